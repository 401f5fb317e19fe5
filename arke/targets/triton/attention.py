"""The Triton target's attention dispatch: flash forward with an online softmax, and split-KV decode.

One program owns ``BLOCK_M`` query *rows* of one group of heads that read the same keys and
values: rows ``rho = i * R + r`` of the ``R`` query heads of one KV head (GQA's heads, found by
:func:`~arke.plan.attention.match_attention`; ``R = 1`` without a group), so a decode step
(``S = 1``) still fills a ``tl.dot`` block with the heads of a group. The KV head is never
copied: ``k`` and ``v`` are read through their own subscripts (``k[b, h / R, j, d]``) with the
group's first head, every other role from the program's position.

Per key block of ``BLOCK_N`` keys the program computes the scores ``q kᵀ`` (``tl.dot`` in
IEEE f32, the feature axis in ``BLOCK_D`` chunks; with 16-bit ``q``, ``k`` and ``v``, on the
stored blocks — tensor cores, exact products, f32 sums — with ``BLOCK_D``/``BLOCK_E`` sized at
each launch to cover the head dim, so the query rows stay in registers), the score expression ``f`` (scale, masks,
softcaps, bias tensors ... through :class:`~arke.targets.triton.expr.Emitter`), then the online
softmax: running max ``m``, ``p = exp(f - m)``, the exact rescale ``alpha`` of the running sum
and output, ``o += p v`` (the value axis in ``BLOCK_E`` chunks, each a pass of its own over the
keys). A recognised key bound (``j <= i + T - S``) limits the key range of the program to the
keys some row can see: blocks past it are never read.

Algorithms (the strategy's ``algorithm``):

* ``flash``: one pass over the keys, the result stored as ``o / l``;
* ``split_kv``: the keys cut into ``C`` chunks of whole blocks (``split j = n``: n chunks, else
  :data:`SPLIT_BLOCKS` blocks each), one program per (rows, chunk) writing its (max, sum,
  output) to the workspace; the last program of the rows to finish (an atomic counter per row
  block, in the workspace the runtime zeroes for each launch) merges the chunks *in chunk
  order*, so the result does not depend on which program finished last;
* default: both kernels are rendered and launched, each over a grid that is empty unless the
  dims choose it: ``split_kv`` (``BLOCK_M`` = :data:`DECODE_ROWS`) when a group has at most
  :data:`DECODE_ROWS` rows (``R * S``: decode), else ``flash``;
* ``materialized`` keeps no row of scores in memory on this target: it runs as ``flash``
  (the same result up to rounding; the choice only matters on the CPU).

Workspace (``ws``, 8-byte words): word 0 is the error word of checked subscripts, words
16.. the counters (one per row block), then the f32 partials, one slot per (row block,
chunk): ``BLOCK_M`` maxima, ``BLOCK_M`` sums, ``BLOCK_M × E`` outputs.
A fully masked row gives NaN (``0 / 0``), as the reference does.

Strategy: ``tile`` on the query, key, feature and value indices sets ``BLOCK_M``, ``BLOCK_N``,
``BLOCK_D`` and ``BLOCK_E`` (powers of two, at least 16 for ``tl.dot``; a feature or value axis
wider than its block is walked in chunks, the value chunks each a pass over the keys), ``split
j = n`` the chunks of split_kv, ``warps``/``stages`` the launch options (4 and 2 by default; 8
and 3 for 16-bit inputs, whose blocks are :data:`HALF_BLOCKS`). With 16-bit inputs ``p`` is
rounded to ``v``'s type for ``p·v`` on the GPU, as flash attention does (spec/codegen.md §7).
"""

from __future__ import annotations

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, ceil_div, dim_str, floordiv
from arke.plan.attention import FEATURE, KEY, QUERY, VALUE, Attention
from arke.plan.dispatch import Dispatch, KernelPlan
from arke.plan.exprs import attention_modes, decided, product
from arke.targets.artifact import LaunchSpec, UnsupportedError
from arke.targets.space import rounded_up
from arke.targets.triton.blocks import capped
from arke.targets.triton.expr import STORAGE, Source
from arke.targets.triton.gemm import (
    WIDE_DOT,
    WIDE_DOT_LINE,
    Direct,
    ValueEmitter,
    fixed_options,
    function_text,
    launch_options,
    split_flat,
)

