"""The cooperative primitives of the CUDA-C target: tensor-core MMA, asynchronous copies, shared memory.

The block-cooperative families (rows with warp reductions, tensor-core contractions, flash
attention) reach the hardware only through the few functions of :data:`WARP`, so that the
host check (``tests/support/cuda_host.py``) can give each its exact meaning on the CPU: the
text below is the GPU's, compiled unless ``AK_HOST`` is defined, and the host defines the same
names (fibers for the threads of a block, a rendezvous for every collective).

* ``ak_mma_bf16`` / ``ak_mma_f16``: one ``mma.sync.aligned.m16n8k16.row.col.f32`` per warp,
  ``d = a·b + c`` with f32 accumulation. Fragments as the PTX ISA lays them out, with
  ``g = lane / 4`` and ``t = lane % 4``: ``a[r]`` holds two 16-bit elements (low half first) of
  A at row ``g + 8·(r % 2)``, columns ``2t + 8·(r / 2)`` and ``+1``; ``b[r]`` two of B at rows
  ``2t + 8r`` and ``+1``, column ``g``; ``c[i]`` the f32 element at row ``g + 8·(i / 2)``, column
  ``2t + i % 2``. :func:`ak_pack` makes a register of two 16-bit elements.
* ``ak_cp_async16(dst, src, bytes)``: a 16-byte copy from global to shared memory that does
  not stall the thread (``cp.async.cg``, sm_80+); ``bytes < 16`` copies that many and zero-fills
  the rest (a ragged edge), ``0`` writes zeros without reading ``src``.
  ``ak_cp_async_commit()`` closes a group of copies, ``ak_cp_async_wait<N>()`` waits until at
  most ``N`` groups are in flight (double buffering: the next tile loads while this one is used).
* ``AK_DYNAMIC_SMEM(name)``: the block's dynamic shared memory as ``unsigned char* name``
  (its size is the launch's ``shared`` option).

Rule for every renderer that uses them: ``__syncthreads``, the ``__shfl_*_sync`` shuffles and
``ak_mma_*`` are reached by every thread of the block the same number of times (no collective
inside a branch that depends on the thread), which the host check enforces.
"""

from __future__ import annotations

#: The primitives, as the GPU compiles them (see the module doc).
WARP = r"""
#ifndef AK_HOST
#define AK_DYNAMIC_SMEM(name) \
  extern __shared__ __align__(16) unsigned char name##_raw[]; unsigned char* name = name##_raw
static __device__ __forceinline__ unsigned ak_pack(unsigned short lo, unsigned short hi) {
  return (unsigned)lo | ((unsigned)hi << 16);
}
static __device__ __forceinline__ void ak_mma_bf16(float* c, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
static __device__ __forceinline__ void ak_mma_f16(float* c, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
static __device__ __forceinline__ void ak_cp_async16(void* dst, const void* src, int bytes) {
  unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(s), "l"(src), "r"(bytes));
}
static __device__ __forceinline__ void ak_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void ak_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}
#endif
"""
