"""Hugging Face transformers' decoder layers as compiled arke layers.

:func:`from_transformers` reads a ``LlamaDecoderLayer``, ``Qwen2DecoderLayer``,
``MistralDecoderLayer`` or ``MixtralDecoderLayer`` (its weights and its config);
:func:`layer_from_pretrained` reads one layer of a model folder (``config.json`` and
``*.safetensors``) with the ``safetensors`` library, without building the model. Rotary
frequencies come from transformers' own rotary embedding for the config, so every rope type
it knows (default, llama3, linear, dynamic at its base length, yarn ...) is reproduced.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from arke.models.config import LayerConfig
from arke.models.layer import CompiledLayer

#: model_type -> the transformers class prefix of its modules.
SUPPORTED = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral", "mixtral": "Mixtral"}


def _transformers() -> Any:
    try:
        return importlib.import_module("transformers")
    except ImportError:
        raise ImportError("arke.models needs transformers (and safetensors): pip install 'arke[models]'") from None


def _model_type(config: Any) -> str:
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED:
        also = " (GPT-2 and DeepSeek-V2 models load whole, with arke.models.from_pretrained)" \
            if kind in ("gpt2", "deepseek_v2") else ""
        raise ValueError(f"unsupported model type {kind!r} for a decoder layer of its own; the layers are those of "
                         f"{', '.join(SUPPORTED)}{also}")
    return str(kind)


def positive(config: Any, key: str) -> int:
    """``config.<key>``, which must be a positive integer: a ValueError naming it otherwise."""
    value = getattr(config, key, None)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"config.json: {key} must be a positive integer, not {value!r}")
    return value


def _rotary(config: Any) -> tuple[tuple[float, ...], float]:
    """The inverse frequencies and attention scaling transformers' rotary embedding uses for ``config``."""
    kind = _model_type(config)
    module = importlib.import_module(f"transformers.models.{kind}.modeling_{kind}")
    try:
        rotary = getattr(module, f"{SUPPORTED[kind]}RotaryEmbedding")(config)
    except KeyError as err:  # transformers' table of rope types, by name
        scaling = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}
        kind_of = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
        raise ValueError(f"config.json's rope scaling type {kind_of or err.args[0]!r} is not one transformers "
                         "knows (default, linear, dynamic, yarn, longrope, llama3)") from None
    inv = rotary.inv_freq.detach().to(torch.float32).cpu()
    return tuple(float(f) for f in inv), float(getattr(rotary, "attention_scaling", 1.0))


def check_rope_reach(config: Any, max_seq: int) -> None:
    """Refuse a ``max_seq`` past the length where transformers changes the rotary frequencies during a run
    (``dynamic``: rescaled past ``max_position_embeddings``; ``longrope``: its long factors past
    ``original_max_position_embeddings``): the layers use one set of frequencies, fixed at load."""
    scaling = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}
    kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
    if kind == "dynamic":
        field = "max_position_embeddings"
        limit = getattr(config, field, None)
    elif kind == "longrope":
        field = "original_max_position_embeddings"
        limit = scaling.get(field) or getattr(config, field, None)
    else:
        return
    if isinstance(limit, int) and max_seq > limit:
        raise ValueError(f"config.json's rope type {kind!r} changes its frequencies past {limit} tokens ({field}), "
                         f"which arke.models does not follow: load the model with max_seq={limit} or less")


def layer_config(config: Any, layer_index: int = 0) -> LayerConfig:
    """The :class:`LayerConfig` of layer ``layer_index`` of a transformers config."""
    kind = _model_type(config)
    act = getattr(config, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"unsupported MLP activation {act!r}: the decoder layers are SwiGLU (silu)")
    for key in ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers"):
        positive(config, key)
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    if kv < 1 or heads % kv:
        raise ValueError(f"config.json: num_key_value_heads {kv} must be positive and divide num_attention_heads "
                         f"{heads}")
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    if head_dim < 1 or head_dim % 2:
        raise ValueError(f"config.json: the head size {head_dim} must be a positive even number (rotary pairs)")
    window = None
    if kind in ("mistral", "mixtral"):
        window = getattr(config, "sliding_window", None)
    elif kind == "qwen2":
        types = getattr(config, "layer_types", None)
        if types is not None and types[layer_index] == "sliding_attention":
            window = getattr(config, "sliding_window", None)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"config.json: sliding_window must be a positive number of tokens or null, not {window!r}")
    eps = float(config.rms_norm_eps)
    if not math.isfinite(eps) or eps < 0:  # a negative epsilon makes the norm's rsqrt NaN for small rows
        raise ValueError(f"config.json: rms_norm_eps must be a finite number at least 0, not {config.rms_norm_eps!r}")
    inv_freq, scale = _rotary(config)
    if not all(math.isfinite(f) for f in inv_freq):  # rope_theta 0 or negative: every rotation NaN
        given = getattr(config, "rope_parameters", None)
        theta = given.get("rope_theta") if isinstance(given, dict) else getattr(config, "rope_theta", None)
        raise ValueError(f"config.json: the rotary frequencies are not finite (rope_theta must be a positive number, "
                         f"not {theta!r})")
    experts = int(getattr(config, "num_local_experts", 0) or 0) if kind == "mixtral" else 0
    top_k = getattr(config, "num_experts_per_tok", 2)
    if experts and (isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= experts):
        raise ValueError(f"config.json: num_experts_per_tok must be a whole number from 1 to num_local_experts "
                         f"({experts}), not {top_k!r}")
    return LayerConfig(hidden=int(config.hidden_size), heads=heads, kv_heads=kv, head_dim=head_dim,
                       intermediate=int(config.intermediate_size), eps=eps,
                       inv_freq=inv_freq, rope_scale=scale, window=int(window) if window else None,
                       experts=experts, top_k=top_k if experts else 2)


