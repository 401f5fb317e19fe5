"""Strategies reach the code and never change an answer: ``vectorize``/``unroll`` become LLVM
loop hints on the loops of their index, ``tile``/``unroll`` set a contraction's blocking, and
every variant gives the reference interpreter's answer."""

from __future__ import annotations

import pytest
from codegen_support import RUNNABLE, assert_conforms, build, random_inputs, seeded, text_module

SOURCE = """
kernel scale(x: f32[M, N], w: f32[N]) -> f32[M, N] { return x[m, n] * w[n] + 1.0 }
kernel norm(x: f32[M, N]) -> f32[M, N] {
  s[m] = sum(x[m, n] * x[m, n] for n)
  return x[m, n] * rsqrt(s[m] / f32(N) + 1e-6)
}
kernel mm(a: f32[M, K], b: f32[K, N]) -> f32[M, N] { return sum(a[m, k] * b[k, n] for k) }

@strategy(scale, target = llvm, when N > 100) { vectorize n = 8; unroll n = 4 }
@strategy(norm, target = llvm) { vectorize n = 4; unroll m = 2 }
@strategy(mm, target = llvm, when M > 8) { tile m = 4, n = 64, k = 16; unroll k = 4 }
@strategy(mm, target = llvm, when M > 4) { pack a }
"""

CASES = [("scale", {"M": 5, "N": 137}), ("scale", {"M": 3, "N": 7}), ("norm", {"M": 7, "N": 45}),
         ("mm", {"M": 9, "K": 50, "N": 70}), ("mm", {"M": 6, "K": 50, "N": 70}), ("mm", {"M": 3, "K": 50, "N": 70})]


@pytest.mark.parametrize("target", RUNNABLE)
@pytest.mark.parametrize(("name", "dims"), CASES, ids=lambda v: v if isinstance(v, str) else
                         ",".join(f"{k}={n}" for k, n in v.items()))
def test_strategy_variants_match_interpreter(target: str, name: str, dims: dict[str, int]) -> None:
    module = text_module(SOURCE)
    args = random_inputs(module.kernels[name], dims, seeded(name, dims))
    assert_conforms(build(module, target).kernels[name](*args), module.kernels[name], *args, what=f"{name} {dims}")


def test_vectorize_and_unroll_become_loop_hints() -> None:
    lib = build(text_module(SOURCE), "llvm")
    scale = lib.kernels["scale"].variant(0).artifact.source
    assert '!"llvm.loop.vectorize.width", i32 8' in scale and '!"llvm.loop.unroll.count", i32 4' in scale
    assert "!llvm.loop" not in lib.kernels["scale"].variant(-1).artifact.source  # no strategy: no hints
    assert '!"llvm.loop.unroll.count", i32 4' in lib.kernels["mm"].variant(0).artifact.source


def test_hints_on_nested_loops_get_their_own_metadata() -> None:
    """``vectorize`` of an inner index and ``unroll`` of the outer one: each loop names its own metadata
    (the outer loop's number was once read after the inner loops had counted on, and two loops of one
    function claimed the same id: the module failed to build)."""
    module = text_module("""
kernel heads(x: f32[N, H, E]) -> f32[N, H, E] {
  t[n] = sum(x[n, h, e] * x[n, h, e] for h, e)
  return x[n, h, e] * rsqrt(t[n] + 1e-6)
}
@strategy(heads, target = llvm) { vectorize e = 16; unroll h = 4 }
""")
    kernel = build(module, "llvm").kernels["heads"]
    text = kernel.variant(0).artifact.source
    assert '!"llvm.loop.vectorize.width", i32 16' in text and '!"llvm.loop.unroll.count", i32 4' in text
    args = random_inputs(module.kernels["heads"], {"N": 5, "H": 6, "E": 33}, seeded("nested hints"))
    assert_conforms(kernel(*args), module.kernels["heads"], *args, what="heads, nested hints")
