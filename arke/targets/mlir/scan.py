"""A scan (spec/language.md §8.9) as linalg on tensors and IREE's ``iree_linalg_ext.scan``.

A scan lowers in three steps, each linear in the size:

1. its body (and, for ``linear``, its coefficient and its initial value) as element-wise
   ``linalg.generic`` ops (:class:`~arke.targets.mlir.lowering.Lowering` of a map), in the type
   the scan accumulates in: ``f32`` for every float, the result's own integer type otherwise
   (integer sums and products wrap alike in any width, max/min never wrap), bools as bytes;
2. one ``iree_linalg_ext.scan`` along the scanned dimension, which IREE runs in sequence along
   it and in parallel over the other axes: ``inclusive(false)`` for an exclusive scan, from an
   accumulator filled with the identity (or ``init``);
3. the result in its storage type (a 16-bit float rounded once, when stored).

``iree_linalg_ext.scan`` takes one input, and a recurrence ``h = a · h + b`` combines pairs:
``(a₁, b₁) ∘ (a₂, b₂) = (a₂·a₁, a₂·b₁ + b₂)``, whose ``b`` is ``a₂·h + b₂`` when ``b₁ = h``, the
interpreter's step with its two roundings. Each pair travels packed in one integer of twice the
width (``a``'s bits high, ``b``'s low: an ``f32`` pair in an ``i64``, an ``i64`` pair in an
``i128``). An inclusive scan starts from the first element alone (IREE ignores the accumulator
there), so the pair at position 0 is ``(a₀, a₀·init + b₀)``; an exclusive one starts from
``(1, init)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim
from arke.plan.exprs import product
from arke.targets.artifact import UnsupportedError
from arke.targets.mlir.body import STORAGE, Body, Source
from arke.targets.mlir.lowering import Lowering, _acc_dtype, _identity
from arke.targets.mlir.ops import FuncContext, Loop, reassociation


@dataclass
class LoweredScan:
    """What a scan made: its result tensor (storage type), its loops (for the strategy), its check tensors."""

    result: str
    loops: tuple[Loop, ...]
    checks: tuple[str, ...]


def lower_scan(ctx: FuncContext, op: ir.ScanOp, guards: tuple[ir.Guard, ...], tag: str) -> LoweredScan:
    """Emits ``op`` into ``ctx`` (see the module docstring)."""
    return _Scan(ctx, op, guards, tag).lower()


def _plain_body() -> Body:
    """A region body for hand-written generics: its values are block arguments only."""
    return Body(lambda n: "", lambda d: "", lambda ld: Source(), "q")


class _Scan:
    def __init__(self, ctx: FuncContext, op: ir.ScanOp, guards: tuple[ir.Guard, ...], tag: str):
        self.ctx, self.op, self.guards, self.tag = ctx, op, guards, tag
        self.acc = _acc_dtype(op.dtype)
        self.elem = STORAGE[self.acc]
        self.loops = [Loop(a.name, a.extent, "parallel") for a in op.axes]
        self.outer = [lp for lp in self.loops if lp.name != op.axis]
        self.dim = [a.name for a in op.axes].index(op.axis)
        self.shape: tuple[Dim, ...] = tuple(a.extent for a in op.axes)
        self.outer_shape: tuple[Dim, ...] = tuple(lp.extent for lp in self.outer)
        self.checks: list[str] = []
        # a carrier of _generic/_round: any Lowering over the scan's axes
        self.lw = Lowering(ctx, ir.MapOp(op.result, self.acc, op.axes, ir.Const(0, self.acc)), guards)

    def lower(self) -> LoweredScan:
        op = self.op
        if op.kind == "linear":
            r = self._linear()
        else:
            x = self._kept_apart(self._map(op.body, op.axes, self.tag))
            ident = self.ctx.fresh("c")
            self.ctx.emit(f"{ident} = arith.constant {_identity(op.kind, op.dtype)} : {self.elem}")
            start = self._fill(ident, self.elem)
            unsigned = op.dtype.is_bool or op.dtype.is_unsigned
            ty = self.elem + "u" if unsigned else self.elem
            body = _plain_body()
            v = body.combine(op.kind, "%sp", "%sq", ty)
            r = self._scan(x, start, self.elem, body, v)
        if op.dtype != self.acc:
            r = self.lw._round(r, self.shape, self.acc, op.dtype)
        return LoweredScan(r, tuple(self.loops), tuple(self.checks))

    # ------------------------------------------------------------ pieces

    def _map(self, e: ir.SExpr, axes: tuple[ir.Axis, ...], tag: str) -> str:
        """``e`` over ``axes`` as a tensor of the accumulator type (its check tensor noted)."""
        low = Lowering(self.ctx, ir.MapOp(self.op.result, self.acc, axes, e), self.guards).lower(tag)
        if low.check is not None:
            self.checks.append(low.check)
        return low.result

    def _kept_apart(self, x: str) -> str:
        """``x`` behind an optimization barrier, its dynamic sizes tied: a body that reads no tensor along the
        scanned axis, or one IREE folds to such (``x ** 0``, ``x % 1``), is cloned into the scan's dispatch by
        IREE, which then sizes its temporary as unbounded on the stack ("exceeded stack allocation limit",
        "stack allocation size overflows 64 bits"). IREE gives a scan a dispatch of its own whatever its body,
        so keeping every body apart costs no fusion."""
        t = self.ctx.tensor_type(self.shape, self.elem)
        kept = self.ctx.fresh("c")
        self.ctx.emit(f"{kept} = util.optimization_barrier {x} : {t}")
        sizes = [self.lw._size(d) for d in self.shape if not isinstance(d, sympy.Integer)]
        if not sizes:
            return kept
        tied = self.ctx.fresh("c")
        self.ctx.emit(f"{tied} = flow.tensor.tie_shape {kept} : {t}{{{', '.join(sizes)}}}")
        return tied

    def _fill(self, value: str, elem: str) -> str:
        out_type = self.ctx.tensor_type(self.outer_shape, elem)
        v = self.ctx.fresh("f")
        self.ctx.emit(f"{v} = linalg.fill ins({value} : {elem}) outs({self.ctx.empty(self.outer_shape, elem)} "
                      f": {out_type}) -> {out_type}")
        return v

    def _scan(self, x: str, start: str, elem: str, body: Body, value: str) -> str:
        """``iree_linalg_ext.scan`` of ``x`` from the accumulator ``start``; ``body`` combines ``%sp`` (the
        running value) with ``%sq`` (the next element) into ``value``.

        The axes before the scanned one, and those after it, are collapsed into one dim each
        first (IREE 3.13's CPU backend cannot bound the stack of a scan of rank 4 or more)."""
        k = self.dim
        groups = [g for g in (list(range(k)), [k], list(range(k + 1, len(self.shape)))) if g]
        outer_groups = [g for g in (list(range(k)), list(range(k, len(self.outer_shape)))) if g]
        shape = tuple(product([self.shape[i] for i in g]) for g in groups)
        outer_shape = tuple(product([self.outer_shape[i] for i in g]) for g in outer_groups)
        x = self._reshape("collapse", x, self.shape, shape, groups, elem)
        start = self._reshape("collapse", start, self.outer_shape, outer_shape, outer_groups, elem)
        t = self.ctx.tensor_type(shape, elem)
        ta = self.ctx.tensor_type(outer_shape, elem)
        r = self.ctx.fresh("scan")
        inclusive = "false" if self.op.exclusive else "true"
        self.ctx.emit(f"{r}:2 = iree_linalg_ext.scan dimension({groups.index([k])}) inclusive({inclusive}) "
                      f"ins({x} : {t}) outs({self.ctx.empty(shape, elem)}, {start} : {t}, {ta}) {{")
        self.ctx.emit(f"^bb0(%sp: {elem}, %sq: {elem}):")
        for line in body.lines:
            self.ctx.emit("  " + line)
        self.ctx.emit(f"  iree_linalg_ext.yield {value} : {elem}")
        self.ctx.emit(f"}} -> {t}, {ta}")
        return self._reshape("expand", f"{r}#0", shape, self.shape, groups, elem)

    def _reshape(self, how: str, v: str, src: tuple[Dim, ...], dst: tuple[Dim, ...], groups: list[list[int]],
                 elem: str) -> str:
        """``v`` collapsed (``src`` into ``dst`` by ``groups``) or expanded back (``dst`` out of ``src``)."""
        if len(src) == len(dst):
            return v
        src_type, dst_type = self.ctx.tensor_type(src, elem), self.ctx.tensor_type(dst, elem)
        r = self.ctx.fresh("c")
        if how == "collapse":
            self.ctx.emit(f"{r} = tensor.collapse_shape {v} {reassociation(groups)} : {src_type} into {dst_type}")
        else:
            sizes = ", ".join(self.lw._size(d) for d in dst)
            self.ctx.emit(f"{r} = tensor.expand_shape {v} {reassociation(groups)} output_shape [{sizes}] "
                          f": {src_type} into {dst_type}")
        return r

    # ------------------------------------------------------------ the recurrence

    def _linear(self) -> str:
        op = self.op
        assert op.coeff is not None and op.init is not None
        if op.dtype.is_bool:
            raise UnsupportedError(f"mlir: the recurrence `{op.name or op.result}` of booleans is not lowered")
        half = 32 if self.acc.is_float else int(self.elem[1:])
        wide = f"i{2 * half}"
        pair = _Pair(self.acc, self.elem, half, wide)
        a = self._map(op.coeff, op.axes, self.tag)
        b = self._map(op.body, op.axes, self.tag + ".b")
        outer_axes = tuple(ax for ax in op.axes if ax.name != op.axis)
        h0 = self._map(op.init, outer_axes, self.tag + ".init")
        names = tuple(lp.name for lp in self.loops)
        outer_names = tuple(lp.name for lp in self.outer)
        t = self.ctx.tensor_type(self.shape, self.elem)
        t0 = self.ctx.tensor_type(self.outer_shape, self.elem)

        # the elements: (a, b), with the first step taken from init when inclusive
        body = _plain_body()
        bv = "%pb"
        if not op.exclusive:
            i = body.let(f"linalg.index {self.dim} : index")
            first = body.let(f"arith.cmpi eq, {i}, {body.const(0, 'index')} : index")
            step = pair.step(body, "%pa", "%ph", "%pb")
            bv = body.let(f"arith.select {first}, {step}, %pb : {self.elem}")
        packed = pair.pack(body, "%pa", bv)
        ins = [(a, t, names, "%pa"), (b, t, names, "%pb"), (h0, t0, outer_names, "%ph")]
        out = (self.ctx.empty(self.shape, wide), self.ctx.tensor_type(self.shape, wide), names)
        x = self.lw._generic(self.tag + ".pairs", ins, out, body, packed, wide, self.loops)

        # the accumulator: (1, init)
        body = _plain_body()
        one = body.const(1.0 if self.acc.is_float else 1, self.elem)
        packed = pair.pack(body, one, "%ph")
        out = (self.ctx.empty(self.outer_shape, wide), self.ctx.tensor_type(self.outer_shape, wide), outer_names)
        start = self.lw._generic("", [(h0, t0, outer_names, "%ph")], out, body, packed, wide, self.outer)

        # (a1, b1) then (a2, b2) is (a2 * a1, a2 * b1 + b2)
        body = _plain_body()
        a1, b1 = pair.unpack(body, "%sp")
        a2, b2 = pair.unpack(body, "%sq")
        prod = body.let(f"{pair.mul} {a2}, {a1} : {self.elem}")
        value = pair.pack(body, prod, pair.step(body, a2, b1, b2))
        r = self._scan(x, start, wide, body, value)

        # the carried value: each pair's b
        body = _plain_body()
        _, h = pair.unpack(body, "%in")
        out = (self.ctx.empty(self.shape, self.elem), t, names)
        return self.lw._generic("", [(r, self.ctx.tensor_type(self.shape, wide), names, "%in")], out, body, h,
                                self.elem, self.loops)


@dataclass(frozen=True)
class _Pair:
    """A recurrence's ``(a, b)`` in one integer of twice their width (``a`` high, ``b`` low)."""

    acc: DType
    elem: str
    half: int
    wide: str

    @property
    def mul(self) -> str:
        return "arith.mulf" if self.acc.is_float else "arith.muli"

    @property
    def add(self) -> str:
        return "arith.addf" if self.acc.is_float else "arith.addi"

    def step(self, body: Body, a: str, h: str, b: str) -> str:
        """``a * h + b``, rounded twice (the interpreter's step)."""
        m = body.let(f"{self.mul} {a}, {h} : {self.elem}")
        return body.let(f"{self.add} {m}, {b} : {self.elem}")

    def _bits(self, body: Body, v: str) -> str:
        return body.let(f"arith.bitcast {v} : f32 to i32") if self.acc.is_float else v

    def pack(self, body: Body, a: str, b: str) -> str:
        h = f"i{self.half}"
        wa = body.let(f"arith.extui {self._bits(body, a)} : {h} to {self.wide}")
        wb = body.let(f"arith.extui {self._bits(body, b)} : {h} to {self.wide}")
        hi = body.let(f"arith.shli {wa}, {body.const(self.half, self.wide)} : {self.wide}")
        return body.let(f"arith.ori {hi}, {wb} : {self.wide}")

    def unpack(self, body: Body, p: str) -> tuple[str, str]:
        h = f"i{self.half}"
        lo = body.let(f"arith.trunci {p} : {self.wide} to {h}")
        shifted = body.let(f"arith.shrui {p}, {body.const(self.half, self.wide)} : {self.wide}")
        hi = body.let(f"arith.trunci {shifted} : {self.wide} to {h}")
        if self.acc.is_float:
            return (body.let(f"arith.bitcast {hi} : i32 to f32"), body.let(f"arith.bitcast {lo} : i32 to f32"))
        return hi, lo


__all__ = ["LoweredScan", "lower_scan"]
