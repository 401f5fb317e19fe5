"""The LLVM form of a rows dispatch (:mod:`arke.plan.rows`): every member, row by row, in one function.

The function has the generic signature (see :mod:`arke.targets.llvm.function`). Its workers split the
group's row axes, flattened into one range ``[lo, hi)``; for each row, each member's loop
nest over its remaining axes (and reduce axes) runs in order, so a row read by the first
member is still in the cache when the later ones read it again. Every element is computed
by exactly the code the single-op form would use (the same reductions in the same order),
so a result never depends on the thread count.

Per row, a member's value that nothing outside the group reads (the dispatch's
``internal`` values) lives in the worker: a scalar statistic (``mx[m]``) in a stack slot
that LLVM keeps in a register, a wider one (``p[t, e]``) in a row of the worker's scratch
memory. And when a later member evaluates the very expression a reduction summed
(softmax's ``exp(x - mx)``, summed and then divided), the reduction keeps each term and the
later member reads it back instead of computing it again: the same bits, at the cost of a
load from L1. The terms are kept in that member's own result row when it can hold them (as
torch's softmax does: the row is written once more, but no other row competes for the cache),
else in a scratch row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, equal
from arke.passes.rewrite import op_exprs
from arke.plan.dispatch import Buffer, Dispatch, KernelPlan, PlanOp
from arke.plan.exprs import loads_in
from arke.plan.families import subexprs
from arke.plan.rows import RowGroup, rename
from arke.plan.rows_split import GroupSplit, find_split
from arke.targets.llvm.function import LLVMFunction
from arke.targets.llvm.scalar import STORAGE

#: Ops worth computing once and reading back: anything beyond a few adds and multiplies.
_COSTLY_BINARY = frozenset({"div", "pow", "mod", "floordiv"})


class RowsFunction(LLVMFunction):
    """Emits one rows dispatch: a flat loop over rows, and every member's loops inside it."""

    def __init__(self, plan: KernelPlan, dispatch: Dispatch, name: str, declare: Callable[[str], None],
                 vector_bits: int = 512):
        group = dispatch.pattern
        if not isinstance(group, RowGroup):
            raise TypeError(f"{name}: a rows dispatch needs its RowGroup pattern")
        self.r = group.rows
        self.members: tuple[PlanOp, ...] = dispatch.members
        self.internal = {op.result: op for op in self.members if op.result in dispatch.internal}
        super().__init__(plan, dispatch, name, declare, vector_bits)
        self.local: dict[str, Buffer] = {}  # internal value -> its per-row storage (the row axes dropped)
        self.scratch_used: Dim = sympy.Integer(0)
        self.kept: dict[str, tuple[str, str]] = {}  # reduction -> (its terms' scratch row, its reduce axis)
        self.reused: dict[ir.SExpr, tuple[str, str]] = {}  # in the current member: expr -> (row, axis)
        self.spans: dict[str, tuple[str, str]] = {}  # split rows: member -> its chunk of its first axis
        self.chunk: tuple[str, str, str] | None = None  # in the current member: (axis, lo, hi) of its chunk

    def _buffers_used(self) -> set[str]:
        names = set()
        for op in self.members:
            names.add(op.result)
            names |= {x.src for e in op_exprs(op) for x in loads_in(e)}
        return names - set(self.internal)

    # -- the function
    def render(self) -> str:
        self.start_error_flag()
        rows = [f"%row{k}" for k in range(self.r)]  # names no IR axis can have
        self.extent = {name: a.extent for name, a in zip(rows, self.op.axes)}
        self.place_internal()
        reuse = shared_terms(self.members, self.r)
        in_place = self.place_terms(reuse)
        split = self.usable_split()
        fits = ""
        if split is not None:  # the workers share (row, chunk) pairs: see arke.plan.rows_split
            self.extent["%chunk"] = split.chunks
            fits = self.split_fits(split)

        def row() -> None:
            at = [self.current[name] for name in rows]
            if split is not None:
                self.chunk_spans(split, fits)
            for src, reader in in_place.items():
                self.kept[src] = (self.result_row(reader, at), self.kept[src][1])
            for op in self.members:
                self.member(op, at, {term: self.kept[src][0] for src, (reader, term) in reuse if reader is op})

        self.parallel_extent = self.flat_loop(rows + (["%chunk"] if split is not None else []), row)
        return self.text()

    def usable_split(self) -> GroupSplit | None:
        """The group's chunks (:func:`~arke.plan.rows_split.find_split`), where every member loops its
        first axis after the rows itself (not as the lanes of a row of accumulators)."""
        split = find_split(self.members, self.r)
        if split is None:
            return None
        for op in self.members:
            self.op = op
            if self.rows_axis() == op.axes[self.r].name:
                return None
        return split

    def split_fits(self, split: GroupSplit) -> str:
        """Whether, at this call's dims, every member's extent is the chunk count times its width
        (the dims may break a divisibility the split needs): once per call, before the rows."""
        count = self.dim(split.chunks)
        ok = "true"
        for op in self.members:
            whole = self.let(f"mul i64 {count}, {self.dim(split.widths[op.result])}")
            fits = self.let(f"icmp eq i64 {whole}, {self.dim(op.axes[self.r].extent)}")
            ok = self.let(f"and i1 {ok}, {fits}")
        return ok

    def chunk_spans(self, split: GroupSplit, ok: str) -> None:
        """Each member's slice of its first axis on this chunk: ``[j·w, (j+1)·w)``; where the dims do not
        divide (``ok`` false: :meth:`split_fits`), chunk 0 runs the whole row and the others nothing."""
        j = self.current["%chunk"]
        first = self.let(f"icmp eq i64 {j}, 0")
        for op in self.members:
            w = self.dim(split.widths[op.result])
            lo = self.let(f"mul i64 {j}, {w}")
            hi = self.let(f"add i64 {lo}, {w}")
            everything = self.let(f"select i1 {first}, i64 {self.dim(op.axes[self.r].extent)}, i64 0")
            self.spans[op.result] = (self.let(f"select i1 {ok}, i64 {lo}, i64 0"),
                                     self.let(f"select i1 {ok}, i64 {hi}, i64 {everything}"))

    def span(self, axis: str) -> tuple[str, str] | None:
        if self.chunk is not None and self.chunk[0] == axis:
            return self.chunk[1], self.chunk[2]
        return None

    def place_terms(self, reuse: list[tuple[str, tuple[PlanOp, ir.SExpr]]]) -> dict[str, PlanOp]:
        """Where each reduction keeps the terms a later member reads again: in that member's own
        result row when it is an f32 map (each element is read just before it is overwritten,
        and the row is the one the member writes anyway: no extra cache traffic), else in a row
        of scratch. Returns the reductions of the first kind, with their readers."""
        in_place: dict[str, PlanOp] = {}
        for src, (reader, _) in reuse:
            if src in self.kept:
                continue
            op = next(m for m in self.members if m.result == src)
            assert isinstance(op, ir.ReduceOp)
            axis = op.reduce_axes[0]
            alone = sum(1 for other, _ in reuse if other == src) == 1  # no one reads them after it
            if alone and isinstance(reader, ir.MapOp) and reader.dtype is DType.F32 \
                    and len(reader.axes) == self.r + 1 and reader.result not in self.internal:
                in_place[src] = reader
                self.kept[src] = ("", axis.name)  # the row's address is set per row
            else:
                self.kept[src] = (self.scratch_row(axis.extent), axis.name)
        return in_place

    def result_row(self, op: PlanOp, rows: list[str]) -> str:
        """The address of element 0 of ``op``'s result on this row."""
        for a, v in zip(op.axes, rows):
            self.current[a.name] = v
        self.extent = {a.name: a.extent for a in op.axes}
        at: list[ir.SExpr] = [ir.Idx(a.name) for a in op.axes[:self.r]]
        return self.address(self.buffer(op.result), [*at, ir.Const(0, DType.I64)])

    def member(self, op: PlanOp, rows: list[str], reused: dict[ir.SExpr, str]) -> None:
        """One member on the current row: its loops over the axes after the rows, then its element."""
        self.op = op
        self.extent = {a.name: a.extent for a in op.axes}
        if isinstance(op, ir.ReduceOp):
            self.extent.update({a.name: a.extent for a in op.reduce_axes})
        for a, value in zip(op.axes, rows):
            self.current[a.name] = value
        rest = [a.name for a in op.axes[self.r:]]
        lane_axis = rest[-1] if rest else (op.reduce_axes[0].name if isinstance(op, ir.ReduceOp) else None)
        if lane_axis is not None:
            self.reused = {term: (row, lane_axis) for term, row in reused.items()}
        lanes = self.rows_axis()
        outer = [a for a in rest if a != lanes]
        if op.result in self.spans:
            self.chunk = (op.axes[self.r].name, *self.spans[op.result])
        self.nest(outer, (lambda: self.contract_rows(lanes)) if lanes is not None else self.element)
        self.reused, self.chunk = {}, None

    def rows_axis(self) -> str | None:
        """The single-op form's choice of a row of accumulators, among the axes after the rows."""
        op = self.op
        if not isinstance(op, ir.ReduceOp) or len(op.axes) <= self.r:
            return None
        n = op.axes[-1].name
        return n if any(x.indices and x.indices[-1] == ir.Idx(n) for x in loads_in(op.body)) else None

    # -- per-row storage
    def place_internal(self) -> None:
        """A stack slot for each internal statistic, a scratch row for each wider internal value."""
        for name, op in self.internal.items():
            rest = op.type.shape[self.r:]
            if rest:
                size: Dim = sympy.Integer(1)
                for d in rest:
                    size = size * d
                self.ptr[name] = self.scratch_row(size)
            else:
                self.ptr[name] = self._pro(f"alloca {STORAGE[op.dtype]}")
            self.local[name] = Buffer(name, op.dtype, rest, "internal")

    def scratch_row(self, elements: Dim) -> str:
        """The next ``elements`` 8-byte slots of the worker's scratch (each use gets its own)."""
        offset = self.scratch_used
        self.scratch_used = sympy.expand(offset + elements)
        self.scratch = self.scratch_used
        if offset == 0:
            return "%scratch"
        return self._pro(f"getelementptr inbounds i64, ptr %scratch, i64 {self.dim(offset)}")

    def buffer(self, name: str) -> Buffer:
        if name in self.internal:
            op = self.internal[name]
            return Buffer(name, op.dtype, op.type.shape, "internal")
        return super().buffer(name)

    def address(self, buf: Buffer, subs: Sequence[ir.SExpr]) -> str:
        if buf.name in self.local:  # the matcher proved the row subscripts are this row's
            return super().address(self.local[buf.name], subs[self.r:])
        return super().address(buf, subs)

    # -- terms computed once
    def reduced(self, op: ir.ReduceOp | ir.ContractOp, term: str) -> None:
        if op.result in self.kept:
            row, axis = self.kept[op.result]
            p = self.let(f"getelementptr inbounds float, ptr {row}, i64 {self.current[axis]}")
            self.emit(f"store float {term}, ptr {p}")

    def expr(self, e: ir.SExpr) -> str:
        if self.reused and e in self.reused:
            row, axis = self.reused[e]
            p = self.let(f"getelementptr inbounds float, ptr {row}, i64 {self.current[axis]}")
            return self.let(f"load float, ptr {p}")
        return super().expr(e)


