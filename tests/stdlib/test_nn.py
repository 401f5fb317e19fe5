"""std.nn on the reference interpreter, kernel by kernel, against independent torch expressions.

References are computed in float64 with torch / torch.nn.functional (see stdlib_support for
the tolerance policy); shapes are ragged and include a long-row case (N = 4097).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from stdlib_support import ATOL, RTOL, assert_close, expect_guard, f64, kernel, randn, std_module

import arke

NN = "std.nn"

#: (M, N) of the row-wise kernels: single element, ragged, a tall one, and long rows.
ROW_SHAPES = [(1, 1), (3, 17), (33, 5), (2, 4097)]


def k(name: str):
    return kernel(NN, name)


def test_module_has_the_documented_kernels() -> None:
    """Guards against a kernel being added to std.nn without a test here."""
    assert set(std_module(NN).names) == {
        "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "add", "mul", "softmax", "logsumexp",
        "log_softmax", "layernorm", "rmsnorm", "matmul", "bmm", "linear", "linear_bias", "linear_int8",
        "linear_bf16", "quantize_rows", "linear_w8a8", "swiglu", "geglu", "embedding", "cross_entropy",
        "cross_entropy_mean", "greedy",
        "route_top2",
    }


# ---------------------------------------------------------------- activations

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,  # exact erf form
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}


@pytest.mark.parametrize("shape", ROW_SHAPES)
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation(name: str, shape: tuple[int, int], rng: np.random.Generator) -> None:
    x = randn(rng, *shape, scale=3.0)
    assert_close(k(name)(x), ACTIVATIONS[name](f64(x)))


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation_saturates(name: str) -> None:
    """Large magnitudes (exp would overflow f32 beyond ~88) and exact zeros."""
    x = np.concatenate([np.linspace(-100, 100, 41), [0.0, -0.0, 1e-30, -1e-30, 88.8, -88.8]]).astype(np.float32)
    x = x.reshape(1, -1)
    out = k(name)(x)
    assert np.isfinite(out).all()
    assert_close(out, ACTIVATIONS[name](f64(x)))


# ---------------------------------------------------------------- broadcasting elementwise


@pytest.mark.parametrize("shape", ROW_SHAPES)
@pytest.mark.parametrize(("name", "op"), [("add", torch.add), ("mul", torch.mul)])
def test_row_broadcast(name: str, op: Callable, shape: tuple[int, int], rng: np.random.Generator) -> None:
    x, y = randn(rng, *shape), randn(rng, shape[1])
    assert_close(k(name)(x, y), op(f64(x), f64(y)[None, :]))


# ---------------------------------------------------------------- softmax family

SOFTMAX_FAMILY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "softmax": lambda x: F.softmax(x, dim=-1),
    "log_softmax": lambda x: F.log_softmax(x, dim=-1),
    "logsumexp": lambda x: torch.logsumexp(x, dim=-1),
}


@pytest.mark.parametrize("scale", [1.0, 50.0], ids=["unit", "large"])  # large: exp overflows unless shifted
@pytest.mark.parametrize("shape", ROW_SHAPES)
@pytest.mark.parametrize("name", SOFTMAX_FAMILY)
def test_softmax_family(name: str, shape: tuple[int, int], scale: float, rng: np.random.Generator) -> None:
    x = randn(rng, *shape, scale=scale) + np.float32(10.0)  # an offset the max-shift must remove
    out = k(name)(x)
    assert np.isfinite(out).all()
    # log_softmax / logsumexp of logits of size ~50 are ~100: an f32 ulp there is ~8e-6, so the
    # absolute tolerance scales with the inputs' magnitude.
    assert_close(out, SOFTMAX_FAMILY[name](f64(x)), atol=ATOL * scale)


@pytest.mark.parametrize("name", SOFTMAX_FAMILY)
def test_softmax_family_masked_entries(name: str, rng: np.random.Generator) -> None:
    """-inf logits (a mask) get probability 0 and do not disturb the others."""
    x = randn(rng, 5, 9)
    x[:, ::2] = -np.inf
    x[3, :] = -np.inf
    x[3, 4] = 0.5  # a row with a single finite logit
    out = k(name)(x)
    ref = SOFTMAX_FAMILY[name](f64(x))
    assert_close(out, ref)  # assert_close treats matching infinities (log_softmax) as equal


@settings(max_examples=20, deadline=None, derandomize=True)
@given(m=st.integers(1, 40), n=st.integers(1, 300), seed=st.integers(0, 2**32 - 1),
       name=st.sampled_from(sorted(SOFTMAX_FAMILY)))
def test_softmax_family_random_shapes(m: int, n: int, seed: int, name: str) -> None:
    x = randn(np.random.default_rng(seed), m, n, scale=4.0)
    assert_close(k(name)(x), SOFTMAX_FAMILY[name](f64(x)), atol=4 * ATOL)


def test_softmax_rows_sum_to_one(rng: np.random.Generator) -> None:
    x = randn(rng, 7, 4097, scale=5.0)
    out = k("softmax")(x)
    assert (out >= 0).all()
    np.testing.assert_allclose(out.sum(axis=1, dtype=np.float64), 1.0, rtol=0, atol=1e-5)


# ---------------------------------------------------------------- normalisation


def ref_layernorm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def ref_rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def norm_args(name: str, rng: np.random.Generator, m: int, n: int, scale: float = 2.0) -> list[np.ndarray]:
    """x (off-centre, so layernorm must subtract the mean), w, and for layernorm b."""
    x = randn(rng, m, n, scale=scale) + np.float32(scale)
    ws = [randn(rng, n)] + ([randn(rng, n)] if name == "layernorm" else [])
    return [x, *ws]


NORMS = {"layernorm": (ref_layernorm, 1e-5), "rmsnorm": (ref_rmsnorm, 1e-6)}  # reference, default eps


@pytest.mark.parametrize("shape", ROW_SHAPES)
@pytest.mark.parametrize("name", NORMS)
def test_norm(name: str, shape: tuple[int, int], rng: np.random.Generator) -> None:
    ref, default_eps = NORMS[name]
    args = norm_args(name, rng, *shape)
    assert_close(k(name)(*args), ref(*map(f64, args), default_eps))


@pytest.mark.parametrize("how", ["default", "keyword", "positional"])
@pytest.mark.parametrize("name", NORMS)
def test_norm_eps(name: str, how: str, rng: np.random.Generator) -> None:
    """Tiny inputs (variance ~ eps) make the result depend on eps: the default must be the documented one."""
    ref, default_eps = NORMS[name]
    args = norm_args(name, rng, 4, 33, scale=1e-3)
    eps = {"default": default_eps, "keyword": 3e-4, "positional": 2e-7}[how]
    if how == "default":
        out = k(name)(*args)
    elif how == "keyword":
        out = k(name)(*args, eps=eps)
    else:
        out = k(name)(*args, eps)
    expected = ref(*map(f64, args), eps)
    assert_close(out, expected)
    # The check is sensitive: another eps (10x) gives a visibly different answer.
    assert not torch.allclose(torch.as_tensor(out).double(), ref(*map(f64, args), 10 * eps), rtol=1e-3, atol=1e-3)


# ---------------------------------------------------------------- products

#: (M, K, N); K = 4097 is a long contraction.
MATMUL_SHAPES = [(1, 1, 1), (3, 17, 5), (17, 33, 1), (33, 4097, 3)]


def contraction_tol(k_len: int) -> dict[str, float]:
    """The rounding error of a K-term f32 dot product of unit normals grows like sqrt(K) (and the
    result's size too), so the tolerance does: 1e-5 for short ones, ~6e-4 absolute at K = 4097."""
    return {"rtol": RTOL * max(1.0, math.sqrt(k_len)), "atol": ATOL * max(1.0, math.sqrt(k_len))}


@pytest.mark.parametrize(("m", "kk", "n"), MATMUL_SHAPES)
def test_matmul(m: int, kk: int, n: int, rng: np.random.Generator) -> None:
    a, b = randn(rng, m, kk), randn(rng, kk, n)
    assert_close(k("matmul")(a, b), f64(a) @ f64(b), **contraction_tol(kk))


@pytest.mark.parametrize(("bt", "m", "kk", "n"), [(1, 1, 1, 1), (3, 5, 17, 2), (2, 33, 3, 17), (4, 1, 513, 7)])
def test_bmm(bt: int, m: int, kk: int, n: int, rng: np.random.Generator) -> None:
    a, b = randn(rng, bt, m, kk), randn(rng, bt, kk, n)
    assert_close(k("bmm")(a, b), torch.bmm(f64(a), f64(b)), **contraction_tol(kk))


@pytest.mark.parametrize("bias", [False, True], ids=["linear", "linear_bias"])
@pytest.mark.parametrize(("m", "kk", "n"), MATMUL_SHAPES)
def test_linear(m: int, kk: int, n: int, bias: bool, rng: np.random.Generator) -> None:
    x, w = randn(rng, m, kk), randn(rng, n, kk)  # w is [out, in], as torch.nn.Linear stores it
    if bias:
        b = randn(rng, n)
        out, ref = k("linear_bias")(x, w, b), F.linear(f64(x), f64(w), f64(b))
    else:
        out, ref = k("linear")(x, w), F.linear(f64(x), f64(w))
    assert_close(out, ref, **contraction_tol(kk))


@pytest.mark.parametrize(("m", "kk", "n"), MATMUL_SHAPES)
def test_linear_int8(m: int, kk: int, n: int, rng: np.random.Generator) -> None:
    """Weight-only quantisation: y = x (scale * w_q)ᵀ with int8 w_q and one scale per output."""
    x, scale = randn(rng, m, kk), np.abs(randn(rng, n)) / 127
    wq = rng.integers(-127, 128, (n, kk)).astype(np.int8)
    ref = F.linear(f64(x), torch.from_numpy(wq).double() * f64(scale)[:, None])
    assert_close(k("linear_int8")(x, wq, scale), ref, **contraction_tol(kk))


@pytest.mark.parametrize(("m", "kk", "n"), MATMUL_SHAPES)
def test_linear_bf16(m: int, kk: int, n: int, rng: np.random.Generator) -> None:
    """bf16 in, f32 sums, one bf16 rounding of the result (what torch's CPU bf16 linear gives)."""
    x, w = (torch.from_numpy(randn(rng, *s)).to(torch.bfloat16) for s in ((m, kk), (n, kk)))
    out = k("linear_bf16")(x, w)
    assert out.dtype == torch.bfloat16
    ref = F.linear(x.double(), w.double())
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2 * max(1.0, kk ** 0.5))


