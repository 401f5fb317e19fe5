"""A whole causal language model, compiled: embeddings, every decoder layer, the final norm and the LM
head, and the KV caches of its sequences.

:class:`CausalLM` runs ``logits = model(ids, cache)``: the token embeddings (``std.lm.embed``; for a
head tied to the embeddings, ``std.lm.embed_panels`` reads the head's packed copy, so the table is held
once), each :class:`~arke.models.layer.CompiledLayer` in turn over its own cache, then ``std.lm.head``
(RMSNorm and the head's contraction in one kernel) on the rows whose logits are asked for: the last
token of each sequence for generation, or every token. Generation is :mod:`arke.models.generate`.

Every check comes first (ids, their range, the cache's owner, batch and room), so a bad call changes no
cache: a running batch stays intact.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from arke.models.config import resident
from arke.models.layer import CompiledLayer
from arke.runtime.errors import GuardError
from arke.runtime.record import counted, recording

#: The model's own kernels: std.lm, and std.nn's argmax for greedy decoding.
LM_SOURCE = "import std.lm\nimport std.nn\nimport std.gpt2\n"


class ModelCache:
    """The KV caches of every layer of a :class:`CausalLM` for ``batch`` sequences of equal length."""

    def __init__(self, owner: CausalLM, batch: int):
        self.owner, self.batch = owner, batch
        self.layers = [layer.new_cache(batch) for layer in owner.layers]
        self.graph: Any = None  # its recorded decode step (arke.models.replay)

    @property
    def length(self) -> int:
        """The tokens each sequence holds."""
        return self.layers[0].length

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.layers)

    def __repr__(self) -> str:
        return (f"<model cache: batch {self.batch}, {self.length} of {self.owner.max_seq} tokens, "
                f"{len(self.layers)} layers>")


class CausalLM:
    """A causal LM compiled for one target: ``logits = model(ids, cache)``.

    ``ids``: int64 ``[B, T]`` token ids; ``cache``: from :meth:`new_cache` with the same ``B`` (the T
    tokens are appended to it). Returns f32 logits ``[B, V]`` of each sequence's last token, or
    ``[B, T, V]`` with ``every_token=True``. :meth:`generate` and :meth:`stream` generate text.
    """

    def __init__(self, name: str, layers: Sequence[CompiledLayer], embed: torch.Tensor, norm: torch.Tensor,
                 head: torch.Tensor | None, eps: float, *, threads: int | None = None, tuning: str = "on",
                 norm_bias: torch.Tensor | None = None, positions: torch.Tensor | None = None):
        import arke

        if not layers:
            raise ValueError("a model needs at least one layer")
        first = layers[0]
        self.name, self.layers, self.eps = name, list(layers), float(eps)
        self.target, self.max_seq, self.device = first.target, first.max_seq, first.device
        self.vocab, self.hidden = int(embed.shape[0]), int(embed.shape[1])
        if head is not None and tuple(head.shape) != (self.vocab, self.hidden):
            raise ValueError(f"the LM head is {list(head.shape)}, but the embeddings are {list(embed.shape)}")
        if tuple(norm.shape) != (self.hidden,):
            raise ValueError(f"the final norm has shape {list(norm.shape)}, not [{self.hidden}]")
        self.tied = head is None
        module = arke.loads(LM_SOURCE, "<causal lm>")
        if self.target == "reference":
            self._kernels: Any = module.kernels
        else:
            self._kernels = arke.build(module, target=self.target, threads=threads, tuning=tuning).kernels
        self.kind = first.kind if first.kind in ("bf16", "f16") else "f32"
        wdtype = {"bf16": torch.bfloat16, "f16": torch.float16}.get(self.kind, torch.float32)
        self.norm = norm.detach().to(self.device, torch.float32).contiguous()
        # GPT-2: a LayerNorm (with bias) before the head, and learned positions added to the embeddings
        self.norm_bias = None if norm_bias is None else norm_bias.detach().to(self.device, torch.float32).contiguous()
        self.positions = None if positions is None else positions.detach().to(self.device, wdtype).contiguous()
        if self.positions is not None and self.positions.shape[0] < self.max_seq:
            raise ValueError(f"max_seq {self.max_seq} is more than the {self.positions.shape[0]} positions the model "
                             "learned: load it with a smaller max_seq")
        source = embed if head is None else head
        self.head, self.panels = self._pack_head(source.detach().to(wdtype), first.nr)
        self.embed: torch.Tensor | None
        if head is None and self.panels is None:
            self.embed = self.head  # tied: one copy
        elif head is None:
            self.embed = None  # tied and packed: the embeddings read the head's panels
        else:
            self.embed = resident(embed, self.device, wdtype)
        self._lock = threading.Lock()
        self.stats: dict[str, float] = {}  # the last generation's throughput (arke.models.generate)

    @classmethod
    def restore(cls, name: str, layers: Sequence[CompiledLayer], kernels: Any, *, eps: float, vocab: int, hidden: int,
                head: torch.Tensor, embed: torch.Tensor | None, panels: torch.Tensor | None, norm: torch.Tensor,
                norm_bias: torch.Tensor | None, positions: torch.Tensor | None, tied: bool) -> CausalLM:
        """A model of a bundle (:mod:`arke.models.bundle`): its layers, its kernels (``kernels[name](*args)``)
        and its weights as a built model holds them (the head packed). Nothing is compiled or packed."""
        self = cls.__new__(cls)
        first = layers[0]
        self.name, self.layers, self.eps, self.tied = name, list(layers), float(eps), tied
        self.target, self.max_seq, self.device = first.target, first.max_seq, first.device
        self.vocab, self.hidden, self._kernels = vocab, hidden, kernels
        self.kind = first.kind if first.kind in ("bf16", "f16") else "f32"
        self.head, self.embed, self.panels, self.norm = head, embed, panels, norm
        self.norm_bias, self.positions = norm_bias, positions
        self._lock = threading.Lock()
        self.stats = {}
        return self

    def _pack_head(self, w: torch.Tensor, nr: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The head's weight as the contraction reads it (packed once into f32 panels where the target does),
        and the panels as ``[P, D, R]`` for ``embed_panels`` (None: not packed)."""
        if not nr or w.dtype != torch.float32:
            return resident(w, self.device), None
        from arke.runtime.panels import pack_panels

        packed = pack_panels(w.contiguous(), nr)
        p = -(-self.vocab // nr)
        panels = torch.as_strided(packed, (p, self.hidden, nr), (self.hidden * nr, nr, 1))
        return packed, panels

    def __repr__(self) -> str:
        return (f"<{self.name} on {self.target}: {len(self.layers)} layers, hidden {self.hidden}, vocab {self.vocab}"
                f"{', tied head' if self.tied else ''}, max_seq {self.max_seq}>")

    @property
    def weight_bytes(self) -> int:
        """Bytes of every weight a decode step reads."""
        own = self.head.numel() * self.head.element_size() + self.norm.numel() * 4
        return own + sum(layer.weight_bytes for layer in self.layers)

    def new_cache(self, batch: int = 1) -> ModelCache:
        """Empty KV caches of every layer for ``batch`` sequences, ``max_seq`` tokens each."""
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise ValueError(f"batch must be a positive integer, not {batch!r}")
        try:
            return ModelCache(self, batch)
        except RuntimeError as err:  # torch's allocator: "can't allocate memory"
            if "allocate" not in str(err):
                raise
            raise self._error(f"the KV caches of {batch} sequence(s) of max_seq {self.max_seq} tokens do not fit in "
                              f"this machine's memory ({str(err).splitlines()[0][:160]}); load the model with a "
                              "smaller max_seq", "size", "max_seq") from None

    def _error(self, message: str, rule: str, param: str) -> GuardError:
        return GuardError(self.name, message, rule=rule, param=param)

    def check_ids(self, ids: Any, name: str = "ids") -> torch.Tensor:
        """``ids`` as an int64 ``[B, T]`` tensor of token ids in range (a list of lists is accepted)."""
        if isinstance(ids, list | tuple):
            ids = self._listed_ids(ids, name)
        elif isinstance(ids, np.ndarray) and ids.dtype.kind in "iu":  # a NumPy row of ids, as a list would be
            ids = torch.from_numpy(ids.astype(np.int64))
        if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int64, torch.int32):
            raise self._error(f"{name} must be an int64 tensor [batch, tokens] of token ids", "type", name)
        if ids.device.type == "meta":
            raise self._error(f"{name} is on the meta device, which holds no values: pass token ids on the CPU",
                              "device", name)
        if ids.dim() == 1:
            ids = ids[None]
        if ids.dim() != 2 or ids.shape[0] < 1 or ids.shape[1] < 1:
            raise self._error(f"{name} must be [batch, tokens] with at least one token, not {list(ids.shape)}",
                              "dim", name)
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.vocab:
            raise self._error(f"{name} must lie in [0, {self.vocab}) (the vocabulary), but range over [{lo}, {hi}]",
                              "index", name)
        return ids.to(torch.int64).contiguous()

    def _listed_ids(self, ids: list[Any] | tuple[Any, ...], name: str) -> torch.Tensor:
        """A list of ids, or of rows (lists or 1-D integer tensors) of one length, as a tensor: every id an integer
        (a float or a bool is refused, never truncated)."""
        def row(r: Any) -> list[int]:
            if isinstance(r, torch.Tensor | np.ndarray):
                t = torch.as_tensor(r)
                if t.dim() != 1 or t.dtype == torch.bool or t.dtype.is_floating_point or t.dtype.is_complex:
                    raise self._error(f"{name}: each row must be a 1-D tensor of integer ids, not {t.dtype} "
                                      f"{list(t.shape)}", "type", name)
                return [int(v) for v in t.tolist()]
            if not isinstance(r, list | tuple):
                raise self._error(f"{name} must be token ids [batch, tokens], not a list holding {r!r}", "type", name)
            bad = [v for v in r if isinstance(v, bool) or not isinstance(v, int | np.integer)]
            if bad:
                raise self._error(f"{name} must hold integer token ids, not {bad[0]!r}", "type", name)
            return [int(v) for v in r]

        nested = [isinstance(r, list | tuple | torch.Tensor | np.ndarray) for r in ids]
        if ids and all(nested):
            rows = [row(r) for r in ids]
            if len({len(r) for r in rows}) > 1:
                raise self._error(f"{name}: rows of different lengths ({', '.join(str(len(r)) for r in rows)}); "
                                  "generate takes them as a ragged batch, a forward pass needs one length", "dim",
                                  name)
            return torch.tensor(rows, dtype=torch.int64).reshape(len(rows), -1)
        if any(nested):
            raise self._error(f"{name} mixes token ids and rows of them", "type", name)
        return torch.tensor(row(list(ids)), dtype=torch.int64)

    def _check(self, ids: Any, cache: Any) -> torch.Tensor:
        ids = self.check_ids(ids)
        if not isinstance(cache, ModelCache) or cache.owner is not self:
            raise self._error("cache must come from this model's new_cache()", "type", "cache")
        b, t = ids.shape
        if cache.batch != b:
            raise self._error(f"the cache holds {cache.batch} sequences, but ids has {b}", "dim", "cache")
        if cache.length + t > self.max_seq:
            raise self._error(f"{t} tokens do not fit: the cache holds {cache.length} of {self.max_seq} (max_seq)",
                              "dim", "ids")
        return ids

    def __call__(self, ids: Any, cache: ModelCache, every_token: bool = False) -> torch.Tensor:
        with self._lock:
            ids = self._check(ids, cache)
            return self._run(ids, cache, every_token)

    def decode_step(self, ids: Any, cache: ModelCache) -> torch.Tensor:
        """The logits ``[B, V]`` of one step of generation (``ids``: ``[B, 1]``, appended to ``cache``), as
        ``model(ids, cache)`` gives them, but in a buffer the next step on this cache overwrites: one-token
        steps are recorded once and replayed (:mod:`arke.models.replay`)."""
        from arke.models.replay import decode

        with self._lock:
            return decode(self, self._check(ids, cache), cache)

    def _run(self, ids: torch.Tensor, cache: ModelCache, every_token: bool,
             positions: torch.Tensor | None = None) -> torch.Tensor:
        b, t = ids.shape
        start = cache.length
        if positions is None:
            positions = torch.arange(start, start + t, dtype=torch.int64, device=self.device).expand(b, t)
        x = self.embed_rows(ids.reshape(-1).to(self.device), positions.reshape(-1))
        x = x.view(b, t, self.hidden).to(self.layers[0].act_dtype)
        for layer, c in zip(self.layers, cache.layers):
            x = layer(x, positions, c)
        h = (x if every_token else x[:, -1:]).reshape(-1, self.hidden).to(torch.float32).contiguous()
        if (rec := recording()) is not None:  # a recorded decode step may copy nothing outside its kernels
            rec.check(h.data_ptr() == x.data_ptr(), "the last hidden rows are copied")
        logits = self.head_rows(h)
        return logits.view(b, t, self.vocab) if every_token else logits

    def embed_rows(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The embeddings ``[N, hidden]`` of tokens ``ids`` at ``positions`` (both int64 ``[N]``)."""
        if self.positions is not None:  # learned positions (GPT-2)
            if self.embed is None:
                return self.call("embed_pos_panels", ids, positions, self.panels, self.positions)
            return self.call("embed_pos", ids, positions, self.embed, self.positions)
        # tied and packed: the embeddings are the head's panels, read in place
        return self.call("embed_panels", ids, self.panels) if self.embed is None else self.call("embed", ids,
                                                                                                  self.embed)

    def head_rows(self, h: torch.Tensor) -> torch.Tensor:
        """The logits ``[N, vocab]`` of hidden rows ``h`` (f32 ``[N, hidden]``): the final norm and the head."""
        if self.norm_bias is not None:
            return self.call("head_ln", h, self.norm, self.norm_bias, self.head, self.eps)
        return self.call("head", h, self.norm, self.head, self.eps)

    def generate(self, input_ids: Any, max_new_tokens: int = 32, **options: Any) -> torch.Tensor:
        """The prompt followed by up to ``max_new_tokens`` generated tokens, ``[B, T + new]``; see
        :func:`arke.models.generate.generate` for the options (greedy by default)."""
        from arke.models.generate import generate

        return generate(self, input_ids, max_new_tokens, **options)

    def batch(self, blocks: int | None = None, block_size: int = 16) -> Any:
        """A running batch over a paged KV cache of ``blocks`` blocks of ``block_size`` slots
        (:class:`arke.models.batch.Batch`): sequences of any lengths join and leave between steps."""
        from arke.models.batch import Batch

        return Batch(self, blocks, block_size)

    def stream(self, input_ids: Any, max_new_tokens: int = 32, **options: Any) -> Iterator[torch.Tensor]:
        """Each step's new tokens (``[B]``) as they are generated; options as :meth:`generate`."""
        from arke.models.generate import stream

        return stream(self, input_ids, max_new_tokens, **options)

    def save_bundle(self, path: Any) -> Any:
        """Save this model to run without the compiler (:func:`arke.models.bundle.save_bundle`); the folder's path."""
        from arke.models.bundle import save_bundle

        return save_bundle(self, path)

    def call(self, name: str, *args: Any) -> Any:
        """Run one of the model's own kernels (std.lm, std.nn; a generic one picks its weights' dtype), its
        results as torch tensors on the model's device."""
        got = counted(recording(), name, lambda: self._kernels[name](*args))
        if isinstance(got, tuple):
            return tuple(torch.as_tensor(g, device=self.device) for g in got)
        return torch.as_tensor(got, device=self.device)
