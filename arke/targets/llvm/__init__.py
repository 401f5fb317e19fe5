"""The ``llvm`` target: LLVM IR through llvmlite, JIT-compiled for this CPU (and, with ``arch``, PTX for
NVIDIA GPUs through LLVM's NVPTX backend).

Renderers: :mod:`.render` (the CPU module, with the families in :mod:`.gemm`, :mod:`.attention`,
:mod:`.rows`), :mod:`.nvptx` (the GPU flavour). Compiling, caching and running: :mod:`.jit`
and :mod:`.kernel`; the worker team: :mod:`.team`; ``akc build``: :mod:`.build_cli`.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from arke.targets.base import SINGLE, Resource, Target

if TYPE_CHECKING:
    from arke.ir import semantic as ir
    from arke.ir import strategy as sir
    from arke.targets.artifact import Artifact, Renderer


class LLVMTarget(Target):
    name = "llvm"
    description = "CPU code through LLVM (and its GPU flavour for NVIDIA)"
    honours = frozenset({"tile", "vectorize", "unroll", "parallel", "split", "threads", "algorithm", "pack"})
    uses = {
        "contraction": frozenset({"tile", "vectorize", "unroll", "pack", "parallel", "threads"}),
        "attention": frozenset({"algorithm", "split", "parallel", "threads"}),
        "rows": frozenset({"parallel", "threads"}),
        SINGLE: frozenset({"vectorize", "unroll", "parallel", "threads"}),
    }
    takes_arch = True
    emits = ("source", "asm", "obj", "ptx", "cubin")
    runs_layers = True

    lends_temporaries = True

    def panel_width(self, weights_dtype: str) -> int:
        if weights_dtype != "f32":
            return 0
        from arke.targets.llvm.jit import host_panel_width

        return host_panel_width()

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
        if arch is not None:
            from arke.targets.llvm.nvptx import RENDERER

            return RENDERER
        from arke.targets.llvm.render import RENDERER  # (kernels built here use the host's vector width)

        return RENDERER

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

    def build_command(self, args: argparse.Namespace, module: Any = None, names: list[str] | None = None) -> int:
        from arke.targets.llvm.build_cli import cmd_build_llvm

        return cmd_build_llvm(args)


TARGET = LLVMTarget()