def shared_terms(members: Sequence[PlanOp], r: int) -> list[tuple[str, tuple[PlanOp, ir.SExpr]]]:
    """(reduction, (later member, term)) for each costly float term a later member evaluates again.

    The reduction must reduce one axis of its row (no axes after the rows) and the reader
    run over one lane axis of the same extent: after its last row axis, or (a reduction
    with no axes after the rows) its one reduce axis. ``term`` is the reduction's body in
    the reader's axis names.
    """
    found: list[tuple[str, tuple[PlanOp, ir.SExpr]]] = []
    for k, src in enumerate(members):
        if not (isinstance(src, ir.ReduceOp) and len(src.axes) == r and len(src.reduce_axes) == 1
                and src.body.dtype.is_float and _costly(src.body)):
            continue
        for reader in members[k + 1:]:
            lane = _lane(reader, r)
            if lane is None or equal(lane.extent, src.reduce_axes[0].extent) is not True:
                continue
            names = {a.name: b.name for a, b in zip(src.axes, reader.axes)}
            names[src.reduce_axes[0].name] = lane.name
            term = rename(src.body, names)
            if any(x == term for e in op_exprs(reader) for x in subexprs(e)):
                found.append((src.result, (reader, term)))
    return found


def _lane(op: PlanOp, r: int) -> ir.Axis | None:
    """The one axis a member runs over within a row, if it has exactly one."""
    rest = list(op.axes[r:]) + (list(op.reduce_axes) if isinstance(op, ir.ReduceOp) else [])
    return rest[0] if len(rest) == 1 else None


def _costly(e: ir.SExpr) -> bool:
    return any((isinstance(x, ir.Unary) and x.op not in ("neg", "abs", "not")) or
               (isinstance(x, ir.Binary) and x.op in _COSTLY_BINARY) for x in subexprs(e))