def _linear(module: Any, into: dict[str, torch.Tensor], name: str) -> None:
    into[name] = module.weight
    if getattr(module, "bias", None) is not None:
        into[name + "_bias"] = module.bias


def _layer_weights(layer: Any, config: LayerConfig) -> dict[str, torch.Tensor]:
    attn = layer.self_attn
    raw: dict[str, torch.Tensor] = {"input_norm": layer.input_layernorm.weight,
                                    "post_norm": layer.post_attention_layernorm.weight}
    for part in ("q", "k", "v", "o"):
        _linear(getattr(attn, f"{part}_proj"), raw, part)
    if "o_bias" in raw:
        raise ValueError("an output projection with a bias is not supported")
    if config.experts:
        moe = getattr(layer, "block_sparse_moe", None) or layer.mlp
        raw["router"] = moe.gate.weight
        experts = moe.experts
        if hasattr(experts, "gate_up_proj"):  # transformers 5: experts as 3-d tensors
            raw["experts_gate_up"], raw["experts_down"] = experts.gate_up_proj, experts.down_proj
        else:  # transformers 4: one module per expert (w1 gate, w3 up, w2 down)
            raw["experts_gate_up"] = torch.stack([torch.cat([e.w1.weight, e.w3.weight]) for e in experts])
            raw["experts_down"] = torch.stack([e.w2.weight for e in experts])
    else:
        for part in ("gate", "up", "down"):
            proj = getattr(layer.mlp, f"{part}_proj")
            if getattr(proj, "bias", None) is not None:
                raise ValueError("an MLP with biases (mlp_bias in the config) is not supported")
            raw[part] = proj.weight
    return raw


def from_transformers(layer: Any, config: Any, target: str = "llvm", max_seq: int = 4096,
                      weights: str = "f32", threads: int | None = None,
                      dtype: torch.dtype = torch.float32, plan: Any = None, tuning: str = "on") -> CompiledLayer:
    """Compile a transformers decoder layer (Llama, Qwen2, Mistral, Mixtral) for ``target``.

    ``weights``: ``"f32"``, ``"bf16"``, ``"f16"`` or ``"int8"`` (weight-only, one scale per output channel).
    ``dtype``: the activations' dtype. ``torch.bfloat16`` or ``torch.float16`` gives a
    :class:`~arke.models.layer_half.HalfLayer` (dense layers): activations, KV cache and weights
    all in that dtype, rounded where transformers rounds running the layer in it (``weights``
    must then be left as it is or name the same dtype).
    ``plan``: a whole-layer plan (``.ak`` strategy blocks, a file of them, or strategies) that the
    layer's kernels run by; without one, the plan :func:`arke.models.tune` confirmed for such a layer
    on this machine is used, unless ``tuning="off"``.
    The layer's own module is only read. Returns a :class:`~arke.models.layer.CompiledLayer`::

        cache = compiled.new_cache(batch=1)
        y = compiled(x, positions, cache)   # x: [B, T, D]; positions: int64 [B, T]
    """
    kind = _model_type(config)
    cls = type(layer).__name__
    if not cls.endswith("DecoderLayer"):
        raise ValueError(f"expected a transformers decoder layer, not {cls}")
    index = int(getattr(layer.self_attn, "layer_idx", 0) or 0)
    check_rope_reach(config, max_seq)
    spec = layer_config(config, index)
    scaling = getattr(layer.self_attn, "scaling", spec.head_dim ** -0.5)
    if abs(float(scaling) - spec.head_dim ** -0.5) > 1e-12:
        raise ValueError(f"attention scaling {scaling} is not 1/sqrt(head_dim): unsupported")
    with torch.no_grad():
        raw = {k: v.detach() for k, v in _layer_weights(layer, spec).items()}
    return _compiled(spec, raw, target, max_seq, weights, threads, dtype, f"{SUPPORTED[kind]}DecoderLayer", plan,
                     tuning)


