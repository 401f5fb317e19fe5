"""Compiling the CUDA-C target: CUDA C to PTX with NVRTC (loaded through ctypes), then cubin with ``ptxas``.

NVRTC comes from the ``nvidia-cuda-nvrtc-cu12`` wheel (``pip install 'arke[cuda]'``); no GPU and no
CUDA toolkit are needed. ``compile_ptx(source, "sm_90", kernel="mm")`` returns PTX for
``compute_90`` (cached on disk, keyed by the source, the architecture and NVRTC's version); an
NVRTC error is a :class:`NvrtcError` naming the kernel, with NVRTC's log. Assembling reuses the
LLVM target's GPU flavour (:func:`arke.targets.nvidia.ptx.assemble`: Triton's ``ptxas``).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
from functools import cache
from typing import TYPE_CHECKING, Any

from arke.targets.nvidia.ptx import arch_name, assemble, ptxas_path

if TYPE_CHECKING:
    from arke.plan.dispatch import KernelPlan

#: The message of a missing NVRTC (what to install).
MISSING = "the cuda target needs NVRTC: pip install 'arke[cuda]' (the nvidia-cuda-nvrtc-cu12 package)"
#: NVRTC's options besides the architecture: no CUDA headers are included, so functions without
#: ``__device__`` (the shared conversion code) default to device ones; products are never fused
#: into adds (the interpreter rounds each).
OPTIONS = ("-default-device", "--std=c++17", "--fmad=false")
_LOCK = threading.Lock()


class NvrtcMissingError(RuntimeError):
    """NVRTC is not installed (``pip install 'arke[cuda]'``)."""


class NvrtcError(RuntimeError):
    """NVRTC rejected a kernel's source: ``kernel`` names it (with the dispatch and the strategy's
    decisions when known: ``where``), ``log`` is NVRTC's message."""

    def __init__(self, kernel: str, arch: str, log: str, where: str = ""):
        super().__init__(f"NVRTC could not compile kernel `{kernel}`{where} for {arch}:\n{log.strip()}")
        self.kernel, self.arch, self.log, self.where = kernel, arch, log, where


def blame(source: str, log: str, plan: KernelPlan) -> str:
    """`` (dispatch <entry>, <family>; strategy: <decisions>)``: the dispatch whose function holds the
    first line NVRTC's log names, and the decisions that shaped it (the defaults: none)."""
    import re

    found = re.search(r"\((\d+)\): error", log)
    entry = None
    if found:
        line = int(found.group(1))
        heads = [(k + 1, m.group(1)) for k, text in enumerate(source.splitlines())
                 for m in [re.match(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(', text)] if m]
        entry = next((name for at, name in reversed(heads) if at <= line), None)
    parts = []
    if entry is not None:
        ordinal = re.match(r".*_d(\d+)", entry)  # entries may carry a suffix (`_mv`, `s`)
        k = int(ordinal.group(1)) if ordinal else -1
        family = plan.dispatches[k].family if 0 <= k < len(plan.dispatches) else ""
        parts.append(f"dispatch {entry}" + (f", {family}" if family else ""))
    decided = ", ".join(f"{d.kind}{' ' + d.subject if d.subject else ''}"
                        f"{' = ' + str(d.value) if d.value is not None else ''}" for d in plan.decisions)
    parts.append(f"strategy: {decided}" if decided else "default strategy")
    return f" ({'; '.join(parts)})"


def library_path() -> str | None:
    """Where ``libnvrtc.so.12`` of the ``nvidia-cuda-nvrtc-cu12`` package is, or None."""
    try:
        spec = importlib.util.find_spec("nvidia.cuda_nvrtc")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, "lib", "libnvrtc.so.12")
        if os.path.exists(path):
            return path
    return None


@cache
def _library() -> Any:
    path = library_path()
    if path is None:
        raise NvrtcMissingError(MISSING)
    try:
        return ctypes.CDLL(path)
    except OSError as err:
        raise NvrtcMissingError(f"{MISSING}; loading {path} failed: {err}") from None


def available() -> bool:
    """Whether NVRTC can be loaded."""
    try:
        _library()
    except NvrtcMissingError:
        return False
    return True


def version() -> str:
    """NVRTC's version, ``"12.9"``."""
    lib = _library()
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


def _text(lib: Any, prog: ctypes.c_void_p, size_fn: str, get_fn: str) -> str:
    n = ctypes.c_size_t()
    getattr(lib, size_fn)(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    getattr(lib, get_fn)(prog, buf)
    return buf.value.decode(errors="replace")


def _compile(source: str, arch: str, kernel: str, plan: KernelPlan | None = None) -> str:
    lib = _library()
    prog = ctypes.c_void_p()
    with _LOCK:
        status = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{kernel or 'kernel'}.cu".encode(),
                                        0, None, None)
        if status != 0:
            raise NvrtcError(kernel, arch, f"nvrtcCreateProgram failed with status {status}")
        try:
            opts = [f"--gpu-architecture=compute_{arch.removeprefix('sm_')}".encode(), *(o.encode() for o in OPTIONS)]
            status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
            if status != 0:
                log = _text(lib, prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog")
                raise NvrtcError(kernel, arch, log, blame(source, log, plan) if plan is not None else "")
            return _text(lib, prog, "nvrtcGetPTXSize", "nvrtcGetPTX")
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


def ptx_key(source: str, arch: str) -> str:
    """The cache key of the PTX NVRTC makes of CUDA C ``source`` for ``arch``."""
    from arke.runtime.cache import cache_key

    return cache_key(kind="ptx", target="cuda", source=source, arch=arch_name(arch), nvrtc=version(),
                     options=" ".join(OPTIONS))


def compile_ptx(source: str, arch: str = "sm_90", kernel: str = "", plan: KernelPlan | None = None) -> str:
    """PTX of CUDA C ``source`` for ``arch`` (``sm_80``/``sm_90``: NVRTC's ``compute_80``/``compute_90``),
    cached on disk; :class:`NvrtcError` names ``kernel`` when NVRTC rejects it (and, given its
    ``plan``, the dispatch and the strategy's decisions)."""
    from arke.runtime.cache import default_cache

    arch = arch_name(arch)
    key = ptx_key(source, arch)
    data = default_cache().get_or_build(key, lambda: _compile(source, arch, kernel, plan).encode(),
                                        meta={"target": "cuda", "arch": arch})
    return data.decode()


__all__ = ["MISSING", "NvrtcError", "NvrtcMissingError", "arch_name", "assemble", "available", "blame", "compile_ptx",
           "library_path", "ptxas_path", "version"]
