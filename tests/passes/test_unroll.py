"""The unroll pass: a reduction over a few literal-extent terms becomes a map, meaning kept.

The causal depthwise conv1d (Mamba's, window 4) is the case that motivated it: planned as a
reduction (a contraction of a row of 4) it ran many times slower than torch; unrolled it is
one pointwise loop. The interpreter runs the kernel before and after the pass on the same
inputs, and an independent torch expression (``F.conv1d`` with groups) checks the meaning.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import arke
from arke.ir import semantic as S
from arke.passes import run_passes
from arke.passes.unroll import MAX_TERMS, unroll_small_reductions, unrollable
from arke.plan.dispatch import make_plan
from arke.runtime.interp import run_function

SOURCE = """
kernel conv(x: f32[B, C, L], w: f32[C, 4], bias: f32[C]) -> y: f32[B, C, L] {
  y[b, c, l] = silu(bias[c] + sum(w[c, k] * (x[b, c, max(l + k - 3, 0)] if l + k >= 3 else 0.0) for k))
}

kernel conv_mod(x: f32[B, C, L], w: f32[C, 4], bias: f32[C]) -> y: f32[B, C, L] {
  y[b, c, l] = silu(bias[c] + sum(w[c, k] * (x[b, c, (l + k - 3 + L) % L] if l + k >= 3 else 0.0) for k))
}

kernel conv_dim(x: f32[B, C, L], w: f32[C, W], bias: f32[C]) -> y: f32[B, C, L] {
  y[b, c, l] = bias[c] + sum(w[c, k] * (x[b, c, max(l + k - W + 1, 0)] if l + k + 1 >= W else 0.0) for k)
}

kernel wide(x: f32[M, 17]) -> f32[M] {
  return sum(x[m, k] for k)
}

kernel window(x: f32[M, 4, 4]) -> (s: f32[M], mx: f32[M], mn: f32[M], p: f32[M]) {
  s[m] = sum(x[m, i, j] for i, j)
  mx[m] = max(x[m, i, j] for i, j)
  mn[m] = min(x[m, i, 0] for i)
  p[m] = prod(x[m, 0, j] for j)
}

kernel narrow(a: i8[M, 3], h: bf16[M, 2]) -> (s: i8[M], t: i64[M], g: bf16[M]) {
  s[m] = sum(a[m, k] for k)
  t[m] = prod(i64(a[m, k]) for k)
  g[m] = sum(h[m, k] for k)
}

kernel flags(b: bool[M, 2]) -> bool[M] {
  return max(b[m, k] for k)
}
"""


@pytest.fixture(scope="module")
def module() -> arke.Module:
    return arke.loads(SOURCE, "<unroll>")


def _passed(module: arke.Module, name: str) -> S.Function:
    return run_passes(module.semantic, name, verify_each=True)


def test_conv_window_becomes_one_pointwise_dispatch(module: arke.Module) -> None:
    for name in ("conv", "conv_mod"):
        fn = _passed(module, name)
        assert [type(op) for op in fn.ops] == [S.MapOp], name
        plan = make_plan(module.semantic, name)
        assert [d.family for d in plan.dispatches] == ["pointwise"], name


def test_only_literal_extents_up_to_the_limit_are_unrolled(module: arke.Module) -> None:
    assert MAX_TERMS == 16
    for name, reduces in (("conv_dim", True), ("wide", True), ("flags", True), ("window", False)):
        fn = _passed(module, name)
        assert any(isinstance(op, S.ReduceOp) for op in fn.ops) is reduces, name
    flags = module.semantic.get("flags")
    assert not any(unrollable(op) for op in flags.ops)  # booleans stay reductions
    window = module.semantic.get("window")
    assert unroll_small_reductions(unroll_small_reductions(window)) == unroll_small_reductions(window)


def _run(fn: S.Function, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    out = run_function(fn, S.Module((fn,)), inputs)
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize(("b", "c", "length"), [(1, 1, 1), (2, 3, 2), (2, 5, 17)])
def test_conv_means_torch_conv1d_before_and_after(module: arke.Module, b: int, c: int, length: int) -> None:
    g = torch.Generator().manual_seed(b * 100 + c * 10 + length)
    x, w, bias = torch.randn(b, c, length, generator=g), torch.randn(c, 4, generator=g), torch.randn(c, generator=g)
    want = F.silu(F.conv1d(x, w[:, None, :], bias, padding=3, groups=c)[..., :length])
    for name in ("conv", "conv_mod"):
        inputs = {"x": x, "w": w, "bias": bias}
        before, after = _run(module.semantic.get(name), inputs), _run(_passed(module, name), inputs)
        torch.testing.assert_close(before[0], want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(after[0], before[0], rtol=1e-6, atol=1e-6)


def test_dtypes_and_kinds_keep_their_meaning(module: arke.Module) -> None:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(9, 4, 4, generator=g)
    x[2, 1, 3] = float("nan")
    before, after = _run(module.semantic.get("window"), {"x": x}), _run(_passed(module, "window"), {"x": x})
    for got, want in zip(after, before):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)
    assert torch.isnan(after[1][2]) and torch.isnan(after[0][2])  # max propagates NaN as the reduction does
    a = torch.tensor([[100, 100, 100], [-128, -1, 5], [127, 1, 0]], dtype=torch.int8)
    h = torch.randn(3, 2, generator=g).bfloat16()
    before, after = (_run(module.semantic.get("narrow"), {"a": a, "h": h}),
                     _run(_passed(module, "narrow"), {"a": a, "h": h}))
    assert torch.equal(after[0], before[0]) and after[0].dtype == torch.int8  # wraps at i8 as the sum does
    assert torch.equal(after[0], torch.tensor([44, -124, -128], dtype=torch.int8))
    assert torch.equal(after[1], before[1])
    assert torch.equal(after[2], before[2]) and after[2].dtype == torch.bfloat16  # one rounding, of the f32 sum
