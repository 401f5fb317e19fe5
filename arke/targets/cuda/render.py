"""The CUDA-C target: one ``extern "C" __global__`` function per op, compiled by NVRTC (no GPU needed).

This is the SIMT base every kernel family compiles through (tensor cores, shared-memory tiles
and flash attention build on it later). It follows the LLVM target's NVPTX flavour
(:mod:`arke.targets.llvm.nvptx`) exactly: plans are made with ``families=frozenset()`` so every
op is its own dispatch ``<kernel>_d<k>(b.., dims, err)`` (the buffers it touches in plan order,
the kernel's dim values, an error word); thread ``blockIdx.x * blockDim.x + threadIdx.x``
computes one element of the op's result, flattened row-major, a reduction by a loop over the
reduce axes in a fixed order; a bad subscript or an integer division by zero clamps as on the
CPU and stores 1 in the error word. Expressions are :mod:`arke.targets.cuda.expr`'s.

NVRTC compiles with ``--fmad=false``: the interpreter rounds every product before it is added,
and a contracted ``a * b + c`` would not.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, dim_str
from arke.plan.dispatch import Buffer, Dispatch, KernelPlan
from arke.plan.exprs import as_dtype, floor_fraction, loads_in
from arke.targets.artifact import Artifact, LaunchSpec, UnsupportedError
from arke.targets.cuda.expr import COMPUTE, CONVERT, HELPERS, STORAGE, TRIG, CExpr, identity
from arke.targets.cuda.warp import WARP
from arke.targets.nvidia.simt import BLOCK, SIMTRenderer, element_count, entry_name, per_element_kernels

#: What every translation unit starts with (NVRTC here has no CUDA headers: nothing is included).
PRELUDE = CONVERT + HELPERS + TRIG + WARP


class CText:
    """What every CUDA-C function emitter shares: lines at a depth, C blocks whose values
    :class:`~arke.targets.cuda.expr.CExpr` forgets when they close, buffers, and dims computed once
    at the top of the function. Subclasses set ``plan``, ``lines``, ``prologue``, ``depth``,
    ``dims`` and ``x``."""

    plan: KernelPlan
    lines: list[str]
    prologue: list[str]
    depth: int
    dims: dict[str, str]
    x: CExpr

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)

    @contextmanager
    def block(self, head: str) -> Iterator[None]:
        """``head {`` ... ``}``: values computed inside are not reused after it."""
        self.emit(f"{head} {{")
        self.depth += 1
        self.x.push()
        try:
            yield
        finally:
            self.x.pop()
            self.depth -= 1
            self.emit("}")

    def buffer(self, name: str) -> Buffer:
        return self.plan.buffers[self.plan.buffer_index(name)]

    # -- dims: ``long long`` constants at the top of the function
    def dim(self, d: Dim) -> str:
        """The C name (or literal) of dim expression ``d``."""
        d = sympy.sympify(d)
        if d.is_Integer:
            return f"{int(d)}LL"
        key = dim_str(d)
        if key not in self.dims:
            text = self._dim(d)
            name = f"dim{len(self.dims)}"
            self.prologue.append(f"  const long long {name} = {text};")
            self.dims[key] = name
        return self.dims[key]

    def _dim(self, d: sympy.Expr) -> str:
        if d.is_Symbol:
            if d.name not in self.plan.dims:
                raise UnsupportedError(f"dim {d.name} is not bound by a parameter of `{self.plan.name}`")
            return f"dims[{self.plan.dims.index(d.name)}]"
        if d.is_Add or d.is_Mul:
            if any(a.is_Rational and not a.is_Integer for a in d.args):
                raise UnsupportedError(f"dim {dim_str(d)} is not an integer expression")
            return f" {'+' if d.is_Add else '*'} ".join(self.dim(a) for a in d.args)
        if isinstance(d, sympy.floor):  # dims are positive; numerators may not be: floor, not truncation
            num, den = floor_fraction(d.args[0])
            return f"ak_fdiv_dim({self.dim(num)}, {self.dim(den)})"
        if isinstance(d, sympy.Mod):
            return f"ak_mod_dim({self.dim(d.args[0])}, {self.dim(d.args[1])})"
        if d.is_Pow and d.exp.is_Integer and int(d.exp) > 0:
            return " * ".join([self.dim(d.base)] * int(d.exp))
        raise UnsupportedError(f"dim {dim_str(d)} cannot be computed on this target")


class CudaFunction(CText):
    """Emits one dispatch as a ``__global__`` function: one thread per element of the result."""

    def __init__(self, plan: KernelPlan, dispatch: Dispatch, name: str):
        self.plan, self.d, self.name = plan, dispatch, name
        self.op = dispatch.op
        self.lines: list[str] = []
        self.prologue: list[str] = []
        self.depth = 1
        self.dims: dict[str, str] = {}
        self.current: dict[str, str] = {}
        self.extent: dict[str, Dim] = {a.name: a.extent for a in self.op.axes}
        if isinstance(self.op, ir.ReduceOp | ir.ContractOp):
            self.extent.update({a.name: a.extent for a in self.op.reduce_axes})
        exprs = ([self.op.lhs, self.op.rhs] if isinstance(self.op, ir.ContractOp) else
                 list(self.op.exprs) if isinstance(self.op, ir.ScanOp) else [self.op.body])
        used = {self.op.result} | {x.src for e in exprs for x in loads_in(e)}
        self.args = sorted(used, key=plan.buffer_index)
        self.x = CExpr(self.emit, lambda a: self.current[a], lambda r: self.dim(r.dim), self.load)
        self.parallel_extent: Dim = sympy.Integer(1)

    # -- memory
    def offset(self, buf: Buffer, subs: tuple[ir.SExpr, ...]) -> str:
        """The row-major element offset of ``subs`` in ``buf``, each subscript checked unless plainly in range."""
        offset = "0LL"
        for k, (s, extent) in enumerate(zip(subs, buf.shape)):
            v = self.x.value(s, DType.I64)
            plain = isinstance(s, ir.Idx) and s.name in self.extent and \
                sympy.sympify(self.extent[s.name]) == sympy.sympify(extent)
            if not plain and not (isinstance(s, ir.Const) and int(s.value) == 0):  # 0: a broadcast axis
                v = self.x.let("long long", f"ak_check({v}, {self.dim(extent)}, &ak_err)")
            offset = v if k == 0 else self.x.let("long long", f"{offset} * {self.dim(extent)} + {v}")
        return offset

    def load(self, e: ir.Load) -> str:
        buf = self.buffer(e.src)
        return self.x.let(STORAGE[buf.dtype], f"b{self.plan.buffer_index(buf.name)}[{self.offset(buf, e.indices)}]")

    # -- the function
    def render(self) -> str:
        assert not isinstance(self.op, ir.ScanOp), "a scan is scan.py's CudaScanFunction"
        axes = [a.name for a in self.op.axes]
        total = self.parallel_extent = element_count(self.op)
        self.emit("const long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;")
        self.emit(f"if (gid < {self.dim(total)}) {{")
        self.depth += 1
        rest = "gid"  # row-major: the last axis varies fastest between neighbouring threads
        for a in reversed(axes[1:]):
            self.emit(f"const long long i_{a} = {rest} % {self.dim(self.extent[a])};")
            self.emit(f"const long long q_{a} = {rest} / {self.dim(self.extent[a])};")
            self.current[a], rest = f"i_{a}", f"q_{a}"
        if axes:
            self.current[axes[0]] = rest
        value = self.x.value(self.op.body) if isinstance(self.op, ir.MapOp) else self.reduction(self.op)
        out = self.buffer(self.op.result)
        where = self.offset(out, tuple(ir.Idx(a) for a in axes))
        self.emit(f"b{self.plan.buffer_index(out.name)}[{where}] = {self.x.narrow(value, out.dtype)};")
        self.depth -= 1
        self.emit("}")
        return self.text()

    def reduction(self, op: ir.ReduceOp | ir.ContractOp) -> str:
        """One element of a reduction, its terms combined in the order of the reduce axes."""
        dtype = op.dtype
        kind = op.kind if isinstance(op, ir.ReduceOp) else "sum"
        body: ir.SExpr = (ir.Binary("mul", as_dtype(op.lhs, dtype), as_dtype(op.rhs, dtype), dtype)
                          if isinstance(op, ir.ContractOp) else op.body)
        acc = f"acc_{op.result.lstrip('%')}"
        self.emit(f"{COMPUTE[dtype]} {acc} = {identity(kind, dtype)};")

        def step() -> None:
            term = self.x.value(body, dtype)
            self.emit(f"{acc} = {self.x.combine(kind, dtype, acc, term)};")

        self.nest([a.name for a in op.reduce_axes], step)
        return acc

    def nest(self, axes: list[str], inner: Callable[[], None]) -> None:
        """Loops over ``axes`` (outermost first) around ``inner``."""
        if not axes:
            inner()
            return
        a = axes[0]
        self.emit(f"for (long long r_{a} = 0; r_{a} < {self.dim(self.extent[a])}; ++r_{a}) {{")
        self.depth += 1
        self.x.push()
        self.current[a] = f"r_{a}"
        self.nest(axes[1:], inner)
        self.x.pop()
        self.depth -= 1
        self.emit("}")

    def text(self) -> str:
        params = []
        for b in self.args:
            buf = self.buffer(b)
            const = "" if b == self.op.result else "const "
            params.append(f"{const}{STORAGE[buf.dtype]}* __restrict__ b{self.plan.buffer_index(b)}")
        params += ["const long long* __restrict__ dims", "long long* __restrict__ err"]
        head = f'extern "C" __global__ void __launch_bounds__({BLOCK}) {self.name}({", ".join(params)}) {{'
        tail = ["  if (ak_err) *err = 1; /* every failing thread stores the same value: no atomic */", "}"]
        return "\n".join([head, "  bool ak_err = false;", *self.prologue, *self.lines, *tail])


#: The block-cooperative families and where each is rendered: ``(module, function)``; the function
#: takes ``(plan, dispatch, entry)`` and returns the dispatch's text and its launch (or launches).
FAMILY_RENDERERS = {
    "rows": ("arke.targets.cuda.rows", "render_rows"),
    "contraction": ("arke.targets.cuda.gemm", "render_contraction"),
    "attention": ("arke.targets.cuda.attention", "render_attention"),
}


class CudaRenderer(SIMTRenderer):
    """Renders a kernel plan to CUDA C (one translation unit per kernel, one entry per dispatch).

    ``families``: the fused families plans for it group (each rendered by its module in
    :data:`FAMILY_RENDERERS`); every other dispatch is one op, one thread per result element.
    """

    name = "cuda"

    def __init__(self, families: frozenset[str] = frozenset()):
        unknown = families - set(FAMILY_RENDERERS)
        if unknown:
            raise ValueError(f"the cuda target has no renderer for the families {sorted(unknown)}")
        self.families = families

    def render(self, plan: KernelPlan) -> Artifact:
        functions: list[str] = []
        launches: list[LaunchSpec] = []
        for k, d in enumerate(plan.dispatches):
            entry = entry_name(plan.name, k)
            if d.family in self.families and (d.pattern is not None or len(d.members) > 1):
                module, function = FAMILY_RENDERERS[d.family]
                text, made = getattr(importlib.import_module(module), function)(plan, d, entry)
                functions.append(text)
                launches.extend(made if isinstance(made, list | tuple) else [made])
                continue
            one, launch = per_element_kernels(plan, "CudaRenderer", lambda d, name: _function(plan, d, name), only=k)
            functions.extend(one)
            launches.extend(launch)
        source = "\n\n".join([f"// arke kernel {plan.name} (CUDA C)", PRELUDE.strip(), *functions]) + "\n"
        return Artifact("cuda", source, tuple(launches), {"block": str(BLOCK)})


def _function(plan: KernelPlan, d: Dispatch, name: str) -> CudaFunction:
    """A single-op dispatch's emitter: a scan's own (one thread per row), else one thread per element."""
    if isinstance(d.op, ir.ScanOp):
        from arke.targets.cuda.scan import CudaScanFunction

        return CudaScanFunction(plan, d, name)
    return CudaFunction(plan, d, name)


RENDERER = CudaRenderer(frozenset(FAMILY_RENDERERS))
