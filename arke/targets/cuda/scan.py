"""A scan dispatch in CUDA C: one block per row, the row's scanned axis split over the block's threads.

A row is a point of the op's other axes (``blockIdx.x``, decomposed row-major). The scanned axis
is walked in chunks of :data:`~arke.targets.nvidia.simt.BLOCK` positions, one per thread:

1. each thread evaluates the body (and a recurrence's coefficient) at its position (an exclusive
   scan reads one position back; the identity, or the pair ``(1, 0)``, outside the row);
2. an inclusive warp scan with ``__shfl_up_sync`` (5 steps, the earlier part first);
3. each warp's total goes to shared memory; after a ``__syncthreads`` every thread combines the
   totals of the warps before its own, in warp order, then the carry of the chunks before;
4. the thread stores its position, and every thread folds all warp totals, in order, into the
   carry (all compute the same value, so no second exchange is needed).

The recurrence ``h = a · h + b`` scans the pairs ``(a, b)`` composed as
``(a₁, b₁) ∘ (a₂, b₂) = (a₂·a₁, a₂·b₁ + b₂)`` (``b`` is then ``a₂·h + b₂`` when ``b₁ = h``).
``cummax``/``cummin`` (NaN wins, whichever side it is on) and integer scans are exact in any
order: the interpreter's bits. Float sums, products and recurrences are reassociated within a
chunk (spec/language.md §8.9 allows it, within the one tolerance rule); the order depends only on
the block size, never on the GPU. NVRTC compiles with ``--fmad=false``: ``a * h + b`` is two
roundings. Every thread reaches every shuffle and ``__syncthreads`` the same number of times.
"""

from __future__ import annotations

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim
from arke.targets.cuda.expr import COMPUTE, identity
from arke.targets.cuda.render import CudaFunction
from arke.targets.nvidia.simt import BLOCK

WARPS = BLOCK // 32


def _shuffled(dtype: DType) -> str:
    """The type a value crosses ``__shfl_up_sync`` in (CUDA shuffles 32- and 64-bit words only)."""
    if dtype.is_float:
        return "float"
    return "long long" if COMPUTE[dtype] in ("long long", "unsigned int") else "int"


class CudaScanFunction(CudaFunction):
    """Emits one scan dispatch as a ``__global__`` function (the signature of :class:`CudaFunction`)."""

    def render(self) -> str:
        op = self.op
        assert isinstance(op, ir.ScanOp)
        outer = [a.name for a in op.axes if a.name != op.axis]
        rows: Dim = sympy.Integer(1)
        for a in outer:
            rows = rows * self.extent[a]
        self.parallel_extent = rows * BLOCK  # one block of BLOCK threads per row
        dtype, ct = op.dtype, COMPUTE[op.dtype]
        linear = op.kind == "linear"
        kind = "sum" if linear else op.kind
        self.emit("const long long row = (long long)blockIdx.x;")
        self.emit("const int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32;")
        rest = "row"
        for a in reversed(outer[1:]):
            self.emit(f"const long long i_{a} = {rest} % {self.dim(self.extent[a])};")
            self.emit(f"const long long q_{a} = {rest} / {self.dim(self.extent[a])};")
            self.current[a], rest = f"i_{a}", f"q_{a}"
        if outer:
            self.current[outer[0]] = rest
        zero, one = identity("sum", dtype), identity("prod", dtype)
        start = identity(kind, dtype) if op.init is None else self.x.value(op.init, dtype)
        self.emit(f"__shared__ {ct} ak_sb[{WARPS}];")
        if linear:
            self.emit(f"__shared__ {ct} ak_sa[{WARPS}];")
        self.emit(f"{ct} carry = {start};")
        out = self.buffer(op.result)
        n, extent = op.axis, self.dim(self.extent[op.axis])
        self.emit(f"for (long long base = 0; base < {extent}; base += {BLOCK}) {{")
        self.depth += 1
        self.emit("const long long p = base + tid;")
        self.emit(f"const long long q = p{' - 1' if op.exclusive else ''};")
        self.emit(f"{ct} vb = {zero if linear else identity(kind, dtype)};")
        if linear:
            self.emit(f"{ct} va = {one};")
        self.emit(f"if (q >= 0 && q < {extent}) {{")
        self.depth += 1
        self.x.push()
        self.current[n] = "q"
        self.emit(f"vb = {self.x.value(op.body, dtype)};")
        if linear:
            assert op.coeff is not None
            self.emit(f"va = {self.x.value(op.coeff, dtype)};")
        self.x.pop()
        self.depth -= 1
        self.emit("}")
        st = _shuffled(dtype)
        self.emit("for (int d = 1; d < 32; d <<= 1) {")  # the warp's inclusive scan
        self.depth += 1
        self.emit(f"const {ct} yb = ({ct})__shfl_up_sync(0xffffffffu, ({st})vb, d);")
        if linear:
            self.emit(f"const {ct} ya = ({ct})__shfl_up_sync(0xffffffffu, ({st})va, d);")
            self.emit("if (lane >= d) { vb = va * yb + vb; va = va * ya; }")
        else:
            self.emit(f"if (lane >= d) vb = {self.x.combine(kind, dtype, 'yb', 'vb')};")
        self.depth -= 1
        self.emit("}")
        self.emit("if (lane == 31) {" + (" ak_sa[warp] = va;" if linear else "") + " ak_sb[warp] = vb; }")
        self.emit("__syncthreads();")
        # the warps before this one, then the chunks before: pb (pa) is their composition
        self.emit(f"{ct} pb = {zero if linear else identity(kind, dtype)};")
        if linear:
            self.emit(f"{ct} pa = {one};")
        self.emit(f"for (int w = 0; w < {WARPS}; ++w) {{")
        self.depth += 1
        if linear:
            self.emit("if (w < warp) { pb = ak_sa[w] * pb + ak_sb[w]; pa = ak_sa[w] * pa; }")
        else:
            self.emit(f"if (w < warp) pb = {self.x.combine(kind, dtype, 'pb', 'ak_sb[w]')};")
        self.depth -= 1
        self.emit("}")
        if linear:
            self.emit("const " + ct + " h = va * (pa * carry + pb) + vb;")
        else:
            self.emit(f"const {ct} before = {self.x.combine(kind, dtype, 'carry', 'pb')};")
            self.emit(f"const {ct} h = {self.x.combine(kind, dtype, 'before', 'vb')};")
        self.x.push()
        self.current[n] = "p"
        self.emit(f"if (p < {extent}) {{")
        self.depth += 1
        where = self.offset(out, tuple(ir.Idx(a.name) for a in op.axes))
        self.emit(f"b{self.plan.buffer_index(out.name)}[{where}] = {self.x.narrow('h', out.dtype)};")
        self.depth -= 1
        self.emit("}")
        self.x.pop()
        self.emit(f"for (int w = 0; w < {WARPS}; ++w) {{")  # every thread: the carry past this chunk
        self.depth += 1
        if linear:
            self.emit("carry = ak_sa[w] * carry + ak_sb[w];")
        else:
            self.emit(f"carry = {self.x.combine(kind, dtype, 'carry', 'ak_sb[w]')};")
        self.depth -= 1
        self.emit("}")
        self.emit("__syncthreads();  /* the totals are read before the next chunk writes them */")
        self.depth -= 1
        self.emit("}")
        return self.text()


__all__ = ["CudaScanFunction"]
