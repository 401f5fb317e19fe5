"""The LLVM target's attention dispatch: tiled, vectorised, one pass over keys per task.

A *task* is up to ``ROWS`` query rows that read the same keys and values: for GQA the
``R`` heads of one KV head (rows ``(i, r)`` of the group, ``i``-major), so every key tile
is read from memory and packed once for all of them. The workers split the tasks
(flattened ``outer batch x group x row block``, row blocks in zig-zag order so any
contiguous chunk mixes short and long causal rows) into static chunks; a row's result
never depends on which task or worker computed it, so any thread count gives the same bits.

Per key tile of ``BK`` keys:

* **pack**: ``BK x D`` keys are loaded ``W x W`` at a time (masked at ragged edges) and
  transposed in registers into ``KT[D][BK]`` in the worker's scratch, so lanes run along keys
  (a ``k`` that is an expression is first computed row by row into scratch; so are the
  task's ``q`` rows);
* **scores**: a register block of ``MR`` rows x ``BK`` keys accumulates ``q[row, d]``
  (broadcast) times ``KT[d]`` with vector FMAs; the score expression ``f`` (scale, masks,
  anything elementwise) is applied on those registers, then the online softmax: the row's
  running max, ``p = exp(f - max)`` (stored to the tile ``P``), the exact rescale ``alpha``
  of the running sum and output;
* **values**: a block of ``MRP`` rows x ``NE`` vectors of ``dv`` keeps ``o`` in registers
  while it accumulates ``P[row, j]`` (broadcast) times the row ``v[j]`` (lanes along dv).

A task of one row (multi-head decode: a KV head serves one query row) skips the pack: each
key row is read in place and dotted with the query along D, and a shuffle tree sums W keys'
partials into one vector of scores (``direct_scores``); its values run in blocks of one row.

Algorithms (the strategy's ``algorithm``; by default split_kv when the group has at most
``DECODE_ROWS`` rows, i.e. decode, else flash, chosen per call from the dims):
``flash`` runs the above over the task's key range, skipping tiles the mask excludes for
every row (a recognised ``j <= i + c``); ``split_kv`` cuts the keys into fixed chunks of
``SPLIT_TILES`` tiles (or the strategy's ``split j = n``: n chunks), each with its own (max,
sum, output), merged in chunk order (the chunks of a task run one after another on its
worker: the runtime has one launch per dispatch and no workspace shared by the workers);
``materialized`` keeps the reference order: a whole row of scores in scratch, its max, the
exponentials and their sum, then the values.

A fully masked row gives NaN (``exp(-inf - -inf)``), as the reference does; so does a row
with a NaN score. One deliberate difference: keys in a skipped tile are never read, so a
NaN or infinite *value* stored at a key the mask hides from every row of the task does not
turn the result into NaN (the reference multiplies it by a zero weight: ``0 * inf``).
"""

from __future__ import annotations

from collections.abc import Callable

import sympy

from arke.ir import semantic as ir
from arke.ir.shapes import Dim, ceil_div, dim_str
from arke.plan.attention import F32, FEATURE, KEY, QUERY, VALUE
from arke.plan.dispatch import Dispatch, KernelPlan
from arke.targets.artifact import LaunchSpec
from arke.targets.llvm.attention_tiles import MR, AttentionEmitter
from arke.targets.llvm.scalar import STORAGE
from arke.targets.llvm.vec import NEG_INF

DECODE_ROWS = 16  # a group of at most this many rows (R * S) runs split_kv by default
SPLIT_TILES = 8  # key tiles per split_kv chunk


def render_attention(plan: KernelPlan, dispatch: Dispatch, entry: str, declare: Callable[[str], None],
                     vector_bits: int, units: frozenset[str] = frozenset()) -> tuple[str, LaunchSpec, str | None]:
    """The LLVM function of an attention dispatch, how to launch it, and the matrix unit it runs on
    (bf16 q and k take their scores on AMX tiles where ``units`` has AMX, else on AVX512-BF16 dot
    products where it has that: attention_amx.py)."""
    fn = _Attention(plan, dispatch, entry, declare, vector_bits, units)
    text = fn.render()
    assert fn.parallel_extent is not None and fn.scratch is not None
    launch = LaunchSpec(entry, dim_str(fn.parallel_extent), tuple(plan.buffer_index(b) for b in fn.args),
                        dim_str(fn.scratch))
    return text, launch, fn.unit


