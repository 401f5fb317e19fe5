"""Incremental checking: after an edit, the server re-checks only what the edit changed.

The document is cut where the parser's error recovery cuts it: at every line that starts
a top-level item (``kernel``, ``@strategy``, ``import``, ``from``). Each *chunk* is parsed
alone, in coordinates of its own: its spans name a pseudo-file (its *token*) and count
lines and offsets from the chunk's first character. So a chunk's AST, its kernels'
signatures and their checks stay valid when text above it grows or shrinks; at the end,
diagnostics are moved into the document (a chunk always starts a line, so only lines and
offsets move, never columns).

The steps are the checker's own (:func:`~arke.lang.checker.resolve_imports`,
:func:`~arke.lang.checker.declare_kernel`, :func:`~arke.lang.checker.check_kernel`,
:func:`~arke.lang.checker.late_checks`, :func:`~arke.lang.checker.finish`), run in the
same order over the same items, so the diagnostics are those of
:func:`~arke.lang.checker.check_text` on the whole text. What is reused:

* a chunk's parse, keyed by its text (unchanged text, same AST up to the move);
* a kernel's signature, built once per chunk (it reads nothing but the kernel);
* a kernel's body check, while its *deps* hold: the same object in scope for every name
  the kernel uses that could be a kernel, whether an import failed, and — only when it
  calls a name that is no built-in and not in scope, whose hint lists every name — the
  set of names in scope. A changed callee is a new signature object, so its callers are
  checked again;
* imports, duplicate kernels, call cycles and strategies are cheap: they are redone
  every time.

Syntax errors: when every chunk parses, the whole text parses into the same items. When
one does not, the whole parse fails too — unless that chunk was cut inside an item
(a line that starts with ``@`` in a matrix product, or ``import`` continuing a ``from``):
chunks are merged with such neighbours and parsed again, and if a merge parses, the
whole text is checked the plain way. It is also checked the plain way for a byte-order
mark, text before the first item that does not parse, brackets nested too deeply and
expressions too long to check (AK1006), whose handling depends on the whole text.
"""

from __future__ import annotations

import gc
import itertools
import logging
from dataclasses import dataclass, field, fields, replace
from typing import Any

from lark.exceptions import UnexpectedEOF, UnexpectedInput, UnexpectedToken

from arke.ir import semantic
from arke.lang import ast
from arke.lang.checker import (
    CHECK_RECURSION,
    CheckResult,
    check_kernel,
    check_text,
    declare_kernel,
    finish,
    late_checks,
    resolve_imports,
)
from arke.lang.diagnostics import Diagnostic, Related
from arke.lang.exprs import BUILTINS
from arke.lang.indices import IndexInfo

# The incremental parse must cut exactly where the parser's recovery cuts, and report a
# chunk's syntax error exactly as the parser does: these are the parser's own pieces.
from arke.lang.lark_parser import _lark
from arke.lang.parse_errors import _syntax_diagnostic, _too_deep
from arke.lang.parser import _ITEM_START, _header_only, _parse_one
from arke.lang.recursion import deep_recursion
from arke.lang.signatures import Signature, build_signature
from arke.lang.source import Source, Span

log = logging.getLogger(__name__)

#: The pseudo-file of a chunk's spans: this prefix, then the chunk's serial number.
TOKEN = "\x00chunk:"
#: ``Outcome.full`` after a bug in the incremental check (it is logged, and the whole text checked).
INTERNAL_ERROR = "internal error"
#: Keywords that only ever start an item: a chunk that starts with one was not cut inside an item.
_CERTAIN = frozenset({"", "kernel", "from"})
#: Runs of chunks parsed around one chunk that does not parse, at most (beyond: the plain check).
_MAX_MERGES = 30


class _Fallback(Exception):
    """The incremental check cannot vouch for its answer here: check the whole text."""


