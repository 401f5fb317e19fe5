"""A Hugging Face model folder as a compiled :class:`~arke.models.lm.CausalLM`, without building the
transformers model: ``config.json`` gives the architecture, the (sharded) ``*.safetensors`` the weights,
read tensor by tensor with the ``safetensors`` library."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from arke.models.hf import (
    SUPPORTED,
    _model_type,
    _tensors,
    check_rope_reach,
    compiled_layer,
    layer_weights,
    positive,
    read_config,
)
from arke.models.lm import CausalLM

#: Where a checkpoint keeps the model's own tensors (a causal LM's ``model.``, a base model's none).
_MODEL_PREFIXES = ("model.", "", "model.language_model.", "language_model.model.")


def _find(path: Path, names: tuple[str, ...], what: str) -> torch.Tensor:
    """The first of ``names`` the folder's safetensors hold."""
    for name in names:
        try:
            found = _tensors(path, name)
        except FileNotFoundError as err:
            if "index names" in str(err):  # a shard the index lists is missing: say so
                raise
            continue
        if "" in found:
            return found[""]
    raise FileNotFoundError(f"no safetensors file in {path} holds the {what} (looked for {', '.join(names)})")


def from_pretrained(folder: str | os.PathLike[str], target: str = "llvm", dtype: torch.dtype = torch.float32,
                    max_seq: int = 4096, weights: str = "f32", threads: int | None = None, tuning: str = "on",
                    layers: int | None = None) -> CausalLM:
    """The causal LM in a Hugging Face model folder (Llama, Qwen2, Mistral, Mixtral, GPT-2, DeepSeek-V2), compiled
    for ``target``.

    ``dtype``: the activations (f32, or bf16/f16 with weights of that dtype); ``weights``: the layers'
    weight kind with f32 activations (``f32``, ``bf16``, ``f16``, ``int8``); ``max_seq``: the tokens each
    sequence's KV cache holds; ``layers``: only the first N layers (a quick check of a large model).
    Weights are fused and packed once; nothing is downloaded.
    """
    if isinstance(max_seq, bool) or not isinstance(max_seq, int) or max_seq < 1:
        raise ValueError(f"max_seq must be a positive integer (the tokens each sequence's cache holds), not "
                         f"{max_seq!r}")
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int)):
        raise ValueError(f"layers must be a whole number of layers (or None: all), not {layers!r}")
    path = Path(folder)
    config = read_config(path)
    check_rope_reach(config, max_seq)
    kind = getattr(config, "model_type", None)
    if kind == "gpt2":
        from arke.models.gpt2_model import gpt2_from_pretrained

        gpt2 = gpt2_from_pretrained(path, config, target, dtype, max_seq, weights, threads, tuning, layers)
        release_freed_memory()
        return gpt2
    if kind == "deepseek_v2":
        from arke.models.deepseek_model import deepseek_from_pretrained

        deepseek = deepseek_from_pretrained(path, config, target, dtype, max_seq, weights, threads, tuning, layers)
        release_freed_memory()
        return deepseek
    if kind not in SUPPORTED:
        raise ValueError(f"unsupported model type {kind!r}; arke.models knows "
                         f"{', '.join([*SUPPORTED, 'gpt2', 'deepseek_v2'])}")
    kind = _model_type(config)
    total = positive(config, "num_hidden_layers")  # config.json's own count: said as such when it is not one
    count = total if layers is None else layers
    if not isinstance(count, int) or not 1 <= count <= total:
        raise ValueError(f"layers must be between 1 and {total} (the model's layers), not {layers!r}")
    vocab, hidden = positive(config, "vocab_size"), positive(config, "hidden_size")
    embed = _find(path, tuple(p + "embed_tokens.weight" for p in _MODEL_PREFIXES), "token embeddings")
    norm = _find(path, tuple(p + "norm.weight" for p in _MODEL_PREFIXES), "final norm")
    tied = bool(getattr(config, "tie_word_embeddings", False))
    head = None if tied else _find(path, ("lm_head.weight", "language_model.lm_head.weight"), "LM head")
    if embed.dim() != 2 or embed.shape[1] != hidden or embed.shape[0] != vocab:
        raise ValueError(f"{path}: the token embeddings are {list(embed.shape)}, but config.json says vocabulary "
                         f"{vocab} and hidden size {hidden}")
    if head is not None and tuple(head.shape) != tuple(embed.shape):
        raise ValueError(f"{path}: the LM head is {list(head.shape)}, but the embeddings are {list(embed.shape)}")
    _no_more_layers(path, total)
    built = []
    for index in range(count):
        spec, raw = layer_weights(path, config, index)
        built.append(compiled_layer(config, spec, raw, target, max_seq, weights, threads, dtype, tuning=tuning))
    eps = float(getattr(config, "rms_norm_eps", 1e-6))
    model = CausalLM(f"{SUPPORTED[kind]}ForCausalLM", built, embed, norm, head, eps, threads=threads, tuning=tuning)
    del embed, head, built
    release_freed_memory()
    return model


def _no_more_layers(path: Path, total: int) -> None:
    """A ValueError where the checkpoint holds a layer past config.json's ``num_hidden_layers`` (a config that
    does not belong to its weights: the model would run without those layers, silently)."""
    from arke.models.hf import _layer_tensors

    try:
        _layer_tensors(path, total)
    except FileNotFoundError:
        return
    raise ValueError(f"{path}: the checkpoint holds layer {total}, but config.json says num_hidden_layers {total}: "
                     "the config does not describe these weights")


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the system (glibc's ``malloc_trim``): packing weights makes
    copies of each matrix that are freed at once, but below glibc's mmap threshold their pages stay in
    the heap, resident, until trimmed. Does nothing where there is no glibc."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def describe(model: CausalLM) -> dict[str, Any]:
    """What a loaded model is, for ``akc generate``'s header."""
    return {"model": model.name, "layers": len(model.layers), "hidden": model.hidden, "vocab": model.vocab,
            "target": model.target, "weights MiB": round(model.weight_bytes / 2**20, 1)}
