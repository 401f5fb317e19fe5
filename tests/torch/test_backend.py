"""torch.compile(backend="arke") against eager on small transformers models (random weights, two layers):
prefill and decode steps over a KV cache, no recompilation as the cache grows, fallbacks reported."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import transformers

from arke.torch import backend, fx_ops

VOCAB = 96


def model(arch: str) -> Any:
    torch.manual_seed(0)
    common: dict[str, Any] = dict(vocab_size=VOCAB, max_position_embeddings=128)
    if arch == "gpt2":
        cfg: Any = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=128, vocab_size=VOCAB)
    else:
        cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
               "mistral": transformers.MistralConfig}[arch]
        extra = {"sliding_window": 64} if arch == "mistral" else {}
        cfg = cls(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, **common, **extra)
    cfg._attn_implementation = "sdpa"
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gpt2"])
def test_prefill_and_decode_match_eager(arch: str) -> None:
    torch._dynamo.reset()
    m = model(arch)
    # the rewrite is what is tested: the rest of the graph runs as torch ops (Inductor compiles it in
    # test_inductor_compiles_the_rest, once: it takes most of a minute per model here)
    compiled = torch.compile(m, backend="arke", dynamic=True,
                             options={"arke.rest": "eager", "arke.kernels": "arke", "arke.fuse": "all"})
    ids = torch.randint(0, VOCAB, (1, 11))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", backend.ArkeFallbackWarning)
        want = m(ids, use_cache=True)
        got = compiled(ids, use_cache=True)
        torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4)
        past_w, past_g = want.past_key_values, got.past_key_values
        token = want.logits[:, -1:].argmax(-1)
        for _ in range(4):  # decode steps: the cache grows by one each time
            w = m(token, past_key_values=past_w, use_cache=True)
            g = compiled(token, past_key_values=past_g, use_cache=True)
            torch.testing.assert_close(g.logits, w.logits, rtol=1e-4, atol=1e-4)
            token = w.logits[:, -1:].argmax(-1)
    recent = backend.reports()[-3:]
    taken = sum((r.taken for r in recent), start=backend.Report().taken)
    assert taken["linear"] >= 1 + 2 * 4  # every projection of both layers and the head (GPT-2's Conv1D too)
    assert taken["attention"] >= 2
    # the norms, the rotary embedding, the MLP's activation and the residuals: fused, nothing refused
    assert all(r.fused and not r.unfused for r in recent), [str(r) for r in recent]


def _prefill_matches_eager(arch: str, options: dict[str, str]) -> backend.Report:
    """Compile ``arch``'s model with ``options``, check a prefill against eager; the graph's report."""
    torch._dynamo.reset()
    m = model(arch)
    ids = torch.randint(0, VOCAB, (1, 9))
    with torch.no_grad():
        got = torch.compile(m, backend="arke", options=options)(ids).logits
        torch.testing.assert_close(got, m(ids).logits, rtol=1e-4, atol=1e-4)
    return backend.reports()[-1]


def test_inductor_compiles_the_rest() -> None:
    assert _prefill_matches_eager("llama", {"arke.kernels": "arke"}).taken["attention"] == 2


def test_measured_nodes_go_to_the_faster_of_the_two() -> None:
    report = _prefill_matches_eager("qwen2", {"arke.rest": "eager"})
    assert report.mode == "measured" and not report.left
    # every linear (7 per layer and the head) and attention node was timed: taken by Arke, or left to torch
    assert sum(report.taken.values()) + len(report.slower) == 2 * 8 + 1
    made = fx_ops.decisions()
    assert made and set(made.values()) <= {"arke", "torch"}


def test_decode_does_not_recompile_per_length() -> None:
    torch._dynamo.reset()
    m = model("qwen2")
    graphs: list[int] = []

    def counting(gm: Any, example_inputs: list[Any]) -> Any:
        graphs.append(1)
        return backend.arke_backend(gm, example_inputs, options={"arke.rest": "eager"})

    compiled = torch.compile(m, backend=counting, dynamic=True)
    counts = []
    with torch.no_grad():
        out = compiled(torch.randint(0, VOCAB, (1, 8)), use_cache=True)
        past = out.past_key_values
        for step in range(6):
            out = compiled(torch.tensor([[step + 1]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            counts.append(len(graphs))
    assert counts[1] == counts[-1], counts  # after the first decode step, no length compiles again


def test_nodes_arke_cannot_take_are_reported_with_the_reason() -> None:
    torch._dynamo.reset()

    def f(x: torch.Tensor, w: torch.Tensor, q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        a = torch.nn.functional.linear(x.double(), w.double()).float()
        o = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        return a.sum() + o.sum() + torch.nn.functional.linear(x, w).sum()

    args = (torch.randn(3, 8), torch.randn(5, 8), torch.randn(1, 2, 4, 8), torch.zeros(4, 4))
    with pytest.warns(backend.ArkeFallbackWarning, match="float64") as caught:
        got = torch.compile(f, backend="arke", options={"arke.kernels": "arke"})(*args)
    torch.testing.assert_close(got, f(*args), rtol=1e-4, atol=1e-4)
    text = next(str(w.message) for w in caught if issubclass(w.category, backend.ArkeFallbackWarning))
    assert "an attention mask" in text and "Arke took 1 × linear" in text


def test_attention_at_another_scale_is_taken() -> None:
    """OPT scales its queries itself and asks SDPA for scale 1.0: the scale is folded into the queries."""
    torch._dynamo.reset()

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0) * 2.0

    q, k, v = (torch.randn(2, 4, 19, 16) for _ in range(3))
    got = torch.compile(f, backend="arke", options={"arke.kernels": "arke", "arke.rest": "eager"})(q, k, v)
    torch.testing.assert_close(got, f(q, k, v), rtol=1e-5, atol=1e-5)
    report = backend.reports()[-1]
    assert report.taken["attention"] == 1 and not report.left, str(report)


@pytest.mark.parametrize("mode", [None, "arke"])
def test_a_bias_of_one_element_is_left_to_torch(mode: str | None) -> None:
    """`F.linear(x, w, b)` with b of shape [1] (torch broadcasts it over the columns) is not `linear_bias`: it
    failed the kernel's N check (the whole graph fell back with a traceback, or the call raised)."""
    torch._dynamo.reset()

    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, w, b)

    args = (torch.randn(5, 40), torch.randn(30, 40), torch.tensor([0.5]))
    options = {"arke.kernels": mode} if mode else None
    with pytest.warns(backend.ArkeFallbackWarning, match="a bias of one element broadcast over the columns"):
        got = torch.compile(f, backend="arke", options=options)(*args)
    torch.testing.assert_close(got, f(*args), rtol=1e-5, atol=1e-5)
