"""Attention on the CPU's bf16 units (AMX tiles, AVX512-BF16), for the LLVM attention emitter
(:mod:`arke.targets.llvm.attention_tiles`).

Where q and k are bf16 (widened loads; k read from its rows, not a computed expression) and the
renderer may use AMX, the dot products ``sum(q[i, d] * k[j, d] for d)`` of a task's query rows with
a key tile run as ``TDPBF16PS``: the task's q rows are rounded once into bf16 rows ``QB`` (exact:
they are widened bf16 values; zero past D), each key tile is packed as words of two consecutive
features (``KT[d / 2][key]``, zero past D: the VNNI form), and per 16 rows × 16 keys a tile of sums
is accumulated over 32-feature steps and stored to ``S``; the score expression and the softmax
read their sums from there. The products are exact in f32; as for contractions on the unit
(spec/codegen.md §7), each pair of products is added as one rounding, bf16 subnormal inputs are
zero and subnormal sums flush to zero.

Where v and the result are bf16 too (flash and split_kv), ``P · V`` runs there as well: each row's
probabilities are also stored rounded to bf16 (``PB``, as flash attention and the GPU targets do:
spec/codegen.md §7; the softmax statistics and the row sums stay f32), the value tile is packed as
words of two consecutive keys (``VT[key / 2][e]``, zero past the tile and past dv), and the
output rows, rescaled by the online softmax's factor, accumulate ``TDPBF16PS`` tiles.

Where the CPU has AVX512-BF16 but no AMX (AMD Zen 4/5, Cooper Lake), the same packed words feed
``VDPBF16PS``: a row's word of two q features (two probabilities) broadcast against 16 keys' (16
values') words, accumulated in f32 registers; its arithmetic is the tiles' (spec/codegen.md §7).
"""

from __future__ import annotations

from arke.ir.dtypes import DType
from arke.ir.shapes import ceil_div
from arke.plan.attention import FEATURE, VALUE
from arke.targets.llvm.attention_base import AttentionBase
from arke.targets.llvm.convert import FLOAT16, narrow
from arke.targets.llvm.declarations import masked_load, masked_load_call
from arke.targets.llvm.gemm_bf16 import load_tile_config, release_tiles
from arke.targets.llvm.vec import Vec

#: Features per tile step (one 64-byte tile row of bf16) and rows / keys per tile.
STEP, TILE = 32, 16


