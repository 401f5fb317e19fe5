"""Launch overhead: what one call of a tiny compiled kernel costs, against torch eager's op call.

Decode runs many small kernels per token, so the fixed cost of a call matters: checking the
arguments' shapes, dtypes and `where` clauses, evaluating dims, allocating the result and
dispatching to the worker team. Each row times a kernel whose work is negligible (8 floats),
so the time is the overhead:

* ``add`` on [1, 8]: the checked call path (``kernel(x, y)``), 1 worker and all workers;
* the same with ``out=`` (no allocation);
* torch eager ``x + y`` and ``torch.add(x, y, out=...)`` on the same tensors, for scale.

    .venv/bin/python benchmarks/launch.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import format_seconds, measure

import arke
from arke.lang.checker import stdlib_path


def launch_table(budget_s: float = 2.0) -> Table:
    """Per-call times of tiny kernels: arke (checked call, 1 and all threads, with and without out=) and torch."""
    lib = arke.build(stdlib_path("std.nn"))
    x, y = torch.randn(1, 8), torch.randn(8)
    out = torch.empty(1, 8)
    add = lib.add
    add(x, y)  # compile outside the timing
    threads = lib.threads
    candidates = {
        "arke add, 1 thread": lambda: add(x, y, threads=1),
        f"arke add, {threads} threads": lambda: add(x, y),
        "arke add, 1 thread, out=": lambda: add(x, y, threads=1, out=out),
        "torch x + y": lambda: x + y,
        "torch.add(x, y, out=)": lambda: torch.add(x, y, out=out),
    }
    times = measure(candidates, budget_s=budget_s)
    table = Table(title="launch overhead: one call of a kernel on [1, 8] f32 (the work is negligible)")
    table.add_column("call")
    table.add_column("time per call", justify="right")
    table.add_column("vs torch x + y", justify="right")
    base = times["torch x + y"].median
    for name, m in times.items():
        table.add_row(name, format_seconds(m.median), f"{m.median / base:.1f}×")
    return table


if __name__ == "__main__":
    Console().print(launch_table())
