"""The interpreter's arg-reductions (``argmax``/``argmin``, spec §8.3) against torch's
``argmax``/``argmin``: every input dtype and kind of row (ties, NaN, infinities, signed zeros,
integer extremes), rows and columns, ragged shapes; and inside larger expressions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from argreduce_support import COMPOSED, DTYPES, kinds, rows_source, torch_of, values
from codegen_support import seeded, text_module

SHAPES = [(1, 1), (3, 4097), (33, 17), (6, 5)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize(("dtype", "kind"), [(d, k) for d in DTYPES for k in kinds(d)])
def test_arg_reductions_match_torch(dtype: str, kind: str, shape: tuple[int, int]) -> None:
    module = text_module(rows_source(dtype))
    x = values(kind, dtype, shape, seeded("argreduce-interp", dtype, kind, shape))
    t = torch_of(x)
    for name, want in (("amax", t.argmax(1)), ("amin", t.argmin(1)), ("cmax", t.argmax(0)), ("cmin", t.argmin(0))):
        got = torch.as_tensor(module.kernels[f"{name}_{dtype}"](x))  # torch for a bf16 argument
        assert got.dtype == torch.int64, name
        np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=f"{name}_{dtype} on {kind} rows")


def test_nan_is_the_first_nan_for_both_and_ties_take_the_first() -> None:
    module = text_module(rows_source("f32"))
    nan, inf = np.nan, np.inf
    x = np.array([[1.0, nan, 3.0, nan], [-0.0, 0.0, -0.0, 0.0], [0.0, -0.0, 5.0, 5.0], [-inf, -inf, -inf, -inf],
                  [2.0, inf, inf, -inf], [nan, nan, nan, nan]], dtype=np.float32)
    np.testing.assert_array_equal(module.kernels["amax_f32"](x), [1, 0, 2, 0, 1, 0])
    np.testing.assert_array_equal(module.kernels["amin_f32"](x), [1, 0, 0, 0, 3, 0])


def test_composed_arg_reductions() -> None:
    module = text_module(COMPOSED)
    rng = seeded("argreduce-composed")
    logits = values("ties", "f32", (5, 33), rng)
    logits[2, 7] = np.nan
    label = torch.from_numpy(logits).argmax(1).numpy().copy()
    label[1] += 1
    ids, best, hits = module.kernels["greedy_step"](logits, label)
    t = torch.from_numpy(logits)
    np.testing.assert_array_equal(ids, t.argmax(1).numpy())
    np.testing.assert_array_equal(best, t.max(1).values.numpy())  # NaN where the row has one
    assert int(hits) == 4

    x = values("ties", "f16", (4, 17), rng)
    target = np.array([0.5, -1.0, 2.0, 9.0], dtype=np.float16)
    near, first = module.kernels["nearest"](x, target)
    xt = torch.from_numpy(x).float()
    np.testing.assert_array_equal(near, (xt - torch.from_numpy(target).float()[:, None]).abs().argmin(1).numpy())
    np.testing.assert_array_equal(first, (xt > 0).to(torch.int8).argmax(1).numpy())

    xb = values("nan", "bf16", (5, 9), rng)
    v, i, j = module.kernels["value_and_position"](xb)
    assert torch.equal(torch.as_tensor(i), xb.argmax(1))
    assert torch.equal(torch.as_tensor(j), (xb.float() * 2).argmin(1) + 1)
    assert torch.equal(v.float().isnan(), xb.float().isnan().any(1))
    assert torch.equal(xb[torch.arange(5), torch.as_tensor(i)].float().nan_to_num(7.0), v.float().nan_to_num(7.0))


def test_an_empty_axis_gives_zero() -> None:
    module = text_module(COMPOSED)
    x = np.array([[3.0], [-1.0]], dtype=np.float32)
    i, j = module.kernels["tail"](x, np.zeros((2, 0), dtype=np.float32))
    np.testing.assert_array_equal(i, [0, 0])
    np.testing.assert_array_equal(j, [0, 0])
    y = np.array([[1.0, 4.0], [4.0, 1.0]], dtype=np.float32)
    i, _ = module.kernels["tail"](np.zeros((2, 3), dtype=np.float32), y)
    np.testing.assert_array_equal(i, [1, 0])
