"""A decoder layer's cache append and attention over its contiguous KV cache (or a paged batch's rows),
recordable as part of a decode step (:mod:`arke.runtime.record`)."""

from __future__ import annotations

from typing import Any

import torch

from arke.models.config import KVCache
from arke.runtime.record import recording


def attend(layer: Any, v: dict[str, torch.Tensor], temps: dict[str, dict[int, torch.Tensor]], cache: Any, b: int,
           t: int) -> int:
    """Append the call's keys and values (``v["k"]``, ``v["v"]``) to ``cache`` at its length, then the attention
    of ``v["q"]`` over it into ``v["o"]``; the length before the call (the cache is not advanced)."""
    if not isinstance(cache, KVCache):  # the rows of a running batch over a paged cache (arke.models.paged)
        return int(cache.attend(layer, v))
    c = layer.config
    start = cache.length
    k = v["k"].view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
    vv = v["v"].view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
    cache.k[:, :, start:start + t].copy_(k)
    cache.v[:, :, start:start + t].copy_(vv)
    if (rec := recording()) is not None:
        _record_append(rec, cache, k, vv, t)
        rec.vary("n", t)  # the attention's length: each step's start + t
    scalars: dict[str, Any] = {"n": start + t}
    if c.window:
        scalars["window"] = c.window
    q4 = v["q"].view(b, t, c.heads, c.head_dim)
    layer._attn([q4, cache.k, cache.v], scalars, v["o"], temps.get("attn"))
    return start


def _record_append(rec: Any, cache: KVCache, k: torch.Tensor, v: torch.Tensor, t: int) -> None:
    """The append as a recorded step's action: NumPy views of the cache and of the new rows (a few µs, where
    torch's copy of a strided slice costs tens)."""
    if k.dtype == torch.bfloat16 or cache.k.dtype != k.dtype:
        rec.fail("a bfloat16 KV cache")  # NumPy has no bfloat16
        return
    kc, vc, kn, vn = cache.k.numpy(), cache.v.numpy(), k.numpy(), v.numpy()

    def write(start: int) -> None:
        kc[:, :, start:start + t] = kn
        vc[:, :, start:start + t] = vn
    rec.action(write, cache.k, cache.v, k, v)
