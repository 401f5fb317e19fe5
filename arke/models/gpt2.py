"""GPT-2's decoder layer, compiled: ``std.gpt2``'s kernels behind :class:`~arke.models.layer.CompiledLayer`'s
surface (the same KV caches, memory plans, paged running batches and checks).

A GPT-2 block is LayerNorm (with bias) → fused QKV projection with bias → multi-head causal attention
(``std.decoder.attn_cached`` / ``attn_paged`` with one KV head per query head; no rotary embedding: the
positions are learned and added to the embeddings by the model) → output projection with bias and the
residual → LayerNorm → fc with bias → GELU (tanh form) → projection with bias and the residual. Its
Conv1D weights are stored ``[in, out]``; they are transposed once here, then fused and packed like any
other layer's.
"""

from __future__ import annotations

from typing import Any

import torch

from arke.models.config import LayerConfig, check_weights
from arke.models.layer import KERNELS, LAYER_SOURCE, CompiledLayer, Step

#: a checkpoint's names of a block's tensors (after ``h.<i>.``) -> this layer's
NAMES = {"ln_1.weight": "wn1", "ln_1.bias": "bn1", "attn.c_attn.weight": "qkv", "attn.c_attn.bias": "bqkv",
         "attn.c_proj.weight": "o", "attn.c_proj.bias": "bo", "ln_2.weight": "wn2", "ln_2.bias": "bn2",
         "mlp.c_fc.weight": "fc", "mlp.c_fc.bias": "bfc", "mlp.c_proj.weight": "proj", "mlp.c_proj.bias": "bproj"}


def gpt2_config(config: Any) -> LayerConfig:
    """The :class:`LayerConfig` of a transformers ``GPT2Config`` (multi-head: one KV head per head)."""
    act = getattr(config, "activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"unsupported GPT-2 activation {act!r}: the layer's MLP is GELU in its tanh form")
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if getattr(config, flag, False):
            raise ValueError(f"GPT-2's {flag} is not supported (the attention scale is 1/sqrt(head_dim))")
    if not getattr(config, "scale_attn_weights", True):
        raise ValueError("GPT-2 without scale_attn_weights is not supported (the attention scale is 1/sqrt(head_dim))")
    d, h = int(config.n_embd), int(config.n_head)
    if d % h:
        raise ValueError(f"hidden size {d} is not a multiple of the {h} heads")
    e = d // h
    inner = int(getattr(config, "n_inner", None) or 4 * d)
    # no rotary embedding: no frequencies
    return LayerConfig(hidden=d, heads=h, kv_heads=h, head_dim=e, intermediate=inner,
                       eps=float(config.layer_norm_epsilon), inv_freq=())


class Gpt2Layer(CompiledLayer):
    """A GPT-2 block compiled for one target: ``y = layer(x, positions, cache)`` as for
    :class:`CompiledLayer` (``positions`` only place the tokens in the cache)."""

    source = LAYER_SOURCE + "import std.gpt2\n"

    def __init__(self, config: LayerConfig, weights: dict[str, torch.Tensor], **options: Any):
        if options.get("weights_dtype", "f32") == "int8":
            raise ValueError("GPT-2 layers take f32, bf16 or f16 weights (int8 is for the Llama-family layers)")
        options.setdefault("name", "GPT2Block")
        super().__init__(config, weights, **options)

    def _bind(self, call: Any) -> None:
        _, dtypes = KERNELS[self.kind]
        self._attn_in = call("ln_qkv", **dtypes)
        self._attn = call("attn_cached")
        self._paged = call("attn_paged")
        self._attn_out = call("out_bias", **dtypes)
        self._mlp = call("ln_gelu_mlp", **dtypes)

    def _pack(self, raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Transposed (Conv1D stores ``[in, out]``), converted and packed weights; the QKV bias split by part."""
        c = self.config
        d, f, h, e = c.hidden, c.intermediate, c.heads, c.head_dim
        want = {"wn1": (d,), "bn1": (d,), "qkv": (d, 3 * d), "bqkv": (3 * d,), "o": (d, d), "bo": (d,),
                "wn2": (d,), "bn2": (d,), "fc": (d, f), "bfc": (f,), "proj": (f, d), "bproj": (d,)}
        check_weights(self.name, raw, want, f"hidden {d}, MLP {f}, {h} heads of {e}")
        dev, f32 = self.device, torch.float32
        out: dict[str, torch.Tensor] = {k: raw[k].detach().to(dev, f32).contiguous()
                                        for k in ("wn1", "bn1", "wn2", "bn2", "bo", "bfc", "bproj")}
        for part, bias in zip(("q", "k", "v"), raw["bqkv"].detach().to(f32).split(d)):
            out["b" + part] = bias.reshape(h, e).to(dev).contiguous()
        for name in ("qkv", "o", "fc", "proj"):
            self._weight(raw[name].detach().float().t().contiguous(), out, name)
        return out

    def _run(self, x: torch.Tensor, positions: torch.Tensor, cache: Any, b: int, t: int) -> torch.Tensor:
        c, w = self.config, self.weights
        n, v, temps, xf = self._inputs(x, b, t)
        self._attn_in([xf, w["wn1"], w["bn1"], w["qkv"], w["bq"], w["bk"], w["bv"]], {"eps": c.eps},
                      (v["q"], v["k"], v["v"]), temps.get("attn_in"))
        start = self._attend(v, temps, cache, b, t)
        self._attn_out([v["o"].view(n, c.heads * c.head_dim), w["o"], w["bo"], xf], {}, v["h"],
                       temps.get("attn_out"))
        y = torch.empty(n, c.hidden, dtype=torch.float32, device=self.device)
        self._mlp([v["h"], w["wn2"], w["bn2"], w["fc"], w["bfc"], w["proj"], w["bproj"]], {"eps": c.eps}, y,
                  temps.get("mlp"))
        cache.length = start + t
        return y.view(b, t, c.hidden).to(x.dtype)

    def _steps(self, b: int, t: int) -> list[Step]:
        c, w, n, probe = self.config, self.weights, b * t, self._probe
        xf = probe(n, c.hidden)
        q, kc = probe(b, t, c.heads, c.head_dim), probe(b, c.kv_heads, self.max_seq, c.head_dim)
        return [("attn_in", self._attn_in, [xf, w["wn1"], w["bn1"], w["qkv"], w["bq"], w["bk"], w["bv"]], {}),
                ("append", None, [], {}),
                ("attn", self._attn, [q, kc, kc], {"n": t}),
                ("attn_out", self._attn_out, [probe(n, c.heads * c.head_dim), w["o"], w["bo"], xf], {}),
                ("mlp", self._mlp, [xf, w["wn2"], w["bn2"], w["fc"], w["bfc"], w["proj"], w["bproj"]], {})]
