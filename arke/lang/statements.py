"""Statements: ``let``, index definitions, assignments and ``return``, checked and lowered in order.

:class:`StatementChecks` is the part of :class:`arke.lang.kernels.KernelChecker` that handles
one statement at a time: it defines each name once (as a :class:`Value` or a ``let``),
fits values to the declared outputs (shape, and dtype with weak literals), and turns an
element defined over indices into a map op, reusing a reduction just emitted.
"""

# mypy: disable-error-code="misc"
# (StatementChecks is a mixin of KernelChecker: its methods annotate `self` with the class
# that provides the state, which mypy flags as "erased self type" without this.)
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from arke.ir import semantic as ir
from arke.ir.dtypes import DType, can_store
from arke.ir.shapes import Dim, dim_str
from arke.lang import ast
from arke.lang.diagnostics import Related
from arke.lang.exprs import BUILTINS, REDUCTIONS
from arke.lang.signatures import RESERVED, declared_shape
from arke.lang.source import Span
from arke.lang.terms import POISON, Scalar, Tensor, broadcast_scalar, cast

if TYPE_CHECKING:
    from arke.lang.kernels import KernelChecker


@dataclass
class Value:
    """A named tensor or scalar in a kernel: its SSA name, type, definition site and use."""

    ssa: str
    type: ir.TensorType
    span: Span
    used: bool = False
    is_param: bool = False


