"""The LLVM target: LLVM IR text for the host CPU, one function per dispatch.

Each dispatch becomes ``void @<kernel>.d<k>(ptr noalias %b0, ..., ptr noalias %dims, i64 %lo,
i64 %hi, ptr noalias %err)``: the buffers it touches (in plan order), the kernel's dim values,
the range ``[lo, hi)`` of its parallel axis (the runtime's workers each take a static chunk),
and an error word. The loop nest is the op's domain with the parallel axis outermost and
reduce axes innermost; reductions run in a fixed order (float ones in vector lanes of
accumulators whose order the IR spells out: :mod:`arke.targets.llvm.lanes`), so a result never
depends on how the parallel axis was split, nor on how LLVM vectorised. A rows dispatch (a
norm's statistics and the map that uses them) is one function that runs its members row by
row (:mod:`arke.targets.llvm.rows`). Subscripts that are not plain, in-range indices are checked: a bad
one is clamped (no wild read) and raises the error word, and the runtime then reports the
exact problem. Loop counters and accumulators live in allocas that LLVM's mem2reg and loop
vectorizer turn into vector code at O3.

This generic form handles every kernel correctly; the tiled, packed and attention-specific
forms that make it fast build on the same plan (see the issue tracker).

This module is the renderer: it gives each dispatch to its family's emitter (contraction:
:mod:`arke.targets.llvm.gemm`, attention: :mod:`arke.targets.llvm.attention`, the rest:
:mod:`arke.targets.llvm.function`, whose expressions and memory accesses are
:mod:`arke.targets.llvm.scalar`'s, on :mod:`arke.targets.llvm.emitter`'s plumbing) and joins
their functions into one module.
"""

from __future__ import annotations

from arke.ir.shapes import dim_str
from arke.plan.contraction import BATCH_REDUCE, INT8_CONTRACTION
from arke.plan.dispatch import KernelPlan
from arke.plan.families import TOPK
from arke.targets.artifact import Artifact, LaunchSpec, Renderer
from arke.targets.llvm.declarations import Declarations
from arke.targets.llvm.function import function_for
from arke.targets.llvm.isa import INT8_UNITS
from arke.targets.space import FUSED

# ---------------------------------------------------------------- the renderer


class LLVMRenderer(Renderer):
    """Renders a kernel plan to an LLVM IR module for the host CPU.

    ``vector_bits`` is the width of the explicit vector code (contraction micro-kernels,
    attention tiles): 512 on AVX-512, 256 on AVX2, 128 elsewhere. The IR is correct on any
    machine (LLVM legalises wider vectors); the width only decides how fast it runs.
    ``units``: the matrix units the code may use (:mod:`arke.targets.llvm.isa`: AMX, AVX512-BF16);
    their code runs only on a CPU that has them, so a renderer is given them for the machine it
    builds for (:func:`arke.targets.llvm.jit.host_renderer`), none by default.
    """

    name = "llvm"
    #: the contraction family loops over extra reduce axes (a batch-reduce GEMM: :mod:`arke.targets.llvm.gemm`);
    #: top-k selections are one pass over each row (:mod:`arke.targets.llvm.topk`)
    families = FUSED | {BATCH_REDUCE, TOPK}
    capabilities = frozenset({"f32", "f16", "bf16", "i8", "i32", "i64", "u8", "u16", "u32", "bool", "parallel"})

    def __init__(self, vector_bits: int = 512, units: frozenset[str] = frozenset()):
        self.vector_bits = vector_bits
        self.units = frozenset(units)
        if vector_bits >= 512 and self.units & set(INT8_UNITS):  # int8 × int8 → i32 sums on the unit
            self.families = self.families | {INT8_CONTRACTION}

    def render(self, plan: KernelPlan) -> Artifact:
        # one line per symbol for the whole module: several dispatches' emitters share intrinsics
        declare = Declarations()

        functions, launches = [], []
        meta = {"vector_bits": str(self.vector_bits)}
        used: set[str] = set()  # the matrix units the code runs on (AMX needs Linux's permission to load)
        for k, d in enumerate(plan.dispatches):
            entry = f"{plan.name}.d{k}"
            if d.family == "attention":
                from arke.targets.llvm.attention import render_attention

                text, launch, unit = render_attention(plan, d, entry, declare, self.vector_bits, self.units)
                if unit is not None:
                    used.add(unit)
            elif d.family == "contraction" and d.pattern is not None:
                from arke.targets.llvm.gemm import render_contraction

                # dims word len(dims) + k may carry the address of B's prepacked panels (runtime.cpu)
                text, launch, panel, unit = render_contraction(plan, d, entry, declare, self.vector_bits,
                                                               panel_slot=len(plan.dims) + k, units=self.units)
                if panel is not None:
                    meta[f"panels.{k}"] = panel
                if unit is not None:
                    used.add(unit)
            else:
                fn = function_for(plan, d, entry, declare, self.vector_bits)
                text = fn.render()
                extent = dim_str(fn.parallel_extent) if fn.parallel_extent is not None else None
                scratch = dim_str(fn.scratch) if fn.scratch is not None else None
                launch = LaunchSpec(entry, extent, tuple(plan.buffer_index(b) for b in fn.args), scratch)
            functions.append(text)
            launches.append(launch)
        source = "\n\n".join([f"; arke kernel {plan.name}", *declare.lines(), *functions]) + "\n"
        if used:
            meta["units"] = ",".join(sorted(used))
        return Artifact("llvm", source, tuple(launches), meta)


RENDERER = LLVMRenderer()
