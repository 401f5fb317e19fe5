"""Shared helpers of the tests of arke.models: small Hugging Face decoder layers and their references.

Every architecture gets one small config (hidden 64, head dim 16) so the compiled kernels'
variants are shared between the tests that use it (compile time is most of these tests' cost).
The reference is transformers' own layer run over the whole sequence at once, in f32, with an
explicit causal (and, for a window, sliding) mask.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import transformers

from arke.models.config import quantize_int8
from arke.models.layer import CompiledLayer

ARCHS = ("llama", "qwen2", "mistral", "mixtral")
PREFIX = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral", "mixtral": "Mixtral"}
HIDDEN = 64
MAX_SEQ = 64
WINDOW = 5  # Mistral's sliding window: shorter than a prefill, so it matters there and in decode

#: Relative tolerance (of max |reference|) of a compiled layer against transformers' in f32.
RTOL = 1e-4


def config(arch: str, **overrides: Any) -> Any:
    """A small transformers config of ``arch`` (GQA everywhere; llama3 rope for llama; a window for mistral)."""
    common: dict[str, Any] = dict(hidden_size=HIDDEN, intermediate_size=96, num_attention_heads=8,
                                  num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                                  rms_norm_eps=1e-5, vocab_size=32)
    if arch == "llama":
        common["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        cls: Any = transformers.LlamaConfig
    elif arch == "qwen2":
        common |= {"num_attention_heads": 7, "num_key_value_heads": 1}
        cls = transformers.Qwen2Config
    elif arch == "mistral":
        common["sliding_window"] = WINDOW
        cls = transformers.MistralConfig
    elif arch == "mixtral":
        common |= {"num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None}
        cls = transformers.MixtralConfig
    else:
        raise ValueError(arch)
    cfg = cls(**(common | overrides))
    cfg._attn_implementation = "sdpa"
    return cfg


def modeling(arch: str) -> Any:
    """transformers' modeling module of ``arch``."""
    return importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")


def randomize(module: torch.nn.Module, seed: int, std: float = 0.2) -> None:
    """Every parameter drawn from N(0, std) (the default init makes a layer nearly the identity)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * std)


def hf_layer(arch: str, cfg: Any, seed: int = 0, index: int = 0) -> Any:
    """A ``<Arch>DecoderLayer`` of ``cfg`` with random weights, in eval mode."""
    layer = getattr(modeling(arch), f"{PREFIX[arch]}DecoderLayer")(cfg, index).eval()
    randomize(layer, seed)
    return layer


def inputs(batch: int, length: int, seed: int = 1, offsets: Sequence[int] | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [batch, length, HIDDEN] and int64 positions (row b starts at ``offsets[b]``, default 0)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, HIDDEN, generator=gen)
    start = torch.tensor(list(offsets) if offsets is not None else [0] * batch, dtype=torch.int64)
    return x, (start[:, None] + torch.arange(length)[None]).contiguous()


def reference(arch: str, layer: Any, cfg: Any, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """transformers' output for the whole sequence at once (causal; sliding window where the config has one)."""
    rotary = getattr(modeling(arch), f"{PREFIX[arch]}RotaryEmbedding")(cfg)
    b, n, _ = x.shape
    i = torch.arange(n)
    seen = i[None, :] <= i[:, None]
    window = getattr(cfg, "sliding_window", None) if arch in ("mistral", "mixtral") else None
    if window:
        seen &= i[None, :] > i[:, None] - window
    mask = torch.zeros(n, n).masked_fill(~seen, float("-inf"))[None, None].expand(b, 1, n, n)
    with torch.no_grad():
        cos, sin = rotary(x, positions)
        out = layer(x, attention_mask=mask, position_ids=positions, position_embeddings=(cos, sin))
    return out[0] if isinstance(out, tuple) else out


def run_chunks(compiled: CompiledLayer, x: torch.Tensor, positions: torch.Tensor, chunks: Sequence[int],
               cache: Any = None) -> torch.Tensor:
    """The compiled layer called on consecutive chunks of the sequence (one cache), outputs concatenated."""
    cache = cache if cache is not None else compiled.new_cache(int(x.shape[0]))
    ys, at = [], 0
    for t in chunks:
        ys.append(compiled(x[:, at:at + t], positions[:, at:at + t].contiguous(), cache))
        at += t
    assert at == x.shape[1] and cache.length == at
    return torch.cat(ys, 1)


def relative_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    """max |y - ref| / max |ref|."""
    return float((y.float() - ref.float()).abs().max() / ref.abs().max())


def weight_matrices(layer: Any) -> list[torch.Tensor]:
    """The matrices a compiled layer converts for bf16/int8 weights: projections and experts, one per output row set.

    Norms, biases and the MoE router stay f32 in a compiled layer and are not listed.
    """
    attn, mlp = layer.self_attn, layer.mlp
    mats = [getattr(attn, f"{p}_proj").weight for p in "qkvo"]
    if hasattr(mlp, "experts"):
        mats += [mlp.experts.gate_up_proj[x] for x in range(mlp.experts.gate_up_proj.shape[0])]
        mats += [mlp.experts.down_proj[x] for x in range(mlp.experts.down_proj.shape[0])]
    else:
        mats += [getattr(mlp, f"{p}_proj").weight for p in ("gate", "up", "down")]
    return mats


def with_weights(layer: Any, convert: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """A copy of ``layer`` with every matrix of :func:`weight_matrices` replaced by ``convert(matrix)`` (f32)."""
    twin = copy.deepcopy(layer)
    with torch.no_grad():
        for w in weight_matrices(twin):
            w.copy_(convert(w.detach()).float())
    return twin


def bf16_rounded(w: torch.Tensor) -> torch.Tensor:
    """The f32 values of ``w`` rounded to bf16."""
    return w.to(torch.bfloat16).float()


def int8_dequantized(w: torch.Tensor) -> torch.Tensor:
    """``scale[:, None] * q`` of :func:`quantize_int8` (per output row)."""
    q, scale = quantize_int8(w)
    return q.float() * scale[:, None]


CONVERT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"bf16": bf16_rounded, "int8": int8_dequantized}
