"""The GPU flavour of the LLVM target: LLVM IR for NVIDIA GPUs (NVPTX), one kernel per op.

Each dispatch becomes ``define ptx_kernel void @<kernel>_d<k>(ptr addrspace(1) %g0, ...,
ptr addrspace(1) %gdims, ptr addrspace(1) %gerr)``: the buffers it touches (in plan order,
global memory), the kernel's dim values and an error word. Plans for this flavour group no
families (``families`` is empty), so every op is its own dispatch. A launch runs at least
``parallel_extent`` threads (a 1-D grid of ``BLOCK``-thread blocks, the launch shape
:mod:`arke.targets.nvidia.simt` gives every SIMT GPU renderer); thread
``ctaid.x * ntid.x + tid.x`` computes one element of the op's result, flattened row-major
over its axes: a map's value, or a reduction's (a norm's statistics, a softmax's sums, a
SIMT contraction's dot product) by a loop over the reduce axes in a fixed order, so a result
never depends on the launch shape.

Expressions, subscripts and checks are :class:`arke.targets.llvm.function.LLVMFunction`'s: the
global pointers are cast to generic ones once in the entry block (NVPTX's address-space
inference turns the accesses back into ``ld.global``/``st.global``), 16-bit floats stay i16
bits converted in integer code, and the float functions NVPTX cannot lower without libdevice
(log, sin, tanh ...) come from :mod:`arke.targets.llvm.nvptx_math`. A bad subscript or an
integer division by zero clamps as on the CPU and stores 1 in the error word (every thread
that fails stores the same value, so no atomic is needed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.plan.dispatch import Dispatch, KernelPlan
from arke.targets.artifact import Artifact
from arke.targets.llvm.declarations import Declarations
from arke.targets.llvm.function import LLVMFunction
from arke.targets.llvm.lib import float_const
from arke.targets.llvm.nvptx_math import FUNCTIONS, nvptx_math
from arke.targets.llvm.scalar import FLOAT_INTRINSIC
from arke.targets.llvm.scan import ScanFunction
from arke.targets.nvidia.simt import BLOCK, SIMTRenderer, element_count, per_element_kernels

TRIPLE = "nvptx64-nvidia-cuda"
_SREG = ("tid", "ctaid", "ntid")


class NVPTXFunction(LLVMFunction):
    """Emits one dispatch as a PTX kernel: one thread per element of the result."""

    def __init__(self, plan: KernelPlan, dispatch: Dispatch, name: str, declare: Callable[[str], None]):
        super().__init__(plan, dispatch, name, declare, vector_bits=32)

    def render(self) -> str:
        assert not isinstance(self.op, ir.ScanOp), "a scan is NVPTXScanFunction's"
        axes = [a.name for a in self.op.axes]
        total = self.parallel_extent = element_count(self.op)
        self.thread_id()
        n = self.dim(total)
        inside = self.let(f"icmp slt i64 %gid, {n}")

        def element() -> None:
            rest = "%gid"  # row-major: the last axis varies fastest between neighbouring threads
            for a in reversed(axes[1:]):
                size = self.dim(self.extent[a])
                self.current[a] = self.let(f"urem i64 {rest}, {size}")
                rest = self.let(f"udiv i64 {rest}, {size}")
            if axes:
                self.current[axes[0]] = rest
            self.element()

        self.branch(inside, element)
        return self.text()

    def thread_id(self) -> None:
        """Start the error flag and compute ``%gid``, the thread's number in the grid."""
        self.start_error_flag()
        for s in _SREG:
            self.declare(f"declare i32 @llvm.nvvm.read.ptx.sreg.{s}.x()")
            self.prologue.append(f"  %{s}32 = call i32 @llvm.nvvm.read.ptx.sreg.{s}.x()")
            self.prologue.append(f"  %{s} = zext i32 %{s}32 to i64")
        self.prologue.append("  %gbase = mul i64 %ctaid, %ntid")
        self.prologue.append("  %gid = add i64 %gbase, %tid")

    def text(self) -> str:
        params = ", ".join(f"ptr addrspace(1) noalias %g{self.ptr[b][2:]}" for b in self.args)
        head = (f"define ptx_kernel void @\"{self.name}\"({params}{', ' if params else ''}"
                "ptr addrspace(1) noalias %gdims, ptr addrspace(1) noalias %gerr) {")
        casts = [f"  {self.ptr[b]} = addrspacecast ptr addrspace(1) %g{self.ptr[b][2:]} to ptr" for b in self.args]
        casts.append("  %dims = addrspacecast ptr addrspace(1) %gdims to ptr")
        tail = ["  %ef = load i1, ptr %errflag", "  br i1 %ef, label %raise, label %done", "raise:",
                "  store i64 1, ptr addrspace(1) %gerr", "  br label %done", "done:", "  ret void", "}"]
        return "\n".join([head, "entry:", *casts, *self.prologue, "  br label %start", "start:", *self.body, *tail])

    # one thread per element: no vector accumulators, no rows of scratch, no loop hints
    def in_lanes(self, dtype: DType, names: Sequence[str]) -> bool:
        return False

    def rows_axis(self) -> str | None:
        return None

    def loop_hints(self, axis: str, number: int) -> str:
        return ""

    # -- float math NVPTX cannot lower by itself
    def call_math(self, op: str, *args: str) -> str:
        """A call of :func:`~arke.targets.llvm.nvptx_math.nvptx_math`'s ``op`` on float ``args``."""
        name, defs = nvptx_math(op)
        for d in defs:
            self.declare(d)
        return self.let(f"call float @{name}({', '.join(f'float {a}' for a in args)})")

    def expr_f(self, op: str, x: str) -> str:
        if op == "exp" or op in FUNCTIONS:
            return self.call_math(op, x)
        return super().expr_f(op, x)

    def _x_Unary(self, e: ir.Unary) -> str:
        if e.dtype.is_float and (e.op in FUNCTIONS or e.op == "gelu"):
            x = self.expr(e.x)
            if e.op != "gelu":
                return self.call_math(e.op, x)
            s = self.let(f"fmul float {x}, {float_const(math.sqrt(0.5))}")  # x / sqrt(2), as the CPU form does
            er = self.call_math("erf", s)
            one = self.let(f"fadd float 1.0, {er}")
            h = self.let(f"fmul float {x}, 0x3FE0000000000000")
            return self.let(f"fmul float {h}, {one}")
        return super()._x_Unary(e)

    def float_binary(self, op: str, a: str, b: str) -> str:
        if op == "pow":
            return self.call_math("pow", a, b)
        return super().float_binary(op, a, b)


