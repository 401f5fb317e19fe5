"""Run the CUDA-C target's kernels on the host: each translation unit compiled as C++ by g++.

There is no GPU here, so the CUDA C that :mod:`arke.targets.cuda.render` renders is checked by
compiling it, after a prelude of shims (``__global__``, ``__launch_bounds__``, ``blockIdx`` ...
and host versions of the CUDA device functions glibc lacks), into a shared library with
``g++ -O1 -ffp-contract=off`` (NVRTC compiles with ``--fmad=false``: no contraction either).
Each entry gets a driver ``run_<entry>(args..., gx, gy, gz, threads)`` that runs the grid's blocks
in turn and the threads of a block as fibers (``ucontext``): a thread runs until it reaches a
collective — ``__syncthreads``, a ``__shfl_*_sync`` shuffle, an ``ak_mma_*`` (whose fragments are
exchanged and multiplied as the PTX ISA lays them out) — and the block goes on when every thread
has, so shared memory, warp reductions and tensor-core tiles mean on the host what they mean on
the GPU. Threads that reach different collectives fail the run (the rule of
:mod:`arke.targets.cuda.warp`). :func:`run` allocates the plan's buffers, launches each dispatch
over its grid with a zeroed error/scratch array and returns the results as the runtimes do
(NumPy for NumPy inputs, torch otherwise) with the error word.

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
from arke.ir.shapes import evaluate, parse_dim
from arke.ir.strategy import Strategy
from arke.plan.dispatch import KernelPlan, make_plan
from arke.runtime.guards import TORCH_DTYPES, prepare_args
from arke.targets.artifact import LaunchSpec
from arke.targets.cuda.render import RENDERER, CudaRenderer

#: Shims that make a CUDA-C translation unit plain host C++ (prepended to the rendered source).
SHIMS = r"""
#define AK_HOST 1
#include <math.h>
#include <string.h>
#include <stdlib.h>
#include <ucontext.h>
#define __global__
#define __device__
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __forceinline__ inline
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
#define warpSize 32
struct ak_host_dim3 { unsigned x, y, z; };
static ak_host_dim3 blockIdx, threadIdx, blockDim, gridDim;
/* -- the threads of a block are fibers: each runs until it reaches a collective (a barrier, a
   shuffle, an mma) or returns; the next round starts when every thread has (see run_block) */