#: Default blocks: query rows, keys, feature chunk, value chunk (all in IEEE f32: the largest
#: that compile for sm_90 and sm_80 with at most a few spilled registers).
BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_E = 32, 32, 64, 64
#: Default blocks, warps and stages when q, k and v are 16-bit (tensor cores): one pass over the
#: keys for head dims up to 128 (the feature and value blocks cover them; wider ones are chunked).
HALF_BLOCKS, HALF_WARPS, HALF_STAGES = (128, 64, 128, 128), 8, 3
#: Keys per block when k or v rows come through a block table (with 8 warps: no spills on sm_80/sm_90).
PAGED_KEYS = 16
#: A group of at most this many rows (R * S) runs split_kv by default.
DECODE_ROWS = 16
#: Key blocks per split_kv chunk (without a `split j = n`).
SPLIT_BLOCKS = 8
#: Workspace words before the counters (word 0: the error word).
HEADER_WORDS = 16
MIN_DOT = 16
NEG_INF = 'float("-inf")'


def render_attention(plan: KernelPlan, dispatch: Dispatch, entry: str,
                     source: type[Source] = Source) -> tuple[str, list[LaunchSpec]]:
    """The ``@triton.jit`` functions of one attention dispatch and how to launch them: one kernel for
    ``flash`` or ``split_kv``; by default both, each launched over a grid that is empty unless
    the dims choose it (split_kv when a group has at most :data:`DECODE_ROWS` rows), so each is
    compiled for its own case (a kernel holding both would need the registers of both)."""
    if not isinstance(dispatch.pattern, Attention):
        raise UnsupportedError(f"{entry}: an attention dispatch needs its Attention pattern")
    modes = attention_modes(plan, dispatch.pattern.key_index)
    parts = [_Flash(plan, dispatch, entry + ("s" if mode == "split_kv" and len(modes) > 1 else ""), source(plan),
                    mode, auto=len(modes) > 1).render() for mode in modes]
    return "\n\n".join(text for text, _ in parts), [launch for _, launch in parts]


