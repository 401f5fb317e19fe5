"""The operators the ``arke`` torch.compile backend puts into graphs: ``torch.ops.arke_fx.*``.

Each runs a standard-library kernel (built once per process, llvm target) on the shapes a model
hands it: ``linear`` flattens the leading axes onto the kernel's rows, ``sdpa`` is
``std.attention``'s ``attention``/``causal_attention`` (grouped-query attention read in place).
A call the kernel cannot take as it comes (an empty tensor, a causal mask between different query
and key lengths, which torch aligns top-left and ``std.attention`` bottom-right) runs torch's own
operator instead, so an operator in a graph is always correct for every shape the graph sees.
"""

from __future__ import annotations

import math
import threading
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F

from arke.library import Library

_LIB: torch.library.Library | None = None
_LOCK = threading.Lock()


@cache
def stdlib() -> Library:
    """``std.nn`` and ``std.attention`` built for this CPU (kernels compile on first use, through the cache)."""
    import arke

    return arke.build(arke.loads("import std.nn\nimport std.attention\n"))


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    k, n = x.shape[-1], w.shape[0]
    if x.numel() == 0 or w.numel() == 0:
        return F.linear(x, w, b)
    rows = x.reshape(-1, k)
    lib = stdlib()
    y = lib.linear(rows, w) if b is None else lib.linear_bias(rows, w, b)
    return y.reshape(*x.shape[:-1], n)


def _linear_fake(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], w.shape[0]))


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None) -> torch.Tensor:
    s, t, d = q.shape[-2], k.shape[-2], q.shape[-1]
    other_scale = scale is not None and abs(scale - default_scale(d)) > 1e-6 * abs(scale)
    if (q.numel() == 0 or k.numel() == 0 or (causal and s != t) or q.shape[1] % k.shape[1] or other_scale
            or v.shape[-1] != d):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                              enable_gqa=q.shape[1] != k.shape[1])
    lib = stdlib()
    return (lib.causal_attention if causal else lib.attention)(q, k, v)


def _sdpa_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None
               ) -> torch.Tensor:
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


def define() -> None:
    """Define ``torch.ops.arke_fx.linear`` and ``torch.ops.arke_fx.sdpa`` (once per process)."""
    global _LIB
    with _LOCK:
        if _LIB is not None:
            return
        lib = torch.library.Library("arke_fx", "DEF")
        lib.define("linear(Tensor x, Tensor w, Tensor? b) -> Tensor")
        lib.define("sdpa(Tensor q, Tensor k, Tensor v, bool causal, float? scale) -> Tensor")
        lib.impl("linear", _linear, "CPU")
        lib.impl("sdpa", _sdpa, "CPU")
        torch.library.register_fake("arke_fx::linear", _linear_fake, lib=lib)
        torch.library.register_fake("arke_fx::sdpa", _sdpa_fake, lib=lib)
        _LIB = lib


def default_scale(head_dim: Any) -> float:
    """The scale std.attention applies: 1 / sqrt(D)."""
    return 1.0 / math.sqrt(int(head_dim))
