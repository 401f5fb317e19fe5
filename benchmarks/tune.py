"""akc tune, measured: tuned f32 matmuls against their defaults, torch eager and torch.compile as a % of
the machine's FMA peak (from the same run), and the sampler against an exhaustive sweep of a small space.

    .venv/bin/python benchmarks/tune.py [--quick] [--budget 40] [--sizes 1024,2048] [--db URL]

Tuning writes to the tuning database (default ~/.cache/arke/tuning.db, or --db), so
``benchmarks/cpu.py``'s tuned column shows the same choices afterwards. Times are medians over
interleaved rounds (benchmarks/timing.py); the tuner confirms its choice against the defaults itself.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import measure

import arke
from arke.runtime.host import cores
from arke.runtime.peaks import fma_peak
from arke.tune import tune

ROOT = Path(__file__).resolve().parents[1]
MATMUL = ROOT / "arke" / "stdlib" / "nn.ak"
console = Console(width=None if sys.stdout.isatty() else 170)


def matmul_rows(sizes: list[int], budget: int, db: str | None, peak: float, compiled: bool) -> Table:
    table = Table(title="tuned f32 matmul (std.nn.matmul) vs its defaults and torch, % of the measured FMA peak")
    for column in ("M=N=K", "defaults", "tuned", "torch", "torch.compile", "tuned/defaults", "torch/tuned",
                   "compile/tuned", "tuned % peak", "defaults % peak", "torch % peak", "tuning", "decisions"):
        table.add_column(column)
    for n in sizes:
        table.add_row(*one_size(n, budget, db, peak, compiled))
    return table


def one_size(n: int, budget: int, db: str | None, peak: float, compiled: bool) -> list[str]:
    """Tune matmul at n³, then time its defaults, the tuned build, torch and torch.compile interleaved."""
    console.print(f"tuning matmul {n}³ (budget {budget}) …")
    result = tune(MATMUL, "matmul", {"M": n, "N": n, "K": n}, budget=budget, db=db,
                  progress=lambda line: console.print(f"  {line}", highlight=False))
    g = torch.Generator().manual_seed(n)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    plain = arke.build(MATMUL, tuning="off").matmul
    tuned = arke.build(MATMUL, tuning="on").matmul
    cands: dict[str, Any] = {"defaults": lambda: plain(a, b), "tuned": lambda: tuned(a, b),
                             "torch": lambda: torch.matmul(a, b)}
    if compiled:
        fn = torch.compile(torch.matmul, dynamic=False)
        fn(a, b)
        cands["torch.compile"] = lambda: fn(a, b)
    plain(a, b), tuned(a, b)
    m = measure(cands, budget_s=8)
    flops = 2.0 * n ** 3

    def pct(name: str) -> str:
        return f"{flops / m[name].median / peak * 100:.0f}%" if name in m else "n/a"

    def over(x: str, y: str) -> str:
        return f"{m[x].median / m[y].median:.2f}×" if x in m and y in m else "n/a"

    return [str(n), m["defaults"].summary(), m["tuned"].summary(), m["torch"].summary(),
            m["torch.compile"].summary() if "torch.compile" in m else "n/a", over("defaults", "tuned"),
            over("torch", "tuned"), over("torch.compile", "tuned"), pct("tuned"), pct("defaults"), pct("torch"),
            f"{result.seconds:.0f} s", ", ".join(result.changed()) or "defaults kept"]


def built(strategy: Any) -> Any:
    """std.nn.matmul built with ``strategy`` alone (None: its defaults), the database not consulted."""
    import dataclasses

    from arke.ir import strategy as sir

    module = arke.load(MATMUL)
    mine = () if strategy is None else (dataclasses.replace(strategy, kernel=module.kernel_map["matmul"]),)
    return arke.build(dataclasses.replace(module, strategies=sir.StrategySet(mine)), tuning="off").matmul


def sweep_row(n: int, budget: int, db: str | None) -> Table:
    """The sampler with ``budget`` measurements against every point of a small space (tile m × tile k)."""
    table = Table(title=f"sampler vs exhaustive sweep: matmul {n}³, decisions tile _m × tile _k")
    for column in ("search", "measured", "best point", "best (re-measured)", "vs sweep's best", "seconds"):
        table.add_column(column)
    keys = ["tile _m", "tile _k"]
    start = time.perf_counter()
    sweep = tune(MATMUL, "matmul", {"M": n, "N": n, "K": n}, db=db, decisions=keys, exhaustive=True)
    sweep_s = time.perf_counter() - start
    start = time.perf_counter()
    sampled = tune(MATMUL, "matmul", {"M": n, "N": n, "K": n}, db=db, decisions=keys, budget=budget, seed=1)
    sampled_s = time.perf_counter() - start

    def best(result: Any) -> Any:
        return min((t for t in result.trials if t.outcome == "ok"), key=lambda t: t.median)

    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    kernels = {}
    for name, result in (("sweep", sweep), ("sampler", sampled)):
        kernels[name] = built(best(result).strategy)
        kernels[name](a, b)
    m = measure({k: (lambda k=k: kernels[k](a, b)) for k in kernels}, budget_s=6)
    for name, result, seconds in (("exhaustive", sweep, sweep_s), (f"TPE, budget {budget}", sampled, sampled_s)):
        key = "sweep" if name == "exhaustive" else "sampler"
        point = best(result)
        words = ", ".join(d.kind + " " + str(d.subject) + " = " + str(d.value) for d in point.strategy.decisions) \
            if point.strategy else "defaults"
        table.add_row(name, str(sum(1 for t in result.trials if t.outcome == "ok")), words, m[key].summary(),
                      f"{m[key].median / m['sweep'].median:.3f}×", f"{seconds:.0f}")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="256³, budget 8, a 6-point sweep (about a minute)")
    parser.add_argument("--budget", type=int, default=None, help="measurements per tuning run (default 40)")
    parser.add_argument("--sizes", default=None, help="matmul sizes (default 1024,2048)")
    parser.add_argument("--db", default=None, help="the tuning database (default: ARKE_TUNING_DB or SQLite)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = parser.parse_args(argv)
    sizes = [int(x) for x in (args.sizes or ("256" if args.quick else "1024,2048")).split(",")]
    budget = args.budget or (8 if args.quick else 40)
    peak = fma_peak(cores(), 0.2 if args.quick else 0.5)
    from arke.tune.machine import cpu

    console.print(f"FMA peak {peak / 1e9:.0f} GFLOP/s on {cores()} threads; {cpu()['model']}")
    console.print(matmul_rows(sizes, budget, args.db, peak, not (args.quick or args.no_compile)))
    console.print(sweep_row(128 if args.quick else 512, 6 if args.quick else 30, args.db))
    return 0


if __name__ == "__main__":
    sys.exit(main())
