"""Bundles against the JIT: what loading and the first call cost, and whether the code runs as fast.

* **Start-up**: a fresh Python process (torch already imported) that loads a bundle and makes its
  first call, against one that loads the `.ak` file and makes the first call through ``arke.build``
  from a warm on-disk cache (object code cached) and from a cold one (an empty cache: plan, render
  and compile). Only what follows ``import torch`` is timed, the median of a few processes.
* **Kernel time**: each bundled kernel against the same kernel through ``arke.build``, the same
  shapes and threads, timed in this process (the same code: the ratio should be 1 within noise).

    .venv/bin/python benchmarks/bundle.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import format_seconds, measure

import arke
from arke.lang.checker import stdlib_path
from arke.targets.llvm.bundle.build import build_bundle

NN = str(stdlib_path("std.nn"))
#: (kernel, shapes): a decode-sized matrix-vector product, a prefill-sized product and a row norm
KERNELS = {"linear": [(1, 4096), (4096, 4096)], "matmul": [(256, 1024), (1024, 1024)],
           "rmsnorm": [(512, 4096), (4096,)], "softmax": [(512, 4096)]}

_STARTUP = """
import sys, time, torch
torch.manual_seed(0)
args = [torch.randn(*s) for s in {shapes!r}]
start = time.perf_counter()
import arke
if sys.argv[1] == "bundle":
    kernel = arke.load_bundle(sys.argv[2]).{kernel}
else:
    kernel = arke.build(arke.load(sys.argv[2]), target="llvm").{kernel}
kernel(*args)
print(time.perf_counter() - start)
"""


def _startup(mode: str, path: str, kernel: str, cache: str, runs: int) -> float:
    code = _STARTUP.format(shapes=KERNELS[kernel], kernel=kernel)
    times = []
    for _ in range(runs):
        env = {**os.environ, "ARKE_CACHE_DIR": cache}
        done = subprocess.run([sys.executable, "-c", code, mode, path], capture_output=True, text=True, env=env,
                              check=True)
        times.append(float(done.stdout.strip().splitlines()[-1]))
    return statistics.median(times)


def startup_table(bundle: str, runs: int) -> Table:
    table = Table(title="start-up: load and first call in a fresh process (after import torch), median of "
                        f"{runs}")
    for col in ("kernel", "bundle", "arke.build, warm cache", "arke.build, cold cache", "warm ÷ bundle",
                "cold ÷ bundle"):
        table.add_column(col, justify="right" if col != "kernel" else "left")
    with tempfile.TemporaryDirectory() as warm:
        for kernel in KERNELS:
            loaded = _startup("bundle", bundle, kernel, warm, runs)
            _startup("build", NN, kernel, warm, 1)  # fills the warm cache
            hot = _startup("build", NN, kernel, warm, runs)
            with tempfile.TemporaryDirectory() as empty:
                cold = _startup("build", NN, kernel, empty, 1)
            table.add_row(kernel, format_seconds(loaded), format_seconds(hot), format_seconds(cold),
                          f"{hot / loaded:.1f}×", f"{cold / loaded:.1f}×")
    return table


def kernel_table(bundle: str, budget_s: float) -> Table:
    lib = arke.load_bundle(bundle)
    jit = arke.build(arke.load(NN), target="llvm")
    threads = torch.get_num_threads()
    table = Table(title=f"kernel time: bundle against arke.build, {threads} threads (same code: 1.00× is the aim)")
    for col in ("kernel", "shapes", "bundle", "arke.build", "bundle ÷ build"):
        table.add_column(col, justify="right" if col not in ("kernel", "shapes") else "left")
    torch.manual_seed(0)
    for kernel, shapes in KERNELS.items():
        args = [torch.randn(*s) for s in shapes]
        a, b = lib.kernels[kernel], jit.kernels[kernel]
        assert torch.equal(a(*args), b(*args)), f"{kernel}: the bundle's result differs from arke.build's"
        # timed one after the other, not interleaved: each runtime's idle workers spin for a while after a
        # call (the bundle's pool and the JIT's team alike) and would take the cores from the other's
        t_bundle = measure({"bundle": lambda a=a, args=args: a(*args)}, budget_s=budget_s)["bundle"].median
        time.sleep(0.05)
        t_build = measure({"build": lambda b=b, args=args: b(*args)}, budget_s=budget_s)["build"].median
        time.sleep(0.05)
        table.add_row(kernel, " · ".join(str(list(s)) for s in shapes), format_seconds(t_bundle),
                      format_seconds(t_build), f"{t_bundle / t_build:.2f}×")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer processes and a shorter timing budget")
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory() as work:
        bundle = str(Path(work) / "nn")
        build_bundle(arke.load(NN), bundle, list(KERNELS))
        console.print(startup_table(bundle, 3 if args.quick else 7))
        console.print(kernel_table(bundle, 1.0 if args.quick else 3.0))


if __name__ == "__main__":
    main()
