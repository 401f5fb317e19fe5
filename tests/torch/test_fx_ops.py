"""The operators of the arke backend (torch.ops.arke_fx): Arke's kernels against torch's on ragged shapes,
the measured choice per shape, weights repacked when written in place, torch's fallbacks for what the
kernels cannot take."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from arke.torch import fx_ops

fx_ops.define()


SHAPES = [((3,), 4097, 19, False), ((2, 5), 64, 33, True), ((1,), 7, 1, True)]


@pytest.mark.parametrize("mode", ["arke", "measured"])
@pytest.mark.parametrize(("lead", "n", "k", "bias"), SHAPES)
def test_linear_matches_torch(mode: str, lead: tuple[int, ...], n: int, k: int, bias: bool) -> None:
    x, w = torch.randn(*lead, k), torch.randn(n, k)
    b = torch.randn(n) if bias else None
    got = torch.ops.arke_fx.linear(x, w, b, mode)
    assert got.shape == (*lead, n) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-4)
    if mode == "measured":
        assert fx_ops.decisions()[("linear", fx_ops._bucket(x.numel() // k), n, k, bias)] in ("arke", "torch")


def test_a_weight_written_in_place_is_repacked() -> None:
    x, w = torch.randn(4, 24), torch.randn(40, 24)
    torch.ops.arke_fx.linear(x, w, None, "arke")
    with torch.no_grad():
        w.mul_(-3.0)
    torch.testing.assert_close(torch.ops.arke_fx.linear(x, w, None, "arke"), F.linear(x, w), rtol=1e-5, atol=1e-4)


def test_new_storage_is_repacked_and_repack_forgets_writes_through_data() -> None:
    import arke.torch

    x, w = torch.randn(4, 24), torch.nn.Parameter(torch.randn(40, 24))
    torch.ops.arke_fx.linear(x, w, None, "arke")
    w.data = torch.randn(40, 24)  # new storage, the same version
    torch.testing.assert_close(torch.ops.arke_fx.linear(x, w, None, "arke"), F.linear(x, w), rtol=1e-5, atol=1e-4)
    w.data.mul_(2.0)  # unseen by torch's version counter: forgotten by hand
    arke.torch.repack()
    torch.testing.assert_close(torch.ops.arke_fx.linear(x, w, None, "arke"), F.linear(x, w), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(("k", "n"), [(64, 64), (48, 80)])
def test_one_weight_read_both_ways_is_packed_for_each(k: int, n: int) -> None:
    """A tied ``x @ W`` and ``h @ W.t()``: GPT-2's [K, N] form and the [N, K] form of the same tensor are two
    packings (one reused for the other was the wrong matrix, or the wrong shape)."""
    w, x = torch.randn(k, n) / 8, torch.randn(5, k)
    h = torch.ops.arke_fx.linear(x, w, None, "arke", True)  # x @ w
    torch.testing.assert_close(h, x @ w, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(torch.ops.arke_fx.linear(h, w, None, "arke"), h @ w.t(), rtol=1e-5, atol=1e-4)

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(w.clone())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(x @ self.w) @ self.w.t()

    m = Tied().eval()
    with torch.no_grad():
        compiled = torch.compile(m, backend="arke", options={"arke.kernels": "arke", "arke.rest": "eager"})
        torch.testing.assert_close(compiled(x), m(x), rtol=1e-5, atol=1e-4)


def test_an_inference_tensor_that_is_data_is_read_as_it_is_at_each_call() -> None:
    """Without a version counter an in-place write cannot be seen: a plain inference tensor is not packed and
    kept (only a model's parameters are), so a caller's update is read."""
    with torch.inference_mode():
        x, bank = torch.randn(6, 16), torch.randn(12, 16)
        torch.testing.assert_close(torch.ops.arke_fx.linear(x, bank, None, "arke"), x @ bank.t(), rtol=1e-5,
                                   atol=1e-4)
        bank.copy_(torch.randn(12, 16))
        torch.testing.assert_close(torch.ops.arke_fx.linear(x, bank, None, "arke"), x @ bank.t(), rtol=1e-5,
                                   atol=1e-4)


def test_data_shared_with_numpy_is_read_as_it_is_at_each_call() -> None:
    """Any second operand that is no Parameter was packed once and kept, keyed on its version counter: a
    write through NumPy's shared memory (or any path around the counter) was then never seen."""
    import numpy as np

    arr = np.random.default_rng(3).standard_normal((24, 40)).astype(np.float32)
    y, x = torch.from_numpy(arr), torch.randn(5, 24)
    with torch.no_grad():
        g = torch.compile(lambda x, y: x @ y, backend="arke", options={"arke.kernels": "arke"})
        torch.testing.assert_close(g(x, y), x @ y, rtol=1e-5, atol=1e-4)
        arr *= 2.0
        torch.testing.assert_close(g(x, y), x @ y, rtol=1e-5, atol=1e-4)


def test_an_inference_tensor_weight_is_packed() -> None:
    """A model made under inference_mode has weights without a version counter."""
    with torch.inference_mode():
        x, w = torch.randn(8, 16), torch.randn(12, 16)
        torch.testing.assert_close(torch.ops.arke_fx.linear(x, w, None, "arke"), F.linear(x, w), rtol=1e-5,
                                   atol=1e-4)
        lin = torch.nn.Linear(16, 12).eval()
        compiled = torch.compile(lin, backend="arke", options={"arke.kernels": "arke"})
        torch.testing.assert_close(compiled(x), lin(x), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(("h", "g", "s", "t", "causal"), [(4, 2, 3, 3, True), (4, 4, 1, 37, False), (6, 2, 5, 9, True)])
def test_sdpa_matches_torch(h: int, g: int, s: int, t: int, causal: bool) -> None:
    q, k, v = torch.randn(2, h, s, 8), torch.randn(2, g, t, 8), torch.randn(2, g, t, 8)
    got = torch.ops.arke_fx.sdpa(q, k, v, causal, None, "arke")  # causal with s != t: torch's (top-left) meaning
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=h != g)
    assert got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("scale", "causal", "t"), [(0.5, False, 4), (1.0, True, 37), (0.01, False, 4097)])
def test_any_scale_is_folded_into_the_queries(scale: float, causal: bool, t: int) -> None:
    q, k, v = torch.randn(1, 4, t, 8), torch.randn(1, 2, t, 8), torch.randn(1, 2, t, 8)
    got = torch.ops.arke_fx.sdpa(q, k, v, causal, scale, "arke")
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.equal(got, torch.ops.arke_fx.sdpa(q, k, v, causal, None, "arke"))  # the scale was applied
