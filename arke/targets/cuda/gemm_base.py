"""Shared pieces of the CUDA-C contraction kernels (:mod:`arke.targets.cuda.gemm`).

* :class:`GemmText` — one ``__global__`` function of a contraction dispatch: the ABI head
  (the buffers the dispatch touches in plan order, ``dims``, ``err``), dims hoisted to the top,
  scalar expressions through :class:`~arke.targets.cuda.expr.CExpr` (loads of the contraction's
  result read a value held in a register: the finished accumulator);
* :class:`Direct` — an operand that is a plain load, addressed as ``base + outer * so + k * sk``
  with ``base`` (the batch subscripts, checked once) computed per block;
* :func:`side_value` — one element of a side (plain load or prologue expression) in f32;
* :func:`store_result` — the epilogue on one finished element, rounded and stored;
* :func:`tile_origin` — a block's batch entry and output tile from ``blockIdx.x`` (grouped rows).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, row_major_stride
from arke.plan.contraction import Contraction
from arke.plan.dispatch import Dispatch, KernelPlan
from arke.targets.artifact import UnsupportedError
from arke.targets.cuda.expr import STORAGE, CExpr
from arke.targets.cuda.render import CudaFunction

#: Row blocks per L2 group: the blocks of one group walk the same column panels of ``B`` together.
GROUP_M = 8
HALF = frozenset({DType.BF16, DType.F16})
#: Shared memory one block may use (the lower of sm_80's 163 KB and sm_90's 227 KB, with room to spare:
#: one source serves both).
SMEM_LIMIT = 99 * 1024

#: Device helpers of the contraction kernels (guarded: a kernel may have several contraction dispatches).
GEMM_HELPERS = r"""
#ifndef AK_GEMM_HELPERS
#define AK_GEMM_HELPERS
#ifdef AK_HOST
static inline unsigned ak_gemm_ld32(const unsigned short* p) { unsigned v; memcpy(&v, p, 4); return v; }
#else
/* two neighbouring 16-bit elements of shared memory (4-byte aligned) as one register */
static __device__ __forceinline__ unsigned ak_gemm_ld32(const unsigned short* p) {
  return *reinterpret_cast<const unsigned*>(p);
}
#endif
/* a / b and a % b for a block index 0 <= a < 2**32 and b >= 1, in 32 bits (64-bit division is a call) */
static inline long long ak_gemm_div(long long a, long long b) {
  return b > 0xFFFFFFFFLL ? 0LL : (long long)((unsigned)a / (unsigned)b);
}
static inline long long ak_gemm_mod(long long a, long long b) {
  return b > 0xFFFFFFFFLL ? a : (long long)((unsigned)a % (unsigned)b);
}
#endif
"""


class GemmText(CudaFunction):
    """One ``__global__`` function of a contraction dispatch, ``threads`` threads per block."""

    def __init__(self, plan: KernelPlan, d: Dispatch, name: str, threads: int):
        # CudaFunction's state, set here: its constructor reads the op's loads as buffers, and an
        # epilogue's loads of the (internal) sum have none
        self.plan, self.d, self.name, self.op = plan, d, name, d.op
        self.lines: list[str] = []
        self.prologue: list[str] = []
        self.depth = 1
        self.dims: dict[str, str] = {}
        self.current: dict[str, str] = {}
        self.x = CExpr(self.emit, lambda a: self.current[a], lambda r: self.dim(r.dim), self.load)
        self.parallel_extent: Dim = sympy.Integer(1)
        if not isinstance(d.pattern, Contraction):
            raise UnsupportedError(f"{name}: a contraction dispatch needs its Contraction pattern")
        contract = d.members[0]
        if isinstance(contract, ir.MapOp):
            raise UnsupportedError(f"{name}: a contraction's first op must reduce")
        self.c: Contraction = d.pattern
        self.contract = contract
        self.threads = threads
        self.extent = {a.name: a.extent for a in (*contract.axes, *contract.reduce_axes)}
        if self.c.epilogue is not None:
            self.extent |= {a.name: a.extent for a in self.c.epilogue.axes}
        #: loads of these buffers read these raw (storage-typed) values instead of memory
        self.values: dict[str, str] = {}
        names = {x.src for e in (self.c.a, self.c.b) for x in ir.walk(e) if isinstance(x, ir.Load)}
        if self.c.epilogue is not None:
            names |= {x.src for x in ir.walk(self.c.epilogue.body)
                      if isinstance(x, ir.Load) and x.src != self.c.result}
        names.add(d.op.result)
        self.args = sorted(names, key=plan.buffer_index)

    def load(self, e: ir.Load) -> str:
        if e.src in self.values:
            return self.values[e.src]
        return super().load(e)

    def ptr(self, name: str) -> str:
        return f"b{self.plan.buffer_index(name)}"

    def ext(self, axis: str) -> str:
        """The C value of an axis's extent."""
        return self.dim(self.extent[axis])

    @contextmanager
    def at(self, index: dict[str, str]) -> Iterator[None]:
        """Axes bound to these C values (and a fresh scope of values) while inside."""
        saved = dict(self.current)
        self.current.update(index)
        self.x.push()
        try:
            yield
        finally:
            self.x.pop()
            self.current = saved

    def text(self) -> str:
        params = []
        out = self.d.op.result
        for b in self.args:
            buf = self.buffer(b)
            const = "" if b == out else "const "
            params.append(f"{const}{STORAGE[buf.dtype]}* __restrict__ b{self.plan.buffer_index(b)}")
        params += ["const long long* __restrict__ dims", "long long* __restrict__ err"]
        head = f'extern "C" __global__ void __launch_bounds__({self.threads}) {self.name}({", ".join(params)}) {{'
        tail = ["  if (ak_err) *err = 1; /* every failing thread stores the same value: no atomic */", "}"]
        return "\n".join([head, "  bool ak_err = false;", *self.prologue, *self.lines, *tail])


