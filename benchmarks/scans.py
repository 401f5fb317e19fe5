"""Scans on the CPU side by side: arke (llvm target) against torch eager and torch.compile.

A report, not a test: it never fails the build. Each kernel is timed with the shared helper
(``benchmarks/timing.py``: equal warm-up, interleaved rounds, median and spread) and one table
prints arke's, torch eager's and torch.compile's times, the ratios arke/torch and
arke/torch.compile (below 1: arke is faster), arke's read+write bandwidth, and arke's largest
error against torch relative to the output's scale.

* ``cumsum`` over ``[64, 4097]`` and ``[8, 65536]`` (``torch.cumsum(x, 1)``), an exclusive cumsum,
  ``cumprod`` and ``cummax`` over ``[64, 4097]``;
* Mamba's selective scan (``B=1, D=1536, S=16, T=256``: one ``h = exp(Δ·A)·h + Δ·B·x`` state per
  channel and state, contracted with ``C``), against torch eager's loop over ``t`` (the reference
  implementation of ``mamba_simple``'s ``selective_scan_ref``) and that loop compiled.

``--quick`` uses short budgets and skips torch.compile:

    .venv/bin/python benchmarks/scans.py --quick
    .venv/bin/python benchmarks/scans.py [--budget 5] [--only cumsum] [--no-compile] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Measurement, format_seconds, measure

import arke

console = Console(width=None if sys.stdout.isatty() else 160)

SOURCE = """
kernel cumsum(x: f32[M, N]) -> y: f32[M, N] { y[m, n] = cumsum(x[m, n] for n) }
kernel cumsum_exclusive(x: f32[M, N]) -> y: f32[M, N] { y[m, n] = cumsum(x[m, n] for n, exclusive = true) }
kernel cumprod(x: f32[M, N]) -> y: f32[M, N] { y[m, n] = cumprod(x[m, n] for n) }
kernel cummax(x: f32[M, N]) -> y: f32[M, N] { y[m, n] = cummax(x[m, n] for n) }
kernel selective_scan(x: f32[B, D, T], dt: f32[B, D, T], A: f32[D, S], Bm: f32[B, S, T],
                      C: f32[B, S, T]) -> y: f32[B, D, T] {
  h[b, d, s, t] = scan(exp(dt[b, d, t] * A[d, s]) * h + dt[b, d, t] * Bm[b, s, t] * x[b, d, t] for t, h = 0.0)
  y[b, d, t] = sum(C[b, s, t] * h[b, d, s, t] for s)
}
"""


@dataclass
class Bench:
    name: str
    kernel: str
    shape: str
    make: Callable[[torch.Generator], tuple[torch.Tensor, ...]]
    torch_fn: Callable[..., torch.Tensor]
    nbytes: int  # bytes read and written once


@dataclass
class Row:
    bench: Bench
    times: dict[str, Measurement] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    error: float = 0.0


def excl_cumsum(x: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(x, 1) - x


def selective_scan_ref(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, Bm: torch.Tensor,
                       C: torch.Tensor) -> torch.Tensor:
    """The state-space scan as mamba's reference writes it: a loop over time in torch eager."""
    dA = torch.exp(dt[:, :, None, :] * A[None, :, :, None])       # [B, D, S, T]
    dBx = dt[:, :, None, :] * Bm[:, None, :, :] * x[:, :, None, :]  # [B, D, S, T]
    h = torch.zeros(dA.shape[:3])
    ys = []
    for t in range(x.shape[2]):
        h = dA[..., t] * h + dBx[..., t]
        ys.append(torch.einsum("bds,bs->bd", h, C[:, :, t]))
    return torch.stack(ys, dim=2)


