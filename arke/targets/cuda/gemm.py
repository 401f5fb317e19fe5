"""The CUDA-C target's contraction dispatch: tiled matmul in shared memory, on the tensor cores for 16-bit operands.

One dispatch runs ``C[batch.., m, n] = epilogue(sum(A(.., m, k) * B(.., k, n) for k))``
(:class:`~arke.plan.contraction.Contraction`) as up to two ``__global__`` entries, each
launched over a grid that is empty unless the dims choose it:

* **tiled** (``<entry>``), one block per (batch entry × ``BLOCK_M`` rows × ``BLOCK_N``
  columns), all flattened on ``blockIdx.x`` (no 65535 limit on the batch), the row blocks of a
  batch entry in groups of :data:`~arke.targets.cuda.gemm_base.GROUP_M` (column-major inside a
  group) so that neighbouring blocks share panels of ``B`` in L2. Two forms:

  - *tensor cores* (both sides plain loads of the same 16-bit type, bf16 or f16): ``stages``
    buffers of an A tile and a B tile in dynamic shared memory, filled with ``ak_cp_async16``
    (16-byte chunks, zero-filled past ragged edges) in a ``commit`` / ``wait<stages - 2>`` +
    ``__syncthreads`` pipeline, so tile ``k + stages - 1`` loads while tile ``k`` is used. Each
    operand keeps its stored orientation in shared memory: rows along ``k`` when ``k`` is its
    contiguous axis (``linear``'s ``w[n, k]``), rows along ``m``/``n`` otherwise (``matmul``'s
    ``b[k, n]``), each row padded so that the fragment reads of a warp hit 32 different banks.
    When a row's start is not 16-byte aligned (the contiguous extent is not a multiple of 8, or
    a batch offset or the pointer is not), decided at run time from the dims, the tile is
    copied element by element instead. The warps split the block into warp tiles (64 × 32 of a
    128 × 128 block with 8 warps); a warp runs ``mma.sync.m16n8k16`` (``ak_mma_bf16`` /
    ``ak_mma_f16``, f32 accumulation) on fragments packed from shared memory (the fragment
    layout of :mod:`arke.targets.cuda.warp`). The finished accumulators pass through shared
    memory (a slab of rows at a time when the whole tile does not fit), so the epilogue runs
    with neighbouring threads on neighbouring columns (coalesced) and is compiled once;
  - *SIMT* (f32, mixed, int8 weights, prologues; :mod:`arke.targets.cuda.gemm_simt`): A and B
    tiles in f32 in shared memory, each side evaluated (its prologue through ``CExpr``)
    as it is loaded, double-buffered through registers; each thread accumulates a register
    micro-tile of outputs in IEEE f32 (NVRTC's ``--fmad=false``: no fused multiply-add).

* **matrix-vector** (``<entry>_mv``, :mod:`arke.targets.cuda.gemm_mv`): for a contraction
  without ``m`` (a matrix-vector product), and by default whenever ``M`` is at most
  :data:`~arke.targets.cuda.gemm_mv.MV_ROWS` (decode): all rows of a batch entry in one block;
  either each warp computes a few columns with its lanes splitting ``k`` and a warp-shuffle
  reduction (``B`` contiguous along ``k``), or each thread one column over the whole ``k``
  range (``B`` contiguous along ``n``: coalesced). The tiled entry's grid is multiplied by
  ``1 - small`` and this one's by ``small``, where ``small`` is 1 exactly when
  ``M <= MV_ROWS`` (dim arithmetic: ``((MV_ROWS + 1) // (M + 1) + MV_ROWS) // (MV_ROWS + 1)``).

Each output's ``k`` terms are summed in a fixed order that depends only on the form and the
blocks (fixed when the kernel is rendered), never on the launch; the epilogue (bias, an
activation, a residual, a cast to bf16 ...) runs through ``CExpr`` on each finished element
(its loads of the result read the accumulator, rounded first when the sum is 16-bit), which
is stored in the output's dtype, masked to the ragged edges. A bad batch subscript (GQA's
``h / R`` past the heads) clamps and raises the error word.

Strategy: ``tile m, n, k`` set ``BLOCK_M``/``BLOCK_N``/``BLOCK_K`` (tensor cores: multiples of
16, 8 and 16, default 128 × 128 × 32; SIMT default 64 × 64 × 16), ``warps`` the threads (32 per
warp; default 8), ``stages`` the shared-memory buffers (tensor cores: at least 2, default 3;
SIMT: 1 is a single buffer, 2 or more double-buffer through registers). A ``tile m`` decision
asks for the tiled form at every ``M`` (no matrix-vector entry unless there is no ``m``). A
combination no kernel can run is an :class:`~arke.targets.artifact.UnsupportedError` that names
the decision and the values that work.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, ceil_div, dim_str, floordiv, parse_dim
from arke.plan.contraction import Contraction
from arke.plan.dispatch import Dispatch, KernelPlan
from arke.plan.exprs import decided
from arke.targets.artifact import LaunchSpec, UnsupportedError
from arke.targets.cuda.gemm_base import (
    GEMM_HELPERS,
    HALF,
    SMEM_LIMIT,
    Direct,
    GemmText,
    batch_count,
    store_result,
    tile_origin,
)
from arke.targets.cuda.gemm_mv import MV_ROWS, render_matvec
from arke.targets.cuda.gemm_simt import render_simt

#: Tensor-core defaults: the block (rows, columns, depth), warps and shared-memory stages.
TC_BLOCKS, TC_WARPS, TC_STAGES = (128, 128, 32), 8, 3
#: The most f32 accumulators a thread may hold (registers: 255 at most, with room for fragments).
MAX_ACC = 128
_MMA = {DType.BF16: "ak_mma_bf16", DType.F16: "ak_mma_f16"}


def render_contraction(plan: KernelPlan, dispatch: Dispatch, entry: str) -> tuple[str, list[LaunchSpec]]:
    """The CUDA C of one contraction dispatch (its entries, with their helpers) and their launches."""
    c = dispatch.pattern
    if not isinstance(c, Contraction):
        raise UnsupportedError(f"{entry}: a contraction dispatch needs its Contraction pattern")
    contract = dispatch.members[0]
    rows: Dim = sympy.Integer(1)
    for a in contract.axes:
        if a.name == c.m:
            rows = a.extent
    texts, launches = [GEMM_HELPERS.strip()], []
    tiled = c.m is not None
    matvec = c.m is None or decided(plan, "tile", c.m) is None
    # 1 when M <= MV_ROWS, else 0 (dim arithmetic): the grid of the form the dims do not choose is empty
    small: Dim = floordiv(floordiv(MV_ROWS + 1, rows + 1) + MV_ROWS, MV_ROWS + 1)
    if tiled:
        half = half_operands(plan, c)
        text, launch = (_TensorCore(plan, dispatch, entry, half).render() if half is not None
                        else render_simt(plan, dispatch, entry))
        if matvec:
            launch = LaunchSpec(launch.entry, None, launch.buffers, launch.scratch,
                                (dim_str(parse_dim(launch.grid[0]) * (1 - small)),), launch.options)
        texts.append(text)
        launches.append(launch)
    if matvec:
        text, launch = render_matvec(plan, dispatch, f"{entry}_mv", small if tiled else sympy.Integer(1))
        texts.append(text)
        launches.append(launch)
    return "\n\n".join(texts), launches


def half_operands(plan: KernelPlan, c: Contraction) -> DType | None:
    """The 16-bit dtype both sides are plain loads of (fed to the tensor cores as stored), if any."""
    pa, pb = c.plain_a(), c.plain_b()
    if pa is None or pb is None or c.m is None:
        return None
    da, db = (plan.buffers[plan.buffer_index(x.src)].dtype for x in (pa, pb))
    return da if da == db and da in HALF else None


def _warp_grid(bm: int, bn: int, warps: int) -> tuple[int, int] | None:
    """Warps along (rows, columns) with whole m16 × n8 warp tiles, as square as can be (ties: taller)."""
    found = [(abs(bm // wm - bn // (warps // wm)), -(bm // wm), wm) for wm in range(1, warps + 1)
             if warps % wm == 0 and bm % (16 * wm) == 0 and bn % (8 * (warps // wm)) == 0]
    if not found:
        return None
    wm = min(found)[2]
    return wm, warps // wm


def _padded(row: int) -> int:
    """A shared-memory row of ``row`` 16-bit elements (a multiple of 8) padded to 8 mod 16 elements:
    rows 16-byte aligned for the copies, and the 8 rows or 4 row pairs a warp's fragment reads touch
    fall on different banks."""
    return row + 8 if row % 16 == 0 else row


@dataclass(frozen=True)
class _Layout:
    """One operand's tile in shared memory: ``rows`` rows of ``stride`` elements (``width`` used)."""

    kmajor: bool  # rows along the outer axis (m or n), k contiguous in a row; else rows along k
    rows: int
    width: int
    stride: int

    @property
    def size(self) -> int:
        return self.rows * self.stride

    def pair(self, tile: str, outer: str, k: str) -> str:
        """The register of elements (outer, k) and (outer, k + 1) of the tile at ``tile``."""
        if self.kmajor:
            return f"ak_gemm_ld32({tile} + ({outer}) * {self.stride} + ({k}))"
        return f"ak_pack({tile}[({k}) * {self.stride} + ({outer})], {tile}[({k} + 1) * {self.stride} + ({outer})])"


