"""Decode steps replayed: a causal LM's one-token step recorded once as its native launches, then run as one
loop over them (:mod:`arke.runtime.record` says why: the Python between the kernels ran cache-cold).

The first decode step on a cache runs as usual with a recording on, reading the token and its position
from buffers of its own. Every later step on the same cache, batch and settings writes the new token and
position there and replays the recording: the launches, the KV cache appends and the attention's length,
nothing else. The results are those of the usual path, bit for bit (the same launches on the same
buffers, tested). A running batch over a paged cache does the same when every sequence decodes one token
(:class:`PagedGraph`): its rows (ids, positions, block table, slots) are rewritten in place.

A step is replayed only where every part of it recorded: the llvm target on the CPU, f32 activations,
decoder layers whose step is kernels and views (Llama-family and GPT-2 layers; not mixture-of-experts,
16-bit or DeepSeek layers), with no copy between kernels (each checked as it is recorded). Anything else
runs the usual path, as does any step whose settings changed since the recording: torch's thread count,
the prepacked weights, the launcher knobs, the process. ``ARKE_NO_REPLAY=1`` turns replay off.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

import torch

from arke import knobs
from arke.models.calls import KernelCall
from arke.models.gpt2 import Gpt2Layer
from arke.models.layer import CompiledLayer
from arke.runtime import panels
from arke.runtime.record import Recording, record


def unreplayable(lm: Any) -> str | None:
    """Why ``lm``'s decode steps cannot be replayed (None: they can)."""
    if knobs.no_replay():
        return "ARKE_NO_REPLAY is set"
    if lm.device.type != "cpu":  # a target whose kernels record no launches fails its recording instead
        return f"the model runs on {lm.device.type}"
    for layer in lm.layers:
        if type(layer) not in (CompiledLayer, Gpt2Layer):
            return f"{type(layer).__name__} layers"
        if layer.config.experts:
            return "mixture-of-experts layers"
        if layer.act_dtype != torch.float32:
            return f"{layer.act_dtype} activations"
        if not isinstance(layer._attn, KernelCall):
            return "layers whose kernels are not compiled here (the reference interpreter, or a bundle)"
    return None


def _settings() -> tuple[Any, ...]:
    """What a recording's launches assumed: a step under other settings runs the usual path."""
    return (torch.get_num_threads(), panels.generation(), knobs.no_team(), knobs.no_omp(), knobs.no_replay(),
            os.getpid())


def _replay(lm: Any, recording: Recording, start: int) -> None:
    """A recording's steps, holding every layer's lock (their arenas, as their own calls hold them)."""
    locks = [layer._calling for layer in lm.layers]
    for lock in locks:
        lock.acquire()
    try:
        for step in recording.steps:
            step(start)
    finally:
        for lock in locks:
            lock.release()


