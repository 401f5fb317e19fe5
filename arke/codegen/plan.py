"""Kernel plans: a checked kernel, optimised and cut into dispatches, ready for any renderer.

``make_plan`` inlines calls and fuses elementwise producers (``arke.passes``), then makes
every remaining op one dispatch: a loop nest over the op's axes (and reduce axes) that
reads and writes whole buffers. The plan names every buffer and dim symbol in the order
the runtime passes them, so renderers and runtimes agree without re-deriving anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from arke.codegen.families import family
from arke.ir import semantic as ir
from arke.ir import strategy as sir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim


@dataclass(frozen=True)
class Buffer:
    """A tensor the kernel touches. ``role``: ``param``, ``temp`` or ``result``."""

    name: str
    dtype: DType
    shape: tuple[Dim, ...]
    role: str


@dataclass(frozen=True)
class Dispatch:
    """One loop nest: an op, its family, and the axis split across workers (None: not split)."""

    op: ir.MapOp | ir.ReduceOp | ir.ContractOp
    family: str
    parallel: str | None


@dataclass(frozen=True)
class KernelPlan:
    """Everything a renderer needs for one kernel on one target."""

    name: str
    function: ir.Function
    dims: tuple[str, ...]
    buffers: tuple[Buffer, ...]
    dispatches: tuple[Dispatch, ...]
    decisions: tuple[sir.Decision, ...] = ()

    def buffer_index(self, name: str) -> int:
        for k, b in enumerate(self.buffers):
            if b.name == name:
                return k
        raise KeyError(name)


def make_plan(module: ir.Module, name: str, strategy: sir.Strategy | None = None) -> KernelPlan:
    """The plan of kernel ``name`` (calls inlined, elementwise producers fused)."""
    from arke.passes import run_passes

    fn = run_passes(module, name)
    results = set(fn.results)
    buffers = [Buffer(p.name, p.type.dtype, p.type.shape, "param") for p in fn.params]
    dispatches = []
    for op in fn.ops:
        if isinstance(op, ir.CallOp):  # run_passes inlines every call
            raise ValueError(f"{name}: a call of `{op.callee}` survived inlining")
        role = "result" if op.result in results else "temp"
        buffers.append(Buffer(op.result, op.dtype, op.type.shape, role))
        parallel = _parallel_axis(op, strategy)
        dispatches.append(Dispatch(op, family(op), parallel))
    dims = tuple(dict.fromkeys(b.dim for b in fn.bindings))
    return KernelPlan(name, fn, dims, tuple(buffers), tuple(dispatches),
                      strategy.decisions if strategy else ())


def _parallel_axis(op: ir.MapOp | ir.ReduceOp | ir.ContractOp, strategy: sir.Strategy | None) -> str | None:
    """The axis split across workers: the strategy's `parallel` index if this op has it, else its
    outermost axis. Reduce axes are never split, so results do not depend on the thread count."""
    names = [a.name for a in op.axes]
    if strategy is not None:
        for d in strategy.decisions:
            if d.kind == "parallel" and d.subject in names:
                return d.subject
    return names[0] if names else None