class _Attention(AttentionEmitter):
    """Emits one attention dispatch: its tasks, each task's rows, and the algorithm over the keys."""

    def setup(self) -> None:
        p, w = self.pat, self.w
        self.R: Dim = p.group_size if p.group is not None and p.group_size is not None else sympy.Integer(1)
        self.outer = [r for r in p.batch if r != p.group]
        self.n_groups: Dim = ceil_div(p.extent(p.group), self.R) if p.group is not None else sympy.Integer(1)
        self.n_rb = ceil_div(self.R * p.extent(QUERY), self.rows)
        total: Dim = self.n_groups * self.n_rb
        for r in self.outer:
            total = total * p.extent(r)
        self.parallel_extent = total
        self.dp = w * ceil_div(p.extent(FEATURE), w)
        self.epp = self.ne * w * ceil_div(p.extent(VALUE), self.ne * w)
        self.tp = self.bk * ceil_div(p.extent(KEY), self.bk)
        rows = self.rows
        p_size = rows * (self.tp if self.algorithm == "materialized" else self.bk)
        split = self.algorithm != "materialized"
        sizes: list[tuple[str, Dim]] = [("KT", self.dp * self.bk), ("P", p_size), ("O", rows * self.epp),
                                        ("OM", rows * self.epp if split else sympy.Integer(0)),
                                        ("ST", sympy.Integer(8 * rows)), ("TAB", sympy.Integer(14 * rows)),
                                        ("QR", sympy.Integer(0) if p.q_direct else rows * self.dp),
                                        ("KS", sympy.Integer(0) if p.k_direct or p.k_rows or p.k_half
                                               else self.bk * self.dp),
                                        # row pointers of a tile's keys / values read through a table
                                        ("KR", sympy.Integer(2 * self.bk if p.k_rows else 0)),
                                        ("VR", sympy.Integer(2 * self.bk if p.v_rows else 0)),
                                        # AMX scores: the tile's sums, the task's q rows in bf16
                                        ("S", sympy.Integer(rows * self.bk if self.amx else 0)),
                                        ("QB", rows * self.dq / 2 if self.unit else sympy.Integer(0)),
                                        # p · v on the unit: the probabilities in bf16, the value tile as key pairs
                                        ("PB", sympy.Integer(rows * self.bk // 2 if self.pairs_pv else 0)),
                                        ("VT", self.bk * self.epp / 2 if self.pairs_pv else sympy.Integer(0)),
                                        # ... and AMX's P · V of the tile before it is added to the rescaled O
                                        ("OT", rows * self.epp if self.pairs_pv and self.amx
                                         else sympy.Integer(0))]
        self.at: dict[str, str] = {}
        offset: Dim = sympy.Integer(0)
        for name, size in sizes:
            self.at[name] = self._pro(f"getelementptr inbounds float, ptr %scratch, i64 {self.dim(offset)}")
            offset = offset + size
        self.scratch = offset / 2  # every size is a multiple of 16 floats: whole 64-byte lines
        st, tab = self.at["ST"], self.at["TAB"]
        for k, name in enumerate(("M", "L", "A", "MM", "LM")):
            self.at[name] = self._pro(f"getelementptr inbounds float, ptr {st}, i64 {k * rows}")
        for k, name in enumerate(("QP", "OP", "RI", "RH", "VA", "KL", "KH")):
            self.at[name] = self._pro(f"getelementptr inbounds i64, ptr {tab}, i64 {k * rows}")

    # -- the function
    def render(self) -> str:
        self.start_error_flag()
        self.setup()
        if self.amx:
            self.tile_setup()
        self.loop("task", "%lo", "%hi", self.task)
        if self.amx:
            self.tile_release()
        return self.text()

    def task(self) -> None:
        p = self.pat
        t = self.current["task"]
        nrb = self.dim(self.n_rb)
        pos, rest = self.i64("urem", t, nrb), self.i64("udiv", t, nrb)
        g = "0"
        if p.group is not None:
            ng = self.dim(self.n_groups)
            g, rest = self.i64("urem", rest, ng), self.i64("udiv", rest, ng)
        for role in reversed(self.outer[1:]):
            n = self.dim(p.extent(role))
            self.current[role], rest = self.i64("urem", rest, n), self.i64("udiv", rest, n)
        if self.outer:
            self.current[self.outer[0]] = rest
        half, odd = self.i64("lshr", pos, "1"), self.let(f"trunc i64 {pos} to i1")
        back = self.i64("sub", self.i64("sub", nrb, "1"), half)
        rb = self.let(f"select i1 {odd}, i64 {back}, i64 {half}")  # zig-zag: 0, n-1, 1, n-2 ...
        self.rho0 = self.i64("mul", rb, str(self.rows))
        self.nrows = self.imin(str(self.rows), self.i64("sub", self.dim(self.R * p.extent(QUERY)), self.rho0))
        if self.direct_usable():  # one row (MHA decode): its scores straight from the key rows
            one = self.let(f"icmp eq i64 {self.nrows}, 1")
            self.branch(one, lambda: self.task_rows(g, True), lambda: self.task_rows(g, False))
        else:
            self.task_rows(g, False)

    def task_rows(self, g: str, single: bool) -> None:
        """The task's rows over its keys: one row by :meth:`direct_scores` (``single``), else in blocks of
        ``MR`` rows over packed key tiles."""
        p = self.pat
        self.single = single
        self.mr, self.mrp = (1, 1) if single else (MR, self.block_rows)
        mr = str(self.mr)
        self.npad = self.i64("mul", self.i64("udiv", self.i64("add", self.nrows, str(self.mr - 1)), mr), mr)
        r = self.dim(self.R)
        self.h0 = self.i64("mul", g, r) if p.group is not None else "0"
        if p.group is not None:
            self.current[p.group] = self.h0  # every head of the group reads the same k/v
        if p.k_direct and isinstance(p.k, ir.Load):
            self.kbase = self.gep(self.ptr[p.k.src], self.offset(p.k, {KEY: "0", FEATURE: "0"}))
            self.kstride = self.dim(self.stride(self.buffer(p.k.src).shape, list(p.k.indices).index(ir.Idx(KEY))))
        elif p.k_half is not None:  # a widened bf16/f16 k: packed straight from its rows, widened as loaded
            kh = p.k_half
            self.kbase = self.gep(self.ptr[kh.src], self.offset(kh, {KEY: "0", FEATURE: "0"}), "i16")
            self.kstride = self.dim(self.stride(self.buffer(kh.src).shape, list(kh.indices).index(ir.Idx(KEY))))
        self.vty = STORAGE[p.v_dtype]  # float, or i16 bits of a bf16/f16 v (widened as each row is read)
        if not p.v_rows:  # else each value row's address is looked up (attention_tiles.row_table)
            self.vbase = self.gep(self.ptr[p.v.src], self.offset(p.v, {KEY: "0", VALUE: "0"}), self.vty)
            self.vstride = self.dim(self.stride(self.buffer(p.v.src).shape, list(p.v.indices).index(ir.Idx(KEY))))
        self.row_setup(r)
        if self.unit is not None:
            self.q_rows_bf16()
        if self.algorithm == "materialized":
            self.materialized()
        else:
            self.over_keys()

    def row_setup(self, r: str) -> None:
        """Each row's query/result pointers, ``i``, head and validity; the task's key range."""
        p = self.pat
        bounds = p.bounds if self.algorithm != "materialized" else ()
        lo = self.var("i64", "9223372036854775807" if any(not b.upper for b in bounds) else "0")
        hi = self.var("i64", "-9223372036854775808" if any(b.upper for b in bounds) else self.dim(p.extent(KEY)))
        # the keys every row of the task sees: a whole tile inside needs no mask test (tiles())
        inner_lo, inner_hi = self.var("i64", "0"), self.var("i64", self.dim(p.extent(KEY)))

        def row() -> None:
            rl = self.current["row"]
            rho = self.i64("add", self.rho0, self.imin(rl, self.i64("sub", self.nrows, "1")))
            valid = self.let(f"icmp slt i64 {rl}, {self.nrows}")
            i, rr = self.i64("udiv", rho, r), self.i64("urem", rho, r)
            self.current[QUERY] = i
            if p.group is not None:
                h = self.i64("add", self.h0, rr)
                inside = self.let(f"icmp slt i64 {h}, {self.dim(p.extent(p.group))}")
                valid = self.let(f"and i1 {valid}, {inside}")
                self.current[p.group] = self.let(f"select i1 {inside}, i64 {h}, i64 {self.h0}")
            qrow = self.query_row(rl, i)
            out = ir.Load(p.out, tuple(ir.Idx(x) for x in p.out_axes), F32)
            orow = self.gep(self.ptr[p.out], self.offset(out, {QUERY: i, VALUE: "0"}), STORAGE[p.out_dtype])
            self.put("ptr", qrow, self.gep(self.at["QP"], rl, "ptr"))
            self.put("ptr", orow, self.gep(self.at["OP"], rl, "ptr"))
            self.put("i64", i, self.gep(self.at["RI"], rl, "i64"))
            self.put("i64", self.current.get(p.group or "", "0"), self.gep(self.at["RH"], rl, "i64"))
            self.put("i64", self.let(f"zext i1 {valid} to i64"), self.gep(self.at["VA"], rl, "i64"))
            row_lo, row_hi = "0", self.dim(p.extent(KEY))
            for b in bounds:
                limit = self.expr(b.limit)
                if b.upper:
                    row_hi = self.imin(row_hi, limit)
                else:
                    row_lo = self.imax(row_lo, limit)
            self.put("i64", row_lo, self.gep(self.at["KL"], rl, "i64"))  # the keys this row can see
            self.put("i64", row_hi, self.gep(self.at["KH"], rl, "i64"))
            if any(b.upper for b in bounds):
                self.put("i64", self.imax(self.get("i64", hi), row_hi), hi)
                self.put("i64", self.imin(self.get("i64", inner_hi), row_hi), inner_hi)
            if any(not b.upper for b in bounds):
                self.put("i64", self.imin(self.get("i64", lo), row_lo), lo)
                self.put("i64", self.imax(self.get("i64", inner_lo), row_lo), inner_lo)

        self.loop("row", "0", self.npad, row)
        t = self.dim(p.extent(KEY))
        top = self.imin(self.imax(self.get("i64", hi), "0"), t)
        self.klo, self.khi = self.imin(self.imax(self.get("i64", lo), "0"), top), top
        self.inner = (self.get("i64", inner_lo), self.get("i64", inner_hi)) if bounds else None

    def query_row(self, rl: str, i: str) -> str:
        """Where the scores read row ``rl``'s query: in place, or computed here into ``QR`` (lanes along D)."""
        p = self.pat
        if p.q_direct and isinstance(p.q, ir.Load):
            return self.gep(self.ptr[p.q.src], self.offset(p.q, {QUERY: i, FEATURE: "0"}))
        row = self.gep(self.at["QR"], self.i64("mul", rl, self.dim(self.dp)))

        def block() -> None:
            d0 = self.i64("mul", self.current["qb"], str(self.w))
            value = self.feature_row(p.q, d0, self.vec.lanes_below(d0, self.dim(p.extent(FEATURE))))
            self.emit(self.vec.store(value, self.gep(row, d0)))

        self.loop("qb", "0", self.dim(self.dp / self.w), block)
        return row

    # -- the algorithms
    def reset(self) -> None:
        """Running max -inf, sum 0, output 0 for every row of the task."""
        def row() -> None:
            rl = self.current["rs"]
            self.put("float", NEG_INF, self.gep(self.at["M"], rl))
            self.put("float", "0.0", self.gep(self.at["L"], rl))
            self.zero_row("O", rl)

        self.loop("rs", "0", self.npad, row)

    def zero_row(self, array: str, rl: str) -> None:
        orow = self.gep(self.at[array], self.i64("mul", rl, self.dim(self.epp)))

        def lanes() -> None:
            at = self.i64("mul", self.current["zr"], str(self.w))
            self.emit(self.vec.store("zeroinitializer", self.gep(orow, at)))

        self.loop("zr", "0", self.dim(self.epp / self.w), lanes)

    def over_keys(self) -> None:
        """Flash and split_kv: the task's keys in chunks, each run by the online softmax from a fresh
        state and merged into the row's running (max, sum, output) in chunk order. Flash is one
        chunk (its merge is exact: the weights are exp(-inf) = 0 and exp(0) = 1)."""
        whole = str(1 << 40)
        chunk = str(SPLIT_TILES * self.bk)
        if self.chunks:  # n chunks of whole tiles: ceil(ceil(T / n) / BK) * BK keys each
            chunk = self.dim(ceil_div(ceil_div(self.pat.extent(KEY), self.chunks), self.bk) * self.bk)
        if self.algorithm == "flash":
            chunk = whole
        elif self.algorithm == "auto":  # split_kv for a few rows (decode), else flash
            small = self.let(f"icmp sle i64 {self.dim(self.R * self.pat.extent(QUERY))}, {DECODE_ROWS}")
            chunk = self.let(f"select i1 {small}, i64 {chunk}, i64 {whole}")
        rows = self.npad

        def start() -> None:
            rl = self.current["ms"]
            self.put("float", NEG_INF, self.gep(self.at["MM"], rl))
            self.put("float", "0.0", self.gep(self.at["LM"], rl))
            self.zero_row("OM", rl)

        self.loop("ms", "0", rows, start)
        first = self.i64("udiv", self.klo, chunk)
        last = self.i64("udiv", self.i64("add", self.khi, self.i64("sub", chunk, "1")), chunk)

        def one_chunk() -> None:
            c = self.current["chunk"]
            lo = self.imax(self.klo, self.i64("mul", c, chunk))
            hi = self.imin(self.khi, self.i64("mul", self.i64("add", c, "1"), chunk))
            self.reset()
            self.tiles(lo, hi, "flash")
            self.loop("mg", "0", rows, self.merge)

        self.loop("chunk", first, last, one_chunk)
        self.finish("OM", "LM")

    def merge(self) -> None:
        """Fold one chunk's (max, sum, output) of a row into the running ones, exactly rescaled."""
        rl = self.current["mg"]
        mc, lc = self.get("float", self.gep(self.at["M"], rl)), self.get("float", self.gep(self.at["L"], rl))
        mm, lm = self.get("float", self.gep(self.at["MM"], rl)), self.get("float", self.gep(self.at["LM"], rl))
        mn = self.let(f"call float @llvm.maximum.f32(float {mm}, float {mc})")
        self.declare("declare float @llvm.maximum.f32(float, float)")
        ms = self.safe(mn)
        a, b = self.fexp(self.let(f"fsub float {mm}, {ms}")), self.fexp(self.let(f"fsub float {mc}, {ms}"))
        la, lb = self.let(f"fmul float {lm}, {a}"), self.let(f"fmul float {lc}, {b}")
        self.put("float", self.let(f"fadd float {la}, {lb}"), self.gep(self.at["LM"], rl))
        self.put("float", mn, self.gep(self.at["MM"], rl))
        va, vb = self.vec.splat(a), self.vec.splat(b)
        off = self.i64("mul", rl, self.dim(self.epp))
        orow, mrow = self.gep(self.at["O"], off), self.gep(self.at["OM"], off)

        def lane_block() -> None:
            at = self.i64("mul", self.current["mge"], str(self.w))
            o, m = self.vec.load(self.gep(orow, at)), self.gep(mrow, at)
            x = self.let(f"fmul {self.vec.f} {self.vec.load(m)}, {va}")
            y = self.let(f"fmul {self.vec.f} {o}, {vb}")
            self.emit(self.vec.store(self.let(f"fadd {self.vec.f} {x}, {y}"), m))

        self.loop("mge", "0", self.dim(self.epp / self.w), lane_block)

    def materialized(self) -> None:
        """The reference order: every score of the row, its max, exp and sum, then the values."""
        def row() -> None:
            self.put("float", NEG_INF, self.gep(self.at["M"], self.current["mi"]))

        self.loop("mi", "0", self.npad, row)
        t = self.dim(self.pat.extent(KEY))
        self.tiles("0", t, "scores")
        tp = self.dim(self.tp)

        def exps() -> None:
            rl = self.current["me"]
            m = self.vec.splat(self.get("float", self.gep(self.at["M"], rl)))
            frow = self.gep(self.at["P"], self.i64("mul", rl, tp))
            acc = self.var(self.vec.f, "zeroinitializer")

            def lanes() -> None:
                at = self.i64("mul", self.current["mj"], str(self.w))
                x = self.vec.load(self.gep(frow, at))
                e = self.vec.exp(self.let(f"fsub {self.vec.f} {x}, {m}"))
                e = self.let(f"select {self.vec.ty('i1')} {self.vec.lanes_below(at, t)}, {self.vec.f} {e}, "
                             f"{self.vec.f} zeroinitializer")  # past the last key (NaN if the row is all -inf)
                self.emit(self.vec.store(e, self.gep(frow, at)))
                self.put(self.vec.f, self.let(f"fadd {self.vec.f} {self.get(self.vec.f, acc)}, {e}"), acc)

            self.loop("mj", "0", self.dim(self.tp / self.w), lanes)
            self.put("float", self.vec.hsum(self.get(self.vec.f, acc)), self.gep(self.at["L"], rl))

        self.loop("me", "0", self.npad, exps)
        self.values("0", t, self.at["P"], tp, "0", fresh=True)
        self.finish("O", "L")