class _TensorCore:
    """Emits the tensor-core tiled entry (see the module doc)."""

    def __init__(self, plan: KernelPlan, d: Dispatch, entry: str, dtype: DType):
        c = d.pattern
        assert isinstance(c, Contraction) and c.m is not None
        self.c, self.dtype = c, dtype
        dm, dn, dk = TC_BLOCKS
        self.bm, self.bn, self.bk = (decided(plan, "tile", c.m) or dm, decided(plan, "tile", c.n) or dn,
                                     decided(plan, "tile", c.k) or dk)
        self.warps = decided(plan, "warps", None) or TC_WARPS
        self.stages = decided(plan, "stages", None) or TC_STAGES
        self.check(entry)
        grid = _warp_grid(self.bm, self.bn, self.warps)
        assert grid is not None
        self.wm, self.wn = grid
        self.mi, self.ni = self.bm // self.wm // 16, self.bn // self.wn // 8
        self.threads = 32 * self.warps
        self.g = GemmText(plan, d, entry, self.threads)

    def layout(self, kmajor: bool, outer: int) -> _Layout:
        if kmajor:
            return _Layout(True, outer, self.bk, _padded(self.bk))
        return _Layout(False, self.bk, outer, _padded(outer))

    def check(self, entry: str) -> None:
        """Refuse decisions no tensor-core kernel can run, naming them and what works."""
        c, where = self.c, f"{entry} (16-bit operands on the tensor cores, mma.sync m16n8k16)"
        for axis, value, step in ((c.m, self.bm, 16), (c.n, self.bn, 8), (c.k, self.bk, 16)):
            if value % step:
                raise UnsupportedError(f"{where}: tile {axis} = {value} is not a multiple of {step}; use a "
                                       f"multiple of {step} ({', '.join(str(step * q) for q in (1, 2, 4, 8))})",
                                       code="AK4004")
        if self.warps > 32:
            raise UnsupportedError(f"{where}: warps = {self.warps} is over 32 (1024 threads)", code="AK4004")
        if _warp_grid(self.bm, self.bn, self.warps) is None:
            ok = [w for w in (1, 2, 4, 8, 16, 32) if _warp_grid(self.bm, self.bn, w) is not None]
            raise UnsupportedError(f"{where}: warps = {self.warps} cannot split a {self.bm} × {self.bn} block "
                                   f"(tile {c.m} × tile {c.n}) into whole 16 × 8 warp tiles; warps can be "
                                   f"{', '.join(map(str, ok)) or 'none: use larger tiles'}", code="AK4004")
        acc = self.bm * self.bn // (32 * self.warps)
        if acc > MAX_ACC:
            raise UnsupportedError(f"{where}: tile {c.m} = {self.bm}, tile {c.n} = {self.bn} with warps = "
                                   f"{self.warps} leave {acc} accumulators per thread, over the {MAX_ACC} that "
                                   f"fit in registers; use more warps or smaller tiles", code="AK4012")
        if self.stages < 2:
            raise UnsupportedError(f"{where}: stages = {self.stages}; the cp.async pipeline needs at least 2 "
                                   "shared-memory buffers (stages = 2, 3 or 4)", code="AK4004")
        per_stage = 2 * (self.layout(True, self.bm).size + self.layout(True, self.bn).size)
        per_stage = max(per_stage, 2 * (self.layout(False, self.bm).size + self.layout(False, self.bn).size))
        if self.stages * per_stage > SMEM_LIMIT:
            fit = SMEM_LIMIT // per_stage
            raise UnsupportedError(f"{where}: stages = {self.stages} of a {self.bm} × {self.bn} × {self.bk} tile "
                                   f"need {self.stages * per_stage} bytes of shared memory, over {SMEM_LIMIT}; "
                                   + (f"use stages <= {fit}" if fit >= 2 else f"use a smaller tile {c.k}"),
                                   code="AK4012")

    def render(self) -> tuple[str, LaunchSpec]:
        g, c = self.g, self.c
        pa, pb = c.plain_a(), c.plain_b()
        assert pa is not None and pb is not None and c.m is not None
        rows, cols = g.extent[c.m], g.extent[c.n]
        n_m, n_n = ceil_div(rows, self.bm), ceil_div(cols, self.bn)
        pm, pn = tile_origin(g, n_m, n_n)
        da, db = Direct(g, pa, c.m, c.k), Direct(g, pb, c.n, c.k)
        la, lb = self.layout(da.contig != c.m, self.bm), self.layout(db.contig != c.n, self.bn)
        # both sizes are multiples of 8 elements: every tile starts 16-byte aligned
        stage = self.stage = la.size + lb.size
        g.emit("AK_DYNAMIC_SMEM(ak_smem);")
        g.emit("unsigned short* const sm = (unsigned short*)ak_smem;")
        g.emit("const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;")
        g.emit("const int grp = lane >> 2, quad = lane & 3;  /* the fragment's row group and column pair */")
        g.emit(f"const int wrow = (warp / {self.wn}) * {self.mi * 16}, wcol = (warp % {self.wn}) * {self.ni * 8};")
        g.emit(f"const long long m0 = {pm} * {self.bm}LL, n0 = {pn} * {self.bn}LL;")
        kx = g.ext(c.k)
        g.emit(f"const long long kt_count = ({kx} + {self.bk - 1}LL) / {self.bk}LL;")
        va, vb = self.aligned(da, "va"), self.aligned(db, "vb")
        g.emit(f"float acc[{self.mi}][{self.ni}][4];")
        g.emit("#pragma unroll")
        with g.block(f"for (int i = 0; i < {self.mi}; ++i)"):
            g.emit("#pragma unroll")
            with g.block(f"for (int j = 0; j < {self.ni}; ++j)"):
                g.emit("acc[i][j][0] = 0.0f; acc[i][j][1] = 0.0f; acc[i][j][2] = 0.0f; acc[i][j][3] = 0.0f;")
        # the pipeline: the first stages - 1 trips only issue tiles 0 .. stages - 2; trip kt waits for
        # tile kt (empty groups past the end keep the count uniform: wait<stages - 2> always means
        # "tile kt has landed"), then refills the buffer every warp finished at trip kt - 1
        with g.block(f"for (long long kt = {1 - self.stages}; kt < kt_count; ++kt)"):
            with g.block("if (kt >= 0)"):  # block-uniform
                g.emit(f"ak_cp_async_wait<{self.stages - 2}>();")
                g.emit("__syncthreads();")
            g.emit(f"const long long nk = kt + {self.stages - 1};")
            with g.block("if (nk < kt_count)"):
                slot = f"(int)(nk % {self.stages})"
                self.load_tile(da, la, va, "m0", g.ext(c.m), "nk", slot, 0)
                self.load_tile(db, lb, vb, "n0", g.ext(c.n), "nk", slot, la.size)
            g.emit("ak_cp_async_commit();")
            with g.block("if (kt >= 0)"):
                g.emit(f"const unsigned short* const ta = sm + (int)(kt % {self.stages}) * {stage};")
                g.emit(f"const unsigned short* const tb = ta + {la.size};")
                self.steps(la, lb)
        g.emit("ak_cp_async_wait<0>();")
        g.emit("__syncthreads();  /* every warp is done with the tiles: their memory stages the output */")
        slab = self.epilogue()
        shared = max(2 * self.stages * stage, 4 * slab * (self.bn + 4))
        grid: Dim = batch_count(g) * n_m * n_n
        launch = LaunchSpec(g.name, None, tuple(g.plan.buffer_index(b) for b in g.args), None, (dim_str(grid),),
                            (("block", self.threads), ("shared", shared), ("stages", self.stages)))
        return g.text(), launch

    def aligned(self, d: Direct, name: str) -> str | None:
        """A block-uniform bool: every 16-byte chunk of the operand's rows starts 16-byte aligned (then the
        tile is copied with cp.async), or None when the operand has no contiguous axis (copied element-wise)."""
        if d.contig is None:
            return None
        other = d.k if d.contig != d.k else d.outer
        assert other is not None
        base = "" if d.base == "0LL" else f" && {d.base} % 8LL == 0"
        self.g.emit(f"const bool {name} = {d.stride[other]} % 8LL == 0{base} && "
                    f"((unsigned long long)(const void*){d.ptr} & 15ull) == 0;")
        return name

    def load_tile(self, d: Direct, lay: _Layout, vec: str | None, o0: str, o_ext: str, kt: str, slot: str,
                  offset: int) -> None:
        """Issue the copies of one operand's tile ``kt`` into buffer ``slot`` (zeros past the edges)."""
        g, k_ext = self.g, self.g.ext(self.c.k)
        g.emit(f"unsigned short* const dst{offset} = sm + {slot} * {self.stage} + {offset};")
        g.emit(f"const long long k0_{offset} = {kt} * {self.bk}LL;")
        k0 = f"k0_{offset}"

        def coords(r: str, e: str) -> tuple[str, str]:  # (outer, k) of tile row r, element e
            return (f"{o0} + {r}", f"{k0} + {e}") if lay.kmajor else (f"{o0} + {e}", f"{k0} + {r}")

        if vec is not None:
            per_row = lay.width // 8
            with g.block(f"if ({vec})"):
                g.emit("#pragma unroll")
                with g.block(f"for (int c = tid; c < {lay.rows * per_row}; c += {self.threads})"):
                    g.emit(f"const int r = c / {per_row}, e = (c % {per_row}) * 8;")
                    go, gk = coords("r", "e")
                    g.emit(f"const long long go = {go}, gk = {gk};")
                    # the chunk runs along the contiguous axis: past its extent the rest is zero-filled
                    run, cross = ((f"{k_ext} - gk", f"go < {o_ext}") if lay.kmajor
                                  else (f"{o_ext} - go", f"gk < {k_ext}"))
                    g.emit(f"const long long left = {run};")
                    g.emit(f"const int bytes = {cross} ? (left >= 8 ? 16 : left > 0 ? (int)left * 2 : 0) : 0;")
                    g.emit(f"ak_cp_async16(dst{offset} + r * {lay.stride} + e, "
                           f"bytes > 0 ? {d.ptr} + {d.address('go', 'gk')} : {d.ptr}, bytes);")
            g.emit("else")
        with g.block(""), g.block(f"for (int c = tid; c < {lay.rows * lay.width}; c += {self.threads})"):
            g.emit(f"const int r = c / {lay.width}, e = c % {lay.width};")
            go, gk = coords("r", "e")
            g.emit(f"const long long go = {go}, gk = {gk};")
            g.emit(f"dst{offset}[r * {lay.stride} + e] = go < {o_ext} && gk < {k_ext} ? "
                   f"{d.raw('go', 'gk')} : (unsigned short)0;")

    def steps(self, la: _Layout, lb: _Layout) -> None:
        """The mma steps over one shared tile: BLOCK_K / 16 steps of mi × ni mma per warp."""
        g = self.g
        g.emit("#pragma unroll")
        with g.block(f"for (int kk = 0; kk < {self.bk}; kk += 16)"):
            g.emit(f"unsigned fa[{self.mi}][4], fb[{self.ni}][2];")
            g.emit("const int kc = kk + quad * 2;")
            g.emit("#pragma unroll")
            with g.block(f"for (int i = 0; i < {self.mi}; ++i)"):
                g.emit("const int r = wrow + i * 16 + grp;")
                for q, (dr, dk) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
                    g.emit(f"fa[i][{q}] = {la.pair('ta', f'r + {dr}', f'kc + {dk}')};")
            g.emit("#pragma unroll")
            with g.block(f"for (int j = 0; j < {self.ni}; ++j)"):
                g.emit("const int n = wcol + j * 8 + grp;")
                g.emit(f"fb[j][0] = {lb.pair('tb', 'n', 'kc')};")
                g.emit(f"fb[j][1] = {lb.pair('tb', 'n', 'kc + 8')};")
            g.emit("#pragma unroll")
            with g.block(f"for (int i = 0; i < {self.mi}; ++i)"):
                g.emit("#pragma unroll")
                with g.block(f"for (int j = 0; j < {self.ni}; ++j)"):
                    g.emit(f"{_MMA[self.dtype]}(acc[i][j], fa[i], fb[j]);")

    def slab(self) -> int:
        """Rows of the output the block stages in shared memory at a time: all of them when they fit,
        else the most whole warp rows that do."""
        rows = self.mi * 16
        best = rows
        for q in range(1, self.wm + 1):
            if self.wm % q == 0 and 4 * rows * q * (self.bn + 4) <= SMEM_LIMIT:
                best = rows * q
        return best

    def epilogue(self) -> int:
        """The accumulators through shared memory, a slab of rows at a time: the warps owning the slab
        write their fragments (rows grp and grp + 8, columns 2 quad and + 1 of each m16 × n8 tile), then
        the block runs the epilogue over the slab with neighbouring threads on neighbouring columns
        (coalesced reads of bias or residual, coalesced stores). Returns the slab's rows."""
        g, c = self.g, self.c
        assert c.m is not None
        slab, es = self.slab(), self.bn + 4
        g.emit("float* const ep = (float*)ak_smem;")
        g.emit("#pragma unroll 1")
        with g.block(f"for (int s = 0; s < {self.bm // slab}; ++s)"):
            with g.block(f"if (wrow / {slab} == s)"):  # the warps of this slab (no collective inside)
                g.emit(f"float* const wp = ep + (wrow - s * {slab} + grp) * {es} + wcol + quad * 2;")
                g.emit("#pragma unroll")
                with g.block(f"for (int i = 0; i < {self.mi}; ++i)"):
                    g.emit("#pragma unroll")
                    with g.block(f"for (int j = 0; j < {self.ni}; ++j)"):
                        for e in range(4):
                            g.emit(f"wp[(i * 16 + {8 * (e >> 1)}) * {es} + j * 8 + {e & 1}] = acc[i][j][{e}];")
            g.emit("__syncthreads();")
            g.emit("#pragma unroll 2")
            with g.block(f"for (int idx = tid; idx < {slab * self.bn}; idx += {self.threads})"):
                g.emit(f"const int r = idx / {self.bn}, cc = idx % {self.bn};")
                g.emit(f"const long long row = m0 + s * {slab} + r, col = n0 + cc;")
                with g.block(f"if (row < {g.ext(c.m)} && col < {g.ext(c.n)})"):
                    store_result(g, f"ep[r * {es} + cc]", {c.m: "row", c.n: "col"})
            g.emit("__syncthreads();")
        return slab


__all__ = ["render_contraction"]
