"""What a decoder layer computes (:class:`LayerConfig`), its KV cache, and int8 weight quantisation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from arke.models.layer import CompiledLayer


@dataclass(frozen=True)
class LayerConfig:
    """What a decoder layer computes: sizes, norm epsilon, rotary frequencies, window, experts."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    inv_freq: tuple[float, ...]  # head_dim / 2 rotary frequencies (any rope type's, precomputed); () for none
    rope_scale: float = 1.0  # the rope type's attention scaling of cos and sin
    window: int | None = None  # sliding-window attention: the keys a query sees, its own included
    experts: int = 0  # 0: a dense SwiGLU MLP; else a mixture of this many SwiGLU experts
    top_k: int = 2

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.heads} query heads cannot share {self.kv_heads} KV heads evenly")
        if self.inv_freq and len(self.inv_freq) * 2 != self.head_dim:  # (GPT-2 has no rotary embedding)
            raise ValueError(f"{len(self.inv_freq)} rotary frequencies for a head dim of {self.head_dim}")


class KVCache:
    """Keys and values of every token a layer has seen, preallocated to ``max_seq`` slots."""

    def __init__(self, owner: CompiledLayer, batch: int):
        c = owner.config
        shape = (batch, c.kv_heads, owner.max_seq, c.head_dim)
        self.owner, self.batch = owner, batch
        self.k, self.v = (cache_zeros(shape, owner.act_dtype, owner.device) for _ in range(2))
        self.length = 0  # slots filled (the same for every sequence of the batch)

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def __repr__(self) -> str:
        return f"<KV cache: batch {self.batch}, {self.length} of {self.owner.max_seq} slots>"


def cache_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A zeroed KV-cache tensor: on the CPU, on huge pages where they pay (:mod:`arke.runtime.hugepages`)."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    from arke.runtime import hugepages

    return hugepages.zeros(shape, dtype)


def resident(t: torch.Tensor, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A model's own contiguous copy of weight ``t`` (in ``dtype``) on ``device``: on the CPU, in the long-lived
    weight storage of :mod:`arke.runtime.hugepages` (decode streams it)."""
    t = t.detach().to(dtype or t.dtype)
    if torch.device(device).type != "cpu":
        return t.to(device).contiguous()
    from arke.runtime import hugepages

    return hugepages.weight_copy(t)


def check_weights(name: str, raw: dict[str, torch.Tensor], want: dict[str, tuple[int, ...]], sizes: str = "") -> None:
    """Every weight ``want`` names is in ``raw``, of its shape (a ValueError naming the missing or wrong ones;
    ``sizes`` says what the shapes follow from)."""
    missing = [k for k in want if k not in raw]
    if missing:
        raise ValueError(f"{name}: weights lack {', '.join(missing)}")
    wrong = [f"{k} is {list(raw[k].shape)}, not {list(s)}" for k, s in want.items() if tuple(raw[k].shape) != s]
    if wrong:
        raise ValueError(f"{name}: {'; '.join(wrong)}" + (f" ({sizes})" if sizes else ""))


def by_expert(expert: torch.Tensor, experts: int) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    """Each token's chosen experts ``expert [N, k]`` grouped by expert: the token of each grouped (token, s)
    pair, each expert's count (in expert order), and where each pair landed (``slot [N, k]``, for the
    weighted combine)."""
    flat = expert.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts).tolist()
    rows = torch.div(order, expert.shape[1], rounding_mode="floor")
    slot = torch.empty_like(order)
    slot[order] = torch.arange(order.numel(), device=order.device)
    return rows, counts, slot.view(expert.shape)


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w ≈ scale[:, None] * q``: symmetric int8 per output channel (row), round to nearest."""
    w = w.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def random_weights(config: LayerConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights of a layer of ``config`` (the names :class:`~arke.models.layer.CompiledLayer` reads),
    scaled like a trained layer's (unit-order activations): what a plan is measured and checked with."""
    g = torch.Generator().manual_seed(seed)
    c, d, e = config, config.hidden, config.head_dim

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * shape[-1] ** -0.5

    raw = {"input_norm": 1 + 0.1 * torch.randn(d, generator=g), "post_norm": 1 + 0.1 * torch.randn(d, generator=g),
           "q": w(c.heads * e, d), "k": w(c.kv_heads * e, d), "v": w(c.kv_heads * e, d), "o": w(d, c.heads * e)}
    if c.experts:
        raw |= {"router": w(c.experts, d), "experts_gate_up": w(c.experts, 2 * c.intermediate, d),
                "experts_down": w(c.experts, d, c.intermediate)}
    else:
        raw |= {"gate": w(c.intermediate, d), "up": w(c.intermediate, d), "down": w(d, c.intermediate)}
    return raw
