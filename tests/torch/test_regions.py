"""The arke backend's fusion: regions of an ATen graph (elementwise operations, reductions, softmax, layout
operators) translated to `.ak` kernels, checked against eager torch on random and ragged shapes."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from arke.torch import aten_ak, backend

OPTIONS = {"arke.rest": "eager", "arke.kernels": "arke", "arke.fuse": "all"}


def _rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    b, s, _ = x.shape
    q = x.view(b, s, -1, 16).transpose(1, 2)  # [B, H, S, 16]
    half = torch.cat((-q[..., 8:], q[..., :8]), dim=-1)
    return q * cos.unsqueeze(1) + half * sin.unsqueeze(1)


def _partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """GPT-NeoX's: the first 4 of each head's 16 features turned, the rest passed through (slices of part
    of an axis)."""
    b, s, _ = x.shape
    q = x.view(b, s, -1, 16).transpose(1, 2)
    r, rest = q[..., :4], q[..., 4:]
    half = torch.cat((-r[..., 2:], r[..., :2]), dim=-1)
    return torch.cat((r * cos[..., :4].unsqueeze(1) + half * sin[..., :4].unsqueeze(1), rest), dim=-1)


def _flat_gelu(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A product's rows flattened ([2·S, 40]) read back as [2, S, 40]: S is in no input's shape by itself."""
    return F.gelu(x.view(-1, 40) @ w).view(x.shape) * 2.0


