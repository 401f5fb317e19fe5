"""Run the CUDA-C target's kernels on the host: each translation unit compiled as C++ by g++.

There is no GPU here, so the CUDA C that :mod:`arke.codegen.cuda` renders is checked by
compiling it, after a prelude of shims (``__global__``, ``__launch_bounds__``, ``blockIdx`` ...
and host versions of the CUDA device functions glibc lacks), into a shared library with
``g++ -O1 -ffp-contract=off`` (NVRTC compiles with ``--fmad=false``: no contraction either).
Each entry gets a driver ``run_<entry>(args..., blocks)`` that runs every thread of the grid in
turn. :func:`run` allocates the plan's buffers, launches each dispatch in order and returns the
results as the runtimes do (NumPy for NumPy inputs, torch otherwise) with the error word.

Host floating point differs from the GPU's only in libm's last bits (glibc against libdevice).
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch

import arke
from arke.codegen.base import LaunchSpec
from arke.codegen.cuda import RENDERER
from arke.codegen.plan import KernelPlan, make_plan
from arke.ir.shapes import evaluate, parse_dim
from arke.runtime.guards import TORCH_DTYPES, prepare_args

#: Threads per block: the renderer's ``block`` option (``__launch_bounds__``).
BLOCK = 128

#: Shims that make a CUDA-C translation unit plain host C++ (prepended to the rendered source).
SHIMS = r"""
#include <math.h>
#define __global__
#define __device__
#define __launch_bounds__(n)
#define __restrict__ __restrict
#define __forceinline__ inline
struct ak_host_dim3 { unsigned x; };
static ak_host_dim3 blockIdx, threadIdx, blockDim;
/* CUDA device functions glibc lacks, computed exactly (the argument reduced mod 2 first: exact) */
static inline double ak_host_sinpi(double x) {
  long double r = fmodl((long double)x, 2.0L);
  return (double)sinl(3.14159265358979323846264338327950288L * r);
}
static inline double ak_host_cospi(double x) {
  long double r = fmodl((long double)x, 2.0L);
  return (double)cosl(3.14159265358979323846264338327950288L * r);
}
static inline float ak_host_sinpif(float x) { return (float)ak_host_sinpi(x); }
static inline float ak_host_cospif(float x) { return (float)ak_host_cospi(x); }
static inline float ak_host_int_as_float(int i) { float f; __builtin_memcpy(&f, &i, 4); return f; }
static inline int ak_host_float_as_int(float f) { int i; __builtin_memcpy(&i, &f, 4); return i; }
#define sinpi ak_host_sinpi
#define cospi ak_host_cospi
#define sinpif ak_host_sinpif
#define cospif ak_host_cospif
#define __int_as_float ak_host_int_as_float
#define __float_as_int ak_host_float_as_int
#define rsqrtf(x) (1.0f / sqrtf(x))
#define __fdividef(a, b) ((a) / (b))
#define exp10f(x) ((float)pow(10.0, (double)(x)))
"""

#: An entry's head as the renderer writes it: its name and parameter list.
_ENTRY = re.compile(r'^extern "C" __global__ void __launch_bounds__\(\d+\) (\w+)\((.*)\) \{$', re.M)

_WORK: list[Path] = []


def available() -> bool:
    """Whether g++ is installed (the host compiler these tests need)."""
    return shutil.which("g++") is not None


def _workdir() -> Path:
    """A private build directory for this process, removed at exit."""
    if not _WORK:
        path = Path(tempfile.mkdtemp(prefix="arke-cuda-host-"))
        atexit.register(shutil.rmtree, path, True)
        _WORK.append(path)
    return _WORK[0]


def host_source(source: str) -> str:
    """A rendered CUDA-C translation unit as host C++: the shims, the source, and one driver per entry.

    ``run_<entry>(args..., long long blocks)`` runs threads ``0 .. blocks * BLOCK - 1`` of the
    entry one after another (blockIdx.x outer, threadIdx.x inner).
    """
    drivers = []
    for name, params in _ENTRY.findall(source):
        args = [p.rsplit(" ", 1)[1] for p in params.split(", ")]
        drivers.append(
            f'extern "C" void run_{name}({params}, long long blocks) {{\n'
            f"  blockDim.x = {BLOCK};\n"
            "  for (long long b = 0; b < blocks; ++b) {\n"
            "    blockIdx.x = (unsigned)b;\n"
            f"    for (unsigned t = 0; t < {BLOCK}; ++t) {{ threadIdx.x = t; {name}({', '.join(args)}); }}\n"
            "  }\n}")
    return "\n".join([SHIMS, source, *drivers]) + "\n"


@cache
def compile_source(source: str) -> ctypes.CDLL:
    """The rendered CUDA-C ``source`` compiled for the host (once per process per source text)."""
    text = host_source(source)
    digest = hashlib.sha256(text.encode()).hexdigest()[:24]
    src, lib = _workdir() / f"k{digest}.cpp", _workdir() / f"k{digest}.so"
    src.write_text(text, encoding="utf-8")
    done = subprocess.run(["g++", "-O1", "-ffp-contract=off", "-std=gnu++17", "-shared", "-fPIC",
                           "-o", str(lib), str(src)], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"g++ failed on {src}:\n{done.stderr}")
    return ctypes.CDLL(str(lib))


@dataclass(frozen=True)
class HostKernel:
    """A kernel's plan, its rendered artifact and the host library it compiled to."""

    plan: KernelPlan
    source: str
    launches: tuple[LaunchSpec, ...]
    library: ctypes.CDLL


