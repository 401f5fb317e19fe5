"""What a transformers causal LM's forward pass must do at least, for the benchmarks' "÷ the machine's limit"
lines: its floating-point operations (against the FMA or matrix-unit peak) and the weight bytes a decode step
reads (against the read bandwidth).

Counted from the model's own modules, so any architecture's count is its own:

* every ``nn.Linear`` (and GPT-2's ``Conv1D``) multiplies each token it sees by its weight: 2 · in · out
  flops per token; the LM head sees ``head_tokens`` of them (the last one where generation asks for
  ``logits_to_keep=1``, all of them where a graph returns every position's logits);
* causal attention: QKᵀ and PV over the keys each query sees, 2 · 2 · heads · head_dim per (query, key);
* a decode step reads every linear's weight and bias once (embeddings: one row, not counted) plus the
  KV cache.
"""

from __future__ import annotations

from typing import Any

import torch


def _linears(model: Any) -> list[tuple[str, int, int, int]]:
    """(name, in, out, bias elements) of each matrix-multiplying module."""
    found = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            found.append((name, mod.in_features, mod.out_features, 0 if mod.bias is None else mod.bias.numel()))
        elif type(mod).__name__ == "Conv1D" and hasattr(mod, "nf"):  # GPT-2: weight [in, out]
            k, n = mod.weight.shape
            found.append((name, int(k), int(n), 0 if mod.bias is None else mod.bias.numel()))
    return found


def _attention(config: Any) -> tuple[int, int, int]:
    """(layers, query heads, head size) of a transformers config."""
    layers = getattr(config, "num_hidden_layers", None) or config.n_layer
    heads = getattr(config, "num_attention_heads", None) or config.n_head
    hidden = getattr(config, "hidden_size", None) or config.n_embd
    return int(layers), int(heads), int(getattr(config, "head_dim", None) or hidden // heads)


def forward_flops(model: Any, tokens: int, head_tokens: int, context: int = 0) -> float:
    """Flops of one forward pass over ``tokens`` new tokens after ``context`` cached ones (causal), the LM head
    on ``head_tokens`` of them."""
    total = 0.0
    for name, k, n, _ in _linears(model):
        total += 2.0 * k * n * (head_tokens if name.endswith("lm_head") else tokens)
    layers, heads, size = _attention(model.config)
    keys = sum(context + t + 1 for t in range(tokens))  # the (query, key) pairs a causal mask lets through
    return total + layers * 2 * 2 * heads * size * keys


def decode_bytes(model: Any, context: int, dtype_bytes: int = 4, config: Any = None) -> float:
    """Bytes one decode step reads at least: every linear's weight and bias, and the KV cache at ``context``.
    ``model`` may be one decoder layer, with its model's ``config`` given (then a config of one layer)."""
    weights = sum(k * n + b for _, k, n, b in _linears(model)) * dtype_bytes
    config = config if config is not None else model.config
    layers, heads, size = _attention(config)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    return weights + 2 * layers * kv_heads * size * context * dtype_bytes
