"""std.attention on the reference interpreter against independent torch expressions.

Attention is checked against F.scaled_dot_product_attention (``enable_gqa=True``) and against
an explicit softmax(QKᵀ/√D + mask)·V with K/V heads repeated by ``repeat_interleave``.
Layouts follow the kernels: q is [B, H, S, D] (S queries), k and v are [B, G, T, D] (T keys),
R = H / G query heads share one KV head. Causal attention aligns the S queries with the last
S of the T keys (bottom-right), so query i sees keys j <= i + T - S.

RoPE is checked against Hugging Face's rotate_half form (``rope``) and GPT-J's interleaved
form (``rope_interleaved``), both written out below.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from stdlib_support import ATOL, RTOL, assert_close, expect_guard, f64, kernel, randn, std_module

import arke

ATTN = "std.attention"

# Attention outputs are convex combinations of V rows (|out| ≲ 3). Each score is a D-term
# dot product and each output an average over T keys; measured errors against float64 stay
# below 1e-6 up to T = 1025, D = 64, so 2e-5 leaves a 20x margin for other summation orders.
ATTN_TOL = {"rtol": 2 * RTOL, "atol": 2 * ATOL}

#: (B, H, G, S, T, D): H query heads sharing G KV heads, S queries, T keys, head size D.
CONFIGS = {
    "mha": (2, 4, 4, 5, 5, 16),
    "mha-ragged": (1, 3, 3, 17, 33, 8),
    "gqa-r4": (1, 8, 2, 3, 17, 16),
    "gqa-r7": (2, 14, 2, 5, 33, 8),
    "mqa": (2, 4, 1, 17, 17, 8),
    "mqa-r7-d1": (1, 7, 1, 3, 33, 1),
    "decode": (2, 8, 2, 1, 33, 16),
    "decode-one-key": (1, 4, 4, 1, 1, 8),
    "long-kv": (1, 8, 2, 64, 1025, 64),
}


def k(name: str):
    return kernel(ATTN, name)


def test_module_has_the_documented_kernels() -> None:
    assert set(std_module(ATTN).names) == {"attention", "causal_attention", "rope", "rope_interleaved"}


# ---------------------------------------------------------------- attention references


def causal_mask(s: int, t: int) -> torch.Tensor:
    """[S, T] bool, True where query i may see key j: j <= i + T - S (bottom-right aligned)."""
    return torch.ones(s, t, dtype=torch.bool).tril(diagonal=t - s)


def ref_sdpa(q: torch.Tensor, kk: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    s, t = q.shape[2], kk.shape[2]
    if causal and s == t:
        return F.scaled_dot_product_attention(q, kk, v, is_causal=True, enable_gqa=True)
    # is_causal=True is top-left aligned when S != T: give the bottom-right mask explicitly.
    mask = causal_mask(s, t) if causal else None
    return F.scaled_dot_product_attention(q, kk, v, attn_mask=mask, enable_gqa=True)


def ref_explicit(q: torch.Tensor, kk: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    r = q.shape[1] // kk.shape[1]
    kk, v = kk.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)  # query head h reads KV head h // R
    scores = q @ kk.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[2], kk.shape[2]), -math.inf)
    return torch.softmax(scores, dim=-1) @ v


REFERENCES = {"sdpa": ref_sdpa, "explicit": ref_explicit}


def qkv(rng: np.random.Generator, b: int, h: int, g: int, s: int, t: int, d: int,
        q_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return randn(rng, b, h, s, d, scale=q_scale), randn(rng, b, g, t, d), randn(rng, b, g, t, d)


# ---------------------------------------------------------------- attention


@pytest.mark.parametrize("ref", REFERENCES)
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("name", ["attention", "causal_attention"])
def test_attention(name: str, config: str, ref: str, rng: np.random.Generator) -> None:
    q, kk, v = qkv(rng, *CONFIGS[config])
    expected = REFERENCES[ref](f64(q), f64(kk), f64(v), causal=name == "causal_attention")
    assert_close(k(name)(q, kk, v), expected, **ATTN_TOL)


@pytest.mark.parametrize("ref", REFERENCES)
def test_attention_more_queries_than_keys(ref: str, rng: np.random.Generator) -> None:
    """Non-causal attention has no T >= S requirement."""
    q, kk, v = qkv(rng, 1, 6, 3, 9, 3, 4)
    assert_close(k("attention")(q, kk, v), REFERENCES[ref](f64(q), f64(kk), f64(v), causal=False), **ATTN_TOL)


@pytest.mark.parametrize("name", ["attention", "causal_attention"])
def test_attention_peaky_scores(name: str, rng: np.random.Generator) -> None:
    """Scores of ~±100 (exp overflows f32 beyond 88 without the max-shift); nearly one-hot weights.

    The scores themselves then carry an f32 rounding of ~1e-5 absolute, which moves the
    softmax weights by as much relatively: 1e-4 absolute on outputs of size ~3.
    """
    q, kk, v = qkv(rng, 1, 4, 2, 9, 17, 16, q_scale=30.0)
    out = k(name)(q, kk, v)
    assert np.isfinite(out).all()
    assert_close(out, ref_sdpa(f64(q), f64(kk), f64(v), causal=name == "causal_attention"), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("config", ["decode", "decode-one-key", "mha", "gqa-r7"])
def test_causal_first_and_last_query(config: str, rng: np.random.Generator) -> None:
    """The last query sees every key (as non-causal attention does); with T == S the first sees only key 0."""
    b, h, g, s, t, d = CONFIGS[config]
    q, kk, v = qkv(rng, b, h, g, s, t, d)
    causal, full = k("causal_attention")(q, kk, v), k("attention")(q, kk, v)
    np.testing.assert_allclose(causal[:, :, -1], full[:, :, -1], rtol=1e-6, atol=1e-6)
    if s == t:
        r = h // g
        np.testing.assert_allclose(causal[:, :, 0], np.repeat(v[:, :, 0], r, axis=1), rtol=1e-6, atol=1e-6)


def test_causal_ignores_future_keys(rng: np.random.Generator) -> None:
    """Changing the keys and values after position T - S + i does not change query i's output."""
    q, kk, v = qkv(rng, 1, 4, 2, 5, 9, 8)
    out = k("causal_attention")(q, kk, v)
    kk2, v2 = kk.copy(), v.copy()
    kk2[:, :, 5:] = randn(rng, 1, 2, 4, 8)  # keys 5..8 are visible only to queries 1..4
    v2[:, :, 5:] = randn(rng, 1, 2, 4, 8)
    out2 = k("causal_attention")(q, kk2, v2)
    np.testing.assert_array_equal(out[:, :, 0], out2[:, :, 0])
    assert not np.allclose(out[:, :, 1:], out2[:, :, 1:])


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_attention_input_kinds(kind: str, rng: np.random.Generator) -> None:
    q, kk, v = qkv(rng, *CONFIGS["gqa-r4"])
    args = [q, kk, v] if kind == "numpy" else [torch.from_numpy(a) for a in (q, kk, v)]
    out = k("causal_attention")(*args)
    assert_close(out, ref_sdpa(f64(q), f64(kk), f64(v), causal=True), **ATTN_TOL,
                 kind=np.ndarray if kind == "numpy" else torch.Tensor)


