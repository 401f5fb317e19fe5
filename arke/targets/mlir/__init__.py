"""The ``mlir`` target: each kernel as linalg on tensors in upstream dialects (scans as IREE's
``iree_linalg_ext.scan``), its strategy as a transform-dialect script, compiled and run by IREE on
the CPU (or for CUDA GPUs).

Renderers: :mod:`.render` with :mod:`.body`, :mod:`.ops`, :mod:`.named`, :mod:`.scan`; the strategy as a
transform script: :mod:`.schedule`. Compiling and running through IREE: :mod:`.kernel`;
``akc build``: :mod:`.build_cli`.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, ClassVar

from arke.targets.base import FUSED, SINGLE, Target
from arke.targets.space import Takes, takes

if TYPE_CHECKING:
    from arke.ir import semantic as ir
    from arke.ir import strategy as sir
    from arke.targets.artifact import Artifact, Renderer

#: every dispatch is one linalg op, scheduled by the transform script (schedule.py): a decision applies
#: to the ops with a loop over its index of the right kind (``parallel`` on parallel loops, ``split``
#: on reduced ones); linalg writes attention over whole tensors, the materialized algorithm
_ONE_OP: dict[str, Takes] = {
    "tile": takes(), "vectorize": takes(), "unroll": takes(), "threads": takes(),
    "parallel": takes("axis", why="`parallel` applies to the op's parallel loops (its result indices)"),
    "split": takes("reduced", why="`split` applies to the op's reduced loops"),
    "algorithm": takes(values=("materialized",), why="upstream MLIR has no transform for online softmax or "
                                                      "split-KV: the attention core stays materialized"),
}
TAKES: dict[str, dict[str, Takes]] = {family: _ONE_OP for family in (SINGLE, *sorted(FUSED))}
DROPS: dict[str, dict[str, str]] = {
    family: {"pack": "no upstream transform packs one operand of a linalg op into panels",
             "warps": "a GPU decision: the MLIR target schedules loops", "stages": "a GPU decision: the MLIR "
             "target schedules loops"} for family in TAKES
}


class MLIRTarget(Target):
    toolchain = ("iree-base-compiler", "iree-base-runtime")
    name = "mlir"
    description = "linalg on tensors, compiled by IREE"
    #: linalg writes attention over whole tensors: online softmax and split-KV need rewrites upstream lacks
    choices: ClassVar[dict[str, tuple[str, ...]]] = {"algorithm": ("materialized",)}
    takes = TAKES
    drops = DROPS
    #: plans group no families: IREE (or any MLIR pipeline) fuses the linalg ops itself
    families = frozenset()
    reports_unexpressed = True  # its build command reports what the transform script cannot say (AK4013)
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

    def honoured(self, decision: sir.Decision, dispatch: Any, others: Any = (), arch: str | None = None
                 ) -> str | None:
        """As every target's, and: a scan is ``iree_linalg_ext.scan``, whose axis is no reduction loop of a linalg
        op, so `split` along it has nothing to split (the schedule's note said so only in ``arke.build``)."""
        why = super().honoured(decision, dispatch, others, arch)
        if why is not None or decision.kind != "split" or decision.subject is None:
            return why
        from arke.ir import semantic as ir

        scanned = any(isinstance(op, ir.ScanOp) and op.scan_axis.name == decision.subject for op in dispatch.members)
        reduced = any(isinstance(op, ir.ReduceOp | ir.ContractOp) and
                      any(a.name == decision.subject for a in op.reduce_axes) for op in dispatch.members)
        if scanned and not reduced:
            return (f"a scan runs as `iree_linalg_ext.scan`, which has no reduction loop over `{decision.subject}` "
                    "to split: IREE runs the scan in order")
        return None

    def cache_key(self, artifact: Artifact, arch: str | None = None) -> str:
        """The key of the CPU build (``arch`` set: the CUDA build for it)."""
        from arke.targets.mlir.kernel import vmfb_key

        return vmfb_key(artifact.source, "cpu" if arch is None else "cuda", arch)

    def build_kernel(self, module: ir.Module, ir_name: str, strategy: sir.Strategy | None, *, threads: int,
                     device: str = "cpu", arch: str | None = None) -> Any:
        from arke.targets.mlir.kernel import build_kernel

        return build_kernel(module, ir_name, strategy, threads, device)

    def build_command(self, args: argparse.Namespace) -> int:
        from arke.targets.mlir.build_cli import cmd_build_mlir

        return cmd_build_mlir(args)


TARGET = MLIRTarget()