def _swiglu(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return F.silu(g) * u


def _softmaxes(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1) * w + torch.log_softmax(x, dim=1).sum(1, keepdim=True)


def _reductions(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.amax(dim=(0, 2)) + x.sum(dim=(0, 2)) - x.mean(dim=(0, 2)).abs() + w.amin()


def _pointwise(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.clamp(x, min=-0.5, max=2.0) ** 3 - F.gelu(x, approximate="tanh") + F.gelu(x) / (1.0 + x.exp())
    z = torch.maximum(x, w).abs().sqrt() - (2.0 + x.abs()).reciprocal() + torch.erf(x) - x.neg().relu()
    return torch.tanh(y) * torch.sigmoid(w) - 2.5 * z + torch.minimum(x, w) * 0.25


def _inputs(name: str, n: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    if name == "flat_gelu":
        return torch.randn(2, n, 40, generator=g), torch.randn(40, 40, generator=g)
    if name in ("rope", "partial_rope"):
        return (torch.randn(2, n, 64, generator=g), torch.randn(2, n, 16, generator=g),
                torch.randn(2, n, 16, generator=g))
    if name == "swiglu":
        return torch.randn(n, 40, generator=g), torch.randn(n, 40, generator=g)
    if name in ("softmaxes", "reductions"):
        return torch.randn(3, n, 24, generator=g), torch.randn(24, generator=g)
    return torch.randn(n, 72, generator=g), torch.randn(72, generator=g)


CASES: dict[str, Callable[..., torch.Tensor]] = {
    "rmsnorm": _rmsnorm, "rope": _rope, "partial_rope": _partial_rope, "flat_gelu": _flat_gelu,
    "swiglu": _swiglu, "softmaxes": _softmaxes,
    "reductions": _reductions, "pointwise": _pointwise,
}


@pytest.mark.parametrize("name", list(CASES))
def test_regions_match_eager_on_ragged_sizes(name: str) -> None:
    """Compiled against eager at 3, 17 and 4097 rows (static sizes first, then the rows made symbolic: a model's
    widths stay numbers, its lengths do not): every case is fused."""
    torch._dynamo.reset()
    f = CASES[name]
    compiled = torch.compile(f, backend="arke", options=OPTIONS)
    g = torch.Generator().manual_seed(7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", backend.ArkeFallbackWarning)
        for n in (3, 17, 4097):
            args = _inputs(name, n, g)
            torch.testing.assert_close(compiled(*args), f(*args), rtol=2e-5, atol=2e-5)
    report = backend.reports()[-1]
    assert report.fused, str(report)
    assert not report.unfused, str(report)


def test_a_norm_and_its_scaling_are_one_kernel() -> None:
    """The norm's pow, mean, add, rsqrt and both products: one Arke kernel, nothing left for Inductor."""
    torch._dynamo.reset()
    x, w = torch.randn(5, 72), torch.randn(72)
    torch.testing.assert_close(torch.compile(_rmsnorm, backend="arke", options=OPTIONS)(x, w), _rmsnorm(x, w))
    report = backend.reports()[-1]
    assert report.fused == [6] and report.others == 0, str(report)


def test_outputs_keep_their_layout() -> None:
    """A fused value the graph reads through a view keeps the strides the graph gave it (here transposed)."""
    torch._dynamo.reset()

    def f(x: torch.Tensor) -> torch.Tensor:
        y = (x.transpose(0, 1) * 2.0).exp()  # [N, M], laid out as x is: y.t() is contiguous
        return y.t().view(-1) + 1.0

    x = torch.randn(6, 5)
    torch.testing.assert_close(torch.compile(f, backend="arke", options=OPTIONS)(x), f(x))


def test_integer_work_stays_with_torch() -> None:
    """Integer arithmetic is not translated; the f32 work around it still is, and the result is torch's."""
    torch._dynamo.reset()

    def f(ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        pos = (ids * 3 + 1) % 7
        return x * pos.float().unsqueeze(-1) + 1.0

    ids, x = torch.randint(0, 9, (4,)), torch.randn(4, 8)
    torch.testing.assert_close(torch.compile(f, backend="arke", options=OPTIONS)(ids, x), f(ids, x))
    assert backend.reports()[-1].fused


def test_inductor_compiles_around_the_regions() -> None:
    """With Inductor for the rest (the default), the fused kernels are opaque calls it schedules around."""
    torch._dynamo.reset()

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return _rmsnorm(x, w).matmul(w.unsqueeze(-1)).squeeze(-1).cumsum(0)

    x, w = torch.randn(9, 72), torch.randn(72)
    got = torch.compile(f, backend="arke", options={"arke.fuse": "all"})(x, w)
    torch.testing.assert_close(got, f(x, w), rtol=1e-4, atol=1e-4)
    assert backend.reports()[-1].fused


def test_fusion_can_be_switched_off() -> None:
    torch._dynamo.reset()
    x, w = torch.randn(5, 72), torch.randn(72)
    out = torch.compile(_rmsnorm, backend="arke", options={**OPTIONS, "arke.fuse": False})(x, w)
    torch.testing.assert_close(out, _rmsnorm(x, w))
    assert not backend.reports()[-1].fused
    torch._dynamo.reset()
    small = torch.compile(_rmsnorm, backend="arke", options={**OPTIONS, "arke.fuse": True})(x, w)  # 360 elements
    torch.testing.assert_close(small, _rmsnorm(x, w))
    assert not backend.reports()[-1].fused and backend.reports()[-1].small == 1
    with pytest.raises(Exception, match=r"arke\.fuse"):
        torch._dynamo.reset()
        torch.compile(_rmsnorm, backend="arke", options={**OPTIONS, "arke.fuse": "yes"})(x, w)


@pytest.mark.parametrize(("value", "text"), [(2, "2.0"), (-0.5, "(-0.5)"), (math.inf, "inf"), (-math.inf, "(-inf)")])
def test_literals(value: Any, text: str) -> None:
    assert aten_ak.literal(value) == text


@pytest.mark.parametrize("bad", [math.nan, True, "x", None])
def test_untranslatable_literals(bad: Any) -> None:
    with pytest.raises(aten_ak.Untranslatable):
        aten_ak.literal(bad)


def test_sizes_become_dims() -> None:
    assert aten_ak.dim_text(64) == "64"
    with pytest.raises(aten_ak.Untranslatable, match="empty"):
        aten_ak.dim_text(0)


def test_layer_norm_after_decomposition() -> None:
    """LayerNorm reaches the graph as var_mean and elementwise operations: one region, eager's result."""
    torch._dynamo.reset()

    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5) + x.var(dim=-1, keepdim=True, correction=1)

    x, w, b = torch.randn(2, 7, 72), torch.randn(72), torch.randn(72)
    torch.testing.assert_close(torch.compile(f, backend="arke", options=OPTIONS)(x, w, b), f(x, w, b),
                               rtol=2e-5, atol=2e-5)
    report = backend.reports()[-1]
    assert len(report.fused) == 1 and not report.unfused, str(report)


def _where(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, x.exp(), y * 2.0) + 1.0


def _nan_and_inf(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x + float("nan")) * 0.0 + torch.clamp(y, min=float("-inf")) + x.amax(-1, keepdim=True)


def _ungrouped_view(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x * 2.0).reshape(x.shape[1], x.shape[0]).t().exp() + y


def _long_chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    for k in range(40):
        x = torch.tanh(x * (1.0 + k / 100.0) + y)
    return x


def _empty_rows(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x[:0] * 2.0).sum(0) + y.sum(0)


HOSTILE = {"where": _where, "nan_and_inf": _nan_and_inf, "ungrouped_view": _ungrouped_view,
           "long_chain": _long_chain, "empty_rows": _empty_rows}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_graphs_still_match_eager(name: str) -> None:
    """Graphs with what regions do not take (bool masks, NaN, views across axes, empty slices) or take at length:
    the result is eager's, whatever was fused."""
    torch._dynamo.reset()
    f = HOSTILE[name]
    x, y = torch.randn(6, 4), torch.randn(6, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", backend.ArkeFallbackWarning)
        got = torch.compile(f, backend="arke", options=OPTIONS)(x, y)
    torch.testing.assert_close(got, f(x, y), rtol=2e-5, atol=2e-5, equal_nan=True)


def test_a_failing_rewrite_leaves_the_graph_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the rewrite costs the user nothing but the speed: torch runs the graph, the report says why."""
    torch._dynamo.reset()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr("arke.torch.regions.fuse", broken)
    x, w = torch.randn(5, 72), torch.randn(72)
    with pytest.warns(backend.ArkeFallbackWarning, match="the rewrite failed"):
        got = torch.compile(_rmsnorm, backend="arke", options=OPTIONS)(x, w)
    torch.testing.assert_close(got, _rmsnorm(x, w))


def test_gradients_leave_the_graph_to_inductor_with_the_reason() -> None:
    """With gradients needed, nothing is rewritten (Arke's operators have no derivatives): the forward and the
    backward are torch's, and the forward graph's report says why, once."""
    torch._dynamo.reset()

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return _rmsnorm(x, w).sum()

    x, w = torch.randn(7, 72, requires_grad=True), torch.randn(72, requires_grad=True)
    with pytest.warns(backend.ArkeFallbackWarning, match="gradients are needed") as caught:
        y = torch.compile(f, backend="arke", options={"arke.rest": "eager"})(x, w)
        y.backward()
    x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
    f(x2, w2).backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad)
    assert sum(isinstance(m.message, backend.ArkeFallbackWarning) for m in caught) == 1


def _gathers(ids: torch.Tensor, table: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    h = F.embedding(ids, table)  # [B, T, D]
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
    rows = torch.index_select(table, 0, ids[0])  # [T, D]
    picked = torch.gather(rows, 1, (ids[0] % 3).unsqueeze(-1).expand(-1, 4))[:, :1]  # [T, 1]
    return torch.where(mask, h, -1.0) + rows * picked


def test_gathers_and_masks_are_fused() -> None:
    """Embedding, index_select and gather read their indices from an integer tensor, and where takes a bool
    mask: all in the region of the norm they feed; out-of-range ids fail as torch's do, with an error."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(3)
    table = torch.randn(50, 8, generator=g)
    f = torch.compile(_gathers, backend="arke", options=OPTIONS)
    for t in (3, 17, 4097):
        ids = torch.randint(0, 8, (1, t), generator=g)
        mask = torch.rand(1, t, 8, generator=g) > 0.3
        torch.testing.assert_close(f(ids, table, mask), _gathers(ids, table, mask), rtol=2e-5, atol=2e-5)
    report = backend.reports()[-1]
    assert report.fused and not report.unfused, str(report)
    with pytest.raises(Exception, match=r"outside|out of range|index"):
        f(torch.full((1, 3), 99), table, torch.ones(1, 3, 8, dtype=torch.bool))


def _masks(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    leaky = torch.where(x > 0, x, 0.01 * x)
    keep = ((x >= y) & (y < 1.0)) | ~(x != x)  # NaN compares unequal to itself
    return leaky + torch.where(keep, y, x.exp()), keep


def test_comparisons_and_logic_in_regions() -> None:
    """Comparisons, logic and where in one region; a bool value read outside is a bool output of the kernel."""
    torch._dynamo.reset()
    x, y = torch.randn(9, 40), torch.randn(9, 40)
    x[0, 0] = float("nan")
    got = torch.compile(_masks, backend="arke", options=OPTIONS)(x, y)
    want = _masks(x, y)
    torch.testing.assert_close(got[0], want[0], equal_nan=True)
    assert got[1].dtype == torch.bool and torch.equal(got[1], want[1])
    report = backend.reports()[-1]
    assert len(report.fused) == 1 and report.others == 0, str(report)


def test_the_report_names_what_was_not_translated_and_what_has_no_definition() -> None:
    def f(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return torch.exp(x + i) + torch.sort(x, dim=1).values

    x, i = torch.randn(8, 16), torch.randint(0, 4, (8, 16))
    torch.testing.assert_close(torch.compile(f, backend="arke", options=OPTIONS)(x, i), f(x, i))
    report = backend.reports()[-1]
    assert any("int64" in why for _, why in report.untranslated), report
    assert any("sort" in op for op in report.foreign), report
    assert "not translated" in str(report) and "without a .ak definition" in str(report)


def test_a_gather_with_a_shorter_index_is_left_to_torch_with_the_reason() -> None:
    """torch lets a gather's index be shorter than the input along the other axes (it reads their first rows):
    the region would have read the input's whole axis (the checker's AK3003 about a generated kernel)."""
    torch._dynamo.reset()
    w, i = torch.randn(6, 50), torch.randint(0, 50, (3, 4))

    def f(i: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return w.gather(1, i) * 2

    got = torch.compile(f, backend="arke", options={"arke.fuse": "all"})(i, w)
    assert torch.equal(got, f(i, w))
    assert "a gather whose index is 3 long on axis 0, where the input is 6" in str(backend.reports()[-1])


@pytest.mark.parametrize("config", ["capture_dynamic_output_shape_ops", "capture_scalar_outputs"])
def test_a_size_that_may_be_zero_stays_with_torch(config: str) -> None:
    """A data-dependent size (a boolean mask's rows, an `.item()` slice) may be 0 as the graph runs: the
    region's kernel refused it ("dims must be at least 1") where torch gives an empty result, or a sum's
    identity. Such a region is left to Inductor, with the reason."""
    def masked(x: torch.Tensor) -> torch.Tensor:
        return ((x[x[:, 0] > 0] * 2).exp() + 1).sum(0)

    def sliced(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return ((x[:k.item()] * 2).exp() + 1).sum(0)

    torch._dynamo.reset()
    with torch._dynamo.config.patch(**{config: True}), torch.no_grad():
        x = torch.randn(1024, 64, generator=torch.Generator().manual_seed(7))
        none = -x.abs() - 0.1
        close = {"rtol": 1e-5, "atol": 1e-4}  # a sum of 1024 exponentials, in another order than torch's
        if config == "capture_dynamic_output_shape_ops":
            g = torch.compile(masked, backend="arke", options={"arke.fuse": "all"})
            torch.testing.assert_close(g(x.abs() + 0.1), masked(x.abs() + 0.1), **close)
            got, want = g(none), masked(none)
        else:
            g = torch.compile(sliced, backend="arke", options={"arke.fuse": "all"})
            torch.testing.assert_close(g(x, torch.tensor(5)), sliced(x, torch.tensor(5)), **close)
            got, want = g(x, torch.tensor(0)), sliced(x, torch.tensor(0))
    torch.testing.assert_close(got, want)
    reasons = [why for r in backend.reports() for _, why in r.unfused]
    assert any("may be 0 as it runs" in why for why in reasons), reasons
