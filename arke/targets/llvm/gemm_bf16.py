"""Contractions on the CPU's matrix units, for the LLVM contraction renderer (:mod:`arke.targets.llvm.gemm`):
bf16 on AMX or AVX512-BF16 (below), int8 × int8 → i32 on AMX-INT8 (``TDPBSSD``, the AMX form on
bytes) or AVX512-VNNI (:mod:`arke.targets.llvm.gemm_vnni`), the panels and blocks shared by all.

A contraction whose two sides are plain bf16 loads (``sum(f32(x[m, k]) * f32(w[n, k]) for k)``, ``A``
contiguous along k) runs on the best unit the renderer was given (:mod:`arke.targets.llvm.isa`):

* **AMX** (``TDPBF16PS``): a micro-kernel holds a 32 × 32 block of sums in four tiles (tmm0-3), and
  per 32-deep step of k loads two tiles of ``A`` (16 rows × 32 bf16 each, tmm4-5) and two of ``B``
  (16 pairs of k × 16 columns, tmm6-7) and issues four tile products. The tile configuration is
  loaded once per call of the dispatch (every tile 16 rows × 64 bytes) and released at its end.
* **AVX512-BF16** (``VDPBF16PS``): an 8 × 32 block of sums in sixteen ``<16 x float>`` registers;
  per pair of k each row's two ``A`` values are broadcast as one 32-bit word and multiplied into
  the two vectors of the panel's pair row.

Both read ``B`` packed into VNNI panels of 32 columns — ``[panel][k / 2][32][2]`` bf16 (a pair of
consecutive k per column, zero past K and past the slab's columns), a k-block padded to a multiple
of 32 — and ``A`` in place where a row block is whole (32 or 8 rows inside M, a k-block without a
tail); elsewhere its rows inside M are copied into a zero-padded ``[mr][kc]`` bf16 block (the
block's other rows hold whatever the scratch held: a unit's rows are independent, and their sums
are never stored). Sums go to the same f32 tile as the f32 path's, so the epilogue,
row conditions and batch-reduce steps are unchanged. Each element's sum runs over k in the same order
whatever the thread count (k-blocks in order, pairs in order inside one unit instruction).

What differs from the f32 path (spec/codegen.md §7): products of bf16 values are exact in f32 on both,
but these units add the two products of a pair to the sum as one instruction with round-to-nearest-even
whatever MXCSR says, treat bf16 subnormal inputs as zero, and flush subnormal sums to zero.
"""

from __future__ import annotations

from dataclasses import dataclass

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.plan.contraction import Contraction
from arke.plan.dispatch import KernelPlan
from arke.targets.llvm.declarations import masked_load, masked_load_call
from arke.targets.llvm.emitter import Emitter
from arke.targets.llvm.gemm_base import Blocking
from arke.targets.llvm.gemm_vnni import PANEL, GemmVnni
from arke.targets.llvm.isa import AMX, AMX_INT8, DPBF16, INT8_UNITS, UNITS, VNNI
from arke.targets.llvm.vec import Vec

#: Columns of a VNNI panel (two vectors of 16 f32 sums; two AMX tiles of 16 columns).
UNIT_NR = PANEL
#: Depth granule of a packed k-block: one AMX tile of A is 32 bf16 wide.
UNIT_K = 32
#: bf16 elements added to the pitch of a copied block of A's rows (a cache line).
A_PAD = 32


@dataclass(frozen=True)
class UnitForm:
    """What the code for one unit looks like: register rows, default slab and k-block, operand type."""

    mr: int  # rows of a micro-kernel block
    nc: int  # default columns per task
    kc: int  # default k-block (elements)
    int8: bool  # int8 operands (64 per 64-byte row), else bf16 (32)
    tiles: bool  # AMX: tile registers, a tile configuration, A copied tile by tile


