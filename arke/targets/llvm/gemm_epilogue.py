"""A contraction's epilogue in vectors along ``n``, for the LLVM contraction renderer (:mod:`arke.targets.llvm.gemm`).

After a task's last k-block its sums sit in the f32 scratch tile, ``nc`` columns per row. The
epilogue (the sum rounded to the contraction's dtype, then bias, activation, gate, residual,
rounding to the result's dtype ...) used to run one element at a time and left the loop to LLVM's
vectoriser, which made 8-lane code with a constant load per operation and the 16-bit roundings
inlined per lane: in a bf16 SwiGLU the up projection's epilogue cost a third of its AMX GEMM. Here
it runs ``W`` columns at a time (:class:`~arke.targets.llvm.vexpr.VectorExprMixin`): the sums are
one masked load from the tile, loads contiguous along ``n`` one masked load each, and what has no
vector form runs lane by lane through the scalar emitter. Every element takes the scalar code's
steps (the same roundings, the same ``exp``), so results do not change, whatever the thread count.

It applies when the result is a float stored contiguously along ``n`` and the sums are floats; any
other epilogue (an i32 sum, a result transposed against ``n``) keeps the element loop.
"""

from __future__ import annotations

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import equal
from arke.plan.contraction import Contraction
from arke.plan.dispatch import PlanOp
from arke.targets.llvm.gemm_base import Blocking
from arke.targets.llvm.scalar import STORAGE
from arke.targets.llvm.vexpr import VectorExprMixin

#: The dtypes a vector epilogue stores and rounds sums to.
FLOATS = (DType.F32, DType.BF16, DType.F16)
_NONE = ir.Load("%none", (), DType.F32)  # the mixin's "leaf": the sums are recognised by their buffer


class VectorEpilogue(VectorExprMixin):
    """The vector form of :meth:`arke.targets.llvm.gemm._Gemm.finish` (see the module's docstring)."""

    c: Contraction
    blk: Blocking
    integer: bool
    contract: PlanOp

    def leaf(self) -> ir.Load:
        return _NONE

    def varying(self, e: ir.SExpr) -> bool:
        return any((isinstance(x, ir.Idx) and x.name == self.lane_index) or
                   (isinstance(x, ir.Load) and x.src == self.c.result) for x in ir.walk(e))

    def _v_Load(self, e: ir.Load) -> str | None:
        if e.src == self.c.result:  # the finished sums (the epilogue reads them at its own point only)
            return self.svec
        return super()._v_Load(e)

    def lane_axis(self) -> str | None:
        """The result's axis along ``n`` when the epilogue can run in vectors (see the module's docstring)."""
        c = self.c
        if self.integer or c.n is None or self.contract.dtype not in FLOATS:
            return None
        out = c.epilogue if c.epilogue is not None else self.contract
        pairs = dict(zip((a.name for a in self.contract.axes), (a.name for a in out.axes)))
        lane = pairs.get(c.n)
        buf = self.buffer(out.result)
        if lane is None or out.dtype not in FLOATS or buf.dtype is not out.dtype or not out.axes:
            return None
        if out.axes[-1].name != lane or len(buf.shape) != len(out.axes):
            return None
        if equal(buf.shape[-1], self.extent[c.n]) is not True:
            return None
        return lane

    def vector_finish(self, n0: str, nc: str, tile: str, m_ext: str, listed: tuple[str, str] | None) -> bool:
        """The epilogue on the tile's rows ``W`` columns at a time, stored; False (nothing emitted) where
        it cannot run in vectors."""
        lane = self.lane_axis()
        if lane is None:
            return False
        c, w, vec = self.c, self.vec.w, self.vec
        self.lane_index = lane
        out = c.epilogue if c.epilogue is not None else self.contract
        buf = self.buffer(out.result)
        t64 = vec.ty("i64")
        last = self.let(f"add i64 {n0}, {self.let(f'sub i64 {nc}, 1')}")

        def row(i: str) -> None:
            if c.m is not None:
                self.current[c.m] = self.listed_row(listed[0], i) if listed is not None else i  # type: ignore[attr-defined]
            if c.epilogue is not None:
                for mine, theirs in zip(c.epilogue.axes, self.contract.axes):
                    if theirs.name != c.n:
                        self.current[mine.name] = self.current[theirs.name]
            base = self.let(f"mul i64 {i}, {self.blk.nc}")
            offset = self.row_offset(buf, [ir.Idx(a.name) for a in out.axes[:-1]])

            def columns(col: str) -> None:
                n = self.let(f"add i64 {n0}, {col}")
                self.current[c.n] = self.current[lane] = n
                self.lane_start, self.lane_mask = n, vec.lanes_below(col, nc)
                # lanes past the slab repeat its last column: computed lane by lane, they stay in range
                lanes = self.let(f"add {t64} {vec.splat(n, 'i64')}, {vec.iota('i64')}")
                inside = self.let(f"icmp slt {t64} {lanes}, {vec.splat(last, 'i64')}")
                self.jvec = self.let(f"select {vec.ty('i1')} {inside}, {t64} {lanes}, {t64} {vec.splat(last, 'i64')}")
                at = self.let(f"getelementptr inbounds float, ptr {tile}, i64 {self.let(f'add i64 {base}, {col}')}")
                # the sum is rounded to the contraction's dtype first, as the interpreter stores it
                self.svec = vec.rounded(vec.masked_load(at, self.lane_mask), self.contract.dtype)
                body = c.epilogue.body if c.epilogue is not None else None
                if isinstance(body, ir.Cast) and body.dtype is buf.dtype and body.x.dtype.is_float:
                    body = body.x  # the store rounds to the result's dtype: a second rounding changes nothing
                value = self.vector(body) if body is not None else self.svec
                q = self.let(f"getelementptr inbounds {STORAGE[buf.dtype]}, ptr {self.ptr[buf.name]}, "
                             f"i64 {self.let(f'add i64 {offset}, {n}')}")
                self.emit(vec.masked_store_as(value, q, self.lane_mask, buf.dtype))
                self.lane_start = self.lane_mask = None

            self.counted("vcol", "0", nc, columns, step=w)

        self.counted("out", "0", m_ext, row)
        return True


__all__ = ["FLOATS", "VectorEpilogue"]
