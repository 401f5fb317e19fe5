"""A paged KV cache, and the rows of a running batch over it.

A :class:`PagedCache` holds, for every layer of a :class:`~arke.models.lm.CausalLM`, a pool of keys and
one of values, ``[blocks, kv_heads, block_size, head_dim]`` each, and hands blocks out to sequences: a
sequence's tokens live in its blocks, listed in order in its row of the block table. Blocks are
allocated as a sequence grows and returned when it leaves, so sequences of any lengths share the pools
with no padding, and one can join or leave between any two steps.

A step runs *rows*: each is one token of one sequence at its position (a joining sequence's whole prompt,
a running one's last token), all through each layer at once. Each layer writes its rows' keys and values
into their slots, then ``std.decoder.attn_paged`` lets each row attend to its own sequence's slots up to
its position, reading them through the block table in place (:class:`Rows`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from arke.models.config import cache_zeros
from arke.runtime.errors import GuardError
from arke.runtime.record import recording

if TYPE_CHECKING:
    from arke.models.layer import CompiledLayer
    from arke.models.lm import CausalLM


class PagedCache:
    """Key and value pools of ``blocks`` blocks of ``block_size`` slots for every layer of ``model``."""

    def __init__(self, model: CausalLM, blocks: int, block_size: int = 16):
        for name, value in (("blocks", blocks), ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        half = [layer.name for layer in model.layers if layer.act_dtype != torch.float32]
        if half:
            raise ValueError("a paged cache runs layers with f32 activations; this model's are "
                             f"{model.layers[0].act_dtype} (load it with dtype=torch.float32)")
        self.model, self.blocks, self.block_size = model, blocks, block_size
        self.k, self.v = [], []
        for layer in model.layers:  # a layer may page its own rows (DeepSeek-V2: latent rows and rope keys)
            c = layer.config
            shapes = getattr(layer, "page_shapes", None)
            k, v = shapes(blocks, block_size) if shapes else ((blocks, c.kv_heads, block_size, c.head_dim),) * 2
            self.k.append(cache_zeros(k, torch.float32, model.device))
            self.v.append(cache_zeros(v, torch.float32, model.device))
        self.free = list(range(blocks - 1, -1, -1))  # popped from the end: block 0 first
        self.tables: dict[int, list[int]] = {}  # sequence id -> its blocks, in order
        self.lengths: dict[int, int] = {}  # sequence id -> the tokens its blocks hold

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def __repr__(self) -> str:
        return (f"<paged KV cache: {self.blocks} blocks of {self.block_size} slots, {len(self.free)} free, "
                f"{len(self.tables)} sequences>")

    def needed(self, sequence: int, tokens: int) -> int:
        """The blocks ``sequence`` must be given to take ``tokens`` more."""
        have = len(self.tables.get(sequence, ()))
        after = self.lengths.get(sequence, 0) + tokens
        return max(0, -(-after // self.block_size) - have)

    def reserve(self, grow: dict[int, int]) -> None:
        """Give each sequence the blocks for its ``grow[sequence]`` new tokens; all or nothing: when the pool
        is short nothing changes and a GuardError says by how much."""
        need = sum(self.needed(s, t) for s, t in grow.items())
        if need > len(self.free):
            raise GuardError("paged cache", f"this step needs {need} more blocks of {self.block_size} slots, but "
                             f"{len(self.free)} of {self.blocks} are free: finish or remove a sequence, or make "
                             "the cache larger", rule="dim", param="blocks")
        for s, t in grow.items():
            table = self.tables.setdefault(s, [])
            table.extend(self.free.pop() for _ in range(self.needed(s, t)))
            self.lengths[s] = self.lengths.get(s, 0) + t

    def release(self, sequence: int) -> None:
        """Return a sequence's blocks to the pool."""
        self.free.extend(reversed(self.tables.pop(sequence, [])))
        self.lengths.pop(sequence, None)

    def table(self, order: list[int]) -> torch.Tensor:
        """The block table of the sequences in ``order``, int32 ``[S, MB]`` (unused entries name block 0,
        a valid block the attention never weighs). ``MB`` covers ``max_seq``, whatever the sequences hold now:
        a batch's decode steps keep one shape, and their recording (arke.models.replay) one table."""
        width = max(1, -(-self.model.max_seq // self.block_size),
                    max((len(self.tables[s]) for s in order), default=1))
        t = torch.zeros(len(order), width, dtype=torch.int32)
        for i, s in enumerate(order):
            t[i, :len(self.tables[s])] = torch.tensor(self.tables[s], dtype=torch.int32)
        return t.to(self.model.device)


class Rows:
    """One step's rows as a layer sees them: where each row's key and value go, and what it attends to."""

    def __init__(self, cache: PagedCache, order: list[int], counts: list[int], starts: list[int]):
        dev, size = cache.model.device, cache.block_size
        seq = torch.repeat_interleave(torch.arange(len(order)), torch.tensor(counts))
        pos = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, counts)])
        self.cache, self.layer_index = cache, 0
        self.blk = cache.table(order)
        self.seq, self.pos = seq.to(dev), pos.to(dev)
        # each row's slot: its sequence's block (through the table just built) and the offset in it
        self.block, self.offset = self.blk[self.seq, self.pos // size].to(torch.int64), self.pos % size
        self.length = 0  # the layer sets it after its call; the cache's lengths are kept by the batch

    def attend(self, layer: CompiledLayer, v: dict[str, torch.Tensor]) -> int:
        """Write the rows' keys and values into their slots of this layer's pools, then each row's attention
        over its sequence into ``v["o"]``."""
        own = getattr(layer, "attend_rows", None)
        if own is not None:  # a layer that pages its own rows
            return int(own(self, v))
        c, i = layer.config, self.layer_index
        kc, vc = self.cache.k[i], self.cache.v[i]
        n = self.seq.numel()
        kc[self.block, :, self.offset] = v["k"].view(n, c.kv_heads, c.head_dim)
        vc[self.block, :, self.offset] = v["v"].view(n, c.kv_heads, c.head_dim)
        if (rec := recording()) is not None:  # a recorded step: the same append from its (rewritten) rows
            rows = (kc.numpy(), vc.numpy(), self.block.numpy(), self.offset.numpy(),
                    v["k"].view(n, c.kv_heads, c.head_dim).numpy(), v["v"].view(n, c.kv_heads, c.head_dim).numpy())

            def write(start: int, kn: Any = rows[0], vn: Any = rows[1], at: Any = rows[2], off: Any = rows[3],
                      k: Any = rows[4], vv: Any = rows[5]) -> None:
                kn[at, :, off] = k
                vn[at, :, off] = vv
            rec.action(write, kc, vc, self.block, self.offset, v["k"], v["v"])
        scalars: dict[str, Any] = {"window": c.window} if c.window else {}
        out = v["o"].view(n, c.heads, c.head_dim)
        layer._paged([v["q"].view(n, c.heads, c.head_dim), kc, vc, self.blk, self.seq, self.pos], scalars, out, None)
        return 0


def run_rows(model: CausalLM, ids: torch.Tensor, rows: Rows, last: torch.Tensor) -> torch.Tensor:
    """The logits ``[len(last), V]`` of rows ``last`` after running the rows' tokens ``ids`` ``[N]`` through
    every layer (each row's key and value appended to its sequence's blocks)."""
    flat = ids.to(model.device)
    x = model.embed_rows(flat, rows.pos)
    n = flat.numel()
    x = x.view(1, n, model.hidden)
    positions = rows.pos.view(1, n)
    for i, layer in enumerate(model.layers):
        rows.layer_index = i
        with layer._calling:
            x = layer._run(x, positions, rows, 1, n)  # type: ignore[arg-type]
    # every row a sequence's last (a decode step): the rows themselves, no gather
    h = x.view(n, model.hidden) if last.numel() == n else x.view(n, model.hidden)[last.to(model.device)].contiguous()
    return model.head_rows(h)