#: AMX: each micro-kernel call loads and stores its four sum tiles, a cost a deep k-block hides
#: (measured at 1024 x 1024 x 2048 on one core: k-blocks of 128, 512, 2048 gave 581, 818, 1017
#: GFLOP/s); its block of A (32 rows) and B's panels then stream from L2 in order. int8 k-blocks
#: hold twice the elements of bf16 ones in as many bytes.
#: What bounds the 2 x 2 block is the tile loads, not the products (one core of an AMX Xeon, 64-byte
#: aligned operands): four products alone run at 3.4-3.7 TFLOP/s, with their four loads from L1 at
#: 2.7, streamed from L2 at 2.0, and rows 4 KiB apart cost a further fifth. Software prefetch of B's
#: next k-steps, and A copied tile by tile with k-blocks of 384 under 1024-column slabs, measured
#: within noise of this form on whole 512-row GEMMs (about 1.9 TFLOP/s on two cores, oneDNN's speed).
FORMS = {AMX: UnitForm(32, 256, 2048, False, True), AMX_INT8: UnitForm(32, 256, 4096, True, True),
         DPBF16: UnitForm(8, 128, 512, False, False), VNNI: UnitForm(8, 128, 1024, True, False)}


def matrix_unit(plan: KernelPlan, c: Contraction, units: frozenset[str], integer: bool = False) -> str | None:
    """The matrix unit ``c`` runs on (one of ``units``), or None for the f32 path (``integer``: ``c``
    sums int8 products into i32, and runs on one of :data:`~arke.targets.llvm.isa.INT8_UNITS`).

    Both sides must be plain bf16 loads (no prologue: its f32 values would have to be rounded to
    bf16), ``A`` contiguous along k, ``B`` contiguous along n or k; a strategy that sets the register
    rows (``tile m``) or the vector width keeps the f32 path, whose blocking those decisions describe.
    """
    pa, pb = c.plain_a(), c.plain_b()
    if pa is None or pb is None or not units:
        return None
    if integer:  # an int8 x int8 -> i32 sum: planned only where the renderer has the unit
        return next((u for u in INT8_UNITS if u in units), None)
    if any(plan.buffers[plan.buffer_index(x.src)].dtype is not DType.BF16 for x in (pa, pb)):
        return None
    if pa.indices[-1] != ir.Idx(c.k) or pb.indices[-1] not in (ir.Idx(c.n), ir.Idx(c.k)):
        return None
    if (c.m is not None and plan.decision("tile", c.m) is not None) or plan.decision("vectorize", c.n) is not None:
        return None
    return next((u for u in UNITS if u in units), None)


