"""LLVM rendering of the contraction family, the way BLIS does it.

One dispatch runs ``C[batch.., m, n] = epilogue(sum(A[.., m, k] * B[.., k, n] for k))``:

* The workers split (batch × column slabs of ``nc`` columns; half slabs where N has few): each task
  owns whole columns, so every element's sum runs over k in the same order whatever the thread count.
* Per ``kc``-deep block of k, the task packs its slab of ``B`` into ``nr``-wide panels
  (``[panel][k][nr]``, converted to f32, zero beyond N) in its scratch memory. A plain ``A``
  is not packed: the micro-kernel broadcasts its elements straight from each row (a row
  block of ``A`` stays in L1 while the panels of ``B`` stream from L2).
* A fused producer (a *prologue*: ``silu(x[m, k])``, ``f32(w[k, n]) * s[n]``) is evaluated
  once per element as its side is packed: ``B``'s into the panels, ``A``'s into ``mr`` rows
  of ``kc`` floats per row block.
* The micro-kernel keeps an ``mr × nr`` block of sums in vector registers (``mr × nr/lanes``
  accumulators of ``<lanes x float>``), one ``llvm.fma`` per accumulator per k step. Rows past
  M read the last row again (valid memory) and are never stored, so there are no edge cases
  in the hot loop.
* Sums collect in an f32 scratch tile ``[rows][nc]``; after the last k block the epilogue
  (bias, activation, residual, per-channel scale ...) is applied to each finished element and
  the result stored in its dtype.
* A batch-reduce contraction (``Contraction.outer``: ``sum(h[e, t, f] * wd[e, d, f] for e, f)``)
  runs all of the above for each value of its outer reduce axes in turn (the operands' addresses
  and prologues at that value, ``B_e`` packed as for one axis), every step adding into the same
  scratch tile; the epilogue runs once, after the last step. The order of the terms is fixed.
* Few rows (M below :data:`GEMV_ROWS`: decode) with both operands contiguous along k, as in
  ``linear``: no packing; each output is a dot product along k with vector accumulators,
  eight columns at a time, folded in a fixed order — this form is bound by reading ``B`` once.

Blocking comes from the strategy: ``tile m`` sets ``mr`` (register rows), ``tile n`` the slab
width ``nc``, ``tile k`` the depth ``kc``, ``vectorize n`` the lanes and ``unroll k`` the
micro-kernel's unrolling, ``pack a`` packs a plain ``A`` too; the defaults suit AVX-512 (and
shrink with ``vector_bits``).

This module chooses the blocking and emits the task loop, the micro-kernel calls and the
epilogue; the packing is :mod:`arke.targets.llvm.gemm_pack`'s, the micro-kernel and the decode
forms :mod:`arke.targets.llvm.gemm_base`'s.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, dim_str
from arke.plan.contraction import Contraction
from arke.plan.dispatch import Dispatch, KernelPlan
from arke.targets.artifact import LaunchSpec
from arke.targets.llvm.declarations import vector_fma
from arke.targets.llvm.gemm_base import GEMV_ROWS, Blocking
from arke.targets.llvm.gemm_bf16 import A_PAD, VNNI, matrix_unit, unit_blocking
from arke.targets.llvm.gemm_epilogue import VectorEpilogue
from arke.targets.llvm.gemm_routed import GemmRouted
from arke.targets.llvm.panels import VNNI_KEY
from arke.targets.llvm.scalar import STORAGE
from arke.targets.llvm.vec import Vec

#: Vectors across a panel of B (nr = this × lanes).
PANEL_VECTORS = 2
#: The largest slab width and k-block a strategy's `tile n` / `tile k` sets (a task packs that much in scratch).
MAX_TILE = 8192
#: Below this many column slabs the workers split half slabs (:meth:`_Gemm.halves`).
HALF_SLABS_BELOW = 8


def panel_width(vector_bits: int) -> int:
    """``nr`` of the default blocking: the panel width prepacked weights must have (``pack_panels``)."""
    return PANEL_VECTORS * max(4, vector_bits // 32)


def blocking(plan: KernelPlan, c: Contraction, vector_bits: int) -> Blocking:
    """The blocking for ``c``: the strategy's tiles where it gave them, else defaults for the width."""

    def value(kind: str, axis: str | None) -> int | None:
        d = plan.decision(kind, axis) if axis is not None else None
        return int(d.value) if d is not None and isinstance(d.value, int) else None

    lanes = value("vectorize", c.n) or max(4, vector_bits // 32)
    registers = 32 if vector_bits >= 512 else 16  # zmm0-31 with AVX-512, else 16 vector registers
    nv = PANEL_VECTORS
    mr = value("tile", c.m) or max(1, min(8 if registers == 32 else 6, (registers - nv - 2) // nv))
    mr = max(1, min(mr, 16))
    nr = nv * lanes
    nc = min(value("tile", c.n) or 128, MAX_TILE)  # larger ones are AK4014 (the target's Takes limits)
    nc = max(nr, -(-nc // nr) * nr)
    kc = max(1, min(value("tile", c.k) or 512, MAX_TILE))
    return Blocking(lanes, mr, nv, kc, nc, max(1, value("unroll", c.k) or 1))


def render_contraction(plan: KernelPlan, d: Dispatch, entry: str, declare: Callable[[str], None],
                       vector_bits: int, panel_slot: int | None = None,
                       units: frozenset[str] = frozenset()) -> tuple[str, LaunchSpec, str | None, str | None]:
    """The LLVM functions of one contraction dispatch and how to launch them.

    ``panel_slot``: the word of the dims array that may hold the address of ``B`` packed once
    into panels (see :meth:`_Gemm.panel_operand`); 0 there means "pack as you go". The third
    result, when B can come prepacked: ``"<B's buffer index>,<nr>"``. ``units``: the matrix units
    the code may use (:mod:`arke.targets.llvm.isa`; bf16 and int8 operands run on the best of them);
    the fourth result is the one it uses, if any.
    """
    assert isinstance(d.pattern, Contraction)
    integer = d.members[0].dtype is DType.I32
    unit = matrix_unit(plan, d.pattern, units, integer) if vector_bits >= 512 else None
    if unit is None and integer:
        raise ValueError(f"{entry}: an int8 contraction was planned for a renderer without an int8 unit ({units})")
    blk = unit_blocking(plan, d.pattern, unit) if unit is not None else blocking(plan, d.pattern, vector_bits)
    g = _Gemm(plan, d, entry, declare, blk, vector_bits, unit)
    g.panel_slot = panel_slot if g.panel_operand() is not None else None
    text = g.render()
    extent = dim_str(g.parallel_extent) if g.parallel_extent is not None else None
    launch = LaunchSpec(entry, extent, tuple(plan.buffer_index(b) for b in g.args), dim_str(g.scratch_words()))
    operand = g.panel_operand()
    panel = f"{plan.buffer_index(operand.src)},{g.panel_key()}" if g.panel_slot is not None and operand else None
    return text, launch, panel, unit


class _Gemm(VectorEpilogue, GemmRouted):
    """Emits a contraction dispatch: the task loop, packing, micro-kernel calls and epilogue."""

    def __init__(self, plan: KernelPlan, d: Dispatch, name: str, declare: Callable[[str], None], blk: Blocking,
                 vector_bits: int = 512, unit: str | None = None):
        assert isinstance(d.pattern, Contraction)
        self.c, self.blk, self.unit = d.pattern, blk, unit
        self.integer = d.members[0].dtype is DType.I32  # int8 × int8 → i32 sums (on the unit only)
        self.contract = d.members[0]
        self.accumulated: str | None = None  # the finished sum while the epilogue is rendered
        self.a_once: str | None = None  # decode: where the evaluated rows of A are (see rows_once)
        self.panel_slot: int | None = None  # the dims word holding B's prepacked panels, if it may
        self.pre = self.has_pre = ""
        self.scratch_at = ("", "")  # the task's packed-B block and A rows (set per slab)
        self.plain_a, self.plain_b = self.c.plain_a(), self.c.plain_b()
        # A is packed when it has a prologue (evaluated once per element) or the strategy says
        # `pack a` (rows whose stride is a multiple of 4 KiB collide in L1 when read in place)
        self.packs_a = self.plain_a is None or plan.decision("pack", self.plain_a.src) is not None
        # decode with a prologue on A (a norm, an activation): A's few rows are evaluated once per
        # worker into contiguous f32 rows, and the dot products read them (B is read once, as stored)
        pa, pb = self.plain_a, self.plain_b
        self.rows_once = (pb is not None and pb.indices[-1] == ir.Idx(self.c.k) and not self.c.batch
                          and not self.c.outer and self.c.m is not None
                          and (pa is None or pa.indices[-1] != ir.Idx(self.c.k)))
        super().__init__(plan, d, name, declare, vector_bits)
        self.vec = Vec(max(4, vector_bits // 32), self.let, declare)  # the epilogue's vectors
        self.bound, self.lane_index, self.jvec, self.svec = {}, "", "", ""
        for op in d.members:
            self.extent.update({a.name: a.extent for a in op.axes})
        self.extent.update({a.name: a.extent for a in self.contract.reduce_axes})  # type: ignore[union-attr]

    def _buffers_used(self) -> set[str]:
        c = self.c
        names = {x.src for e in (c.a, c.b) for x in ir.walk(e) if isinstance(x, ir.Load)}
        if c.epilogue is not None:
            names.add(c.epilogue.result)
            names |= {x.src for x in ir.walk(c.epilogue.body) if isinstance(x, ir.Load) and x.src != c.result}
        else:
            names.add(c.result)
        return names

    def _x_Load(self, e: ir.Load) -> str:
        if e.src == self.c.result and self.accumulated is not None:
            return self.accumulated
        return self.load(e)

    def panel_operand(self) -> ir.Load | None:
        """``B`` when it can come prepacked: an f32 parameter ``w[n, k]`` (a weight), no batch axes.

        Its panels are ``[ceil(N / nr)][K][nr]`` (column ``n`` of panel ``n / nr`` at lane ``n % nr``,
        zero past N): the micro-kernel reads a k-block of a panel in place, and decode streams the
        panels with ``A``'s rows broadcast, so neither packs anything."""
        pb, c = self.plain_b, self.c
        if pb is None or c.batch or pb.indices != (ir.Idx(c.n), ir.Idx(c.k)):
            return None
        buf = self.plan.buffers[self.plan.buffer_index(pb.src)]
        if buf.role != "param":
            return None
        if self.unit is not None:  # VNNI panels (panels.py); the VNNI unit's column sums want the per-call pack
            return pb if self.unit != VNNI else None
        return pb if buf.dtype is DType.F32 else None

    def panel_key(self) -> str:
        """The layout of the prepacked panels this dispatch reads (:mod:`arke.targets.llvm.panels`)."""
        return VNNI_KEY if self.unit is not None else str(self.blk.nr)

    # -- sizes
    def padded_rows(self) -> Dim:
        """Rows of the sum tile: M rounded up to register blocks, and at least the rows decode's panel dots
        write whatever M is (``GEMV_ROWS - 1``; a strategy may ask for blocks of fewer rows)."""
        mr = self.blk.mr
        blocks = mr * sympy.floor((self.rows() + mr - 1) / mr)
        return blocks + (GEMV_ROWS - 1 - mr if mr < GEMV_ROWS - 1 else 0)

    def scratch_words(self) -> Dim:
        """8-byte words of scratch per worker: packed B block, packed A rows, f32 sum tile, the few
        evaluated rows of A for decode, alignment slack."""
        floats = self.list_offset() + 32
        if self.routed():  # the listed rows of a routed contraction, one i64 each
            floats += 2 * self.rows()
        return sympy.floor((floats + 1) / 2)

    def list_offset(self) -> Dim:
        """Floats of the scratch before a routed contraction's row list (an even count: 8-byte words)."""
        floats = self.blk.kc * self.blk.nc + self.a_panel() + self.padded_rows() * self.blk.nc
        if self.rows_once:
            floats += GEMV_ROWS * self.extent[self.c.k]
        return 2 * sympy.floor((floats + 1) / 2)

    def a_panel(self) -> int:
        """Floats of the packed A rows (``mr × kc``, rounded to a cache line), when A has a prologue
        (or, on a matrix unit, the bf16 rows of a block that is not read in place)."""
        if self.unit is not None:  # mr rows of kc + A_PAD bf16
            return -(-self.blk.mr * (self.blk.kc + A_PAD) // 32) * 16
        return -(-self.blk.mr * self.blk.kc // 16) * 16 if self.packs_a else 0

    # -- the function
    def render(self) -> str:
        c, blk = self.c, self.blk
        self.prologue.append("  %errflag = alloca i1")
        self.prologue.append("  store i1 false, ptr %errflag")
        n_ext = self.dim(self.extent[c.n])
        # tasks of half a slab where N has few slabs (see halves()): a task count the workers can share out
        width = self.halves() or blk.nc
        tiles: Dim = sympy.floor((self.extent[c.n] + width - 1) / width)
        total: Dim = tiles
        for axis in c.batch:
            total = total * self.extent[axis]
        self.parallel_extent = total
        ntiles = self.dim(tiles)
        aligned = self.let("ptrtoint ptr %scratch to i64")
        aligned = self.let(f"add i64 {aligned}, 63")
        aligned = self.let(f"and i64 {aligned}, -64")
        packed = self.let(f"inttoptr i64 {aligned} to ptr")
        a_rows = self.let(f"getelementptr inbounds float, ptr {packed}, i64 {blk.kc * blk.nc}")
        tile = self.let(f"getelementptr inbounds float, ptr {packed}, i64 {blk.kc * blk.nc + self.a_panel()}")
        if self.unit == VNNI:  # the column sums go past the int8 panels (a quarter of B's f32 room)
            self.corr = self.let(f"getelementptr inbounds float, ptr {packed}, i64 {blk.kc * blk.nc // 4 + 16}")
        if self.rows_once:
            tile_floats = self.let(f"mul i64 {self.dim(self.padded_rows())}, {blk.nc}")
            self.a_once = self.let(f"getelementptr inbounds float, ptr {tile}, i64 {tile_floats}")
            few = self.let(f"icmp slt i64 {self.dim(self.rows())}, {GEMV_ROWS}")
            self.branch(few, lambda: self.evaluate_rows(self.a_once or ""), lambda: None)
        listing = self.let(f"getelementptr inbounds float, ptr {packed}, i64 {self.dim(self.list_offset())}") \
            if self.routed() else ""

        def task(flat: str) -> None:
            jc = self.let(f"urem i64 {flat}, {ntiles}")
            rest = self.let(f"udiv i64 {flat}, {ntiles}")
            for axis in reversed(c.batch[1:]):
                e = self.dim(self.extent[axis])
                self.current[axis] = self.let(f"urem i64 {rest}, {e}")
                rest = self.let(f"udiv i64 {rest}, {e}")
            if c.batch:
                self.current[c.batch[0]] = rest
            n0 = self.let(f"mul i64 {jc}, {width}")
            left = self.let(f"sub i64 {n_ext}, {n0}")
            if width == blk.nc:
                self.slab(n0, self.smin(left, str(blk.nc)), packed, a_rows, tile, listing)
                return
            # wide N: the even tasks run whole slabs (A is read once per slab), the odd ones nothing
            wide = self.let(f"icmp sge i64 {n_ext}, {HALF_SLABS_BELOW * blk.nc}")
            odd = self.let(f"trunc i64 {jc} to i1")
            nc = self.let(f"select i1 {wide}, i64 {self.smin(left, str(blk.nc))}, i64 {self.smin(left, str(width))}")
            self.branch(self.let(f"and i1 {wide}, {odd}"), lambda: None,
                        lambda: self.slab(n0, nc, packed, a_rows, tile, listing))

        if self.panel_slot is not None:
            word = self._pro(f"getelementptr inbounds i64, ptr %dims, i64 {self.panel_slot}")
            word = self._pro(f"load i64, ptr {word}")
            self.has_pre = self._pro(f"icmp ne i64 {word}, 0")
            self.pre = self._pro(f"inttoptr i64 {word} to ptr")
        tiles = self.unit is not None and self.form.tiles
        if tiles:
            self.tile_config()
        self.counted("task", "%lo", "%hi", task)
        if tiles:
            self.tile_release()
        self.declare("declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)")
        self.declare(vector_fma(blk.lanes)[1])
        params = ", ".join(f"ptr noalias {self.ptr[b]}" for b in self.args)
        head = (f"define void @\"{self.name}\"({params}, ptr noalias %dims, i64 %lo, i64 %hi, ptr noalias %err, "
                "ptr noalias %scratch) {")
        tail = ["  %ef = load i1, ptr %errflag", "  %ez = zext i1 %ef to i64", "  %eo = load i64, ptr %err",
                "  %en = or i64 %eo, %ez", "  store i64 %en, ptr %err", "  ret void", "}"]
        main = "\n".join([head, "entry:", *self.prologue, "  br label %start", "start:", *self.body, *tail])
        return "\n\n".join([self.unit_kernel() if self.unit is not None else self.micro_kernel(), main])

    def halves(self) -> int | None:
        """The width of half a slab, when tasks may be that wide: the workers split column slabs, and a
        projection with few of them (N = 896: 7 slabs of 128) leaves a worker idle for up to a slab's
        time (a 4:3 split on two), N = 128 one worker idle. Below :data:`HALF_SLABS_BELOW` slabs each
        task is half a slab (A is read once more per slab: at this size its rows stay in L2); above it,
        whole slabs. Not for a strategy's ``tile n`` nor the matrix units' own blocking. Each element's
        sum runs over k in the same order either way."""
        blk = self.blk
        half = blk.nc // 2 // blk.nr * blk.nr
        if self.unit is not None or half == 0 or self.plan.decision("tile", self.c.n) is not None:
            return None
        return half

    def slab(self, n0: str, nc: str, packed: str, a_rows: str, tile: str, listing: str = "") -> None:
        """One task: columns [n0, n0 + nc) of every row, for the current batch entry (of the listed
        rows only, when the contraction is routed: ``listing`` is where the list goes)."""
        c, blk = self.c, self.blk
        self.scratch_at = (packed, a_rows)
        rows_pad = self.dim(self.padded_rows())
        bytes_ = self.let(f"mul i64 {rows_pad}, {4 * blk.nc}")
        self.emit(f"call void @llvm.memset.p0.i64(ptr align 64 {tile}, i8 0, i64 {bytes_}, i1 false)")
        if self.unit == VNNI:
            self.emit(f"call void @llvm.memset.p0.i64(ptr align 4 {self.corr}, i8 0, i64 {4 * blk.nc}, i1 false)")
        if listing:
            self.routed_slab(n0, nc, packed, a_rows, tile, listing)
            return
        # a batch-reduce contraction: each step of the outer reduce axes adds A_e · B_e into the sums
        self.over(list(c.outer), lambda: self.sums(n0, nc, packed, a_rows, tile))
        self.finish(n0, nc, tile)

    def over(self, axes: list[str], body: Callable[[], None]) -> None:
        """``body()`` for every value of the outer reduce ``axes`` (the first outermost), in order."""
        if not axes:
            body()
            return

        def step(i: str) -> None:
            self.current[axes[0]] = i
            self.over(axes[1:], body)

        self.counted("red", "0", self.dim(self.extent[axes[0]]), step)

    def bases(self) -> tuple[str, str]:
        """The addresses of the plain operands' first elements at the current batch entry ("null" if none)."""
        c = self.c
        zero = (c.k, c.n) + ((c.m,) if c.m is not None else ())
        a0 = self.base(self.plain_a, zero) if self.plain_a is not None else "null"
        b0 = self.base(self.plain_b, zero) if self.plain_b is not None else "null"
        return a0, b0

    def sums(self, n0: str, nc: str, packed: str, a_rows: str, tile: str) -> None:
        """Add ``sum(A * B for k)`` over the slab's columns into the tile (the outer reduce axes fixed)."""
        m_ext = self.dim(self.rows())
        a0, b0 = self.bases()
        pa, pb = self.plain_a, self.plain_b
        dots_ok = self.dots_ok()
        if dots_ok and pa is not None and pb is not None:
            few = self.let(f"icmp slt i64 {m_ext}, {GEMV_ROWS}")
            self.branch(few, lambda: self.either_dots(pa, pb, a0, b0, n0, nc, tile),
                        lambda: self.blocks(a0, b0, n0, nc, packed, a_rows, tile))
        elif self.a_once is not None and pb is not None:
            few = self.let(f"icmp slt i64 {m_ext}, {GEMV_ROWS}")
            a_once = self.a_once
            self.branch(few, lambda: self.either_dots(None, pb, a_once, b0, n0, nc, tile),
                        lambda: self.blocks(a0, b0, n0, nc, packed, a_rows, tile))
        else:
            self.blocks(a0, b0, n0, nc, packed, a_rows, tile)

    def dots_ok(self) -> bool:
        """Whether few rows may run as dot products along k: both plain operands contiguous along k, and
        a float sum (the f32 dot products would round an integer one)."""
        pa, pb = self.plain_a, self.plain_b
        return (pa is not None and pb is not None and self.contiguous_k(pa) and self.contiguous_k(pb)
                and not self.integer)

    def routed_slab(self, n0: str, nc: str, packed: str, a_rows: str, tile: str, listing: str) -> None:
        """One task of a routed contraction: the rows its condition lists (at ``listing``), then the others."""
        m_ext = self.dim(self.rows())
        a0, b0 = self.bases()
        pa, pb = self.plain_a, self.plain_b
        dots_ok = self.dots_ok()
        # the listed rows take the path the dense form takes at this M (the same sums, in the same
        # order): dot products below GEMV_ROWS rows, else blocks; decode through prepacked panels or
        # evaluated rows stays dense (its rows are few)
        def routed(use_dots: bool) -> None:
            count = self.list_rows(listing)
            listed = (listing, count)

            def run() -> None:
                if use_dots and pa is not None and pb is not None:
                    self.dots(pa, pb, a0, b0, n0, nc, tile, listed)
                else:
                    self.blocks(a0, b0, n0, nc, packed, a_rows, tile, listed)
                self.finish(n0, nc, tile, listed)

            self.branch(self.let(f"icmp sgt i64 {count}, 0"), run)
            self.store_unrouted(n0, nc)

        a_once = self.a_once
        few = self.let(f"icmp slt i64 {m_ext}, {GEMV_ROWS}")
        if dots_ok and self.panel_slot is None:
            self.branch(few, lambda: routed(True), lambda: routed(False))
        elif (dots_ok or a_once is not None) and pb is not None:
            def dense_few() -> None:
                self.either_dots(pa if dots_ok else None, pb, a0 if dots_ok else a_once or "", b0, n0, nc, tile)
                self.finish(n0, nc, tile)

            self.branch(few, dense_few, lambda: routed(False))
        else:
            routed(False)

    def either_dots(self, pa: ir.Load | None, pb: ir.Load, a0: str, b0: str, n0: str, nc: str, tile: str) -> None:
        """Decode: dot products along k of A's rows and B's rows, or, when B came prepacked, the panels
        streamed with A's elements broadcast."""
        if self.panel_slot is None:
            self.dots(pa, pb, a0, b0, n0, nc, tile)
            return
        if self.unit is not None:  # VNNI panels: the unit's blocks (rows past M repeat the last; never stored)
            packed, a_rows = self.scratch_at
            self.branch(self.has_pre, lambda: self.blocks(a0, b0, n0, nc, packed, a_rows, tile),
                        lambda: self.dots(pa, pb, a0, b0, n0, nc, tile))
            return
        self.branch(self.has_pre, lambda: self.panel_dots(pa, a0, n0, nc, tile),
                    lambda: self.dots(pa, pb, a0, b0, n0, nc, tile))

    # -- packed blocks and micro-kernel calls
    def blocks(self, a0: str, b0: str, n0: str, nc: str, packed: str, a_rows: str, tile: str,
               listed: tuple[str, str] | None = None) -> None:
        """The packed k-blocks and register blocks of the task's rows (``listed``: a routed
        contraction's row list and count, whose rows run in list order)."""
        if self.unit is not None:
            self.unit_blocks(a0, b0, n0, nc, packed, a_rows, tile, listed)
            return
        c, blk = self.c, self.blk
        pa, pb = self.plain_a, self.plain_b
        k_ext = self.dim(self.extent[c.k])
        m_ext = listed[1] if listed is not None else self.dim(self.rows())
        sa_m = self.stride(pa, c.m) if c.m is not None and pa is not None else "0"
        sa_k = self.stride(pa, c.k) if pa is not None else "1"
        sb_k = self.stride(pb, c.k) if pb is not None else "0"
        sb_n = self.stride(pb, c.n) if pb is not None else "0"
        a_ty = STORAGE[self.buffer(pa.src).dtype] if pa is not None else "float"
        b_ty = STORAGE[self.buffer(pb.src).dtype] if pb is not None else "float"
        panels = self.let(f"add i64 {nc}, {blk.nr - 1}")
        panels = self.let(f"udiv i64 {panels}, {blk.nr}")
        last_row = self.let(f"sub i64 {m_ext}, 1")

        def depth(pc: str) -> None:
            left = self.let(f"sub i64 {k_ext}, {pc}")
            kc = self.smin(left, str(blk.kc))
            if self.panel_slot is None:
                self.pack(b0, b_ty, n0, nc, pc, kc, sb_k, sb_n, panels, packed)
            else:  # prepacked panels are read in place
                self.branch(self.has_pre, lambda: None,
                            lambda: self.pack(b0, b_ty, n0, nc, pc, kc, sb_k, sb_n, panels, packed))
            a_pc = self.let(f"mul i64 {pc}, {sa_k}")

            def row_block(ir_: str) -> None:
                rows = []
                for r in range(blk.mr):
                    row = self.smin(self.let(f"add i64 {ir_}, {r}"), last_row)
                    if listed is not None:
                        row = self.listed_row(listed[0], row)
                    if self.packs_a:  # copied (through the prologue) into [kc][mr] panels
                        rows.append(self.pack_a_row(row, r, pc, kc, a_rows))
                        continue
                    off = self.let(f"mul i64 {row}, {sa_m}")
                    off = self.let(f"add i64 {off}, {a_pc}")
                    rows.append(self.let(f"getelementptr inbounds {a_ty}, ptr {a0}, i64 {off}"))
                c_row = self.let(f"mul i64 {ir_}, {blk.nc}")

                def panel(jr: str) -> None:
                    bp_off = self.let(f"mul i64 {jr}, {kc}")
                    bp = self.let(f"getelementptr inbounds float, ptr {packed}, i64 {bp_off}")
                    if self.panel_slot is not None:  # panel (n0 + jr) / nr of the prepacked ones, at row pc
                        at = self.let(f"add i64 {n0}, {jr}")
                        at = self.let(f"udiv i64 {at}, {blk.nr}")
                        at = self.let(f"mul i64 {at}, {k_ext}")
                        at = self.let(f"add i64 {at}, {pc}")
                        at = self.let(f"mul i64 {at}, {blk.nr}")
                        pb_ = self.let(f"getelementptr inbounds float, ptr {self.pre}, i64 {at}")
                        bp = self.let(f"select i1 {self.has_pre}, ptr {pb_}, ptr {bp}")
                    ct = self.let(f"add i64 {c_row}, {jr}")
                    cp = self.let(f"getelementptr inbounds float, ptr {tile}, i64 {ct}")
                    args = ", ".join(f"ptr {r}" for r in rows)
                    step = str(blk.mr) if self.packs_a else sa_k
                    self.emit(f"call void @\"{self.name}.micro\"({args}, i64 {step}, ptr {bp}, i64 {kc}, ptr {cp})")

                nr_cols = self.let(f"mul i64 {panels}, {blk.nr}")
                self.counted("jr", "0", nr_cols, panel, step=blk.nr)

            self.counted("ir", "0", m_ext, row_block, step=blk.mr)

        self.counted("pc", "0", k_ext, depth, step=blk.kc)

    # -- the finished sums: epilogue and store
    def finish(self, n0: str, nc: str, tile: str, listed: tuple[str, str] | None = None) -> None:
        """The epilogue on the finished sums of the tile's rows, stored (row ``i`` of the tile is the
        ``i``-th listed row of a routed contraction)."""
        c, blk = self.c, self.blk
        m_ext = listed[1] if listed is not None else self.dim(self.rows())
        if self.vector_finish(n0, nc, tile, m_ext, listed):
            return
        contract = self.contract
        out_op = c.epilogue if c.epilogue is not None else contract

        def row(i: str) -> None:
            if c.m is not None:
                self.current[c.m] = self.listed_row(listed[0], i) if listed is not None else i
            base = self.let(f"mul i64 {i}, {blk.nc}")

            def column(col: str) -> None:
                self.current[c.n] = self.let(f"add i64 {n0}, {col}")
                at = self.let(f"add i64 {base}, {col}")
                q = self.let(f"getelementptr inbounds float, ptr {tile}, i64 {at}")
                total = self.let(f"load {'i32' if self.integer else 'float'}, ptr {q}")
                if self.unit == VNNI:
                    total = self.corrected(total, col)
                acc = DType.I32 if self.integer else DType.F32
                if c.epilogue is None:
                    value = self.convert(total, acc, contract.dtype)
                    self.store(self.buffer(c.result), [ir.Idx(a.name) for a in contract.axes], value, contract.dtype)
                    return
                for mine, theirs in zip(c.epilogue.axes, contract.axes):
                    self.current[mine.name] = self.current[theirs.name]
                # the sum is rounded to the contraction's dtype first, as the interpreter stores it
                self.accumulated = self.convert(total, acc, contract.dtype)
                value = self.expr(c.epilogue.body)
                self.accumulated = None
                self.store(self.buffer(out_op.result), [ir.Idx(a.name) for a in out_op.axes], value, out_op.dtype)

            self.counted("col", "0", nc, column)

        self.counted("out", "0", m_ext, row)
