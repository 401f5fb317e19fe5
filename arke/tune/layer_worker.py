"""The measuring worker's side of whole-layer plans (:mod:`arke.tune.layer`): build a layer like the one
being tuned (its sizes, weight kind, activations, target; random weights of its shapes, the same for
every candidate of a run) under a candidate plan, check it, time it.

Each call shape of the request (``tokens`` new tokens after ``context`` cached ones) is

1. run once (its arena planned, its kernels compiled), then the arena is poisoned (every byte 0xFF:
   NaN in every float dtype), so a kernel that leaves an element unwritten shows;
2. checked on fresh random inputs against the same layer on the reference interpreter (the oracle),
   both from identical caches: ``max |y - y_ref| <= tol * max |y_ref - x|`` (the layer's own
   update; the residual would hide most errors), tol by weight kind (:data:`TOLERANCE`);
3. timed: the same warm-up for every candidate, then samples of repeated calls, the cache set back
   to ``context`` before each call (so every call appends at the same place).

The reply's samples are, sample by sample, the sum over the call shapes (seconds per round of calls).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import torch

from arke.tune.worker import timed

#: max |y - y_ref| / max |y_ref - x| a plan may reach, by the layer's weight kind.
TOLERANCE = {"f32": 1e-3, "bf16": 3e-2, "f16": 3e-2, "int8": 1e-1}

_BUILT: dict[str, tuple[dict[str, torch.Tensor], Any]] = {}  # spec digest -> (raw weights, the reference layer)
#: the packed weights of the run's first layer: every plan reads the very same memory (fresh packing per plan
#: would place it anew each time, and its placement moved a 1B layer's times by 10-20 % on this machine)
_PACKED: dict[str, dict[str, torch.Tensor]] = {}


def build(spec: Mapping[str, Any], raw: dict[str, torch.Tensor], *, target: str, plan: str = "",
          tuning: str = "off") -> Any:
    """A layer of ``spec`` (:func:`arke.models.plans.spec`) with these weights on ``target``, under ``plan``."""
    from arke.models.config import LayerConfig
    from arke.models.layer import CompiledLayer

    fields = dict(spec["config"])
    fields["inv_freq"] = tuple(fields["inv_freq"])
    config = LayerConfig(**fields)
    threads = spec.get("threads")
    common: dict[str, Any] = {"target": target, "max_seq": int(spec["max_seq"]),
                              "threads": None if threads is None else int(threads), "plan": plan or None,
                              "tuning": tuning}
    act = str(spec.get("act", "torch.float32"))
    if act == "torch.float32":
        return CompiledLayer(config, raw, weights_dtype=str(spec["weights"]), **common)
    from arke.models.layer_half import HalfLayer

    return HalfLayer(config, raw, dtype=getattr(torch, act.removeprefix("torch.")), **common)


def _weights_and_reference(spec: Mapping[str, Any], seed: int) -> tuple[dict[str, torch.Tensor], Any]:
    from arke.models.config import LayerConfig, random_weights
    from arke.models.layer import REFERENCE

    key = json.dumps([spec, seed], sort_keys=True, default=str)
    if key not in _BUILT:
        _BUILT.clear()  # one layer per tuning run: keep only the latest
        fields = dict(spec["config"])
        fields["inv_freq"] = tuple(fields["inv_freq"])
        raw = random_weights(LayerConfig(**fields), seed)
        _BUILT[key] = (raw, build(spec, raw, target=REFERENCE))
    return _BUILT[key]


def _cache(layer: Any, batch: int, context: int, kv: tuple[torch.Tensor, torch.Tensor] | None) -> Any:
    cache = layer.new_cache(batch)
    if context and kv is not None:
        cache.k[:, :, :context].copy_(kv[0])
        cache.v[:, :, :context].copy_(kv[1])
    cache.length = context
    return cache


def _inputs(layer: Any, batch: int, tokens: int, context: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    x = torch.randn(batch, tokens, layer.config.hidden, generator=g).to(layer.act_dtype)
    positions = (context + torch.arange(tokens)).expand(batch, tokens).contiguous()
    return x, positions


def _call(layer: Any, x: torch.Tensor, positions: torch.Tensor, cache: Any, context: int) -> Callable[[], None]:
    """One timed call: the cache set back to ``context`` first, so every call appends at the same place."""
    def call() -> None:
        cache.length = context
        layer(x, positions, cache)
    return call


def measure_layer(request: Mapping[str, Any]) -> dict[str, Any]:
    """Check and time one plan (see the module docstring): ``{"status": "ok", "samples": [...], "calls": {...}}``,
    or ``mismatch`` / ``failed`` with an ``error``."""
    spec, target = request["layer"], str(request["layer"]["target"])
    seed = int(request.get("seed", 0))
    raw, reference = _weights_and_reference(spec, int(request.get("weights_seed", 0)))
    layer = build(spec, raw, target=target, plan=str(request.get("plan") or ""))
    packed = _PACKED.setdefault(json.dumps([spec, int(request.get("weights_seed", 0))], sort_keys=True, default=str),
                                layer.weights)
    if len(_PACKED) > 1:  # one layer per tuning run: keep only the latest
        for key in list(_PACKED)[:-1]:
            del _PACKED[key]
    layer.weights = packed
    g = torch.Generator().manual_seed(seed)
    batch = int(request.get("batch", 1))
    total: list[float] = []
    per_call: dict[str, float] = {}
    tol = TOLERANCE.get(layer.kind, 1e-3)
    for tokens, context in request["calls"]:
        tokens, context = int(tokens), int(context)
        shape = (batch, layer.config.kv_heads, context, layer.config.head_dim)
        kv = (torch.randn(shape, generator=g).to(layer.act_dtype), torch.randn(shape, generator=g).to(layer.act_dtype))
        layer(*_inputs(layer, batch, tokens, context, g), _cache(layer, batch, context, kv))
        layer._shape(batch, tokens).arena.fill_(255)  # poisoned: NaN in every float dtype
        x, positions = _inputs(layer, batch, tokens, context, g)
        got = layer(x, positions, _cache(layer, batch, context, kv)).double()
        if request.get("perturb"):  # tests: a layer whose result is wrong is caught
            got.view(-1)[0] += 1.0
        want = reference(x, positions, _cache(reference, batch, context, kv)).double()
        update = float((want - x.double()).abs().max())
        error = float((got - want).abs().max()) if not bool(got.isnan().any()) else float("nan")
        if not error <= tol * max(update, 1e-30):
            return {"status": "mismatch", "error": f"at {tokens} tokens after {context}: max |y - y_ref| = {error:.3g}"
                                                   f", more than {tol:g} of the layer's update ({update:.3g})"}
        samples = timed(_call(layer, x, positions, _cache(layer, batch, context, kv), context), request)
        per_call[f"{tokens}@{context}"] = sorted(samples)[len(samples) // 2]
        total = [a + b for a, b in zip(total, samples)] if total else samples
    return {"status": "ok", "samples": total, "calls": per_call}

