"""The host check's own semantics (tests/support/cuda_host.py): hand-written CUDA C kernels that use
each cooperative primitive, run on the host against torch, and compiled by NVRTC for the GPU.

The mma test builds its fragments straight from the PTX ISA's layout tables for
``mma.m16n8k16`` (written out again here, independently of the renderers), so the host's
emulation of ``ak_mma_bf16`` is checked against a plain matrix product.
"""

from __future__ import annotations

import ctypes

import cuda_host
import pytest
import torch

from arke.targets.cuda.render import PRELUDE

pytestmark = pytest.mark.skipif(not cuda_host.available(), reason="no g++")

HEAD = 'extern "C" __global__ void __launch_bounds__({threads}) {name}({params}) {{'

MMA = HEAD.format(threads=32, name="mma", params="const unsigned short* __restrict__ a, const unsigned short* "
                  "__restrict__ b, float* __restrict__ c, const long long* __restrict__ dims, "
                  "long long* __restrict__ err") + r"""
  const unsigned lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  unsigned fa[4], fb[2];
  for (int r = 0; r < 4; ++r) {  /* A 16x16 row-major: rows g, g+8; columns 2t(+1), +8 */
    const int row = g + 8 * (r % 2), col = 2 * t + 8 * (r / 2);
    fa[r] = ak_pack(a[row * 16 + col], a[row * 16 + col + 1]);
  }
  for (int r = 0; r < 2; ++r) {  /* B 16x8 stored [K][N]: rows 2t(+1) + 8r, column g */
    const int k = 2 * t + 8 * r;
    fb[r] = ak_pack(b[k * 8 + g], b[(k + 1) * 8 + g]);
  }
  float acc[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  ak_mma_bf16(acc, fa, fb);
  for (int i = 0; i < 4; ++i) c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = acc[i];
}
"""

REDUCE = HEAD.format(threads=128, name="rowsum", params="const float* __restrict__ x, float* __restrict__ y, "
                     "const long long* __restrict__ dims, long long* __restrict__ err") + r"""
  __shared__ float partial[4];
  const long long n = dims[0];
  float v = 0.0f;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) v += x[blockIdx.x * n + i];
  for (int m = 16; m > 0; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  float w = partial[threadIdx.x % 4];  /* every warp folds the partials: no collective in a branch */
  for (int m = 2; m > 0; m /= 2) w += __shfl_xor_sync(0xffffffffu, w, m);
  if (threadIdx.x == 0) y[blockIdx.x] = w;
}
"""

COPY = HEAD.format(threads=32, name="copy", params="const unsigned char* __restrict__ x, unsigned char* "
                   "__restrict__ y, const long long* __restrict__ dims, long long* __restrict__ err") + r"""
  AK_DYNAMIC_SMEM(smem);
  const long long n = dims[0];
  const long long at = (long long)threadIdx.x * 16;
  const int bytes = at >= n ? 0 : (n - at >= 16 ? 16 : (int)(n - at));
  ak_cp_async16(smem + at, x + (bytes ? at : 0), bytes);
  ak_cp_async_commit();
  ak_cp_async_wait<0>();
  __syncthreads();
  for (int i = 0; i < 16; ++i) y[at + i] = smem[at + i] + 1;
}
"""

DIVERGENT = HEAD.format(threads=64, name="divergent", params="float* __restrict__ y, const long long* __restrict__ "
                        "dims, long long* __restrict__ err") + r"""
  if (threadIdx.x < 32) __syncthreads();
  y[threadIdx.x] = 1.0f;
}
"""


def launch(source: str, entry: str, tensors: list[torch.Tensor], dims: list[int], grid: int, threads: int) -> int:
    lib = cuda_host.compile_source(PRELUDE + source)
    d = torch.tensor(dims or [0], dtype=torch.int64)
    err = torch.zeros(1, dtype=torch.int64)
    args = [ctypes.c_void_p(t.data_ptr()) for t in tensors] + [ctypes.c_void_p(d.data_ptr()),
                                                               ctypes.c_void_p(err.data_ptr())]
    status: int = getattr(lib, f"run_{entry}")(*args, ctypes.c_longlong(grid), ctypes.c_longlong(1),
                                               ctypes.c_longlong(1), ctypes.c_uint(threads))
    return status


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int16)


@pytest.mark.parametrize("seed", range(3))
def test_mma_fragments_follow_the_ptx_layout(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(16, 16, generator=g).bfloat16()
    b = torch.randn(16, 8, generator=g).bfloat16()
    c = torch.zeros(16, 8)
    assert launch(MMA, "mma", [bits(a), bits(b), c], [], 1, 32) == 0
    want = a.double() @ b.double() + 1.0
    torch.testing.assert_close(c.double(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n", [1, 33, 4097])
def test_warp_shuffles_and_shared_memory_reduce_a_row(n: int) -> None:
    x = torch.randn(3, n)
    y = torch.zeros(3)
    assert launch(REDUCE, "rowsum", [x, y], [n], 3, 128) == 0
    torch.testing.assert_close(y.double(), x.double().sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [16, 100, 509])
def test_async_copies_zero_fill_past_the_end(n: int) -> None:
    x = torch.randint(0, 200, (512,), dtype=torch.uint8)
    y = torch.zeros(512, dtype=torch.uint8)
    assert launch(COPY, "copy", [x, y], [n], 1, 32) == 0
    want = torch.where(torch.arange(512) < n, x + 1, torch.ones_like(x))
    assert torch.equal(y, want)


def test_a_barrier_in_a_divergent_branch_fails_the_run() -> None:
    y = torch.zeros(64)
    assert launch(DIVERGENT, "divergent", [y], [], 1, 64) == 2


@pytest.mark.skipif(not cuda_host.nvrtc_available(), reason="needs NVRTC (pip install 'arke[cuda]')")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_same_kernels_compile_for_the_gpu(arch: str) -> None:
    from arke.targets.cuda import nvrtc
    from arke.targets.nvidia import ptx as nvptx

    ptx = nvrtc.compile_ptx(PRELUDE + MMA + REDUCE + COPY, arch, kernel="sim")
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx and "cp.async.cg.shared.global" in ptx
    if nvptx.ptxas_path() is not None:
        _, entries = nvptx.assemble(ptx, arch)
        assert {e.entry for e in entries} == {"mma", "rowsum", "copy"}
        assert all(e.spills == 0 for e in entries)
