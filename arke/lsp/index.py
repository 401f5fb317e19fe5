"""The index of one document: every name in the file, what it refers to, and where that is defined.

Built from a :class:`~arke.lang.checker.CheckResult` (its AST, the signatures of every
kernel in scope — imported ones included, with their own files — and the indices each
kernel binds). Names are resolved the way the checker resolves them (an index bound
around the name first, then ``let``\\ s, tensors, dims, kernels, built-ins); types and
shapes come from the checker through :mod:`arke.lsp.facts`.

Hover, go-to-definition and completion read an index; the server keeps, for each
document, the index of the last text without syntax errors, so a file broken mid-typing
keeps its symbols.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from arke.ir.strategy import DECISIONS
from arke.lang import ast
from arke.lang.checker import CheckResult, find_module
from arke.lang.exprs import BUILTINS
from arke.lang.signatures import Signature
from arke.lang.source import Source, Span
from arke.lang.walk import children as _children
from arke.lang.walk import subscript_names
from arke.lsp.facts import KernelFacts, kernel_facts

#: Names that are literals, never symbols.
LITERALS = frozenset({"inf", "true", "false"})


@dataclass(frozen=True)
class Symbol:
    """What a name refers to.

    ``kind``: ``kernel``, ``param``, ``output``, ``tensor``, ``let``, ``dim``, ``index``,
    ``builtin``, ``reduction``, ``dtype``, ``decision``, ``target`` or ``module``.
    ``kernel``: the kernel whose name it is (for a kernel symbol, itself). ``decl``: where
    it is defined (possibly in another file), None for the language's own words.
    ``detail``: a few words on how it is bound (``reduced by `sum```).
    """

    kind: str
    name: str
    kernel: str | None = None
    decl: Span | None = None
    detail: str | None = None


@dataclass(frozen=True)
class Occurrence:
    """A name written in the document (``start``/``end`` offsets) and its symbol."""

    start: int
    end: int
    symbol: Symbol


@dataclass
class KernelScope:
    """The names one kernel defines, with their definitions, for resolving and completing."""

    node: ast.Kernel
    params: dict[str, Span] = field(default_factory=dict)
    outputs: dict[str, Span] = field(default_factory=dict)
    dims: dict[str, Span] = field(default_factory=dict)
    lets: dict[str, Span] = field(default_factory=dict)
    tensors: dict[str, Span] = field(default_factory=dict)
    #: (name, binding span, scope start, scope end, how it is bound), in source order
    indices: list[tuple[str, Span, int, int, str]] = field(default_factory=list)

    def index_at(self, name: str, offset: int) -> tuple[Span, str] | None:
        """The innermost binding of index ``name`` whose scope holds ``offset``."""
        best: tuple[str, Span, int, int, str] | None = None
        for entry in self.indices:
            if entry[0] == name and entry[2] <= offset <= entry[3] and (
                    best is None or entry[3] - entry[2] < best[3] - best[2]):
                best = entry
        return (best[1], best[4]) if best else None


def name_span(source: Source, within: Span, name: str) -> Span:
    """The span of the first whole-word ``name`` inside ``within`` (``within`` itself if absent)."""
    m = re.compile(rf"(?<![A-Za-z_0-9]){re.escape(name)}(?![A-Za-z_0-9])").search(source.text, within.start, within.end)
    return source.span(m.start(), m.end()) if m else within


class DocumentIndex:
    """Every name of one document's text, resolved; built once per checked text."""

    def __init__(self, text: str, path: str, result: CheckResult):
        self.text = text
        self.path = path
        self.result = result
        self.source = Source(path, text)
        self.signatures: dict[str, Signature] = dict(result.signatures)
        self.own = set(result.kernel_names)
        self.scopes: list[KernelScope] = []
        self._occurrences: list[Occurrence] = []
        self._facts: dict[str, KernelFacts] = {}
        module = result.ast
        if module is not None:
            for imp in module.imports:
                self._import(imp)
            for k in module.kernels:
                self._kernel(k)
            for s in module.strategies:
                self._strategy(s)
        self._occurrences.sort(key=lambda o: o.start)
        self._starts = [o.start for o in self._occurrences]

    # ------------------------------------------------------------ queries

    @property
    def occurrences(self) -> list[Occurrence]:
        return self._occurrences

    def at(self, offset: int) -> Occurrence | None:
        """The name at ``offset``: the one it is inside, else the one it ends (the cursor just after a word)."""
        k = bisect.bisect_right(self._starts, offset) - 1
        if k < 0:
            return None
        occ = self._occurrences[k]
        if occ.start <= offset < occ.end:
            return occ
        return occ if offset == occ.end else None

    def scope_at(self, offset: int) -> KernelScope | None:
        """The kernel whose text holds ``offset``."""
        for scope in self.scopes:
            if scope.node.span.start <= offset <= scope.node.span.end:
                return scope
        return None

    def scope_named(self, name: str) -> KernelScope | None:
        return next((s for s in self.scopes if s.node.name == name), None)

    def strategy_at(self, offset: int) -> ast.Strategy | None:
        module = self.result.ast
        for s in module.strategies if module else ():
            if s.span.start <= offset <= s.span.end:
                return s
        return None

    def facts(self, kernel: str) -> KernelFacts | None:
        """The checker's types and extents inside one of the file's own kernels (computed on first use)."""
        if kernel not in self._facts:
            sig = self.signatures.get(kernel)
            if sig is None or kernel not in self.own:
                return None
            self._facts[kernel] = kernel_facts(sig, self.signatures)
        return self._facts[kernel]

    def resolve(self, scope: KernelScope | None, name: str, offset: int) -> Symbol | None:
        """What ``name`` written at ``offset`` means (in ``scope``'s kernel, or at top level)."""
        if scope is not None:
            kernel = scope.node.name
            bound = scope.index_at(name, offset)
            if bound is not None:
                return Symbol("index", name, kernel, bound[0], bound[1])
            for kind, table in (("let", scope.lets), ("param", scope.params), ("output", scope.outputs),
                                ("tensor", scope.tensors), ("dim", scope.dims)):
                if name in table:
                    return Symbol(kind, name, kernel, table[name])
        if name in BUILTINS:
            return Symbol("builtin", name)
        sig = self.signatures.get(name)
        if sig is not None:
            return Symbol("kernel", name, name, sig.node.name_span)
        return None

    # ------------------------------------------------------------ building

    def _add(self, span: Span, symbol: Symbol | None) -> None:
        if symbol is not None and span.file == self.path:
            self._occurrences.append(Occurrence(span.start, span.end, symbol))

    def _import(self, imp: ast.Import) -> None:
        target = find_module(imp.module, self.path)
        decl = Span(str(target), 1, 1, 1, 1, 0, 0) if target is not None else None
        module_span = name_span(self.source, imp.span, imp.module.split(".")[0])
        module_end = module_span.start + len(imp.module)
        self._add(self.source.span(module_span.start, module_end), Symbol("module", imp.module, None, decl))
        start = module_end
        for n in imp.names or ():
            found = name_span(self.source, Span(self.path, 0, 0, 0, 0, start, imp.span.end), n)
            sig = self.signatures.get(n)
            decl_n = sig.node.name_span if sig is not None and sig.node.name == n else None
            self._add(found, Symbol("kernel", n, n, decl_n))
            start = found.end

    def _kernel(self, k: ast.Kernel) -> None:
        scope = KernelScope(k)
        self.scopes.append(scope)
        for p in k.params:
            if p.type.dtype == "dim":  # a dim parameter `G: dim` is a dim of the kernel, declared here
                scope.dims.setdefault(p.name, name_span(self.source, p.span, p.name))
                continue
            scope.params.setdefault(p.name, name_span(self.source, p.span, p.name))
            for d in p.type.dims or ():  # a dim is bound by the first axis that is exactly its name
                if isinstance(d, ast.Name):
                    scope.dims.setdefault(d.id, d.span)
        for p in k.params:
            for d in p.type.dims or ():
                for n in _names(d):
                    scope.dims.setdefault(n.id, n.span)
        for o in k.outputs:
            if o.name is not None:
                scope.outputs.setdefault(o.name, name_span(self.source, o.span, o.name))
        for st in k.body:
            if isinstance(st, ast.Let):
                scope.lets.setdefault(st.name, st.name_span)
            elif isinstance(st, ast.Define | ast.Assign):
                if st.name in scope.outputs:
                    scope.outputs[st.name] = st.name_span  # defined in the body: the definition is there
                else:
                    scope.tensors.setdefault(st.name, st.name_span)
            elif isinstance(st, ast.MultiAssign):
                for multi, where in zip(st.names, st.name_spans):
                    scope.tensors.setdefault(multi, where)
        self._bindings(scope)
        name = k.name
        self._add(k.name_span, Symbol("kernel", name, name, k.name_span))
        for p in k.params:
            if p.name in scope.params:
                self._add(name_span(self.source, p.span, p.name), Symbol("param", p.name, name, scope.params[p.name]))
            else:
                self._add(name_span(self.source, p.span, p.name), Symbol("dim", p.name, name, scope.dims[p.name]))
            self._type(scope, p.type)
            if p.default is not None:
                self._expr(scope, p.default)
        for o in k.outputs:
            if o.name is not None:
                self._add(name_span(self.source, o.span, o.name), Symbol("output", o.name, name, scope.outputs[o.name]))
            self._type(scope, o.type)
        for w in k.where:
            self._expr(scope, w)
        for st in k.body:
            self._statement(scope, st)

    def _bindings(self, scope: KernelScope) -> None:
        """Where each index is bound, and over which part of the text the binding holds."""
        known = set(scope.params) | set(scope.outputs) | set(scope.dims) | set(scope.lets) | set(scope.tensors)
        for st in scope.node.body:
            if isinstance(st, ast.Define):
                for n, s in zip(st.indices, st.index_spans):
                    scope.indices.append((n, s, st.span.start, st.span.end, f"an index of `{st.name}`"))
                self._reductions(scope, st.value)
            elif isinstance(st, ast.Return):
                for v in st.values:
                    # As the checker does: a name used as a subscript that is nothing else is a free index.
                    for n, s in _free_indices(v, known):
                        scope.indices.append((n, s, v.span.start, v.span.end, "a free index of the returned value"))
                    self._reductions(scope, v)
            elif isinstance(st, ast.Let | ast.Assign | ast.MultiAssign):
                self._reductions(scope, st.value)

    def _reductions(self, scope: KernelScope, e: ast.Expr) -> None:
        if isinstance(e, ast.Reduce):
            for n, s in zip(e.indices, e.index_spans):
                scope.indices.append((n, s, e.span.start, e.span.end, f"reduced by `{e.op}`"))
        for c in _children(e):
            self._reductions(scope, c)

    def _type(self, scope: KernelScope, t: ast.TypeExpr) -> None:
        self._add(t.dtype_span, Symbol("dtype", t.dtype))
        for d in t.dims or ():
            self._expr(scope, d)

    def _statement(self, scope: KernelScope, st: ast.Stmt) -> None:
        kernel = scope.node.name
        if isinstance(st, ast.Let):
            self._add(st.name_span, Symbol("let", st.name, kernel, scope.lets.get(st.name)))
        elif isinstance(st, ast.Define | ast.Assign):
            kind = "output" if st.name in scope.outputs else "tensor"
            decl = scope.outputs.get(st.name) or scope.tensors.get(st.name)
            self._add(st.name_span, Symbol(kind, st.name, kernel, decl))
            if isinstance(st, ast.Define):
                for n, s in zip(st.indices, st.index_spans):
                    self._add(s, self.resolve(scope, n, s.start))
                if st.type is not None:  # a declared shape (spec §7.3)
                    self._type(scope, st.type)
        elif isinstance(st, ast.MultiAssign):
            for n, s in zip(st.names, st.name_spans):
                self._add(s, Symbol("tensor", n, kernel, scope.tensors.get(n)))
        values = st.values if isinstance(st, ast.Return) else (getattr(st, "value", None),)
        for v in values:
            if v is not None:
                self._expr(scope, v)

    def _expr(self, scope: KernelScope | None, e: ast.Expr) -> None:
        if isinstance(e, ast.Name):
            if e.id not in LITERALS:
                self._add(e.span, self.resolve(scope, e.id, e.span.start))
        elif isinstance(e, ast.Index):
            self._add(e.name_span, self.resolve(scope, e.name, e.name_span.start))
        elif isinstance(e, ast.Call):
            self._add(e.func_span, self._callee(e.func))
        elif isinstance(e, ast.Reduce):
            self._add(e.op_span, Symbol("reduction", e.op))
            for n, s in zip(e.indices, e.index_spans):
                self._add(s, self.resolve(scope, n, s.start))
        for c in _children(e):
            self._expr(scope, c)

    def _callee(self, name: str) -> Symbol | None:
        if name in BUILTINS:  # a call of a built-in's name always means the built-in
            return Symbol("builtin", name)
        sig = self.signatures.get(name)
        return Symbol("kernel", name, name, sig.node.name_span) if sig is not None else None

    def _strategy(self, s: ast.Strategy) -> None:
        sig = self.signatures.get(s.kernel)
        self._add(s.kernel_span, Symbol("kernel", s.kernel, s.kernel, sig.node.name_span) if sig else None)
        if s.target is not None and s.target_span is not None:
            self._add(s.target_span, Symbol("target", s.target))
        if s.when is not None:
            self._when(s.when, sig)
        infos = self.result.indices.get(sig.ir_name, {}) if sig is not None else {}
        for d in s.decisions:
            self._add(d.name_span, Symbol("decision", d.name, s.kernel) if d.name in DECISIONS else None)
            spec = DECISIONS.get(d.name)
            for item in d.items:
                where = name_span(self.source, item.span, item.name)
                if spec is not None and spec.subject == "operand" and sig is not None:
                    decl = _param_span(sig, item.name)
                    self._add(where, Symbol("param", item.name, s.kernel, decl) if decl else None)
                elif item.name in infos:
                    info = infos[item.name]
                    detail = "reduced in a statement of" if info.reduced else "an index of"
                    self._add(where, Symbol("index", item.name, s.kernel, info.span, f"{detail} `{s.kernel}`"))

    def _when(self, e: ast.Expr, sig: Signature | None) -> None:
        if isinstance(e, ast.Name) and sig is not None and e.id in sig.dims:
            self._add(e.span, Symbol("dim", e.id, sig.name, _dim_span(sig, e.id)))
        for c in _children(e):
            self._when(c, sig)


def _names(e: ast.Expr) -> list[ast.Name]:
    if isinstance(e, ast.Name):
        return [e]
    return [n for c in _children(e) for n in _names(c)]


def _free_indices(e: ast.Expr, known: set[str]) -> list[tuple[str, Span]]:
    """The names used in subscripts of ``e`` that name nothing else, with their first use (the checker's order)."""
    return subscript_names(e, lambda n: n not in known and n not in LITERALS)


def _param_span(sig: Signature, name: str) -> Span | None:
    for p in sig.node.params:
        if p.name == name:
            return name_span(sig.source, p.span, name)
    return None


def _dim_span(sig: Signature, dim: str) -> Span | None:
    """Where ``dim`` is bound: its first appearance alone as an axis of a parameter."""
    for p in sig.node.params:
        for d in p.type.dims or ():
            if isinstance(d, ast.Name) and d.id == dim:
                return d.span
    return None


__all__ = ["LITERALS", "DocumentIndex", "KernelScope", "Occurrence", "Symbol", "name_span"]
