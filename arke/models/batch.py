"""A running batch: sequences of different lengths generating together over a paged KV cache.

``batch = model.batch(blocks=…)``; ``sid = batch.add(prompt, max_new_tokens=…, **sampling)`` queues a
sequence; each ``batch.step()`` runs every sequence one token further (a new one's whole prompt, in the
same pass as the others' decode rows) and returns ``{sid: token}``; ``batch.remove(sid)`` drops one;
finished sequences (their token budget spent, or an end-of-sequence token) leave by themselves and free
their blocks. ``batch.run()`` steps until every sequence is done and returns each one's tokens.

Everything a step needs is checked before it changes anything: a prompt that is too long, a bad id or
a pool short of blocks is a clear error, and the running sequences go on as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from arke.models.generate import Sampling, _Chooser
from arke.models.paged import PagedCache, Rows
from arke.models.replay import paged_step

if TYPE_CHECKING:
    from arke.models.lm import CausalLM


@dataclass
class _Sequence:
    tokens: list[int]  # the prompt, then every generated token
    pending: list[int]  # the tokens the next step runs (the prompt, then the last token)
    budget: int  # new tokens still to generate
    chooser: _Chooser
    how: Sampling
    generated: list[int] = field(default_factory=list)


class Batch:
    """Sequences generating together over one :class:`~arke.models.paged.PagedCache`."""

    def __init__(self, model: CausalLM, blocks: int | None = None, block_size: int = 16):
        if blocks is None:  # room for one sequence of max_seq tokens, plus one block per 16 slots of slack
            blocks = -(-model.max_seq // block_size) * 2
        self.model = model
        self.cache = PagedCache(model, blocks, block_size)
        self._sequences: dict[int, _Sequence] = {}
        self.finished: dict[int, list[int]] = {}  # sequence id -> its generated tokens, once it is done
        self._next = 0
        self._graph: Any = None  # the recorded decode step (arke.models.replay)

    def __repr__(self) -> str:
        return f"<running batch of {len(self._sequences)} sequences over {self.cache!r}>"

    @property
    def active(self) -> list[int]:
        """The sequences still generating, in the order they joined."""
        return list(self._sequences)

    def add(self, prompt: Any, max_new_tokens: int = 32, *, do_sample: bool = False, temperature: float = 1.0,
            top_k: int = 50, top_p: float = 1.0, repetition_penalty: float = 1.0,
            eos_token_id: int | list[int] | None = None, seed: int | None = None) -> int:
        """Queue a sequence (its prompt's token ids); it joins at the next step. Returns its id."""
        ids = self.model.check_ids(prompt, "prompt")
        if ids.shape[0] != 1:
            raise ValueError(f"add takes one prompt (a 1-D list or tensor of ids), not {ids.shape[0]}")
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, not {max_new_tokens!r}")
        tokens = ids[0].tolist()
        if len(tokens) + max_new_tokens > self.model.max_seq:
            raise ValueError(f"the prompt's {len(tokens)} tokens and {max_new_tokens} new ones do not fit in "
                             f"max_seq {self.model.max_seq}")
        blocks = -(-(len(tokens) + max_new_tokens) // self.cache.block_size)
        if blocks > self.cache.blocks:
            raise ValueError(f"the sequence needs {blocks} blocks of {self.cache.block_size} slots, but the cache "
                             f"has {self.cache.blocks}: make it larger (model.batch(blocks=...))")
        how = Sampling.of(self.model.vocab, do_sample, temperature, top_k, top_p, repetition_penalty, eos_token_id,
                          None, seed)
        chooser = _Chooser(self.model, ids, how)
        sid, self._next = self._next, self._next + 1  # only once everything is checked
        self._sequences[sid] = _Sequence(tokens, list(tokens), max_new_tokens, chooser, how)
        return sid

    def remove(self, sid: int) -> list[int]:
        """Drop a sequence (its blocks return to the pool); the tokens it generated."""
        if sid not in self._sequences:
            raise KeyError(f"no running sequence {sid}; running: {self.active}")
        self.cache.release(sid)
        return self._sequences.pop(sid).generated

    def step(self) -> dict[int, int]:
        """Run every sequence one token further; each one's new token. Finished sequences leave."""
        order = self.active
        if not order:
            return {}
        counts = [len(self._sequences[s].pending) for s in order]
        starts = [self.cache.lengths.get(s, 0) for s in order]
        self.cache.reserve(dict(zip(order, counts)))  # all or nothing
        rows = Rows(self.cache, order, counts, starts)
        ids = torch.tensor([t for s in order for t in self._sequences[s].pending], dtype=torch.int64)
        last = torch.tensor(counts).cumsum(0) - 1
        logits = paged_step(self, ids, rows, last)  # a decode step replayed (arke.models.replay)
        out: dict[int, int] = {}
        for i, s in enumerate(order):
            seq = self._sequences[s]
            token = int(seq.chooser(logits[i:i + 1])[0])
            seq.tokens.append(token)
            seq.generated.append(token)
            seq.pending = [token]
            seq.budget -= 1
            out[s] = token
            if seq.budget == 0 or token in seq.how.eos:
                self.cache.release(s)
                self.finished[s] = self._sequences.pop(s).generated
        return out

    def run(self) -> dict[int, list[int]]:
        """Step until every sequence is done; each sequence's generated tokens (those that finished earlier
        included)."""
        while self._sequences:
            self.step()
        return dict(self.finished)
