"""This machine's measured limits, as the benchmarks and the tuner compare against them: the f32 FMA
peak (independent vector FMA chains, JIT-compiled for the host) on so many threads at once."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any

FMA_CHAINS = 16  # independent accumulators: FMA latency (4 cycles) × 2 units < 16, so the units never wait


def fma_ir(chains: int) -> str:
    """LLVM IR of ``fma_chains(n, out)``: ``chains`` independent ``a = a * 0.5 + 0.5`` chains, n steps.

    The fixed point is 1.0, so nothing overflows or goes subnormal; the sum is stored so the
    loop cannot be removed.
    """
    vec = "<16 x float>"
    splat = "<" + ", ".join(["float 5.000000e-01"] * 16) + ">"
    one = "<" + ", ".join(["float 1.000000e+00"] * 16) + ">"
    phis = [f"  %a{c} = phi {vec} [ {one}, %entry ], [ %b{c}, %loop ]" for c in range(chains)]
    steps = [f"  %b{c} = call {vec} @llvm.fma.v16f32({vec} %a{c}, {vec} {splat}, {vec} {splat})"
             for c in range(chains)]
    sums = ["  %s0 = fadd " + f"{vec} %b0, %b1"] + [f"  %s{c - 1} = fadd {vec} %s{c - 2}, %b{c}"
                                                   for c in range(2, chains)]
    return "\n".join([
        f"declare {vec} @llvm.fma.v16f32({vec}, {vec}, {vec})",
        "define void @fma_chains(i64 %n, ptr %out) {",
        "entry:", "  br label %loop",
        "loop:", "  %i = phi i64 [ 0, %entry ], [ %i1, %loop ]", *phis, *steps,
        "  %i1 = add i64 %i, 1", "  %more = icmp ult i64 %i1, %n", "  br i1 %more, label %loop, label %exit",
        "exit:", *sums, f"  store {vec} %s{chains - 2}, ptr %out, align 4", "  ret void", "}",
    ]) + "\n"


def jit_fma() -> tuple[Any, Callable[[int, Any], None]]:
    """The engine (keep it alive) and the JIT'd ``fma_chains`` for the host CPU."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    tm = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3)
    module = llvm.parse_assembly(fma_ir(FMA_CHAINS))
    module.verify()
    engine = llvm.create_mcjit_compiler(module, tm)
    engine.finalize_object()
    proto = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p)
    return engine, proto(engine.get_function_address("fma_chains"))


def fma_peak(threads: int, seconds: float) -> float:
    """FLOP/s of independent vector FMA chains on ``threads`` threads at once (best of 3)."""
    engine, fn = jit_fma()
    best = loop_rate(fn, FMA_CHAINS * 16 * 2, threads, seconds)
    del engine
    return best


def loop_rate(fn: Callable[[int, Any], None], per_step: float, threads: int, seconds: float) -> float:
    """Operations/s of a JIT'd loop ``fn(n, out)`` doing ``per_step`` operations per step, on ``threads``
    threads at once (one Python thread per core: ctypes releases the GIL), the best of three rounds."""
    outs = [(ctypes.c_float * 256)() for _ in range(threads)]
    n = 1 << 12
    while True:  # calibrate on one core: each thread should run about `seconds`
        start = time.perf_counter()
        fn(n, ctypes.addressof(outs[0]))
        took = time.perf_counter() - start
        if took > 0.05:
            break
        n *= 4
    n = max(1, int(n * seconds / took))
    best = 0.0
    for _ in range(3):
        workers = [threading.Thread(target=fn, args=(n, ctypes.addressof(outs[t]))) for t in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        _join(workers)
        best = max(best, threads * n * per_step / (time.perf_counter() - start))
    return best


def _join(workers: list[threading.Thread]) -> None:
    """Wait for every worker, even when Ctrl-C interrupts the wait: they run JIT'd code whose engine the
    interrupted caller frees as it unwinds (the process then died of a segmentation fault, not exit 130). Their
    loops are bounded (about ``seconds``), so the wait is too; the interrupt is raised once they are done."""
    interrupted: BaseException | None = None
    for w in workers:
        while w.is_alive():
            try:
                w.join()
            except KeyboardInterrupt as err:
                interrupted = err
    if interrupted is not None:
        raise interrupted
