"""Contractions whose workers split half slabs of columns where N has few slabs (arke/targets/llvm/gemm.py,
``_Gemm.halves``): against the interpreter on N around the switch (1023, 1024) and ragged sizes, the same
bits on 1, 2 and 3 threads, with and without prepacked weights, with an epilogue; a strategy's `tile n`
keeps its own slabs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from codegen_support import assert_conforms, build, seeded, text_module

SOURCE = """
kernel lin(x: f32[M, K], w: f32[N, K]) -> f32[M, N] { return sum(x[m, k] * w[n, k] for k) }
kernel lin_gelu(x: f32[M, K], w: f32[N, K], b: f32[N]) -> f32[M, N] {
  return gelu(sum(x[m, k] * w[n, k] for k) + b[n])
}
kernel lin_tiled(x: f32[M, K], w: f32[N, K]) -> f32[M, N] { return sum(x[m, k] * w[n, k] for k) }
@strategy(lin_tiled, target = llvm) {
  tile n = 64
}
"""
MODULE = text_module(SOURCE)
LIB = build(MODULE, "llvm")


@pytest.mark.parametrize("name", ["lin", "lin_gelu", "lin_tiled"])
@pytest.mark.parametrize(("m", "k", "n"), [(3, 17, 1023), (37, 40, 1024), (130, 33, 200), (5, 64, 4097), (4, 9, 1)])
def test_half_slabs_conform_on_any_thread_count(name: str, m: int, k: int, n: int) -> None:
    rng = seeded("half_slabs", name, m, k, n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    args = [x, w] + ([rng.standard_normal(n).astype(np.float32)] if name == "lin_gelu" else [])
    kernel = LIB.kernels[name]
    assert_conforms(kernel(*args), MODULE.kernels[name], *args, what=name)
    tensors = [torch.from_numpy(a) for a in args]
    packed = [tensors[0], LIB.backend.pack_weight(tensors[1]), *tensors[2:]]
    for given in (tensors, packed):  # (prepacked panels may sum a decode row in another order: a form of their own)
        runs = [kernel(*given, threads=t) for t in (1, 2, 3)]
        assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])
    assert_conforms(kernel(*packed).numpy(), MODULE.kernels[name], *args, what=f"{name} on prepacked panels")
