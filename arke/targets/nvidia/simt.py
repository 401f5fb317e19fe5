"""One thread per result element: the launch shape the SIMT GPU renderers share.

The LLVM target's NVPTX flavour (:mod:`arke.targets.llvm.nvptx`) and the CUDA-C target
(:mod:`arke.targets.cuda.render`) render each op of a plan made with no families as its own
kernel ``<kernel>_d<k>`` (:func:`entry_name`); thread ``ctaid.x * ntid.x + tid.x`` computes
one element of the op's result (:func:`element_count` threads in all), launched as
``ceil(elements / BLOCK)`` blocks of :data:`BLOCK` threads (:func:`per_element_kernels`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Protocol

import sympy

from arke.ir import semantic as ir
from arke.ir.shapes import Dim, ceil_div, dim_str
from arke.plan.dispatch import Dispatch, KernelPlan
from arke.targets.artifact import LaunchSpec, Renderer, UnsupportedError

#: threads per block of every launch (a multiple of the 32-thread warp)
BLOCK = 128


def entry_name(kernel: str, k: int) -> str:
    """The PTX entry of dispatch ``k`` (PTX and C names take no dots, so not the CPU's ``<kernel>.d<k>``; an
    imported kernel's ``std.nn.linear`` is ``std_nn_linear``)."""
    return f"{re.sub(r'[^A-Za-z0-9_]', '_', kernel)}_d{k}"


def element_count(op: ir.MapOp | ir.ReduceOp | ir.ContractOp) -> Dim:
    """The elements of an op's result: the threads a one-thread-per-element launch needs."""
    total: Dim = sympy.Integer(1)
    for a in op.axes:
        total = total * a.extent
    return total


class ElementKernel(Protocol):
    """A dispatch's GPU function: its entry name, the buffers it takes and its thread count."""

    @property
    def name(self) -> str: ...
    @property
    def args(self) -> Sequence[str]: ...
    @property
    def parallel_extent(self) -> Dim | None: ...

    def render(self) -> str: ...


def per_element_kernels(plan: KernelPlan, renderer: str, make: Callable[[Dispatch, str], ElementKernel],
                        only: int | None = None) -> tuple[list[str], list[LaunchSpec]]:
    """Every dispatch of ``plan`` (or dispatch ``only``) as a one-thread-per-element GPU function (its
    text) and its launch: ``ceil(elements / BLOCK)`` blocks of :data:`BLOCK` threads. Shared by the
    SIMT GPU targets."""
    functions, launches = [], []
    for k, d in enumerate(plan.dispatches):
        if only is not None and k != only:
            continue
        if len(d.members) > 1:  # a fused group (from a plan made with families) has no per-element form
            raise UnsupportedError(f"dispatch {k} of `{plan.name}` fuses {len(d.members)} ops; make the plan "
                                   f"with families={renderer}.families")
        fn = make(d, entry_name(plan.name, k))
        functions.append(fn.render())
        total = fn.parallel_extent if fn.parallel_extent is not None else sympy.Integer(1)
        launches.append(LaunchSpec(fn.name, dim_str(total), tuple(plan.buffer_index(b) for b in fn.args),
                                   grid=(dim_str(ceil_div(total, BLOCK)),), options=(("block", BLOCK),)))
    return functions, launches


class SIMTRenderer(Renderer):
    """A GPU renderer of one kernel per op, one thread per result element (:func:`per_element_kernels`).

    Make its plans with ``families=<renderer>.families`` (none: one dispatch per op).
    ``meta["block"]`` is the threads per block of every launch.
    """

    capabilities = frozenset({"f32", "f16", "bf16", "i8", "i32", "i64", "u8", "u16", "u32", "bool", "parallel"})
    families: frozenset[str] = frozenset()
