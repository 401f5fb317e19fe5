"""The Triton target's contraction dispatch: a blocked ``tl.dot`` matmul with fused prologue and epilogue.

One dispatch runs ``C[batch.., m, n] = epilogue(sum(A(.., m, k) * B(.., k, n) for k))``
(:class:`~arke.plan.contraction.Contraction`):

* one program per (batch entry × ``BLOCK_M`` rows × ``BLOCK_N`` columns), the whole grid
  flattened on axis 0 (no 65535 limit on the batch); within a batch entry the row blocks run
  in groups of :data:`GROUP_M` (column-major inside a group) so neighbouring programs share
  panels of ``B`` in L2;
* the k loop walks ``BLOCK_K`` steps with masked loads (ragged M, N and K: lanes past an
  edge read nothing and count 0), evaluates each side's *prologue* (a fused producer such as
  ``f32(w[n, k]) * s[n]``) on the loaded block through :class:`~arke.targets.triton.expr.Emitter`
  and accumulates in f32 with ``tl.dot``; bf16/f16 operands that are both plain loads of the
  same 16-bit type are fed to ``tl.dot`` as they are stored (tensor cores, f32 accumulation),
  anything else is converted to f32 first and multiplied in IEEE f32 (``input_precision="ieee"``:
  no TF32 rounding, so results match the interpreter within f32 rounding);
* the epilogue (bias, activation, residual, per-channel scale, a cast to bf16 ...) is
  evaluated on the accumulator block and the result stored, masked, in its dtype.

Blocks come from the strategy: ``tile m, n, k`` set ``BLOCK_M``/``BLOCK_N``/``BLOCK_K``
(rounded up to a power of two, at least 16, which ``tl.dot`` needs: a few rows, as in
decode, are a padded, masked block), ``warps`` sets ``num_warps`` and ``stages``
``num_stages``. Defaults: 64 × 64 × 16 and 4 warps in f32, 128 × 128 × 64 and 8 warps for
16-bit operands, 3 stages; a matrix-vector product (no ``m``) uses 16 rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, ceil_div, dim_str, row_major_stride
from arke.plan.contraction import Contraction
from arke.plan.dispatch import Dispatch, KernelPlan
from arke.plan.exprs import decided, product
from arke.targets.artifact import LaunchSpec, UnsupportedError
from arke.targets.space import rounded_up  # the blocks tiles run as (AK4014 says the same)
from arke.targets.triton.blocks import capped
from arke.targets.triton.expr import COMPUTE, Emitter, Source

#: Default blocks (rows, columns, depth) and warps of a contraction program in f32 (an IEEE f32
#: ``tl.dot`` runs on FMA units: a shallow k step keeps its operands in registers without spills) ...
BLOCK_M, BLOCK_N, BLOCK_K, WARPS = 64, 64, 16, 4
#: ... and with 16-bit operands fed to the tensor cores as stored.
HALF_BLOCKS, HALF_WARPS = (128, 128, 64), 8
#: Row blocks per L2 group (programs of one group walk its columns together).
GROUP_M = 8
#: The smallest block edge ``tl.dot`` accepts.
MIN_DOT = 16
HALF = frozenset({DType.BF16, DType.F16})
#: A module-level constexpr: true under ``TRITON_INTERPRET=1``, whose ``tl.dot`` gets bf16 blocks
#: wrong (it reads their bits as another type), so 16-bit operands are widened to f32 there only.
WIDE_DOT = "_ak_wide_dot"
WIDE_DOT_LINE = f'{WIDE_DOT} = tl.constexpr(__import__("os").environ.get("TRITON_INTERPRET", "0") not in ("", "0"))'


def launch_options(plan: KernelPlan, constexprs: dict[str, int], stages: int = 3,
                   warps: int = 4, entry: str = "") -> tuple[tuple[str, int], ...]:
    """The launch options: the block constexprs, then ``num_warps`` and ``num_stages`` (the strategy's,
    else what the fit step chose for ``entry``, else the default)."""
    return (*constexprs.items(),
            ("num_warps", decided(plan, "warps", None) or plan.fitted_option(entry, "num_warps") or warps),
            ("num_stages", decided(plan, "stages", None) or plan.fitted_option(entry, "num_stages") or stages))


def fixed_options(plan: KernelPlan, blocks: Sequence[str]) -> tuple[str, ...]:
    """The options a fit step must keep: ``blocks`` (those a decision set) and ``num_warps``/``num_stages``
    where the strategy decided them."""
    return (*blocks, *(key for kind, key in (("warps", "num_warps"), ("stages", "num_stages"))
                       if decided(plan, kind, None) is not None))


def function_text(src: Source, entry: str, buffers: Sequence[int], constexprs: Sequence[str],
                  with_ws: bool = False) -> str:
    """One ``@triton.jit`` function: ``b<i>`` per buffer, ``ws`` if used, ``d<j>`` per dim, constexprs."""
    params = [f"b{i}" for i in buffers]
    if src.err is not None or with_ws:
        params.append("ws")
    params += [f"d{j}" for j in range(len(src.plan.dims))]
    params += [f"{k}: tl.constexpr" for k in constexprs]
    return "\n".join(["@triton.jit", f"def {entry}({', '.join(params)}):", *src.header, *src.lines]) + "\n"


def split_flat(src: Source, flat: str, extents: Sequence[tuple[str, str]], depth: int) -> dict[str, str]:
    """Positions of a row-major flat index over ``extents`` (name, int64 scalar text), outermost first."""
    out: dict[str, str] = {}
    rest = flat
    for k, (name, n) in enumerate(reversed(extents)):
        v = src.fresh()
        if k == len(extents) - 1:
            src.line(f"{v} = {rest}", depth)
        else:
            src.line(f"{v} = {rest} % {n}", depth)
            nxt = src.fresh()
            src.line(f"{nxt} = {rest} // {n}", depth)
            rest = nxt
        out[name] = v
    return out


class ValueEmitter(Emitter):
    """An emitter where some values are blocks already computed (a finished sum, a score tile)."""

    def __init__(self, src: Source, shape: str, index: dict[str, str], mask: str | None, depth: int,
                 values: dict[str, str], extent: dict[str, Dim]):
        super().__init__(src, shape, index, mask, depth)
        self.values = values
        self.extent = dict(extent)

    def _x_Load(self, e: ir.Load) -> str:
        if e.src in self.values:
            return self.values[e.src]
        return super()._x_Load(e)


class Direct:
    """A plain load addressed directly: ``base`` (scalar) plus each plain axis times its stride."""

    def __init__(self, src: Source, load: ir.Load, scalars: dict[str, str], plain: Sequence[str],
                 extent: dict[str, Dim], depth: int = 1):
        self.src, self.load = src, load
        buf = src.buffer(load.src)
        em = ValueEmitter(src, "[1]", scalars, None, depth, {}, extent)
        terms = []
        for pos, (sub, size) in enumerate(zip(load.indices, buf.shape)):
            if isinstance(sub, ir.Idx) and sub.name in plain:
                continue
            stride = src.dim(row_major_stride(buf.shape, pos))
            if isinstance(sub, ir.Idx) and sub.name in scalars and sub.name in extent \
                    and sympy.sympify(extent[sub.name]) == sympy.sympify(size):
                terms.append(f"{scalars[sub.name]} * {stride}")  # a scalar index known in range
            elif not (isinstance(sub, ir.Const) and int(sub.value) == 0):
                # anything else (GQA's h / R) computed and checked once, here; a scalar keeps the
                # address's divisibility visible to Triton (vectorised, pipelined loads)
                terms.append(f"tl.sum({em.subscript(sub, size)}, 0) * {stride}")
        self.base = src.fresh()
        src.line(f"{self.base} = {' + '.join(terms) if terms else '0'}", depth)
        self.stride = {a: src.dim(row_major_stride(buf.shape, list(load.indices).index(ir.Idx(a)))) for a in plain}
        self.dtype = buf.dtype

    def block(self, at: dict[str, str], mask: str, depth: int) -> str:
        """The raw (storage-typed) block at ``at`` (axis -> broadcastable positions), 0 off ``mask``."""
        terms = " + ".join(f"{v} * {self.stride[a]}" for a, v in at.items())
        raw = self.src.fresh()
        self.src.line(f"{raw} = tl.load({self.src.pointer(self.load.src)} + {self.base} + {terms}, mask={mask}, "
                      "other=0)", depth)
        return raw

    def f32(self, at: dict[str, str], mask: str, depth: int) -> str:
        """The block in f32 (the load's dtype converted as the interpreter converts it)."""
        raw = self.block(at, mask, depth)
        if self.dtype is DType.F32:
            return raw
        v = self.src.fresh()
        self.src.line(f"{v} = {raw}.to(tl.float32)", depth)
        return v


def render_contraction(plan: KernelPlan, dispatch: Dispatch, entry: str,
                       source: type[Source] = Source) -> tuple[str, LaunchSpec]:
    """The ``@triton.jit`` function of one contraction dispatch and how to launch it."""
    if not isinstance(dispatch.pattern, Contraction):
        raise UnsupportedError(f"{entry}: a contraction dispatch needs its Contraction pattern")
    return _Gemm(plan, dispatch, entry, source(plan)).render()


class _Gemm:
    """Emits one contraction dispatch (see the module doc)."""

    def __init__(self, plan: KernelPlan, d: Dispatch, entry: str, src: Source):
        assert isinstance(d.pattern, Contraction)
        self.plan, self.d, self.entry, self.src = plan, d, entry, src
        self.c = d.pattern
        self.contract = d.members[0]
        if isinstance(self.contract, ir.MapOp):
            raise UnsupportedError(f"{entry}: a contraction's first op must reduce")
        self.extent: dict[str, Dim] = {a.name: a.extent for a in (*self.contract.axes, *self.contract.reduce_axes)}
        c = self.c
        half = self.half_operands() is not None
        dm, dn, dk = HALF_BLOCKS if half else (BLOCK_M, BLOCK_N, BLOCK_K)
        self.warps = HALF_WARPS if half else WARPS
        tiles = {"BLOCK_M": MIN_DOT if c.m is None else capped(decided(plan, "tile", c.m)),
                 "BLOCK_N": capped(decided(plan, "tile", c.n)), "BLOCK_K": capped(decided(plan, "tile", c.k))}
        defaults = {"BLOCK_M": dm, "BLOCK_N": dn, "BLOCK_K": dk}
        # a block no decision set takes the fit step's choice (spec/codegen.md §9.5), else the default
        self.blocks = {k: rounded_up(v or plan.fitted_option(entry, k) or defaults[k], MIN_DOT)
                       for k, v in tiles.items()}
        self.fixed = fixed_options(plan, [k for k, v in tiles.items() if v is not None])

    def rows(self) -> Dim:
        return self.extent[self.c.m] if self.c.m is not None else sympy.Integer(1)

    def half_operands(self) -> DType | None:
        """The 16-bit dtype both operands are plain loads of (fed to ``tl.dot`` as stored), if any."""
        pa, pb = self.c.plain_a(), self.c.plain_b()
        if pa is None or pb is None:
            return None
        da, db = self.src.buffer(pa.src).dtype, self.src.buffer(pb.src).dtype
        return da if da == db and da in HALF else None

    def render(self) -> tuple[str, LaunchSpec]:
        c, src, blk = self.c, self.src, self.blocks
        bm, bn = blk["BLOCK_M"], blk["BLOCK_N"]
        n_m, n_n = ceil_div(self.rows(), bm), ceil_div(self.extent[c.n], bn)
        batch = [(a, src.dim(self.extent[a])) for a in c.batch]
        total = n_m * n_n * product([self.extent[a] for a in c.batch])
        pid, bid, t = src.fresh(), src.fresh(), src.fresh()
        nm, nn = src.dim(n_m), src.dim(n_n)
        src.line(f"{pid} = tl.program_id(0).to(tl.int64)", 1)
        src.line(f"{bid} = {pid} // ({nm} * {nn})", 1)
        src.line(f"{t} = {pid} % ({nm} * {nn})", 1)
        index = split_flat(src, bid, batch, 1) if batch else {}
        # grouped order: GROUP_M row blocks share each column block while it is in L2
        width, first, size, pm, pn = (src.fresh() for _ in range(5))
        src.line(f"{width} = {GROUP_M} * {nn}", 1)
        src.line(f"{first} = ({t} // {width}) * {GROUP_M}", 1)
        src.line(f"{size} = tl.minimum({nm} - {first}, {GROUP_M})", 1)
        src.line(f"{pm} = {first} + ({t} % {width}) % {size}", 1)
        src.line(f"{pn} = ({t} % {width}) // {size}", 1)
        rm, rn, acc = src.fresh(), src.fresh(), src.fresh()
        src.line(f"{rm} = {pm} * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)", 1)
        src.line(f"{rn} = {pn} * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)", 1)
        src.line(f"{acc} = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)", 1)
        m_ext, n_ext, k_ext = src.dim(self.rows()), src.dim(self.extent[c.n]), src.dim(self.extent[c.k])
        pa, pb = c.plain_a(), c.plain_b()
        self.direct_a = Direct(src, pa, index, [x for x in (c.m, c.k) if x is not None], self.extent) \
            if pa is not None else None
        self.direct_b = Direct(src, pb, index, [c.k, c.n], self.extent) if pb is not None else None
        k0, rk = src.fresh(), src.fresh()
        src.line(f"for {k0} in range(0, {k_ext}, BLOCK_K):", 1)
        src.line(f"{rk} = {k0} + tl.arange(0, BLOCK_K).to(tl.int64)", 2)
        a_index = dict(index) | {c.k: f"{rk}[None, :]"}
        b_index = dict(index) | {c.k: f"{rk}[:, None]", c.n: f"{rn}[None, :]"}
        if c.m is not None:
            a_index[c.m] = f"{rm}[:, None]"
        ma, mb = src.fresh(), src.fresh()
        src.line(f"{ma} = ({rm}[:, None] < {m_ext}) & ({rk}[None, :] < {k_ext})", 2)
        src.line(f"{mb} = ({rk}[:, None] < {k_ext}) & ({rn}[None, :] < {n_ext})", 2)
        half = self.half_operands()
        a = self.operand(c.a, self.direct_a, "[BLOCK_M, BLOCK_K]", a_index, ma, half)
        b = self.operand(c.b, self.direct_b, "[BLOCK_K, BLOCK_N]", b_index, mb, half)
        precision = "" if half is not None else ', input_precision="ieee"'
        src.line(f"{acc} = tl.dot({a}, {b}, {acc}{precision})", 2)
        self.finish(acc, index | {c.n: f"{rn}[None, :]"} | ({c.m: f"{rm}[:, None]"} if c.m is not None else {}),
                    f"({rm}[:, None] < {m_ext}) & ({rn}[None, :] < {n_ext})")
        text = function_text(src, self.entry, self.buffers(), list(self.blocks))
        if half is not None:
            text = f"{WIDE_DOT_LINE}\n\n\n{text}"
        launch = LaunchSpec(self.entry, None, tuple(self.buffers()), "1" if src.err is not None else None,
                            (dim_str(total),),
                            launch_options(self.plan, self.blocks, warps=self.warps, entry=self.entry),
                            fixed=self.fixed)
        return text, launch

    def operand(self, e: ir.SExpr, direct: Direct | None, shape: str, index: dict[str, str], mask: str,
                half: DType | None) -> str:
        """One side's block: a plain load read directly (as stored for 16-bit ``tl.dot``, else in f32), or
        its prologue expression in f32, 0 off the mask."""
        if direct is not None:
            at = {a: index[a] for a in direct.stride}
            if half is None:
                return direct.f32(at, mask, 2)
            raw = direct.block(at, mask, 2)
            self.src.line(f"if {WIDE_DOT}:", 2)  # Triton's interpreter multiplies 16-bit blocks wrongly
            self.src.line(f"{raw} = {raw}.to(tl.float32)", 3)
            return raw
        em = ValueEmitter(self.src, shape, index, mask, 2, {}, self.extent)
        return em.let(f"tl.where({mask}, {em.expr(e)}, 0.0)")  # a prologue may not map 0 to 0 (exp, x + 1)

    def finish(self, acc: str, index: dict[str, str], mask: str) -> None:
        """The epilogue on the finished block, stored in the result's dtype."""
        c, src = self.c, self.src
        out = self.d.op
        value = acc
        extent = dict(self.extent)
        if c.epilogue is not None:
            names = dict(zip([a.name for a in c.epilogue.axes], [a.name for a in self.contract.axes]))
            index = {**index, **{mine: index[theirs] for mine, theirs in names.items() if theirs in index}}
            extent |= {a.name: a.extent for a in c.epilogue.axes}
        if self.contract.dtype in HALF:  # the sum as its dtype stores it (the epilogue reads that)
            # rounded as expressions round it: a plain .to(tl.bfloat16) truncates in Triton's interpreter
            rounding = ValueEmitter(src, "[BLOCK_M, BLOCK_N]", index, mask, 1, {}, extent)
            value = rounding.rounded(acc, self.contract.dtype)
        em = ValueEmitter(src, "[BLOCK_M, BLOCK_N]", index, mask, 1, {c.result: value}, extent)
        if c.epilogue is not None:
            value = em.expr(c.epilogue.body)
        elif self.contract.dtype not in (DType.F32, *HALF):
            value = em.let(f"{value}.to({COMPUTE[self.contract.dtype]})")
        em.store(src.buffer(out.result), [ir.Idx(a.name) for a in out.axes], value, out.dtype)

    def buffers(self) -> list[int]:
        c = self.c
        names = {x.src for e in (c.a, c.b) for x in ir.walk(e) if isinstance(x, ir.Load)}
        if c.epilogue is not None:
            names |= {x.src for x in ir.walk(c.epilogue.body) if isinstance(x, ir.Load) and x.src != c.result}
        names.add(self.d.op.result)
        return sorted(self.plan.buffer_index(n) for n in names)


__all__ = ["render_contraction"]
