"""Compiling the LLVM target's GPU flavour: LLVM IR to PTX (llvmlite's NVPTX backend) to cubin (``ptxas``).

``compile_ptx(source, "sm_90")`` lowers a module from :mod:`arke.targets.llvm.nvptx` to PTX;
``assemble(ptx, "sm_90")`` runs the ``ptxas`` that ships with Triton (no GPU needed) and
returns the cubin with each entry's registers and spills. Both go through the on-disk cache
(:func:`arke.runtime.cache.default_cache`), keyed by the input text, the architecture and the
toolchain's version, as :mod:`arke.targets.llvm.kernel` keys object code.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from functools import cache
from typing import Any

from arke.targets.base import Resource
from arke.targets.nvidia.cubin import arch_of, cubin_resources

#: The PTX ISA version each architecture's code declares (``+ptx80`` is what CUDA 12 ``ptxas`` takes for sm_90).
PTX_FEATURES = {"sm_90": "+ptx80", "sm_80": "+ptx80"}
_LOCK = threading.Lock()  # llvmlite's target machines are not documented as thread-safe


class PtxasMissingError(RuntimeError):
    """No ``ptxas`` (it ships with Triton: ``pip install triton``)."""


@dataclass(frozen=True)
class AssembledEntry:
    """One kernel entry of an assembled cubin: registers per thread, and spills (4-byte words of
    local memory per thread, as Triton counts them)."""

    entry: str
    registers: int
    spills: int
    stack: int


def arch_name(arch: str) -> str:
    """``sm_90``/``sm_80`` from any spelling :func:`arke.targets.nvidia.cubin.arch_of` takes."""
    arch_of(arch)  # raises ValueError naming the known ones
    return "sm_" + arch.lower().removeprefix("sm").lstrip("_")


@cache
def _target_machine(arch: str) -> Any:
    import llvmlite.binding as llvm

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    target = llvm.Target.from_triple("nvptx64-nvidia-cuda")
    return target.create_target_machine(cpu=arch, features=PTX_FEATURES[arch], opt=3)


def _compile_ptx(source: str, arch: str) -> str:
    import llvmlite.binding as llvm

    with _LOCK:
        tm = _target_machine(arch)
        mod = llvm.parse_assembly(source)
        mod.data_layout = str(tm.target_data)
        mod.verify()
        builder = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
        builder.getModulePassManager().run(mod, builder)
        return str(tm.emit_assembly(mod))


def ptx_key(source: str, arch: str) -> str:
    """The cache key of the PTX llvmlite's NVPTX backend makes of LLVM IR ``source`` for ``arch``."""
    import llvmlite

    from arke.runtime.cache import cache_key

    return cache_key(kind="ptx", target="llvm-nvptx", source=source, arch=arch_name(arch),
                     llvmlite=llvmlite.__version__)


def compile_ptx(source: str, arch: str = "sm_90") -> str:
    """PTX for ``arch`` (``sm_80``/``sm_90``) of an NVPTX LLVM IR module, optimised at O3 (cached on disk)."""
    from arke.runtime.cache import default_cache

    arch = arch_name(arch)
    key = ptx_key(source, arch)
    data = default_cache().get_or_build(key, lambda: _compile_ptx(source, arch).encode(),
                                        meta={"target": "llvm-nvptx", "arch": arch})
    return data.decode()


@cache
def ptxas_path() -> str | None:
    """The ``ptxas`` that ships with Triton (beside its ``cuobjdump``), else one on ``PATH``; None if neither."""
    import shutil

    try:
        import triton

        path = os.path.join(os.path.dirname(str(triton.__file__)), "backends", "nvidia", "bin", "ptxas")
        if os.access(path, os.X_OK):
            return path
    except ImportError:
        pass
    return shutil.which("ptxas")


def _assemble(ptx: str, arch: str) -> bytes:
    path = ptxas_path()
    if path is None:
        raise PtxasMissingError("assembling PTX needs ptxas (it ships with Triton: pip install triton)")
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w", encoding="utf-8") as f:
            f.write(ptx)
        run = subprocess.run([path, f"-arch={arch}", src, "-o", out], capture_output=True, text=True, timeout=300)
        if run.returncode != 0:
            raise RuntimeError(f"ptxas failed for {arch}:\n{run.stderr}")
        with open(out, "rb") as f:
            return f.read()


def assemble(ptx: str, arch: str = "sm_90") -> tuple[bytes, list[AssembledEntry]]:
    """The cubin of ``ptx`` for ``arch`` and each entry's resources (read back with ``cuobjdump``)."""
    from arke.runtime.cache import cache_key, default_cache

    arch = arch_name(arch)
    key = cache_key(kind="cubin", target="llvm-nvptx", ptx=ptx, arch=arch, ptxas=ptxas_path() or "")
    cubin = default_cache().get_or_build(key, lambda: _assemble(ptx, arch), meta={"target": "llvm-nvptx",
                                                                                   "arch": arch})
    entries = []
    for name in re.findall(r"^\.visible \.entry (\S+?)\(", ptx, re.M):
        regs, stack, _shared = cubin_resources(cubin, name)
        entries.append(AssembledEntry(name, regs, stack // 4, stack))
    return cubin, entries


def ptx_resources(ptx: str, arch: str) -> list[Resource]:
    """Each entry's registers and spills once ``ptx`` is assembled for ``arch`` (empty without ``ptxas``)."""
    if ptxas_path() is None:
        return []
    return [Resource(e.entry, registers=e.registers, spills=e.spills) for e in assemble(ptx, arch)[1]]


__all__ = ["AssembledEntry", "PtxasMissingError", "arch_name", "assemble", "compile_ptx", "ptx_resources",
           "ptxas_path"]
