"""Parse `.ak` text into the AST (``arke.lang.ast``), with friendly syntax errors.

The grammar is ``arke/grammar/arke.lark`` (LALR). Syntax errors never show Lark's
internals: they say in words what was expected. When a file has an error, each top-level
item (kernel, strategy, import) is parsed again on its own so one broken kernel does not
hide the errors of the others; a kernel whose body does not parse keeps its header, so its
signature is still checked and the kernels and strategies that name it find it.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Iterator

from lark import Token
from lark.exceptions import UnexpectedInput, VisitError

from arke.lang import ast
from arke.lang.diagnostics import Diagnostic
from arke.lang.lark_parser import _lark
from arke.lang.parse_errors import _syntax_diagnostic, _too_deep, _too_long
from arke.lang.parse_tree import _Build
from arke.lang.source import Source

# The start of every top-level item: used to parse items one by one after an error.
_ITEM_START = re.compile(r"^[ \t]*(?:kernel\b|@|import\b|from\b)", re.MULTILINE)


def parse(text: str, path: str = "<input>") -> tuple[ast.Module, list[Diagnostic]]:
    """Parse a `.ak` file. Returns the module (possibly partial) and syntax diagnostics.

    Never raises for bad input: every problem becomes a diagnostic.
    """
    if text.startswith("\ufeff"):  # a byte-order mark: white space, so offsets stay exact
        text = " " + text[1:]
    src = Source(path, text)
    text = src.text  # lone CRs as line ends
    diags: list[Diagnostic] = []
    too_deep = _too_deep(src)
    if too_deep is not None:
        return ast.Module(path, (), (), ()), [too_deep]
    try:
        module = _parse_one(src, text, diags)
        return module, sorted(diags, key=lambda d: (d.span.start, d.code))
    except UnexpectedInput as err:
        first = _syntax_diagnostic(err, src, text, 0)
    except RecursionError:  # an extremely long expression: find it item by item below
        first = _too_long(src, text, 0)
    # Recover: parse each top-level item alone, its positions shifted to its place in the file.
    starts = [m.start() for m in _ITEM_START.finditer(text)] + [len(text)]
    diags = []
    kernels: list[ast.Kernel] = []
    strategies: list[ast.Strategy] = []
    imports: list[ast.Import] = []
    for a, b in itertools.pairwise(starts):
        chunk = text[a:b]
        try:
            part = _parse_one(src, chunk, diags, a)
        except UnexpectedInput as err:
            diags.append(_syntax_diagnostic(err, src, chunk, a))
            kernels += _header_only(src, chunk, diags, a)
            continue
        except RecursionError:
            diags.append(_too_long(src, chunk, a))
            continue
        kernels += part.kernels
        strategies += part.strategies
        imports += part.imports
    if not diags:  # the error lies before the first item, or between items
        diags.append(first)
    module = ast.Module(path, tuple(imports), tuple(kernels), tuple(strategies))
    return module, sorted(set(diags), key=lambda d: (d.span.start, d.code))


def _header_only(src: Source, chunk: str, diags: list[Diagnostic], base: int) -> list[ast.Kernel]:
    """A kernel whose body does not parse, read up to its body's `{` (marked ``body_broken``), so
    that its signature is still checked (an unknown dtype in it is reported) and its callers and
    strategies still find it; nothing when the header itself does not parse."""
    depth = 0
    for tok in _tokens(chunk):
        if tok.type in ("LPAR", "LSQB"):
            depth += 1
        elif tok.type in ("RPAR", "RSQB"):
            depth -= 1
        elif tok.type == "LBRACE" and depth == 0:  # the body's, or a set's in `where D in {...}`: try each
            head = chunk[:tok.end_pos] + "}"
            found: list[Diagnostic] = []
            try:
                part = _parse_one(src, head, found, base)
            except (UnexpectedInput, RecursionError):
                continue
            if len(part.kernels) != 1 or part.strategies or part.imports:
                return []
            diags.extend(found)
            return [dataclasses.replace(part.kernels[0], body_broken=True)]
    return []


def _tokens(text: str) -> Iterator[Token]:
    """The tokens of ``text`` up to the first that does not lex."""
    try:
        yield from _lark().lex(text)
    except UnexpectedInput:
        return


def _parse_one(src: Source, text: str, diags: list[Diagnostic], base: int = 0) -> ast.Module:
    tree = _lark().parse(text)
    builder = _Build(src, base)
    try:
        module: ast.Module = builder.transform(tree)
    except VisitError as err:  # a bug in the builder, not in the input: surface the cause
        raise err.orig_exc from err
    diags.extend(builder.diags)
    return module
