"""The SIMT tiled form of the CUDA-C contraction (f32, mixed and int8 operands, prologues).

One block per (batch entry × ``BLOCK_M`` × ``BLOCK_N`` tile), as the tensor-core form
(:mod:`arke.targets.cuda.gemm`). Every ``BLOCK_K`` step, each thread fetches its share of the
next A and B tiles into registers, each element evaluated in f32 (a plain load converted as
the interpreter converts it, or the side's prologue through ``CExpr``: elements past a ragged
edge are 0 and never evaluated), while the block multiplies the current tiles from shared
memory; then it stores them in the other shared buffer, and one ``__syncthreads`` separates the
steps (``stages = 1``: one buffer, loaded between two barriers). The tiles lie in shared memory
k-major (``[BLOCK_K][BLOCK_M]``), so a thread's row and column values are single reads.

Thread ``(ty, tx)`` of a ``TY × TX`` grid owns rows ``ty + TY·i`` and columns ``tx + TX·j``
(``i < TM``, ``j < TN``): a warp reads consecutive columns (no bank conflicts) and stores
consecutive output columns (coalesced). Its sums run over ``k`` in order, one rounded product
added at a time, as the interpreter's loop does.
"""

from __future__ import annotations

from arke.ir import semantic as ir
from arke.ir.shapes import Dim, ceil_div, dim_str
from arke.plan.contraction import Contraction
from arke.plan.dispatch import Dispatch, KernelPlan
from arke.plan.exprs import decided
from arke.targets.artifact import LaunchSpec, UnsupportedError
from arke.targets.cuda.gemm_base import (
    SMEM_LIMIT,
    Direct,
    GemmText,
    batch_count,
    n_contiguous,
    side_value,
    store_result,
    tile_origin,
)

#: Default block (rows, columns, depth) and warps of the SIMT form.
SIMT_BLOCKS, SIMT_WARPS = (64, 64, 16), 8
#: The most outputs a thread may accumulate (registers).
MAX_OUTPUTS = 64


def render_simt(plan: KernelPlan, d: Dispatch, entry: str) -> tuple[str, LaunchSpec]:
    """The SIMT tiled entry of a contraction dispatch and its launch."""
    return _Simt(plan, d, entry).render()


