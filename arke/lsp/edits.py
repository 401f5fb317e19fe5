"""Edits and outlines: quick fixes, formatting and document symbols.

* **Quick fixes** come from the diagnostics themselves: a diagnostic with an exact
  replacement (``data.replacement``, the checker's ``Diagnostic.replacement``) or a hint
  "did you mean `d`?" becomes a code action replacing its range with the suggestion.
* **Formatting** is :func:`arke.lang.fmt.format_source`, sent as one edit of the region
  that changed (so the cursor and the undo history stay put elsewhere).
* **Document symbols** come from the parser's AST of the current text (which recovers
  item by item, so a broken kernel hides only itself).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from lsprotocol import types

from arke.lang import ast
from arke.lang.parser import parse
from arke.lsp.convert import Text, diagnostic_data
from arke.lsp.textmap import TextMap

log = logging.getLogger(__name__)

_DID_YOU_MEAN = re.compile(r"did you mean `([^`]+)`\?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9.]*")


def quick_fixes(uri: str, text: Text, diagnostics: Sequence[types.Diagnostic]) -> list[types.CodeAction]:
    """One quick fix per diagnostic of ``akc`` that suggests a replacement."""
    actions = []
    for d in diagnostics:
        if d.source not in (None, "akc"):
            continue
        fix = _fix(text, d)
        if fix is None:
            continue
        where, replacement = fix
        actions.append(types.CodeAction(
            title=f"Replace with `{replacement}`", kind=types.CodeActionKind.QuickFix, diagnostics=[d],
            is_preferred=True, edit=types.WorkspaceEdit(changes={uri: [types.TextEdit(where, replacement)]}),
        ))
    return actions


def _fix(text: Text, d: types.Diagnostic) -> tuple[types.Range, str] | None:
    replacement = diagnostic_data(d).get("replacement")
    if isinstance(replacement, str):
        return d.range, replacement
    m = _DID_YOU_MEAN.search(d.message)
    if m is None:
        return None
    start, end = text.offset(d.range.start), text.offset(d.range.end)
    covered = text.text[start:end]
    if _NAME.fullmatch(covered):
        return d.range, m.group(1)
    # The range is wider than the name (`import std.nnn`): replace the name the message quotes.
    for quoted in re.findall(r"`([^`]+)`", d.message.split("\n")[0]):
        found = [x for x in re.finditer(rf"(?<![\w.]){re.escape(quoted)}(?![\w.])", covered)]
        if len(found) == 1:
            a, b = start + found[0].start(), start + found[0].end()
            return text.range(a, b), m.group(1)
    return None


def format_edits(text: Text, path: str) -> list[types.TextEdit] | None:
    """The edit that formats the document; [] when it is formatted, None when it does not parse."""
    from arke.lang.fmt import FormatError, format_source  # the formatter is needed only here

    try:
        formatted = format_source(text.text, path)
    except FormatError as err:  # the formatter refuses text that does not parse: nothing to do
        log.info("not formatting %s: %s", path, err)
        return None
    if formatted == text.text:
        return []
    change = TextMap.between(text.text, formatted)
    old_end = change.old_len - change.suffix
    new_end = change.new_len - change.suffix
    return [types.TextEdit(text.range(change.prefix, old_end), formatted[change.prefix:new_end])]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def document_symbols(text: Text, path: str) -> list[types.DocumentSymbol]:
    """Imports, kernels (with their parameters and outputs) and strategies (with their decisions)."""
    module, _ = parse(text.text, path)
    src = text.text
    out: list[tuple[int, types.DocumentSymbol]] = []
    for imp in module.imports:
        out.append((imp.span.start, types.DocumentSymbol(
            name=imp.module, kind=types.SymbolKind.Module, range=text.range(imp.span.start, imp.span.end),
            selection_range=text.range(imp.span.start, imp.span.end), detail=_one_line(src[imp.span.start:
                                                                                          imp.span.end]))))
    for k in module.kernels:
        out.append((k.span.start, _kernel_symbol(text, k)))
    for s in module.strategies:
        label = f"@strategy({s.kernel}" + (f", target = {s.target}" if s.target else "") + \
            (", when ..." if s.when is not None else "") + ")"
        children = [types.DocumentSymbol(
            name=d.name, kind=types.SymbolKind.Property, range=text.range(d.span.start, d.span.end),
            selection_range=text.range(d.name_span.start, d.name_span.end),
            detail=_one_line(src[d.span.start:d.span.end])) for d in s.decisions]
        out.append((s.span.start, types.DocumentSymbol(
            name=label, kind=types.SymbolKind.Namespace, range=text.range(s.span.start, s.span.end),
            selection_range=text.range(s.kernel_span.start, s.kernel_span.end), children=children)))
    return [sym for _, sym in sorted(out, key=lambda pair: pair[0])]


def _kernel_symbol(text: Text, k: ast.Kernel) -> types.DocumentSymbol:
    src = text.text
    params = ", ".join(_one_line(src[p.span.start:p.span.end]) for p in k.params)
    outs = ", ".join((f"{o.name}: " if o.name else "") + _one_line(src[o.type.span.start:o.type.span.end])
                     for o in k.outputs)
    children = []
    for p in k.params:
        children.append(types.DocumentSymbol(
            name=p.name, kind=types.SymbolKind.Variable, range=text.range(p.span.start, p.span.end),
            selection_range=text.range(p.span.start, p.span.start + len(p.name)),
            detail=_one_line(src[p.type.span.start:p.type.span.end])))
    for st in k.body:
        if isinstance(st, ast.Let | ast.Define | ast.Assign):
            children.append(types.DocumentSymbol(
                name=st.name, kind=types.SymbolKind.Constant if isinstance(st, ast.Let) else types.SymbolKind.Field,
                range=text.range(st.span.start, st.span.end),
                selection_range=text.range(st.name_span.start, st.name_span.end)))
    return types.DocumentSymbol(
        name=k.name, kind=types.SymbolKind.Function, range=text.range(k.span.start, k.span.end),
        selection_range=text.range(k.name_span.start, k.name_span.end),
        detail=f"({params}) -> {outs}" if len(k.outputs) <= 1 else f"({params}) -> ({outs})", children=children)


__all__ = ["document_symbols", "format_edits", "quick_fixes"]
