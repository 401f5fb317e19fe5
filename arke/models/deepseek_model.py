"""A DeepSeek-V2 causal LM from a Hugging Face folder: the embeddings, every
:class:`~arke.models.deepseek.DeepseekLayer` (dense for the first ``first_k_dense_replace``, then shared
plus routed experts), the final RMSNorm and the head (:class:`~arke.models.lm.CausalLM`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from arke.models.deepseek import DeepseekLayer, MlaConfig
from arke.models.hf import positive
from arke.models.lm import CausalLM


def mla_config(config: Any, layer_index: int) -> MlaConfig:
    """The :class:`MlaConfig` of layer ``layer_index`` of a transformers ``DeepseekV2Config``."""
    from transformers.modeling_rope_utils import yarn_apply_mscale
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2RotaryEmbedding

    if getattr(config, "hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(f"unsupported MLP activation {config.hidden_act!r}: DeepSeek-V2's experts are SwiGLU")
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        raise ValueError("DeepSeek-V2 with projection biases (attention_bias, mlp_bias) is not supported")
    method = getattr(config, "topk_method", "greedy")
    if method not in ("greedy", "group_limited_greedy"):
        raise ValueError(f"unsupported expert selection {method!r} (greedy and group_limited_greedy are)")
    rotary = DeepseekV2RotaryEmbedding(config)
    inv = tuple(float(f) for f in rotary.inv_freq.detach().float())
    nope, rope = int(config.qk_nope_head_dim), int(config.qk_rope_head_dim)
    if len(inv) * 2 != rope:
        raise ValueError(f"the rotary embedding has {len(inv)} frequencies, but qk_rope_head_dim is {rope}")
    dense = layer_index < int(getattr(config, "first_k_dense_replace", 0) or 0) or not config.n_routed_experts
    common: dict[str, Any] = dict(
        hidden=int(config.hidden_size), heads=int(config.num_attention_heads), q_lora=int(config.q_lora_rank or 0),
        kv_lora=int(config.kv_lora_rank), nope=nope, rope=rope, v_dim=int(config.v_head_dim),
        eps=float(config.rms_norm_eps), inv_freq=inv, rope_scale=float(getattr(rotary, "attention_scaling", 1.0)),
        softmax_scale=float(yarn_apply_mscale(config.rope_parameters, (nope + rope) ** -0.5)))
    if dense:
        return MlaConfig(intermediate=int(config.intermediate_size), **common)
    experts, groups = int(config.n_routed_experts), int(getattr(config, "n_group", None) or 1)
    if experts % groups:
        raise ValueError(f"{experts} experts do not split into {groups} groups (n_group)")
    top_k, top_groups = config.num_experts_per_tok, getattr(config, "topk_group", None) or 1
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= experts:
        raise ValueError(f"config.json: num_experts_per_tok must be a whole number from 1 to n_routed_experts "
                         f"({experts}), not {top_k!r}")
    if method == "group_limited_greedy" and (not isinstance(top_groups, int) or not 1 <= top_groups <= groups
                                             or top_k > top_groups * (experts // groups)):
        raise ValueError(f"config.json: topk_group must be from 1 to n_group ({groups}), and its groups must hold "
                         f"num_experts_per_tok ({top_k}) experts, not {top_groups!r}")
    if not config.n_shared_experts:
        raise ValueError("config.json: n_shared_experts 0 (no shared expert) is not supported: DeepSeek-V2's "
                         "MoE layers add a shared expert's output to the routed ones")
    return MlaConfig(intermediate=int(config.moe_intermediate_size), experts=experts,
                     shared=int(config.moe_intermediate_size) * int(config.n_shared_experts),
                     top_k=top_k, routed_scale=float(config.routed_scaling_factor),
                     topk_method=method, groups=groups, topk_groups=int(getattr(config, "topk_group", None) or 1),
                     **common)


def mla_weights(path: Path, config: Any, layer_index: int) -> tuple[MlaConfig, dict[str, torch.Tensor]]:
    """Layer ``layer_index``'s config and raw weights, by the names :class:`DeepseekLayer` reads."""
    from arke.models.hf import _layer_tensors

    spec = mla_config(config, layer_index)
    t = _layer_tensors(path, layer_index)
    a = "self_attn."
    names = {"input_norm": "input_layernorm.weight", "post_norm": "post_attention_layernorm.weight",
             "kv_a": a + "kv_a_proj_with_mqa.weight", "kv_norm": a + "kv_a_layernorm.weight",
             "kv_b": a + "kv_b_proj.weight", "o": a + "o_proj.weight"}
    names |= ({"q_a": a + "q_a_proj.weight", "q_norm": a + "q_a_layernorm.weight", "q_b": a + "q_b_proj.weight"}
              if spec.q_lora else {"q": a + "q_proj.weight"})
    raw: dict[str, torch.Tensor] = {}
    if spec.experts:
        names["router"] = "mlp.gate.weight"
        names |= {f"shared_{k}": f"mlp.shared_experts.{k}_proj.weight" for k in ("gate", "up", "down")}
        if "mlp.experts.gate_up_proj" in t:
            names["experts_gate_up"], names["experts_down"] = "mlp.experts.gate_up_proj", "mlp.experts.down_proj"
        else:  # one module per expert (the original checkpoints)
            each = [f"mlp.experts.{x}.{k}_proj.weight" for x in range(spec.experts) for k in ("gate", "up", "down")]
            lacking = [n for n in each if n not in t]
            if lacking:
                raise ValueError(f"layer {layer_index} of {path} lacks {', '.join(lacking[:3])}")
            raw["experts_gate_up"] = torch.stack([torch.cat([t[f"mlp.experts.{x}.gate_proj.weight"],
                                                             t[f"mlp.experts.{x}.up_proj.weight"]])
                                                  for x in range(spec.experts)])
            raw["experts_down"] = torch.stack([t[f"mlp.experts.{x}.down_proj.weight"] for x in range(spec.experts)])
    else:
        names |= {k: f"mlp.{k}_proj.weight" for k in ("gate", "up", "down")}
    missing = [v for v in names.values() if v not in t]
    if missing:
        raise ValueError(f"layer {layer_index} of {path} lacks {', '.join(missing)}")
    raw.update({k: t[v] for k, v in names.items()})
    return spec, raw


