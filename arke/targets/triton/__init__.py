"""The ``triton`` target: Triton kernels (Python source), run on an NVIDIA GPU or in Triton's CPU
interpreter (``TRITON_INTERPRET=1``), and compiled ahead of time to PTX/cubin with no GPU.

Renderers: :mod:`.render` with :mod:`.expr`, :mod:`.gemm`, :mod:`.attention`. Loading and
launching: :mod:`.kernel`; ahead-of-time compiles and resources: :mod:`.aot`; ``akc build``:
:mod:`.build_cli`.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from arke.targets.base import SINGLE, Resource, Target

if TYPE_CHECKING:
    from arke.ir import semantic as ir
    from arke.ir import strategy as sir
    from arke.targets.artifact import Renderer

_GPU = frozenset({"warps", "stages"})


class TritonTarget(Target):
    name = "triton"
    description = "GPU kernels written in Triton"
    honours = frozenset({"tile", "vectorize", "unroll", "parallel", "split", "warps", "stages", "algorithm", "pack"})
    uses = {
        "contraction": frozenset({"tile", "parallel"}) | _GPU,
        "attention": frozenset({"algorithm", "tile", "split", "parallel"}) | _GPU,
        "rows": frozenset({"parallel"}) | _GPU,
        SINGLE: frozenset({"tile", "parallel"}) | _GPU,
    }
    emits = ("source", "ptx", "cubin")
    runs_layers = True

    def layer_device(self) -> Any:
        from arke.targets.triton.kernel import device

        return device()

    def unavailable(self, device: str = "cpu", arch: str | None = None) -> str | None:
        from arke.targets.triton.kernel import missing

        return missing()

    def on_host(self, device: str, arch: str | None) -> bool:
        return False

    def renderer(self, arch: str | None = None) -> Renderer:
        from arke.targets.triton.render import RENDERER

        return RENDERER

    def build_kernel(self, module: ir.Module, ir_name: str, strategy: sir.Strategy | None, *, threads: int,
                     device: str = "cpu", arch: str | None = None) -> Any:
        from arke.targets.triton.kernel import build_kernel

        return build_kernel(module, ir_name, strategy, threads)

    def resources(self, kernel: Any) -> list[Resource]:
        from arke.targets.triton.aot import compile_artifact, interpreted

        if interpreted():
            return []  # the interpreter compiles nothing
        entries = compile_artifact(kernel.artifact, kernel.plan, "sm_90", check=False)
        return [Resource(e.entry, e.registers, e.spills, e.shared) for e in entries]

    def build_command(self, args: argparse.Namespace, module: Any = None, names: list[str] | None = None) -> int:
        from arke.targets.triton.build_cli import cmd_build_triton

        if args.arch is None:
            args.arch = "sm_90"
        return cmd_build_triton(args)


TARGET = TritonTarget()