class AmxScores(AttentionBase):
    """The bf16-pair forms of an attention dispatch's scores and values, on AMX or AVX512-BF16 (the base
    of :class:`~arke.targets.llvm.attention_tiles.AttentionEmitter`)."""

    def pairs_unit(self, units: frozenset[str], vector_bits: int) -> str | None:
        """The unit this dispatch's scores run on over bf16 pairs: AMX, else AVX512-BF16, else None (the
        f32 FMA path; see the module docstring)."""
        from arke.targets.llvm.isa import AMX, DPBF16

        p = self.pat
        usable = (vector_bits >= 512 and p.q_half is not None and p.k_half is not None and not p.k_direct
                  and not p.k_rows and p.q_half.dtype is DType.BF16 and p.k_half.dtype is DType.BF16)
        return next((u for u in (AMX, DPBF16) if usable and u in units), None)

    def pair_values_usable(self) -> bool:
        """Whether ``P · V`` runs on the unit too: bf16 v and result, flash or split_kv (the module docstring)."""
        p = self.pat
        return p.v_dtype is DType.BF16 and p.out_dtype is DType.BF16 and self.algorithm != "materialized"

    def dot_pairs(self, acc: str, a: str, b: str) -> str:
        """``acc + a · b`` over each lane's two bf16 pairs (``VDPBF16PS``; ``a``, ``b`` as 16 words)."""
        f, pairs = self.vec.f, f"<{2 * self.w} x bfloat>"
        self.declare(f"declare {f} @llvm.x86.avx512bf16.dpbf16ps.512({f}, {pairs}, {pairs})")
        x, y = (self.let(f"bitcast {self.vec.ty('i32')} {v} to {pairs}") for v in (a, b))
        return self.let(f"call {f} @llvm.x86.avx512bf16.dpbf16ps.512({f} {acc}, {pairs} {x}, {pairs} {y})")

    def dp_scores(self, rls: list[str]) -> list[list[str]]:
        """Rows ``rls``' dot products with the packed tile (KT) on AVX512-BF16: per feature pair, the row's
        word of two bf16 features (QB) broadcast against 16 keys' words, ``nv`` vectors per row."""
        s, vec, f = self, self.vec, self.vec.f
        accs = [[s.var(f, "zeroinitializer") for _ in range(s.nv)] for _ in rls]
        rows = [s.gep(s.at["QB"], s.i64("mul", rl, s.dim(s.dq / 2)), "i32") for rl in rls]

        def step() -> None:
            kp = s.current["dp"]
            kt = s.gep(s.at["KT"], s.i64("mul", kp, str(s.bk)), "i32")
            keys = [s.let(f"load {vec.ty('i32')}, ptr {s.gep(kt, str(v * s.w), 'i32')}, align 4")
                    for v in range(s.nv)]
            for r, row in enumerate(rows):
                q = vec.splat(s.get("i32", s.gep(row, kp, "i32")), "i32")
                for v in range(s.nv):
                    s.put(f, s.dot_pairs(s.get(f, accs[r][v]), q, keys[v]), accs[r][v])

        s.loop("dp", "0", s.dim(ceil_div(s.pat.extent(FEATURE), 2)), step)
        return [[s.get(f, a) for a in row] for row in accs]

    def dp_values(self, j0: str, kn: str) -> None:
        """``O[row] = O[row] * alpha[row] + PB[row] · VT`` on AVX512-BF16: a block of ``mrp`` rows × ``ne``
        vectors of dv kept in registers, per key pair the row's word of two probabilities broadcast."""
        self.pack_value_pairs(j0, kn)
        s, vec, w, f = self, self.vec, self.w, self.vec.f
        epp = s.dim(s.epp)

        def block() -> None:
            r0 = s.i64("mul", s.current["pb"], str(s.mrp))
            e0 = s.i64("mul", s.current["eb"], str(s.ne * w))
            rls = [s.i64("add", r0, str(r)) for r in range(s.mrp)]
            orows = [s.gep(s.at["O"], s.i64("add", s.i64("mul", rl, epp), e0)) for rl in rls]
            prows = [s.gep(s.at["PB"], s.i64("mul", rl, str(s.bk // 2)), "i32") for rl in rls]
            accs = []
            for r, rl in enumerate(rls):
                alpha = vec.splat(s.get("float", s.gep(s.at["A"], rl)))
                for u in range(s.ne):
                    accs.append(s.var(f, s.let(f"fmul {f} {vec.load(s.gep(orows[r], str(u * w)))}, {alpha}")))

            def pair() -> None:
                kp = s.current["vk"]
                vrow = s.gep(s.at["VT"], s.i64("add", s.i64("mul", kp, epp), e0), "i32")
                vs = [s.let(f"load {vec.ty('i32')}, ptr {s.gep(vrow, str(u * w), 'i32')}, align 4")
                      for u in range(s.ne)]
                for r in range(s.mrp):
                    p = vec.splat(s.get("i32", s.gep(prows[r], kp, "i32")), "i32")
                    for u in range(s.ne):
                        acc = accs[r * s.ne + u]
                        s.put(f, s.dot_pairs(s.get(f, acc), p, vs[u]), acc)

            s.loop("vk", "0", s.i64("udiv", s.i64("add", kn, "1"), "2"), pair)  # past kn: p and v are 0
            for r in range(s.mrp):
                for u in range(s.ne):
                    s.emit(vec.store(s.get(f, accs[r * s.ne + u]), s.gep(orows[r], str(u * w))))

        s.loop("pb", "0", s.i64("udiv", s.npad, str(s.mrp)),
               lambda: s.loop("eb", "0", s.dim(s.epp / (s.ne * w)), block))

    def store_p_bf16(self, rl: str, v: int, p: str) -> None:
        """Row ``rl``'s probabilities ``p`` (vector ``v`` of the tile) rounded to bf16 into ``PB``: one
        ``VCVTNEPS2BF16`` where the CPU has AVX512-BF16 (it flushes a subnormal to zero, which
        ``TDPBF16PS`` reading ``PB`` does anyway: the same sums), else the rounding in integer steps."""
        if self.convert_bf16:
            self.declare(f"declare <{self.w} x bfloat> @llvm.x86.avx512bf16.cvtneps2bf16.512({self.vec.f})")
            half = self.let(f"call <{self.w} x bfloat> @llvm.x86.avx512bf16.cvtneps2bf16.512({self.vec.f} {p})")
            bits = self.let(f"bitcast <{self.w} x bfloat> {half} to {self.vec.ty('i16')}")
        else:
            name, definition = narrow(FLOAT16[DType.BF16], self.w)
            self.declare(definition)
            bits = self.let(f"call {self.vec.ty('i16')} {name}({self.vec.f} {p})")
        at = self.gep(self.at["PB"], self.i64("add", self.i64("mul", rl, str(self.bk)), str(v * self.w)), "i16")
        self.emit(f"store {self.vec.ty('i16')} {bits}, ptr {at}, align 2")

    def pack_value_pairs(self, j0: str, kn: str) -> None:
        """``VT[kp][e]`` = the word of keys ``j0 + 2kp``, ``j0 + 2kp + 1``'s bf16 values at ``e`` (0 past
        the tile's keys and past dv): two rows interleaved per 16 values."""
        w, ev = self.w, self.dim(self.pat.extent(VALUE))
        self.declare(masked_load(w, "i16")[1])
        last = self.i64("sub", kn, "1")
        interleave = "<" + ", ".join(f"i32 {i // 2 + (w if i % 2 else 0)}" for i in range(2 * w)) + ">"
        epp = self.dim(self.epp)

        def pair() -> None:
            kp = self.current["vp"]
            keys = [self.i64("mul", kp, "2"), self.i64("add", self.i64("mul", kp, "2"), "1")]

            def chunk() -> None:
                e0 = self.i64("mul", self.current["vq"], str(w))
                emask = self.vec.lanes_below(e0, ev)
                halves = []
                for k in keys:
                    inside = self.let(f"icmp slt i64 {k}, {kn}")
                    mask = self.let(f"select i1 {inside}, {self.vec.ty('i1')} {emask}, "
                                    f"{self.vec.ty('i1')} zeroinitializer")
                    row = self.value_row(j0, self.imin(k, last), e0)
                    halves.append(self.let(masked_load_call(w, "i16", row, mask, 2)))
                y = self.let(f"shufflevector {self.vec.ty('i16')} {halves[0]}, {self.vec.ty('i16')} {halves[1]}, "
                             f"<{2 * w} x i32> {interleave}")
                at = self.gep(self.at["VT"], self.i64("mul", self.i64("add", self.i64("mul", kp, epp), e0), "2"),
                              "i16")
                self.emit(f"store <{2 * w} x i16> {y}, ptr {at}, align 2")

            self.loop("vq", "0", self.dim(self.epp / w), chunk)

        self.loop("vp", "0", str(self.bk // 2), pair)

    def tile_values(self, j0: str, kn: str) -> None:
        """``O[row] = O[row] * alpha[row] + PB[row] · VT`` for the task's rows: the products on AMX tiles
        (0 the sums, 4 the probabilities, 6 the value pairs) into ``OT``, then one vector pass. O never
        goes through a tile: a tile load right after vector stores to the same lines waits for them."""
        self.pack_value_pairs(j0, kn)
        vec, w, epp = self.vec, self.w, self.dim(self.epp)
        row_tiles = self.i64("udiv", self.i64("add", self.npad, str(TILE - 1)), str(TILE))
        bk = self.bk
        ostride = self.i64("mul", epp, "4")

        def tile_row() -> None:
            t = self.current["ot"]

            def value_tile() -> None:
                c = self.current["oc"]
                o = self.gep(self.at["OT"], self.i64("add", self.i64("mul", self.i64("mul", t, str(TILE)), epp),
                                                     self.i64("mul", c, str(TILE))))
                self.emit("call void @llvm.x86.tilezero(i8 0)")
                for step in range(bk // STEP):
                    a = self.gep(self.at["PB"], self.i64("add", self.i64("mul", self.i64("mul", t, str(TILE)),
                                                                         str(bk)), str(step * STEP)), "i16")
                    b = self.gep(self.at["VT"], self.i64("add", self.i64("mul", str(step * TILE), epp),
                                                         self.i64("mul", c, str(TILE))))
                    self.emit(f"call void @llvm.x86.tileloadd64(i8 4, ptr {a}, i64 {2 * bk})")
                    self.emit(f"call void @llvm.x86.tileloadd64(i8 6, ptr {b}, i64 {ostride})")
                    self.emit("call void @llvm.x86.tdpbf16ps(i8 0, i8 4, i8 6)")
                self.emit(f"call void @llvm.x86.tilestored64(i8 0, ptr {o}, i64 {ostride})")

            self.loop("oc", "0", self.dim(self.epp / TILE), value_tile)

        self.loop("ot", "0", row_tiles, tile_row)

        def rescale() -> None:
            rl = self.current["oa"]
            alpha = vec.splat(self.get("float", self.gep(self.at["A"], rl)))
            off = self.i64("mul", rl, epp)
            orow, trow = self.gep(self.at["O"], off), self.gep(self.at["OT"], off)

            def lanes() -> None:
                e0 = self.i64("mul", self.current["ob"], str(w))
                at = self.gep(orow, e0)
                self.emit(vec.store(vec.fma(vec.load(at), alpha, vec.load(self.gep(trow, e0))), at))

            self.loop("ob", "0", self.dim(self.epp / w), lanes)

        self.loop("oa", "0", self.npad, rescale)

    def tile_setup(self) -> None:
        load_tile_config(self)

    def tile_release(self) -> None:
        release_tiles(self)

    def q_rows_bf16(self) -> None:
        """``QB[row][d]`` = the task's q rows (QR, exact f32 of bf16 values) as bf16, zero past D, for the
        rows up to ``npad`` rounded up to a tile (rows past npad are left as they are: their sums are unused)."""
        s = self
        vec = s.vec
        dd = s.dim(s.pat.extent(FEATURE))
        dq = s.dim(s.dq)
        half = Vec(2 * vec.w, s.let, s.declare)

        def row() -> None:
            rl = s.current["qh"]
            src = s.get("ptr", s.gep(s.at["QP"], rl, "ptr"))
            dst = s.gep(s.at["QB"], s.i64("mul", rl, dq), "i16")

            def chunk() -> None:
                f0 = s.i64("mul", s.current["qc"], str(STEP))
                parts = []
                for u in range(2):
                    at = s.i64("add", f0, str(u * vec.w))
                    x = vec.masked_load(s.gep(src, at), vec.lanes_below(at, dd))
                    bits = s.let(f"bitcast {vec.f} {x} to {vec.ty('i32')}")
                    bits = s.let(f"lshr {vec.ty('i32')} {bits}, {vec.splat('16', 'i32')}")
                    parts.append(s.let(f"trunc {vec.ty('i32')} {bits} to {vec.ty('i16')}"))
                both = s.let(f"shufflevector {vec.ty('i16')} {parts[0]}, {vec.ty('i16')} {parts[1]}, "
                             f"<{2 * vec.w} x i32> <{', '.join(f'i32 {i}' for i in range(2 * vec.w))}>")
                s.emit(f"store {half.ty('i16')} {both}, ptr {s.gep(dst, f0, 'i16')}, align 2")

            s.loop("qc", "0", s.dim(s.dq / STEP), chunk)

        s.loop("qh", "0", s.npad, row)

    def pack_pairs(self, j0: str, kn: str) -> None:
        """``KT[d / 2][k]`` = the 32-bit word of key ``j0 + k``'s bf16 features ``d, d + 1`` (0 past D): per
        16 keys × 32 features the rows are loaded as 16 words each and transposed in registers. The
        keys past a short tile repeat its last one (their scores are masked to -inf)."""
        s = self
        vec = s.vec
        w = vec.w
        dd = s.dim(s.pat.extent(FEATURE))
        last = s.i64("sub", kn, "1")
        first = s.gep(s.kbase, s.i64("mul", j0, s.kstride), "i16")
        s.declare(masked_load(2 * w, "i16")[1])

        def block(full: bool) -> None:
            f0 = s.i64("mul", s.current["db"], str(2 * w))
            fmask = Vec(2 * w, s.let, s.declare).lanes_below(f0, dd)
            base = s.gep(first, f0, "i16")
            for v in range(s.nv):
                rows = []
                for k in range(w):
                    key = str(v * w + k) if full else s.imin(str(v * w + k), last)
                    at = s.gep(base, s.i64("mul", key, s.kstride), "i16")
                    raw = s.let(masked_load_call(2 * w, "i16", at, fmask, 2))
                    rows.append(s.let(f"bitcast <{2 * w} x i16> {raw} to {vec.f}"))
                word_row = s.i64("mul", s.current["db"], str(w * s.bk))
                out = s.gep(s.at["KT"], s.i64("add", word_row, str(v * w)))
                for lane, col in enumerate(vec.transpose(rows)):
                    s.emit(vec.store(col, s.gep(out, str(lane * s.bk))))

        blocks = s.dim(ceil_div(s.pat.extent(FEATURE), 2 * w))
        whole = s.let(f"icmp eq i64 {kn}, {s.bk}")
        s.branch(whole, lambda: s.loop("db", "0", blocks, lambda: block(True)),
                 lambda: s.loop("db", "0", blocks, lambda: block(False)))

    def tile_scores(self) -> None:
        """``S[row][key]`` = the dot products of the task's q rows (QB) with the packed tile (KT), per
        16 × 16 tile over the 32-feature steps (tile 0 the sums, 4 the rows, 6 the key pairs)."""
        s = self
        for line in ("declare void @llvm.x86.tileloadd64(i8, ptr, i64)", "declare void @llvm.x86.tdpbf16ps(i8, i8, i8)",
                     "declare void @llvm.x86.tilestored64(i8, ptr, i64)", "declare void @llvm.x86.tilezero(i8)"):
            s.declare(line)
        dq = s.dim(s.dq)
        steps = s.dim(s.dq / STEP)
        row_tiles = s.i64("udiv", s.i64("add", s.npad, str(TILE - 1)), str(TILE))
        bk = s.bk

        def tile_row() -> None:
            t = s.current["st"]
            a0 = s.gep(s.at["QB"], s.i64("mul", s.i64("mul", t, str(TILE)), dq), "i16")

            def key_tile() -> None:
                c = s.current["sc"]
                s.emit("call void @llvm.x86.tilezero(i8 0)")

                def step() -> None:
                    k = s.current["ss"]
                    a = s.gep(a0, s.i64("mul", k, str(STEP)), "i16")
                    b = s.gep(s.at["KT"], s.i64("add", s.i64("mul", k, str(TILE * bk)),
                                                 s.i64("mul", c, str(TILE))))
                    s.emit(f"call void @llvm.x86.tileloadd64(i8 4, ptr {a}, i64 {s.i64('mul', dq, '2')})")
                    s.emit(f"call void @llvm.x86.tileloadd64(i8 6, ptr {b}, i64 {4 * bk})")
                    s.emit("call void @llvm.x86.tdpbf16ps(i8 0, i8 4, i8 6)")

                s.loop("ss", "0", steps, step)
                at = s.i64("add", s.i64("mul", s.i64("mul", t, str(TILE)), str(bk)),
                           s.i64("mul", c, str(TILE)))
                s.emit(f"call void @llvm.x86.tilestored64(i8 0, ptr {s.gep(s.at['S'], at)}, i64 {4 * bk})")

            s.loop("sc", "0", str(bk // TILE), key_tile)

        s.loop("st", "0", row_tiles, tile_row)
