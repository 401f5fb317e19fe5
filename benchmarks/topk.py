"""Top-k on the llvm target against torch eager's ``torch.topk``, side by side: top-k sampling's
candidates (``topk50`` below: K = 50 of a vocabulary; 16 × 32000 is the issue-17 row, then Llama's
32000 and Qwen's 152064 at decode) and MoE routing (``std.nn.route_top2``: 64 tokens × 8 experts,
K = 2, Mixtral; and 64 experts, and ``argtopk`` alone at K = 8).

Each row checks that arke gives the positions of the spec's order (a stable sort's) before it
times them (interleaved, the median of several samples: ``timing.measure``); ``ratio`` is arke's
time over torch's (at or under 1.0 is the issue-17 target). On llvm a literal K up to 64 over a
loaded row is one pass per row (``arke.targets.llvm.topk``: a sorted buffer of K, a vector
threshold test); elsewhere K rounds, each a ``max`` of the numbers left and a ``min`` of the first
position holding it (``arke.passes.topk``).

    .venv/bin/python benchmarks/topk.py [--threads N] [--budget S]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import format_seconds, measure

import arke
from arke.lang.checker import stdlib_path

SAMPLING = ((16, 32000), (1, 32000), (1, 152064), (4, 152064))
ROUTING = ((64, 8), (512, 8), (64, 64))
TOP8 = """
kernel top8(logits: f32[T, E]) -> i: i64[T, 8] {
  i[t, j] = argtopk(logits[t, e] for e, j)
}
"""


#: Top-k sampling's candidates, as a user writes them (not in std.nn: its 50 rounds spill on the GPU targets).
TOPK50 = """
kernel topk50(logits: f32[M, V]) -> (v: f32[M, 50], ids: i64[M, 50]) {
  v[m, j] = topk(logits[m, n] for n, j)
  ids[m, j] = argtopk(logits[m, n] for n, j)
}
"""


def _routing_torch(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    v, i = torch.topk(logits, 2, dim=-1)
    return torch.softmax(v, dim=-1), i


def _ids(x: torch.Tensor, k: int) -> torch.Tensor:
    """The positions of the spec's order (language §8.3: equal values by lower position), from a
    stable sort: ``torch.topk`` leaves the order of ties unspecified, and on random rows of 32000
    floats two of the 50 largest are sometimes equal."""
    return torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]


def topk_table(threads: int | None, budget_s: float) -> Table:
    """Per-call times of the top-k kernels, arke llvm and torch, one row per shape."""
    lib = arke.build(stdlib_path("std.nn"), target="llvm", threads=threads)
    sampling = arke.build(arke.loads(TOPK50), target="llvm", threads=threads)
    top8 = arke.build(arke.loads(TOP8), target="llvm", threads=threads)
    if threads is not None:
        torch.set_num_threads(threads)
    table = Table(title=escape(f"top-k, f32 [rows, N] (threads: {threads or 'all'})"))
    for col in ("kernel", "shape", "K", "arke llvm", "torch eager", "ratio"):
        table.add_column(col, justify="right")
    rows: list[tuple[str, tuple[int, int], int, Callable[[], object], Callable[[], object], Callable[[], bool]]] = []
    for m, n in SAMPLING:
        x = torch.randn(m, n)
        rows.append(("topk50", (m, n), 50, partial(sampling.topk50, x), partial(torch.topk, x, 50, -1),
                     partial(lambda x: torch.equal(sampling.topk50(x)[1], _ids(x, 50)), x)))
    for m, n in ROUTING:
        x = torch.randn(m, n)
        rows.append(("route_top2", (m, n), 2, partial(lib.route_top2, x), partial(_routing_torch, x),
                     partial(lambda x: torch.equal(lib.route_top2(x)[1], _ids(x, 2)), x)))
    x = torch.randn(64, 64)
    rows.append(("argtopk", (64, 64), 8, partial(top8.top8, x), partial(torch.topk, x, 8, -1),
                 partial(lambda x: torch.equal(top8.top8(x), _ids(x, 8)), x)))
    for name, (m, n), k, arke_call, torch_call, same in rows:
        if not same():
            raise AssertionError(f"{name} [{m}, {n}]: positions differ from torch's")
        times = measure({"arke": arke_call, "torch": torch_call}, budget_s=budget_s)
        a, t = times["arke"].median, times["torch"].median
        table.add_row(name, escape(f"[{m}, {n}]"), str(k), format_seconds(a), format_seconds(t), f"{a / t:.2f}")
    return table


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="worker threads for arke and torch")
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of timing per shape")
    args = parser.parse_args()
    Console().print(topk_table(args.threads, args.budget))
