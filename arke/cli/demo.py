"""The demo (``make demo``, ``akc demo``, ``examples/demo.py``): Arke's answer next to torch's.

It checks ``examples/rmsnorm.ak`` and ``examples/attention.ak`` with :func:`arke.load`,
runs their kernels on the reference interpreter (:func:`arke.interpret`) and compiled for
the CPU through LLVM (:func:`arke.build`) on random inputs (ragged sizes such as 4097
columns included), computes the same results with plain torch written here independently
(``torch.nn.functional`` and explicit formulas), and prints one table row per case and
way of running it. The exit status is 1 when any of them disagrees.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: Where the example programs live (the repository's ``examples/`` folder).
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"  # arke/cli/demo.py -> the repository

#: Largest max-abs difference accepted for f32 results of these sizes.
TOLERANCE = 1e-4


@dataclass(frozen=True)
class Case:
    """One comparison: ``kernel`` of example ``file`` on inputs of ``shapes``, against ``reference``."""

    file: str
    kernel: str
    shapes: tuple[tuple[int, ...], ...]
    reference: Callable[..., torch.Tensor]
    note: str = ""


# ---------------------------------------------------------------- the torch side, written independently


def torch_rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last axis, by torch's own ``rms_norm``."""
    import torch.nn.functional as F

    return F.rms_norm(x, (x.shape[-1],), w, eps)


def torch_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis, by torch."""
    import torch

    return torch.softmax(x, dim=-1)


def torch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention with a bottom-right-aligned causal mask, by torch's SDPA.

    Query head ``h`` reads key/value head ``h // (H // G)``; query ``i`` of ``S`` sees key
    ``j`` of ``T`` when ``j <= i + T - S`` (so a decode step, ``S == 1``, sees every key).
    """
    import torch
    import torch.nn.functional as F

    heads, groups = q.shape[1], k.shape[1]
    s, t = q.shape[2], k.shape[2]
    mask = torch.arange(t)[None, :] <= torch.arange(s)[:, None] + (t - s)
    k = k.repeat_interleave(heads // groups, dim=1)
    v = v.repeat_interleave(heads // groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def cases() -> list[Case]:
    """The demo's comparisons: ragged and round sizes, prefill and decode attention."""
    return [
        Case("rmsnorm.ak", "rmsnorm", ((3, 4097), (4097,)), torch_rmsnorm, "ragged row"),
        Case("rmsnorm.ak", "rmsnorm", ((32, 768), (768,)), torch_rmsnorm),
        Case("rmsnorm.ak", "softmax", ((5, 4097),), torch_softmax, "ragged row"),
        Case("rmsnorm.ak", "softmax", ((17, 100),), torch_softmax),
        Case("attention.ak", "attention", ((2, 8, 7, 32), (2, 2, 13, 32), (2, 2, 13, 32)), torch_attention,
             "GQA, causal, S < T"),
        Case("attention.ak", "attention", ((1, 4, 1, 16), (1, 1, 37, 16), (1, 1, 37, 16)), torch_attention,
             "MQA decode, S = 1"),
    ]


# ---------------------------------------------------------------- running


@dataclass(frozen=True)
class Outcome:
    """What one case gave on one runner: the max abs difference (None when it failed to run) and any error."""

    case: Case
    error: float | None
    problem: str = ""
    runner: str = "interpreter"

    @property
    def ok(self) -> bool:
        return self.error is not None and self.error <= TOLERANCE and not self.problem


def _as_tensor(value: Any) -> torch.Tensor:
    import numpy as np
    import torch

    return value if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))


def run_case(case: Case, module: Any, generator: torch.Generator, library: Any = None) -> list[Outcome]:
    """Run one case on the interpreter (and on ``library``'s compiled kernel) and on torch; compare."""
    import torch

    import arke

    inputs = [torch.randn(shape, generator=generator, dtype=torch.float32) for shape in case.shapes]
    want = case.reference(*inputs)
    runners: list[tuple[str, Callable[..., Any]]] = [("interpreter", lambda *a: arke.interpret(
        module.kernels[case.kernel], *a))]
    if library is not None:
        runners.append((f"{library.target} (compiled)", library.kernels[case.kernel]))
    return [_compare(case, name, run, inputs, want) for name, run in runners]