static ucontext_t ak_sched;
static ucontext_t ak_fiber[1024];
static char* ak_stacks;
static int ak_cur, ak_done[1024];
static long long ak_arrivals[1024];
static void ak_yield() { ak_arrivals[ak_cur]++; swapcontext(&ak_fiber[ak_cur], &ak_sched); }
static inline void __syncthreads() { ak_yield(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)mask; ak_yield(); }
static inline void __threadfence() {}
/* shuffles: every thread posts its value, all meet, each reads its partner's, all meet again */
static unsigned long long ak_post[1024];
template <class T> static T ak_shuffle(T v, unsigned src_lane, int width) {
  static_assert(sizeof(T) <= 8, "a shuffled value is at most 8 bytes");
  memcpy(&ak_post[threadIdx.x], &v, sizeof(T));
  ak_yield();
  unsigned lane = threadIdx.x % 32, base = threadIdx.x - lane + (lane / width) * width;
  T r;
  memcpy(&r, &ak_post[base + src_lane % width], sizeof(T));
  ak_yield();
  return r;
}
template <class T> static T __shfl_xor_sync(unsigned, T v, int m, int width = 32) {
  return ak_shuffle(v, (threadIdx.x % width) ^ (unsigned)m, width);
}
template <class T> static T __shfl_sync(unsigned, T v, int lane, int width = 32) {
  return ak_shuffle(v, (unsigned)lane, width);
}
template <class T> static T __shfl_down_sync(unsigned, T v, unsigned d, int width = 32) {
  unsigned l = threadIdx.x % width;
  return ak_shuffle(v, l + d < (unsigned)width ? l + d : l, width);
}
template <class T> static T __shfl_up_sync(unsigned, T v, unsigned d, int width = 32) {
  unsigned l = threadIdx.x % width;
  return ak_shuffle(v, l >= d ? l - d : l, width);
}
template <class T> static T atomicAdd(T* p, T v) { T old = *p; *p = old + v; return old; }
template <class T> static T atomicMax(T* p, T v) { T old = *p; if (v > old) *p = v; return old; }
template <class T> static T atomicExch(T* p, T v) { T old = *p; *p = v; return old; }
/* dynamic shared memory: one block runs at a time, so one static buffer serves every block */
static unsigned char ak_host_smem[256 * 1024] __attribute__((aligned(16)));
#define AK_DYNAMIC_SMEM(name) unsigned char* name = ak_host_smem
/* tensor cores: each lane posts its fragments, all meet, each computes its four outputs */
static unsigned ak_mma_a[1024][4], ak_mma_b[1024][2];
static inline unsigned ak_pack(unsigned short lo, unsigned short hi) { return (unsigned)lo | ((unsigned)hi << 16); }
static inline float ak_host_bf16(unsigned short h) {
  unsigned u = (unsigned)h << 16; float f; memcpy(&f, &u, 4); return f;
}
static inline float ak_host_f16(unsigned short h) {
  unsigned sign = ((unsigned)h & 0x8000u) << 16, e = ((unsigned)h >> 10) & 0x1Fu, m = h & 0x3FFu, u;
  if (e == 0x1Fu) u = sign | 0x7F800000u | (m << 13);
  else if (e) u = sign | ((e + 112u) << 23) | (m << 13);
  else if (!m) u = sign;
  else { e = 113u; while (!(m & 0x400u)) { m <<= 1; e -= 1u; } u = sign | (e << 23) | ((m & 0x3FFu) << 13); }
  float f; memcpy(&f, &u, 4); return f;
}
static void ak_host_mma(float* c, const unsigned* a, const unsigned* b, float (*wide)(unsigned short)) {
  unsigned me = threadIdx.x, base = me - me % 32;
  memcpy(ak_mma_a[me], a, 16); memcpy(ak_mma_b[me], b, 8);
  ak_yield();
  float A[16][16], B[16][8];
  for (unsigned l = 0; l < 32; ++l) {
    unsigned g = l / 4, t = l % 4;
    for (int r = 0; r < 4; ++r) for (int h = 0; h < 2; ++h) {
      unsigned short e = (unsigned short)(ak_mma_a[base + l][r] >> (16 * h));
      A[g + 8 * (r % 2)][2 * t + 8 * (r / 2) + h] = wide(e);
    }
    for (int r = 0; r < 2; ++r) for (int h = 0; h < 2; ++h) {
      unsigned short e = (unsigned short)(ak_mma_b[base + l][r] >> (16 * h));
      B[2 * t + 8 * r + h][g] = wide(e);
    }
  }
  unsigned g = (me % 32) / 4, t = me % 4;
  for (int i = 0; i < 4; ++i) {
    unsigned row = g + 8 * (i / 2), col = 2 * t + i % 2;
    double s = 0;  /* products of 16-bit floats are exact in f32; the sum is kept wide, then rounded */
    for (int k = 0; k < 16; ++k) s += (double)A[row][k] * (double)B[k][col];
    c[i] = (float)((double)c[i] + s);
  }
  ak_yield();
}
static inline void ak_mma_bf16(float* c, const unsigned* a, const unsigned* b) { ak_host_mma(c, a, b, ak_host_bf16); }
static inline void ak_mma_f16(float* c, const unsigned* a, const unsigned* b) { ak_host_mma(c, a, b, ak_host_f16); }
/* asynchronous copies complete at once on the host */
static inline void ak_cp_async16(void* dst, const void* src, int bytes) {
  memset(dst, 0, 16);
  if (bytes > 0) memcpy(dst, src, bytes);
}
static inline void ak_cp_async_commit() {}
template <int N> static inline void ak_cp_async_wait() {}
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
#define __expf(x) expf(x)
#define __ldg(p) (*(p))
#define exp10f(x) ((float)pow(10.0, (double)(x)))
"""

#: Runs every block of a launch (after the translation unit: each entry's driver calls it).
RUNNER = r"""
typedef void (*ak_body_fn)(void*);
static ak_body_fn ak_body;
static void* ak_body_args;
static void ak_trampoline() { ak_body(ak_body_args); ak_done[ak_cur] = 1; }
/* One block: fibers round-robin until every thread has returned. Returns 0, or 2 when the threads
   of a round stopped at different collectives, or some returned while others wait at one. */
