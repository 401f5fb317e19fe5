"""Kernel bodies: one kernel's statements checked in order against its signature, lowered to SemanticIR.

:class:`KernelChecker` holds a kernel's state (its values, ``let`` names, dims,
index frames, the ops emitted so far) and the plumbing every part uses (diagnostics, fresh
SSA names, materializing whole tensors). The parts are mixins, one module each:

* ``arke.lang.statements``: ``let``, index definitions, assignments and ``return``;
* ``arke.lang.indices``: index scopes, extent inference and reductions;
* ``arke.lang.calls``: calls of other kernels;
* ``arke.lang.exprs``: expressions (whole-tensor ones become maps and contractions).

For an index definition ``y[i, j] = expr`` the checker first infers each index's extent
from the places it is used directly as a subscript (``x[i, k]`` says ``i`` runs over
``x``'s first axis), reports conflicting extents with both places, then lowers the
expression: nested reductions become their own ops, kernel calls become call ops.
"""

from __future__ import annotations

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, equal
from arke.lang import ast
from arke.lang.bits import BitOps
from arke.lang.calls import KernelCalls
from arke.lang.diagnostics import Diagnostic, Related, did_you_mean, make
from arke.lang.exprs import ExprLowering
from arke.lang.indices import IndexBinding, IndexInfo
from arke.lang.lengths import LengthChecks
from arke.lang.scans import ScanLowering
from arke.lang.signatures import Signature, subs_dims
from arke.lang.source import Span
from arke.lang.statements import StatementChecks, Value
from arke.lang.terms import Scalar, Tensor, Term, cast
from arke.lang.topk import TopKLowering
from arke.lang.walk import children


