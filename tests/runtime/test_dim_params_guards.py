"""Call-time checks of dim parameters (spec §5.5) on the reference interpreter and through the guards:
what a dim parameter takes (Python, NumPy and 0-d tensor integers), what it refuses before anything
runs (bools, floats, strings, zero, negative numbers, values past 64 bits), its default, keywords,
its agreement with an axis of the same name, and ``where`` clauses over it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import arke
from arke.runtime.guards import GuardError, check_call, dim_params

TEXT = """
kernel tile(x: f32[N], K: dim = 2) -> y: f32[N, K] where K <= 8 {
  y[n, k] = x[n] + f32(k)
}

kernel same(x: f32[K], K: dim) -> f32[K] {
  return x * f32(K)
}
"""


@pytest.fixture(scope="module")
def module() -> arke.Module:
    return arke.loads(TEXT, "<guards>")


def run(module: arke.Module, name: str, *args: object, **kw: object) -> np.ndarray:
    return np.asarray(arke.interpret(module.kernels[name], *args, **kw))


def test_takes_python_numpy_and_tensor_integers(module: arke.Module) -> None:
    x = np.arange(3, dtype=np.float32)
    want = x[:, None] + np.arange(4, dtype=np.float32)[None, :]
    for k in (4, np.int64(4), np.uint8(4), np.array(4, dtype=np.int32), torch.tensor(4),
              torch.tensor(4, dtype=torch.int8)):
        np.testing.assert_array_equal(run(module, "tile", x, k), want)
    np.testing.assert_array_equal(run(module, "tile", x, K=4), want)
    np.testing.assert_array_equal(run(module, "tile", x), x[:, None] + np.arange(2, dtype=np.float32))


@pytest.mark.parametrize("bad", [0, -1, True, False, 2.0, "2", None, np.float32(2), torch.tensor(2.0),
                                 torch.tensor([2]), np.bool_(True)])
def test_refuses_what_is_not_a_positive_integer(module: arke.Module, bad: object) -> None:
    with pytest.raises(GuardError, match="`K` is a dim: it needs a positive integer") as err:
        run(module, "tile", np.zeros(3, np.float32), bad)
    assert err.value.rule == "dim" and err.value.param == "K"


def test_refuses_values_past_64_bits(module: arke.Module) -> None:
    with pytest.raises(GuardError, match="beyond the 64-bit sizes"):
        run(module, "tile", np.zeros(3, np.float32), 2**64)


def test_where_clause_and_axis_agreement(module: arke.Module) -> None:
    with pytest.raises(GuardError, match=r"`K <= 8` does not hold: K = 9"):
        run(module, "tile", np.zeros(3, np.float32), 9)
    np.testing.assert_array_equal(run(module, "same", np.ones(3, np.float32), 3), [3, 3, 3])
    with pytest.raises(GuardError, match=r"K = 4 from `K`, but `x` axis 0 has 3"):
        run(module, "same", np.ones(3, np.float32), 4)
    with pytest.raises(GuardError, match="missing argument `K`"):
        run(module, "same", np.ones(3, np.float32))


def test_check_call_binds_dim_parameters_from_their_values(module: arke.Module) -> None:
    fn = module.semantic.get("tile")
    assert dim_params(fn) == {"K"}
    assert check_call(fn, {"x": (5,)}, dim_args={"K": 3}) == {"N": 5, "K": 3}
    assert check_call(fn, {"x": (5,)}) == {"N": 5, "K": 2}  # the default
