"""Operators a user writes, side by side: arke (llvm target) against torch eager and torch.compile.

The operators are issue 17's, written in `.ak` as a user writes them from the spec
(``benchmarks/operators/operators.ak``): a GPT-2 MLP block, ALiBi attention, sliding-window
attention with a tanh softcap, an int4 weight-only linear with group scales, partial NeoX
rotary, group norm, cross-entropy with label smoothing and an ignore index, a causal depthwise
conv1d, QK-norm → RoPE → causal GQA attention, a mixture of experts with top-k routing and a
shared expert, greedy argmax, DeepSeek-V2's MLA decode with the up-projections absorbed, a
cumulative sum, and paged-attention decode through a block table. Each torch version is what a
user would write in eager torch (``F.scaled_dot_product_attention``, ``F.group_norm``,
``F.cross_entropy``, ``F.conv1d``, a loop over the routed experts, a loop over the sequences'
gathered KV blocks ...).

A report, not a test: every operator is first checked against torch (max |arke - torch| /
max |torch| under its tolerance; exact for argmax) and then timed with the shared helper
(``benchmarks/timing.py``: equal warm-up, interleaved rounds, median and spread). A mismatch or a
failure is printed in its row and makes the exit status 1, so ``--quick`` (tiny shapes, one
short round, no torch.compile) is also the test of the operators' correctness
(``tests/runtime/test_operators_bench.py``).

Both sides run on ``--threads`` threads (default 2: this machine's cores), on one OpenMP team.

    .venv/bin/python benchmarks/operators.py [--quick] [--only conv] [--budget 3] [--no-compile]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from operator_refs import OPERATORS, Operator
from timing import Measurement, format_seconds, measure

import arke

SOURCE = Path(__file__).resolve().parent / "operators" / "operators.ak"


@dataclass
class Row:
    op: Operator
    shape: str
    times: dict[str, Measurement] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    error: float = math.nan
    ok: bool = False
    failure: str = ""
    build_s: float = 0.0


def relative_error(got: Any, want: torch.Tensor) -> float:
    g, w = torch.as_tensor(got).double(), want.double()
    if g.shape != w.shape:
        return math.inf
    return float((g - w).abs().max() / w.abs().max().clamp_min(1e-30)) if w.numel() else 0.0


def short(err: BaseException) -> str:
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first[:100]}"


def run_operator(lib: Any, op: Operator, quick: bool, budget_s: float, compile_left: list[float],
                 use_compile: bool) -> Row:
    shape = op.quick if quick else op.full
    row = Row(op, ", ".join(f"{k}={v}" for k, v in shape.items()))
    args, scalars = op.make(torch.Generator().manual_seed(0), **shape)
    kernel = lib.kernels[op.kernel]
    start = time.perf_counter()
    got = kernel(*args, **scalars)  # the first call compiles (or loads from the on-disk cache)
    row.build_s = time.perf_counter() - start
    want = op.torch_fn(*args, **scalars)
    if op.exact:
        row.error = 0.0 if torch.equal(torch.as_tensor(got), want) else math.inf
    else:
        row.error = relative_error(got, want)
    row.ok = row.error <= op.tol
    candidates: dict[str, Callable[[], object]] = {"arke": lambda: kernel(*args, **scalars),
                                                   "torch": lambda: op.torch_fn(*args, **scalars)}
    if not use_compile:
        row.notes["torch.compile"] = "skipped (--quick or --no-compile)"
    elif compile_left[0] <= 0:
        row.notes["torch.compile"] = "compile budget spent"
    else:
        start = time.perf_counter()
        try:
            compiled = torch.compile(op.torch_fn, dynamic=False)
            compiled(*args, **scalars)
            candidates["torch.compile"] = lambda: compiled(*args, **scalars)
        except Exception as err:  # the optional competitor's failure is a note, never a crash
            row.notes["torch.compile"] = short(err)
        compile_left[0] -= time.perf_counter() - start
    row.times = measure(candidates, budget_s=budget_s, max_rounds=2 if quick else 25)
    return row


def ratio(row: Row, other: str) -> str:
    if "arke" not in row.times or other not in row.times:
        return "n/a"
    return f"{row.times['arke'].median / row.times[other].median:.2f}×"


def report(rows: list[Row], threads: int, wall_s: float, quick: bool) -> None:
    head = ["operator", "shape", "arke", "torch", "torch.compile", "arke/torch", "arke/compile", "check"]
    table = [head]
    for r in rows:
        if r.failure:
            table.append([r.op.name, r.shape, "", "", "", "", "", f"FAILED {r.failure}"])
            continue
        cells = [r.times[c].summary() if c in r.times else "n/a" for c in ("arke", "torch", "torch.compile")]
        check = ("ok" if r.ok else "MISMATCH") + (f" ({r.error:.0e})" if not r.op.exact else " (exact)")
        table.append([r.op.name, r.shape, *cells, ratio(r, "torch"), ratio(r, "torch.compile"), check])
    widths = [max(len(line[c]) for line in table) for c in range(len(head))]
    title = f"operators: arke (llvm) vs torch on {threads} threads{' — quick shapes' if quick else ''}"
    print(title)
    for n, line in enumerate(table):
        print("  ".join(cell.ljust(w) if c < 2 or c == len(head) - 1 else cell.rjust(w)
                        for c, (cell, w) in enumerate(zip(line, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))
    notes = {f"torch.compile n/a: {why}" for r in rows for why in r.notes.values()}
    for note in sorted(notes):
        print(note)
    builds = ", ".join(f"{r.op.name} {format_seconds(r.build_s)}" for r in rows if not r.failure)
    print(f"arke's first call per operator (compile or cache load, outside the timings): {builds}")
    failed = sum(1 for r in rows if r.failure)
    mismatched = sum(1 for r in rows if not r.failure and not r.ok)
    print(f"Times: median ± interquartile range over interleaved rounds; ratios below 1× mean arke is faster. "
          f"threads: arke {threads}, torch {torch.get_num_threads()} "
          f"(OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}); whole run {wall_s:.0f} s")
    print(f"{len(rows)} operators: {failed} failed, {mismatched} mismatched checks")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, one short round, no torch.compile")
    parser.add_argument("--budget", type=float, help="seconds of timed rounds per operator (default 4, --quick 0.2)")
    parser.add_argument("--threads", type=int, default=2, help="threads for arke and torch (default 2)")
    parser.add_argument("--only", help="run only operators whose name contains this text")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--compile-budget", type=float, default=240.0,
                        help="seconds torch.compile may spend compiling, all operators together (default 240)")
    args = parser.parse_args(argv)
    quick = bool(args.quick)
    budget = args.budget if args.budget is not None else (0.2 if quick else 4.0)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    lib = arke.build(SOURCE, target="llvm", threads=args.threads)
    compile_left = [args.compile_budget]
    rows: list[Row] = []
    for op in OPERATORS:
        if args.only and args.only not in op.name:
            continue
        print(f"{op.name} …", flush=True)
        try:
            rows.append(run_operator(lib, op, quick, budget, compile_left, not (quick or args.no_compile)))
        except Exception as err:  # a report never stops: the row says what broke
            shape = op.quick if quick else op.full
            rows.append(Row(op, ", ".join(f"{k}={v}" for k, v in shape.items()), failure=short(err)))
    report(rows, args.threads, time.perf_counter() - started, quick)
    return 0 if rows and all(r.ok and not r.failure for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