def _compiled(spec: LayerConfig, raw: dict[str, torch.Tensor], target: str, max_seq: int, weights: str,
              threads: int | None, dtype: torch.dtype, name: str, plan: Any = None,
              tuning: str = "on") -> CompiledLayer:
    """The compiled layer for these activations: f32 (any weight kind) or half (weights of that dtype)."""
    if dtype == torch.float32:
        return CompiledLayer(spec, raw, target=target, max_seq=max_seq, weights_dtype=weights, name=name,
                             threads=threads, plan=plan, tuning=tuning)
    from arke.models.layer_half import HALF, HalfLayer

    if dtype not in HALF:
        raise ValueError(f"dtype must be torch.float32, torch.bfloat16 or torch.float16, not {dtype}")
    if weights not in ("f32", HALF[dtype]):
        raise ValueError(f"{HALF[dtype]} activations read {HALF[dtype]} weights, not {weights!r}: leave weights "
                         f"unset (or use dtype=torch.float32 for {weights} weights with f32 activations)")
    return HalfLayer(spec, raw, dtype=dtype, target=target, max_seq=max_seq, name=name, threads=threads, plan=plan,
                     tuning=tuning)


# ---------------------------------------------------------------- model folders


def _tensors(folder: Path, prefix: str) -> dict[str, torch.Tensor]:
    """Every tensor whose name starts with ``prefix``, from the folder's safetensors files."""
    try:
        from safetensors import safe_open
    except ImportError:
        raise ImportError("from_pretrained needs safetensors: pip install 'arke[models]'") from None
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            mapping = json.loads(index.read_text())["weight_map"]
            files = sorted({folder / f for name, f in mapping.items() if name.startswith(prefix)})
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{index} is not a shard index (a JSON object with a `weight_map` of tensor names to "
                             f"files: {type(err).__name__}: {err}); save or download the model again") from None
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickled = sorted(p.name for p in folder.glob("pytorch_model*.bin"))
        if pickled and not index.exists():
            raise ValueError(f"{folder} holds a PyTorch checkpoint ({pickled[0]}), and arke reads safetensors files "
                             "only (a .bin file is a pickle, which can run code when loaded): save the model with "
                             "`model.save_pretrained(folder, safe_serialization=True)`")
        raise FileNotFoundError(f"no safetensors file in {folder} holds {prefix!r}")
    missing = [f for f in files if not f.exists()]
    if missing:
        raise FileNotFoundError(f"{folder}: the index names {missing[0].name}, which is not there")
    out: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                    if name.startswith(prefix):
                        # an owned copy: a tensor kept from the mapped file would keep every page of it that
                        # packing touched resident for as long as the model lives
                        out[name[len(prefix):]] = f.get_tensor(name).clone()
        except Exception as err:  # safetensors' own errors (a cut or corrupted file) name no file
            detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ValueError(f"{path} is not a readable safetensors file ({detail}): save or download the model "
                             "again") from None
    return out


#: Where a checkpoint keeps its layers: a causal-LM model (``model.layers.N``), a base model
#: (``layers.N``), a multimodal model's language part.
PREFIXES = ("model.layers.{}.", "layers.{}.", "model.language_model.layers.{}.", "language_model.model.layers.{}.")


def _layer_tensors(folder: Path, layer_index: int) -> dict[str, torch.Tensor]:
    """Layer ``layer_index``'s tensors, by name within the layer, under whichever prefix the checkpoint uses."""
    for prefix in PREFIXES:
        try:
            found = _tensors(folder, prefix.format(layer_index))
        except FileNotFoundError:
            continue
        if found:
            return found
    shown = ", ".join(p.format(layer_index) for p in PREFIXES)
    raise FileNotFoundError(f"no safetensors file in {folder} holds tensors of layer {layer_index} "
                            f"(looked for {shown})")


def read_config(folder: str | os.PathLike[str]) -> Any:
    """A model folder's transformers config (its text part for a multimodal model); the folder must have
    ``config.json`` (whether its ``model_type`` is supported is the caller's question)."""
    transformers = _transformers()
    path = Path(folder)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} has no config.json")
    try:
        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as err:  # transformers' validators raise their own kinds (StrictDataclassClassValidationError)
        raise ValueError(f"{path / 'config.json'} is not a config transformers accepts: "
                         f"{str(err).strip() or type(err).__name__}") from None
    return getattr(config, "text_config", None) or config