@dataclass(eq=False)
class _Kernel:
    """One kernel of a chunk: its signature (built once) and its last body check, with what that read."""

    node: ast.Kernel
    refs: tuple[str, ...]  # names it uses that may name a kernel
    calls: tuple[str, ...]  # names it calls that are no built-in
    sig: Signature | None = None
    sig_diags: tuple[Diagnostic, ...] = ()
    deps: tuple[Any, ...] | None = None
    body: tuple[tuple[semantic.Function, ...], dict[str, IndexInfo], list[tuple[str, Span]],
                tuple[Diagnostic, ...]] | None = None

    def signature(self, source: Source) -> Signature:
        """Its signature, built on first use (``source``: its chunk's), the diagnostics kept in ``sig_diags``."""
        if self.sig is None:
            diags: list[Diagnostic] = []
            self.sig = build_signature(self.node, source, self.node.name, diags)
            self.sig_diags = tuple(diags)
        return self.sig

    def deps_in(self, scope: dict[str, Signature], import_failed: bool) -> tuple[Any, ...]:
        """What the body check reads besides the kernel itself (compared by identity, see :func:`_same`)."""
        names = frozenset(scope) if any(n not in scope for n in self.calls) else None
        return (import_failed, names, *(scope.get(n) for n in self.refs))


@dataclass(eq=False)
class _Chunk:
    """A piece of the document from one item's first line to the next's, parsed in its own coordinates."""

    text: str
    token: str
    kind: str  # the keyword it starts with ('' for the text before the first item)
    lines: int  # line breaks in it
    source: Source
    module: ast.Module | None  # None: it does not parse (but for the header of a kernel whose body does not)
    diags: tuple[Diagnostic, ...] = ()  # what the parser's AST builder reported (a bad number, ...)
    error: UnexpectedInput | None = None  # set: it does not parse
    kernels: list[_Kernel] = field(default_factory=list)
    placed: tuple[tuple[int, int], ast.Module] | None = None  # its module moved into the document, and where to

    def moved(self, move: Placement) -> ast.Module:
        """Its module in the document's coordinates (kept: most chunks stay where they were from edit to edit)."""
        assert self.module is not None
        place = move.places[self.token]
        if self.placed is None or self.placed[0] != place:
            self.placed = (place, move.node(self.module))
        return self.placed[1]


def _parse_chunk(text: str, token: str) -> _Chunk:
    src = Source(token, text)
    start = _ITEM_START.match(text)  # every chunk but the first starts an item
    kind = start.group().strip(" \t") if start else ""
    if _too_deep(src) is not None:
        raise _Fallback("brackets nested too deeply")
    diags: list[Diagnostic] = []
    try:
        module = _parse_one(src, text, diags)
    except UnexpectedInput as err:
        # as the parser's recovery: a kernel whose body does not parse keeps its header
        header = _header_only(src, text, diags, 0) if kind else []
        broken = _Chunk(text, token, kind, text.count("\n"), src, ast.Module(token, (), tuple(header), ())
                        if header else None, tuple(diags), error=err)
        broken.kernels = [_Kernel(k, *_references(k)) for k in header]
        return broken
    except RecursionError as err:
        raise _Fallback("an expression too long to parse") from err
    chunk = _Chunk(text, token, kind, text.count("\n"), src, module, tuple(diags))
    chunk.kernels = [_Kernel(k, *_references(k)) for k in module.kernels]
    return chunk


_FIELDS: dict[type, tuple[str, ...]] = {}


def _at_end(err: UnexpectedInput) -> bool:
    """Whether the parse failed at the end of its text (it might have gone on in a longer one)."""
    return isinstance(err, UnexpectedEOF) or (isinstance(err, UnexpectedToken) and err.token.type == "$END")


def _field_names(node: object) -> tuple[str, ...]:
    names = _FIELDS.get(type(node))
    if names is None:
        names = _FIELDS[type(node)] = tuple(f.name for f in fields(node))  # type: ignore[arg-type]
    return names


