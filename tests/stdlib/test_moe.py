"""std.moe on the reference interpreter: top-k routing against softmax → topk → renormalise → scatter."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from stdlib_support import assert_close, expect_guard, f64, kernel, randn, std_module

import arke

MOE = "std.moe"


def routing():
    return kernel(MOE, "topk_routing")


def test_module_has_the_documented_kernels() -> None:
    assert set(std_module(MOE).names) == {"topk_routing"}


def ref_topk_routing(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Mixtral's rule: softmax, keep the k largest, renormalise, scatter into a dense [T, E] of zeros."""
    p = F.softmax(logits, dim=-1)
    weights, experts = torch.topk(p, min(k, p.shape[-1]), dim=-1)
    return torch.zeros_like(p).scatter(-1, experts, weights / weights.sum(-1, keepdim=True))


def ref_topk_routing_stable(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The same rule with ties broken towards the lower expert index (a stable descending sort);
    torch.topk does not specify its order among equal values."""
    p = F.softmax(logits, dim=-1)
    order = torch.sort(p, dim=-1, descending=True, stable=True).indices[:, :k]
    weights = p.gather(-1, order)
    return torch.zeros_like(p).scatter(-1, order, weights / weights.sum(-1, keepdim=True))


#: (T, E, k): single token/expert, Mixtral's 8 experts top-2, ragged sizes, k == E (plain softmax),
#: k > E (every expert), and a wide row (4097 experts).
CASES = [(1, 1, 1), (3, 8, 2), (17, 8, 2), (33, 64, 2), (5, 17, 1), (4, 33, 4), (3, 5, 5), (7, 3, 8), (2, 4097, 2)]


@pytest.mark.parametrize(("t", "e", "k"), CASES)
def test_topk_routing(t: int, e: int, k: int, rng: np.random.Generator) -> None:
    logits = randn(rng, t, e, scale=2.0)
    out = routing()(logits, k=k)
    assert_close(out, ref_topk_routing(f64(logits), k))
    assert ((out > 0).sum(axis=1) == min(k, e)).all()
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=0, atol=1e-6)


@pytest.mark.parametrize("how", ["default", "keyword", "positional"])
def test_topk_routing_k(how: str, rng: np.random.Generator) -> None:
    logits = randn(rng, 9, 8)
    if how == "default":
        k, out = 2, routing()(logits)  # Mixtral's top-2
    elif how == "keyword":
        k, out = 3, routing()(logits, k=3)
    else:
        k, out = 1, routing()(logits, 1)
    assert_close(out, ref_topk_routing(f64(logits), k))
    assert ((out > 0).sum(axis=1) == k).all()


def test_top1_is_one_hot_argmax(rng: np.random.Generator) -> None:
    logits = randn(rng, 17, 6)
    out = routing()(logits, k=1)
    np.testing.assert_array_equal(out, np.eye(6, dtype=np.float32)[logits.argmax(axis=1)])


@pytest.mark.parametrize("k", [6, 7, 100])
def test_k_at_least_experts_is_softmax(k: int, rng: np.random.Generator) -> None:
    logits = randn(rng, 5, 6)
    assert_close(routing()(logits, k=k), F.softmax(f64(logits), dim=-1))


def test_ties_go_to_the_lower_expert() -> None:
    out = routing()(np.zeros((2, 5), dtype=np.float32), k=2)
    np.testing.assert_array_equal(out, np.array([[0.5, 0.5, 0, 0, 0]] * 2, dtype=np.float32))
    out = routing()(np.array([[1, 3, 3, 0, 3], [2, 2, 2, 2, 5]], dtype=np.float32), k=2)
    assert_close(out, ref_topk_routing_stable(torch.tensor([[1, 3, 3, 0, 3], [2, 2, 2, 2, 5]]).double(), 2))
    np.testing.assert_array_equal(out[0], np.array([0, 0.5, 0.5, 0, 0], dtype=np.float32))


@pytest.mark.parametrize("k", [1, 2, 3])
def test_many_ties(k: int, rng: np.random.Generator) -> None:
    """Logits from {0, 1, 2}: ties at the k-th place in most rows."""
    logits = rng.integers(0, 3, size=(33, 8)).astype(np.float32)
    assert_close(routing()(logits, k=k), ref_topk_routing_stable(f64(logits), k))


def test_large_and_masked_logits(rng: np.random.Generator) -> None:
    """Logits of ~±300 (exp overflows f32 without the max-shift) and -inf (a disabled expert)."""
    logits = randn(rng, 6, 16, scale=100.0)
    logits[:, 3] = -np.inf
    logits[0, :] = -np.inf
    logits[0, [5, 9, 12]] = [1.0, 2.0, 0.5]  # a token with three enabled experts
    out = routing()(logits, k=2)
    assert np.isfinite(out).all()
    assert (out[:, 3] == 0).all()
    assert_close(out, ref_topk_routing(f64(logits), 2))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(t=st.integers(1, 20), e=st.integers(1, 70), k=st.integers(1, 10), seed=st.integers(0, 2**32 - 1))
def test_topk_routing_random_shapes(t: int, e: int, k: int, seed: int) -> None:
    logits = randn(np.random.default_rng(seed), t, e, scale=3.0)
    assert_close(routing()(logits, k=k), ref_topk_routing(f64(logits), k))


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_input_kinds(kind: str, rng: np.random.Generator) -> None:
    logits = randn(rng, 4, 8)
    arg = logits if kind == "numpy" else torch.from_numpy(logits)
    assert_close(routing()(arg, k=2), ref_topk_routing(f64(logits), 2),
                 kind=np.ndarray if kind == "numpy" else torch.Tensor)


def test_routing_imported_into_a_user_module(rng: np.random.Generator) -> None:
    """A router layer: `import std.moe` (and std.nn for the projection); k by default and given in the call."""
    mod = arke.loads(
        "import std.nn\nimport std.moe\n"
        "kernel route(x: f32[T, D], wr: f32[E, D]) -> f32[T, E] {\n  return topk_routing(linear(x, wr))\n}\n"
        "kernel route1(x: f32[T, D], wr: f32[E, D]) -> f32[T, E] {\n  return topk_routing(linear(x, wr), 1)\n}\n")
    x, wr = randn(rng, 17, 32), randn(rng, 8, 32)
    logits = F.linear(f64(x), f64(wr))
    # The logits are 32-term f32 dot products (~1e-6 off), which moves the routing weights by as much.
    assert_close(mod.kernels["route"](x, wr), ref_topk_routing(logits, 2), atol=1e-5)
    assert_close(mod.kernels["route1"](x, wr), ref_topk_routing(logits, 1), atol=1e-5)


@pytest.mark.parametrize(("args", "kwargs", "rule", "param"), [
    ((np.zeros((3, 8)),), {}, "dtype", "logits"),  # float64
    ((np.zeros(8, dtype=np.float32),), {}, "rank", "logits"),
    ((np.zeros((3, 8), dtype=np.float32),), {"k": 2.5}, "scalar", "k"),
    ((np.zeros((3, 8), dtype=np.float32), 2.0), {}, "scalar", "k"),  # an integer parameter: no silent float
    ((np.zeros((3, 8), dtype=np.float32),), {"top_k": 2}, "arity", "top_k"),
], ids=["logits-float64", "logits-rank", "k-fraction", "k-float", "unknown-keyword"])
def test_guard_errors(args: tuple, kwargs: dict, rule: str, param: str) -> None:
    expect_guard(routing(), args, kwargs, rule=rule, param=param)
