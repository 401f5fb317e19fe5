"""A scan dispatch in CUDA C: one thread per row, each in sequence along the scanned index.

A row is a point of the op's other axes; neighbouring threads take neighbouring rows. Every row
combines its terms in the interpreter's order, one rounding per operation (NVRTC compiles with
``--fmad=false``: ``a * h + b`` is never one FMA), so the result is the interpreter's bits,
deterministic and linear in the size. This is the simple form: a long row
runs on one thread (a block-level scan with warp shuffles for few long rows is future work).
"""

from __future__ import annotations

import sympy

from arke.ir import semantic as ir
from arke.ir.shapes import Dim
from arke.targets.cuda.expr import COMPUTE, identity
from arke.targets.cuda.render import CudaFunction


class CudaScanFunction(CudaFunction):
    """Emits one scan dispatch as a ``__global__`` function (the signature of :class:`CudaFunction`)."""

    def render(self) -> str:
        op = self.op
        assert isinstance(op, ir.ScanOp)
        outer = [a.name for a in op.axes if a.name != op.axis]
        total: Dim = sympy.Integer(1)
        for a in outer:
            total = total * self.extent[a]
        self.parallel_extent = total
        self.emit("const long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;")
        self.emit(f"if (gid < {self.dim(total)}) {{")
        self.depth += 1
        rest = "gid"
        for a in reversed(outer[1:]):
            self.emit(f"const long long i_{a} = {rest} % {self.dim(self.extent[a])};")
            self.emit(f"const long long q_{a} = {rest} / {self.dim(self.extent[a])};")
            self.current[a], rest = f"i_{a}", f"q_{a}"
        if outer:
            self.current[outer[0]] = rest
        dtype, ct = op.dtype, COMPUTE[op.dtype]
        start = identity(op.kind, dtype) if op.init is None else self.x.value(op.init, dtype)
        self.emit(f"{ct} acc = {start};")
        out = self.buffer(op.result)
        n = op.axis
        self.emit(f"for (long long r_{n} = 0; r_{n} < {self.dim(self.extent[n])}; ++r_{n}) {{")
        self.depth += 1
        self.x.push()
        self.current[n] = f"r_{n}"
        x = self.x.value(op.body, dtype)
        where = self.offset(out, tuple(ir.Idx(a.name) for a in op.axes))
        store = f"b{self.plan.buffer_index(out.name)}[{where}] = {self.x.narrow('acc', out.dtype)};"
        if op.exclusive:
            self.emit(store)
        if op.kind == "linear":
            assert op.coeff is not None
            a = self.x.value(op.coeff, dtype)
            self.emit(f"acc = {a} * acc + {x};")  # NVRTC's --fmad=false: two roundings, as the interpreter
        else:
            self.emit(f"acc = {self.x.combine(op.kind, dtype, 'acc', x)};")
        if not op.exclusive:
            self.emit(store)
        self.x.pop()
        self.depth -= 1
        self.emit("}")
        self.depth -= 1
        self.emit("}")
        return self.text()


__all__ = ["CudaScanFunction"]
