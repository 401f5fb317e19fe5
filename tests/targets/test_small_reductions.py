"""Small literal-extent reductions (unrolled into maps by ``arke.passes.unroll``) on every runnable
target, against the interpreter by the one tolerance rule, and the plan each target makes of them.

A causal depthwise conv1d of window 4 (Mamba's), in both of §10's spellings of a read that
stays in range (a clamp and a modulo), a 4 × 4 window with every reduction kind, and narrow
dtypes (an i8 sum that wraps, a bf16 sum rounded once): ragged shapes (L = 4097, C = 3).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from codegen_support import RUNNABLE, TARGETS, as_dtype, assert_conforms, build, seeded, text_module

from arke.ir import semantic as S
from arke.ir.dtypes import DType
from arke.targets import base as targets

SOURCE = """
kernel conv(x: f32[B, C, L], w: f32[C, 4], bias: f32[C]) -> y: f32[B, C, L] {
  y[b, c, l] = silu(bias[c] + sum(w[c, k] * (x[b, c, max(l + k - 3, 0)] if l + k >= 3 else 0.0) for k))
}

kernel conv_mod(x: f32[B, C, L], w: f32[C, 4], bias: f32[C]) -> y: f32[B, C, L] {
  y[b, c, l] = silu(bias[c] + sum(w[c, k] * (x[b, c, (l + k - 3 + L) % L] if l + k >= 3 else 0.0) for k))
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
"""

RUN = pytest.mark.parametrize("target", RUNNABLE)
CONV = [(1, 1, 1), (2, 3, 17), (1, 3, 4097)]


def _lib(target: str) -> Any:
    return build(text_module(SOURCE), target)


@RUN
@pytest.mark.parametrize("name", ["conv", "conv_mod"])
@pytest.mark.parametrize(("b", "c", "length"), CONV)
def test_causal_conv(target: str, name: str, b: int, c: int, length: int) -> None:
    rng = seeded("conv", b, c, length)
    x, w, bias = (rng.standard_normal(s).astype(np.float32) for s in ((b, c, length), (c, 4), (c,)))
    got = _lib(target).kernels[name](x, w, bias)
    assert_conforms(got, text_module(SOURCE).kernels[name], x, w, bias, what=f"{target} {name}")


# Triton's interpreter runs a program per row in Python: 257 rows (past a block of 256) instead of 4097
WINDOW = [(t, m) for t in RUNNABLE for m in (1, 3, 257 if t == "triton" else 4097)]


@pytest.mark.parametrize(("target", "m"), WINDOW)
def test_window_kinds_and_narrow_dtypes(target: str, m: int) -> None:
    rng = seeded("window", m)
    x = rng.standard_normal((m, 4, 4)).astype(np.float32)
    x[m // 2, 1, 2] = np.nan
    assert_conforms(_lib(target).kernels["window"](x), text_module(SOURCE).kernels["window"], x,
                    what=f"{target} window")
    a = rng.integers(-128, 128, (m, 3)).astype(np.int8)
    h = as_dtype(rng.standard_normal((m, 2)), DType.BF16)
    got = _lib(target).kernels["narrow"](a, h)
    assert_conforms(got, text_module(SOURCE).kernels["narrow"], a, h, what=f"{target} narrow")
    assert torch.as_tensor(got[0]).dtype == torch.int8


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_plans_the_conv_pointwise(target: str) -> None:
    """The plan every target renders (its own fused families): one pointwise dispatch, no reduction."""
    t = targets.get(target)
    for name in ("conv", "conv_mod"):
        plan = t.plan(text_module(SOURCE).semantic, name, None)
        assert {d.family for d in plan.dispatches} == {"pointwise"}, (target, name)
    # window's four results are maps over the same rows: a target may launch them as one group
    # (llvm's rows family groups maps that share their row axis), but none is a reduction any more
    plan = t.plan(text_module(SOURCE).semantic, "window", None)
    assert all(isinstance(op, S.MapOp) for d in plan.dispatches for op in d.members), (target, plan.dispatches)
