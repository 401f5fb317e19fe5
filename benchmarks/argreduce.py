"""Greedy argmax over a vocabulary: ``std.nn.greedy`` on the llvm target against torch eager's
``logits.argmax(-1)``, side by side, at decode and prefill shapes of real vocabularies (GPT-2's
50257, Llama's 32000, Qwen's 151936) and a ragged 4097.

Each row checks that both give the same positions before it times them (interleaved, the
median of several samples: ``timing.measure``); ``ratio`` is arke's time over torch's (at or
under 1.0 is the issue-17 target). The arg-reduction runs as a ``max`` of the row and a ``min``
of the positions that hold it, one rows dispatch: the row is read from memory once.

    .venv/bin/python benchmarks/argreduce.py [--threads N] [--budget S]
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

SHAPES = ((1, 151936), (1, 50257), (8, 151936), (32, 32000), (128, 4097))


def greedy_table(threads: int | None, budget_s: float) -> Table:
    """Per-call times of greedy argmax, arke llvm and torch, one row per shape."""
    lib = arke.build(stdlib_path("std.nn"), target="llvm", threads=threads)
    if threads is not None:
        torch.set_num_threads(threads)
    table = Table(title=escape(f"greedy argmax, f32 logits [rows, vocabulary] (threads: {threads or 'all'})"))
    for col in ("shape", "arke llvm", "torch argmax", "ratio"):
        table.add_column(col, justify="right")
    for m, v in SHAPES:
        logits = torch.randn(m, v)
        if not torch.equal(lib.greedy(logits), logits.argmax(-1)):
            raise AssertionError(f"greedy [{m}, {v}]: positions differ from torch's")
        candidates: dict[str, Callable[[], object]] = {"arke": partial(lib.greedy, logits),
                                                       "torch": partial(torch.argmax, logits, -1)}
        times = measure(candidates, budget_s=budget_s)
        a, t = times["arke"].median, times["torch"].median
        table.add_row(escape(f"[{m}, {v}]"), format_seconds(a), format_seconds(t), f"{a / t:.2f}")
    return table


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="worker threads for arke and torch")
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of timing per shape")
    args = parser.parse_args()
    Console().print(greedy_table(args.threads, args.budget))