def _references(kernel: ast.Kernel) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names ``kernel`` uses that may name a kernel, and those it calls that are no built-in."""
    refs: set[str] = set()
    calls: set[str] = set()
    stack: list[Any] = [kernel]
    while stack:
        node = stack.pop()
        if isinstance(node, tuple):
            stack.extend(node)
            continue
        if not hasattr(node, "__dataclass_fields__") or isinstance(node, Span):
            continue
        if isinstance(node, ast.Name):
            refs.add(node.id)
        elif isinstance(node, ast.Index):
            refs.add(node.name)
        elif isinstance(node, ast.Call):
            refs.add(node.func)
            if node.func not in BUILTINS:
                calls.add(node.func)
        elif isinstance(node, ast.Reduce):
            refs.add(node.op)
        stack.extend(getattr(node, n) for n in _field_names(node))
    return tuple(sorted(refs)), tuple(sorted(calls))


def _joined(path: str, modules: list[ast.Module]) -> ast.Module:
    """One module of the items of ``modules``, in order."""
    return ast.Module(path, tuple(i for m in modules for i in m.imports), tuple(k for m in modules for k in m.kernels),
                      tuple(s for m in modules for s in m.strategies))


def _same(a: tuple[Any, ...] | None, b: tuple[Any, ...]) -> bool:
    """Deps equal: the flag and the name set by value, the signatures by identity (each is built once)."""
    return (a is not None and len(a) == len(b) and a[0] == b[0] and a[1] == b[1]
            and all(x is y for x, y in zip(a[2:], b[2:])))


class Placement:
    """Where each chunk of one checked text is: moves spans from chunk coordinates into the document."""

    def __init__(self, path: str, places: dict[str, tuple[int, int]]):
        self.path = path
        self.places = places  # token -> (offset, 1-based line) of its first character

    def span(self, span: Span) -> Span:
        if not span.file.startswith(TOKEN):
            return span
        place = self.places.get(span.file)
        if place is None:  # a span of a chunk no longer in the text: a stale reuse, never expected
            raise _Fallback(f"a span of a chunk that is gone ({span.file[len(TOKEN):]})")
        offset, line = place
        return Span(self.path, span.line + line - 1, span.col, span.end_line + line - 1, span.end_col,
                    span.start + offset, span.end + offset)

    def diagnostic(self, d: Diagnostic) -> Diagnostic:
        span = self.span(d.span)
        related = tuple(Related(self.span(r.span), r.message) for r in d.related)
        if span is d.span and all(r.span is s.span for r, s in zip(related, d.related)):
            return d
        return replace(d, span=span, related=related)

    def node(self, node: Any) -> Any:
        """``node`` (an AST node, a span, a tuple of them...) with every span moved into the document."""
        if isinstance(node, Span):
            return self.span(node)
        if isinstance(node, tuple):
            return tuple(self.node(x) for x in node)
        if hasattr(node, "__dataclass_fields__"):
            return type(node)(*(self.node(getattr(node, n)) for n in _field_names(node)))
        return node


@dataclass
class Outcome:
    """One check of a document's text.

    ``result``: its diagnostics are in the document's coordinates, as ``check_text`` gives
    them; when ``placement`` is set (an incremental check), its AST, signatures and indices
    are still in chunk coordinates — :meth:`document_result` moves them. ``full``: why the
    whole text was checked the plain way (None for an incremental check).
    """

    text: str
    path: str
    result: CheckResult
    placement: Placement | None = None
    full: str | None = None
    parsed: int = 0  # chunks parsed anew
    checked: int = 0  # kernel bodies checked anew
    chunks: tuple[_Chunk, ...] = ()  # those that parse, in order: the items of ``result.ast``

    def document_result(self) -> CheckResult:
        """The result with everything in the document's coordinates (for the index: hover, definition...)."""
        move = self.placement
        if move is None:
            return self.result
        r = self.result
        source = Source(self.path, self.text)
        parts = [(c.module, c.moved(move)) for c in self.chunks if c.module is not None]
        module = _joined(self.path, [m for _, m in parts])
        moved = {id(a): b for local, m in parts for a, b in zip(local.kernels, m.kernels)}
        own = set(r.kernel_names)
        signatures = {n: replace(s, node=moved[id(s.node)], source=source) if n in own and id(s.node) in moved
                      else s for n, s in r.signatures.items()}
        own_ir = {r.signatures[n].ir_name for n in own if n in r.signatures}
        indices = {k: {n: replace(i, span=move.span(i.span)) for n, i in v.items()} if k in own_ir else v
                   for k, v in r.indices.items()}
        return replace(r, signatures=signatures, indices=indices, ast=module)


