"""Kernel bodies: statements, scopes, index binding and extent inference, lowered to SemanticIR.

:class:`KernelChecker` walks a kernel's statements in order. For an index definition
``y[i, j] = expr`` it first infers each index's extent from the places it is used directly
as a subscript (``x[i, k]`` says ``i`` runs over ``x``'s first axis), reports conflicting
extents with both places, then lowers the expression (``arke.lang.exprs``): nested
reductions become their own ops, whole-tensor expressions become maps and contractions,
kernel calls become call ops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType, can_store
from arke.ir.shapes import Dim, decide, dim_str, equal
from arke.lang import ast
from arke.lang.diagnostics import Diagnostic, Related, did_you_mean, make
from arke.lang.exprs import BUILTINS, ExprLowering
from arke.lang.signatures import RESERVED, Signature, cond_str, cond_subs, cond_sympy, subs_dims
from arke.lang.source import Span
from arke.lang.terms import POISON, Scalar, Tensor, Term, broadcast_scalar, cast


@dataclass
class Value:
    """A named tensor or scalar in a kernel: its SSA name, type, definition site and use."""

    ssa: str
    type: ir.TensorType
    span: Span
    used: bool = False
    is_param: bool = False


@dataclass(frozen=True)
class IndexInfo:
    """What a kernel's index is: its extent and whether some statement reduces over it."""

    name: str
    extent: Dim
    span: Span
    reduced: bool


_FIELDS: dict[type, tuple[str, ...]] = {}


def children(e: ast.Expr) -> Iterator[ast.Expr]:
    """The expressions directly inside ``e``, in field order."""
    names = _FIELDS.get(type(e))
    if names is None:  # `fields()` is slow next to the walk itself: once per node type
        names = _FIELDS[type(e)] = tuple(f.name for f in fields(e))
    for name in names:
        v = getattr(e, name)
        if isinstance(v, ast.Expr):
            yield v
        elif isinstance(v, tuple):
            yield from (x for x in v if isinstance(x, ast.Expr))


_children = children


def subscript_names(e: ast.Expr, unbound: Callable[[str], bool]) -> list[tuple[str, Span]]:
    """The names used in subscripts of ``e`` (outside the reductions that bind them) for which
    ``unbound`` holds, each with its first use, in the order the checker meets them."""
    out: list[tuple[str, Span]] = []

    def walk(x: ast.Expr, hidden: frozenset[str], in_sub: bool) -> None:
        if isinstance(x, ast.Name):
            if in_sub and x.id not in hidden and all(n != x.id for n, _ in out) and unbound(x.id):
                out.append((x.id, x.span))
        elif isinstance(x, ast.Index):
            for sub in x.indices:
                walk(sub, hidden, True)
        elif isinstance(x, ast.Reduce):
            walk(x.body, hidden | frozenset(x.indices), in_sub)
        else:
            for c in children(x):
                walk(c, hidden, in_sub)

    walk(e, frozenset(), False)
    return out