@pytest.mark.parametrize(("m", "kk"), [(1, 1), (3, 67), (17, 4097)])
def test_quantize_rows(m: int, kk: int, rng: np.random.Generator) -> None:
    """Per-row scale max|x| / 127 and q = x / s rounded half away from zero (an all-zero row: scale 1)."""
    x = randn(rng, m, kk) * 3
    x[0] = 0.0
    q, s = k("quantize_rows")(x)
    xt = torch.from_numpy(x).double()
    amax = xt.abs().amax(1)
    want_s = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    torch.testing.assert_close(torch.as_tensor(s).double(), want_s, rtol=1e-6, atol=0)
    r = xt / torch.as_tensor(s).double()[:, None]
    want_q = (torch.sign(r) * torch.floor(r.abs() + 0.5)).clamp(-127, 127).to(torch.int8)
    assert torch.equal(torch.as_tensor(q), want_q)


@pytest.mark.parametrize(("m", "kk", "n"), MATMUL_SHAPES)
def test_linear_w8a8(m: int, kk: int, n: int, rng: np.random.Generator) -> None:
    """int8 activations and weights: the i32 sums are exact, then scaled per row and channel, one bf16 rounding."""
    x = rng.integers(-127, 128, (m, kk)).astype(np.int8)
    w = rng.integers(-127, 128, (n, kk)).astype(np.int8)
    sx, sw = np.abs(randn(rng, m)) / 127, np.abs(randn(rng, n)) / 127
    out = torch.as_tensor(k("linear_w8a8")(x, sx, w, sw))
    exact = torch.from_numpy(x).long() @ torch.from_numpy(w).long().T
    ref = (exact.float() * torch.from_numpy(sx)[:, None] * torch.from_numpy(sw)).to(torch.bfloat16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), rtol=8e-3, atol=0)


