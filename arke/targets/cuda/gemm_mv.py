"""The matrix-vector form of the CUDA-C contraction: decode-sized ``M`` (or no ``m`` at all).

A decode step's linear layer reads a whole weight matrix to produce a few rows: it is bound by
memory, and a 128-row tile would multiply mostly padding. Here one block covers every row of
a batch entry (``M <= MV_ROWS``, or one row when the contraction has no ``m``) for a group of
columns, so each element of ``B`` is read once, in one of two ways chosen when the kernel is
rendered:

* **k split** (``B`` not contiguous along ``n``: ``linear``'s ``w[n, k]``): each warp owns
  :data:`COLUMNS_PER_WARP` columns; lane ``l`` sums the terms ``k = l, l + 32, ...`` in order
  (the warp reads 32 neighbouring elements of each row at a time); then the lanes' partial
  sums (``MV_ROWS × COLUMNS_PER_WARP`` each) are reduced and spread at once by
  ``__shfl_xor_sync`` steps in which each lane keeps half of its values and sends the other
  half, so that one lane ends with each (row, column) total and finishes it;
* **a thread per column** (``B`` contiguous along ``n``: ``matmul``'s ``b[k, n]``, attention's
  values): thread ``t`` sums column ``t`` over ``k`` in order; neighbouring threads read
  neighbouring elements, and the rows' ``A`` values are the same address for the whole warp.

Either order is fixed when the kernel is rendered. Sides are evaluated in f32 as they are read
(a prologue through ``CExpr``; rows past ``M`` are skipped by block-uniform branches), the
epilogue on each finished element. Every thread reaches every shuffle, as collectives must.

The sizes are small on purpose: ptxas trades a cold spill for an occupancy step when a kernel
needs a few registers more than a step allows (48, 64, 80 ... at 256 threads), and four rows
of two columns per warp keep every stdlib contraction clear of that on sm_80 and sm_90.
"""

from __future__ import annotations

from arke.ir.shapes import Dim, ceil_div, dim_str
from arke.plan.contraction import Contraction
from arke.plan.dispatch import Dispatch, KernelPlan
from arke.plan.exprs import decided
from arke.targets.artifact import LaunchSpec, UnsupportedError
from arke.targets.cuda.gemm_base import (
    Direct,
    GemmText,
    batch_count,
    n_contiguous,
    side_value,
    split_batch,
    store_result,
)

#: The most rows the matrix-vector form computes (more take the tiled form).
MV_ROWS = 4
#: Columns each warp finishes in the k-split form.
COLUMNS_PER_WARP = 2
#: Default warps of a block.
MV_WARPS = 8


def render_matvec(plan: KernelPlan, d: Dispatch, entry: str, gate: Dim) -> tuple[str, LaunchSpec]:
    """The matrix-vector entry of a contraction dispatch and its launch (its grid times ``gate``: 0 or 1)."""
    c = d.pattern
    assert isinstance(c, Contraction)
    warps = decided(plan, "warps", None) or MV_WARPS
    if warps > 32:
        raise UnsupportedError(f"{entry} (matrix-vector): warps = {warps} is over 32 (1024 threads)", code="AK4004")
    threads = 32 * warps
    g = GemmText(plan, d, entry, threads)
    per_thread = n_contiguous(c)
    width = threads if per_thread else warps * COLUMNS_PER_WARP  # columns per block
    n_b = ceil_div(g.extent[c.n], width)
    g.emit("const long long pid = (long long)blockIdx.x;")
    g.emit(f"const long long nb = ak_gemm_mod(pid, {g.dim(n_b)});")
    if c.batch:
        g.emit(f"const long long bid = ak_gemm_div(pid, {g.dim(n_b)});")
        split_batch(g, "bid", c.batch)
    pa, pb = c.plain_a(), c.plain_b()
    da = Direct(g, pa, c.m, c.k) if pa is not None else None
    db = Direct(g, pb, c.n, c.k) if pb is not None else None
    g.emit("const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;")
    rows = MV_ROWS if c.m is not None else 1
    form = _PerThread(g, da, db, rows) if per_thread else _SplitK(g, da, db, rows)
    form.emit()
    grid: Dim = batch_count(g) * n_b * gate
    launch = LaunchSpec(g.name, None, tuple(plan.buffer_index(b) for b in g.args), None, (dim_str(grid),),
                        (("block", threads),))
    return g.text(), launch


class _Form:
    def __init__(self, g: GemmText, da: Direct | None, db: Direct | None, rows: int):
        self.g, self.c, self.da, self.db, self.rows = g, g.c, da, db, rows

    def live(self, r: str = "r") -> str:
        """A condition: row ``r`` exists (block-uniform where ``r`` is a loop constant)."""
        return f"{r} < {self.g.ext(self.c.m)}" if self.c.m is not None else f"{r} == 0"

    def a_value(self, k: str) -> str:
        return side_value(self.g, "a", self.da, "(long long)r" if self.c.m is not None else None, k)

    def finish(self, acc: str, col: str) -> None:
        index = {self.c.n: col}
        if self.c.m is not None:
            index[self.c.m] = "(long long)r"
        store_result(self.g, acc, index)

    def emit(self) -> None:
        raise NotImplementedError