def thread_grid(bm: int, bn: int, threads: int) -> tuple[int, int] | None:
    """Threads along (rows, columns) that split a ``bm × bn`` block into equal micro-tiles, as square as
    can be (ties: more threads along the columns, for coalesced stores)."""
    found = [(abs(bm // ty - bn // (threads // ty)), ty, threads // ty) for ty in range(1, threads + 1)
             if threads % ty == 0 and bm % ty == 0 and bn % (threads // ty) == 0]
    return (min(found)[1], min(found)[2]) if found else None


def _fitting_warps(bm: int, bn: int) -> list[int]:
    """The warps that share a ``bm × bn`` block out in equal micro-tiles that fit in registers."""
    return [w for w in (1, 2, 4, 8, 16, 32)
            if thread_grid(bm, bn, 32 * w) is not None and bm * bn // (32 * w) <= MAX_OUTPUTS]


def _default_warps(bm: int, bn: int) -> int:
    """:data:`SIMT_WARPS`, or where a ``bm × bn`` block cannot be shared out that way (``tile m = 1``), the
    most warps up to it that can, else the fewest above it: the user chose the tile, not the warps."""
    ok = _fitting_warps(bm, bn)
    below = [w for w in ok if w <= SIMT_WARPS]
    return max(below) if below else min(ok) if ok else SIMT_WARPS


class _Simt:
    """Emits the SIMT tiled entry (see the module doc)."""

    def __init__(self, plan: KernelPlan, d: Dispatch, entry: str):
        c = d.pattern
        assert isinstance(c, Contraction) and c.m is not None
        self.c = c
        dm, dn, dk = SIMT_BLOCKS
        self.bm, self.bn, self.bk = (decided(plan, "tile", c.m) or dm, decided(plan, "tile", c.n) or dn,
                                     decided(plan, "tile", c.k) or dk)
        warps = decided(plan, "warps", None) or _default_warps(self.bm, self.bn)
        self.threads = 32 * warps
        self.double = (decided(plan, "stages", None) or 2) >= 2
        where = f"{entry} (f32 SIMT tiles)"
        if warps > 32:
            raise UnsupportedError(f"{where}: warps = {warps} is over 32 (1024 threads)", code="AK4004")
        grid = thread_grid(self.bm, self.bn, self.threads)
        if grid is None:
            valid = ", ".join(map(str, _fitting_warps(self.bm, self.bn))) or "none: use tiles with more factors of 2"
            raise UnsupportedError(f"{where}: tile {c.m} = {self.bm}, tile {c.n} = {self.bn} cannot be split "
                                   f"into equal row × column blocks of warps = {warps} ({self.threads} threads); "
                                   f"warps can be {valid}", code="AK4004")
        self.ty, self.tx = grid
        self.tm, self.tn = self.bm // self.ty, self.bn // self.tx
        if self.tm * self.tn > MAX_OUTPUTS:
            raise UnsupportedError(f"{where}: tile {c.m} = {self.bm}, tile {c.n} = {self.bn} with warps = {warps} "
                                   f"give each thread {self.tm * self.tn} outputs, over the {MAX_OUTPUTS} that fit in "
                                   "registers; use more warps or smaller tiles", code="AK4012")
        self.g = GemmText(plan, d, entry, self.threads)
        pa = c.plain_a()
        # rows of a tile along the operand's contiguous axis, so neighbouring threads read neighbours
        self.a_kfast = pa is None or pa.indices[-1] != ir.Idx(c.m)
        self.b_nfast = n_contiguous(c)
        self.sa = self.bm + (2 if self.a_kfast else 0)  # k-fast stores then hit 32 different banks
        self.sb = self.bn + (0 if self.b_nfast else 2)
        self.buffers = 2 if self.double else 1
        self.shared = 4 * self.buffers * self.bk * (self.sa + self.sb)
        if self.shared > SMEM_LIMIT:
            raise UnsupportedError(f"{where}: a {self.bm} × {self.bn} × {self.bk} tile needs {self.shared} bytes of "
                                   f"shared memory, over {SMEM_LIMIT}; use a smaller tile {c.k}", code="AK4012")

    def render(self) -> tuple[str, LaunchSpec]:
        g, c = self.g, self.c
        assert c.m is not None
        n_m, n_n = ceil_div(g.extent[c.m], self.bm), ceil_div(g.extent[c.n], self.bn)
        pm, pn = tile_origin(g, n_m, n_n)
        pa, pb = c.plain_a(), c.plain_b()
        self.da = Direct(g, pa, c.m, c.k) if pa is not None else None
        self.db = Direct(g, pb, c.n, c.k) if pb is not None else None
        g.emit("AK_DYNAMIC_SMEM(ak_smem);")
        g.emit("float* const sa = (float*)ak_smem;")
        g.emit(f"float* const sb = sa + {self.buffers * self.bk * self.sa};")
        g.emit(f"const int tid = (int)threadIdx.x, ty = tid / {self.tx}, tx = tid % {self.tx};")
        g.emit(f"const long long m0 = {pm} * {self.bm}LL, n0 = {pn} * {self.bn}LL;")
        g.emit(f"const long long kt_count = ({g.ext(c.k)} + {self.bk - 1}LL) / {self.bk}LL;")
        g.emit(f"float acc[{self.tm}][{self.tn}];")
        g.emit("#pragma unroll")
        with g.block(f"for (int i = 0; i < {self.tm}; ++i)"):
            g.emit("#pragma unroll")
            with g.block(f"for (int j = 0; j < {self.tn}; ++j)"):
                g.emit("acc[i][j] = 0.0f;")
        qa, qb = self.shares()
        g.emit(f"float ra[{qa}], rb[{qb}];")
        if self.double:
            # trip -1 only loads tile 0; trip kt fetches tile kt + 1 into registers while tile kt multiplies,
            # then stores it in the other buffer (every thread finished with it before the last barrier)
            with g.block("for (long long kt = -1; kt < kt_count; ++kt)"):
                with g.block("if (kt + 1 < kt_count)"):
                    self.fetch("kt + 1")
                with g.block("if (kt >= 0)"):
                    self.multiply("(int)(kt & 1)")
                with g.block("if (kt + 1 < kt_count)"):
                    self.put("(int)((kt + 1) & 1)")
                g.emit("__syncthreads();")
        else:
            with g.block("for (long long kt = 0; kt < kt_count; ++kt)"):
                self.fetch("kt")
                self.put("0")
                g.emit("__syncthreads();")
                self.multiply("0")
                g.emit("__syncthreads();")
        self.epilogue()
        grid: Dim = batch_count(g) * n_m * n_n
        launch = LaunchSpec(g.name, None, tuple(g.plan.buffer_index(b) for b in g.args), None, (dim_str(grid),),
                            (("block", self.threads), ("shared", self.shared), ("stages", 2 if self.double else 1)))
        return g.text(), launch

    def shares(self) -> tuple[int, int]:
        t = self.threads
        return -(-self.bm * self.bk // t), -(-self.bn * self.bk // t)

    def _coords(self, fast_k: bool, width: int) -> str:
        """(r, kk): a tile element's row (m or n offset) and k offset from its index e."""
        if fast_k:
            return f"const int r = e / {self.bk}, kk = e % {self.bk};"
        return f"const int kk = e / {width}, r = e % {width};"

    def fetch(self, kt: str) -> None:
        """This thread's elements of tiles ``kt`` of A and B, in f32, into ``ra``/``rb``."""
        g, c = self.g, self.c
        assert c.m is not None
        qa, qb = self.shares()
        with g.block(""):
            g.emit(f"const long long k0 = ({kt}) * {self.bk}LL;")
            for name, q, fast, width, o0, axis, side, direct in (
                    ("ra", qa, self.a_kfast, self.bm, "m0", c.m, "a", self.da),
                    ("rb", qb, not self.b_nfast, self.bn, "n0", c.n, "b", self.db)):
                g.emit("#pragma unroll")
                with g.block(f"for (int q = 0; q < {q}; ++q)"):
                    g.emit(f"const int e = tid + q * {self.threads};")
                    g.emit(self._coords(fast, width))
                    g.emit(f"const long long go = {o0} + r, gk = k0 + kk;")
                    g.emit("float v = 0.0f;")
                    whole = "" if width * self.bk % self.threads == 0 else f"e < {width * self.bk} && "
                    with g.block(f"if ({whole}go < {g.ext(axis)} && gk < {g.ext(c.k)})"):
                        g.emit(f"v = {side_value(g, side, direct, 'go', 'gk')};")
                    g.emit(f"{name}[q] = v;")

    def put(self, slot: str) -> None:
        """``ra``/``rb`` into shared buffer ``slot``."""
        g = self.g
        qa, qb = self.shares()
        for name, q, fast, width, tile, stride in (("ra", qa, self.a_kfast, self.bm, "sa", self.sa),
                                                   ("rb", qb, not self.b_nfast, self.bn, "sb", self.sb)):
            g.emit("#pragma unroll")
            with g.block(f"for (int q = 0; q < {q}; ++q)"):
                g.emit(f"const int e = tid + q * {self.threads};")
                g.emit(self._coords(fast, width))
                guard = "" if width * self.bk % self.threads == 0 else f"if (e < {width * self.bk}) "
                g.emit(f"{guard}{tile}[({slot}) * {self.bk * stride} + kk * {stride} + r] = {name}[q];")

    def multiply(self, slot: str) -> None:
        """The products of the shared tiles in buffer ``slot`` added to each thread's micro-tile, k in order."""
        g = self.g
        g.emit(f"const float* const pa = sa + ({slot}) * {self.bk * self.sa};")
        g.emit(f"const float* const pb = sb + ({slot}) * {self.bk * self.sb};")
        g.emit("#pragma unroll")
        with g.block(f"for (int kk = 0; kk < {self.bk}; ++kk)"):
            g.emit(f"float av[{self.tm}], bv[{self.tn}];")
            g.emit("#pragma unroll")
            g.emit(f"for (int i = 0; i < {self.tm}; ++i) av[i] = pa[kk * {self.sa} + ty + i * {self.ty}];")
            g.emit("#pragma unroll")
            g.emit(f"for (int j = 0; j < {self.tn}; ++j) bv[j] = pb[kk * {self.sb} + tx + j * {self.tx}];")
            g.emit("#pragma unroll")
            with g.block(f"for (int i = 0; i < {self.tm}; ++i)"):
                g.emit("#pragma unroll")
                g.emit(f"for (int j = 0; j < {self.tn}; ++j) acc[i][j] = acc[i][j] + av[i] * bv[j];")

    def epilogue(self) -> None:
        g, c = self.g, self.c
        assert c.m is not None
        g.emit("#pragma unroll")
        with g.block(f"for (int i = 0; i < {self.tm}; ++i)"):
            g.emit("#pragma unroll")
            with g.block(f"for (int j = 0; j < {self.tn}; ++j)"):
                g.emit(f"const long long row = m0 + ty + i * {self.ty}, col = n0 + tx + j * {self.tx};")
                with g.block(f"if (row < {g.ext(c.m)} && col < {g.ext(c.n)})"):
                    store_result(g, "acc[i][j]", {c.m: "row", c.n: "col"})


__all__ = ["SIMT_BLOCKS", "SIMT_WARPS", "render_simt", "thread_grid"]