def f32_of(raw: str, dtype: DType) -> str:
    """A stored operand element as the interpreter converts it to f32."""
    if dtype is DType.BF16:
        return f"ak_bf16_to_f32({raw})"
    if dtype is DType.F16:
        return f"ak_f16_to_f32({raw})"
    if dtype is DType.F32:
        return raw
    return f"(float)({raw})"


def _c_mul(a: str, b: str) -> str:
    return a if b == "1LL" else f"{a} * {b}"


class Direct:
    """A side that is a plain load, read in place: ``ptr[base + outer * so + k * sk]``.

    ``base`` holds every other subscript (batch axes, GQA's ``h / R``: checked, once per block)
    and is computed where the object is made, so the batch axes must be bound by then.
    ``contig`` is the axis (``outer`` or ``k``) whose stride is 1, if one is.
    """

    def __init__(self, g: GemmText, load: ir.Load, outer: str | None, k: str):
        buf = g.buffer(load.src)
        self.g, self.load, self.dtype, self.ptr = g, load, buf.dtype, g.ptr(load.src)
        self.outer, self.k = outer, k
        axes = [a for a in (outer, k) if a is not None]
        pos = {a: list(load.indices).index(ir.Idx(a)) for a in axes}
        self.stride = {a: g.dim(row_major_stride(buf.shape, p)) for a, p in pos.items()}
        if all(p in pos.values() or (isinstance(s, ir.Const) and int(s.value) == 0)
               for p, s in enumerate(load.indices)):
            self.base = "0LL"  # no other subscripts
        else:
            with g.at({a: "0LL" for a in axes}):
                self.base = g.x.let("long long", g.offset(buf, load.indices))
        last = load.indices[-1] if load.indices else None
        self.contig = last.name if isinstance(last, ir.Idx) and last.name in pos else None

    def address(self, outer: str | None, k: str) -> str:
        """The element offset of (outer, k) from the buffer's start."""
        terms = [] if self.base == "0LL" else [self.base]
        if self.outer is not None and outer is not None:
            terms.append(_c_mul(f"({outer})", self.stride[self.outer]))
        terms.append(_c_mul(f"({k})", self.stride[self.k]))
        return " + ".join(terms)

    def raw(self, outer: str | None, k: str) -> str:
        return f"{self.ptr}[{self.address(outer, k)}]"

    def f32(self, outer: str | None, k: str) -> str:
        return f32_of(self.raw(outer, k), self.dtype)


def plain_side(c: Contraction, side: str) -> ir.Load | None:
    """The plain load of side ``a`` or ``b``, if it is one."""
    return c.plain_a() if side == "a" else c.plain_b()


def side_value(g: GemmText, side: str, direct: Direct | None, outer: str | None, k: str) -> str:
    """One element of side ``a`` (outer = the row) or ``b`` (outer = the column) in f32: a C expression
    or variable. The caller guards it to in-range elements (a prologue may read through its subscripts)."""
    if direct is not None:
        return direct.f32(outer, k)
    c = g.c
    index = {c.k: k}
    axis = c.m if side == "a" else c.n
    if axis is not None and outer is not None:
        index[axis] = outer
    with g.at(index):
        return g.x.value(c.a if side == "a" else c.b, DType.F32)