class StatementChecks:
    """Statement half of :class:`arke.lang.kernels.KernelChecker` (a mixin: it uses its state)."""

    # ------------------------------------------------------------ statements

    def statement(self: KernelChecker, s: ast.Stmt) -> None:
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

    def defined_before(self: KernelChecker, name: str, span: Span) -> bool:
        if name in RESERVED:
            self.error("AK2003", f"`{name}` is a literal and cannot be defined", span)
            return True
        if name in self.values or name in self.lets:
            first = self.values[name].span if name in self.values else self.let_spans[name]
            self.error("AK2003", f"`{name}` is already defined; every name is defined once", span,
                       related=[Related(first, "first defined here")], hint="give the new value another name")
            return True
        if name in self.dims or name in BUILTINS or name in REDUCTIONS or name in ast.SCANS:
            kind = "dim" if name in self.dims else "function" if name in BUILTINS else "reduction"
            self.error("AK2003", f"`{name}` is already the name of a {kind}", span,
                       hint="give the new value another name")
            return True
        return False

    def _s_Let(self: KernelChecker, s: ast.Let) -> None:
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

    def _s_Define(self: KernelChecker, s: ast.Define) -> None:
        names, spans = list(s.indices), list(s.index_spans)
        for k, n in enumerate(names):
            if n in names[:k]:
                self.error("AK2101", f"index `{n}` appears twice on the left", spans[k],
                           hint="each axis of the new tensor needs its own index")
                return
            if (clash := self.index_clash(n)) is not None:
                self.error("AK2003", f"index `{n}` has the name of {clash}", spans[k], hint="pick another index name")
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
        own = self.declared_type(s, out is not None)
        if s.type is not None and own is None:
            return
        if own is not None:
            declared = dict(zip(names, own.shape))
        frame, ok = self.extents(s.value, names, spans, declared, "intermediate" if out is None else "output")
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
        if own is not None:
            stored = self.store_dtype(t, own.dtype, s.value.span, f"`{s.name}`")
            if stored is None:
                return
            dtype = stored
        axes = tuple(ir.Axis(n, frame[n]) for n in names)
        ssa = self.adopt(t, names, dtype, s.name) or self.fresh()
        if not self.ops or _result(self.ops[-1]) != ssa:
            self.emit(ir.MapOp(ssa, dtype, axes, cast(t.sx, dtype), s.name))
        ttype = ir.TensorType(dtype, tuple(a.extent for a in axes))
        self.bind(s.name, ssa, ttype, s.name_span)

    def declared_type(self: KernelChecker, s: ast.Define, is_output: bool) -> ir.TensorType | None:
        """The declared type of ``t[i, j]: T[...] = ...`` (spec §7.3), None when absent or wrong (reported)."""
        if s.type is None:
            return None
        if is_output:
            self.error("AK3022", f"`{s.name}` is an output, whose type the signature declares already", s.type.span,
                       hint=f"drop the type: `{s.name}[{', '.join(s.indices)}] = ...`")
            return None
        ranked = len(s.type.dims or ())
        if ranked != len(s.indices):
            count = f"{len(s.indices)} ind{'ices' if len(s.indices) != 1 else 'ex'}"
            self.error("AK3022", f"`{s.name}` is defined with {count}, but its declared shape has {ranked} "
                       f"dim{'s' if ranked != 1 else ''}", s.type.span,
                       hint="declare one dim per index, in order, as in `t[i, j]: f32[M, N] = ...`")
            return None
        return declared_shape(s.type, self.dims, self.error)

    def adopt(self: KernelChecker, t: Scalar, names: list[str], dtype: DType, name: str) -> str | None:
        """When the element is exactly the reduction just emitted, name that op instead of copying it."""
        if not self.ops or not isinstance(t.sx, ir.Load):
            return None
        last = self.ops[-1]
        if (isinstance(last, ir.ReduceOp | ir.ContractOp | ir.ScanOp)
                and t.sx.src == last.result and last.dtype == dtype
                and [a.name for a in last.axes] == names and t.sx.indices == tuple(ir.Idx(n) for n in names)):
            self.ops[-1] = _renamed(last, name)
            return last.result
        return None

    def store_dtype(self: KernelChecker, t: Scalar | Tensor, to: DType, span: Span, name: str) -> DType | None:
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

    def bind(self: KernelChecker, name: str, ssa: str, ttype: ir.TensorType, span: Span) -> None:
        out = self.outputs.get(name)
        if out is not None:
            self.results[out[0]] = ssa
            self.values[name] = Value(ssa, ttype, span, used=True)
        else:
            self.values[name] = Value(ssa, ttype, span)

    def _s_Assign(self: KernelChecker, s: ast.Assign) -> None:
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

    def _s_MultiAssign(self: KernelChecker, s: ast.MultiAssign) -> None:
        if not isinstance(s.value, ast.Call) or s.value.func not in self.callables:
            self.error("AK2202", "several names on the left need a call of a kernel with several outputs", s.span)
            return
        for k, (n, sp) in enumerate(zip(s.names, s.name_spans)):
            if n in s.names[:k]:
                self.error("AK2003", f"`{n}` is named twice on the left; every name is defined once", sp,
                           related=[Related(s.name_spans[s.names.index(n)], "first named here")],
                           hint="give each result its own name")
                return
            if self.defined_before(n, sp):
                return
        results = self.call_kernel(s.value, count=len(s.names))
        if not isinstance(results, list):
            return
        for n, sp, (ssa, ttype) in zip(s.names, s.name_spans, results):
            self.bind(n, ssa, ttype, sp)

    def shape_matches(self: KernelChecker, got: tuple[Dim, ...], want: tuple[Dim, ...], span: Span, what: str) -> bool:
        if len(got) == len(want) and all(self.same(a, b) for a, b in zip(got, want)):
            return True
        g = "[" + ", ".join(dim_str(d) for d in got) + "]"
        w = "[" + ", ".join(dim_str(d) for d in want) + "]"
        self.error("AK3012", f"{what} has shape {w}, but the value has shape {g}", span)
        return False

    def _s_Return(self: KernelChecker, s: ast.Return) -> None:
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

    def return_value(self: KernelChecker, e: ast.Expr, out: ir.TensorType, what: str) -> str | None:
        names, spans = self.implicit_indices(e)
        frame, ok = self.extents(e, names, spans, role="return", output=out) if names else ({}, True)
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

    def map_axes(self: KernelChecker, t: Scalar, names: list[str], frame: dict[str, Dim], out: ir.TensorType,
                 span: Span, what: str) -> list[str] | None:
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


def _result(op: ir.Op) -> str | None:
    return None if isinstance(op, ir.CallOp) else op.result


def _renamed(op: ir.ReduceOp | ir.ContractOp | ir.ScanOp, name: str) -> ir.Op:
    from dataclasses import replace

    return replace(op, name=name or op.name)