# every FLOAT_INTRINSIC NVPTX cannot lower is written out in llvm_nvptx_math
assert {"log", "log2", "sin", "cos"} <= set(FUNCTIONS) and {"log", "log2", "sin", "cos"} <= set(FLOAT_INTRINSIC)


class NVPTXScanFunction(NVPTXFunction, ScanFunction):
    """Emits one scan dispatch as a PTX kernel: one thread per row, the row scanned in sequence.

    A row is a point of the scan's other axes (the thread's number, decomposed row-major); the
    thread walks the scanned axis from position 0 with :class:`~arke.targets.llvm.scan.ScanFunction`'s
    step (one rounding per operation, no fused multiply-add), so every row is the interpreter's
    own sequence of operations and the results do not depend on the launch shape. Linear in the
    size; neighbouring threads hold neighbouring rows, so a scan along an earlier axis reads
    coalesced columns.
    """

    def render(self) -> str:
        op = self.op
        assert isinstance(op, ir.ScanOp)
        outer = [a.name for a in op.axes if a.name != op.axis]
        total = sympy.Integer(1)
        for a in outer:
            total = total * self.extent[a]
        self.parallel_extent = total
        self.thread_id()
        inside = self.let(f"icmp slt i64 %gid, {self.dim(total)}")
        self.branch(inside, lambda: self.rows([self.unflatten(outer, "%gid") if outer else {}]))
        return NVPTXFunction.text(self)


def _function(plan: KernelPlan, d: Dispatch, name: str, declare: Callable[[str], None]) -> NVPTXFunction:
    """A dispatch's emitter: a scan's own (one thread per row), else one thread per element."""
    if isinstance(d.op, ir.ScanOp):
        return NVPTXScanFunction(plan, d, name, declare)
    return NVPTXFunction(plan, d, name, declare)


class NVPTXRenderer(SIMTRenderer):
    """Renders a kernel plan to an LLVM IR module for NVIDIA GPUs (``nvptx64-nvidia-cuda``)."""

    name = "llvm-nvptx"

    def render(self, plan: KernelPlan) -> Artifact:
        declare = Declarations()  # one line per symbol in the module

        functions, launches = per_element_kernels(
            plan, "NVPTXRenderer", lambda d, name: _function(plan, d, name, declare))
        source = "\n\n".join([f"; arke kernel {plan.name} (NVPTX)", f'target triple = "{TRIPLE}"',
                              *declare.lines(), *functions]) + "\n"
        return Artifact("llvm-nvptx", source, tuple(launches), {"block": str(BLOCK), "triple": TRIPLE})


RENDERER = NVPTXRenderer()
