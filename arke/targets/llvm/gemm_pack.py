"""Packing for the LLVM contraction renderer (:mod:`arke.targets.llvm.gemm`): operands copied into
the layouts the micro-kernel reads.

``B``'s k-block of a slab goes into ``nr``-wide panels ``[panel][k][nr]`` of f32, zero past the
slab's columns: a row of ``nr`` at a time when ``B`` is contiguous along n, ``lanes × lanes``
blocks transposed in registers when it is stored along k (``w[n, k]``), else a column at a time,
or through ``B``'s prologue expression. ``A`` is packed (through its prologue, if it has one)
into ``[kc][mr]`` panels per row block; for decode its few rows are evaluated once into
contiguous f32 rows.
"""

from __future__ import annotations

from arke.ir import semantic as ir
from arke.targets.llvm.gemm_base import GemmBase


class GemmPacking(GemmBase):
    """Packs a contraction's operands for the micro-kernel (see :class:`arke.targets.llvm.gemm._Gemm`)."""

    def pack(self, b0: str, b_ty: str, n0: str, nc: str, pc: str, kc: str, sb_k: str, sb_n: str,
             panels: str, packed: str) -> None:
        """``packed[panel][kk][l] = f32(B[pc + kk, n0 + panel*nr + l])``, 0 past the slab's columns.

        When B is contiguous along n, whole panels are copied a row of ``nr`` at a time (vector
        loads along n); otherwise each column is read down k, the order B is stored in.
        """
        if self.plain_b is None:
            self.pack_expression(n0, nc, pc, kc, panels, packed)
            return
        blk, b_dtype = self.blk, self.buffer(self.plain_b.src).dtype
        if self.plain_b.indices[-1] == ir.Idx(self.c.n):
            full = self.let(f"udiv i64 {nc}, {blk.nr}")
            vec, raw = f"<{blk.nr} x float>", f"<{blk.nr} x {b_ty}>"

            def row(kk: str) -> None:
                k = self.let(f"add i64 {pc}, {kk}")
                src = self.let(f"mul i64 {k}, {sb_k}")
                src = self.let(f"add i64 {src}, {n0}")

                def whole(p: str) -> None:
                    col = self.let(f"mul i64 {p}, {blk.nr}")
                    at = self.let(f"add i64 {src}, {col}")
                    ptr = self.let(f"getelementptr inbounds {b_ty}, ptr {b0}, i64 {at}")
                    v = self.to_f32(self.let(f"load {raw}, ptr {ptr}, align 1"), b_dtype, vec)
                    o = self.let(f"mul i64 {p}, {kc}")
                    o = self.let(f"add i64 {o}, {kk}")
                    o = self.let(f"mul i64 {o}, {blk.nr}")
                    q = self.let(f"getelementptr inbounds float, ptr {packed}, i64 {o}")
                    self.emit(f"store {vec} {v}, ptr {q}, align 4")

                self.counted("whole", "0", full, whole)
            self.counted("prow", "0", kc, row)
            self.pack_columns(b0, b_ty, n0, nc, pc, kc, sb_k, sb_n, full, panels, packed)
        elif self.contiguous_k(self.plain_b) and blk.nr % blk.lanes == 0 and blk.lanes >= 4:
            full = self.let(f"udiv i64 {nc}, {blk.nr}")
            deep = self.let(f"and i64 {kc}, {-blk.lanes}")
            self.pack_transposed(b0, b_ty, n0, pc, deep, kc, sb_n, full, packed)
            self.pack_columns(b0, b_ty, n0, nc, pc, kc, sb_k, sb_n, full, panels, packed)  # the last, partial panel
            self.pack_columns(b0, b_ty, n0, nc, pc, kc, sb_k, sb_n, "0", full, packed, k_from=deep)  # k tail
        else:
            self.pack_columns(b0, b_ty, n0, nc, pc, kc, sb_k, sb_n, "0", panels, packed)

    def pack_transposed(self, b0: str, b_ty: str, n0: str, pc: str, deep: str, kc: str, sb_n: str, full: str,
                        packed: str) -> None:
        """Whole panels of a B stored along k (``w[n, k]``, as ``linear`` reads it), for k below ``deep``
        (a multiple of the lanes): ``lanes × lanes`` blocks loaded as vectors along k, one per
        column, and transposed in registers into rows of the panel (vector stores along n)."""
        from arke.targets.llvm.vec import Vec

        assert self.plain_b is not None
        blk, b_dtype = self.blk, self.buffer(self.plain_b.src).dtype
        w = blk.lanes
        vec = Vec(w, self.let, self.declare)
        raw = f"<{w} x {b_ty}>"

        def panel(p: str) -> None:
            col0 = self.let(f"mul i64 {p}, {blk.nr}")
            col0 = self.let(f"add i64 {n0}, {col0}")
            dst0 = self.let(f"mul i64 {p}, {kc}")

            def block(kb: str) -> None:
                k = self.let(f"add i64 {pc}, {kb}")
                for half in range(blk.nr // w):
                    rows = []
                    for lane in range(w):
                        n = self.let(f"add i64 {col0}, {half * w + lane}")
                        at = self.let(f"mul i64 {n}, {sb_n}")
                        at = self.let(f"add i64 {at}, {k}")
                        ptr = self.let(f"getelementptr inbounds {b_ty}, ptr {b0}, i64 {at}")
                        rows.append(self.to_f32(self.let(f"load {raw}, ptr {ptr}, align 1"), b_dtype, vec.f))
                    for j, row in enumerate(vec.transpose(rows)):
                        o = self.let(f"add i64 {dst0}, {kb}")
                        o = self.let(f"add i64 {o}, {j}")
                        o = self.let(f"mul i64 {o}, {blk.nr}")
                        o = self.let(f"add i64 {o}, {half * w}")
                        q = self.let(f"getelementptr inbounds float, ptr {packed}, i64 {o}")
                        self.emit(f"store {vec.f} {row}, ptr {q}, align 4")

            self.counted("tk", "0", deep, block, step=w)

        self.counted("tpanel", "0", full, panel)

    def pack_columns(self, b0: str, b_ty: str, n0: str, nc: str, pc: str, kc: str, sb_k: str, sb_n: str,
                     first: str, panels: str, packed: str, k_from: str = "0") -> None:
        """Panels ``first`` to ``panels`` packed a column at a time (reading down k, from ``k_from``)."""
        assert self.plain_b is not None
        blk, b_dtype = self.blk, self.buffer(self.plain_b.src).dtype

        def panel(p: str) -> None:
            col0 = self.let(f"mul i64 {p}, {blk.nr}")
            dst0 = self.let(f"mul i64 {p}, {kc}")
            dst0 = self.let(f"mul i64 {dst0}, {blk.nr}")

            def column(lane: str) -> None:
                col = self.let(f"add i64 {col0}, {lane}")
                inside = self.let(f"icmp slt i64 {col}, {nc}")
                safe = self.let(f"select i1 {inside}, i64 {col}, i64 0")
                n = self.let(f"add i64 {n0}, {safe}")
                src = self.let(f"mul i64 {n}, {sb_n}")
                kb = self.let(f"mul i64 {pc}, {sb_k}")
                src = self.let(f"add i64 {src}, {kb}")
                dst = self.let(f"add i64 {dst0}, {lane}")

                def step(kk: str) -> None:
                    s = self.let(f"mul i64 {kk}, {sb_k}")
                    s = self.let(f"add i64 {src}, {s}")
                    ptr = self.let(f"getelementptr inbounds {b_ty}, ptr {b0}, i64 {s}")
                    v = self.to_f32(self.let(f"load {b_ty}, ptr {ptr}"), b_dtype)
                    v = self.let(f"select i1 {inside}, float {v}, float 0.0")
                    o = self.let(f"mul i64 {kk}, {blk.nr}")
                    o = self.let(f"add i64 {dst}, {o}")
                    q = self.let(f"getelementptr inbounds float, ptr {packed}, i64 {o}")
                    self.emit(f"store float {v}, ptr {q}")

                self.counted("kk", k_from, kc, step)

            self.counted("lane", "0", str(blk.nr), column)

        self.counted("panel", first, panels, panel)

    def evaluate_rows(self, dst: str) -> None:
        """``dst[m * K + k] = A(m, k)`` (through A's prologue) for the few rows of a decode call."""
        c = self.c
        m_axis = c.m
        assert m_axis is not None
        k_ext = self.dim(self.extent[c.k])

        def row(m: str) -> None:
            self.current[m_axis] = m
            base = self.let(f"mul i64 {m}, {k_ext}")

            def step(k: str) -> None:
                self.current[c.k] = k
                v = self.expr(c.a)
                q = self.let(f"add i64 {base}, {k}")
                q = self.let(f"getelementptr inbounds float, ptr {dst}, i64 {q}")
                self.emit(f"store float {v}, ptr {q}")

            self.counted("ek", "0", k_ext, step)

        self.counted("em", "0", self.dim(self.rows()), row)

    def pack_a_row(self, row: str, r: int, pc: str, kc: str, a_rows: str) -> str:
        """Row ``r`` of the packed A block, interleaved ``[kk][mr]``: ``A(row, pc + kk)`` for kk < kc
        (through the prologue, if A has one). Returns the row's first element."""
        c, mr = self.c, self.blk.mr
        dst = self.let(f"getelementptr inbounds float, ptr {a_rows}, i64 {r}")
        if c.m is not None:
            self.current[c.m] = row

        def step(kk: str) -> None:
            self.current[c.k] = self.let(f"add i64 {pc}, {kk}")
            v = self.expr(c.a)
            at = self.let(f"mul i64 {kk}, {mr}")
            q = self.let(f"getelementptr inbounds float, ptr {dst}, i64 {at}")
            self.emit(f"store float {v}, ptr {q}")

        self.counted("ak", "0", kc, step)
        return dst

    def pack_expression(self, n0: str, nc: str, pc: str, kc: str, panels: str, packed: str) -> None:
        """B panels through B's prologue expression (0 past the slab's columns)."""
        c, blk = self.c, self.blk

        def panel(p: str) -> None:
            col0 = self.let(f"mul i64 {p}, {blk.nr}")
            dst0 = self.let(f"mul i64 {p}, {kc}")
            dst0 = self.let(f"mul i64 {dst0}, {blk.nr}")

            def row(kk: str) -> None:
                self.current[c.k] = self.let(f"add i64 {pc}, {kk}")
                base = self.let(f"mul i64 {kk}, {blk.nr}")
                base = self.let(f"add i64 {dst0}, {base}")

                def lane(li: str) -> None:
                    col = self.let(f"add i64 {col0}, {li}")
                    inside = self.let(f"icmp slt i64 {col}, {nc}")
                    safe = self.let(f"select i1 {inside}, i64 {col}, i64 0")
                    self.current[c.n] = self.let(f"add i64 {n0}, {safe}")
                    v = self.let(f"select i1 {inside}, float {self.expr(c.b)}, float 0.0")
                    q = self.let(f"add i64 {base}, {li}")
                    q = self.let(f"getelementptr inbounds float, ptr {packed}, i64 {q}")
                    self.emit(f"store float {v}, ptr {q}")

                self.counted("bl", "0", str(blk.nr), lane)

            self.counted("bk", "0", kc, row)

        self.counted("bpanel", "0", panels, panel)