class _Flash:
    """Emits one attention dispatch (see the module doc)."""

    def __init__(self, plan: KernelPlan, d: Dispatch, entry: str, src: Source, mode: str, auto: bool):
        assert isinstance(d.pattern, Attention)
        self.plan, self.d, self.entry, self.src = plan, d, entry, src
        p = self.p = d.pattern
        names = {role: a.name for a, role in zip(d.op.axes, p.out_axes)}
        first = d.members[0]
        d_name = first.reduce_axes[0].name if not isinstance(first, ir.MapOp) else None

        tiled: list[str] = []

        def block(option: str, name: str | None, default: int) -> int:
            """A block: the strategy's tile of ``name``, else the fit step's choice, else ``default``."""
            tile = capped(decided(plan, "tile", name)) if name is not None else None
            if tile is not None:
                tiled.append(option)
            return rounded_up(tile or plan.fitted_option(entry, option) or default, MIN_DOT)

        # 16-bit q, k (read as stored) and v: tl.dot on tensor cores with f32 sums; p is rounded to
        # v's type for p·v, as flash attention does (spec/codegen.md §7). Else IEEE f32 throughout.
        dt = {x.dtype for x in (p.q_half, p.k_half) if x is not None}
        self.half: DType | None = dt.pop() if p.q_half is not None and p.k_half is not None and len(dt) == 1 \
            and p.v_dtype == p.q_half.dtype else None
        bm0, bn0, bd0, be0 = HALF_BLOCKS if self.half else (BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_E)
        if mode == "split_kv" and auto:
            bm0 = DECODE_ROWS  # the rows of a decode group fill one block
        if p.k_rows or p.v_rows:  # each lane of a k/v block holds its own i64 row address: fewer keys
            bn0 = min(bn0, PAGED_KEYS)
        bd0, be0 = (self.fit(p.extent(FEATURE), bd0), self.fit(p.extent(VALUE), be0))
        self.blocks = {"BLOCK_M": block("BLOCK_M", names.get(QUERY), bm0),
                       "BLOCK_N": block("BLOCK_N", p.key_index, bn0), "BLOCK_D": block("BLOCK_D", d_name, bd0),
                       "BLOCK_E": block("BLOCK_E", names.get(VALUE), be0)}
        # Whether one block spans the feature (value) axis: a known extent that fits, or, for 16-bit
        # inputs without a tile decision, a block sized at each launch to cover it (no chunk loop:
        # the rows of q stay in registers across the keys, one pass over the keys per row block).
        self.covers: list[tuple[str, str]] = []
        self.whole: dict[str, bool] = {}
        for role, blk, name in ((FEATURE, "BLOCK_D", d_name), (VALUE, "BLOCK_E", names.get(VALUE))):
            known = sympy.sympify(p.extent(role))
            fits = bool(known.is_Integer and int(known) <= self.blocks[blk])
            if not fits and self.half and (name is None or decided(plan, "tile", name) is None):
                self.covers.append((blk, dim_str(p.extent(role))))
                fits = True
            self.whole[role] = fits
        self.fixed = fixed_options(plan, [*tiled, *(blk for blk, _ in self.covers)])  # covers: set at launch
        self.chunks = decided(plan, "split", p.key_index)
        self.algorithm = mode
        self.R: Dim = p.group_size if p.group is not None and p.group_size is not None else sympy.Integer(1)
        self.outer = [r for r in p.batch if r != p.group]
        self.n_groups: Dim = ceil_div(p.extent(p.group), self.R) if p.group is not None else sympy.Integer(1)
        self.rs: Dim = self.R * p.extent(QUERY)
        bm, bn = self.blocks["BLOCK_M"], self.blocks["BLOCK_N"]
        self.n_rb = ceil_div(self.rs, bm)
        self.tasks: Dim = product([p.extent(r) for r in self.outer]) * self.n_groups * self.n_rb
        t = p.extent(KEY)
        self.chunk_keys: Dim = (ceil_div(ceil_div(t, self.chunks), bn) * bn if self.chunks
                                else sympy.Integer(SPLIT_BLOCKS * bn))
        c_split = ceil_div(t, self.chunk_keys)
        # 1 when R * S <= DECODE_ROWS, else 0 (as dim arithmetic, defined for R * S = 0 too)
        small = floordiv(floordiv(DECODE_ROWS + 1, self.rs + 1) + DECODE_ROWS, DECODE_ROWS + 1)
        # the grid is empty unless the dims choose this kernel
        self.gate: Dim = (small if mode == "split_kv" else 1 - small) if auto else sympy.Integer(1)
        self.C: Dim = c_split if mode == "split_kv" else sympy.Integer(1)
        self.ep: Dim = p.extent(VALUE)  # a partial output row in the workspace (stored masked to E)
        self.slot_size: Dim = 2 * bm + bm * self.ep
        self.extent = dict(p.extents)
        # k/v rows through a table: each lane of a block holds its own i64 address, so the default
        # blocks take 8 warps and PAGED_KEYS keys (4 warps of 32 keys spill on sm_90)
        self.rows = p.k_rows or p.v_rows

    @staticmethod
    def fit(extent: Dim, default: int) -> int:
        """A known extent's block (a power of two covering it, up to 256), else ``default``."""
        value = sympy.sympify(extent)
        return rounded_up(int(value), MIN_DOT) if value.is_Integer and 0 < int(value) <= 256 else default

    # -- the function
    def render(self) -> tuple[str, LaunchSpec]:
        src, p = self.src, self.p
        split = self.algorithm != "flash"
        if split:
            src.needs_err()
        pid, c, task = src.fresh(), src.fresh(), src.fresh()
        C = src.dim(self.C)
        src.line(f"{pid} = tl.program_id(0).to(tl.int64)", 1)
        src.line(f"{c} = {pid} % {C}", 1)
        src.line(f"{task} = {pid} // {C}", 1)
        parts = [(r, src.dim(p.extent(r))) for r in self.outer] + [("#g", src.dim(self.n_groups)),
                                                                    ("#rb", src.dim(self.n_rb))]
        at = split_flat(src, task, parts, 1)
        self.scalars = {r: at[r] for r in self.outer}
        rho, i, h, ok, ar = (src.fresh() for _ in range(5))
        R = src.dim(self.R)
        src.line(f"{ar} = tl.arange(0, BLOCK_M).to(tl.int64)", 1)
        src.line(f"{rho} = {at['#rb']} * BLOCK_M + {ar}", 1)
        src.line(f"{i} = {rho} // {R}", 1)
        src.line(f"{ok} = {rho} < {src.dim(self.rs)}", 1)
        self.kv = dict(self.scalars)
        self.rows1: dict[str, str] = dict(self.scalars) | {QUERY: i}
        if p.group is not None:
            h0 = src.fresh()
            src.line(f"{h0} = {at['#g']} * {R}", 1)
            src.line(f"{h} = {h0} + {rho} % {R}", 1)
            src.line(f"{ok} = {ok} & ({h} < {src.dim(p.extent(p.group))})", 1)
            self.kv[p.group] = h0
            self.rows1[p.group] = h
        self.ok, self.ar = ok, ar
        self.rows2 = {k: (v if k in self.scalars else f"{v}[:, None]") for k, v in self.rows1.items()}
        klo, khi = self.key_range()
        # k and v read in place: their other subscripts (GQA's h / R) computed and checked once, here
        k_load = p.k_half if self.half else p.k if p.k_direct and isinstance(p.k, ir.Load) else None
        self.k_direct = Direct(src, k_load, self.kv, [KEY, FEATURE], self.extent) if k_load is not None else None
        # a row-addressed v (through a block table) is evaluated per block, as a gather
        self.v_direct = None if p.v_rows else Direct(src, p.v, self.kv, [KEY, VALUE], self.extent)
        lo, hi = src.fresh(), src.fresh()
        if split:
            ck = src.dim(self.chunk_keys)
            src.line(f"{lo} = tl.maximum({klo}, {c} * {ck})", 1)
            src.line(f"{hi} = tl.minimum({khi}, ({c} + 1) * {ck})", 1)
        else:
            src.line(f"{lo} = {klo}", 1)
            src.line(f"{hi} = {khi}", 1)
        start = src.fresh()
        src.line(f"{start} = ({lo} // BLOCK_N) * BLOCK_N", 1)
        if split:
            self.wsf, self.base = src.fresh(), src.fresh()
            src.line(f"{self.wsf} = ws.to(tl.pointer_type(tl.float32))", 1)
            src.line(f"{self.base} = 2 * ({HEADER_WORDS} + {src.dim(self.tasks)})", 1)
        e0, re = src.fresh(), src.fresh()
        src.line(f"for {e0} in {self.value_blocks()}:", 1)
        src.line(f"{re} = {e0} + tl.arange(0, BLOCK_E).to(tl.int64)", 2)
        m, l_, acc = self.keys(start, hi, re)
        if split:  # one chunk (C = 1) goes through the merge too: the same result, exactly
            self.partial(pid, m, l_, acc, re, 2)
            self.merge(task, C)
        else:
            self.store(acc, l_, re, 2)
        text = function_text(src, self.entry, self.buffers(), list(self.blocks))
        if self.half:
            text = f"{WIDE_DOT_LINE}\n\n\n{text}"
        scratch: str | None = "1" if src.err is not None else None
        if split:
            words = HEADER_WORDS + self.gate * (self.tasks + ceil_div(self.tasks * self.C * self.slot_size, 2))
            scratch = dim_str(words)
        launch = LaunchSpec(self.entry, None, tuple(self.buffers()), scratch,
                            (dim_str(self.tasks * self.C * self.gate),),
                            launch_options(self.plan, self.blocks, warps=HALF_WARPS if self.half or self.rows else 4,
                                           stages=HALF_STAGES if self.half else 2, entry=self.entry),
                            tuple(self.covers), self.fixed)
        return text, launch

    def key_range(self) -> tuple[str, str]:
        """The keys some valid row of the program can see: ``[klo, khi)`` (scalars)."""
        src, p = self.src, self.p
        t = src.dim(p.extent(KEY))
        klo, khi = src.fresh(), src.fresh()
        uppers = [b for b in p.bounds if b.upper]
        lowers = [b for b in p.bounds if not b.upper]
        em = ValueEmitter(src, "[BLOCK_M]", self.rows1, self.ok, 1, {}, self.extent)
        if uppers:
            lim = em.expr(uppers[0].limit)
            for b in uppers[1:]:
                lim = em.let(f"tl.minimum({lim}, {em.expr(b.limit)})")
            src.line(f"{khi} = tl.max(tl.where({self.ok}, {lim}, -1), 0)", 1)
            src.line(f"{khi} = tl.minimum(tl.maximum({khi}, 0), {t})", 1)
        else:
            src.line(f"{khi} = {t}", 1)
        if lowers:
            lim = em.expr(lowers[0].limit)
            for b in lowers[1:]:
                lim = em.let(f"tl.maximum({lim}, {em.expr(b.limit)})")
            src.line(f"{klo} = tl.min(tl.where({self.ok}, {lim}, {t}), 0)", 1)
            src.line(f"{klo} = tl.minimum(tl.maximum({klo}, 0), {khi})", 1)
        else:
            src.line(f"{klo} = 0", 1)
        return klo, khi

    def q_block(self, rd: str, depth: int) -> str:
        """The query block ``[BLOCK_M, BLOCK_D]`` at features ``rd`` (as stored when 16-bit)."""
        src, p = self.src, self.p
        mq = src.fresh()
        src.line(f"{mq} = {self.ok}[:, None] & ({rd}[None, :] < {src.dim(p.extent(FEATURE))})", depth)
        eq = ValueEmitter(src, "[BLOCK_M, BLOCK_D]", self.rows2 | {FEATURE: f"{rd}[None, :]"}, mq, depth, {},
                          self.extent)
        q = eq.let(f"tl.where({mq}, {eq.expr(p.q)}, 0.0)")
        return self.narrowed(q, depth)

    def k_block(self, rd: str, depth: int) -> str:
        """The key block ``[BLOCK_D, BLOCK_N]`` at features ``rd`` (as stored when 16-bit)."""
        src, p = self.src, self.p
        mk = src.fresh()
        src.line(f"{mk} = ({rd}[:, None] < {src.dim(p.extent(FEATURE))}) & ({self.rj}[None, :] < "
                 f"{src.dim(p.extent(KEY))})", depth)
        if p.k_rows:  # k's row of each key looked up once per key block (keys_rows); a feature chunk here
            assert isinstance(p.k, ir.Load)
            src.line(f"{mk} = {mk} & ({self.rj}[None, :] < {self.hi})", depth)
            return self.row_block(p.k, f"{self.k_off}[None, :] + {rd}[:, None]", mk, depth)
        at = {FEATURE: f"{rd}[:, None]", KEY: f"{self.rj}[None, :]"}
        if self.k_direct is not None:
            return self.widened(self.k_direct.block(at, mk, depth), depth) if self.half \
                else self.k_direct.f32(at, mk, depth)
        ek = ValueEmitter(src, "[BLOCK_D, BLOCK_N]", self.kv | at, mk, depth, {}, self.extent)
        return ek.let(f"tl.where({mk}, {ek.expr(p.k)}, 0.0)")

    def key_rows(self, load: ir.SExpr, depth: int) -> str:
        """The ``[BLOCK_N]`` offsets of a row-addressed load's rows (its feature subscript at 0) for
        the keys of the block below the length: the table looked up, and checked, once per key."""
        assert isinstance(load, ir.Load)
        src = self.src
        mr = src.fresh()
        src.line(f"{mr} = ({self.rj} < {src.dim(self.p.extent(KEY))}) & ({self.rj} < {self.hi})", depth)
        em = ValueEmitter(src, "[BLOCK_N]", self.kv | {KEY: self.rj}, mr, depth, {}, self.extent)
        off = em.offset(src.buffer(load.src), (*load.indices[:-1], ir.Const(0, DType.I64)))
        return em.let(f"tl.where({mr}, {off}, 0)")

    def row_block(self, load: ir.Load, offsets: str, mask: str, depth: int) -> str:
        """A block of a row-addressed load at ``offsets`` (its rows' offsets plus the features), as
        stored when 16-bit on the tensor-core path, else in f32."""
        raw = self.src.fresh()
        self.src.line(f"{raw} = tl.load({self.src.pointer(load.src)} + {offsets}, mask={mask}, other=0)", depth)
        if load.dtype in (DType.BF16, DType.F16):
            return self.widened(raw, depth) if self.half else f"{raw}.to(tl.float32)"
        return raw

    def narrowed(self, block: str, depth: int) -> str:
        """An f32 block of 16-bit values back in their type for ``tl.dot`` (exact), but f32 in the
        interpreter (whose ``tl.dot`` gets 16-bit blocks wrong)."""
        if not self.half:
            return block
        self.src.line(f"if not {WIDE_DOT}:", depth)
        self.src.line(f"{block} = {block}.to({STORAGE[self.half]})", depth + 1)
        return block

    def widened(self, raw: str, depth: int) -> str:
        """A stored 16-bit block, widened to f32 in the interpreter only."""
        self.src.line(f"if {WIDE_DOT}:", depth)
        self.src.line(f"{raw} = {raw}.to(tl.float32)", depth + 1)
        return raw

    def dot(self, a: str, b: str, acc: str | None = None) -> str:
        """``tl.dot`` of two blocks: IEEE f32, or 16-bit blocks on tensor cores with f32 sums."""
        precision = "" if self.half else ', input_precision="ieee"'
        return f"tl.dot({a}, {b}{', ' + acc if acc else ''}{precision})"

    def keys(self, start: str, hi: str, re: str) -> tuple[str, str, str]:
        """The online softmax over keys ``[start, hi)`` for value chunk ``re``: (max, sum, output) blocks."""
        src, p = self.src, self.p
        m, l_, acc = src.fresh(), src.fresh(), src.fresh()
        src.line(f"{m} = tl.full([BLOCK_M], {NEG_INF}, tl.float32)", 2)
        src.line(f"{l_} = tl.zeros([BLOCK_M], tl.float32)", 2)
        src.line(f"{acc} = tl.zeros([BLOCK_M, BLOCK_E], tl.float32)", 2)
        j0, rj, rd = src.fresh(), src.fresh(), src.fresh()
        self.rj, self.hi = rj, hi
        src.line(f"{rd} = tl.arange(0, BLOCK_D).to(tl.int64)", 2)
        q = self.q_block(rd, 2)  # the first feature chunk of the rows, read once
        src.line(f"for {j0} in range({start}, {hi}, BLOCK_N):", 2)
        src.line(f"{rj} = {j0} + tl.arange(0, BLOCK_N).to(tl.int64)", 3)
        self.k_off = self.key_rows(p.k, 3) if p.k_rows else ""
        self.v_off = self.key_rows(p.v, 3) if p.v_rows else ""
        k = self.k_block(rd, 3)
        s = src.fresh()
        src.line(f"{s} = {self.dot(q, k)}", 3)
        if not self.whole[FEATURE]:
            d0, rdd = src.fresh(), src.fresh()
            src.line(f"for {d0} in range(BLOCK_D, {src.dim(p.extent(FEATURE))}, BLOCK_D):", 3)
            src.line(f"{rdd} = {d0} + tl.arange(0, BLOCK_D).to(tl.int64)", 4)
            q2, k2 = self.q_block(rdd, 4), self.k_block(rdd, 4)
            src.line(f"{s} = {self.dot(q2, k2, s)}", 4)
        t = src.dim(p.extent(KEY))
        mf = src.fresh()
        src.line(f"{mf} = {self.ok}[:, None] & ({rj}[None, :] < {t})", 3)
        ef = ValueEmitter(src, "[BLOCK_M, BLOCK_N]", self.rows2 | {KEY: f"{rj}[None, :]"}, mf, 3, {p.scores: s},
                          self.extent)
        f = ef.expr(p.score)
        mn, ms, alpha, pr = (src.fresh() for _ in range(4))
        src.line(f"{f} = tl.where({rj}[None, :] < {hi}, {f}, {NEG_INF})", 3)
        src.line(f"{mn} = tl.maximum({m}, tl.max({f}, 1))", 3)
        src.line(f"{ms} = tl.where({mn} == {NEG_INF}, 0.0, {mn})", 3)
        src.line(f"{alpha} = tl.exp({m} - {ms})", 3)
        src.line(f"{pr} = tl.exp({f} - {ms}[:, None])", 3)
        src.line(f"{l_} = {l_} * {alpha} + tl.sum({pr}, 1)", 3)
        mv = src.fresh()
        src.line(f"{mv} = ({rj}[:, None] < {t}) & ({re}[None, :] < {src.dim(p.extent(VALUE))})", 3)
        at = {KEY: f"{rj}[:, None]", VALUE: f"{re}[None, :]"}
        if self.v_direct is None:  # row-addressed: the rows below the length, looked up once per block
            src.line(f"{mv} = {mv} & ({rj}[:, None] < {hi})", 3)
            v = self.row_block(p.v, f"{self.v_off}[:, None] + {re}[None, :]", mv, 3)
            pv = pr
            if self.half:
                pv = src.fresh()
                src.line(f"{pv} = {pr}", 3)
                pv = self.narrowed(pv, 3)  # v is as stored already (row_block)
        elif self.half:
            v = self.widened(self.v_direct.block(at, mv, 3), 3)
            pv = src.fresh()
            src.line(f"{pv} = {pr}", 3)
            pv = self.narrowed(pv, 3)
        else:
            v, pv = self.v_direct.f32(at, mv, 3), pr
        src.line(f"{acc} = {acc} * {alpha}[:, None] + {self.dot(pv, v)}", 3)
        src.line(f"{m} = {mn}", 3)
        return m, l_, acc

    def store(self, acc: str, l_: str, re: str, depth: int) -> None:
        """The result rows ``o / l`` (or ``o * (1 / l)``) of value chunk ``re``."""
        src, p = self.src, self.p
        mo = src.fresh()
        src.line(f"{mo} = {self.ok}[:, None] & ({re}[None, :] < {src.dim(p.extent(VALUE))})", depth)
        em = ValueEmitter(src, "[BLOCK_M, BLOCK_E]", self.rows2 | {VALUE: f"{re}[None, :]"}, mo, depth, {},
                          self.extent)
        out = em.let(f"{acc} * (1.0 / {l_})[:, None]" if p.recip else f"{acc} / {l_}[:, None]")
        em.store(src.buffer(p.out), [ir.Idx(r) for r in p.out_axes], out, p.out_dtype)

    def slot_at(self, index: str, depth: int) -> str:
        """The f32 offset of partial slot ``index`` in the workspace."""
        at = self.src.fresh()
        self.src.line(f"{at} = {self.base} + {index} * {self.src.dim(self.slot_size)}", depth)
        return at

    def value_blocks(self) -> str:
        """The iterable of value-chunk starts: one block when it spans ``E``, else steps of ``BLOCK_E``."""
        if self.whole[VALUE]:
            return "tl.static_range(1)"
        return f"range(0, {self.src.dim(self.p.extent(VALUE))}, BLOCK_E)"

    def partial(self, pid: str, m: str, l_: str, acc: str, re: str, depth: int) -> None:
        """This chunk's (max, sum, output) of value chunk ``re`` into its workspace slot."""
        src, ar, w = self.src, self.ar, self.wsf
        at = self.slot_at(pid, depth)
        ep = src.dim(self.ep)
        src.line(f"tl.store({w} + {at} + {ar}, {m})", depth)
        src.line(f"tl.store({w} + {at} + BLOCK_M + {ar}, {l_})", depth)
        src.line(f"tl.store({w} + {at} + 2 * BLOCK_M + {ar}[:, None] * {ep} + {re}[None, :], {acc}, "
                 f"mask={re}[None, :] < {ep})", depth)

    def merge(self, task: str, C: str) -> None:
        """The last chunk program of a row block to finish merges every chunk's slot, in chunk order."""
        src, ar, w = self.src, self.ar, self.wsf
        cnt = src.fresh()
        src.line("tl.debug_barrier()", 1)  # every lane's partial stores before the release
        src.line(f"{cnt} = tl.atomic_add(ws + {HEADER_WORDS} + {task}, 1)", 1)
        src.line(f"if {cnt} == {C} - 1:", 1)
        src.line("tl.debug_barrier()", 2)
        e0, re = src.fresh(), src.fresh()
        src.line(f"for {e0} in {self.value_blocks()}:", 2)
        src.line(f"{re} = {e0} + tl.arange(0, BLOCK_E).to(tl.int64)", 3)
        mm, lm, om = src.fresh(), src.fresh(), src.fresh()
        src.line(f"{mm} = tl.full([BLOCK_M], {NEG_INF}, tl.float32)", 3)
        src.line(f"{lm} = tl.zeros([BLOCK_M], tl.float32)", 3)
        src.line(f"{om} = tl.zeros([BLOCK_M, BLOCK_E], tl.float32)", 3)
        cc = src.fresh()
        src.line(f"for {cc} in range(0, {C}):", 3)
        at = self.slot_at(f"({task} * {C} + {cc})", 4)
        ep = src.dim(self.ep)
        mc, lc, oc, mn, ms, a, b = (src.fresh() for _ in range(7))
        load = 'cache_modifier=".cg"'
        src.line(f"{mc} = tl.load({w} + {at} + {ar}, {load})", 4)
        src.line(f"{lc} = tl.load({w} + {at} + BLOCK_M + {ar}, {load})", 4)
        src.line(f"{oc} = tl.load({w} + {at} + 2 * BLOCK_M + {ar}[:, None] * {ep} + {re}[None, :], "
                 f"mask={re}[None, :] < {ep}, other=0.0, {load})", 4)
        src.line(f"{mn} = tl.maximum({mm}, {mc})", 4)
        src.line(f"{ms} = tl.where({mn} == {NEG_INF}, 0.0, {mn})", 4)
        src.line(f"{a} = tl.exp({mm} - {ms})", 4)
        src.line(f"{b} = tl.exp({mc} - {ms})", 4)
        src.line(f"{lm} = {lm} * {a} + {lc} * {b}", 4)
        src.line(f"{om} = {om} * {a}[:, None] + {oc} * {b}[:, None]", 4)
        src.line(f"{mm} = {mn}", 4)
        self.store(om, lm, re, 3)

    def buffers(self) -> list[int]:
        p = self.p
        exprs: list[ir.SExpr] = [p.q, p.k, p.v, p.score, *(b.limit for b in p.bounds)]  # q_half/k_half are in q/k
        names = {x.src for e in exprs for x in ir.walk(e) if isinstance(x, ir.Load)} - {p.scores}
        names.add(p.out)
        return sorted(self.plan.buffer_index(n) for n in names)


__all__ = ["render_attention"]