# ---------------------------------------------------------------- rope references


def inv_freq(d: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def ref_rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Hugging Face Llama: emb = cat(freqs, freqs); x cos(emb) + rotate_half(x) sin(emb)."""
    freqs = pos.double()[:, None] * inv_freq(x.shape[-1], theta)[None, :]  # [T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, D], broadcast over heads
    return x * emb.cos() + rotate_half(x) * emb.sin()


def ref_rope_interleaved(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """GPT-J: pairs (x[2i], x[2i+1]) rotated by pos * inv_freq[i]."""
    freqs = (pos.double()[:, None] * inv_freq(x.shape[-1], theta)[None, :])[:, None, :]  # [T, 1, D/2]
    cos, sin = freqs.cos(), freqs.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)


ROPES = {"rope": ref_rope, "rope_interleaved": ref_rope_interleaved}

#: (T, H, D), D even; D/2 odd in the last one.
ROPE_SHAPES = [(1, 1, 2), (3, 2, 8), (17, 3, 64), (33, 1, 128), (5, 7, 6)]


def positions(rng: np.random.Generator, t: int, max_pos: int) -> np.ndarray:
    """Unordered positions in [0, max_pos), with 0 and max_pos - 1 among them."""
    pos = rng.integers(0, max_pos, size=t, dtype=np.int64)
    pos[0] = max_pos - 1
    pos[-1] = 0
    return pos


def rope_tol(x: np.ndarray, max_pos: int) -> dict[str, float]:
    """The angle pos * inv_freq is formed in f32 (as Hugging Face does), so it is off by a few
    ulps of itself: ~max_pos * 2**-24 radians at the largest position. The output moves by as
    much times |x|; below ~64 that is under 1e-5, at 32768 it is ~1e-3 (measured 1.5e-3 max)."""
    angle_err = 4 * max_pos * 2.0**-24
    return {"rtol": RTOL, "atol": ATOL + angle_err * float(np.abs(x).max())}


@pytest.mark.parametrize("shape", ROPE_SHAPES)
@pytest.mark.parametrize("name", ROPES)
def test_rope(name: str, shape: tuple[int, int, int], rng: np.random.Generator) -> None:
    x, pos = randn(rng, *shape), positions(rng, shape[0], 64)
    assert_close(k(name)(x, pos), ROPES[name](f64(x), torch.from_numpy(pos), 10000.0), **rope_tol(x, 64))


@pytest.mark.parametrize("max_pos", [4096, 32768])
@pytest.mark.parametrize("name", ROPES)
def test_rope_long_positions(name: str, max_pos: int, rng: np.random.Generator) -> None:
    x, pos = randn(rng, 33, 2, 64), positions(rng, 33, max_pos)
    assert_close(k(name)(x, pos), ROPES[name](f64(x), torch.from_numpy(pos), 10000.0), **rope_tol(x, max_pos))


@pytest.mark.parametrize("how", ["default", "keyword", "positional"])
@pytest.mark.parametrize("name", ROPES)
def test_rope_theta(name: str, how: str, rng: np.random.Generator) -> None:
    x, pos = randn(rng, 9, 2, 16), positions(rng, 9, 50)
    if how == "default":
        theta, out = 10000.0, k(name)(x, pos)
    elif how == "keyword":
        theta, out = 500000.0, k(name)(x, pos, theta=500000.0)  # Llama 3's base
    else:
        theta, out = 100.0, k(name)(x, pos, 100.0)
    ref = ROPES[name]
    assert_close(out, ref(f64(x), torch.from_numpy(pos), theta), **rope_tol(x, 50))
    # Sensitive to theta: another base gives a visibly different answer.
    assert not torch.allclose(torch.as_tensor(out).double(), ref(f64(x), torch.from_numpy(pos), 2 * theta), atol=1e-3)


@pytest.mark.parametrize("name", ROPES)
def test_rope_position_zero_is_identity(name: str, rng: np.random.Generator) -> None:
    x = randn(rng, 4, 3, 10)
    np.testing.assert_array_equal(k(name)(x, np.zeros(4, dtype=np.int64)), x)


def test_rope_layouts_agree(rng: np.random.Generator) -> None:
    """rope_interleaved is rope on the dims permuted from (0, 1, 2, 3, ...) pairs to (0, 2, ...| 1, 3, ...) halves."""
    x, pos = randn(rng, 7, 3, 12), positions(rng, 7, 40)
    perm = np.concatenate([np.arange(0, 12, 2), np.arange(1, 12, 2)])
    halves = k("rope")(np.ascontiguousarray(x[..., perm]), pos)
    np.testing.assert_allclose(halves[..., np.argsort(perm)], k("rope_interleaved")(x, pos), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ROPES)
def test_rope_input_kinds(name: str, rng: np.random.Generator) -> None:
    """A torch x with a NumPy pos gives a torch tensor."""
    x, pos = randn(rng, 5, 2, 8), positions(rng, 5, 30)
    out = k(name)(torch.from_numpy(x), pos)
    assert_close(out, ROPES[name](f64(x), torch.from_numpy(pos), 10000.0), kind=torch.Tensor)


def test_kernels_imported_into_a_user_module(rng: np.random.Generator) -> None:
    """`import std.attention`: a decode step (S == 1 fixed by the signature) and RoPE with Llama 3's base."""
    mod = arke.loads(
        "import std.attention\n"
        "kernel decode(q: f32[B, H, 1, D], k: f32[B, G, T, D], v: f32[B, G, T, D]) -> f32[B, H, 1, D]\n"
        "  where H % G == 0\n"
        "{\n  return causal_attention(q, k, v)\n}\n"
        "kernel rope_llama3(x: f32[T, H, D], pos: i64[T]) -> f32[T, H, D]\n  where D % 2 == 0\n"
        "{\n  return rope(x, pos, 500000.0)\n}\n")
    q, kk, v = qkv(rng, *CONFIGS["decode"])
    assert_close(mod.kernels["decode"](q, kk, v), ref_sdpa(f64(q), f64(kk), f64(v), causal=True), **ATTN_TOL)
    x, pos = randn(rng, 9, 2, 16), positions(rng, 9, 50)
    assert_close(mod.kernels["rope_llama3"](x, pos), ref_rope(f64(x), torch.from_numpy(pos), 500000.0),
                 **rope_tol(x, 50))


# ---------------------------------------------------------------- guards


def _bad_calls(rng: np.random.Generator) -> dict[str, tuple]:
    q, kk, v = qkv(rng, 1, 4, 2, 5, 7, 8)
    x, pos = randn(rng, 3, 2, 4), np.arange(3, dtype=np.int64)
    return {
        # id: (kernel, args, kwargs, rule, parameter, texts the message must contain)
        "attention-heads-not-divisible": ("attention", (q, randn(rng, 1, 3, 7, 8), randn(rng, 1, 3, 7, 8)), {},
                                          "where", None, ("H % G == 0", "G = 3", "H = 4")),
        "attention-v-head-dim": ("attention", (q, kk, randn(rng, 1, 2, 7, 4)), {}, "dim", "v", ("D = 8",)),
        "attention-v-length": ("attention", (q, kk, randn(rng, 1, 2, 6, 8)), {}, "dim", "v", ("T = 7",)),
        "attention-k-batch": ("attention", (q, randn(rng, 2, 2, 7, 8), v), {}, "dim", "k", ("B = 1",)),
        "attention-q-float64": ("attention", (q.astype(np.float64), kk, v), {}, "dtype", "q", ("f32",)),
        "attention-k-rank": ("attention", (q, kk[0], v), {}, "rank", "k", ()),
        "causal-fewer-keys": ("causal_attention", (q, kk[:, :, :4], v[:, :, :4]), {}, "where", None,
                              ("T >= S", "S = 5", "T = 4")),
        "causal-v-float16": ("causal_attention", (q, kk, v.astype(np.float16)), {}, "dtype", "v", ("f32",)),
        "rope-odd-dim": ("rope", (randn(rng, 3, 2, 5), pos), {}, "where", None, ("D % 2 == 0", "D = 5")),
        "rope-pos-length": ("rope", (x, np.arange(4)), {}, "dim", "pos", ("T = 3",)),
        "rope-pos-int32": ("rope", (x, pos.astype(np.int32)), {}, "dtype", "pos", ("i64",)),
        "rope-pos-float": ("rope_interleaved", (x, pos.astype(np.float32)), {}, "dtype", "pos", ("i64",)),
        "rope-theta-string": ("rope_interleaved", (x, pos), {"theta": "big"}, "type", "theta", ()),
        "rope-x-rank": ("rope_interleaved", (x[0], pos), {}, "rank", "x", ()),
    }


@pytest.mark.parametrize("case", list(_bad_calls(np.random.default_rng(0))))
def test_guard_errors(case: str, rng: np.random.Generator) -> None:
    name, args, kwargs, rule, param, texts = _bad_calls(rng)[case]
    expect_guard(k(name), args, kwargs, rule=rule, param=param, mentions=texts)
