"""The ``mlir`` target: each kernel as linalg on tensors in upstream dialects, its strategy as a
transform-dialect script, compiled and run by IREE on the CPU (or for CUDA GPUs).

Renderers: :mod:`.render` with :mod:`.body`, :mod:`.ops`, :mod:`.named`; the strategy as a
transform script: :mod:`.schedule`. Compiling and running through IREE: :mod:`.kernel`;
``akc build``: :mod:`.build_cli`.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from arke.targets.base import SINGLE, Target

if TYPE_CHECKING:
    from arke.ir import semantic as ir
    from arke.ir import strategy as sir
    from arke.targets.artifact import Artifact, Renderer

#: every dispatch is one linalg op, scheduled by the transform script
_ALL = frozenset({"tile", "vectorize", "unroll", "parallel", "split", "threads", "algorithm"})


class MLIRTarget(Target):
    name = "mlir"
    description = "linalg on tensors, compiled by IREE"
    honours = _ALL
    #: linalg writes attention over whole tensors: online softmax and split-KV need rewrites upstream lacks
    choices = {"algorithm": ("materialized",)}
    uses = {SINGLE: _ALL, "attention": _ALL, "contraction": _ALL, "rows": _ALL}
    takes_device = True
    emits = ("source", "transform", "vmfb")

    def unavailable(self, device: str = "cpu", arch: str | None = None) -> str | None:
        from arke.targets.mlir.kernel import missing

        return missing(device)

    def check_options(self, device: str, arch: str | None) -> str | None:
        from arke.targets.mlir.kernel import _check_device, cuda_arch

        _check_device(device)  # an IREEError (a ValueError) naming the devices
        if device == "cpu":
            return super().check_options(device, arch)
        return None if arch is None else cuda_arch(arch)

    def require(self, device: str = "cpu", arch: str | None = None) -> None:
        from arke.targets.mlir.kernel import require_iree, runtime_config

        require_iree()  # IREEMissingError, a ValueError naming the extra
        runtime_config(device)  # cuda without a GPU: IREEError (a ValueError)

    def on_host(self, device: str, arch: str | None) -> bool:
        return device == "cpu"

    def renderer(self, arch: str | None = None) -> Renderer:
        from arke.targets.mlir.render import RENDERER

        return RENDERER

    def cache_key(self, artifact: Artifact, arch: str | None = None) -> str:
        """The key of the CPU build (``arch`` set: the CUDA build for it)."""
        from arke.targets.mlir.kernel import vmfb_key

        return vmfb_key(artifact.source, "cpu" if arch is None else "cuda", arch)

    def build_kernel(self, module: ir.Module, ir_name: str, strategy: sir.Strategy | None, *, threads: int,
                     device: str = "cpu", arch: str | None = None) -> Any:
        from arke.targets.mlir.kernel import build_kernel

        return build_kernel(module, ir_name, strategy, threads, device)

    def build_command(self, args: argparse.Namespace, module: Any = None, names: list[str] | None = None) -> int:
        from arke.targets.mlir.build_cli import cmd_build_mlir

        return cmd_build_mlir(args)


TARGET = MLIRTarget()
