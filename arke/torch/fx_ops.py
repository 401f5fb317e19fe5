"""The operators the ``arke`` torch.compile backend puts into graphs: ``torch.ops.arke_fx.*``.

Each call runs Arke's kernel or torch's own operator, whichever is faster *here*: the first call of
each shape (rows rounded up to a power of two) times both, interleaved, and keeps the faster for every
later call of that shape (:func:`decisions` lists them; the ``arke.torch`` logger reports each). A
compiler that is slower than the operator it replaces on some machine and shape should not be used
there. Each call site carries its graph's mode: ``"measured"``, or ``"arke"`` to force Arke's kernels
(tests of them), or ``"torch"``.

Each runs a standard-library kernel (built once per process, llvm target) on the shapes a model
hands it: ``linear`` flattens the leading axes onto the kernel's rows, ``sdpa`` is
``std.attention``'s ``attention``/``causal_attention`` (grouped-query attention read in place).
A call the kernel cannot take as it comes (an empty tensor, a causal mask between different query
and key lengths, which torch aligns top-left and ``std.attention`` bottom-right) runs torch's own
operator instead (a scale other than ``1/sqrt(D)`` is folded into the queries), so an operator in a
graph is always correct for every shape the graph sees.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
import weakref
from collections.abc import Callable
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F

from arke.library import Library

_LIB: torch.library.Library | None = None
_LOCK = threading.Lock()
LOG = logging.getLogger("arke.torch")
#: how a call chooses: the faster per shape ("measured"), or always Arke's kernel, or always torch's
MODES = ("measured", "arke", "torch")
_CHOICE: dict[tuple[Any, ...], str] = {}  # shape key -> "arke" or "torch"
# (id(w), kn) -> (w, (version, data pointer), panels): one weight may be read both ways (a tied x @ W, h @ W.t())
_PACKED: dict[tuple[int, bool], tuple[weakref.ref[torch.Tensor], tuple[int, int], torch.Tensor | None]] = {}
ROUNDS = 5  # timed calls of each per decision, after one untimed call (interleaved; the median decides)


def decisions() -> dict[tuple[Any, ...], str]:
    """The choices made so far: (operator, shape key...) -> ``"arke"`` or ``"torch"``."""
    return dict(_CHOICE)


def _bucket(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _run(mode: str, key: tuple[Any, ...], ours: Callable[[], torch.Tensor], theirs: Callable[[], torch.Tensor]
         ) -> torch.Tensor:
    if mode != "measured":
        return ours() if mode == "arke" else theirs()
    found = _CHOICE.get(key)
    if found is None:
        # one untimed call of each first: Arke's first call of a shape compiles its kernel, packs the weight
        # and prepares the launches; timed with the others it would weigh on the median of a few rounds
        ours()
        theirs()
        times: dict[str, list[float]] = {"arke": [], "torch": []}
        for _ in range(ROUNDS):
            for name, f in (("arke", ours), ("torch", theirs)):
                start = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - start)
        a, t = statistics.median(times["arke"]), statistics.median(times["torch"])
        found = _CHOICE[key] = "arke" if a <= t else "torch"
        LOG.info("arke_fx %s: Arke %.3f ms, torch %.3f ms: %s runs it", key, a * 1e3, t * 1e3, found)
    return ours() if found == "arke" else theirs()


@cache
def stdlib() -> Library:
    """``std.nn`` and ``std.attention`` built for this CPU (kernels compile on first use, through the cache)."""
    import arke

    return arke.build(arke.loads("import std.nn\nimport std.attention\n"))


def linear_key(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> tuple[Any, ...]:
    """The shape a linear call's choice is made for (rows rounded up to a power of two)."""
    return ("linear", _bucket(x.numel() // max(1, x.shape[-1])), w.shape[0], w.shape[1], b is not None)


def sdpa_key(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float | None = None) -> tuple[Any, ...]:
    """The shape an attention call's choice is made for (lengths rounded up to powers of two; a scale other
    than ``1/sqrt(D)`` costs a scaled copy of the queries: a choice of its own)."""
    key = ("sdpa", q.shape[0], q.shape[1], k.shape[1], _bucket(q.shape[-2]), _bucket(k.shape[-2]), q.shape[-1],
           causal)
    return (*key, "scaled") if _folded(scale, q.shape[-1]) is not None else key


def _folded(scale: float | None, head_dim: int) -> float | None:
    """The factor that folds ``scale`` into the queries; None where it is std.attention's own ``1/sqrt(D)``."""
    if scale is None or abs(scale - default_scale(head_dim)) <= 1e-6 * abs(scale):
        return None
    return float(scale) / default_scale(head_dim)


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, mode: str, kn: bool = False) -> torch.Tensor:
    wt = w.t() if kn else w  # kn: the weight is stored [K, N] (GPT-2's Conv1D)
    k, n = x.shape[-1], wt.shape[0]
    if x.numel() == 0 or w.numel() == 0:
        return F.linear(x, wt, b).contiguous()
    rows = x.reshape(-1, k)
    lib = stdlib()

    def ours() -> torch.Tensor:  # packs the weight on Arke's first call only: torch's calls never copy it
        packed = _packed(w, kn)
        weight = packed if packed is not None else wt.contiguous()
        return (lib.linear(rows, weight) if b is None else lib.linear_bias(rows, weight, b)).reshape(*x.shape[:-1], n)

    return _run(mode, linear_key(x, wt, b), ours, lambda: F.linear(x, wt, b).contiguous())


def _packed(w: torch.Tensor, kn: bool = False) -> torch.Tensor | None:
    """``w`` packed once into the contraction kernels' panels (a weight is read by every call: its layout for
    the micro-kernel is worth a copy), repacked when it is written in place; None where the target has none,
    or ``w`` is no ``nn.Parameter``.
    ``kn``: ``w`` is stored [K, N] (its transpose is packed)."""
    if not isinstance(w, torch.nn.Parameter):
        # a model's weight is a Parameter; any other operand is data a caller may write behind torch's version
        # counter (through NumPy's shared memory, an inference tensor's missing counter), so it is read as it is
        # at each call (the kernel packs as it goes): a kept copy would go stale unseen
        return None
    key = (id(w), kn)
    found = _PACKED.get(key)
    # `w.data = new` keeps the version but not the storage; an inference Parameter has no version counter (it
    # is written in place only inside inference_mode: repack() covers that, as it covers `w.data` writes)
    stamp = (-1 if w.is_inference() else w._version, w.data_ptr())
    if found is not None and found[0]() is w and found[1] == stamp:
        return found[2]
    packed = stdlib().backend.pack_weight((w.t() if kn else w).contiguous())
    _PACKED[key] = (weakref.ref(w, lambda _: _PACKED.pop(key, None)), stamp, packed)
    return packed


def repack() -> None:
    """Forget every weight packed for ``torch.compile(backend="arke")``: the next call packs again. Needed only
    after a write through ``w.data`` in place (``w.data.mul_(2)``), which torch's version counter does not see,
    or an in-place write to a parameter made under ``torch.inference_mode()`` (it has no counter; other
    inference tensors are never packed)."""
    _PACKED.clear()


def _linear_fake(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, mode: str, kn: bool = False
                 ) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], w.shape[1] if kn else w.shape[0]))


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None, mode: str
          ) -> torch.Tensor:
    s, t, d = q.shape[-2], k.shape[-2], q.shape[-1]

    def theirs() -> torch.Tensor:  # contiguous, as the fake says
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                              enable_gqa=q.shape[1] != k.shape[1]).contiguous()

    if q.numel() == 0 or k.numel() == 0 or (causal and s != t) or q.shape[1] % k.shape[1] or v.shape[-1] != d:
        return theirs()
    lib = stdlib()
    kernel = lib.causal_attention if causal else lib.attention
    factor = _folded(scale, d)
    if factor is not None:
        # std.attention divides the scores by sqrt(D): another scale is folded into the queries (OPT's 1.0,
        # Gemma's query_pre_attn_scalar), one rounding more than torch's own scaled queries
        return _run(mode, sdpa_key(q, k, causal, scale), lambda: kernel(q * factor, k, v), theirs)
    return _run(mode, sdpa_key(q, k, causal), lambda: kernel(q, k, v), theirs)


def _sdpa_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
               mode: str) -> torch.Tensor:
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


def define() -> None:
    """Define ``torch.ops.arke_fx.linear`` and ``torch.ops.arke_fx.sdpa`` (once per process)."""
    global _LIB
    with _LOCK:
        if _LIB is not None:
            return
        lib = torch.library.Library("arke_fx", "DEF")
        lib.define("linear(Tensor x, Tensor w, Tensor? b, str mode, bool kn=False) -> Tensor")
        lib.define("sdpa(Tensor q, Tensor k, Tensor v, bool causal, float? scale, str mode) -> Tensor")
        lib.impl("linear", _linear, "CPU")
        lib.impl("sdpa", _sdpa, "CPU")
        torch.library.register_fake("arke_fx::linear", _linear_fake, lib=lib)
        torch.library.register_fake("arke_fx::sdpa", _sdpa_fake, lib=lib)
        _LIB = lib


def default_scale(head_dim: Any) -> float:
    """The scale std.attention applies: 1 / sqrt(D)."""
    return 1.0 / math.sqrt(int(head_dim))