def deepseek_from_pretrained(path: Path, config: Any, target: str, dtype: torch.dtype, max_seq: int, weights: str,
                             threads: int | None, tuning: str, layers: int | None) -> CausalLM:
    """See :func:`arke.models.from_pretrained`."""
    from arke.models.pretrained import _MODEL_PREFIXES, _find

    if dtype != torch.float32:
        raise ValueError("DeepSeek-V2 runs with f32 activations (weights may be bf16: weights='bf16')")
    total = positive(config, "num_hidden_layers")  # config.json's own count: said as such when it is not one
    count = total if layers is None else layers
    if not isinstance(count, int) or not 1 <= count <= total:
        raise ValueError(f"layers must be between 1 and {total} (the model's layers), not {layers!r}")
    embed = _find(path, tuple(p + "embed_tokens.weight" for p in _MODEL_PREFIXES), "token embeddings")
    norm = _find(path, tuple(p + "norm.weight" for p in _MODEL_PREFIXES), "final norm")
    tied = bool(getattr(config, "tie_word_embeddings", False))
    head = None if tied else _find(path, ("lm_head.weight",), "LM head")
    vocab, hidden = int(config.vocab_size), int(config.hidden_size)
    if embed.dim() != 2 or tuple(embed.shape) != (vocab, hidden):
        raise ValueError(f"{path}: the token embeddings are {list(embed.shape)}, but config.json says vocabulary "
                         f"{vocab} and hidden size {hidden}")
    built = []
    for index in range(count):
        spec, raw = mla_weights(path, config, index)
        built.append(DeepseekLayer(spec, raw, target=target, max_seq=max_seq, weights_dtype=weights,
                                   threads=threads, tuning=tuning))
    return CausalLM("DeepseekV2ForCausalLM", built, embed, norm, head, float(config.rms_norm_eps), threads=threads,
                    tuning=tuning)