def _compare(case: Case, runner: str, run: Callable[..., Any], inputs: list[Any], want: Any) -> Outcome:
    try:
        got = _as_tensor(run(*inputs))
    except Exception as exc:  # the demo reports a failing case and goes on with the others
        if os.environ.get("AKC_DEBUG"):
            raise
        return Outcome(case, None, f"{type(exc).__name__}: {exc}", runner)
    if tuple(got.shape) != tuple(want.shape):
        return Outcome(case, None, f"shape {tuple(got.shape)}, torch gives {tuple(want.shape)}", runner)
    diff = (got.double() - want.double()).abs().max().item()
    if diff != diff:  # NaN
        return Outcome(case, float("nan"), "NaN in the result", runner)
    return Outcome(case, diff, runner=runner)


def _load(path: Path) -> Any:
    """``arke.load(path)``, or None after printing why it cannot be loaded."""
    import arke
    from arke.lang.render import print_diagnostics

    try:
        return arke.load(path)
    except arke.CheckError as err:
        if err.diagnostics:
            print_diagnostics(err.diagnostics, stream=sys.stderr)
        else:
            print(f"demo: `{path}` was checked but not lowered to IR (no diagnostics)", file=sys.stderr)
        return None


def _shapes(shapes: Sequence[tuple[int, ...]]) -> str:
    return " ".join("[" + ",".join(str(n) for n in s) + "]" for s in shapes)


def run_demo(examples: Path = EXAMPLES, seed: int = 0) -> int:
    """Check, interpret and compare every case; print a table; 0 when every case agrees with torch."""
    import torch
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if not console.is_terminal:  # a log file or a pipe: room for the whole table on one line per case
        console.width = 120
    generator = torch.Generator().manual_seed(seed)
    modules: dict[str, Any] = {}
    for name in dict.fromkeys(c.file for c in cases()):
        module = _load(examples / name)
        if module is None:
            return 1
        modules[name] = module
        strategies = len(module.strategies.strategies)
        shown = os.path.relpath(examples / name)
        console.print(f"checked {shown}: kernels {', '.join(module.names)}; {strategies} strategies")

    import arke

    libraries = {name: arke.build(module, target="llvm") for name, module in modules.items()}
    outcomes = [o for case in cases() for o in run_case(case, modules[case.file], generator, libraries[case.file])]
    table = Table(title=f"Arke vs torch {torch.__version__} (f32, tolerance {TOLERANCE:g})")
    for column in ("kernel", "input shapes", "case", "run on", "max abs error", "result"):
        table.add_column(column, justify="right" if column == "max abs error" else "left", no_wrap=True)
    for out in outcomes:
        error = "-" if out.error is None else f"{out.error:.2e}"
        result = "[green]ok[/green]" if out.ok else f"[red]FAIL[/red] {out.problem}".rstrip()
        table.add_row(out.case.kernel, _shapes(out.case.shapes), out.case.note, out.runner, error, result)
    console.print(table)
    failed = sum(not o.ok for o in outcomes)
    console.print(f"[red]{failed} of {len(outcomes)} cases disagree[/red]" if failed
                  else f"[green]all {len(outcomes)} cases agree with torch[/green]")
    return 1 if failed else 0


def run_all(examples: Path = EXAMPLES, layer: bool = True, part: str = "model") -> int:
    """The example kernels (:func:`run_demo`), then (unless ``layer`` is False) whole-model generation
    (:mod:`arke.cli.demo_model`), or with ``part="layer"`` the single decoder layer (:mod:`arke.cli.demo_layer`)."""
    status = run_demo(examples)
    if layer and part == "layer":
        from arke.cli.demo_layer import run_layer_demo

        status = max(status, run_layer_demo())
    elif layer:
        from arke.cli.demo_model import run_model_demo

        status = max(status, run_model_demo())
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``examples/demo.py``: ``[--kernels | --layer] [EXAMPLES_FOLDER]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    kernels_only, layer = "--kernels" in args, "--layer" in args
    args = [a for a in args if a not in ("--kernels", "--layer")]
    return run_all(Path(args[0]) if args else EXAMPLES, layer=not kernels_only, part="layer" if layer else "model")


__all__ = ["Case", "Outcome", "cases", "main", "run_all", "run_case", "run_demo", "torch_attention", "torch_rmsnorm",
           "torch_softmax"]
