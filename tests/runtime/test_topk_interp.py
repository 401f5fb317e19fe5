"""Top-k selections (spec §8.3) on the reference interpreter against torch: every float dtype and
two integer widths, every kind of row (random, ties, equal rows, NaN, ±inf, signed zeros, integer
extremes), ragged shapes (N = 4097, M = 3), K = 1, K = N, K from a parameter, columns, and the
composed kernels. Positions are compared exactly with a stable torch.sort (the specified tie
order) and, on rows without ties, with torch.topk itself; values with torch.topk's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from argreduce_support import DTYPES, kinds, values
from codegen_support import seeded, text_module
from topk_support import COMPOSED, rows_source, stable_topk, torch_of

from arke.runtime.guards import GuardError

SHAPES = [(3, 4097), (6, 33), (4, 5)]
CASES = [(d, k, s) for d in DTYPES for k in kinds(d) for s in SHAPES]


def _id(case: tuple[str, str, tuple[int, int]]) -> str:
    dtype, kind, (m, n) = case
    return f"{dtype}-{kind}-{m}x{n}"


def assert_values(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.fixture(scope="module")
def modules() -> dict[str, object]:
    return {d: text_module(rows_source(d, more=True)) for d in DTYPES}


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_rows_equal_a_stable_sort(case: tuple[str, str, tuple[int, int]], modules: dict[str, object]) -> None:
    dtype, kind, (m, n) = case
    module = modules[dtype]
    x = values(kind, dtype, (m, n), seeded("topk-interp", *case))
    t = torch_of(x)
    for name, k, largest in (("top4", 4, True), ("bot4", 4, False)):
        v, i = module.kernels[f"{name}_{dtype}"](t)  # type: ignore[attr-defined]
        want_v, want_i = stable_topk(t, k, largest)
        assert torch.equal(i, want_i), (name, i, want_i)
        assert_values(v, want_v)
        assert_values(v, torch.topk(t, k, dim=-1, largest=largest).values)  # torch's own values
    for k in (1, 3, n):
        slots = torch.zeros(k, dtype=torch.int64)
        v, i = module.kernels[f"topk_{dtype}"](t, slots)  # type: ignore[attr-defined]
        want_v, want_i = stable_topk(t, k, True)
        assert torch.equal(i, want_i) and v.shape == (m, k)
        assert_values(v, want_v)
        low = module.kernels[f"bottomk_{dtype}"](t, slots)  # type: ignore[attr-defined]
        assert torch.equal(low, stable_topk(t, k, False)[1])
    assert torch.equal(module.kernels[f"top1_{dtype}"](t), stable_topk(t, 1, True)[1])  # type: ignore[attr-defined]
    if m >= 2:
        got = module.kernels[f"ctop2_{dtype}"](t)  # type: ignore[attr-defined]
        assert torch.equal(got, stable_topk(t, 2, True, dim=0)[1])


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_positions_equal_torch_topk_without_ties(dtype: str, modules: dict[str, object]) -> None:
    rng = seeded("topk-interp-torch", dtype)
    x = torch.randperm(4097 * 3, generator=torch.Generator().manual_seed(int(rng.integers(1 << 30))))
    x = (x.reshape(3, 4097).to(torch.float32) / 64.0).to(getattr(torch, {"f32": "float32", "bf16": "bfloat16",
                                                                          "f16": "float16"}[dtype]))
    if dtype != "f32":  # distinct values that 16 bits hold exactly: a shuffled ramp of 256 per row
        x = torch.stack([torch.randperm(256, generator=torch.Generator().manual_seed(r)) for r in range(3)])
        x = (x.to(torch.float32) * 0.5 - 64.0).to(getattr(torch, {"bf16": "bfloat16", "f16": "float16"}[dtype]))
    arg = x
    for name, largest in (("top4", True), ("bot4", False)):
        v, i = modules[dtype].kernels[f"{name}_{dtype}"](arg)  # type: ignore[attr-defined]
        want = torch.topk(x, 4, dim=-1, largest=largest)
        assert torch.equal(i, want.indices)
        assert_values(v, want.values)


def test_nan_order_is_torch_topk() -> None:
    """NaN is the largest value: first in topk, last in bottomk; NaNs and ties by position."""
    module = text_module(rows_source("f32", more=True))
    nan = float("nan")
    rows = [[1.0, nan, 3.0, nan, -1.0, 3.0], [nan] * 6, [-float("inf")] * 6, [0.0, -0.0, 0.0, -0.0, 1.0, -1.0]]
    x = torch.tensor(rows,
                     dtype=torch.float32)
    v, i = module.kernels["topk_f32"](x, torch.zeros(6, dtype=torch.int64))
    assert i.tolist() == [[1, 3, 2, 5, 0, 4], list(range(6)), list(range(6)), [4, 0, 1, 2, 3, 5]]
    assert torch.signbit(v[3, 1:5]).tolist() == [False, True, False, True]  # each element's own zero
    low = module.kernels["bottomk_f32"](x, torch.zeros(6, dtype=torch.int64))
    assert low.tolist() == [[4, 0, 2, 5, 1, 3], list(range(6)), list(range(6)), [5, 0, 1, 2, 3, 4]]
    torch.testing.assert_close(v, torch.topk(x, 6).values, equal_nan=True)


def test_k_above_n_is_a_guard_error() -> None:
    module = text_module(rows_source("f32", more=True))
    with pytest.raises(GuardError, match=r"K <= N .*`topk` keeps K values from rows of N"):
        module.kernels["topk_f32"](np.zeros((2, 3), dtype=np.float32), np.zeros(4, dtype=np.int64))
    with pytest.raises(GuardError, match=r"4 <= N"):
        module.kernels["top4_f32"](np.zeros((2, 3), dtype=np.float32))


def test_composed_kernels_against_torch() -> None:
    module = text_module(COMPOSED)
    rng = seeded("topk-composed-interp")
    logits = torch.from_numpy(rng.standard_normal((64, 8)).astype(np.float32))
    v, w, expert = module.kernels["route_top2"](logits)
    top = torch.topk(logits, 2, dim=-1)
    assert torch.equal(expert, top.indices) and torch.equal(v, top.values)
    torch.testing.assert_close(w, torch.softmax(top.values, dim=-1))
    x = torch.from_numpy(rng.standard_normal((3, 4097)).astype(np.float32))
    torch.testing.assert_close(module.kernels["shifted"](x),
                               torch.exp(torch.topk(x, 4).values - x.amax(-1, keepdim=True)))
    table = torch.from_numpy(rng.standard_normal((4097, 5)).astype(np.float32))
    torch.testing.assert_close(module.kernels["picked"](x, table), table[torch.topk(x * x, 3).indices])
    b = torch.from_numpy(rng.integers(-2, 3, (7, 5)).astype(np.float32)).to(torch.bfloat16)
    sv, si = module.kernels["sort5"](b)
    want = torch.sort(b, dim=-1, stable=True)
    assert torch.equal(si, want.indices) and torch.equal(sv, want.values)
    h = torch.from_numpy(rng.integers(-3, 4, 33).astype(np.float16))
    assert torch.equal(module.kernels["vec3"](h), stable_topk(h.abs(), 3, True)[1])
