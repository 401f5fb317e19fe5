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
from arke.targets.space import RUNS_AS, Takes, dispatch_family, takes
from arke.targets.triton.blocks import MAX_LINE, WHY, limits

if TYPE_CHECKING:
    from arke.ir import semantic as ir
    from arke.ir import strategy as sir
    from arke.targets.artifact import Renderer

_GPU = {"warps": takes(), "stages": takes()}
_BLOCKS = "a program's blocks run along the innermost result index and the innermost reduced index"
_ROW_BLOCKS = "a rows program is one row: its blocks run along the indices after the rows and the reduced ones"
_KEYS = {"algorithm": ("flash", "materialized")}
#: Triton's blocks are powers of two (tl.arange), tl.dot's at least 16: the renderer rounds tiles with rounded_up
_DOT = (16, "Triton's dot blocks are powers of two of at least 16")
_POW2 = (1, "Triton's blocks are powers of two")

#: What the Triton code reads (render.py: a program's blocks and launch options; gemm.py: the blocking;
#: attention.py: the algorithm, blocks per role and split_kv's chunks).
TAKES: dict[str, dict[str, Takes]] = {
    "contraction": {"tile": takes("m n k", why="a contraction program is blocked along its rows, columns and depth "
                                               "only", powers=_DOT, limits=limits("m n k")), **_GPU},
    "attention": {
        "algorithm": takes(values=("flash", "split_kv"),
                           why="`algorithm = materialized` runs as flash here (no row of scores is kept)"),
        "tile": takes("query key feature value", why="an attention program is blocked along its query, key, "
                                                     "feature and value indices only", powers=_DOT,
                      limits=limits("query key feature value")),
        "split": takes("key", unless=_KEYS, why="only the key index is split (into split_kv's chunks)"),
        **_GPU,
    },
    "rows": {"tile": takes("inner reduced", why=_ROW_BLOCKS, powers=_POW2, limits=limits("inner reduced", MAX_LINE)),
             "vectorize": takes("inner reduced", why=_ROW_BLOCKS, powers=_POW2,
                                limits=limits("inner reduced", MAX_LINE)), **_GPU},
    SINGLE: {"tile": takes("last last_reduced", why=_BLOCKS, powers=_POW2,
                           limits=limits("last last_reduced", MAX_LINE)),
             "vectorize": takes("last last_reduced", why=_BLOCKS, powers=_POW2,
                                limits=limits("last last_reduced", MAX_LINE)), **_GPU},
}
_GRID = "every program of a GPU grid runs at once: there is no loop to split over workers"
DROPS: dict[str, dict[str, str]] = {
    family: {"parallel": _GRID, "unroll": "Triton unrolls its own loops; the code asks for no unrolling",
             "pack": "operands are read as stored: Triton has no packing pass"}
    for family in (*TAKES,)
}


class TritonTarget(Target):
    toolchain = ("triton",)
    name = "triton"
    description = "GPU kernels written in Triton"
    takes = TAKES
    drops = DROPS
    emits = ("source", "ptx", "cubin")
    runs_layers = True
    paged_attention = True  # k/v rows through a block table, keys past a length skipped (attention.py)
    torch_traceable = True  # each launch through torch.library.wrap_triton (arke/torch/triton_ops.py)

    def honoured(self, decision: sir.Decision, dispatch: Any, others: Any = (), arch: str | None = None
                 ) -> str | None:
        """As every target's, and: a reduction's program holds its outputs' block by its reduce chunk in one
        tensor, so a decided outputs' block gives way to a decided chunk past 2**20 elements in all
        (blocks.two_wide)."""
        why = super().honoured(decision, dispatch, others, arch)
        if why is not None or decision.kind not in ("tile", "vectorize") or not isinstance(decision.value, int):
            return why
        from arke.ir import semantic as ir
        from arke.targets.triton.blocks import outer_runs_as

        op = dispatch.op
        if dispatch_family(dispatch) != SINGLE or not isinstance(op, ir.ReduceOp | ir.ContractOp) or \
                not op.axes or not op.reduce_axes or decision.subject != op.axes[-1].name:
            return None
        chunk = [d.value for d in others if d.kind in ("tile", "vectorize") and d.subject == op.reduce_axes[-1].name
                 and isinstance(d.value, int)]
        runs = outer_runs_as(decision.value, chunk[-1]) if chunk else None
        if runs is None:
            return None
        return (f"{WHY}: beside a reduce chunk of {min(chunk[-1], MAX_LINE)} along `{op.reduce_axes[-1].name}` "
                f"(`{decision.kind} {decision.subject} = {decision.value}` {RUNS_AS} {runs})")

    def layer_device(self) -> Any:
        from arke.targets.triton.kernel import device

        return device()

    def unavailable(self, device: str = "cpu", arch: str | None = None) -> str | None:
        from arke.targets.triton.kernel import missing

        return missing()

    def on_host(self, device: str, arch: str | None) -> bool:
        return False

    def torch_dispatch(self, on_host: bool) -> tuple[str, bool]:
        from arke.targets.triton.kernel import interpreting

        # under the interpreter the kernels run on the CPU, and there is nothing for Inductor to compile
        return ("CPU", False) if interpreting() else ("CUDA", True)

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

    def build_command(self, args: argparse.Namespace) -> int:
        from arke.targets.triton.build_cli import cmd_build_triton

        if args.arch is None:
            args.arch = "sm_90"
        return cmd_build_triton(args)


TARGET = TritonTarget()