_KERNELS: dict[tuple[int, str], tuple[arke.Module, HostKernel]] = {}


def host_kernel(module: arke.Module, kernel: str) -> HostKernel:
    """Kernel ``kernel`` of ``module`` planned, rendered to CUDA C and compiled for the host (once)."""
    key = (id(module), kernel)
    if key not in _KERNELS:
        plan = make_plan(module.semantic, module.kernel_map[kernel], None, families=RENDERER.families)
        artifact = RENDERER.render(plan)
        source = str(artifact.source)
        # the module is kept alive with its kernel: its id stays unique
        _KERNELS[key] = (module, HostKernel(plan, source, tuple(artifact.launches), compile_source(source)))
    return _KERNELS[key][1]


def run(module: arke.Module, kernel: str, *arrays: Any, **scalars: Any) -> tuple[Any, int]:
    """Call ``kernel`` through its host-compiled CUDA C: ``(results, error word)``.

    The arguments are checked and converted as every runtime does them; the results come back
    as the runtimes return them (NumPy for NumPy inputs, except bf16; one value or a tuple).
    """
    k = host_kernel(module, kernel)
    plan, fn = k.plan, k.plan.function
    args, dims, any_torch = prepare_args(fn, arrays, scalars)
    buffers: list[torch.Tensor] = []
    for b in plan.buffers:
        if b.role == "param":  # f16/bf16 bits, bools one byte each: torch's layout is the ABI's
            buffers.append(args[b.name].contiguous())
        else:
            buffers.append(torch.zeros(tuple(evaluate(d, dims) for d in b.shape), dtype=TORCH_DTYPES[b.dtype]))
    dim_values = torch.tensor([dims[d] for d in plan.dims] or [0], dtype=torch.int64)
    err = torch.zeros(1, dtype=torch.int64)
    for launch in k.launches:
        extent = evaluate(parse_dim(launch.parallel_extent or "1"), dims)
        if extent == 0:
            continue
        entry = getattr(k.library, f"run_{launch.entry}")
        call: list[Any] = [ctypes.c_void_p(buffers[i].data_ptr()) for i in launch.buffers]
        call += [ctypes.c_void_p(dim_values.data_ptr()), ctypes.c_void_p(err.data_ptr()),
                 ctypes.c_longlong(-(-extent // BLOCK))]
        entry(*call)
    outs: list[torch.Tensor] = []
    for r in fn.results:
        t = buffers[plan.buffer_index(r)]
        outs.append(t.clone() if r in args or any(t is o for o in outs) else t)
    found = [o.numpy() if not any_torch and o.dtype != torch.bfloat16 else o for o in outs]
    return (found[0] if len(found) == 1 else tuple(found)), int(err.item())
