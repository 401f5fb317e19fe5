"""The attention dispatch's emitter and its micro-kernels (see :mod:`arke.targets.llvm.attention`).

:class:`AttentionEmitter` holds what every algorithm shares: small emitting helpers, row
pointers and roles, and the per-tile kernels: packing a key tile transposed, the score block
with the score expression and the softmax step, and the value block.
"""

from __future__ import annotations

from collections.abc import Callable

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import ceil_div
from arke.plan.attention import FEATURE, KEY, QUERY, VALUE, Attention
from arke.plan.dispatch import Dispatch, KernelPlan
from arke.targets.llvm.attention_amx import STEP, AmxScores
from arke.targets.llvm.declarations import prefetch
from arke.targets.llvm.isa import AMX, DPBF16
from arke.targets.llvm.scalar import STORAGE
from arke.targets.llvm.vec import NEG_INF, Vec

ROWS = 64  # query rows per task: a packed key tile serves all of them
MAT_ROWS = 16  # rows per task of `materialized` (each keeps a whole row of scores)
PREFETCH_TILES = 4  # keys and values are prefetched this many tiles ahead ...
PREFETCH_ROWS = 16  # ... by tasks of at most this many rows (decode: memory-bound)
MR = 4  # rows per score block over a packed key tile


class AttentionEmitter(AmxScores):
    """The state and the tile kernels of one attention dispatch; the algorithms drive them."""

    def __init__(self, plan: KernelPlan, dispatch: Dispatch, name: str, declare: Callable[[str], None],
                 vector_bits: int, units: frozenset[str] = frozenset()):
        assert isinstance(dispatch.pattern, Attention)
        self.pat = dispatch.pattern
        super().__init__(plan, dispatch, name, declare, vector_bits)
        # the scores over bf16 pairs (attention_amx.py): AMX tiles, else AVX512-BF16 dot products
        self.unit = self.pairs_unit(units, vector_bits)
        self.amx = self.unit == AMX
        self.convert_bf16 = DPBF16 in units and vector_bits == 512  # VCVTNEPS2BF16 for p · v's bf16 p
        self.dq = STEP * ceil_div(self.pat.extent(FEATURE), STEP)
        self.extent = dict(self.pat.extents)
        self.w = max(4, vector_bits // 32)
        self.nv = 4 if self.w >= 16 else 2  # key vectors per tile
        self.bk = self.nv * self.w
        self.block_rows = 4 if self.w >= 16 else 2  # rows per block of the values
        self.mr, self.mrp, self.ne = MR, self.block_rows, 4
        self.single = False  # a task of one row: direct_scores (set per task by attention.task_rows)
        self.vec = Vec(self.w, self.let, declare)
        self.bound: dict[ir.SExpr, str] = {}
        self.lane_index = KEY
        choice = plan.decision("algorithm")
        split = plan.decision("split", self.pat.key_index)
        self.chunks = int(split.value) if split is not None and isinstance(split.value, int) else None
        # `split j = n` alone asks for split_kv: n chunks of the keys, merged in order
        self.algorithm = str(choice.value) if choice is not None else "split_kv" if self.chunks else "auto"
        self.rows = MAT_ROWS if self.algorithm == "materialized" else ROWS
        self.pairs_pv = self.unit is not None and self.pair_values_usable()  # ... and P · V
        self.inner: tuple[str, str] | None = None  # the keys every row of a task sees (attention.row_setup)

    def leaf(self) -> ir.Load:
        return self.pat.score_load

    def _buffers_used(self) -> set[str]:
        p = self.pat
        loads = [x for e in (p.score, p.q, p.k, p.v) for x in ir.walk(e) if isinstance(x, ir.Load)]
        return {p.out, p.v.src} | {x.src for x in loads if x.src != p.scores}


    def row_values(self, rl: str) -> None:
        """Set the row's roles (``i``, its head) for the score expression."""
        self.current[QUERY] = self.get("i64", self.gep(self.at["RI"], rl, "i64"))
        if self.pat.group is not None:
            self.current[self.pat.group] = self.get("i64", self.gep(self.at["RH"], rl, "i64"))

    def feature_row(self, e: ir.SExpr, d0: str, dmask: str) -> str:
        """``e`` (q or k, not a plain load) at features ``d0 ..+W`` of the current row or key: lanes along D."""
        last = self.i64("sub", self.dim(self.pat.extent(FEATURE)), "1")
        at = self.let(f"add {self.vec.ty('i64')} {self.vec.splat(d0, 'i64')}, {self.vec.iota()}")
        saved = self.lane_index
        self.lane_index, self.lane_start, self.lane_mask = FEATURE, d0, dmask
        self.jvec = self.let(f"select {self.vec.ty('i1')} {dmask}, {self.vec.ty('i64')} {at}, "
                             f"{self.vec.ty('i64')} {self.vec.splat(last, 'i64')}")
        value = self.vector(e)
        self.lane_index = saved
        return value

    def tiles(self, lo: str, hi: str, mode: str) -> None:
        """Every key tile of ``[lo, hi)``: pack it, then scores (and for flash the values)."""
        bk = str(self.bk)
        n = self.i64("udiv", self.i64("add", self.imax(self.i64("sub", hi, lo), "0"), str(self.bk - 1)), bk)

        def tile() -> None:
            j0 = self.i64("add", lo, self.i64("mul", self.current["tile"], bk))
            kn = self.imin(bk, self.i64("sub", hi, j0))
            few = self.let(f"icmp ule i64 {self.npad}, {PREFETCH_ROWS}")  # memory-bound: a few rows per tile
            self.branch(few, lambda: self.prefetch(self.i64("add", j0, str(PREFETCH_TILES * self.bk)), hi),
                        lambda: None)
            if self.pat.k_rows:
                self.row_table(j0, kn, self.pat.k, FEATURE, "KR", "float")
            if self.pat.v_rows and mode == "flash":
                self.row_table(j0, kn, self.pat.v, VALUE, "VR", self.vty)
            if self.single:
                sums = self.direct_scores(j0, kn)
            else:
                self.pack(j0, kn)
            if self.amx:
                self.tile_scores()

            def rows(inner: bool) -> None:
                if self.single:
                    self.score_rows(["0"], [sums], j0, kn, mode, inner)
                    return
                self.loop("sb", "0", self.i64("udiv", self.npad, str(self.mr)), lambda: self.scores(
                    self.i64("mul", self.current["sb"], str(self.mr)), j0, kn, mode, inner))

            if self.pat.inner is None or self.inner is None:
                rows(False)
            else:  # a whole tile inside every row's bounds: the score without its masks
                end = self.i64("add", j0, bk)
                inside = self.let(f"icmp eq i64 {kn}, {bk}")
                inside = self.let(f"and i1 {inside}, {self.let(f'icmp sge i64 {j0}, {self.inner[0]}')}")
                inside = self.let(f"and i1 {inside}, {self.let(f'icmp sle i64 {end}, {self.inner[1]}')}")
                self.branch(inside, lambda: rows(True), lambda: rows(False))
            if mode == "flash" and self.pairs_pv:
                self.tile_values(j0, kn) if self.amx else self.dp_values(j0, kn)
            elif mode == "flash":
                self.values(j0, kn, self.at["P"], bk, "0", fresh=False)

        self.loop("tile", "0", n, tile)

    def prefetch(self, j0: str, hi: str) -> None:
        """Ask for a later tile's keys and values now: the work on this tile hides the memory latency."""
        n = self.imin(str(self.bk), self.imax(self.i64("sub", hi, j0), "0"))
        lines = {}
        for name, width in (("k", self.dim(self.pat.extent(FEATURE))), ("v", self.dim(self.pat.extent(VALUE)))):
            lines[name] = self.i64("udiv", self.i64("add", width, "15"), "16")

        def lines_of(row: str, count: str) -> None:
            def line() -> None:
                at = self.gep(row, self.i64("mul", self.current["pl"], "16"))
                call, declaration = prefetch(at)
                self.declare(declaration)
                self.emit(call)

            self.loop("pl", "0", count, line)

        def key(j: str) -> None:
            if self.pat.k_direct:
                lines_of(self.gep(self.kbase, self.i64("mul", j, self.kstride)), lines["k"])
            elif self.pat.k_rows:  # looked up through the table now: the task reads this key later anyway
                lines_of(self.table_row(j, self.pat.k, FEATURE, "float"), lines["k"])
            if not self.pat.v_rows:
                lines_of(self.gep(self.vbase, self.i64("mul", j, self.vstride), self.vty), lines["v"])
            elif self.algorithm != "materialized":  # materialized reads the values in a later pass
                lines_of(self.table_row(j, self.pat.v, VALUE, self.vty), lines["v"])

        tables = [x for x, rows in ((self.pat.k, self.pat.k_rows), (self.pat.v, self.pat.v_rows)) if rows]
        self.walk_keys("pf", n, j0, self.i64("sub", n, "1"), tables, key)

    def key_rows(self, j0: str, kn: str) -> tuple[str | None, str, DType | None]:
        """Where the tile's key rows are: the first row and the stride between rows (None: each row's
        address is in the ``KR`` table), and the 16-bit type of a key widened as it is read."""
        p = self.pat
        half = p.k_half.dtype if p.k_half is not None and not p.k_direct else None
        if p.k_direct:
            return self.gep(self.kbase, self.i64("mul", j0, self.kstride)), self.kstride, half
        if half is not None:
            return self.gep(self.kbase, self.i64("mul", j0, self.kstride), "i16"), self.kstride, half
        if not p.k_rows:
            return self.stage_keys(j0, kn), self.dim(self.dp), half
        return None, "0", half

    def direct_usable(self) -> bool:
        """Whether a task of one row may take :meth:`direct_scores`: f32 scores (no matrix unit) over a
        query row whose features are contiguous."""
        p, q = self.pat, self.pat.q
        if self.unit is not None:
            return False
        return not (p.q_direct and isinstance(q, ir.Load)) or \
            self.stride(self.buffer(q.src).shape, list(q.indices).index(ir.Idx(FEATURE))) == 1

    def direct_scores(self, j0: str, kn: str) -> list[str]:
        """The one row's dot products with the tile's keys, read in place: per key, FMAs along D into
        a vector of partial sums; W keys' partials are then summed by a shuffle tree into one vector
        of W scores (lanes along keys, as :meth:`scores` gives). No packed tile: a row reads each key
        once, so transposing it would cost more than the dot products. Keys past a short tile repeat
        its last key, as in :meth:`pack`."""
        w, vec, f = self.w, self.vec, self.vec.f
        dd = self.dim(self.pat.extent(FEATURE))
        first, stride, half = self.key_rows(j0, kn)
        last = self.i64("sub", kn, "1")
        qrow = self.get("ptr", self.at["QP"])
        sums = []
        for v in range(self.nv):
            rows = []
            for k in range(w):
                key = self.imin(str(v * w + k), last)
                rows.append(self.get("ptr", self.gep(self.at["KR"], key, "ptr")) if first is None
                            else self.gep(first, self.i64("mul", key, stride), "i16" if half else "float"))
            accs = [self.var(f, "zeroinitializer") for _ in range(w)]

            def step(rows: list[str] = rows, accs: list[str] = accs) -> None:
                d0 = self.i64("mul", self.current["dd"], str(w))
                dmask = vec.lanes_below(d0, dd)
                q = vec.masked_load(self.gep(qrow, d0), dmask)
                for row, acc in zip(rows, accs):
                    at = self.gep(row, d0, "i16" if half else "float")
                    kv = vec.masked_load(at, dmask) if half is None else vec.load_as_float(at, half, dmask)
                    self.put(f, vec.fma(q, kv, self.get(f, acc)), acc)

            self.loop("dd", "0", self.dim(self.dp / w), step)
            sums.append(vec.sum_rows([self.get(f, acc) for acc in accs]))
        return sums

    def pack(self, j0: str, kn: str) -> None:
        """``KT[d][k] = key[j0 + k][d]``: W x W blocks loaded (masked past D) and transposed in registers.

        A full tile reads its rows at a fixed stride; in the last, short one the keys past the
        tile repeat its last key (their scores are masked to -inf anyway)."""
        if self.unit is not None:
            self.pack_pairs(j0, kn)
            return
        w, vec, p = self.w, self.vec, self.pat
        dd = self.dim(p.extent(FEATURE))
        last = self.i64("sub", kn, "1")
        first, stride, half = self.key_rows(j0, kn)

        def block(full: bool) -> None:
            d0 = self.i64("mul", self.current["db"], str(w))
            dmask = vec.lanes_below(d0, dd)
            ty = "i16" if half is not None else "float"
            base = None if first is None else self.gep(first, d0, ty)
            for v in range(self.nv):
                rows = []
                for k in range(w):
                    key = str(v * w + k) if full else self.imin(str(v * w + k), last)
                    at = (self.gep(self.get("ptr", self.gep(self.at["KR"], key, "ptr")), d0) if base is None
                          else self.gep(base, self.i64("mul", key, stride), ty))
                    rows.append(vec.masked_load(at, dmask) if half is None else vec.load_as_float(at, half, dmask))
                out = self.gep(self.at["KT"], self.i64("add", self.i64("mul", d0, str(self.bk)), str(v * w)))
                for lane, col in enumerate(vec.transpose(rows)):
                    self.emit(vec.store(col, self.gep(out, str(lane * self.bk))))

        blocks = self.dim(self.dp / w)
        whole = self.let(f"icmp eq i64 {kn}, {self.bk}")
        self.branch(whole, lambda: self.loop("db", "0", blocks, lambda: block(True)),
                    lambda: self.loop("db", "0", blocks, lambda: block(False)))

    def row_table(self, j0: str, kn: str, load: ir.SExpr, feature: str, table: str, ty: str) -> None:
        """The addresses of the tile's rows of ``load`` (k or v read through a block table,
        :mod:`arke.plan.paged`): each key's subscripts computed and checked once, into ``table``;
        the keys past the tile repeat its last one."""
        def key(j: str) -> None:
            self.put("ptr", self.table_row(j, load, feature, ty), self.gep(self.at[table], self.current["kr"], "ptr"))

        self.walk_keys("kr", str(self.bk), j0, self.i64("sub", kn, "1"), [load], key)

    def table_row(self, j: str, load: ir.SExpr, feature: str, ty: str) -> str:
        """The address of key ``j``'s row of ``load`` (read through a block table; its subscripts checked)."""
        assert isinstance(load, ir.Load)
        if self.pat.group is not None:
            self.current[self.pat.group] = self.h0  # any head of the group: they read the same rows
        self.current[KEY] = j
        return self.gep(self.ptr[load.src], self.offset(load, {feature: "0"}), ty)

    def stage_keys(self, j0: str, kn: str) -> str:
        """k as an expression (a fused norm, a rotation, another layout): the tile's key rows computed
        into ``KS[BK][D]`` (lanes along D, keys past the tile repeat its last one), packed from there."""
        p = self.pat
        dd = self.dim(p.extent(FEATURE))
        if p.group is not None:
            self.current[p.group] = self.h0  # any head of the group: they read the same keys

        def key() -> None:
            at = self.current["ks"]
            self.current[KEY] = self.i64("add", j0, self.imin(at, self.i64("sub", kn, "1")))
            row = self.gep(self.at["KS"], self.i64("mul", at, self.dim(self.dp)))

            def block() -> None:
                d0 = self.i64("mul", self.current["kd"], str(self.w))
                self.emit(self.vec.store(self.feature_row(p.k, d0, self.vec.lanes_below(d0, dd)), self.gep(row, d0)))

            self.loop("kd", "0", self.dim(self.dp / self.w), block)

        self.loop("ks", "0", str(self.bk), key)
        return self.at["KS"]

    def scores(self, r0: str, j0: str, kn: str, mode: str, inner: bool = False) -> None:
        """Scores of rows ``r0 ..+MR`` for the tile, the score expression (``inner``: its form inside
        every bound, for a whole tile all rows see), then the softmax step."""
        vec, w, f = self.vec, self.w, self.vec.f
        rls = [self.i64("add", r0, str(r)) for r in range(self.mr)]
        if self.amx:  # the tiles' sums (tile_scores)
            sums = [[vec.load(self.gep(self.at["S"], self.i64("add", self.i64("mul", rl, str(self.bk)), str(v * w))))
                     for v in range(self.nv)] for rl in rls]
            self.score_rows(rls, sums, j0, kn, mode, inner)
            return
        if self.unit is not None:  # AVX512-BF16 dot products over the packed pairs
            self.score_rows(rls, self.dp_scores(rls), j0, kn, mode, inner)
            return
        accs = [[self.var(f, "zeroinitializer") for _ in range(self.nv)] for _ in range(self.mr)]
        qps = [self.get("ptr", self.gep(self.at["QP"], rl, "ptr")) for rl in rls]
        q = self.pat.q
        qd = self.dim(self.stride(self.buffer(q.src).shape, list(q.indices).index(ir.Idx(FEATURE)))) \
            if self.pat.q_direct and isinstance(q, ir.Load) else "1"  # else rows computed into QR

        def step() -> None:
            d = self.current["dk"]
            kt = self.gep(self.at["KT"], self.i64("mul", d, str(self.bk)))
            ks = [vec.load(self.gep(kt, str(v * w))) for v in range(self.nv)]
            for r in range(self.mr):
                q = vec.splat(self.get("float", self.gep(qps[r], self.i64("mul", d, qd))))
                for v in range(self.nv):
                    self.put(f, vec.fma(q, ks[v], self.get(f, accs[r][v])), accs[r][v])

        self.loop("dk", "0", self.dim(self.pat.extent(FEATURE)), step)
        self.score_rows(rls, [[self.get(f, a) for a in row] for row in accs], j0, kn, mode, inner)

    def score_rows(self, rls: list[str], sums: list[list[str]], j0: str, kn: str, mode: str,
                   inner: bool = False) -> None:
        """The score expression on each row's dot products ``sums`` (vectors over the tile's keys),
        masked past the tile, then the softmax step (flash) or the record (materialized). ``inner``: a
        whole tile inside every row's key bounds, so :attr:`Attention.inner` without a mask."""
        vec, w, f = self.vec, self.w, self.vec.f
        last = self.i64("add", j0, self.i64("sub", kn, "1"))
        score = self.pat.inner if inner else self.pat.score
        assert score is not None
        for r in range(self.mr):
            self.row_values(rls[r])
            xs = []
            for v in range(self.nv):
                at = self.let(f"add {vec.ty('i64')} {vec.splat(self.i64('add', j0, str(v * w)), 'i64')}, {vec.iota()}")
                if inner:
                    valid = "splat (i1 true)"
                    self.jvec, self.lane_start = at, self.i64("add", j0, str(v * w))
                else:
                    valid = vec.lanes_below(str(v * w), kn)
                    self.jvec = self.let(f"select {vec.ty('i1')} {valid}, {vec.ty('i64')} {at}, "
                                         f"{vec.ty('i64')} {vec.splat(last, 'i64')}")  # past the tile: a real key
                    self.lane_start = self.imin(self.i64("add", j0, str(v * w)), last)
                self.lane_mask = valid
                self.svec = sums[r][v]
                x = self.vector(score)
                xs.append(x if inner else self.let(f"select {vec.ty('i1')} {valid}, {f} {x}, {f} {vec.const(NEG_INF)}"))
            if mode == "flash":
                self.online(rls[r], xs)
            else:
                self.record(rls[r], xs, j0)

    def online(self, rl: str, xs: list[str]) -> None:
        """The online softmax step of one row: new max, p = exp(x - max) into P, the rescale."""
        vec, f = self.vec, self.vec.f
        top = xs[0]
        for x in xs[1:]:
            top = vec.max(top, x)
        m_at, l_at = self.gep(self.at["M"], rl), self.gep(self.at["L"], rl)
        old = self.get("float", m_at)
        new = self.fmax(old, vec.hmax_fast(top))
        base = self.safe(new)
        alpha = self.fexp(self.let(f"fsub float {old}, {base}"))
        sub = vec.splat(base)
        prow = self.gep(self.at["P"], self.i64("mul", rl, str(self.bk)))
        ps = []
        for v, x in enumerate(xs):
            ps.append(vec.exp(self.let(f"fsub {f} {x}, {sub}")))
            if self.pairs_pv:  # p · v on the unit reads the probabilities in bf16
                self.store_p_bf16(rl, v, ps[-1])
            else:
                self.emit(vec.store(ps[-1], self.gep(prow, str(v * self.w))))
        while len(ps) > 1:  # a fixed pairwise tree
            ps = [self.let(f"fadd {f} {ps[k]}, {ps[k + 1]}") if k + 1 < len(ps) else ps[k]
                  for k in range(0, len(ps), 2)]
        scaled = self.let(f"fmul float {self.get('float', l_at)}, {alpha}")
        self.put("float", self.let(f"fadd float {scaled}, {vec.hsum(ps[0])}"), l_at)
        self.put("float", new, m_at)
        self.put("float", alpha, self.gep(self.at["A"], rl))

    def record(self, rl: str, xs: list[str], j0: str) -> None:
        """Materialized: keep the row's scores and its running max."""
        vec = self.vec
        top = xs[0]
        for x in xs[1:]:
            top = vec.max(top, x)
        m_at = self.gep(self.at["M"], rl)
        self.put("float", self.fmax(self.get("float", m_at), vec.hmax_fast(top)), m_at)
        frow = self.gep(self.at["P"], self.i64("add", self.i64("mul", rl, self.dim(self.tp)), j0))
        for v, x in enumerate(xs):
            self.emit(vec.store(x, self.gep(frow, str(v * self.w))))

    def values(self, j0: str, nk: str, pbase: str, pstride: str, pfirst: str, fresh: bool) -> None:
        """``O[row, e] (* alpha) += sum_k P[row, k] * v[j0 + k, e]`` for every row block and dv block."""
        vec, w, f = self.vec, self.w, self.vec.f
        ev = self.dim(self.pat.extent(VALUE))

        def block(masked: bool) -> None:
            r0 = self.i64("mul", self.current["pb"], str(self.mrp))
            e0 = self.i64("mul", self.current["eb"], str(self.ne * w))
            # only the keys some row of the block can see: the others have weight exactly 0
            first, end = self.i64("add", j0, nk), j0
            for r in range(self.mrp):
                rl = self.i64("add", r0, str(r))
                first = self.imin(first, self.get("i64", self.gep(self.at["KL"], rl, "i64")))
                end = self.imax(end, self.get("i64", self.gep(self.at["KH"], rl, "i64")))
            first = self.i64("sub", self.imax(first, j0), j0)
            end = self.imax(self.i64("sub", self.imin(end, self.i64("add", j0, nk)), j0), first)
            masks = [vec.lanes_below(self.i64("add", e0, str(u * w)), ev) for u in range(self.ne)] if masked else []
            rls = [self.i64("add", r0, str(r)) for r in range(self.mrp)]
            orows = [self.gep(self.at["O"], self.i64("add", self.i64("mul", rl, self.dim(self.epp)), e0))
                     for rl in rls]
            prows = [self.gep(pbase, self.i64("add", self.i64("mul", rl, pstride), pfirst)) for rl in rls]
            accs = []
            for r, rl in enumerate(rls):
                scale = None if fresh else vec.splat(self.get("float", self.gep(self.at["A"], rl)))
                for u in range(self.ne):
                    init = "zeroinitializer" if fresh else self.let(
                        f"fmul {f} {vec.load(self.gep(orows[r], str(u * w)))}, {scale}")
                    accs.append(self.var(f, init))

            def key() -> None:
                k = self.current["kk"]
                vrow = self.value_row(j0, k, e0)
                vs = [vec.load_as_float(self.gep(vrow, str(u * w), self.vty), self.pat.v_dtype,
                                        masks[u] if masked else None) for u in range(self.ne)]
                for r in range(self.mrp):
                    pv = vec.splat(self.get("float", self.gep(prows[r], k)))
                    for u in range(self.ne):
                        acc = accs[r * self.ne + u]
                        self.put(f, vec.fma(pv, vs[u], self.get(f, acc)), acc)

            self.loop("kk", first, end, key)
            for r in range(self.mrp):
                for u in range(self.ne):
                    self.emit(vec.store(self.get(f, accs[r * self.ne + u]), self.gep(orows[r], str(u * w))))

        def either() -> None:
            end = self.i64("mul", self.i64("add", self.current["eb"], "1"), str(self.ne * w))
            full = self.let(f"icmp sle i64 {end}, {ev}")  # a whole block of dv: plain loads
            self.branch(full, lambda: block(False), lambda: block(True))

        blocks = self.dim(self.epp / (self.ne * w))
        self.loop("pb", "0", self.i64("udiv", self.npad, str(self.mrp)),
                  lambda: self.loop("eb", "0", blocks, either))

    def finish(self, o: str, l_: str) -> None:
        """``result[row, e] = O[row, e] / L[row]`` for the task's valid rows (masked past dv)."""
        vec, w, f = self.vec, self.w, self.vec.f
        ev = self.dim(self.pat.extent(VALUE))

        def row() -> None:
            rl = self.current["fr"]
            valid = self.let(f"trunc i64 {self.get('i64', self.gep(self.at['VA'], rl, 'i64'))} to i1")
            total = self.get("float", self.gep(self.at[l_], rl))
            if self.pat.recip:
                total = self.let(f"fdiv float 1.0, {total}")
            lv = vec.splat(total)
            orow = self.gep(self.at[o], self.i64("mul", rl, self.dim(self.epp)))
            dst = self.get("ptr", self.gep(self.at["OP"], rl, "ptr"))

            def lanes() -> None:
                e0 = self.i64("mul", self.current["fe"], str(w))
                mask = self.let(f"select i1 {valid}, {vec.ty('i1')} {vec.lanes_below(e0, ev)}, "
                                f"{vec.ty('i1')} zeroinitializer")
                x = vec.load(self.gep(orow, e0))
                y = self.let(f"{'fmul' if self.pat.recip else 'fdiv'} {f} {x}, {lv}")
                self.emit(vec.masked_store_as(y, self.gep(dst, e0, STORAGE[self.pat.out_dtype]), mask,
                                              self.pat.out_dtype))

            self.loop("fe", "0", self.dim(ceil_div(self.pat.extent(VALUE), w)), lanes)

        self.loop("fr", "0", self.nrows, row)