class KernelChecker(StatementChecks, KernelCalls, IndexBinding, LengthChecks, ScanLowering, ExprLowering, BitOps,
                    TopKLowering):
    """Checks one kernel body against its signature and lowers it to an IR function."""

    def __init__(self, sig: Signature, callables: dict[str, Signature], diags: list[Diagnostic]):
        self.sig = sig
        self.callables = callables
        self.diags = diags
        self.dims: dict[str, Dim] = dict(sig.dims)
        self.values: dict[str, Value] = {
            p.name: Value(p.name, p.type, next(q.span for q in sig.node.params if q.name == p.name), is_param=True)
            for p in sig.params if p.name not in sig.dim_params  # a dim parameter is a dim in the body
        }
        self.lets: dict[str, Scalar] = {}
        self.let_spans: dict[str, Span] = {}
        self.used: set[str] = set()
        self.frames: list[dict[str, Dim]] = []
        self.ops: list[ir.Op] = []
        self.guards: list[ir.Guard] = list(sig.guards)
        self.counter = 0
        self.indices: dict[str, IndexInfo] = {}
        self.calls: list[tuple[str, Span]] = []
        self.failed = False
        self.poisoned: set[str] = set()
        self.import_failed = False  # set by the checker: unknown calls are then not reported
        # Every name a statement defines, with where: to tell "used before defined" from "unknown".
        self.defined_at: dict[str, Span] = {}
        for st in sig.node.body:
            if isinstance(st, ast.MultiAssign):
                self.defined_at.update(zip(st.names, st.name_spans))
            elif isinstance(st, ast.Let | ast.Define | ast.Assign):
                self.defined_at.setdefault(st.name, st.name_span)
        self.outputs = {n: (k, t) for k, (n, t) in enumerate(zip(sig.output_names, sig.outputs)) if n is not None}
        self.results: list[str | None] = [None] * len(sig.outputs)

    # ------------------------------------------------------------ plumbing

    def error(self, code: str, message: str, span: Span, hint: str | None = None,
              related: list[Related] | tuple[Related, ...] = (), replacement: str | None = None) -> None:
        d = make(code, message, span, hint, related, replacement)
        if d.is_error:
            self.failed = True
        if d not in self.diags:
            self.diags.append(d)

    def source_text(self, span: Span) -> str:
        return self.sig.source.text[span.start:span.end]

    def fresh(self) -> str:
        self.counter += 1
        return str(self.counter - 1)

    def emit(self, op: ir.Op) -> None:
        self.ops.append(op)

    def same(self, a: Dim, b: Dim) -> bool:
        """Whether two dims are provably equal (the where clauses' equalities applied)."""
        return equal(subs_dims(a, self.sig.subst), subs_dims(b, self.sig.subst)) is True

    def index_clash(self, name: str) -> str | None:
        """What ``name`` already names when a new index would take it (spec §6: an index may not be a tensor,
        dim or `let`): "a tensor", "an output", "a dim", "a `let`", or None."""
        if name in self.values:
            return "a tensor"
        if name in self.outputs:
            return "an output"
        if name in self.dims:
            return "a dim"
        return "a `let`" if name in self.lets else None

    def unknown_name(self, name: str, span: Span) -> None:
        later = self.defined_at.get(name)
        if later is not None and later.start > span.start:
            self.error("AK2007", f"`{name}` is used before it is defined", span,
                       related=[Related(later, f"`{name}` is defined here")],
                       hint="move the definition above its first use")
            return
        pool = [*self.values, *self.lets, *self.dims, *(n for f in self.frames for n in f)]
        guess = did_you_mean(name, pool)
        self.error("AK2001", f"unknown name `{name}`", span,
                   hint=f"did you mean `{guess}`?" if guess else None, replacement=guess)

    def value_tensor(self, ssa: str, shape: tuple[Dim, ...], dtype: DType) -> Tensor:
        return Tensor(shape, dtype, lambda subs: ir.Load(ssa, tuple(subs), dtype), ssa)

    def value_term(self, name: str) -> Term:
        v = self.values[name]
        v.used = True
        return self.value_tensor(v.ssa, v.type.shape, v.type.dtype)

    def materialize(self, t: Tensor, dtype: DType | None = None, name: str | None = None) -> str:
        """The SSA value holding a whole tensor (a map op unless it already is one)."""
        dtype = dtype or t.dtype
        if t.value is not None and dtype == t.dtype:
            return t.value
        axes = tuple(ir.Axis(f"_{k}", d) for k, d in enumerate(t.shape))
        body = cast(t.at(tuple(ir.Idx(a.name) for a in axes)), dtype)
        ssa = self.fresh()
        self.emit(ir.MapOp(ssa, dtype, axes, body, name))
        return ssa

    def mentions_poisoned(self, e: ast.Expr) -> bool:
        if not self.poisoned:
            return False
        if isinstance(e, ast.Name) and e.id in self.poisoned:
            return True
        if isinstance(e, ast.Index) and e.name in self.poisoned:
            return True
        return any(self.mentions_poisoned(c) for c in children(e))

    # ------------------------------------------------------------ the body

    def check(self) -> ir.Function | None:
        """Check the body; the IR function, or None when the kernel had errors."""
        body = self.sig.node.body
        returned: ast.Return | None = None
        for stmt in body:
            if returned is not None:
                self.error("AK2203", "this statement comes after `return` and would never run", stmt.span)
                break
            if isinstance(stmt, ast.Return):
                returned = stmt
            self.statement(stmt)
        if returned is None and not self.failed:
            missing = [n for n, r in zip(self.sig.output_names, self.results) if r is None]
            if missing or not self.sig.output_names:
                what = ", ".join(f"`{n}`" for n in missing if n) or "its result"
                self.error("AK2201", f"kernel `{self.sig.name}` never returns {what}", self.sig.node.name_span,
                           hint="end the body with `return ...`, or define every named output")
        self.warn_unused()
        if self.failed or not self.sig.ok or any(r is None for r in self.results):
            return None
        return ir.Function(self.sig.ir_name, self.sig.params, self.sig.bindings, tuple(self.guards),
                           tuple(self.ops), tuple(r for r in self.results if r is not None), self.sig.outputs,
                           self.sig.output_names, self.sig.specialisation)

    # ------------------------------------------------------------ warnings

    def warn_unused(self) -> None:
        if self.failed:
            return
        for name, v in self.values.items():
            if not v.used and not v.is_param and name not in self.outputs:
                self.error("AK2301", f"`{name}` is defined but never used", v.span,
                           hint="remove it, or use it in the result")
        for name, span in self.let_spans.items():
            if name in self.lets and name not in self.used:
                self.error("AK2301", f"`{name}` is defined but never used", span)