class IncrementalChecker:
    """Checks successive texts of one document, reusing what did not change (one thread at a time)."""

    def __init__(self, path: str):
        self.path = path
        self._chunks: dict[tuple[str, int], _Chunk] = {}
        self._last: set[tuple[str, int]] = set()
        self._serial = itertools.count()

    def check(self, text: str) -> Outcome:
        """Check ``text``: the diagnostics are exactly ``check_text(text, path)``'s."""
        collecting = gc.isenabled()
        gc.disable()  # as check_text: the AST and IR hold no cycles
        try:
            with deep_recursion(CHECK_RECURSION):  # as check_text: long operator chains make deep trees
                return self._check(text)
        except _Fallback as why:
            reason = str(why)
        except RecursionError:
            reason = "an expression too deep to check item by item"
        except Exception:  # a bug here must not silence the document: the plain check still answers
            log.exception("the incremental check of %s failed", self.path)
            self._chunks, self._last = {}, set()  # what it left half done is not reused
            reason = INTERNAL_ERROR
        finally:
            if collecting:
                gc.enable()
        log.info("checking %s as a whole: %s", self.path, reason)
        return Outcome(text, self.path, check_text(text, self.path), full=reason)

    # ------------------------------------------------------------ the steps

    def _split(self, text: str) -> tuple[list[_Chunk], Placement, int]:
        """The text's chunks (the first: what precedes the first item), where each is, and how many were parsed."""
        cuts = [0, *(m.start() for m in _ITEM_START.finditer(text)), len(text)]
        chunks: list[_Chunk] = []
        places: dict[str, tuple[int, int]] = {}
        seen: dict[str, int] = {}
        used: set[tuple[str, int]] = set()
        parsed = 0
        line = 1
        for a, b in itertools.pairwise(cuts):
            piece = text[a:b]
            key = (piece, seen.get(piece, 0))  # identical chunks (a pasted kernel) stay apart
            seen[piece] = key[1] + 1
            chunk = self._chunks.get(key)
            if chunk is None:
                chunk = self._chunks[key] = _parse_chunk(piece, f"{TOKEN}{next(self._serial)}")
                parsed += 1
            used.add(key)
            chunks.append(chunk)
            places[chunk.token] = (a, line)
            line += chunk.lines
        # Keep this text's chunks and the previous one's (an edit undone finds its chunks again).
        self._chunks = {k: c for k, c in self._chunks.items() if k in used or k in self._last}
        self._last = used
        return chunks, Placement(self.path, places), parsed

    def _parse(self, text: str, chunks: list[_Chunk], move: Placement) -> tuple[list[_Chunk], list[Diagnostic]]:
        """What ``parse`` makes of the whole text: the chunks whose items it keeps, and its diagnostics
        (in document coordinates)."""
        prefix = chunks[0]
        # The text before the first item fails where the whole text fails, unless it fails at its own end.
        if prefix.error is not None and _at_end(prefix.error):
            raise _Fallback("the text before the first item is unfinished")
        broken = [k for k, c in enumerate(chunks) if k and c.error is not None]
        if not broken and prefix.error is None:
            found = [move.diagnostic(d) for c in chunks for d in c.diags]
            return chunks, sorted(found, key=lambda d: (d.span.start, d.code))
        source = Source(self.path, text)
        if _too_deep(source) is not None:
            raise _Fallback("brackets nested too deeply")
        if prefix.error is None and not any(self._unmergeable(chunks, k) for k in broken):
            raise _Fallback("a chunk that does not parse may have been cut inside an item")
        # The whole text does not parse: as the parser's recovery, item by item (the text before the
        # first item left out, its error reported only when nothing else is), in document coordinates.
        good = [c for c in chunks[1:] if c.module is not None]
        found = [move.diagnostic(d) for c in good for d in c.diags]
        for k in broken:
            chunk = chunks[k]
            assert chunk.error is not None
            found.append(_syntax_diagnostic(chunk.error, source, chunk.text, move.places[chunk.token][0]))
        if not found and prefix.error is not None:
            found.append(_syntax_diagnostic(prefix.error, source, text, 0))
        return good, sorted(set(found), key=lambda d: (d.span.start, d.code))

    @staticmethod
    def _unmergeable(chunks: list[_Chunk], k: int) -> bool:
        """Whether chunk ``k`` (which does not parse) cannot be part of a run of chunks that parses.

        A run may only be cut where a chunk starts with ``@`` or ``import`` (which also occur
        inside items); so when no run of neighbours through such cuts parses, neither does the text.
        """
        lo = k
        while chunks[lo].kind not in _CERTAIN:
            lo -= 1
        hi = k
        while hi + 1 < len(chunks) and chunks[hi + 1].kind not in _CERTAIN:
            hi += 1
        runs = [(a, b) for a in range(lo, k + 1) for b in range(k, hi + 1) if (a, b) != (k, k)]
        if len(runs) > _MAX_MERGES:
            return False
        for a, b in runs:
            try:
                _lark().parse("".join(c.text for c in chunks[a:b + 1]))
            except UnexpectedInput:
                continue
            except RecursionError:
                return False
            return False
        return True

    def _check(self, text: str) -> Outcome:
        if text.startswith("\ufeff"):
            raise _Fallback("a byte-order mark")
        chunks, move, parsed = self._split(text)
        good, diags = self._parse(text, chunks, move)
        module = _joined(self.path, [c.module for c in good if c.module is not None])
        imported = resolve_imports(module.imports, self.path, diags)
        own: dict[str, Signature] = {}
        kernels: dict[str, _Kernel] = {}
        for c in good:
            for kern in c.kernels:
                if declare_kernel(kern.node, own, diags):
                    own[kern.node.name] = kern.signature(c.source)
                    kernels[kern.node.name] = kern
                    diags.extend(kern.sig_diags)
        scope = {**imported.scope, **own}  # as check_text: a file's own kernels shadow imported ones
        calls: dict[str, list[tuple[str, Span]]] = {}
        own_functions: list[semantic.Function] = []
        indices = dict(imported.indices)
        checked = 0
        for name, sig in own.items():
            kern = kernels[name]
            deps = kern.deps_in(scope, imported.failed)
            if kern.body is None or not _same(kern.deps, deps):
                body: list[Diagnostic] = []
                fns, bound, called = check_kernel(sig, scope, imported.failed, body)
                kern.body, kern.deps = (fns, bound, called, tuple(body)), deps
                checked += 1
            fns, indices[sig.ir_name], calls[sig.ir_name], body_diags = kern.body
            diags.extend(body_diags)
            own_functions.extend(fns)
        strategies = late_checks(calls, module.strategies, scope, indices, diags,
                                 functions=(*imported.functions, *own_functions))
        placed = [move.diagnostic(d) for d in diags]
        if any(d.code == "AK1006" for d in placed):  # how deep a check may go depends on the call stack
            raise _Fallback("an expression too long to check")
        result = finish(placed, imported, tuple(own), own_functions, strategies, scope, indices, module)
        return Outcome(text, self.path, result, move, None, parsed, checked, tuple(good))


__all__ = ["INTERNAL_ERROR", "TOKEN", "IncrementalChecker", "Outcome", "Placement"]
