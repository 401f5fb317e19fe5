"""What this machine is, as every target's cache key and the benchmarks describe it."""

from __future__ import annotations

import os
from functools import cache

from arke import knobs


@cache
def host_description() -> str:
    """The process triple, CPU name and features (llvmlite's view of the host): part of every cache key."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return f"{llvm.get_process_triple()} {llvm.get_host_cpu_name()} {llvm.get_host_cpu_features().flatten()}"


def cores() -> int:
    """The cores this process may run on."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def default_threads() -> int:
    """``ARKE_THREADS``, else torch's thread count (``torch.get_num_threads()``: one pool, one size)."""
    chosen = knobs.threads()
    if chosen is not None:
        return chosen
    import torch

    return max(1, torch.get_num_threads())


@cache
def worker_limit() -> int:
    """The most workers a CPU launch runs on, whatever ``threads`` asks for: 4 per core, at least 8.

    More workers than cores only contend for them (and the chunks cut for the workers never
    change a result), so a request beyond this is cut to it, as it is to a launch's chunks.
    """
    return max(8, 4 * cores())


def run_threads(threads: int | None) -> int:
    """``threads`` when given (> 0), else :func:`default_threads`."""
    return threads if threads and threads > 0 else default_threads()
