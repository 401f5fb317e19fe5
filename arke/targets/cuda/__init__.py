"""The ``cuda`` target: CUDA C (tensor-core contractions, warp-shuffle rows, flash and split-KV
attention) compiled by NVRTC to PTX, assembled by ``ptxas``, and launched through the CUDA driver.

Renderers: :mod:`.render` with the families in :mod:`.gemm`, :mod:`.rows`, :mod:`.attention`.
Compiling: :mod:`.nvrtc`; loading and launching: :mod:`arke.targets.nvidia.driver` (shared with
the llvm target's GPU flavour); ``akc build``: :mod:`.build_cli`.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from arke.targets.base import SINGLE, Resource, Target
from arke.targets.space import Takes, takes

if TYPE_CHECKING:
    from arke.ir import semantic as ir
    from arke.ir import strategy as sir
    from arke.targets.artifact import Artifact, Renderer

_GPU = {"warps": takes(), "stages": takes()}

#: What the CUDA C reads (gemm*.py: the blocking, warps and pipeline stages; rows.py: warps;
#: attention*.py: the algorithm, blocks per role, split_kv's chunks, warps and stages). A dispatch
#: of one op is one thread per element and reads nothing.
TAKES: dict[str, dict[str, Takes]] = {
    "contraction": {"tile": takes("m n k", why="a contraction block is sized along its rows, columns and depth only"),
                    **_GPU},
    "attention": {
        "algorithm": takes(values=("flash", "split_kv"),
                           why="`algorithm = materialized` runs as flash here (no row of scores is kept)"),
        "tile": takes("query key feature value", why="an attention block is sized along its query, key, feature "
                                                     "and value indices only"),
        "split": takes("key", unless={"algorithm": ("flash", "materialized")},
                       why="only the key index is split (into split_kv's chunks)"),
        **_GPU,
    },
    "rows": {"warps": takes()},
    SINGLE: {},
}
_ONE = "a dispatch of one op is one CUDA thread per element: it takes no decisions"
_GRID = "every block of a GPU grid runs at once: there is no loop to split over workers"
DROPS: dict[str, dict[str, str]] = {
    SINGLE: dict.fromkeys(("tile", "vectorize", "unroll", "parallel", "split", "warps", "stages", "algorithm",
                           "pack"), _ONE),
    "rows": {"stages": "a rows block reads its row once: there is no pipeline to stage",
             "tile": "a rows block is one row, its threads striding along it",
             "vectorize": "a rows block is one row, its threads striding along it"},
    **{f: {"parallel": _GRID} for f in ("contraction", "attention")},
}


class CudaTarget(Target):
    toolchain = ("nvidia-cuda-nvrtc-cu12", "cuda-bindings")
    name = "cuda"
    description = "CUDA C compiled by NVRTC"
    takes = TAKES
    drops = DROPS
    takes_arch = True
    emits = ("source", "ptx", "cubin")
    runs_layers = True

    def honoured(self, decision: sir.Decision, dispatch: Any, others: Any = (), arch: str | None = None
                 ) -> str | None:
        """As every target's, and: an f32 (SIMT) matmul double-buffers its tiles, no more (gemm_simt.py), so
        `stages` above 2 runs as 2 there; the tensor-core one (16-bit operands) takes up to 8."""
        why = super().honoured(decision, dispatch, others, arch)
        if why is not None or decision.kind != "stages" or not isinstance(decision.value, int) or decision.value <= 2:
            return why
        from arke.ir.dtypes import DType
        from arke.plan.contraction import Contraction
        from arke.targets.space import RUNS_AS

        c = dispatch.pattern
        if not isinstance(c, Contraction) or c.m is None:
            return None
        pa, pb = c.plain_a(), c.plain_b()
        if pa is not None and pb is not None and pa.dtype == pb.dtype in (DType.F16, DType.BF16):
            return None  # tensor cores (gemm.half_operands): a cp.async pipeline of that many stages
        return (f"an f32 matmul on `cuda` (SIMT tiles) double-buffers at most (`stages = {decision.value}` "
                f"{RUNS_AS} 2)")

    def layer_device(self) -> Any:
        import torch

        from arke.targets.base import TargetUnavailableError

        why = self.unavailable()
        if why is not None:  # torch's own word is an AssertionError ("not compiled with CUDA")
            raise TargetUnavailableError(why)
        return torch.device("cuda", torch.cuda.current_device())

    def unavailable(self, device: str = "cpu", arch: str | None = None) -> str | None:
        from arke.targets.nvidia.driver import gpu_missing

        return gpu_missing(self.name)

    def check_options(self, device: str, arch: str | None) -> str | None:
        if device != "cpu" or arch is None:
            return super().check_options(device, arch)
        from arke.targets.nvidia.ptx import arch_name

        return arch_name(arch)

    def require(self, device: str = "cpu", arch: str | None = None) -> None:
        from arke.targets.nvidia.driver import require_gpu

        require_gpu(self.name)  # CudaUnavailableError (a ValueError) saying what to do

    def renderer(self, arch: str | None = None) -> Renderer:
        from arke.targets.cuda.render import RENDERER

        return RENDERER

    def cache_key(self, artifact: Artifact, arch: str | None = None) -> str:
        from arke.targets.cuda.nvrtc import ptx_key

        return ptx_key(artifact.source, arch or "sm_90")

    def to_ptx(self, artifact: Artifact, plan: Any, arch: str) -> str:
        """The PTX of a rendered plan, through NVRTC (no GPU needed)."""
        from arke.targets.cuda import nvrtc

        return nvrtc.compile_ptx(artifact.source, arch, kernel=plan.name, plan=plan)

    def build_kernel(self, module: ir.Module, ir_name: str, strategy: sir.Strategy | None, *, threads: int,
                     device: str = "cpu", arch: str | None = None) -> Any:
        from arke.targets.nvidia.driver import build_kernel as build_gpu

        return build_gpu(self, module, ir_name, strategy, threads, arch)

    def resources(self, kernel: Any) -> list[Resource]:
        from arke.targets.nvidia.ptx import ptx_resources

        return ptx_resources(kernel.ptx, kernel.arch)

    def build_command(self, args: argparse.Namespace) -> int:
        from arke.targets.cuda.build_cli import cmd_build_cuda

        return cmd_build_cuda(args)


TARGET = CudaTarget()
