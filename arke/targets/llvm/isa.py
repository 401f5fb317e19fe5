"""The CPU's matrix units: which the host has, and the Linux permission AMX needs before its first use.

A contraction of bf16 operands runs on the best unit the renderer was given (:data:`AMX` tiles,
else :data:`DPBF16` — AVX512-BF16's ``VDPBF16PS`` — else f32 FMAs). The renderer is told the units
explicitly (``LLVMRenderer(units=...)``) so the code for each ISA can be built and tested on any
host; :func:`host_units` is what kernels built for this machine get.

AMX's tile data is a dynamically enabled XSAVE feature on Linux (kernel 5.16 and later): a process
must ask for it (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``) before any thread runs a
tile instruction, else the first one faults (SIGILL). :func:`amx_permitted` asks once per process;
where the request fails (an older kernel, a hypervisor that hides the state) the host is treated as
having no AMX.
"""

from __future__ import annotations

import ctypes
import platform
import sys
from functools import cache

#: AMX tiles: ``TDPBF16PS`` (bf16 pairs, f32 sums) — features ``amx-tile`` and ``amx-bf16``.
AMX = "amx-bf16"
#: AVX512-BF16: ``VDPBF16PS`` (bf16 pairs into 16 f32 lanes) — feature ``avx512bf16``.
DPBF16 = "avx512bf16"
#: AMX tiles: ``TDPBSSD`` (int8 quads, i32 sums) — features ``amx-tile`` and ``amx-int8``.
AMX_INT8 = "amx-int8"
#: AVX512-VNNI: ``VPDPBUSD`` (unsigned × signed int8 quads into 16 i32 lanes) — feature ``avx512vnni``.
VNNI = "avx512vnni"
#: The bf16 units the LLVM target has code for, best first.
UNITS = (AMX, DPBF16)
#: The int8 units (an int8 × int8 → i32 contraction is claimed only where one is present).
INT8_UNITS = (AMX_INT8, VNNI)

_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
_SYS_ARCH_PRCTL = 158  # x86-64


def _features() -> set[str]:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    return {f[1:] for f in llvm.get_host_cpu_features().flatten().split(",") if f.startswith("+")}


@cache
def amx_permitted() -> bool:
    """Ask Linux (once per process) for the AMX tile data state; whether this process may use the tiles."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)) == 0
    except (OSError, AttributeError):
        return False


@cache
def host_units() -> frozenset[str]:
    """The matrix units this host has and this process may use (AMX only once Linux permits it)."""
    have = _features()
    units = set()
    if {"amx-tile", "amx-bf16"} <= have and "avx512f" in have and amx_permitted():
        units.add(AMX)
    if {"amx-tile", "amx-int8"} <= have and "avx512f" in have and amx_permitted():
        units.add(AMX_INT8)
    if {"avx512bf16", "avx512bw"} <= have:
        units.add(DPBF16)
    if {"avx512vnni", "avx512bw"} <= have:
        units.add(VNNI)
    return frozenset(units)


def missing(unit: str) -> str | None:
    """Why this host cannot run ``unit``'s code (None when it can): what a skipped test says."""
    if unit in host_units():
        return None
    if unit in (AMX, AMX_INT8) and {"amx-tile", unit} <= _features():
        return "this CPU has AMX but Linux refused the tile data permission (arch_prctl ARCH_REQ_XCOMP_PERM)"
    return f"this CPU has no {unit}"