class _Graph:
    """A recorded step: its recording and logits, or why it could not be recorded."""

    recording: Recording | None = None
    failed: str | None = None
    logits: torch.Tensor | None = None

    def _record(self, step: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``step()`` (the usual path) with a recording on: its logits."""
        rec = Recording()
        with record(rec):
            logits = step()
        if rec.failed is None:
            self.recording, self.logits = rec, logits
        else:
            self.failed = rec.failed
        return logits


class DecodeGraph(_Graph):
    """One cache's recorded decode step (batch ``B``, one token each)."""

    def __init__(self, lm: Any, cache: Any):
        b = cache.batch
        self.lm, self.cache, self.batch = lm, weakref.ref(cache), b  # weak: the cache holds its graph
        self.settings = _settings()
        self.ids = torch.zeros(b, 1, dtype=torch.int64)
        self.positions = torch.zeros(b, 1, dtype=torch.int64)
        self._ids, self._positions = self.ids.numpy(), self.positions.numpy()

    def serves(self, cache: Any) -> bool:
        """Whether this graph belongs to ``cache`` under the current settings."""
        return self.cache() is cache and cache is not None and cache.batch == self.batch and \
            _settings() == self.settings

    def capture(self, ids: torch.Tensor, cache: Any) -> torch.Tensor:
        """The usual step on ``ids`` ``[B, 1]``, recorded: its logits."""
        self._ids[:] = ids.numpy()
        self._positions[:] = cache.length
        return self._record(lambda: self.lm._run(self.ids, cache, False, positions=self.positions))

    def run(self, ids: torch.Tensor, cache: Any) -> torch.Tensor:
        """The recorded step on ``ids`` ``[B, 1]``: its logits (``[B, V]``, overwritten by the next step)."""
        assert self.recording is not None and self.logits is not None
        start = cache.length
        self._ids[:] = ids.numpy()
        self._positions[:] = start
        _replay(self.lm, self.recording, start)
        for c in cache.layers:
            c.length = start + 1
        return self.logits


def decode(lm: Any, ids: torch.Tensor, cache: Any) -> torch.Tensor:
    """A checked decode step of ``lm`` (``ids`` ``[B, 1]`` int64): replayed where it can be, recorded the first
    time; the logits ``[B, V]`` may be a buffer the next step overwrites."""
    graph = cache.graph  # the cache's own: what it records (its KV tensors among them) lives as long as it
    if graph is not None and graph.serves(cache):
        if graph.recording is not None:
            return graph.run(ids, cache)
        return lm._run(ids, cache, False)  # recorded once and could not be: the usual path
    if ids.shape[1] != 1 or unreplayable(lm) is not None:
        return lm._run(ids, cache, False)
    cache.graph = graph = DecodeGraph(lm, cache)
    return graph.capture(ids, cache)


class PagedGraph(_Graph):
    """A running batch's recorded decode step: ``n`` sequences of one token each, block tables ``W`` wide."""

    def __init__(self, lm: Any, ids: torch.Tensor, rows: Any):
        self.lm, self.key, self.settings = lm, (ids.numel(), rows.blk.shape[1]), _settings()
        # the step's inputs, rewritten in place by each replayed step (the recorded launches read them there)
        self.inputs = (ids, rows.blk, rows.seq, rows.pos, rows.block, rows.offset)
        self._inputs = [t.numpy() for t in self.inputs]

    def serves(self, ids: torch.Tensor, rows: Any) -> bool:
        """Whether this graph's step has these rows' shapes under the current settings."""
        return (ids.numel(), rows.blk.shape[1]) == self.key and _settings() == self.settings

    def capture(self, ids: torch.Tensor, rows: Any, last: torch.Tensor) -> torch.Tensor:
        """The usual step (on the rows this graph keeps as its inputs), recorded: its logits."""
        from arke.models.paged import run_rows

        return self._record(lambda: run_rows(self.lm, ids, rows, last))

    def run(self, ids: torch.Tensor, rows: Any) -> torch.Tensor:
        """The recorded step on these rows: the logits ``[n, V]`` (overwritten by the next step)."""
        assert self.recording is not None and self.logits is not None
        for into, new in zip(self._inputs, (ids, rows.blk, rows.seq, rows.pos, rows.block, rows.offset)):
            into[...] = new.numpy()
        _replay(self.lm, self.recording, 0)
        return self.logits


def paged_step(batch: Any, ids: torch.Tensor, rows: Any, last: torch.Tensor) -> torch.Tensor:
    """A running batch's step over its rows: replayed where it is a decode step that can be, recorded the
    first time; the logits of each sequence's last row (a buffer the next step may overwrite)."""
    from arke.models.paged import run_rows

    lm, graph = batch.model, batch._graph
    if last.numel() != ids.numel() or lm.device.type != "cpu":  # prompts joining: rows of several tokens
        return run_rows(lm, ids, rows, last)
    if graph is not None and graph.serves(ids, rows):
        return graph.run(ids, rows) if graph.recording is not None else run_rows(lm, ids, rows, last)
    if unreplayable(lm) is not None:
        return run_rows(lm, ids, rows, last)
    batch._graph = graph = PagedGraph(lm, ids, rows)
    return graph.capture(ids, rows, last)
