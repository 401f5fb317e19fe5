"""A rows dispatch whose map members run their innermost loop as partitioned pieces of vector code.

A member of a row group loops over the axes after the rows; where its innermost index enters a
condition, a remainder or a select of subscripts (rotary embeddings' ``e < R`` and ``e % R``, a
partner element at ``e + R if e < R else e - R``), LLVM cannot vectorise that loop: every lane would
be a gather. Within a row the member is the same pointwise map a single-op dispatch would be, so it
gets the same loop partitioning (:mod:`arke.targets.llvm.partition`): between breakpoints each
condition holds one value and each subscript is affine, and each piece is one vector loop of
contiguous loads (checked before it runs; a piece that fails its checks runs the generic loop).

Internal values (``cs[n, e]`` computed once per row) live in the worker's scratch row; the pieces read
and write them there like any other row (:meth:`PartitionedRowsFunction.row_offset`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from arke.ir import semantic as ir
from arke.plan.dispatch import Buffer, Dispatch, KernelPlan, PlanOp
from arke.targets.llvm.partition import Partition, analyse
from arke.targets.llvm.partition_emit import PartitionMixin
from arke.targets.llvm.rows import RowsFunction
from arke.targets.llvm.vec import Vec


class PartitionedRowsFunction(PartitionMixin, RowsFunction):
    """:class:`~arke.targets.llvm.rows.RowsFunction` with each map member's innermost loop partitioned
    where :func:`~arke.targets.llvm.partition.analyse` finds something to gain."""

    def __init__(self, plan: KernelPlan, dispatch: Dispatch, name: str, declare: Callable[[str], None],
                 vector_bits: int = 512):
        super().__init__(plan, dispatch, name, declare, vector_bits)
        self.vec = Vec(max(4, vector_bits // 32), self.let, declare)
        self.start_pieces(None)

    def member(self, op: PlanOp, rows: list[str], reused: dict[ir.SExpr, str]) -> None:
        self.start_pieces(self.partition(op, reused))
        try:
            super().member(op, rows, reused)
        finally:
            self.start_pieces(None)

    def partition(self, op: PlanOp, reused: dict[ir.SExpr, str]) -> Partition | None:
        """The partition of a map member's innermost index, where its loop is a plain one over that index's
        whole extent (not a split row's chunk, not reading terms a reduction kept, no strategy loop hints)."""
        if not isinstance(op, ir.MapOp) or len(op.axes) <= self.r or reused or op.result in self.spans:
            return None
        axis = op.axes[-1].name
        if self.plan.decision("vectorize", axis) is not None or self.plan.decision("unroll", axis) is not None:
            return None
        return analyse(op, self.vec.w)

    def nest(self, axes: list[str], inner: Callable[[], None]) -> None:
        if self.partitioned and axes == [self.part.axis] and self.span(axes[0]) is None:
            self.pieces("0", self.dim(self.extent[axes[0]]))
            return
        super().nest(axes, inner)

    def row_offset(self, buf: Buffer, subs: Sequence[ir.SExpr]) -> str:
        if buf.name in self.local:  # a value kept per row: its row of scratch, the row subscripts dropped
            return super().row_offset(self.local[buf.name], subs[self.r:])
        return super().row_offset(buf, subs)