class KernelChecker(ExprLowering):
    """Checks one kernel body against its signature and lowers it to an IR function."""

    def __init__(self, sig: Signature, callables: dict[str, Signature], diags: list[Diagnostic]):
        self.sig = sig
        self.callables = callables
        self.diags = diags
        self.dims: dict[str, Dim] = dict(sig.dims)
        self.values: dict[str, Value] = {
            p.name: Value(p.name, p.type, next(q.span for q in sig.node.params if q.name == p.name), is_param=True)
            for p in sig.params
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

    def lookup_index(self, name: str) -> Dim | None:
        for frame in reversed(self.frames):
            if name in frame:
                return frame[name]
        return None

    def is_unbound(self, name: str) -> bool:
        return (self.lookup_index(name) is None and name not in self.lets and name not in self.values
                and name not in self.dims and name not in ("true", "false", "inf"))

    def unbound_index(self, name: str, span: Span, extent: Dim | None = None) -> None:
        scope = {n: d for frame in self.frames for n, d in frame.items()}
        fits = [n for n, d in scope.items() if extent is not None and self.same(d, extent)]
        guess = fits[0] if len(fits) == 1 else did_you_mean(name, scope)
        self.error("AK2104", f"index `{name}` is not bound on the left of `=` or by a reduction", span,
                   hint=f"did you mean `{guess}`?" if guess else "add it to the left side (`y[..., "
                   f"{name}] = ...`) or reduce over it (`sum(... for {name})`)", replacement=guess)

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

    def note_index(self, name: str, extent: Dim, span: Span, reduced: bool) -> None:
        old = self.indices.get(name)
        self.indices[name] = IndexInfo(name, extent, old.span if old else span, reduced or bool(old and old.reduced))

    def under(self, frame: dict[str, Dim], e: ast.Expr, what: str | None) -> Term:
        """Lower ``e`` with the indices of ``frame`` bound: one element (``what`` it is for), or
        any term when ``what`` is None."""
        self.frames.append(frame)
        try:
            return self.expr(e) if what is None else self.scalar(e, what)
        finally:
            self.frames.pop()

    def mentions_poisoned(self, e: ast.Expr) -> bool:
        if not self.poisoned:
            return False
        if isinstance(e, ast.Name) and e.id in self.poisoned:
            return True
        if isinstance(e, ast.Index) and e.name in self.poisoned:
            return True
        return any(self.mentions_poisoned(c) for c in _children(e))

    # ------------------------------------------------------------ extents

    def extents(self, e: ast.Expr, names: list[str], spans: list[Span],
                declared: dict[str, Dim] | None = None) -> tuple[dict[str, Dim], bool]:
        """Infer each index's extent from its direct uses as a subscript in ``e``.

        Returns the extents and whether they are all known; after an error the unknown
        ones are 1, good enough to look for the expression's own errors, not to define anything.
        """
        found: dict[str, list[tuple[Dim, Span, str]]] = {n: [] for n in names}
        for n, d in (declared or {}).items():
            found[n].append((d, spans[names.index(n)], "the declared output"))
        self._collect(e, found, frozenset())
        out: dict[str, Dim] = {}
        ok = True
        for name, span in zip(names, spans):
            uses = found[name]
            if not uses:
                ok = False
                out[name] = sympy.Integer(1)
                if self.unreliable_use(e, name):
                    continue  # the access itself is wrong (unknown tensor, wrong arity): that is the error
                self.error("AK2105", f"the extent of index `{name}` cannot be inferred", span,
                           hint=f"use `{name}` directly as a subscript of a tensor on the right "
                                "(as in `x[" + name + "]`), or declare the output's shape")
                continue
            first = uses[0]
            for other in uses[1:]:
                if not self.same(first[0], other[0]):
                    self.error("AK3003", f"index `{name}` runs over {dim_str(first[0])} ({first[2]}) but also over "
                               f"{dim_str(other[0])} ({other[2]})", other[1],
                               related=[Related(first[1], f"`{name}` runs over {dim_str(first[0])} here")],
                               hint=f"if they are always equal, add `where {dim_str(first[0])} == "
                                    f"{dim_str(other[0])}`; otherwise use two indices")
                    ok = False
                    break
            out[name] = first[0]
        return out, ok

    def unreliable_use(self, e: ast.Expr, name: str) -> bool:
        """Whether ``name`` subscripts an access that is wrong itself (an unknown or failed tensor,
        or the wrong number of subscripts), which is reported instead of the missing extent."""
        if isinstance(e, ast.Index) and any(isinstance(i, ast.Name) and i.id == name for i in e.indices):
            v = self.values.get(e.name)
            if v is None or len(e.indices) != v.type.rank:
                return True
        return any(self.unreliable_use(c, name) for c in _children(e))

    def _collect(self, e: ast.Expr, found: dict[str, list[tuple[Dim, Span, str]]], hidden: frozenset[str]) -> None:
        if isinstance(e, ast.Index):
            v = self.values.get(e.name)
            if v is not None and len(e.indices) != v.type.rank:
                v = None  # a wrong number of subscripts is its own error; it says nothing about extents
            for k, sub in enumerate(e.indices):
                if (isinstance(sub, ast.Name) and sub.id in found and sub.id not in hidden and v is not None
                        and k < v.type.rank):
                    found[sub.id].append((v.type.shape[k], sub.span, f"axis {k} of `{e.name}`"))
                self._collect(sub, found, hidden)
            return
        if isinstance(e, ast.Reduce):
            self._collect(e.body, found, hidden | frozenset(e.indices))
            return
        for c in _children(e):
            self._collect(c, found, hidden)

    def implicit_indices(self, e: ast.Expr) -> tuple[list[str], list[Span]]:
        """Names used as subscripts in a `return` that are nothing else: the result's free indices."""
        found = subscript_names(e, self.is_unbound)
        return [n for n, _ in found], [span for _, span in found]

    # ------------------------------------------------------------ reductions

    def reduction(self, e: ast.Reduce) -> Term:
        """``sum(body for i, j)`` becomes its own op over the indices the body keeps."""
        names, spans = list(e.indices), list(e.index_spans)
        for n, s in zip(names, spans):
            if self.lookup_index(n) is not None:
                self.error("AK2102", f"reduction index `{n}` is already bound outside this `{e.op}`", s,
                           hint="pick another name for the reduced index")
                return POISON
            if names.count(n) > 1:
                self.error("AK2101", f"index `{n}` is listed twice", s)
                return POISON
        frame, ok = self.extents(e.body, names, spans)
        if not ok:
            self.under(frame, e.body, "a value to reduce")  # for its own errors only
            return POISON
        for n, s in zip(names, spans):
            self.note_index(n, frame[n], s, reduced=True)
        body = self.under(frame, e.body, "a value to reduce")
        if not isinstance(body, Scalar):
            return POISON
        order = [n for f in self.frames for n in f]
        keep = [n for n in order if n in body.free]
        axes = tuple(ir.Axis(n, self.lookup_index(n) or sympy.Integer(1)) for n in keep)
        raxes = tuple(ir.Axis(n, frame[n]) for n in names)
        kind, dtype = e.op, body.dtype
        sx = body.sx
        if kind == "mean" or (kind in ("sum", "prod") and dtype.is_bool):
            dtype = DType.F32 if kind == "mean" and not dtype.is_float else (DType.I64 if dtype.is_bool else dtype)
            sx = cast(sx, dtype)
        if body.weak and dtype == DType.I64 and kind == "mean":
            dtype = DType.F32
        ssa = self.fresh()
        op_kind = "sum" if kind == "mean" else kind
        if (op_kind == "sum" and isinstance(sx, ir.Binary) and sx.op == "mul" and isinstance(sx.a, ir.Load)
                and isinstance(sx.b, ir.Load) and sx.a != sx.b and _plain(sx.a) and _plain(sx.b)
                and sx.a.dtype == sx.b.dtype == dtype):
            self.emit(ir.ContractOp(ssa, dtype, axes, raxes, sx.a, sx.b))
        else:
            self.emit(ir.ReduceOp(ssa, dtype, op_kind, axes, raxes, sx))
        result = Scalar(ir.Load(ssa, tuple(ir.Idx(n) for n in keep), dtype), dtype, frozenset(keep))
        if kind == "mean":
            count: Dim = sympy.Integer(1)
            for ax in raxes:
                count = count * ax.extent
            denom = ir.Cast(ir.DimRef(count), dtype) if not count.is_number else ir.Const(float(count), dtype)
            result = Scalar(ir.Binary("div", result.sx, denom, dtype), dtype, result.free)
        return result

    # ------------------------------------------------------------ statements

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
                           self.sig.output_names)

    def statement(self, s: ast.Stmt) -> None:
        values = s.values if isinstance(s, ast.Return) else (getattr(s, "value", None),)
        # A statement that uses a name whose definition failed was already reported: skip it.
        if not any(v is not None and self.mentions_poisoned(v) for v in values):
            handler = getattr(self, "_s_" + type(s).__name__)
            handler(s)
        # A definition that failed still defines its name, silently: no "unknown name" cascade.
        names = s.names if isinstance(s, ast.MultiAssign) else (getattr(s, "name", None),)
        for n in names:
            if n is not None and n not in self.values and n not in self.lets and n not in self.dims:
                self.poisoned.add(n)

    def defined_before(self, name: str, span: Span) -> bool:
        if name in RESERVED:
            self.error("AK2003", f"`{name}` is a literal and cannot be defined", span)
            return True
        if name in self.values or name in self.lets:
            first = self.values[name].span if name in self.values else self.let_spans[name]
            self.error("AK2003", f"`{name}` is already defined; every name is defined once", span,
                       related=[Related(first, "first defined here")], hint="give the new value another name")
            return True
        if name in self.dims or name in BUILTINS:
            self.error("AK2003", f"`{name}` is already the name of a {'dim' if name in self.dims else 'function'}",
                       span, hint="give the new value another name")
            return True
        return False

    def _s_Let(self, s: ast.Let) -> None:
        if self.defined_before(s.name, s.name_span):
            return
        t = self.scalar(s.value, "a dim or scalar value for `let`")
        if not isinstance(t, Scalar):
            return
        if t.free:
            self.error("AK2106", f"`let {s.name}` depends on indices {', '.join(sorted(t.free))}", s.value.span,
                       hint="`let` names a dim or a scalar; define a tensor with `y[i] = ...`")
            return
        if t.dim is not None and t.dtype.is_int:
            self.dims[s.name] = t.dim
            self.let_spans[s.name] = s.name_span
            return
        self.lets[s.name] = Scalar(t.sx, t.dtype, t.free, t.weak, None)
        self.let_spans[s.name] = s.name_span

    def _s_Define(self, s: ast.Define) -> None:
        names, spans = list(s.indices), list(s.index_spans)
        for k, n in enumerate(names):
            if n in names[:k]:
                self.error("AK2101", f"index `{n}` appears twice on the left", spans[k],
                           hint="each axis of the new tensor needs its own index")
                return
            if n in self.values or n in self.dims or n in self.lets:
                self.error("AK2003", f"index `{n}` has the name of a tensor, dim or `let`", spans[k],
                           hint="pick another index name")
                return
        out = self.outputs.get(s.name)
        if out is None and self.defined_before(s.name, s.name_span):
            return
        if out is not None and self.results[out[0]] is not None:
            self.error("AK2003", f"output `{s.name}` is defined twice", s.name_span)
            return
        declared = None
        if out is not None:
            if len(names) != out[1].rank:
                self.error("AK3012", f"output `{s.name}` has rank {out[1].rank}, but is defined with "
                           f"{len(names)} indices", s.span)
                return
            declared = dict(zip(names, out[1].shape))
        frame, ok = self.extents(s.value, names, spans, declared)
        if not ok:
            self.under(frame, s.value, "an element")  # for its own errors only: the name stays undefined
            return
        for n, sp in zip(names, spans):
            self.note_index(n, frame[n], sp, reduced=False)
        t = self.under(frame, s.value, "an element")
        if not isinstance(t, Scalar):
            return
        dtype = t.dtype
        if out is not None:
            stored = self.store_dtype(t, out[1].dtype, s.value.span, f"output `{s.name}`")
            if stored is None:
                return
            dtype = stored
        axes = tuple(ir.Axis(n, frame[n]) for n in names)
        ssa = self.adopt(t, names, dtype, s.name) or self.fresh()
        if not self.ops or _result(self.ops[-1]) != ssa:
            self.emit(ir.MapOp(ssa, dtype, axes, cast(t.sx, dtype), s.name))
        ttype = ir.TensorType(dtype, tuple(a.extent for a in axes))
        self.bind(s.name, ssa, ttype, s.name_span)

    def adopt(self, t: Scalar, names: list[str], dtype: DType, name: str) -> str | None:
        """When the element is exactly the reduction just emitted, name that op instead of copying it."""
        if not self.ops or not isinstance(t.sx, ir.Load):
            return None
        last = self.ops[-1]
        if (isinstance(last, ir.ReduceOp | ir.ContractOp) and t.sx.src == last.result and last.dtype == dtype
                and [a.name for a in last.axes] == names and t.sx.indices == tuple(ir.Idx(n) for n in names)):
            self.ops[-1] = _renamed(last, name)
            return last.result
        return None

    def store_dtype(self, t: Scalar | Tensor, to: DType, span: Span, name: str) -> DType | None:
        # A weak literal takes the destination's type if it is of the same kind (an int
        # literal fits any number type, a float literal only floats).
        weak = isinstance(t, Scalar) and t.weak and not to.is_bool and (t.dtype.is_int or to.is_float)
        if weak and isinstance(t, Scalar) and not self.literal_fits(t, to, ast.Name(span, name)):
            return None
        if weak or can_store(t.dtype, to):
            return to
        what = name if " " in name else f"`{name}`"
        self.error("AK3016", f"{what} is {to}, but the value is {t.dtype}", span,
                   hint=f"convert it explicitly: `{to}(...)`")
        return None

    def bind(self, name: str, ssa: str, ttype: ir.TensorType, span: Span) -> None:
        out = self.outputs.get(name)
        if out is not None:
            self.results[out[0]] = ssa
            self.values[name] = Value(ssa, ttype, span, used=True)
        else:
            self.values[name] = Value(ssa, ttype, span)

    def _s_Assign(self, s: ast.Assign) -> None:
        out = self.outputs.get(s.name)
        if out is None and self.defined_before(s.name, s.name_span):
            return
        free, _ = self.implicit_indices(s.value)
        if free:
            idx = ", ".join(free)
            self.error("AK2106", f"the value uses indices {idx}, so `{s.name}` needs them on the left", s.name_span,
                       hint=f"write `{s.name}[{idx}] = ...`", replacement=f"{s.name}[{idx}]")
            return
        t = self.expr(s.value)
        if t is POISON:
            return
        if isinstance(t, Scalar):
            if t.free:
                idx = ", ".join(sorted(t.free))
                self.error("AK2106", f"the value depends on indices {idx}, so `{s.name}` needs them on the left",
                           s.name_span, hint=f"write `{s.name}[{idx}] = ...`", replacement=f"{s.name}[{idx}]")
                return
            t = broadcast_scalar(t.sx, t.dtype)
        assert isinstance(t, Tensor)
        dtype = t.dtype
        if out is not None:
            if not self.shape_matches(t.shape, out[1].shape, s.value.span, f"output `{s.name}`"):
                return
            d = self.store_dtype(t, out[1].dtype, s.value.span, f"output `{s.name}`")
            if d is None:
                return
            dtype = d
        ssa = self.materialize(t, dtype, s.name)
        self.bind(s.name, ssa, ir.TensorType(dtype, t.shape), s.name_span)

    def _s_MultiAssign(self, s: ast.MultiAssign) -> None:
        if not isinstance(s.value, ast.Call) or s.value.func not in self.callables:
            self.error("AK2202", "several names on the left need a call of a kernel with several outputs", s.span)
            return
        for n, sp in zip(s.names, s.name_spans):
            if self.defined_before(n, sp):
                return
        results = self.call_kernel(s.value, count=len(s.names))
        if not isinstance(results, list):
            return
        for n, sp, (ssa, ttype) in zip(s.names, s.name_spans, results):
            self.bind(n, ssa, ttype, sp)

    def shape_matches(self, got: tuple[Dim, ...], want: tuple[Dim, ...], span: Span, what: str) -> bool:
        if len(got) == len(want) and all(self.same(a, b) for a, b in zip(got, want)):
            return True
        g = "[" + ", ".join(dim_str(d) for d in got) + "]"
        w = "[" + ", ".join(dim_str(d) for d in want) + "]"
        self.error("AK3012", f"{what} has shape {w}, but the value has shape {g}", span)
        return False

    def _s_Return(self, s: ast.Return) -> None:
        outs = self.sig.outputs
        if len(s.values) != len(outs):
            self.error("AK2202", f"`return` gives {len(s.values)} value{'s' if len(s.values) != 1 else ''}, but "
                       f"kernel `{self.sig.name}` declares {len(outs)} output{'s' if len(outs) != 1 else ''}", s.span)
            return
        for k, (e, out) in enumerate(zip(s.values, outs)):
            name = self.sig.output_names[k]
            if self.results[k] is not None:
                if not (isinstance(e, ast.Name) and e.id == name):
                    self.error("AK2202", f"output `{name}` is already defined above; `return` would replace it",
                               e.span, hint=f"write `return {name}`, or drop the `return`",
                               replacement=name)
                continue
            what = f"output `{name}`" if name else "the output" if len(outs) == 1 else f"output {k}"
            ssa = self.return_value(e, out, what)
            if ssa is not None:
                self.results[k] = ssa

    def return_value(self, e: ast.Expr, out: ir.TensorType, what: str) -> str | None:
        names, spans = self.implicit_indices(e)
        frame, ok = self.extents(e, names, spans) if names else ({}, True)
        if not ok:
            self.under(frame, e, None)  # for its own errors only
            return None
        for n, sp in zip(names, spans):
            self.note_index(n, frame[n], sp, reduced=False)
        t = self.under(frame, e, None)
        if t is POISON:
            return None
        dtype = self.store_dtype(t, out.dtype, e.span, what)  # type: ignore[arg-type]
        if dtype is None:
            return None
        if isinstance(t, Tensor):
            if t.rank == 0 and out.rank > 0:
                t = broadcast_scalar(t.at(()), t.dtype, out.shape)
            if not self.shape_matches(t.shape, out.shape, e.span, what):
                return None
            return self.materialize(t, dtype)
        assert isinstance(t, Scalar)
        if not t.free:  # an element that depends on no index fills the whole output
            return self.materialize(broadcast_scalar(cast(t.sx, dtype), dtype, out.shape), dtype)
        order = self.map_axes(t, names, frame, out, e.span, what)
        if order is None:
            return None
        axes = tuple(ir.Axis(n, d) for n, d in zip(order, out.shape))
        ssa = self.adopt(t, order, dtype, "") or self.fresh()
        if not self.ops or _result(self.ops[-1]) != ssa:
            self.emit(ir.MapOp(ssa, dtype, axes, cast(t.sx, dtype)))
        return ssa

    def map_axes(self, t: Scalar, names: list[str], frame: dict[str, Dim], out: ir.TensorType, span: Span,
                 what: str) -> list[str] | None:
        """Match a returned element's free indices to the output's axes by extent."""
        free = [n for n in names if n in t.free]
        if len(free) != out.rank:
            self.error("AK3012", f"the returned value has {len(free)} free "
                       f"ind{'ices' if len(free) != 1 else 'ex'} ({', '.join(free) or 'none'}) but {what} has rank "
                       f"{out.rank}", span)
            return None
        order: list[str] = []
        for axis, d in enumerate(out.shape):
            matches = [n for n in free if n not in order and self.same(frame[n], d)]
            if not matches:
                self.error("AK3012", f"axis {axis} of {what} is {dim_str(d)}, but no free index of the returned "
                           "value runs over it", span)
                return None
            if len(matches) > 1:
                self.error("AK3013", f"indices {' and '.join(matches)} both run over {dim_str(d)}, so which one is "
                           f"axis {axis} of {what} is ambiguous", span,
                           hint="name the output and define it with explicit indices: "
                                "`-> y: ...` then `y[i, j] = ...`")
                return None
            order.append(matches[0])
        return order

    # ------------------------------------------------------------ kernel calls

    def call_kernel(self, e: ast.Call, count: int = 1) -> Any:
        """Check a call against the callee's signature and emit a call op."""
        callee = self.callables[e.func]
        self.calls.append((callee.ir_name, e.func_span))
        if callee.name == self.sig.name and callee.node is self.sig.node:
            self.error("AK2006", f"kernel `{e.func}` calls itself", e.func_span, hint="kernels cannot recurse")
            return POISON
        params = callee.params
        required = sum(1 for p in params if p.default is None)
        if not required <= len(e.args) <= len(params):
            want = f"{required}" if required == len(params) else f"{required} to {len(params)}"
            self.error("AK3008", f"`{e.func}` takes {want} arguments, but {len(e.args)} are given", e.span,
                       related=[Related(callee.node.name_span, f"`{e.func}` is defined here")])
            return POISON
        bind: dict[sympy.Symbol, Dim] = {}
        args: list[str] = []
        deferred: list[tuple[ast.Call, ir.Param, int, Dim, Dim, Span]] = []
        for k, p in enumerate(params):
            if k >= len(e.args):
                assert p.default is not None
                args.append(self.materialize(broadcast_scalar(ir.Const(p.default, p.type.dtype), p.type.dtype)))
                continue
            ssa = self.call_arg(e, e.args[k], p, bind, deferred)
            if ssa is None:
                return POISON
            args.append(ssa)
        for call, p, axis, want, got, span in deferred:
            expected = subs_dims(want, bind)
            if not self.same(expected, got):
                self.error("AK3009", f"axis {axis} of `{p.name}` must be {dim_str(expected)} for this call "
                           f"(`{call.func}` declares {dim_str(want)}), but the argument's is {dim_str(got)}", span,
                           related=[Related(call.func_span, f"`{call.func}` called here")])
                return POISON
        for cond, text in callee.conds:
            c = cond_subs(cond, bind)
            verdict = decide(cond_sympy(c, self.sig.subst))
            if verdict is False:
                self.error("AK3011", f"this call breaks `{text}`, a where clause of `{e.func}`", e.span,
                           related=[Related(callee.node.name_span, f"`{e.func}` is defined here")])
                return POISON
            if verdict is None:
                self.guards.append(ir.Guard(c, f"{cond_str(c)} (`{text}` of the call of `{e.func}`)"))
        types = tuple(ir.TensorType(t.dtype, tuple(subs_dims(d, bind) for d in t.shape)) for t in callee.outputs)
        if len(types) != count:
            self.error("AK3008", f"`{e.func}` returns {len(types)} outputs, but {count} "
                       f"{'is' if count == 1 else 'are'} used here", e.span,
                       hint="take them apart with `a, b = " + e.func + "(...)`" if count == 1 else None)
            return POISON
        results = tuple(self.fresh() for _ in types)
        dims = tuple(sorted((str(k), v) for k, v in bind.items()))
        self.emit(ir.CallOp(results, types, callee.ir_name, tuple(args), dims))
        if count == 1:
            return self.value_tensor(results[0], types[0].shape, types[0].dtype)
        return list(zip(results, types))

    def call_arg(self, e: ast.Call, arg: ast.Expr, p: ir.Param, bind: dict[sympy.Symbol, Dim],
                 deferred: list[tuple[ast.Call, ir.Param, int, Dim, Dim, Span]]) -> str | None:
        t = self.expr(arg)
        if t is POISON:
            return None
        if p.type.rank == 0:
            if isinstance(t, Scalar) and t.free:
                self.error("AK3009", f"`{p.name}` of `{e.func}` is a scalar, but the argument depends on indices "
                           f"{', '.join(sorted(t.free))}", arg.span)
                return None
            if isinstance(t, Tensor) and t.rank:
                self.error("AK3009", f"`{p.name}` of `{e.func}` is a scalar, but the argument has rank {t.rank}",
                           arg.span)
                return None
            assert isinstance(t, Scalar | Tensor)
            dtype = self.store_dtype(t, p.type.dtype, arg.span, f"parameter `{p.name}`")
            if dtype is None:
                return None
            tensor = t if isinstance(t, Tensor) else broadcast_scalar(t.sx, t.dtype)
            return self.materialize(tensor, dtype)
        if not isinstance(t, Tensor):
            self.error("AK3009", f"`{p.name}` of `{e.func}` is a tensor of rank {p.type.rank}, but the argument "
                       "is an element", arg.span, hint="pass the whole tensor, without indices")
            return None
        if t.rank != p.type.rank:
            self.error("AK3009", f"`{p.name}` of `{e.func}` has rank {p.type.rank}, but the argument has rank "
                       f"{t.rank}", arg.span)
            return None
        if t.dtype != p.type.dtype:
            self.error("AK3010", f"`{p.name}` of `{e.func}` is {p.type.dtype}, but the argument is {t.dtype}",
                       arg.span, hint=f"convert it: `{p.type.dtype}({self.source_text(arg.span)})`")
            return None
        for axis, (want, got) in enumerate(zip(p.type.shape, t.shape)):
            if isinstance(want, sympy.Symbol) and want not in bind:
                bind[want] = got
            else:  # a literal, a repeated or a compound dim: checked once every symbol is bound
                deferred.append((e, p, axis, want, got, arg.span))
        return self.materialize(t)

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


def _plain(load: ir.Load) -> bool:
    return all(isinstance(i, ir.Idx) for i in load.indices)


def _result(op: ir.Op) -> str | None:
    return None if isinstance(op, ir.CallOp) else op.result


def _renamed(op: ir.ReduceOp | ir.ContractOp, name: str) -> ir.Op:
    from dataclasses import replace

    return replace(op, name=name or op.name)
