"""A contraction's epilogue runs in vectors along ``n`` (:mod:`arke.targets.llvm.gemm_epilogue`): the sums
one masked load, loads along ``n`` one each, roundings to bf16/f16 on whole vectors, what has no vector form
lane by lane. Every element takes the scalar code's steps, so the interpreter's answer holds on ragged
shapes (a slab narrower than a vector, N = 4097) and the result is the same bit for bit on any number
of threads."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from codegen_support import assert_conforms, build, seeded, text_module

from arke.library import GenericKernel
from arke.runtime.generics import pick

SOURCE = """
kernel bias_gelu(x: f32[M, K], w: f32[N, K], b: f32[N]) -> f32[M, N] {
  return gelu(sum(x[m, k] * w[n, k] for k) + b[n])
}
# the lane index in a select, and tanh (no vector form: lane by lane)
kernel by_column(x: f32[M, K], w: f32[N, K]) -> f32[M, N] {
  return tanh(sum(x[m, k] * w[n, k] for k)) if n % 3 == 0 else f32(n) * 0.5
}
kernel gated(x: A[M, K], wg: A[N, K], wu: A[N, K]) -> A[M, N]
  where A in {bf16, f16}
{
  g[m, n] = A(sum(f32(x[m, k]) * f32(wg[n, k]) for k))
  u[m, n] = A(sum(f32(x[m, k]) * f32(wu[n, k]) for k))
  return A(f32(A(silu(f32(g[m, n])))) * f32(u[m, n]))
}
kernel residual(o: A[M, K], w: A[N, K], x: A[M, N]) -> A[M, N]
  where A in {bf16, f16}
{
  return A(f32(x[m, n]) + f32(A(sum(f32(o[m, k]) * f32(w[n, k]) for k))))
}
# both operands along m and n (k leading)
kernel across(x: f32[K, M], w: f32[K, N]) -> f32[N, M] {
  return sum(x[k, m] * w[k, n] for k) * 2.0
}
"""

HALF = {"bf16": torch.bfloat16, "f16": torch.float16}
SHAPES = [{"M": 3, "K": 40, "N": 4097}, {"M": 37, "K": 64, "N": 7}, {"M": 33, "K": 96, "N": 300}]


def _inputs(name: str, dims: dict[str, int], dtype: str) -> list[Any]:
    rng = seeded("epilogue", name, dims, dtype)
    m, k, n = dims["M"], dims["K"], dims["N"]

    def t(*shape: int) -> Any:
        values = (rng.standard_normal(shape) / (np.sqrt(k) if len(shape) == 2 else 1.0)).astype(np.float32)
        return values if dtype == "f32" else torch.from_numpy(values).to(HALF[dtype])

    return {"bias_gelu": lambda: [t(m, k), t(n, k), t(n)], "by_column": lambda: [t(m, k), t(n, k)],
            "gated": lambda: [t(m, k), t(n, k), t(n, k)], "residual": lambda: [t(m, k), t(n, k), t(m, n)],
            "across": lambda: [t(k, m), t(k, n)]}[name]()


def _source(kernel: Any, args: list[Any]) -> str:
    if isinstance(kernel, GenericKernel):
        kernel = kernel.member(pick(kernel.generic, args, {}))
    return str(kernel.variant(-1).artifact.source)


CASES = [("bias_gelu", "f32"), ("by_column", "f32"), ("gated", "bf16"), ("gated", "f16"), ("residual", "bf16"),
         ("residual", "f16"), ("across", "f32")]


@pytest.mark.parametrize("dims", SHAPES, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
@pytest.mark.parametrize(("name", "dtype"), CASES, ids=[f"{n}-{d}" for n, d in CASES])
def test_epilogue_matches_interpreter_on_any_threads(name: str, dtype: str, dims: dict[str, int]) -> None:
    module = text_module(SOURCE)
    kernel = build(module, "llvm").kernels[name]
    args = _inputs(name, dims, dtype)
    one = kernel(*args, threads=1)
    assert_conforms(one, module.kernels[name], *args, what=f"{name} {dtype} {dims}")
    two = kernel(*args, threads=2)
    assert torch.equal(torch.as_tensor(one), torch.as_tensor(two)), "the thread count changed a result"


@pytest.mark.parametrize(("name", "dtype"), CASES, ids=[f"{n}-{d}" for n, d in CASES])
def test_the_epilogue_is_a_vector_loop(name: str, dtype: str) -> None:
    kernel = build(text_module(SOURCE), "llvm").kernels[name]
    source = _source(kernel, _inputs(name, SHAPES[0], dtype))
    assert "h.vcol" in source, name
