"""The CUDA-C target's attention dispatch: flash forward with an online softmax, and split-KV decode.

One block owns ``BLOCK_M`` query *rows* of one group of heads that read the same keys and
values: rows ``rho = i * R + r`` of the ``R`` query heads of one KV head (GQA's heads, found by
:func:`~arke.plan.attention.match_attention`; ``R = 1`` without a group), so a decode step
(``S = 1``) still fills a tile with the heads of a group. The grid is one axis, one block per
(outer batch entries × group × row block × key chunk), so no batch hits CUDA's 65535 limit.
``k`` and ``v`` are read in place through their own subscripts (``k[b, h / R, j, d]``, the
non-row subscripts computed and checked once per block) with the group's first head.

Per tile of ``BLOCK_N`` keys (staged in shared memory) the block computes the scores
``q kᵀ``, the score expression ``f`` (scale, masks, softcaps, bias tensors ... through
:class:`~arke.targets.cuda.expr.CExpr`, at valid rows and keys only, so the error word is
raised exactly where the interpreter's would be), then the online softmax: running max ``m``,
``p = exp(f - m)``, the exact rescale ``alpha`` of the running sum ``l`` and output ``o``,
``o += p v``. A recognised key bound (``j <= i + T - S``) limits the keys of a block to those
some row can see: tiles past it are never read. Two forms (:mod:`arke.targets.cuda.attention_loops`):

* **tensor cores**, when ``q``, ``k`` and ``v`` are plain loads of one 16-bit type: warp
  ``(wm, wn)`` owns 16 rows and ``BLOCK_N / WN`` keys of each tile; ``S = Q Kᵀ`` and
  ``O += P V`` are ``m16n8k16`` MMAs (``ak_mma_bf16``/``ak_mma_f16``: exact products, f32
  sums) on tiles in shared memory, ``P`` rounded to ``v``'s type as flash attention does
  (spec/codegen.md §7); the row statistics are reduced over the 4 lanes of a quad with
  ``__shfl_xor_sync``. K/V tiles are copied by ``ak_cp_async16`` into ``stages`` buffers (the
  next tiles load while this one is used) when their rows are 16-byte aligned, else element
  by element; head dims need no particular size (the MMA steps past ``D`` and ``E`` are
  skipped, a ragged step reads zeros). With ``WN > 1`` (decode: 16 rows, 4 warps) the warps'
  partial results are merged in warp order.
* **SIMT** otherwise (f32, ``q``/``k`` expressions such as a fused norm or rotary embedding,
  mixed dtypes): each row is ``32 / (BLOCK_M / warps)`` lanes of one warp, each lane a fixed
  subset of a tile's keys and of the value features; ``q``, ``k`` (evaluated in f32) and ``v``
  tiles in shared memory; statistics by ``__shfl_xor_sync`` within a row's lanes.

A feature (value) axis wider than ``BLOCK_D`` (``BLOCK_E``) is walked in chunks: features per
key tile, values as passes of their own over the keys. Every sum runs in an order fixed by
the plan (tile sizes are fixed at render time), so results do not depend on scheduling.

Algorithms (the strategy's ``algorithm``):

* ``flash``: one pass over the keys, the result stored as ``o / l`` (or ``o * (1 / l)``);
* ``split_kv``: the keys cut into ``C`` chunks of whole tiles (``split j = n``: n chunks, else
  :data:`SPLIT_TILES` tiles each), one block per (rows, chunk) writing its (max, sum, output)
  to the scratch words; the last block of the rows to finish (an ``atomicAdd`` counter per row
  block after a ``__threadfence``, in the scratch the runtime zeroes for each launch) merges
  the chunks *in chunk order*, so the result does not depend on which block finished last;
* default: both kernels are rendered (the split one's entry ends in ``s``), each launched over
  a grid that is empty unless the dims choose it: ``split_kv`` (``BLOCK_M`` =
  :data:`DECODE_ROWS`) when a group has at most :data:`DECODE_ROWS` rows (``R * S``), else ``flash``;
* ``materialized`` keeps no row of scores in memory on a GPU: it runs as ``flash``.

Scratch (``err``, 8-byte words): word 0 the error word, words 1..15 unused, then one counter
per row block, then the f32 partials, one slot per (row block, chunk): ``BLOCK_M`` maxima,
``BLOCK_M`` sums, ``BLOCK_M × E`` outputs. A fully masked row gives NaN (``0 / 0``), as the
reference does.

Each entry is declared once before its definition with ``__launch_bounds__(threads, 1)``: the
definition keeps the ABI's one-line head, and ptxas, told that one resident block per SM will
do (the tiles' dynamic shared memory bounds the count anyway), gives the accumulators the
registers they need instead of spilling a few to fit more blocks than could ever be resident.

Strategy: ``tile`` on the query, key, feature and value indices sets ``BLOCK_M``, ``BLOCK_N``,
``BLOCK_D``, ``BLOCK_E``; ``warps`` the warps of a block; ``stages`` the K/V buffers of the
tensor-core form (the SIMT form loads each tile once, synchronously: stages has no effect
there); ``split j = n`` the chunks of split_kv. A combination the form cannot run is an
:class:`~arke.targets.artifact.UnsupportedError` naming the decision and the values that work.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, ceil_div, dim_str, floordiv, row_major_stride
from arke.plan.attention import KEY, QUERY, VALUE, Attention
from arke.plan.dispatch import Buffer, Dispatch, KernelPlan
from arke.plan.exprs import attention_modes, decided, product
from arke.targets.artifact import LaunchSpec, UnsupportedError
from arke.targets.cuda.attention_blocks import DECODE_ROWS, HEADER_WORDS, NEG_INF, SPLIT_TILES, Choices
from arke.targets.cuda.attention_loops import main_loop
from arke.targets.cuda.expr import STORAGE, CExpr
from arke.targets.cuda.render import CText


def render_attention(plan: KernelPlan, dispatch: Dispatch, entry: str) -> tuple[str, list[LaunchSpec]]:
    """The ``__global__`` functions of one attention dispatch and how to launch them: one kernel for
    ``flash`` or ``split_kv``; by default both, each launched over a grid that is empty unless the
    dims choose it (split_kv when a group has at most :data:`DECODE_ROWS` rows)."""
    if not isinstance(dispatch.pattern, Attention):
        raise UnsupportedError(f"{entry}: an attention dispatch needs its Attention pattern")
    modes = attention_modes(plan, dispatch.pattern.key_index)
    texts, launches = [], []
    for mode in modes:
        name = entry + ("s" if mode == "split_kv" and len(modes) > 1 else "")
        kernel = AttentionKernel(plan, dispatch, name, mode, auto=len(modes) > 1)
        text, launch = kernel.render()
        texts.append(text)
        launches.append(launch)
    return "\n\n".join(texts), launches


class AttentionKernel(CText):
    """Emits one attention kernel (see the module doc): the prologue, rows, key range, results and
    the split merge here; the key loop of each form in :mod:`arke.targets.cuda.attention_loops`."""

    def __init__(self, plan: KernelPlan, d: Dispatch, entry: str, mode: str, auto: bool):
        p = d.pattern
        assert isinstance(p, Attention)
        self.plan, self.d, self.p, self.entry = plan, d, p, entry
        self.split = mode == "split_kv"
        # 16-bit q, k (plain loads) and v of one type: tensor cores; anything else: SIMT in f32
        dt = {x.dtype for x in (p.q_half, p.k_half) if x is not None}
        self.half: DType | None = dt.pop() if p.q_half is not None and p.k_half is not None and len(dt) == 1 \
            and p.v_dtype == p.q_half.dtype else None
        choices = Choices(plan, d, entry, self.split, auto, self.half is not None)
        self.b = choices.blocks()
        self.chunks = decided(plan, "split", p.key_index)
        self.R: Dim = p.group_size if p.group is not None and p.group_size is not None else sympy.Integer(1)
        self.outer = [r for r in p.batch if r != p.group]
        self.n_groups: Dim = ceil_div(p.extent(p.group), self.R) if p.group is not None else sympy.Integer(1)
        self.rs: Dim = self.R * p.extent(QUERY)
        self.n_rb: Dim = ceil_div(self.rs, self.b.m)
        self.tasks: Dim = product([p.extent(r) for r in self.outer]) * self.n_groups * self.n_rb
        t = p.extent(KEY)
        bn = self.b.n
        self.chunk_keys: Dim = (ceil_div(ceil_div(t, self.chunks), bn) * bn if self.chunks
                                else sympy.Integer(SPLIT_TILES * bn))
        # 1 when R * S <= DECODE_ROWS, else 0 (as dim arithmetic, defined for R * S = 0 too)
        small = floordiv(floordiv(DECODE_ROWS + 1, self.rs + 1) + DECODE_ROWS, DECODE_ROWS + 1)
        self.gate: Dim = (small if self.split else 1 - small) if auto else sympy.Integer(1)
        self.C: Dim = ceil_div(t, self.chunk_keys) if self.split else sympy.Integer(1)
        self.slot: Dim = 2 * self.b.m + self.b.m * p.extent(VALUE)
        self.extent: dict[str, Dim] = dict(p.extents)
        # the text
        self.lines: list[str] = []
        self.prologue: list[str] = []
        self.depth = 1
        self.dims: dict[str, str] = {}
        self.at: dict[str, str] = {}  # role -> the C variable of its index where expressions are evaluated
        self.values: dict[str, str] = {}  # a value computed here (the raw scores) -> its C variable
        self.x = CExpr(self.emit, lambda a: self.at[a], lambda r: self.dim(r.dim), self.load)

    def serial(self, head: str) -> AbstractContextManager[None]:
        """A loop the compiler must not unroll: a thread's share of a tile's elements (unrolled and
        interleaved, their 64-bit index arithmetic takes the registers the accumulators need)."""
        self.emit("#pragma unroll 1")
        return self.block(head)

    @contextmanager
    def where(self, at: dict[str, str]) -> Iterator[None]:
        """Expressions evaluated at the indices ``at`` (role -> C variable) in this block."""
        saved = self.at
        self.at = dict(at)
        self.x.push()
        try:
            yield
        finally:
            self.x.pop()
            self.at = saved

    def pointer(self, name: str) -> str:
        return f"b{self.plan.buffer_index(name)}"

    def plain(self, sub: ir.SExpr, extent: Dim) -> bool:
        """Whether a subscript is known to be in range: a role of the same extent, or the 0 of a broadcast."""
        if isinstance(sub, ir.Const) and not sub.dtype.is_float and int(sub.value) == 0:
            return True
        return isinstance(sub, ir.Idx) and sub.name in self.extent and \
            sympy.sympify(self.extent[sub.name]) == sympy.sympify(extent)

    def offset(self, buf: Buffer, subs: tuple[ir.SExpr, ...]) -> str:
        """The row-major element offset of ``subs`` in ``buf``, each subscript checked unless plainly in range."""
        offset = "0LL"
        for k, (s, extent) in enumerate(zip(subs, buf.shape)):
            v = self.x.value(s, DType.I64)
            if not self.plain(s, extent):
                v = self.x.let("long long", f"ak_check({v}, {self.dim(extent)}, &ak_err)")
            offset = v if k == 0 else self.x.let("long long", f"{offset} * {self.dim(extent)} + {v}")
        return offset

    def load(self, e: ir.Load) -> str:
        """CExpr's raw load: the element as stored (its subscripts checked), or a value computed here."""
        if e.src in self.values:
            return self.values[e.src]
        buf = self.buffer(e.src)
        return self.x.let(STORAGE[buf.dtype], f"{self.pointer(e.src)}[{self.offset(buf, e.indices)}]")

    def direct(self, load: ir.Load, plain: tuple[str, ...]) -> tuple[str, dict[str, str]]:
        """A load addressed directly at the block's KV indices (``self.at``): the element offset of
        its other subscripts (checked once, here) and the stride of each ``plain`` role."""
        buf = self.buffer(load.src)
        terms = []
        for pos, (sub, size) in enumerate(zip(load.indices, buf.shape)):
            if isinstance(sub, ir.Idx) and sub.name in plain:
                continue
            v = self.x.value(sub, DType.I64)
            if not self.plain(sub, size):
                v = self.x.let("long long", f"ak_check({v}, {self.dim(size)}, &ak_err)")
            terms.append(f"{v} * {self.dim(row_major_stride(buf.shape, pos))}")
        base = self.x.let("long long", " + ".join(terms) if terms else "0LL")
        at = [s.name if isinstance(s, ir.Idx) else None for s in load.indices]
        return base, {a: self.dim(row_major_stride(buf.shape, at.index(a))) for a in plain}

    @staticmethod
    def widen(raw: str, dtype: DType) -> str:
        """A stored float element as f32."""
        return {DType.BF16: f"ak_bf16_to_f32({raw})", DType.F16: f"ak_f16_to_f32({raw})"}.get(dtype, raw)

    # -- rows
    def rows(self, prefix: str, rho: str) -> tuple[str, dict[str, str]]:
        """Row ``rho`` of the block's group: (its validity, role -> index variable)."""
        p = self.p
        self.emit(f"const long long {prefix}rho = {rho};")
        self.emit(f"const long long {prefix}i = {prefix}rho / {self.dim(self.R)};")
        ok = f"{prefix}rho < {self.dim(self.rs)}"
        at = dict(self.scalars) | {QUERY: f"{prefix}i"}
        if p.group is not None:
            self.emit(f"const long long {prefix}h = kv_h0 + {prefix}rho % {self.dim(self.R)};")
            ok += f" && {prefix}h < {self.dim(p.extent(p.group))}"
            at[p.group] = f"{prefix}h"
        self.emit(f"const bool {prefix}ok = {ok};")
        return f"{prefix}ok", at

    # -- the function
    def render(self) -> tuple[str, LaunchSpec]:
        """The kernel's text and launch: the block's task, its key range, the key loop of its form,
        the split merge."""
        p, b = self.p, self.b
        C = self.dim(self.C)
        self.emit("bool ak_err = false;")
        self.emit("AK_DYNAMIC_SMEM(ak_smem);")
        self.emit("const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;")
        self.emit("const long long pid = blockIdx.x;")
        self.emit(f"const long long chunk = pid % {C}, task = pid / {C};")
        rest = "task"
        parts = [(r, p.extent(r)) for r in self.outer] + [("g", self.n_groups), ("rb", self.n_rb)]
        at: dict[str, str] = {}
        for k, (name, n) in enumerate(reversed(parts)):  # row-major: the row block varies fastest
            var = f"kv_{name}"
            if k == len(parts) - 1:
                self.emit(f"const long long {var} = {rest};")
            else:
                self.emit(f"const long long {var} = {rest} % {self.dim(n)};")
                self.emit(f"const long long q_{name} = {rest} / {self.dim(n)};")
                rest = f"q_{name}"
            at[name] = var
        self.scalars = {r: at[r] for r in self.outer}
        self.emit(f"const long long kv_h0 = kv_g * {self.dim(self.R)};")
        self.kv = dict(self.scalars) | ({p.group: "kv_h0"} if p.group is not None else {})
        self.key_range()
        main_loop(self)
        if self.split:
            self.merge()
        self.emit("if (ak_err) err[0] = 1; /* every failing thread stores the same value: no atomic */")
        text = self.text()
        scratch: str | None = "1"
        if self.split:
            words = HEADER_WORDS + self.gate * (self.tasks + ceil_div(self.tasks * self.C * self.slot, 2))
            scratch = dim_str(words)
        options = (("block", b.threads), ("shared", b.shared()), ("stages", b.stages))
        launch = LaunchSpec(self.entry, None, tuple(self.buffers()), scratch,
                            (dim_str(self.tasks * self.C * self.gate),), options)
        return text, launch

    def key_range(self) -> None:
        """``kr_lo``/``kr_hi``: the keys some valid row of the block can see (a chunk's share of them
        for split_kv), and ``kr_start``/``kr_tiles``: the key tiles that cover them."""
        p, b = self.p, self.b
        t = self.dim(p.extent(KEY))
        uppers = [k for k in p.bounds if k.upper]
        lowers = [k for k in p.bounds if not k.upper]
        self.emit(f"long long khi = {'-1LL' if uppers else t}, klo = {t if lowers else '0LL'};")
        if p.bounds:
            with self.serial(f"for (int kr = 0; kr < {b.m}; ++kr)"):
                ok, at = self.rows("kr_", f"kv_rb * {b.m}LL + kr")
                with self.block(f"if ({ok})"), self.where(at):
                    for bound in uppers:
                        lim = self.x.value(bound.limit, DType.I64)
                        self.emit(f"khi = {lim} > khi ? {lim} : khi;")
                    for bound in lowers:
                        lim = self.x.value(bound.limit, DType.I64)
                        self.emit(f"klo = {lim} < klo ? {lim} : klo;")
            self.emit(f"khi = khi < 0 ? 0 : khi > {t} ? {t} : khi;")
            self.emit("klo = klo < 0 ? 0 : klo > khi ? khi : klo;")
        if self.split:
            ck = self.dim(self.chunk_keys)
            self.emit(f"const long long kr_lo = klo > chunk * {ck} ? klo : chunk * {ck};")
            self.emit(f"const long long kr_hi = khi < (chunk + 1) * {ck} ? khi : (chunk + 1) * {ck};")
        else:
            self.emit("const long long kr_lo = klo, kr_hi = khi;")
        self.emit(f"const long long kr_start = (kr_lo / {b.n}) * {b.n};")
        self.emit(f"const long long kr_tiles = kr_hi > kr_start ? (kr_hi - kr_start + {b.n - 1}) / {b.n} : 0;")

    # -- results
    def finish(self, o: str, l_: str, at: dict[str, str], e: str) -> None:
        """Store ``o / l`` (or ``o * (1 / l)``) at a row's value ``e``, rounded to the result's dtype."""
        p = self.p
        value = f"{o} * (1.0f / {l_})" if p.recip else f"{o} / {l_}"
        with self.where(at | {VALUE: e}):
            buf = self.buffer(p.out)
            where = self.offset(buf, tuple(ir.Idx(r) for r in p.out_axes))
            self.emit(f"{self.pointer(p.out)}[{where}] = {self.x.narrow(f'({value})', p.out_dtype)};")

    def combine(self, mm: str, lm: str, om: str, mc: str, lc: str, oc: str) -> None:
        """Fold one partial (max ``mc``, sum ``lc``, output ``oc``) into the running ``mm``, ``lm``, ``om``."""
        self.emit(f"const float cb_mn = fmaxf({mm}, {mc});")
        self.emit(f"const float cb_ms = cb_mn == {NEG_INF} ? 0.0f : cb_mn;")
        self.emit(f"const float cb_a = expf({mm} - cb_ms), cb_b = expf({mc} - cb_ms);")
        self.emit(f"{lm} = {lm} * cb_a + {lc} * cb_b;")
        self.emit(f"{om} = {om} * cb_a + {oc} * cb_b;")
        self.emit(f"{mm} = cb_mn;")

    def epilogue(self, os_: str, ms_: str, ls_: str) -> None:
        """After a value chunk's pass over the keys: the staged (per key-warp) statistics and outputs
        in shared memory merged in warp order, then stored (flash) or written to the chunk's slot."""
        p, b = self.p, self.b
        E = self.dim(p.extent(VALUE))
        with self.serial(f"for (int ix = tid; ix < {b.m * b.e}; ix += {b.threads})"):
            self.emit(f"const int er = ix / {b.e}, ec = ix % {b.e};")
            self.emit("const long long ee = e0 + ec;")
            ok, at = self.rows("ep_", f"kv_rb * {b.m}LL + er")
            with self.block(f"if ({ok} && ee < {E})"):
                self.emit(f"float mm = {ms_}[er], lm = {ls_}[er], om = {os_}[er * {b.e} + ec];")
                for w in range(1, b.wn):
                    with self.block(""):
                        self.combine("mm", "lm", "om", f"{ms_}[{w * b.m} + er]", f"{ls_}[{w * b.m} + er]",
                                     f"{os_}[({w * b.m} + er) * {b.e} + ec]")
                if self.split:
                    self.emit(f"float* slot = ak_ws + (task * {self.dim(self.C)} + chunk) * {self.dim(self.slot)};")
                    self.emit(f"if (ee == 0) {{ slot[er] = mm; slot[{b.m} + er] = lm; }}")
                    self.emit(f"slot[{2 * b.m} + er * {E} + ee] = om;")
                else:
                    self.finish("om", "lm", at, "ee")

    def merge(self) -> None:
        """split_kv: the last block of a row block to finish merges every chunk's slot, in chunk order."""
        p, b = self.p, self.b
        C, E = self.dim(self.C), self.dim(p.extent(VALUE))
        self.emit("__shared__ int ak_last;")
        self.emit("__threadfence(); /* this block's partials are visible before its count */")
        self.emit("__syncthreads();")
        self.emit(f"if (tid == 0) ak_last = atomicAdd((unsigned long long*)(err + {HEADER_WORDS} + task), 1ull) "
                  f"== (unsigned long long)({C} - 1);")
        self.emit("__syncthreads();")
        with self.block("if (ak_last)"):
            self.emit("__threadfence();")
            with self.serial(f"for (long long ix = tid; ix < {b.m}LL * {E}; ix += {b.threads})"):
                self.emit(f"const long long er = ix / {E}, ee = ix % {E};")
                ok, at = self.rows("mg_", f"kv_rb * {b.m}LL + er")
                with self.block(f"if ({ok})"):
                    self.emit(f"float mm = {NEG_INF}, lm = 0.0f, om = 0.0f;")
                    with self.block(f"for (long long cc = 0; cc < {C}; ++cc)"):
                        self.emit(f"const volatile float* slot = ak_ws + (task * {C} + cc) * {self.dim(self.slot)};")
                        self.emit(f"const float mc = slot[er], lc = slot[{b.m} + er], "
                                  f"oc = slot[{2 * b.m} + er * {E} + ee];")
                        self.combine("mm", "lm", "om", "mc", "lc", "oc")
                    self.finish("om", "lm", at, "ee")

    def buffers(self) -> list[int]:
        p = self.p
        exprs: list[ir.SExpr] = [p.q, p.k, p.v, p.score, *(k.limit for k in p.bounds)]
        names = {x.src for e in exprs for x in ir.walk(e) if isinstance(x, ir.Load)} - {p.scores}
        names.add(p.out)
        return sorted(self.plan.buffer_index(n) for n in names)

    def text(self) -> str:
        p, b = self.p, self.b
        params = []
        for k in self.buffers():
            buf = self.plan.buffers[k]
            const = "" if buf.name == p.out else "const "
            params.append(f"{const}{STORAGE[buf.dtype]}* __restrict__ b{k}")
        params += ["const long long* __restrict__ dims", "long long* __restrict__ err"]
        form = f"tensor cores ({self.half.value})" if self.half else "SIMT f32"
        note = (f"// attention {'split_kv' if self.split else 'flash'}, {form}: BLOCK_M={b.m} BLOCK_N={b.n} "
                f"BLOCK_D={b.d} BLOCK_E={b.e} warps={b.warps} stages={b.stages}")
        # The declaration asks ptxas for one resident block per SM at least (shared memory bounds the
        # count anyway): without it ptxas spills a few registers to fit more blocks than the shared
        # memory allows. The definition keeps the ABI's one-line head.
        declaration = f'extern "C" __global__ void __launch_bounds__({b.threads}, 1) {self.entry}({", ".join(params)});'
        head = f'extern "C" __global__ void __launch_bounds__({b.threads}) {self.entry}({", ".join(params)}) {{'
        ws = []
        if self.split:
            ws = [f"  float* ak_ws = (float*)(err + {HEADER_WORDS} + {self.dim(self.tasks)});"]
        return "\n".join([note, declaration, head, *self.prologue, *ws, *self.lines, "}"])


__all__ = ["AttentionKernel", "render_attention"]
