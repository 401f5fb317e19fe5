"""llvmlite for this CPU: the target machine with the host's features, the optimisation pipeline,
object code, assembly, and loading object code into the process (:class:`Loaded`)."""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Callable
from functools import cache
from typing import Any


@cache
def _llvm() -> Any:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    libm = ctypes.util.find_library("m")
    if libm:  # expf, tanhf, erff ... for the JIT's symbol lookups
        llvm.load_library_permanently(libm)
    return llvm


def _new_target_machine(cpu: str | None = None) -> Any:
    llvm = _llvm()
    target = llvm.Target.from_default_triple()
    if cpu is not None:
        return target.create_target_machine(cpu=cpu, features="", opt=3, codemodel="jitdefault")
    features = llvm.get_host_cpu_features().flatten()
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=features, opt=3,
                                        codemodel="jitdefault")


@cache
def target_machine(cpu: str | None = None) -> Any:
    """The host's target machine (its CPU name and features: AVX-512 where present), or the
    machine of another ``cpu`` of the host's architecture (``"haswell"``: AVX2; ``"x86-64"``:
    SSE2 only), whose code also runs here: the tests check every vector width on one host."""
    return _new_target_machine(cpu)


def optimise(source: str, cpu: str | None = None) -> Any:
    """Parse, verify and optimise (O3, loop and SLP vectorisation) an LLVM IR module."""
    llvm = _llvm()
    module = llvm.parse_assembly(source)
    module.verify()
    tm = target_machine(cpu)
    options = llvm.create_pipeline_tuning_options(speed_level=3)
    builder = llvm.create_pass_builder(tm, options)
    builder.getModulePassManager().run(module, builder)
    return module


def compile_object(source: str, cpu: str | None = None) -> bytes:
    """Object code of an LLVM IR module for the host (what the on-disk cache stores), or for
    another ``cpu`` of the host's architecture (see :func:`target_machine`)."""
    return bytes(target_machine(cpu).emit_object(optimise(source, cpu)))


def assembly(source: str) -> str:
    """Host assembly of an LLVM IR module (``akc build --emit asm``)."""
    return str(target_machine().emit_assembly(optimise(source)))


def host_vector_bits() -> int:
    """The widest float vector the host computes natively: 512 (AVX-512), 256 (AVX2/AVX), else 128."""
    features = set(_llvm().get_host_cpu_features().flatten().split(","))
    if "+avx512f" in features:
        return 512
    if "+avx2" in features or "+avx" in features:
        return 256
    return 128


def host_panel_width() -> int:
    """The panel width (``nr``) this host's contraction kernels read prepacked weights in."""
    from arke.targets.llvm.gemm import panel_width

    return panel_width(host_vector_bits())


def host_renderer() -> Any:
    """The LLVM renderer sized for this machine's vectors, with the matrix units it has (and may use)."""
    from arke.targets.llvm.isa import host_units
    from arke.targets.llvm.render import LLVMRenderer

    return LLVMRenderer(vector_bits=host_vector_bits(), units=host_units())


class Loaded:
    """Object code loaded into a JIT engine, kept alive with the functions taken from it."""

    _lock = threading.Lock()

    def __init__(self, obj: bytes):
        llvm = _llvm()
        with self._lock:
            # the engine owns (and frees) its target machine: never hand it the shared, cached one
            self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), _new_target_machine())
            self.engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
            self.engine.finalize_object()

    def function(self, name: str, n_buffers: int) -> Callable[..., None]:
        address = self.engine.get_function_address(name)
        if not address:
            raise RuntimeError(f"compiled code has no function `{name}`")
        proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * n_buffers), ctypes.c_void_p, ctypes.c_int64,
                                 ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)
        fn: Callable[..., None] = proto(address)
        return fn
