"""``benchmarks/bounds.py``: the flops and bytes the benchmarks' "÷ the machine's limit" lines divide by,
counted from a model's own modules (checked here against counts by hand)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

transformers = pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bounds.py"


def bounds() -> ModuleType:
    spec = importlib.util.spec_from_file_location("arke_bench_bounds", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_llama_flops_count_every_linear_and_the_causal_pairs() -> None:
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=2, vocab_size=100,
                                      tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config)
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128  # q, k and v, o, gate/up/down
    attention = 2 * 2 * 2 * 4 * 16  # layers, QK and PV, 2 flops, heads, head size: per (query, key)
    b = bounds()
    assert b.forward_flops(model, 5, 1) == 2 * per_layer * 2 * 5 + 2 * 64 * 100 + attention * 15
    assert b.forward_flops(model, 5, 5) == 2 * per_layer * 2 * 5 + 2 * 64 * 100 * 5 + attention * 15
    # one token after 7 cached: it sees 8 keys
    assert b.forward_flops(model, 1, 1, context=7) == 2 * per_layer * 2 + 2 * 64 * 100 + attention * 8
    assert b.decode_bytes(model, 3) == (2 * per_layer + 64 * 100) * 4 + 2 * 2 * 2 * 16 * 3 * 4


def test_gpt2_counts_its_conv1d_weights_and_biases() -> None:
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_head=2, n_layer=1, vocab_size=50))
    weights = 32 * 96 + 32 * 32 + 32 * 128 + 128 * 32
    biases = 96 + 32 + 128 + 32
    b = bounds()
    assert b.decode_bytes(model, 3) == (weights + biases + 32 * 50) * 4 + 2 * 1 * 2 * 16 * 3 * 4
    assert b.forward_flops(model, 2, 1) == 2 * weights * 2 + 2 * 32 * 50 + 1 * 2 * 2 * 2 * 16 * 3


def test_one_decoder_layer_counts_its_own_weights_and_one_layer_of_cache() -> None:
    config = transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=1, vocab_size=100)
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    layer = Qwen2DecoderLayer(config, layer_idx=0)
    weights = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128
    biases = 64 + 2 * 32  # Qwen2's q, k and v have biases
    assert bounds().decode_bytes(layer, 5, config=config) == (weights + biases) * 4 + 2 * 1 * 2 * 16 * 5 * 4