class _PerThread(_Form):
    """Thread ``t`` of block ``nb`` sums column ``nb · threads + t`` over k, for every row."""

    def emit(self) -> None:
        g, c, rows = self.g, self.c, self.rows
        g.emit(f"const long long col = nb * {g.threads}LL + tid;")
        g.emit(f"float acc[{rows}];")
        g.emit("#pragma unroll")
        g.emit(f"for (int r = 0; r < {rows}; ++r) acc[r] = 0.0f;")
        with g.block(f"if (col < {g.ext(c.n)})"):
            with g.block(f"for (long long k = 0; k < {g.ext(c.k)}; ++k)"):
                g.emit(f"const float bv = {side_value(g, 'b', self.db, 'col', 'k')};")
                g.emit("#pragma unroll")
                with g.block(f"for (int r = 0; r < {rows}; ++r)"), g.block(f"if ({self.live()})"):
                    g.emit(f"acc[r] = acc[r] + {self.a_value('k')} * bv;")
            # one copy of the epilogue: the row's sum picked from the (register) array by selects
            g.emit("#pragma unroll 1")
            with g.block(f"for (int r = 0; r < {rows}; ++r)"), g.block(f"if ({self.live()})"):
                g.emit("float v = acc[0];")
                g.emit("#pragma unroll")
                g.emit(f"for (int q = 1; q < {rows}; ++q) v = r == q ? acc[q] : v;")
                self.finish("v", "col")


class _SplitK(_Form):
    """Warp ``w`` of block ``nb`` owns columns ``nb · warps · C + w · C + j`` (``j < C``); its lanes split k."""

    def emit(self) -> None:
        g, c, rows, cw = self.g, self.c, self.rows, COLUMNS_PER_WARP
        values = rows * cw  # partial sums per lane: a power of two, at most 32
        g.emit(f"const long long c0 = nb * {g.threads // 32 * cw}LL + warp * {cw}LL;")
        g.emit(f"float acc[{values}];  /* acc[r * {cw} + j]: row r, column c0 + j */")
        g.emit("#pragma unroll")
        g.emit(f"for (int q = 0; q < {values}; ++q) acc[q] = 0.0f;")
        with g.block(f"for (long long k = lane; k < {g.ext(c.k)}; k += 32)"):
            g.emit(f"float bv[{cw}];")
            g.emit("#pragma unroll")
            with g.block(f"for (int j = 0; j < {cw}; ++j)"):
                g.emit("const long long col = c0 + j;")
                g.emit("float v = 0.0f;")
                with g.block(f"if (col < {g.ext(c.n)})"):
                    g.emit(f"v = {side_value(g, 'b', self.db, 'col', 'k')};")
                g.emit("bv[j] = v;")
            g.emit("#pragma unroll")
            # block-uniform: rows past M cost nothing
            with g.block(f"for (int r = 0; r < {rows}; ++r)"), g.block(f"if ({self.live()})"):
                g.emit(f"const float av = {self.a_value('k')};")
                g.emit("#pragma unroll")
                g.emit(f"for (int j = 0; j < {cw}; ++j) acc[r * {cw} + j] = acc[r * {cw} + j] + av * bv[j];")
        # the lanes' partial sums, reduced and spread at once: each step a lane keeps half of its values
        # (the upper half when its bit of the offset is set), adds its partner's copy of that half and
        # sends the other; after log2(values) steps lane l holds one total (then plain butterflies)
        half, index, rest = values // 2, [], 0
        for offset in (16, 8, 4, 2, 1):
            if half >= 1:
                with g.block(""):
                    g.emit(f"const bool up = (lane & {offset}) != 0;")
                    g.emit("#pragma unroll")
                    with g.block(f"for (int q = 0; q < {half}; ++q)"):
                        g.emit(f"const float send = up ? acc[q] : acc[q + {half}];")
                        g.emit(f"const float keep = up ? acc[q + {half}] : acc[q];")
                        g.emit(f"acc[q] = keep + __shfl_xor_sync(0xffffffffu, send, {offset});")
                index.append(f"((lane & {offset}) != 0 ? {half} : 0)")
                half //= 2
            else:
                g.emit(f"acc[0] = acc[0] + __shfl_xor_sync(0xffffffffu, acc[0], {offset});")
                rest |= offset
        g.emit(f"const int q = {' + '.join(index) or '0'}, r = q / {cw};")
        g.emit(f"const long long col = c0 + q % {cw};")
        owner = f"(lane & {rest}) == 0 && " if rest else ""
        with g.block(f"if ({owner}{self.live()} && col < {g.ext(c.n)})"):
            self.finish("acc[0]", "col")


__all__ = ["COLUMNS_PER_WARP", "MV_ROWS", "MV_WARPS", "render_matvec"]
