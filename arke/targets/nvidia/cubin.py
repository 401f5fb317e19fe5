"""What the NVIDIA GPU targets share about compiled code: architectures, their limits, and the
resources a cubin's entries need.

:data:`ARCHS` holds each architecture arke builds for (its compute capability and the shared
memory one block may use; :func:`arch_of` reads any spelling of its name). A
:class:`CompiledEntry` is one launch compiled for an architecture with its registers, spills
and shared memory; :func:`cubin_resources` reads them from a cubin with the ``cuobjdump``
that ships with Triton (:func:`require_triton`), and :func:`resource_table` is the table
``akc build`` prints of them.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from types import ModuleType

#: Architectures we compile for: arch name -> (compute capability, most shared memory one block may use, bytes).
ARCHS: dict[str, tuple[int, int]] = {
    "sm_90": (90, 227 * 1024),  # H100/H200: 227 KB opt-in per block
    "sm_80": (80, 163 * 1024),  # A100: 163 KB opt-in per block
}
MAX_REGISTERS = 255  # per thread, on every architecture we target
REGISTERS_PER_BLOCK = 65536

_RESOURCE_LINE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


class TritonMissingError(RuntimeError):
    """Triton is not installed (``pip install triton``)."""


@dataclass(frozen=True)
class CompiledEntry:
    """One launch of a kernel compiled for an architecture, and the resources it needs per block.

    ``spills`` counts 4-byte words of local memory per thread (as Triton's ``n_spills`` does);
    ``stack`` is the same in bytes; ``shared`` the dynamic shared memory Triton allocates
    plus any static shared memory of the cubin.
    """

    kernel: str
    entry: str
    arch: str
    ptx: str
    cubin: bytes
    registers: int
    spills: int
    stack: int
    shared: int
    num_warps: int
    num_stages: int
    options: tuple[tuple[str, int], ...]


def require_triton() -> ModuleType:
    """The ``triton`` module, or :class:`TritonMissingError` with how to install it."""
    try:
        import triton
    except ImportError as err:
        raise TritonMissingError("the triton target needs Triton: pip install triton") from err
    return triton


def arch_of(name: str) -> tuple[int, int]:
    """(compute capability, shared memory limit) of ``sm_90``/``sm_80`` (``90`` and ``sm90`` also work)."""
    key = "sm_" + name.lower().removeprefix("sm").lstrip("_")
    if key not in ARCHS:
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join(ARCHS)}")
    return ARCHS[key]


def _cuobjdump() -> str:
    triton = require_triton()
    try:
        path = str(triton.knobs.nvidia.cuobjdump.path)
    except AttributeError:
        path = os.path.join(os.path.dirname(str(triton.__file__)), "backends", "nvidia", "bin", "cuobjdump")
    return path


def cubin_resources(cubin: bytes, name: str) -> tuple[int, int, int]:
    """(registers, stack bytes, static shared bytes) of function ``name`` in a cubin, from ``cuobjdump``."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        out = subprocess.run([_cuobjdump(), "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=True, timeout=60).stdout
    finally:
        os.unlink(f.name)
    current = None
    for line in out.splitlines():
        head = re.match(r"\s*Function (\S+):", line)
        if head:
            current = head.group(1)
            continue
        m = _RESOURCE_LINE.search(line)
        if m and current == name:
            return int(m.group(1)), int(m.group(2)) + int(m.group(4)), int(m.group(3))
    raise RuntimeError(f"cuobjdump reports no resource usage for `{name}`:\n{out}")


def resource_table(entries: list[CompiledEntry]) -> str:
    """A text table of each entry's registers, spills and shared memory (``akc build`` prints it)."""
    head = ("kernel", "entry", "arch", "warps", "stages", "regs", "spills", "shared")
    rows = [head] + [(e.kernel, e.entry, e.arch, str(e.num_warps), str(e.num_stages), str(e.registers),
                      str(e.spills), f"{e.shared / 1024:.1f} KB") for e in entries]
    widths = [max(len(r[k]) for r in rows) for k in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if k < 3 else c.rjust(w) for k, (c, w) in enumerate(zip(r, widths)))
                     for r in rows) + "\n"
