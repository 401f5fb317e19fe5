"""What a bundle is built for: the host, or a CPU named with ``--cpu`` (and ``--triple``).

A bundle's object code is compiled for one target machine, and may use every feature that machine
has. For the host that is every feature LLVM finds here, so the bundle requires all of the host's
ISA flags (:func:`arke.runtime.bundle_files.isa_flags`); a named CPU requires the flags listed below, the
ones its LLVM definition enables that a kernel's code can use. The vector width and the matrix units
the renderer targets come from the same table, as :func:`~arke.targets.llvm.jit.host_renderer`
takes them from the host.
"""

from __future__ import annotations

from dataclasses import dataclass

from arke.targets.llvm.isa import AMX, AMX_INT8, DPBF16, VNNI


@dataclass(frozen=True)
class CPU:
    """A target CPU: its architecture, vector width, matrix units and the ISA flags (as Linux's
    ``/proc/cpuinfo`` names them) a host needs to run its code."""

    arch: str
    vector_bits: int
    units: frozenset[str]
    flags: frozenset[str]


_V1 = frozenset({"sse", "sse2"})
_V2 = _V1 | {"ssse3", "sse4_1", "sse4_2", "popcnt", "cx16"}
_V3 = _V2 | {"avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "abm"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
_ICL = _V4 | {"avx512_vnni", "avx512vbmi", "avx512_vbmi2", "avx512ifma", "avx512_bitalg", "avx512_vpopcntdq",
              "gfni", "vaes", "vpclmulqdq"}
_SPR = _ICL | {"avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8"}
_N1 = frozenset({"fp", "asimd", "asimdhp", "fphp", "asimddp", "atomics"})
_V1_ARM = _N1 | {"sve", "bf16", "i8mm"}

#: The CPUs ``--cpu`` takes (LLVM's names).
CPUS: dict[str, CPU] = {
    "x86-64": CPU("x86_64", 128, frozenset(), _V1),
    "x86-64-v2": CPU("x86_64", 128, frozenset(), _V2),
    "x86-64-v3": CPU("x86_64", 256, frozenset(), _V3),
    "haswell": CPU("x86_64", 256, frozenset(), _V3),
    "znver3": CPU("x86_64", 256, frozenset(), _V3),
    "x86-64-v4": CPU("x86_64", 512, frozenset(), _V4),
    "skylake-avx512": CPU("x86_64", 512, frozenset(), _V4),
    "icelake-server": CPU("x86_64", 512, frozenset({VNNI}), _ICL),
    "znver4": CPU("x86_64", 512, frozenset({DPBF16, VNNI}), _ICL | {"avx512_bf16"}),
    "sapphirerapids": CPU("x86_64", 512, frozenset({AMX, DPBF16, AMX_INT8, VNNI}), _SPR),
    "neoverse-n1": CPU("aarch64", 128, frozenset(), _N1),
    "neoverse-v1": CPU("aarch64", 128, frozenset(), _V1_ARM),
    "generic": CPU("aarch64", 128, frozenset(), frozenset({"fp", "asimd"})),
}

#: The triple each architecture's bundles default to, and the C compiler that links them.
TRIPLES = {"x86_64": "x86_64-unknown-linux-gnu", "aarch64": "aarch64-unknown-linux-gnu"}
LINKERS = {"x86_64": "x86_64-linux-gnu-gcc", "aarch64": "aarch64-linux-gnu-gcc"}


def arch_of(triple: str) -> str:
    """The architecture of a target triple (``aarch64-linux-gnu`` -> ``aarch64``)."""
    head = triple.split("-")[0]
    return {"arm64": "aarch64", "amd64": "x86_64"}.get(head, head)