GATES = {"swiglu": F.silu, "geglu": F.gelu}  # geglu uses the exact (erf) GELU


@pytest.mark.parametrize(("t", "d", "f"), [(1, 1, 1), (3, 17, 33), (17, 64, 5), (2, 1025, 3)])
@pytest.mark.parametrize("name", GATES)
def test_gated_mlp(name: str, t: int, d: int, f: int, rng: np.random.Generator) -> None:
    x, wg, wu = randn(rng, t, d), randn(rng, f, d), randn(rng, f, d)
    ref = GATES[name](F.linear(f64(x), f64(wg))) * F.linear(f64(x), f64(wu))
    # Product of two length-d contractions: each carries a ~sqrt(d) error, and the product ~d size.
    tol = contraction_tol(d)
    assert_close(k(name)(x, wg, wu), ref, rtol=tol["rtol"], atol=tol["atol"] * math.sqrt(d))


# ---------------------------------------------------------------- embedding and losses


@pytest.mark.parametrize(("t", "v", "d"), [(1, 1, 1), (3, 17, 5), (33, 7, 17), (17, 4097, 3)])
def test_embedding(t: int, v: int, d: int, rng: np.random.Generator) -> None:
    ids = rng.integers(0, v, size=t, dtype=np.int64)
    ids[0], ids[-1] = v - 1, 0  # both ends of the table
    table = randn(rng, v, d)
    out = k("embedding")(ids, table)
    assert_close(out, F.embedding(torch.from_numpy(ids), f64(table)), rtol=0, atol=0)  # a gather is exact