def benches() -> list[Bench]:
    def rows(m: int, n: int) -> Callable[[torch.Generator], tuple[torch.Tensor, ...]]:
        return lambda g: (torch.randn(m, n, generator=g),)

    out = [Bench("cumsum", "cumsum", f"{m}×{n}", rows(m, n), lambda x: torch.cumsum(x, 1), 8 * m * n)
           for m, n in ((64, 4097), (8, 65536))]
    out += [
        Bench("cumsum exclusive", "cumsum_exclusive", "64×4097", rows(64, 4097), excl_cumsum, 8 * 64 * 4097),
        Bench("cumprod", "cumprod", "64×4097", lambda g: (1.0 + 0.001 * torch.randn(64, 4097, generator=g),),
              lambda x: torch.cumprod(x, 1), 8 * 64 * 4097),
        Bench("cummax", "cummax", "64×4097", rows(64, 4097), lambda x: torch.cummax(x, 1).values, 8 * 64 * 4097),
    ]
    b, d, s, t = 1, 1536, 16, 256

    def mamba(g: torch.Generator) -> tuple[torch.Tensor, ...]:
        return (torch.randn(b, d, t, generator=g), 0.1 * torch.rand(b, d, t, generator=g),
                -torch.rand(d, s, generator=g), torch.randn(b, s, t, generator=g), torch.randn(b, s, t, generator=g))

    out.append(Bench("selective scan", "selective_scan", f"B{b} D{d} S{s} T{t}", mamba, selective_scan_ref,
                     4 * (3 * b * d * t + d * s + 2 * b * s * t)))
    return out


def relative_error(got: Any, want: torch.Tensor) -> float:
    g = torch.as_tensor(got).double()
    w = want.double()
    return float((g - w).abs().max() / w.abs().max().clamp_min(1e-30))


def run_bench(bench: Bench, lib: Any, budget_s: float, compiling: bool) -> Row:
    row = Row(bench)
    args = bench.make(torch.Generator().manual_seed(0))
    kernel = lib.kernels[bench.kernel]
    kernel(*args)  # compile outside the timing
    candidates: dict[str, Callable[[], object]] = {"arke": lambda: kernel(*args),
                                                   "torch": lambda: bench.torch_fn(*args)}
    if compiling:
        try:
            compiled = torch.compile(bench.torch_fn, dynamic=False)
            compiled(*args)
            candidates["torch.compile"] = lambda: compiled(*args)
        except Exception as err:  # the optional competitor's failure is a note, never a crash
            row.notes["torch.compile"] = f"{type(err).__name__}: {str(err)[:60]}"
    else:
        row.notes["torch.compile"] = "skipped"
    row.error = relative_error(kernel(*args), bench.torch_fn(*args))
    row.times = measure(candidates, budget_s=budget_s)
    return row


def ratio(row: Row, other: str) -> str:
    if other not in row.times:
        return row.notes.get(other, "—")
    return f"{row.times['arke'].median / row.times[other].median:.2f}×"


def report(rows: list[Row], threads: int, wall_s: float) -> None:
    table = Table(title=f"scans on the CPU: arke llvm ({threads} threads) vs torch {torch.__version__} "
                        f"({torch.get_num_threads()} threads)")
    for col in ("kernel", "shape", "arke", "torch", "torch.compile", "arke/torch", "arke/compile", "arke GB/s",
                "rel. error"):
        table.add_column(col, justify="left" if col in ("kernel", "shape") else "right")
    for row in rows:
        t = row.times
        arke_s = t["arke"].median
        table.add_row(row.bench.name, row.bench.shape, t["arke"].summary(), t["torch"].summary(),
                      t["torch.compile"].summary() if "torch.compile" in t else row.notes.get("torch.compile", "—"),
                      ratio(row, "torch"), ratio(row, "torch.compile"), f"{row.bench.nbytes / arke_s / 1e9:.1f}",
                      f"{row.error:.1e}")
    console.print(table)
    console.print(f"total {format_seconds(wall_s)}; ratios below 1.00× mean arke is faster")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short budgets, no torch.compile")
    ap.add_argument("--budget", type=float, default=5.0, help="seconds of timed rounds per kernel")
    ap.add_argument("--only", default=None, help="run the kernels whose name contains this")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--threads", type=int, default=None, help="arke's worker threads (default: the cores)")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    threads = args.threads or os.cpu_count() or 1
    lib = arke.build(arke.loads(SOURCE), target="llvm", threads=threads)
    budget = 1.0 if args.quick else args.budget
    rows = [run_bench(b, lib, budget, not (args.quick or args.no_compile))
            for b in benches() if args.only is None or args.only in b.name]
    report(rows, threads, time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
