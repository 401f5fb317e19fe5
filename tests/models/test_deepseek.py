"""DeepSeek-V2 (arke.models.from_pretrained on a deepseek_v2 folder) against transformers: multi-head latent
attention with the up-projections absorbed (with and without the query's low-rank bottleneck), a dense first
layer then shared plus routed experts (greedy and group-limited selection), the latent KV cache, model
bundles, and what is refused."""

from __future__ import annotations

import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from hf_support import RTOL, randomize, relative_error

import arke.models
from arke.models.deepseek import DeepseekLayer, LatentCache

VOCAB = 320


@cache
def saved(q_lora: int | None = None, method: str = "greedy") -> tuple[Path, Any]:
    groups = {"n_group": 3, "topk_group": 2} if method == "group_limited_greedy" else {}
    cfg = transformers.DeepseekV2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=2, n_routed_experts=6, num_experts_per_tok=2,
        first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=q_lora, qk_nope_head_dim=8, qk_rope_head_dim=4,
        v_head_dim=8, max_position_embeddings=128, routed_scaling_factor=1.5, topk_method=method,
        tie_word_embeddings=False, **groups)
    model = transformers.DeepseekV2ForCausalLM(cfg).eval()
    randomize(model, seed=7)
    folder = Path(tempfile.mkdtemp(prefix="arke-deepseek-"))
    model.save_pretrained(folder)
    return folder, model


@cache
def loaded(q_lora: int | None = None, method: str = "greedy") -> arke.models.CausalLM:
    return arke.models.from_pretrained(saved(q_lora, method)[0], max_seq=96)


def prompt(length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("q_lora,method", [(None, "greedy"), (24, "greedy"), (None, "group_limited_greedy")])
def test_logits_and_greedy_generation_follow_transformers(q_lora: int | None, method: str) -> None:
    _, hf = saved(q_lora, method)
    lm = loaded(q_lora, method)
    assert all(isinstance(layer, DeepseekLayer) for layer in lm.layers)
    assert not lm.layers[0].config.experts and lm.layers[1].config.experts == 6  # dense, then experts
    ids = prompt(9, seed=1)
    with torch.no_grad():
        want = hf(ids).logits
        tokens = hf.generate(ids, max_new_tokens=32, do_sample=False, attention_mask=torch.ones_like(ids),
                             pad_token_id=0, eos_token_id=None)
    assert relative_error(lm(ids, lm.new_cache(1), every_token=True), want) < RTOL
    assert torch.equal(lm.generate(ids, 32), tokens)


def test_the_cache_holds_latent_rows_and_decode_continues_a_prefill() -> None:
    lm = loaded()
    cache = lm.new_cache(2)
    assert isinstance(cache.layers[0], LatentCache)
    c = lm.layers[0].config
    assert tuple(cache.layers[0].c.shape) == (2, 96, c.kv_lora) and tuple(cache.layers[0].kr.shape) == (2, 96, c.rope)
    ids = torch.cat([prompt(6, seed=2), prompt(6, seed=3)])
    whole = lm(ids, lm.new_cache(2), every_token=True)
    lm(ids[:, :5], cache)
    step = lm(ids[:, 5:], cache)
    assert relative_error(step, whole[:, -1]) < RTOL


def test_batches_of_different_lengths_over_a_paged_latent_cache_and_bundles(tmp_path: Path) -> None:
    lm = loaded(24)
    prompts = [[5, 9, 13], [1, 2, 3, 4, 5, 6, 7, 8, 9], [42], [7, 7, 7, 7, 7]]
    together = lm.generate(prompts, 8)
    for p, got in zip(prompts, together, strict=True):
        assert torch.equal(got, lm.generate(torch.tensor([p]), 8)[0])
    folder = lm.save_bundle(tmp_path / "ds")
    again = arke.models.load_bundle(folder)
    ids = prompt(5, seed=4)
    assert torch.equal(again.generate(ids, 16), lm.generate(ids, 16))
    assert all(torch.equal(a, b) for a, b in zip(again.generate(prompts, 4), lm.generate(prompts, 4), strict=True))


def test_unsupported_configs_are_refused(tmp_path: Path) -> None:
    cfg = transformers.DeepseekV2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                                        moe_intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=2, n_routed_experts=4, num_experts_per_tok=2,
                                        kv_lora_rank=8, q_lora_rank=None, qk_nope_head_dim=4, qk_rope_head_dim=4,
                                        v_head_dim=4, attention_bias=True)
    transformers.DeepseekV2ForCausalLM(cfg).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="projection biases"):
        arke.models.from_pretrained(tmp_path, max_seq=16)
    with pytest.raises(ValueError, match="f32 activations"):
        arke.models.from_pretrained(saved()[0], max_seq=16, dtype=torch.bfloat16)



@pytest.mark.parametrize(("fields", "match"), [
    ({"n_shared_experts": 0}, "n_shared_experts 0"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok must be a whole number from 1 to n_routed_experts"),
    ({"topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 3}, "topk_group must be from 1"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings": 8}, "load the model with "
     "max_seq=8 or less"),
])
def test_configs_transformers_runs_differently_are_refused_by_field(tmp_path: Path, fields: dict[str, Any],
                                                                     match: str) -> None:
    base = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4, num_experts_per_tok=2,
                n_shared_experts=1, kv_lora_rank=8, q_lora_rank=None, qk_nope_head_dim=4, qk_rope_head_dim=4,
                v_head_dim=4, max_position_embeddings=64)
    transformers.DeepseekV2ForCausalLM(transformers.DeepseekV2Config(**{**base, **fields})).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=match):
        arke.models.from_pretrained(tmp_path, max_seq=16)
