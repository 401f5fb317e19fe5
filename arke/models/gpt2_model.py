"""A GPT-2 model folder (``GPT2LMHeadModel``'s ``config.json`` and ``*.safetensors``) as a compiled
:class:`~arke.models.lm.CausalLM`: token and learned position embeddings (``std.gpt2.embed_pos``), every
block (:class:`~arke.models.gpt2.Gpt2Layer`), the final LayerNorm and the head tied to the token
embeddings (``std.lm.head_ln``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from arke.models.gpt2 import NAMES, Gpt2Layer, gpt2_config
from arke.models.hf import _tensors, positive
from arke.models.lm import CausalLM

#: where a checkpoint keeps the model's tensors: GPT2LMHeadModel's ``transformer.``, GPT2Model's none
_PREFIXES = ("transformer.", "")


def _prefix(path: Path) -> str:
    """The prefix the checkpoint's tensor names use."""
    for prefix in _PREFIXES:
        try:
            found = _tensors(path, prefix + "wte.weight")
        except FileNotFoundError as err:
            if "index names" in str(err):
                raise
            continue
        if "" in found:
            return prefix
    raise FileNotFoundError(f"no safetensors file in {path} holds GPT-2's token embeddings (transformer.wte.weight)")


def gpt2_from_pretrained(path: Path, config: Any, target: str, dtype: torch.dtype, max_seq: int, weights: str,
                         threads: int | None, tuning: str, layers: int | None) -> CausalLM:
    """GPT-2 from a model folder; the arguments as :func:`arke.models.from_pretrained`'s."""
    if dtype != torch.float32:
        raise ValueError("GPT-2 runs with f32 activations (dtype=torch.float32); use weights='bf16' for bf16 weights")
    spec = gpt2_config(config)
    total = positive(config, "n_layer")  # config.json's own count: said as such when it is not one
    count = total if layers is None else layers
    if not isinstance(count, int) or not 1 <= count <= total:
        raise ValueError(f"layers must be between 1 and {total} (the model's layers), not {layers!r}")
    if max_seq > int(config.n_positions):
        raise ValueError(f"max_seq {max_seq} is more than GPT-2's {config.n_positions} learned positions")
    prefix = _prefix(path)

    def one(name: str) -> torch.Tensor:
        found = _tensors(path, prefix + name)
        if "" not in found:
            raise FileNotFoundError(f"no safetensors file in {path} holds {prefix + name}")
        return found[""]

    vocab, hidden = int(config.vocab_size), spec.hidden

    def shaped(name: str, *shape: int) -> torch.Tensor:
        """``one(name)``, refused by name unless it has ``shape`` (as transformers refuses the folder)."""
        t = one(name)
        if tuple(t.shape) != shape:
            raise ValueError(f"{path}: {prefix + name} is {list(t.shape)}, but config.json makes it {list(shape)} "
                             f"(vocabulary {vocab}, hidden size {hidden}, {config.n_positions} positions)")
        return t

    wte, wpe = shaped("wte.weight", vocab, hidden), shaped("wpe.weight", int(config.n_positions), hidden)
    blocks = []
    for index in range(count):
        found = _tensors(path, f"{prefix}h.{index}.")
        lacking = [n for n in NAMES if n not in found]
        if lacking:
            raise ValueError(f"block {index} of {path} lacks {', '.join(lacking)}")
        raw = {NAMES[n]: found[n] for n in NAMES}
        blocks.append(Gpt2Layer(spec, raw, target=target, max_seq=max_seq, weights_dtype=weights, threads=threads,
                                tuning=tuning))
    head = None
    if not bool(getattr(config, "tie_word_embeddings", True)):
        head = _tensors(path, "lm_head.weight").get("")
        if head is None:
            raise FileNotFoundError(f"no safetensors file in {path} holds lm_head.weight (the head is not tied)")
        if tuple(head.shape) != (vocab, hidden):
            raise ValueError(f"{path}: lm_head.weight is {list(head.shape)}, but config.json makes it "
                             f"{[vocab, hidden]}")
    return CausalLM("GPT2LMHeadModel", blocks, wte, shaped("ln_f.weight", hidden), head,
                    float(config.layer_norm_epsilon), threads=threads, tuning=tuning,
                    norm_bias=shaped("ln_f.bias", hidden), positions=wpe)
