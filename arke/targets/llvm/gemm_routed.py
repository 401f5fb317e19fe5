"""Routed rows for the LLVM contraction renderer: a contraction run only over the rows that need it.

A contraction whose epilogue selects on a condition of its rows (``Contraction.rows_when``, see
:mod:`arke.plan.contraction`: ``sum(x[t, d] * w[e, f, d] for d) if routed[t, e] else 0.0``) is a
*grouped* product: for each batch entry (an expert ``e``) only the rows where the condition
holds (the tokens routed to it) need their sums. Per task, before anything is packed:

1. the condition is evaluated for every row of the current batch entry, and the rows where it
   holds are listed in order in the worker's scratch (``count`` of them);
2. the blocked product runs over the listed rows only (row ``i`` of a register block reads A's
   row ``list[i]``; the sum tile holds the listed rows densely), and when no row is listed,
   ``B`` is not even packed: an expert no token chose costs one pass over the condition;
3. the epilogue runs on each listed row's finished sums and stores them at the row's place; every
   other row stores the epilogue's other branch (the epilogue evaluated with a sum of 0, which
   its select does not read there).

Each row's sum runs over k in the same order as without the list, so results are bit-identical
to the dense form's whatever the routing and the thread count.
"""

from __future__ import annotations

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.plan.dispatch import PlanOp
from arke.targets.llvm.gemm_bf16 import GemmMatrix


class GemmRouted(GemmMatrix):
    """The routed-rows parts of a contraction dispatch (see :class:`arke.targets.llvm.gemm._Gemm`)."""

    def routed(self) -> bool:
        """Whether this contraction runs over its listed rows only (it has a row condition)."""
        # (a batch-reduce one, with outer reduce axes, adds several products into each row: dense)
        return self.c.rows_when is not None and self.c.m is not None and not self.c.outer

    def list_rows(self, at: str) -> str:
        """List the rows of the current batch entry whose condition holds at ``at`` (i64 words);
        returns the count (an SSA value)."""
        c = self.c
        m_axis, cond = c.m, c.rows_when
        assert m_axis is not None and cond is not None
        self.loops_made += 1
        count = f"%routed.{self.loops_made}.p"
        self.prologue.append(f"  {count} = alloca i64")
        self.emit(f"store i64 0, ptr {count}")

        def row(m: str) -> None:
            self.current[m_axis] = m
            keep = self.expr(cond)

            def add() -> None:
                n = self.let(f"load i64, ptr {count}")
                q = self.let(f"getelementptr inbounds i64, ptr {at}, i64 {n}")
                self.emit(f"store i64 {m}, ptr {q}")
                n1 = self.let(f"add i64 {n}, 1")
                self.emit(f"store i64 {n1}, ptr {count}")

            self.branch(keep, add)

        self.counted("route", "0", self.dim(self.rows()), row)
        return self.let(f"load i64, ptr {count}")

    def store_unrouted(self, n0: str, nc: str) -> None:
        """Every row whose condition is false: the epilogue's other branch, at columns [n0, n0 + nc)."""
        c, epi = self.c, self.c.epilogue
        m_axis, cond = c.m, c.rows_when
        assert m_axis is not None and cond is not None and epi is not None
        contract = self.contract

        def row(m: str) -> None:
            self.current[m_axis] = m
            skip = self.let(f"xor i1 {self.expr(cond)}, true")

            def columns() -> None:
                def column(col: str) -> None:
                    self.current[c.n] = self.let(f"add i64 {n0}, {col}")
                    for mine, theirs in zip(epi.axes, contract.axes):
                        self.current[mine.name] = self.current[theirs.name]
                    self.accumulated = self.convert("0.0", DType.F32, contract.dtype)
                    value = self.expr(epi.body)
                    self.accumulated = None
                    self.store(self.buffer(epi.result), [ir.Idx(a.name) for a in epi.axes], value, epi.dtype)

                self.counted("ucol", "0", nc, column)

            self.branch(skip, columns)

        self.counted("unrouted", "0", self.dim(self.rows()), row)

    accumulated: str | None
    contract: PlanOp


__all__ = ["GemmRouted"]