def cross_entropy_inputs(rng: np.random.Generator, m: int, v: int) -> tuple[np.ndarray, np.ndarray]:
    logits = randn(rng, m, v, scale=5.0)
    target = rng.integers(0, v, size=m, dtype=np.int64)
    target[0] = v - 1
    return logits, target


@pytest.mark.parametrize("shape", ROW_SHAPES)
def test_cross_entropy(shape: tuple[int, int], rng: np.random.Generator) -> None:
    logits, target = cross_entropy_inputs(rng, *shape)
    ref = F.cross_entropy(f64(logits), torch.from_numpy(target), reduction="none")
    # Losses are up to ~30 with these logits; 4e-5 absolute is a few ulps of the log-sum-exp.
    assert_close(k("cross_entropy")(logits, target), ref, atol=4 * ATOL)


@pytest.mark.parametrize("shape", ROW_SHAPES)
def test_cross_entropy_mean(shape: tuple[int, int], rng: np.random.Generator) -> None:
    logits, target = cross_entropy_inputs(rng, *shape)
    ref = F.cross_entropy(f64(logits), torch.from_numpy(target))  # reduction="mean"
    out = k("cross_entropy_mean")(logits, target)
    assert out.shape == ()  # a 0-d array
    assert_close(out, ref, atol=4 * ATOL)