def unit_blocking(plan: KernelPlan, c: Contraction, unit: str) -> Blocking:
    """The blocking of a matrix-unit contraction: 32-column panels, rows per unit, k-blocks of 32s."""

    def value(kind: str, axis: str) -> int | None:
        d = plan.decision(kind, axis)
        return int(d.value) if d is not None and isinstance(d.value, int) else None

    form = FORMS[unit]
    nc = min(value("tile", c.n) or form.nc, 8192)  # larger ones are AK4014 (the target's Takes limits)
    nc = max(UNIT_NR, -(-nc // UNIT_NR) * UNIT_NR)
    kc = min(value("tile", c.k) or form.kc, 8192)
    step = 2 * UNIT_K if form.int8 else UNIT_K
    kc = max(step, -(-kc // step) * step)
    return Blocking(16, form.mr, 2, kc, nc, 1)


def load_tile_config(fn: Emitter) -> None:
    """Load the AMX configuration (palette 1; tiles 0-7 of 16 rows × 64 bytes) where ``fn``'s code runs
    now: once per call of a dispatch that uses the tiles (contractions here, attention's scores)."""
    cfg = fn._pro("alloca [64 x i8], align 64")
    fn.declare("declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)")
    fn.declare("declare void @llvm.x86.ldtilecfg(ptr)")
    fn.emit(f"call void @llvm.memset.p0.i64(ptr align 64 {cfg}, i8 0, i64 64, i1 false)")
    fn.emit(f"store i8 1, ptr {cfg}")
    for t in range(8):
        fn.emit(f"store i16 64, ptr {fn.let(f'getelementptr inbounds i8, ptr {cfg}, i64 {16 + 2 * t}')}")
        fn.emit(f"store i8 16, ptr {fn.let(f'getelementptr inbounds i8, ptr {cfg}, i64 {48 + t}')}")
    fn.emit(f"call void @llvm.x86.ldtilecfg(ptr {cfg})")


def release_tiles(fn: Emitter) -> None:
    """Release the tile state at the end of a dispatch that loaded :func:`load_tile_config`."""
    fn.declare("declare void @llvm.x86.tilerelease()")
    fn.emit("call void @llvm.x86.tilerelease()")


class GemmMatrix(GemmVnni):
    """The matrix-unit form of a contraction's packed blocks (see the module's docstring)."""

    unit: str | None
    panel_slot: int | None  # the dims word holding B's prepacked VNNI panels, if it may (gemm.py)
    pre: str  # their address, when they came
    has_pre: str  # whether they came

    @property
    def form(self) -> UnitForm:
        assert self.unit is not None
        return FORMS[self.unit]

    @property
    def uk(self) -> int:
        """Elements of k per 64-byte tile row: 32 bf16 or 64 int8."""
        return 2 * UNIT_K if self.form.int8 else UNIT_K

    @property
    def el(self) -> str:
        """The LLVM type of one operand element."""
        return "i8" if self.form.int8 else "i16"

    @property
    def es(self) -> int:
        """Bytes per operand element (a 32-bit word of a VNNI panel holds 4 / es of them)."""
        return 1 if self.form.int8 else 2

    def listed_row(self, at: str, i: str) -> str:
        """The row at position ``i`` of a routed contraction's list at ``at``."""
        q = self.let(f"getelementptr inbounds i64, ptr {at}, i64 {i}")
        return self.let(f"load i64, ptr {q}")

    def unit_blocks(self, a0: str, b0: str, n0: str, nc: str, packed: str, a_rows: str, tile: str,
                    listed: tuple[str, str] | None = None) -> None:
        """:meth:`~arke.targets.llvm.gemm._Gemm.blocks` on the unit: VNNI panels, A blocks, unit micro-kernels."""
        c, blk = self.c, self.blk
        pa = self.plain_a
        assert pa is not None and self.plain_b is not None
        k_ext = self.dim(self.extent[c.k])
        m_ext = listed[1] if listed is not None else self.dim(self.rows())
        sa_m = self.stride(pa, c.m) if c.m is not None else "0"
        panels = self.let(f"add i64 {nc}, {UNIT_NR - 1}")
        panels = self.let(f"udiv i64 {panels}, {UNIT_NR}")
        last_row = self.let(f"sub i64 {m_ext}, 1")
        ap = self._pro("alloca ptr")
        sp = self._pro("alloca i64")  # A's row stride in bytes
        kp_ = self._pro("alloca i64")  # bytes between A's k-steps of one row
        hp = self._pro("alloca i64")  # bytes from A's row 0 to row 16 (AMX's second tile)

        prepacked = self.panel_slot is not None
        k_pad = first = ""
        if prepacked:  # panel p of the prepacked ones holds K rounded up to uk, in word rows of 32
            k_pad = self.let(f"add i64 {k_ext}, {self.uk - 1}")
            k_pad = self.let(f"and i64 {k_pad}, {-self.uk}")
            first = self.let(f"udiv i64 {n0}, {UNIT_NR}")

        def depth(pc: str) -> None:
            left = self.let(f"sub i64 {k_ext}, {pc}")
            kc = self.smin(left, str(blk.kc))
            kcp = self.let(f"add i64 {kc}, {self.uk - 1}")
            kcp = self.let(f"and i64 {kcp}, {-self.uk}")
            if prepacked:
                self.branch(self.has_pre, lambda: None,
                            lambda: self.vnni_pack(b0, n0, nc, pc, kc, kcp, panels, packed))
            else:
                self.vnni_pack(b0, n0, nc, pc, kc, kcp, panels, packed)
            if self.unit == VNNI:  # what flipping A's sign bits adds to each column (gemm_vnni.py)
                self.column_sums(kcp, panels, packed)

            def row_block(ir_: str) -> None:
                self.a_block(a0, sa_m, ir_, pc, kc, kcp, m_ext, last_row, a_rows, listed, (ap, sp, kp_, hp))
                a = self.let(f"load ptr, ptr {ap}")
                sa = self.let(f"load i64, ptr {sp}")
                ka = self.let(f"load i64, ptr {kp_}")
                half = self.let(f"load i64, ptr {hp}")
                c_row = self.let(f"mul i64 {ir_}, {blk.nc}")

                def panel(jr: str) -> None:
                    bo = self.let(f"mul i64 {jr}, {kcp}")  # a panel: kcp elements of 32 columns
                    bp = self.let(f"getelementptr inbounds {self.el}, ptr {packed}, i64 {bo}")
                    if prepacked:  # (panel n0 / 32 + jr / 32) * k_pad + pc, in elements of 32 columns
                        at = self.let(f"udiv i64 {jr}, {UNIT_NR}")
                        at = self.let(f"add i64 {at}, {first}")
                        at = self.let(f"mul i64 {at}, {k_pad}")
                        at = self.let(f"add i64 {at}, {pc}")
                        at = self.let(f"mul i64 {at}, {UNIT_NR}")
                        pre = self.let(f"getelementptr inbounds {self.el}, ptr {self.pre}, i64 {at}")
                        bp = self.let(f"select i1 {self.has_pre}, ptr {pre}, ptr {bp}")
                    ct = self.let(f"add i64 {c_row}, {jr}")
                    cp = self.let(f"getelementptr inbounds float, ptr {tile}, i64 {ct}")
                    args = f"(ptr {a}, i64 {sa}, i64 {ka}, i64 {half}, ptr {bp}, i64 {kcp}, ptr {cp})"
                    if self.form.tiles:  # a block of at most 16 rows inside M (decode): half the tile products
                        few = self.let(f"icmp sle i64 {self.let(f'sub i64 {m_ext}, {ir_}')}, 16")
                        self.branch(few, lambda: self.emit(f"call void @\"{self.name}.unit16\"{args}"),
                                    lambda: self.emit(f"call void @\"{self.name}.unit\"{args}"))
                    else:
                        self.few_rows_call(self.let(f"sub i64 {m_ext}, {ir_}"), args)

                cols = self.let(f"mul i64 {panels}, {UNIT_NR}")
                self.counted("ujr", "0", cols, panel, step=UNIT_NR)

            self.counted("uir", "0", m_ext, row_block, step=blk.mr)

        self.counted("upc", "0", k_ext, depth, step=blk.kc)

    def few_rows_call(self, left: str, args: str, at: int = 0) -> None:
        """Call the smallest register-block micro-kernel that holds the ``left`` rows inside M (``.unit<r>`` for
        ``r`` in :attr:`few_rows`, else ``.unit``): the same sums in the same order, fewer wasted products."""
        if at == len(self.few_rows):
            self.emit(f"call void @\"{self.name}.unit\"{args}")
            return
        rows = self.few_rows[at]
        self.branch(self.let(f"icmp sle i64 {left}, {rows}"),
                    lambda: self.emit(f"call void @\"{self.name}.unit{rows}\"{args}"),
                    lambda: self.few_rows_call(left, args, at + 1))

    def _lanes_below(self, start: str, limit: str, lanes: int) -> str:
        """``<lanes x i1>``: ``start + l < limit`` for each lane ``l``."""
        return Vec(lanes, self.let, self.declare).lanes_below(start, limit)

    def _masked(self, ptr: str, mask: str) -> str:
        """A masked load of one 64-byte row of elements (0 where ``mask`` is off)."""
        self.declare(masked_load(self.uk, self.el)[1])
        return self.let(masked_load_call(self.uk, self.el, ptr, mask, self.es))

    def a_block(self, a0: str, sa_m: str, ir_: str, pc: str, kc: str, kcp: str, m_ext: str, last_row: str,
                a_rows: str, listed: tuple[str, str] | None, slots: tuple[str, str, str, str]) -> None:
        """Where the unit reads rows ``ir_ ..`` of A's k-block: its address, the bytes between rows,
        between k-steps of a row and from row 0 to row 16, stored to ``slots``. In place when the
        block is whole (mr rows inside M, no k tail), else copied into the zero-padded block at ``a_rows``:
        for AMX tile by tile (``[k / 32][16-row tile][16][32]``: each tile load reads 1 KiB in
        sequence, which the prefetchers follow, where 16 rows far apart would each be a stream of
        their own and rows 4 KiB apart collide in L1), else row by row (a cache line of padding
        after each, so rows do not lie a multiple of 4 KiB apart)."""
        mr, amx = self.blk.mr, self.form.tiles
        ap, sp, kp_, hp = slots
        pitch = self.let(f"add i64 {kcp}, {A_PAD}")

        def in_place() -> None:
            off = self.let(f"mul i64 {ir_}, {sa_m}")
            off = self.let(f"add i64 {off}, {pc}")
            self.emit(f"store ptr {self.let(f'getelementptr inbounds {self.el}, ptr {a0}, i64 {off}')}, ptr {ap}")
            row = self.let(f"mul i64 {sa_m}, {self.es}")
            self.emit(f"store i64 {row}, ptr {sp}")
            self.emit(f"store i64 {self.es}, ptr {kp_}")
            self.emit(f"store i64 {self.let(f'mul i64 {row}, 16')}, ptr {hp}")

        def copy() -> None:
            def row(r: str) -> None:
                at = self.smin(self.let(f"add i64 {ir_}, {r}"), last_row)
                if listed is not None:
                    at = self.listed_row(listed[0], at)
                off = self.let(f"mul i64 {at}, {sa_m}")
                off = self.let(f"add i64 {off}, {pc}")
                src = self.let(f"getelementptr inbounds {self.el}, ptr {a0}, i64 {off}")
                uk = self.uk
                if amx:  # row r of tile r / 16: element uk * (r % 16) of every 16-row tile
                    tile = self.let(f"udiv i64 {r}, 16")
                    dst = self.let(f"urem i64 {r}, 16")
                    dst = self.let(f"mul i64 {dst}, {uk}")
                    dst = self.let(f"add i64 {dst}, {self.let(f'mul i64 {tile}, {16 * uk}')}")
                else:
                    dst = self.let(f"mul i64 {r}, {pitch}")
                dst = self.let(f"getelementptr inbounds {self.el}, ptr {a_rows}, i64 {dst}")

                def chunk(kk: str) -> None:
                    mask = self._lanes_below(kk, kc, uk)
                    s = self.let(f"getelementptr {self.el}, ptr {src}, i64 {kk}")
                    v = self._masked(s, mask)
                    at = self.let(f"mul i64 {kk}, {mr}") if amx else kk  # a k-step of uk is mr rows of uk
                    q = self.let(f"getelementptr inbounds {self.el}, ptr {dst}, i64 {at}")
                    self.emit(f"store <{uk} x {self.el}> {v}, ptr {q}, align {self.es}")

                self.counted("ak", "0", kcp, chunk, step=uk)

            # only the block's rows inside M: a unit's rows are independent, so the rest of the block
            # (stale scratch) only makes sums that are never stored, and decode copies one row, not mr
            inside = self.smin(str(mr), self.let(f"sub i64 {m_ext}, {ir_}"))
            self.counted("ar", "0", inside, row)
            self.emit(f"store ptr {a_rows}, ptr {ap}")
            if amx:
                self.emit(f"store i64 {self.es * self.uk}, ptr {sp}")  # 64 bytes
                self.emit(f"store i64 {self.es * mr}, ptr {kp_}")  # per element of k: mr rows of es bytes per uk
                self.emit(f"store i64 {self.es * 16 * self.uk}, ptr {hp}")
            else:
                bytes_ = self.let(f"mul i64 {pitch}, {self.es}")
                self.emit(f"store i64 {bytes_}, ptr {sp}")
                self.emit(f"store i64 {self.es}, ptr {kp_}")
                self.emit(f"store i64 {self.let(f'mul i64 {bytes_}, 16')}, ptr {hp}")

        if listed is not None:
            copy()
            return
        end = self.let(f"add i64 {ir_}, {mr}")
        rows_in = self.let(f"icmp sle i64 {end}, {m_ext}")
        no_tail = self.let(f"icmp eq i64 {kc}, {kcp}")
        self.branch(self.let(f"and i1 {rows_in}, {no_tail}"), in_place, copy)

    def vnni_pack(self, b0: str, n0: str, nc: str, pc: str, kc: str, kcp: str, panels: str, packed: str) -> None:
        """``packed[p][kp][l][j] = B[pc + 2kp + j, n0 + 32p + l]`` (bf16; zero past kc and past nc)."""
        c, pb = self.c, self.plain_b
        assert pb is not None
        if pb.indices[-1] == ir.Idx(c.n):
            self._pack_rows(b0, n0, nc, pc, kc, kcp, panels, packed)
        else:
            self._pack_columns(b0, n0, nc, pc, kc, kcp, panels, packed)

    def _pack_rows(self, b0: str, n0: str, nc: str, pc: str, kc: str, kcp: str, panels: str, packed: str) -> None:
        """B contiguous along n (``w[k, n]``): two rows of k interleaved into each pair row of a panel."""
        assert self.plain_b is not None
        sb_k = self.stride(self.plain_b, self.c.k)
        pairs = self.let(f"udiv i64 {kcp}, 2")
        interleave = "<" + ", ".join(f"i32 {i // 2 + (UNIT_NR if i % 2 else 0)}" for i in range(2 * UNIT_NR)) + ">"

        def pair(kp: str) -> None:
            k = self.let(f"mul i64 {kp}, 2")
            has0 = self.let(f"icmp slt i64 {k}, {kc}")
            k1 = self.let(f"add i64 {k}, 1")
            has1 = self.let(f"icmp slt i64 {k1}, {kc}")
            row = self.let(f"add i64 {pc}, {self.smin(k, self.let(f'sub i64 {kc}, 1'))}")
            off = self.let(f"mul i64 {row}, {sb_k}")
            off = self.let(f"add i64 {off}, {n0}")
            row0 = self.let(f"getelementptr inbounds i16, ptr {b0}, i64 {off}")
            nxt = self.let(f"getelementptr i16, ptr {row0}, i64 {sb_k}")
            row1 = self.let(f"select i1 {has1}, ptr {nxt}, ptr {row0}")

            def panel(p: str) -> None:
                col = self.let(f"mul i64 {p}, {UNIT_NR}")
                cols = self._lanes_below(col, nc, UNIT_NR)
                m0 = self.let(f"select i1 {has0}, <{UNIT_NR} x i1> {cols}, <{UNIT_NR} x i1> zeroinitializer")
                m1 = self.let(f"select i1 {has1}, <{UNIT_NR} x i1> {cols}, <{UNIT_NR} x i1> zeroinitializer")
                x0 = self._masked(self.let(f"getelementptr i16, ptr {row0}, i64 {col}"), m0)
                x1 = self._masked(self.let(f"getelementptr i16, ptr {row1}, i64 {col}"), m1)
                y = self.let(f"shufflevector <{UNIT_NR} x i16> {x0}, <{UNIT_NR} x i16> {x1}, <{2 * UNIT_NR} x i32> "
                             f"{interleave}")
                at = self.let(f"mul i64 {p}, {pairs}")  # a panel is kcp / 2 pair rows
                at = self.let(f"add i64 {at}, {kp}")
                at = self.let(f"mul i64 {at}, {2 * UNIT_NR}")
                q = self.let(f"getelementptr inbounds i16, ptr {packed}, i64 {at}")
                self.emit(f"store <{2 * UNIT_NR} x i16> {y}, ptr {q}, align 2")

            self.counted("vp", "0", panels, panel)

        self.counted("vk", "0", pairs, pair)

    def _pack_columns(self, b0: str, n0: str, nc: str, pc: str, kc: str, kcp: str, panels: str, packed: str) -> None:
        """B contiguous along k (``w[n, k]``): per 16 columns, 32 k of each column loaded as 16 pairs
        and the 16 × 16 block of pairs transposed in registers into 16 pair rows of the panel."""
        assert self.plain_b is not None
        sb_n = self.stride(self.plain_b, self.c.n)
        vec = Vec(16, self.let, self.declare)
        per = 4 // self.es  # elements of k per 32-bit word
        pairs = self.let(f"udiv i64 {kcp}, {per}")

        def panel(p: str) -> None:
            base = self.let(f"mul i64 {p}, {UNIT_NR}")
            for half in range(2):
                ptrs, valid = [], []
                for lane in range(16):
                    col = self.let(f"add i64 {base}, {half * 16 + lane}")
                    inside = self.let(f"icmp slt i64 {col}, {nc}")
                    safe = self.let(f"select i1 {inside}, i64 {col}, i64 0")
                    n = self.let(f"add i64 {n0}, {safe}")
                    off = self.let(f"mul i64 {n}, {sb_n}")
                    off = self.let(f"add i64 {off}, {pc}")
                    ptrs.append(self.let(f"getelementptr inbounds {self.el}, ptr {b0}, i64 {off}"))
                    valid.append(inside)

                def block(kb: str, half: int = half, ptrs: list[str] = ptrs, valid: list[str] = valid) -> None:
                    uk = self.uk
                    kmask = self._lanes_below(kb, kc, uk)
                    rows = []
                    for lane in range(16):
                        m = self.let(f"select i1 {valid[lane]}, <{uk} x i1> {kmask}, <{uk} x i1> zeroinitializer")
                        x = self._masked(self.let(f"getelementptr {self.el}, ptr {ptrs[lane]}, i64 {kb}"), m)
                        rows.append(self.let(f"bitcast <{uk} x {self.el}> {x} to <16 x float>"))
                    kp0 = self.let(f"udiv i64 {kb}, {per}")
                    for j, t in enumerate(vec.transpose(rows)):
                        at = self.let(f"mul i64 {p}, {pairs}")  # a panel is kcp / per word rows
                        at = self.let(f"add i64 {at}, {kp0}")
                        at = self.let(f"add i64 {at}, {j}")
                        at = self.let(f"mul i64 {at}, {UNIT_NR}")
                        at = self.let(f"add i64 {at}, {half * 16}")
                        q = self.let(f"getelementptr inbounds i32, ptr {packed}, i64 {at}")
                        self.emit(f"store <16 x i32> {self.let(f'bitcast <16 x float> {t} to <16 x i32>')}, "
                                  f"ptr {q}, align 2")

                self.counted("vb", "0", kcp, block, step=self.uk)

        self.counted("vc", "0", panels, panel)

    # -- the micro-kernels
    def unit_kernel(self) -> str:
        """``c[r][0:32] += sum over k of A[r][k] * panel[k][0:32]`` for the unit's rows, k a multiple of 32."""
        if self.form.tiles:
            return self._amx_kernel()
        return self.vnni_kernel() if self.unit == VNNI else self._dp_kernel()

    def tile_config(self) -> None:
        load_tile_config(self)

    def tile_release(self) -> None:
        release_tiles(self)

    def _amx_kernel(self) -> str:
        """The 32-row micro-kernel (``.unit``) and its 16-row half (``.unit16``: tiles 0, 1 of sums and
        one of A, for a block with at most 16 rows inside M — decode — where the other half's products
        would be wasted and, with the weights in cache, the tile products bound the step)."""
        return self._amx_rows(32) + "\n\n" + self._amx_rows(16)

    def _amx_rows(self, rows: int) -> str:
        tdp = "@llvm.x86.tdpbssd" if self.unit == AMX_INT8 else "@llvm.x86.tdpbf16ps"
        for line in ("declare void @llvm.x86.tileloadd64(i8, ptr, i64)", f"declare void {tdp}(i8, i8, i8)",
                     "declare void @llvm.x86.tilestored64(i8, ptr, i64)"):
            self.declare(line)
        sc = 4 * self.blk.nc
        sums = ("%c", "%c1", "%c2", "%c3")[:rows // 8]
        name = f"{self.name}.unit" + ("" if rows == 32 else str(rows))
        lines = [f"define internal void @\"{name}\"(ptr %a, i64 %sa, i64 %ka, i64 %a16, ptr %bp, i64 %kc, "
                 "ptr %c) nounwind {", "entry:", "  %c1 = getelementptr inbounds i8, ptr %c, i64 64",
                 f"  %c2 = getelementptr inbounds i8, ptr %c, i64 {16 * sc}",
                 f"  %c3 = getelementptr inbounds i8, ptr %c, i64 {16 * sc + 64}",
                 "  %a1 = getelementptr i8, ptr %a, i64 %a16"]
        for t, p in enumerate(sums):
            lines.append(f"  call void @llvm.x86.tileloadd64(i8 {t}, ptr {p}, i64 {sc})")
        lines += ["  br label %loop", "loop:", "  %kk = phi i64 [ 0, %entry ], [ %kk1, %loop ]",
                  "  %ao = mul i64 %kk, %ka",
                  "  %ap0 = getelementptr i8, ptr %a, i64 %ao", "  %ap1 = getelementptr i8, ptr %a1, i64 %ao",
                  f"  %bo = mul i64 %kk, {4 * UNIT_NR // (4 // self.es)}",  # k / per word rows of 32 words
                  "  %bq0 = getelementptr inbounds i8, ptr %bp, i64 %bo",
                  "  %bq1 = getelementptr inbounds i8, ptr %bq0, i64 64",
                  # each load issued just before the first product that needs it, so loads overlap products
                  f"  call void @llvm.x86.tileloadd64(i8 6, ptr %bq0, i64 {4 * UNIT_NR})",
                  "  call void @llvm.x86.tileloadd64(i8 4, ptr %ap0, i64 %sa)",
                  f"  call void {tdp}(i8 0, i8 4, i8 6)",
                  f"  call void @llvm.x86.tileloadd64(i8 7, ptr %bq1, i64 {4 * UNIT_NR})",
                  f"  call void {tdp}(i8 1, i8 4, i8 7)"]
        if rows == 32:
            lines += ["  call void @llvm.x86.tileloadd64(i8 5, ptr %ap1, i64 %sa)",
                      f"  call void {tdp}(i8 2, i8 5, i8 6)",
                      f"  call void {tdp}(i8 3, i8 5, i8 7)"]
        lines += [f"  %kk1 = add i64 %kk, {self.uk}", "  %more = icmp slt i64 %kk1, %kc",
                  "  br i1 %more, label %loop, label %exit", "exit:"]
        for t, p in enumerate(sums):
            lines.append(f"  call void @llvm.x86.tilestored64(i8 {t}, ptr {p}, i64 {sc})")
        lines += ["  ret void", "}"]
        return "\n".join(lines)

    def _dp_kernel(self) -> str:
        vec, pairs = "<16 x float>", "<32 x bfloat>"
        dp = "@llvm.x86.avx512bf16.dpbf16ps.512"
        self.declare(f"declare {vec} {dp}({vec}, {pairs}, {pairs})")
        return self.register_blocks(vec, pairs, dp, per_word=2)


__all__ = ["AMX", "AMX_INT8", "DPBF16", "FORMS", "UNIT_K", "UNIT_NR", "VNNI", "GemmMatrix", "UnitForm",
           "load_tile_config", "matrix_unit", "release_tiles", "unit_blocking"]
