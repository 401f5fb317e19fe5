"""Completion: what may be written at the cursor.

Where the cursor is (a kernel's header or body, a strategy's header or block, an import,
or the top level) is read from the *current* text, which is often broken while the user
types; what is offered comes from the document's last good index (names, types, kernels in
scope) and from the language's own lists:

* in a kernel body: the names in scope there (parameters, dims, ``let``\\ s and tensors
  defined above the cursor, indices bound around it), the kernels in scope, the
  standard library's kernels (with an edit that imports them), built-in functions,
  reductions and keywords;
* in a strategy block: the decisions that have an effect on the strategy's target; after a
  decision's name, the kernel's indices or tensor parameters; after ``algorithm =``, the
  algorithms the target can lower;
* in ``@strategy(``: kernels, then targets after ``target =``, dims after ``when``;
* after ``import``/``from``: modules; after ``from M import``: ``M``'s kernels.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from lsprotocol import types

from arke.ir.dtypes import DTYPES
from arke.ir.shapes import dim_str
from arke.ir.strategy import DECISIONS
from arke.lang.checker import find_module, stdlib_modules
from arke.lang.parser import parse
from arke.lang.signatures import Signature
from arke.lang.source import Source
from arke.lsp.hover import doc_comment, kernel_signature, type_text
from arke.lsp.index import DocumentIndex
from arke.lsp.textmap import TextMap
from arke.lsp.words import (
    BUILTINS,
    KEYWORDS,
    REDUCTIONS,
    builtin_doc,
    builtin_signature,
    decision_doc,
    decisions_for,
    reduction_doc,
    target_doc,
)
from arke.targets import base as targets

K = types.CompletionItemKind
_ITEM_START = re.compile(r"^[ \t]*(kernel\b|@|import\b|from\b)", re.MULTILINE)
_WORD = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_TOP_LEVEL_WORDS = frozenset({"kernel", "import", "from", "where", "when"})


def _item(label: str, kind: K, detail: str | None = None, doc: str | None = None, sort: str = "5",
          edits: list[types.TextEdit] | None = None) -> types.CompletionItem:
    return types.CompletionItem(
        label=label, kind=kind, detail=detail,
        documentation=types.MarkupContent(types.MarkupKind.Markdown, doc) if doc else None,
        sort_text=f"{sort}{label}", additional_text_edits=edits,
    )


@lru_cache(maxsize=32)
def module_kernels(path: str, mtime: float) -> tuple[Signature, ...]:
    """The kernels a module file defines (parsed only: enough for their signatures), cached by modification time."""
    text = Path(path).read_text(encoding="utf-8")
    module, _ = parse(text, path)
    source = Source(path, text)
    return tuple(Signature(k.name, k.name, k, source) for k in module.kernels)


def _kernels_of(module: str, importer: str) -> tuple[Signature, ...]:
    path = find_module(module, importer)
    if path is None:
        return ()
    try:
        return module_kernels(str(path), path.stat().st_mtime)
    except (OSError, UnicodeDecodeError):
        return ()


class Completer:
    """Completions for one request: the current text, the cursor, and the last good index."""

    def __init__(self, text: str, offset: int, index: DocumentIndex | None, path: str):
        self.text = text
        self.offset = offset
        self.index = index
        self.path = path
        self.map = TextMap.between(index.text, text) if index is not None else None
        self.before = text[:offset]

    def items(self) -> list[types.CompletionItem]:
        line = self.before[self.before.rfind("\n") + 1:]
        if "#" in line:  # in a comment (the language has no strings)
            return []
        starts = list(_ITEM_START.finditer(self.before))
        if not starts:
            return self._top_level()
        item = starts[-1]
        head = item.group(1)
        rest = self.text[item.start():self.offset]
        if head in ("import", "from"):
            if "\n" in rest.rstrip(" \t"):
                return self._top_level()
            return self._import(rest)
        if head == "@":
            return self._strategy(rest)
        return self._kernel(rest)

    # ------------------------------------------------------------ contexts

    def _top_level(self) -> list[types.CompletionItem]:
        return [_item(w, K.Keyword, sort="1") for w in ("kernel", "import", "from")] + [
            _item("@strategy", K.Snippet, "a strategy block", sort="1")]

    def _import(self, rest: str) -> list[types.CompletionItem]:
        m = re.match(r"\s*from\s+([\w.]+)\s+import\b", rest)
        if m:
            return [_item(s.name, K.Function, kernel_signature(s), doc_comment(s) or None)
                    for s in _kernels_of(m.group(1), self.path)]
        modules = list(stdlib_modules())
        if not self.path.startswith("<"):
            folder = Path(self.path).parent
            modules += sorted(p.stem for p in folder.glob("*.ak") if p.resolve() != Path(self.path).resolve())
        return [_item(n, K.Module, "standard library" if n.startswith("std.") else "module next to this file")
                for n in modules]

    def _strategy(self, rest: str) -> list[types.CompletionItem]:
        m = re.match(r"@\s*strategy\s*\(\s*(\w*)", rest)
        kernel = m.group(1) if m else ""
        header_end = rest.find("{")
        if header_end < 0:
            return self._strategy_header(rest, kernel)
        block = rest[header_end + 1:]
        if "}" in block:
            return self._top_level()
        target_m = re.search(r"\btarget\s*=\s*(\w+)", rest[:header_end])
        target = target_m.group(1) if target_m else None
        stmt = re.split(r"[;\n{]", block)[-1]
        if re.fullmatch(r"\s*\w*", stmt):  # the decision's name is being typed
            return [_item(n, K.Property, DECISIONS[n].meaning, decision_doc(n, target), sort="1")
                    for n in decisions_for(target)]
        spec = DECISIONS.get(_WORD.findall(stmt)[0])
        if spec is None:
            return []
        if re.fullmatch(r"\s*\w+\s*=\s*\w*", stmt):  # `algorithm = |`
            choices = targets.narrowed_choices(spec.name, target) or spec.choices
            return [_item(c, K.EnumMember, f"{spec.name} = {c}", sort="1") for c in choices]
        if re.search(r"=\s*\w*$", stmt):  # a value: `tile i = |`
            return []
        if spec.subject == "operand":
            return self._kernel_operands(kernel)
        if spec.subject == "index":
            return self._kernel_indices(kernel)
        return []

    def _strategy_header(self, rest: str, kernel: str) -> list[types.CompletionItem]:
        if re.search(r"\btarget\s*=\s*\w*$", rest):
            return [_item(t, K.EnumMember, target_doc(t), sort="1") for t in targets.names()]
        if re.search(r"\bwhen\b", rest):
            sig = self.index.signatures.get(kernel) if self.index else None
            return [_item(d, K.TypeParameter, "dim", sort="1") for d in (sig.dims if sig else ())]
        if "," in rest:
            return [_item("target", K.Keyword, "target = llvm | triton | cuda | mlir", sort="1"),
                    _item("when", K.Keyword, "when CONDITION over the kernel's dims", sort="1")]
        return self._kernel_names(sort="1")

    def _kernel(self, rest: str) -> list[types.CompletionItem]:
        m = re.match(r"\s*kernel\s+(\w+)", rest)
        name = m.group(1) if m else ""
        body = _body_start(rest)
        if body is None:  # in the header: types, dims and `where`
            dims = sorted(set(re.findall(r"[\[,]\s*([A-Za-z_]\w*)", rest)))
            return ([_item(d, K.EnumMember, "dtype", sort="1") for d in DTYPES]
                    + [_item(d, K.TypeParameter, "dim", sort="2") for d in dims]
                    + [_item("where", K.Keyword, sort="3")])
        if _closes(rest[body:]):
            return self._top_level()
        return self._body(name, rest)

    def _body(self, kernel: str, rest: str) -> list[types.CompletionItem]:
        out: dict[str, types.CompletionItem] = {}
        scope = self.index.scope_named(kernel) if self.index else None
        facts = self.index.facts(kernel) if self.index and scope else None
        if scope is not None:
            for kind, table in (("parameter", scope.params), ("output", scope.outputs), ("let", scope.lets),
                                ("tensor", scope.tensors)):
                for n, decl in table.items():
                    if kind in ("let", "tensor") and not self._above(decl.end):
                        continue  # every name is defined before it is used
                    t = facts.types.get(n) if facts else None
                    detail = f"{n}: {type_text(t)}" if t is not None else kind
                    if facts and n in facts.lets:
                        detail = f"{n}: {facts.lets[n]}"
                    out.setdefault(n, _item(n, K.Variable, detail, sort="0"))
            for n in scope.dims:
                out.setdefault(n, _item(n, K.TypeParameter, "dim", sort="1"))
            for n, _decl, start, end, how in scope.indices:
                a, b = self._new(start), self._new(end, end=True)
                if a is not None and b is not None and a <= self.offset <= b:
                    out.setdefault(n, _item(n, K.Variable, f"index: {how}", sort="0"))
        else:  # a kernel the last good text did not have: what its header says
            for n in re.findall(r"[(,]\s*([A-Za-z_]\w*)\s*:", rest):
                out.setdefault(n, _item(n, K.Variable, "parameter", sort="0"))
        for n in _statement_indices(self.before):
            out.setdefault(n, _item(n, K.Variable, "index", sort="0"))
        for it in self._kernel_names(exclude=kernel) + self._stdlib_kernels():
            out.setdefault(it.label, it)
        for n in sorted(BUILTINS):
            out.setdefault(n, _item(n, K.Function, builtin_signature(n), builtin_doc(n), sort="3"))
        for n in REDUCTIONS:
            if n not in out or n in ("max", "min"):
                out[n] = _item(n, K.Function, f"{n}(e for i)" if n not in ("max", "min") else
                               f"{n}(e for i) · {n}(a, b)", reduction_doc(n), sort="3")
        for w in (w for w in KEYWORDS if w not in _TOP_LEVEL_WORDS):
            out.setdefault(w, _item(w, K.Keyword, sort="4"))
        return list(out.values())

    # ------------------------------------------------------------ pieces

    def _new(self, old: int, end: bool = False) -> int | None:
        return self.map.to_new(old, end) if self.map is not None else old

    def _above(self, old_end: int) -> bool:
        new = self._new(old_end, end=True)
        return new is None or new <= self.offset

    def _kernel_names(self, exclude: str = "", sort: str = "2") -> list[types.CompletionItem]:
        if self.index is None:
            return []
        return [_item(n, K.Function, kernel_signature(s), doc_comment(s) or None, sort=sort)
                for n, s in self.index.signatures.items() if n != exclude]

    def _stdlib_kernels(self) -> list[types.CompletionItem]:
        """Standard-library kernels not in scope yet, each with the import that brings it in."""
        have = set(self.index.signatures) if self.index else set()
        out = []
        for module in stdlib_modules():
            for sig in _kernels_of(module, self.path):
                if sig.name in have or sig.name in BUILTINS:
                    continue
                edit = self._import_edit(f"from {module} import {sig.name}")
                out.append(_item(sig.name, K.Function, f"{module}: {kernel_signature(sig)}",
                                 doc_comment(sig) or None, sort="6", edits=[edit]))
        return out

    def _import_edit(self, text: str) -> types.TextEdit:
        """Insert the line ``text`` after the last import, or before the first item when there is none."""
        lines = self.text.split("\n")
        last_import, first_item = None, len(lines)
        for k, line in enumerate(lines):
            stripped = line.strip()
            if stripped.startswith(("import ", "from ")):
                last_import = k
            elif stripped and not stripped.startswith("#"):
                first_item = k
                break
        at = last_import + 1 if last_import is not None else first_item
        spacing = "" if last_import is not None else "\n"
        return types.TextEdit(types.Range(types.Position(at, 0), types.Position(at, 0)), text + "\n" + spacing)

    def _kernel_indices(self, kernel: str) -> list[types.CompletionItem]:
        sig = self.index.signatures.get(kernel) if self.index else None
        if sig is None or self.index is None:
            return []
        infos = self.index.result.indices.get(sig.ir_name, {})
        return [_item(n, K.Variable, f"{n}: 0 ≤ {n} < {dim_str(i.extent)}" + (" (reduced)" if i.reduced else ""),
                      sort="1") for n, i in infos.items()]

    def _kernel_operands(self, kernel: str) -> list[types.CompletionItem]:
        sig = self.index.signatures.get(kernel) if self.index else None
        return [_item(p.name, K.Variable, f"{p.name}: {type_text(p.type)}", sort="1")
                for p in (sig.params if sig else ()) if p.type.rank > 0]


def _body_start(rest: str) -> int | None:
    """Where the kernel's body starts in ``rest`` (just after its ``{``), or None while in the header."""
    depth = 0
    for k, ch in enumerate(rest):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "{" and depth <= 0 and not _in_set(rest, k):
            return k + 1
    return None