static int ak_run_block(unsigned threads) {
  const size_t stack = 128 * 1024;
  if (!ak_stacks) ak_stacks = (char*)malloc(stack * 1024);
  for (unsigned t = 0; t < threads; ++t) {
    getcontext(&ak_fiber[t]);
    ak_fiber[t].uc_stack.ss_sp = ak_stacks + stack * t;
    ak_fiber[t].uc_stack.ss_size = stack;
    ak_fiber[t].uc_link = &ak_sched;
    makecontext(&ak_fiber[t], ak_trampoline, 0);
    ak_done[t] = 0; ak_arrivals[t] = 0;
  }
  for (;;) {
    int running = 0;
    for (unsigned t = 0; t < threads; ++t) {
      if (ak_done[t]) continue;
      ak_cur = (int)t; threadIdx.x = t; threadIdx.y = 0; threadIdx.z = 0;
      swapcontext(&ak_sched, &ak_fiber[t]);
      running += !ak_done[t];
    }
    if (!running) return 0;
    if (running != (int)threads) return 2; /* some returned while others wait at a collective */
    for (unsigned t = 1; t < threads; ++t)
      if (ak_arrivals[t] != ak_arrivals[0]) return 2;
  }
}
static int ak_run_grid(long long gx, long long gy, long long gz, unsigned threads) {
  blockDim.x = threads; blockDim.y = 1; blockDim.z = 1;
  gridDim.x = (unsigned)gx; gridDim.y = (unsigned)gy; gridDim.z = (unsigned)gz;
  for (long long z = 0; z < gz; ++z) for (long long y = 0; y < gy; ++y) for (long long x = 0; x < gx; ++x) {
    blockIdx.x = (unsigned)x; blockIdx.y = (unsigned)y; blockIdx.z = (unsigned)z;
    int status = ak_run_block(threads);
    if (status) return status;
  }
  return 0;
}
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


def host_source(source: str, extra: str = "") -> str:
    """A rendered CUDA-C translation unit as host C++: the shims, ``extra`` shims, the source, and
    one driver per entry.

    ``int run_<entry>(args..., long long gx, long long gy, long long gz, unsigned threads)`` runs
    the grid's blocks one after another, the threads of a block as fibers (see :data:`RUNNER`); it
    returns 0, or 2 when a block's threads reached different collectives.
    """
    drivers = []
    for name, params in _ENTRY.findall(source):
        parts = [p.rsplit(" ", 1) for p in params.split(", ")]
        fields = "".join(f" {t} {n};" for t, n in parts)
        unpack = ", ".join(f"ak_a->{n}" for _, n in parts)
        drivers.append(
            f"struct ak_args_{name} {{{fields} }};\n"
            f"static void ak_body_{name}(void* p) {{ ak_args_{name}* ak_a = (ak_args_{name}*)p; {name}({unpack}); }}\n"
            f'extern "C" int run_{name}({params}, long long gx, long long gy, long long gz, unsigned threads) {{\n'
            f"  ak_args_{name} ak_a = {{{', '.join(n for _, n in parts)}}};\n"
            f"  ak_body = ak_body_{name}; ak_body_args = &ak_a;\n"
            "  return ak_run_grid(gx, gy, gz, threads);\n}")
    return "\n".join([SHIMS, extra, source, RUNNER, *drivers]) + "\n"


@cache
def compile_source(source: str, extra: str = "") -> ctypes.CDLL:
    """The rendered CUDA-C ``source`` compiled for the host (once per process per source text)."""
    text = host_source(source, extra)
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


_KERNELS: dict[tuple[Any, ...], tuple[arke.Module, HostKernel]] = {}