@pytest.mark.parametrize("shape", [*ROW_SHAPES, (3, 151936)])
def test_greedy(shape: tuple[int, int], rng: np.random.Generator) -> None:
    logits = randn(rng, *shape)
    logits[0, shape[1] // 2] = np.inf if shape[1] > 1 else logits[0, 0]
    if shape[0] > 1:
        logits[1, -1] = np.nan
    np.testing.assert_array_equal(k("greedy")(logits), torch.from_numpy(logits).argmax(-1).numpy())


def test_cross_entropy_large_logits(rng: np.random.Generator) -> None:
    """Logits far beyond exp's f32 range still give finite losses (the max-shift)."""
    logits = randn(rng, 4, 33, scale=1000.0)
    target = np.array([0, 5, 17, 32], dtype=np.int64)
    out = k("cross_entropy")(logits, target)
    assert np.isfinite(out).all()
    # Losses are up to a few thousand here: 1e-5 relative.
    assert_close(out, F.cross_entropy(f64(logits), torch.from_numpy(target), reduction="none"), atol=1e-3)


# ---------------------------------------------------------------- NumPy and torch inputs


def _case(name: str, rng: np.random.Generator) -> tuple[list[np.ndarray], torch.Tensor]:
    """Arguments of kernel ``name`` and the expected result."""
    if name == "rmsnorm":
        x, w = randn(rng, 5, 33), randn(rng, 33)
        return [x, w], ref_rmsnorm(f64(x), f64(w), 1e-6)
    if name == "softmax":
        x = randn(rng, 3, 17)
        return [x], F.softmax(f64(x), dim=-1)
    if name == "embedding":
        ids, table = np.array([2, 0, 2, 4], dtype=np.int64), randn(rng, 5, 3)
        return [ids, table], F.embedding(torch.from_numpy(ids), f64(table))
    logits, target = cross_entropy_inputs(rng, 6, 9)
    return [logits, target], F.cross_entropy(f64(logits), torch.from_numpy(target))


@pytest.mark.parametrize("kind", ["numpy", "torch", "mixed", "numpy-strided", "torch-strided"])
@pytest.mark.parametrize("name", ["rmsnorm", "softmax", "embedding", "cross_entropy_mean"])
def test_input_kinds(name: str, kind: str, rng: np.random.Generator) -> None:
    """NumPy in, NumPy out; any torch tensor among the inputs gives a torch tensor.
    Non-contiguous inputs (every other element of a twice-as-long last axis) read the same values."""
    args, ref = _case(name, rng)
    if kind == "torch":
        call: list[np.ndarray | torch.Tensor] = [torch.from_numpy(a) for a in args]
    elif kind == "mixed":  # the first argument a tensor, the rest arrays
        call = [torch.from_numpy(args[0]), *args[1:]]
    elif kind == "numpy-strided":
        call = [np.repeat(a, 2, axis=-1)[..., ::2] for a in args]
    elif kind == "torch-strided":
        call = [torch.from_numpy(np.repeat(a, 2, axis=-1))[..., ::2] for a in args]
    else:
        call = list(args)
    before = [a.copy() for a in args]
    out = k(name)(*call)
    assert_close(out, ref, kind=np.ndarray if kind.startswith("numpy") else torch.Tensor)
    for a, b in zip(args, before, strict=True):
        np.testing.assert_array_equal(a, b)  # inputs are not modified


def test_interpret_function_matches_call(rng: np.random.Generator) -> None:
    x, w, b = norm_args("layernorm", rng, 3, 17)
    np.testing.assert_array_equal(arke.interpret(k("layernorm"), x, w, b, eps=1e-3), k("layernorm")(x, w, b, eps=1e-3))


def test_kernels_imported_into_a_user_module(rng: np.random.Generator) -> None:
    """`import std.nn` brings the kernels into scope; calls between them pass scalars and bind dims."""
    mod = arke.loads(
        "import std.nn\n"
        "kernel block(x: f32[T, D], w: f32[D], wg: f32[F, D], wu: f32[F, D]) -> f32[T, F] {\n"
        "  return softmax(swiglu(rmsnorm(x, w, 1e-2), wg, wu))\n"
        "}\n")
    x, w, wg, wu = randn(rng, 5, 16), randn(rng, 16), randn(rng, 24, 16), randn(rng, 24, 16)
    h = ref_rmsnorm(f64(x), f64(w), 1e-2)
    ref = F.softmax(F.silu(F.linear(h, f64(wg))) * F.linear(h, f64(wu)), dim=-1)
    assert_close(mod.kernels["block"](x, w, wg, wu), ref)
    np.testing.assert_array_equal(mod.kernels["rmsnorm"](x, w), k("rmsnorm")(x, w))


# ---------------------------------------------------------------- guards


def _bad_calls(rng: np.random.Generator) -> dict[str, tuple[str, str, tuple, dict]]:
    x, w = randn(rng, 3, 5), randn(rng, 5)
    ids, table = np.array([0, 1], dtype=np.int64), randn(rng, 4, 2)
    return {
        # id: (kernel, parameter, rule, args, kwargs)
        "rmsnorm-w-length": ("rmsnorm", "w", "dim", (x, w[:4]), {}),
        "rmsnorm-x-float64": ("rmsnorm", "x", "dtype", (x.astype(np.float64), w), {}),
        "rmsnorm-x-rank": ("rmsnorm", "x", "rank", (x[0], w), {}),
        "rmsnorm-eps-string": ("rmsnorm", "eps", "type", (x, w), {"eps": "small"}),
        "rmsnorm-unknown-keyword": ("rmsnorm", "epsilon", "arity", (x, w), {"epsilon": 1e-5}),
        "layernorm-b-missing": ("layernorm", "b", "missing", (x, w), {}),
        "matmul-inner-dim": ("matmul", "b", "dim", (x, randn(rng, 4, 2)), {}),
        "bmm-batch": ("bmm", "b", "dim", (randn(rng, 2, 3, 4), randn(rng, 3, 4, 5)), {}),
        "linear-w-in-features": ("linear", "w", "dim", (x, randn(rng, 7, 6)), {}),
        "embedding-ids-int32": ("embedding", "ids", "dtype", (ids.astype(np.int32), table), {}),
        "embedding-ids-float": ("embedding", "ids", "dtype", (ids.astype(np.float32), table), {}),
        "embedding-id-too-large": ("embedding", "table", "index", (np.array([0, 4]), table), {}),
        "embedding-id-negative": ("embedding", "table", "index", (np.array([-1, 0]), table), {}),
        "cross-entropy-target-length": ("cross_entropy", "target", "dim", (x, np.array([0, 1])), {}),
        "cross-entropy-target-range": ("cross_entropy", "logits", "index", (x, np.array([0, 1, 5])), {}),
    }


@pytest.mark.parametrize("case", list(_bad_calls(np.random.default_rng(0))))
def test_guard_errors(case: str, rng: np.random.Generator) -> None:
    name, param, rule, args, kwargs = _bad_calls(rng)[case]
    expect_guard(k(name), args, kwargs, rule=rule, param=param)