def _in_set(text: str, k: int) -> bool:
    """Whether the ``{`` at ``k`` opens a set after ``in`` (``N in {1, 2}`` in a where clause)."""
    return re.search(r"\bin\s*$", text[:k]) is not None


def _closes(body: str) -> bool:
    """Whether the body's ``}`` comes before the end of ``body`` (the cursor is past the kernel)."""
    depth = 1
    for ch in re.sub(r"#[^\n]*", "", body):
        depth += ch == "{"
        depth -= ch == "}"
        if depth == 0:
            return True
    return False


def _statement_indices(before: str) -> list[str]:
    """Indices the statement being typed binds: ``y[i, j] =`` on its left, ``for k`` in reductions."""
    line = before[before.rfind("\n") + 1:]
    out: list[str] = []
    m = re.match(r"\s*\w+\s*\[([^\]]*)\]\s*=", line)
    if m:
        out += _WORD.findall(m.group(1))
    for names in re.findall(r"\bfor\s+([\w\s,]+)", line):
        out += _WORD.findall(names)
    return out


def complete(text: str, offset: int, index: DocumentIndex | None, path: str,
             markdown: bool = True) -> list[types.CompletionItem]:
    """The completion items at ``offset`` of ``text`` (documentation as plain text unless ``markdown``)."""
    items = Completer(text, offset, index, path).items()
    if not markdown:  # the client cannot show Markdown: the same words, as they are
        for item in items:
            if isinstance(item.documentation, types.MarkupContent):
                item.documentation = item.documentation.value
    return items


__all__ = ["complete", "module_kernels"]
