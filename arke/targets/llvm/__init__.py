"""The ``llvm`` target: LLVM IR through llvmlite, JIT-compiled for this CPU (and, with ``arch``, PTX for
NVIDIA GPUs through LLVM's NVPTX backend).

Renderers: :mod:`.render` (the CPU module, with the families in :mod:`.gemm`, :mod:`.attention`,
:mod:`.rows`), :mod:`.nvptx` (the GPU flavour). Compiling, caching and running: :mod:`.jit`
and :mod:`.kernel`; the worker team: :mod:`.team`; ``akc build``: :mod:`.build_cli`.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import sympy

from arke.ir import semantic as ir
from arke.ir.text import sexpr_text
from arke.plan.contraction import BATCH_REDUCE, Contraction
from arke.plan.families import TOPK
from arke.targets.base import FUSED, SINGLE, Resource, Target
from arke.targets.space import Takes, dispatch_family, takes

if TYPE_CHECKING:
    from collections.abc import Mapping

    from arke.ir import strategy as sir
    from arke.plan.dispatch import Dispatch, PlanOp
    from arke.targets.artifact import Artifact, Renderer

_LOOPED = ("the CPU code gives no loop of its own to the indices the workers split (flattened into one "
           "range) nor to the last index of a float reduction (summed in vector lanes)")

#: What the CPU code reads (function.py: loop hints; gemm*.py: blocking and packing; attention*.py:
#: the algorithm and the key chunks; kernel.py: the thread count).
TAKES: dict[str, dict[str, Takes]] = {
    "contraction": {
        "tile": takes("m n k", why="a contraction is blocked along its rows, columns and depth only",
                      limits={"m": (16, "`tile m` is the micro-kernel's register rows"),
                              "n": (8192, "`tile n` is a task's slab of columns, packed in its scratch"),
                              "k": (8192, "`tile k` is the depth of a packed block, held in a task's scratch")}),
        "vectorize": takes("n", why="the micro-kernel's vector lanes run along a contraction's columns only"),
        "unroll": takes("k", why="the micro-kernel unrolls its loop over a contraction's depth only"),
        "pack": takes("a b", why="only the operands of the product are packed (not those of the epilogue)"),
        "parallel": takes("batch n", why="the workers always split a contraction's batch indices and its columns, "
                                         "never its rows"),
        "threads": takes(),
    },
    "attention": {
        "algorithm": takes(),
        "parallel": takes("batch query", why="the workers split an attention core's batch indices and query rows"),
        "split": takes("key", unless={"algorithm": ("flash", "materialized")},
                       why="only the key index is split (into split_kv's chunks)"),
        "threads": takes(),
    },
    "rows": {
        "parallel": takes("rows", why="the workers split the group's rows (its leading indices, as one range)"),
        "vectorize": takes("looped", why=_LOOPED),
        "unroll": takes("looped", why=_LOOPED),
        "threads": takes(),
    },
    TOPK: {
        "parallel": takes("rows", why="the workers split a top-k's rows (the indices it keeps, as one range)"),
        "threads": takes(),
    },
    SINGLE: {
        "parallel": takes("axis"),
        "vectorize": takes("looped", why=_LOOPED),
        "unroll": takes("looped", why=_LOOPED),
        "threads": takes(),
    },
}
_SERIAL = "a reduction runs whole, in one fixed order, on the CPU: only attention's keys are split"
DROPS: dict[str, dict[str, str]] = {
    "contraction": {"split": "a contraction's depth is summed whole, in order, by each worker"},
    "attention": {"tile": "the attention kernel's blocks follow the vector width",
                  "vectorize": "the attention kernel's vectors follow the CPU's width",
                  "unroll": "the attention kernel's loops are not unrolled on request"},
    "rows": {"split": _SERIAL, "tile": "a rows dispatch runs each row whole: its loops are not tiled"},
    TOPK: {"split": "each row of a top-k is selected whole, in one pass, by one worker",
           "tile": "a top-k's row is scanned in blocks of the vector width",
           "vectorize": "a top-k's row is scanned in vectors of the CPU's width",
           "unroll": "a top-k's scan is unrolled by four vectors, not on request"},
    SINGLE: {"split": _SERIAL, "tile": "a single-op loop nest is not tiled on the CPU"},
}
#: the GPU flavour (``arch``): one thread per element, no loop hints (nvptx.py)
_GPU_WHY = "the llvm target's GPU flavour runs one thread per element and takes no strategy decisions"


def _row_axis(op: PlanOp, rows: int | None, parallel: str | None) -> str | None:
    """The result index a reduction keeps a row of accumulators along (function.py/rows.py ``rows_axis``)."""
    if isinstance(op, ir.MapOp) or not op.axes or (rows is not None and
                                                    (not isinstance(op, ir.ReduceOp) or len(op.axes) <= rows)):
        return None
    n = op.axes[-1].name
    exprs = (op.lhs, op.rhs) if isinstance(op, ir.ContractOp) else (op.body,)
    found = any(isinstance(x, ir.Load) and x.indices and x.indices[-1] == ir.Idx(n) for e in exprs for x in ir.walk(e))
    return n if found and n != parallel else None


def looped(op: PlanOp, parallel: str | None, rows: int | None = None) -> set[str]:
    """The indices of ``op`` the CPU code gives a loop of its own (so loop hints reach them): as a single-op
    dispatch split along ``parallel``, or as a member of a rows dispatch sharing ``rows`` row indices."""
    if isinstance(op, ir.ScanOp):
        return set()  # scan.py: its loops take no hints (rows go side by side, the scan in sequence)
    axes = [a.name for a in op.axes]
    if rows is None:
        order = ([parallel] if parallel in axes else []) + [a for a in axes if a != parallel]
        row = _row_axis(op, None, parallel)
        outer = [a for a in order if a != row]
        flat = (outer if row is not None or len(outer) == 1 else outer[:-1]) if axes and parallel == axes[0] else []
        out = set(outer[len(flat):])
    else:
        row = _row_axis(op, rows, None)
        out = {a for a in axes[rows:] if a != row}
    reduced = [a for a in op.reduce_axes] if not isinstance(op, ir.MapOp) else []
    if row is not None:
        return out | {row} | {a.name for a in reduced}
    if reduced:
        extent = sympy.sympify(reduced[-1].extent)
        short = bool(extent.is_Integer and int(extent) < 64)  # perhaps summed in sequence: loop hints reach it
        in_lanes = op.dtype.is_float and not short
        out |= {a.name for a in (reduced[:-1] if in_lanes else reduced)}
    return out


class LLVMTarget(Target):
    toolchain = ("llvmlite",)
    name = "llvm"
    description = "CPU code through LLVM (and its GPU flavour for NVIDIA)"
    takes = TAKES
    drops = DROPS
    takes_arch = True
    # its contractions loop over extra reduce axes, and it selects top-k's natively (the renderer's own)
    families = FUSED | {BATCH_REDUCE, TOPK}
    emits = ("source", "asm", "obj", "ptx", "cubin")
    runs_layers = True

    lends_temporaries = True
    bounded_reductions = True  # a reduction's loop stops at its length (on the CPU; the GPU flavour masks)

    def panel_width(self, weights_dtype: str) -> int:
        if weights_dtype != "f32":
            return 0
        from arke.targets.llvm.jit import host_panel_width

        return host_panel_width()

    def pack_weight(self, w: Any) -> Any:
        import torch

        from arke.targets.llvm import panels
        from arke.targets.llvm.isa import AMX, AMX_INT8, DPBF16, host_units

        if w.dtype == torch.float32:
            return panels.pack_panels(w, self.panel_width("f32"))
        # bf16 (int8) x bf16 (int8) products run on a matrix unit that reads VNNI panels (gemm_bf16.py);
        # AVX512-VNNI's int8 kernel packs its own (it sums each block's columns as it packs)
        units = host_units()
        if (w.dtype == torch.bfloat16 and {AMX, DPBF16} & units) or (w.dtype == torch.int8 and AMX_INT8 in units):
            return panels.pack_vnni_panels(w)
        return None

    def fused_families(self, arch: str | None = None) -> frozenset[str]:
        return self.families if arch is None else frozenset()  # the GPU flavour: one dispatch per op

    def takes_for(self, arch: str | None = None) -> dict[str, dict[str, Takes]]:
        return TAKES if arch is None else {}

    def drop_reason(self, decision: str, family: str, arch: str | None = None) -> str:
        return super().drop_reason(decision, family) if arch is None else _GPU_WHY

    def dispatch_notes(self, dispatch: Dispatch, arch: str | None = None) -> list[str]:
        c = dispatch.pattern
        if arch is None and isinstance(c, Contraction) and c.rows_when is not None and c.m is not None:
            return [f"routed: computes the rows where `{sexpr_text(c.rows_when)}` only"]
        return []

    def subject_roles(self, dispatch: Dispatch) -> dict[str, frozenset[str]]:
        roles = super().subject_roles(dispatch)
        family = dispatch_family(dispatch)
        if family == SINGLE:
            roles["looped"] = frozenset(looped(dispatch.op, dispatch.parallel))
        elif family == "rows":
            r = getattr(dispatch.pattern, "rows", 1)
            roles["looped"] = frozenset(n for op in dispatch.members for n in looped(op, None, r))
        return roles

    def unavailable(self, device: str = "cpu", arch: str | None = None) -> str | None:
        if arch is None:
            return None
        from arke.targets.nvidia.driver import gpu_missing

        return gpu_missing(self.name)

    def check_options(self, device: str, arch: str | None) -> str | None:
        if device != "cpu" or arch is None:
            return super().check_options(device, arch)
        from arke.targets.nvidia.ptx import arch_name

        return arch_name(arch)  # a ValueError naming the architectures arke builds for

    def require(self, device: str = "cpu", arch: str | None = None) -> None:
        if arch is None:  # this CPU: nothing to require
            return
        from arke.targets.nvidia.driver import require_gpu

        require_gpu(self.name)  # CudaUnavailableError (a ValueError) saying what to do

    def on_host(self, device: str, arch: str | None) -> bool:
        return arch is None

    def renderer(self, arch: str | None = None) -> Renderer:
        from arke.targets.llvm import nvptx, render

        # (kernels built for this CPU are rendered for its vector width: jit.host_renderer)
        return render.RENDERER if arch is None else nvptx.RENDERER

    def cache_key(self, artifact: Artifact, arch: str | None = None) -> str:
        if arch is not None:
            from arke.targets.nvidia.ptx import ptx_key

            return ptx_key(artifact.source, arch)
        from arke.targets.llvm.kernel import object_key

        return object_key(artifact.source)

    def to_ptx(self, artifact: Artifact, plan: Any, arch: str) -> str:
        """The GPU flavour's PTX of a rendered plan (llvmlite's NVPTX backend; no GPU needed)."""
        from arke.targets.nvidia import ptx

        return ptx.compile_ptx(artifact.source, arch)

    def build_kernel(self, module: ir.Module, ir_name: str, strategy: sir.Strategy | None, *, threads: int,
                     device: str = "cpu", arch: str | None = None) -> Any:
        if arch is not None:
            from arke.targets.nvidia.driver import build_kernel as build_gpu

            return build_gpu(self, module, ir_name, strategy, threads, arch)
        from arke.targets.llvm.kernel import build_kernel

        chosen = strategy.get("threads") if strategy is not None else None
        if chosen is not None and isinstance(chosen.value, int):
            threads = chosen.value
        return build_kernel(module, ir_name, strategy, threads)

    def resources(self, kernel: Any) -> list[Resource]:
        ptx_text, arch = getattr(kernel, "ptx", None), getattr(kernel, "arch", None)
        if ptx_text is None or arch is None:
            return []  # host code: no registers, spills or shared memory to report
        from arke.targets.nvidia.ptx import ptx_resources

        return ptx_resources(ptx_text, arch)

    def toolchain_versions(self) -> dict[str, str]:
        import llvmlite.binding as llvm

        return {**super().toolchain_versions(), "LLVM": ".".join(map(str, llvm.llvm_version_info))}

    def tune_values(self, decision: str, dispatch: Dispatch, dims: Mapping[str, int], subject: str | None = None,
                    arch: str | None = None) -> tuple[int | str, ...]:
        """A contraction's blocking as its code reads it (:func:`arke.targets.llvm.gemm.blocking`): ``tile m``
        the register block's rows (at most 16), ``tile n`` a task's columns (whole panels of 32), ``tile k``
        the packed depth, ``vectorize n`` up to the host's lanes, ``unroll k`` up to 8; else the legal values."""
        values = super().tune_values(decision, dispatch, dims, subject, arch)
        if dispatch.family != "contraction" or not values or arch is not None:
            return values
        roles = self.subject_roles(dispatch)
        role = next((r for r in ("m", "n", "k") if subject in roles.get(r, ())), None)
        top = max((v for v in values if isinstance(v, int)), default=1)  # the extent, where it is smaller
        if decision == "tile" and role == "m":
            return tuple(v for v in (1, 2, 3, 4, 6, 8, 10, 12, 14, 16) if v <= top)
        if decision == "tile" and role == "n":
            return tuple(v for v in (32, 64, 128, 192, 256, 384, 512) if v <= max(32, top))
        if decision == "tile" and role == "k":
            return tuple(v for v in (64, 128, 256, 384, 512, 768, 1024, 2048) if v <= max(64, top))
        if decision == "vectorize":
            from arke.targets.llvm.jit import host_vector_bits

            return tuple(v for v in values if isinstance(v, int) and 4 <= v <= host_vector_bits() // 32)
        if decision == "unroll":
            return tuple(v for v in values if isinstance(v, int) and v <= 8)
        return values

    def build_command(self, args: argparse.Namespace) -> int:
        from arke.targets.llvm.build_cli import cmd_build_llvm

        return cmd_build_llvm(args)

    def build_bundle(self, module: Any, out: Any, kernels: list[str] | None = None) -> dict[str, Any]:
        from arke.targets.llvm.bundle.build import build_bundle

        return build_bundle(module, out, kernels)

    def bundle_command(self, args: argparse.Namespace, kernels: list[str]) -> int:
        from arke.targets.llvm.bundle.cli import cmd_bundle

        return cmd_bundle(args, kernels)


TARGET = LLVMTarget()