def n_contiguous(c: Contraction) -> bool:
    """Whether every load of side ``b`` that reads the column axis has it as its last subscript
    (neighbouring columns are neighbouring elements: a thread per column reads coalesced)."""
    loads = [x for x in ir.walk(c.b) if isinstance(x, ir.Load)
             and any(isinstance(y, ir.Idx) and y.name == c.n for s in x.indices for y in ir.walk(s))]
    return bool(loads) and all(x.indices and x.indices[-1] == ir.Idx(c.n) for x in loads)


def store_result(g: GemmText, acc: str, index: dict[str, str]) -> None:
    """The epilogue on the finished sum ``acc`` (f32) of the element at ``index`` (contraction axes ->
    C values), rounded to the output's dtype and stored. The caller guards it to in-range elements."""
    c, contract = g.c, g.contract
    at = dict(index)
    if c.epilogue is not None:
        at |= {mine.name: index[theirs.name] for mine, theirs in zip(c.epilogue.axes, contract.axes)
               if theirs.name in index}
    out_op = g.d.op
    out = g.buffer(out_op.result)
    with g.at(at):
        # the sum as its dtype stores it (a 16-bit sum is rounded before the epilogue reads it)
        raw = acc if contract.dtype is DType.F32 else g.x.narrow(acc, contract.dtype)
        if c.epilogue is not None:
            g.values[c.result] = raw
            value = g.x.value(c.epilogue.body)
            del g.values[c.result]
            stored = g.x.narrow(value, out.dtype)
        else:
            stored = raw
        where = g.offset(out, tuple(ir.Idx(a.name) for a in out_op.axes))
        g.emit(f"{g.ptr(out.name)}[{where}] = {stored};")


def split_batch(g: GemmText, flat: str, batch: Sequence[str]) -> None:
    """Bind the batch axes to their positions in the row-major flat index ``flat`` (below 2**32)."""
    rest = flat
    for k, a in enumerate(reversed(batch)):
        if k == len(batch) - 1:
            g.emit(f"const long long i_{a} = {rest};")
        else:
            g.emit(f"const long long i_{a} = ak_gemm_mod({rest}, {g.ext(a)});")
            g.emit(f"const long long q_{a} = ak_gemm_div({rest}, {g.ext(a)});")
            rest = f"q_{a}"
        g.current[a] = f"i_{a}"


def tile_origin(g: GemmText, n_m: Dim, n_n: Dim) -> tuple[str, str]:
    """The block's batch entry (bound as the batch axes) and its tile's (row block, column block):
    ``blockIdx.x`` = batch entry × tiles of the batch entry, the row blocks in groups of
    :data:`GROUP_M` (column-major inside a group) so that neighbouring blocks share ``B``'s panels."""
    nm, nn = g.dim(n_m), g.dim(n_n)
    g.emit("const long long pid = (long long)blockIdx.x;")
    g.emit(f"const long long tiles = {nm} * {nn};")
    g.emit("const long long tile = ak_gemm_mod(pid, tiles);")
    if g.c.batch:
        g.emit("const long long bid = ak_gemm_div(pid, tiles);")
        split_batch(g, "bid", g.c.batch)
    g.emit(f"const long long width = {GROUP_M}LL * {nn};")
    g.emit(f"const long long first = ak_gemm_div(tile, width) * {GROUP_M}LL;")
    g.emit(f"const long long gsize = {nm} - first < {GROUP_M}LL ? {nm} - first : {GROUP_M}LL;")
    g.emit("const long long within = ak_gemm_mod(tile, width);")
    g.emit("const long long pm = first + ak_gemm_mod(within, gsize);")
    g.emit("const long long pn = ak_gemm_div(within, gsize);")
    return "pm", "pn"


def batch_count(g: GemmText) -> Dim:
    out: Dim = sympy.Integer(1)
    for a in g.c.batch:
        out = out * g.extent[a]
    return out


__all__ = ["GEMM_HELPERS", "GROUP_M", "HALF", "SMEM_LIMIT", "Direct", "GemmText", "batch_count",
           "f32_of", "n_contiguous", "side_value", "split_batch", "store_result", "tile_origin"]
