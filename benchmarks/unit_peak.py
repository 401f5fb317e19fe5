"""The peak of the CPU's bf16 matrix units, measured: the limit the bf16 rows of ``benchmarks/cpu.py``
are a percentage of (as the f32 rows are of the FMA peak).

* **AMX** — ``TDPBF16PS`` on tiles that stay in registers: four accumulator tiles (tmm0-3, 16 × 16
  f32) each multiplied by two operand tiles (tmm4-7) per step, 16 × 16 × 32 × 2 = 16,384 flops per
  instruction; no loads, so it is the unit's own rate.
* **AMX-INT8** — ``TDPBSSD`` the same way: 16 × 16 × 64 × 2 = 32,768 integer operations per instruction.
* **AVX512-VNNI** — ``VPDPBUSD`` on 16 independent ``<16 x i32>`` accumulators, 128 operations each.
* **AVX512-BF16** — ``VDPBF16PS`` on 16 independent ``<16 x float>`` accumulators, 64 flops each.

One Python thread per core runs the JIT'd loop (ctypes releases the GIL); the best of three rounds.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from arke.runtime.peaks import loop_rate
from arke.targets.llvm.isa import AMX, AMX_INT8, DPBF16, VNNI, amx_permitted

CHAINS = 16


def _amx_ir(tdp: str = "tdpbf16ps") -> str:
    cfg = ["  call void @llvm.memset.p0.i64(ptr align 64 %cfg, i8 0, i64 64, i1 false)", "  store i8 1, ptr %cfg"]
    for t in range(8):
        cfg += [f"  %cb{t} = getelementptr inbounds i8, ptr %cfg, i64 {16 + 2 * t}", f"  store i16 64, ptr %cb{t}",
                f"  %rw{t} = getelementptr inbounds i8, ptr %cfg, i64 {48 + t}", f"  store i8 16, ptr %rw{t}"]
    steps = [f"  call void @llvm.x86.{tdp}(i8 {c}, i8 {a}, i8 {b})" for c, (a, b) in
             enumerate(((4, 6), (4, 7), (5, 6), (5, 7)))]
    return "\n".join([
        "declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)", "declare void @llvm.x86.ldtilecfg(ptr)",
        "declare void @llvm.x86.tilezero(i8)", f"declare void @llvm.x86.{tdp}(i8, i8, i8)",
        "declare void @llvm.x86.tilestored64(i8, ptr, i64)", "declare void @llvm.x86.tilerelease()",
        "define void @unit(i64 %n, ptr %out) {", "entry:", "  %cfg = alloca [64 x i8], align 64", *cfg,
        "  call void @llvm.x86.ldtilecfg(ptr %cfg)",
        *[f"  call void @llvm.x86.tilezero(i8 {t})" for t in range(8)],
        "  br label %loop", "loop:", "  %i = phi i64 [ 0, %entry ], [ %i1, %loop ]", *steps,
        "  %i1 = add i64 %i, 1", "  %more = icmp ult i64 %i1, %n", "  br i1 %more, label %loop, label %exit",
        "exit:", "  call void @llvm.x86.tilestored64(i8 0, ptr %out, i64 64)", "  call void @llvm.x86.tilerelease()",
        "  ret void", "}"]) + "\n"


def _dp_ir() -> str:
    vec, pairs = "<16 x float>", "<32 x bfloat>"
    one = "<" + ", ".join(["bfloat 0xR3F80"] * 32) + ">"  # 1.0 in bf16
    zero = "zeroinitializer"
    phis = [f"  %a{c} = phi {vec} [ {zero}, %entry ], [ %b{c}, %loop ]" for c in range(CHAINS)]
    steps = [f"  %b{c} = call {vec} @llvm.x86.avx512bf16.dpbf16ps.512({vec} %a{c}, {pairs} {one}, {pairs} %x)"
             for c in range(CHAINS)]
    sums = ["  %s0 = fadd " + f"{vec} %b0, %b1"] + [f"  %s{c - 1} = fadd {vec} %s{c - 2}, %b{c}"
                                                   for c in range(2, CHAINS)]
    return "\n".join([
        f"declare {vec} @llvm.x86.avx512bf16.dpbf16ps.512({vec}, {pairs}, {pairs})",
        "define void @unit(i64 %n, ptr %out) {", "entry:",
        f"  %x = load {pairs}, ptr %out, align 4",  # zeros from the caller: the sums stay 0, never subnormal
        "  br label %loop", "loop:", "  %i = phi i64 [ 0, %entry ], [ %i1, %loop ]", *phis, *steps,
        "  %i1 = add i64 %i, 1", "  %more = icmp ult i64 %i1, %n", "  br i1 %more, label %loop, label %exit",
        "exit:", *sums, f"  store {vec} %s{CHAINS - 2}, ptr %out, align 4", "  ret void", "}"]) + "\n"


def _vnni_ir() -> str:
    vec = "<16 x i32>"
    phis = [f"  %a{c} = phi {vec} [ zeroinitializer, %entry ], [ %b{c}, %loop ]" for c in range(CHAINS)]
    steps = [f"  %b{c} = call {vec} @llvm.x86.avx512.vpdpbusd.512({vec} %a{c}, <64 x i8> %x, <64 x i8> %x)"
             for c in range(CHAINS)]
    sums = ["  %s0 = add " + f"{vec} %b0, %b1"] + [f"  %s{c - 1} = add {vec} %s{c - 2}, %b{c}"
                                                  for c in range(2, CHAINS)]
    return "\n".join([
        f"declare {vec} @llvm.x86.avx512.vpdpbusd.512({vec}, <64 x i8>, <64 x i8>)",
        "define void @unit(i64 %n, ptr %out) {", "entry:", "  %x = load <64 x i8>, ptr %out, align 4",
        "  br label %loop", "loop:", "  %i = phi i64 [ 0, %entry ], [ %i1, %loop ]", *phis, *steps,
        "  %i1 = add i64 %i, 1", "  %more = icmp ult i64 %i1, %n", "  br i1 %more, label %loop, label %exit",
        "exit:", *sums, f"  store {vec} %s{CHAINS - 2}, ptr %out, align 4", "  ret void", "}"]) + "\n"


#: flops per loop step of each unit's microbenchmark
FLOPS = {AMX: 4 * 16 * 16 * 32 * 2, AMX_INT8: 4 * 16 * 16 * 64 * 2, DPBF16: CHAINS * 16 * 2 * 2,
         VNNI: CHAINS * 16 * 4 * 2}


def _jit(unit: str) -> tuple[Any, Callable[[int, Any], None]]:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    tm = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3)
    source = {AMX: _amx_ir(), AMX_INT8: _amx_ir("tdpbssd"), VNNI: _vnni_ir()}.get(unit) or _dp_ir()
    module = llvm.parse_assembly(source)
    module.verify()
    engine = llvm.create_mcjit_compiler(module, tm)
    engine.finalize_object()
    proto = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p)
    return engine, proto(engine.get_function_address("unit"))


def unit_peak(unit: str, threads: int, seconds: float) -> float:
    """Operations/s (multiply-adds count 2) of ``unit`` (:data:`~arke.targets.llvm.isa.AMX`, ``AMX_INT8``,
    ``DPBF16`` or ``VNNI``) on ``threads`` threads at once."""
    if unit in (AMX, AMX_INT8) and not amx_permitted():
        raise RuntimeError("Linux refused the AMX tile data permission")
    engine, fn = _jit(unit)
    best = loop_rate(fn, FLOPS[unit], threads, seconds)
    del engine
    return best


def matrix_unit_peak(threads: int, seconds: float, units: tuple[str, ...] | None = None) -> tuple[str, float]:
    """The best of ``units`` (default: the bf16 ones) this host lets arke use, and its peak measured now
    ("", 0 if none)."""
    from arke.targets.llvm.isa import UNITS, host_units

    for unit in units or UNITS:
        if unit in host_units():
            return unit, unit_peak(unit, threads, seconds)
    return "", 0.0


if __name__ == "__main__":
    from arke.targets.llvm.isa import host_units

    for u in sorted(host_units()):
        print(f"{u}: {unit_peak(u, 2, 0.3) / 1e9:.0f} GFLOP/s on 2 threads")