def host_kernel(module: arke.Module, kernel: str, renderer: CudaRenderer = RENDERER,
                strategy: Strategy | None = None) -> HostKernel:
    """Kernel ``kernel`` of ``module`` planned (with ``strategy``), rendered to CUDA C by ``renderer``
    and compiled for the host (once)."""
    key = (id(module), kernel, renderer.families, strategy)
    if key not in _KERNELS:
        plan = make_plan(module.semantic, module.kernel_map.get(kernel, kernel), strategy, families=renderer.families)
        artifact = renderer.render(plan)
        source = str(artifact.source)
        # the module is kept alive with its kernel: its id stays unique
        _KERNELS[key] = (module, HostKernel(plan, source, tuple(artifact.launches), compile_source(source)))
    return _KERNELS[key][1]


def run(module: arke.Module, kernel: str, *arrays: Any, renderer: CudaRenderer = RENDERER,
        strategy: Strategy | None = None, **scalars: Any) -> tuple[Any, int]:
    """Call ``kernel`` through its host-compiled CUDA C: ``(results, error word)``.

    The arguments are checked and converted as every runtime does them; the results come back
    as the runtimes return them (NumPy for NumPy inputs, except bf16; one value or a tuple).
    """
    k = host_kernel(module, kernel, renderer, strategy)
    plan, fn = k.plan, k.plan.function
    args, dims, any_torch = prepare_args(fn, arrays, scalars)
    buffers: list[torch.Tensor] = []
    for b in plan.buffers:
        if b.role == "param":  # f16/bf16 bits, bools one byte each: torch's layout is the ABI's
            buffers.append(args[b.name].contiguous())
        else:
            buffers.append(torch.zeros(tuple(evaluate(d, dims) for d in b.shape), dtype=TORCH_DTYPES[b.dtype]))
    dim_values = torch.tensor([dims[d] for d in plan.dims] or [0], dtype=torch.int64)
    raised = 0
    for launch in k.launches:
        grid = [evaluate(parse_dim(g), dims) for g in launch.grid]
        if 0 in grid:
            continue
        grid += [1] * (3 - len(grid))
        options = dict(launch.options)
        # word 0: the error word; the rest the launch's scratch (zeroed, as the GPU runtime does)
        words = evaluate(parse_dim(launch.scratch), dims) if launch.scratch else 1
        ws = torch.zeros(max(1, words), dtype=torch.int64)
        entry = getattr(k.library, f"run_{launch.entry}")
        call: list[Any] = [ctypes.c_void_p(buffers[i].data_ptr()) for i in launch.buffers]
        call += [ctypes.c_void_p(dim_values.data_ptr()), ctypes.c_void_p(ws.data_ptr())]
        call += [ctypes.c_longlong(g) for g in grid] + [ctypes.c_uint(options["block"])]
        if options.get("shared", 0) > 256 * 1024:
            raise AssertionError(f"{launch.entry} asks for {options['shared']} bytes of shared memory")
        status = entry(*call)
        if status:
            raise AssertionError(f"{launch.entry}: the threads of a block reached different collectives "
                                 "(a __syncthreads, shuffle or mma inside a branch that depends on the thread)")
        raised |= int(ws[0].item())
    outs: list[torch.Tensor] = []
    for r in fn.results:
        t = buffers[plan.buffer_index(r)]
        outs.append(t.clone() if r in args or any(t is o for o in outs) else t)
    found = [o.numpy() if not any_torch and o.dtype != torch.bfloat16 else o for o in outs]
    return (found[0] if len(found) == 1 else tuple(found)), raised


def nvrtc_available() -> bool:
    """Whether NVRTC can be loaded (the GPU compile beside each host check)."""
    from arke.targets.cuda import nvrtc

    return nvrtc.available()


def check_host_case(case: Any, renderer: CudaRenderer = RENDERER, what: str = "cuda (host)") -> None:
    """A conformance case (``test_conformance.Case``) through the host-compiled CUDA C equals the
    interpreter within the suite's rule (``codegen_support.tolerance``: libm, glibc here, libdevice
    on a GPU, torch in the interpreter, differs by ulps, and the sums run in the kernel's order);
    the error word must stay clear on in-range inputs."""
    from test_conformance import check_case

    def call(module: arke.Module, *args: Any, **scalars: Any) -> Any:
        got, err = run(module, case.member, *args, renderer=renderer, **scalars)
        assert err == 0, f"{what} {case.id}: the error word was raised on in-range inputs"
        return got

    check_case(case, call, what)