def layer_weights(path: Path, config: Any, layer_index: int) -> tuple[LayerConfig, dict[str, torch.Tensor]]:
    """Layer ``layer_index`` of the folder ``path``: its :class:`LayerConfig` and raw weights, by the names
    :class:`CompiledLayer` reads."""
    if not 0 <= layer_index < int(config.num_hidden_layers):
        raise ValueError(f"layer {layer_index} does not exist: the model has {config.num_hidden_layers} layers")
    spec = layer_config(config, layer_index)
    t = _layer_tensors(path, layer_index)
    raw: dict[str, torch.Tensor] = {}
    names = {"input_norm": "input_layernorm.weight", "post_norm": "post_attention_layernorm.weight"}
    # Qwen2 always has q, k and v biases, Llama-like models where config.json says `attention_bias`: one missing
    # from the checkpoint is an error, as a weight is (a bias taken as zero would change every result)
    biased = getattr(config, "model_type", "") == "qwen2" or bool(getattr(config, "attention_bias", False))
    for part in ("q", "k", "v", "o"):
        names[part] = f"self_attn.{part}_proj.weight"
        if f"self_attn.{part}_proj.bias" in t or (biased and part != "o"):
            names[part + "_bias"] = f"self_attn.{part}_proj.bias"
    if spec.experts:
        moe = "block_sparse_moe" if "block_sparse_moe.gate.weight" in t else "mlp"
        names["router"] = f"{moe}.gate.weight"
        if f"{moe}.experts.gate_up_proj" in t:
            names["experts_gate_up"], names["experts_down"] = (f"{moe}.experts.gate_up_proj",
                                                               f"{moe}.experts.down_proj")
        else:
            e = range(spec.experts)
            each = [f"{moe}.experts.{x}.{w}.weight" for x in e for w in ("w1", "w2", "w3")]
            lacking = [n for n in each if n not in t]
            if lacking:
                raise ValueError(f"layer {layer_index} of {path} lacks {', '.join(lacking)}")
            raw["experts_gate_up"] = torch.stack([torch.cat([t[f"{moe}.experts.{x}.w1.weight"],
                                                             t[f"{moe}.experts.{x}.w3.weight"]]) for x in e])
            raw["experts_down"] = torch.stack([t[f"{moe}.experts.{x}.w2.weight"] for x in e])
    else:
        for part in ("gate", "up", "down"):
            names[part] = f"mlp.{part}_proj.weight"
    missing = [v for v in names.values() if v not in t]
    if missing:
        raise ValueError(f"layer {layer_index} of {path} lacks {', '.join(missing)}")
    if "o_bias" in names:
        raise ValueError(f"layer {layer_index} of {path}: an output projection with a bias (self_attn.o_proj.bias, "
                         "attention_bias in config.json) is not supported")
    used = set(names.values()) | {n for n in t if ".experts." in n and spec.experts}
    unread = sorted(n for n in t if n not in used and not n.endswith("rotary_emb.inv_freq"))
    if unread:  # a weight of a variant the layer does not compute (mlp_bias ...): never dropped silently
        raise ValueError(f"layer {layer_index} of {path} has tensors this architecture's layer does not use: "
                         f"{', '.join(unread[:6])}{' ...' if len(unread) > 6 else ''}; this variant of "
                         f"{getattr(config, 'model_type', 'the model')} is not supported")
    raw.update({k: t[v] for k, v in names.items()})
    return spec, raw


def compiled_layer(config: Any, spec: LayerConfig, raw: dict[str, torch.Tensor], target: str = "llvm",
                   max_seq: int = 4096, weights: str = "f32", threads: int | None = None,
                   dtype: torch.dtype = torch.float32, plan: Any = None, tuning: str = "on") -> CompiledLayer:
    """The compiled layer of ``config``'s architecture for ``spec`` and its raw weights."""
    return _compiled(spec, raw, target, max_seq, weights, threads, dtype,
                     f"{SUPPORTED[_model_type(config)]}DecoderLayer", plan, tuning)


def layer_from_pretrained(folder: str | os.PathLike[str], layer_index: int = 0, target: str = "llvm",
                          max_seq: int = 4096, weights: str = "f32", threads: int | None = None,
                          dtype: torch.dtype = torch.float32, plan: Any = None, tuning: str = "on") -> CompiledLayer:
    """Compile layer ``layer_index`` of a Hugging Face model folder (``config.json`` + ``*.safetensors``).

    ``weights`` and ``dtype`` as for :func:`from_transformers`.
    Only that layer's tensors are read (through the index file when there is one); nothing is
    downloaded. Checkpoint names of both transformers 4 (``block_sparse_moe.experts.N.w1``) and
    5 (``mlp.experts.gate_up_proj``) are understood. :func:`arke.models.from_pretrained` loads the
    whole model.
    """
    config = read_config(folder)
    check_rope_reach(config, max_seq)
    spec, raw = layer_weights(Path(folder), config, layer_index)
    return compiled_layer(config, spec, raw, target, max_seq, weights, threads, dtype, plan, tuning)
