"""Text generation with a :class:`~arke.models.lm.CausalLM`: greedy decoding and sampling.

Every step runs Arke kernels only: the model's forward pass, then ``std.nn.greedy`` (the argmax), or
``std.lm.candidates`` (the repetition penalty and each row's 64 best tokens) and ``std.lm.pick``
(temperature, top-k, top-p and the draw), or with ``top_k=0`` ``std.lm.sample_all`` (the draw from every
token). The draws are uniform numbers from a ``torch.Generator``
seeded with ``seed``, one per sequence and step, so a seed reproduces a generation exactly.

The options follow transformers' ``generate``: ``do_sample``, ``temperature``, ``top_k`` (at most 64; 0: no
limit, every token, where ``top_p`` is 1), ``top_p``, ``repetition_penalty``, ``eos_token_id`` (one id or
several: a sequence that produced one is finished, and is padded with ``pad_token_id`` while the others go
on). Greedy decoding ignores the sampling options, as transformers does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from arke.models.lm import CausalLM

#: The candidates sampling draws from (``std.lm.candidates``' literal K).
CANDIDATES = 64


@dataclass(frozen=True)
class Sampling:
    """How each next token is chosen (checked once, before the prompt runs): build it with :meth:`of`."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    eos: tuple[int, ...] = ()
    pad: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.do_sample, bool):
            raise ValueError(f"do_sample must be True or False, not {self.do_sample!r}")
        if self.do_sample:  # greedy decoding ignores the sampling options, as transformers does
            self._check_sampling()
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be positive, not {self.repetition_penalty!r}")
        if self.seed is not None and not 0 <= self.seed < 2 ** 64:
            raise ValueError(f"seed must be an integer in [0, 2**64), not {self.seed!r}")

    def _check_sampling(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be positive, not {self.temperature!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be a non-negative integer (0: no limit), not {self.top_k!r}")
        if self.top_k > CANDIDATES:
            raise ValueError(f"top_k is at most {CANDIDATES} (the candidates sampling draws from), not {self.top_k}; "
                             "top_k=0 samples from the whole vocabulary")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], not {self.top_p!r}")

    def whole_vocabulary(self, vocab: int) -> bool:
        """Whether a sample draws from every token (``top_k=0`` over more than the candidates)."""
        return self.do_sample and self.top_k == 0 and vocab > CANDIDATES

    @classmethod
    def of(cls, vocab: int, do_sample: Any = False, temperature: Any = 1.0, top_k: Any = 50, top_p: Any = 1.0,
           repetition_penalty: Any = 1.0, eos_token_id: Any = None, pad_token_id: Any = None,
           seed: Any = None) -> Sampling:
        """The options as ``generate`` takes them (None: the default, as in transformers), each checked by name."""
        eos = _ids(eos_token_id, vocab, "eos_token_id")
        pad = _ids(pad_token_id, vocab, "pad_token_id")
        top = _whole(top_k, "top_k", 50)
        assert top is not None
        how = cls(do_sample, _number(temperature, "temperature", 1.0), top,
                  _number(top_p, "top_p", 1.0), _number(repetition_penalty, "repetition_penalty", 1.0), eos,
                  pad[0] if pad else (eos[0] if eos else None), _whole(seed, "seed", None))
        if how.whole_vocabulary(vocab) and how.top_p < 1:
            # the nucleus would need every token sorted (the candidates are the 64 best): refused, never
            # silently drawn from a smaller set than transformers draws from
            raise ValueError(f"top_p={how.top_p} with top_k=0 (no limit) is not supported over a vocabulary of "
                             f"{vocab} tokens: give top_k from 1 to {CANDIDATES} (top_p then applies within them), or "
                             "top_p=1.0 to sample from every token")
        return how


def _scalar(value: Any) -> Any:
    """A NumPy scalar or a one-element torch tensor as a Python number (anything else as it is)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dim() <= 1:
        return value.item()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _number(value: Any, name: str, default: float) -> float:
    value = _scalar(value)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, not {value!r}")
    return float(value)


def _whole(value: Any, name: str, default: int | None) -> int | None:
    value = _scalar(value)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, not {value!r}")
    return value


def _ids(value: Any, vocab: int, name: str) -> tuple[int, ...]:
    """Token ids given as one id or several (ints, NumPy integers, an integer tensor); () for None."""
    if value is None:
        return ()
    if isinstance(value, torch.Tensor | np.ndarray):
        t = torch.as_tensor(value)
        if t.dtype == torch.bool or t.dtype.is_floating_point or t.dtype.is_complex:
            raise ValueError(f"{name} must be token ids in [0, {vocab}), not a {t.dtype} tensor")
        value = t.reshape(-1).tolist()
    value = _scalar(value)
    ids = (value,) if isinstance(value, int) else tuple(_scalar(v) for v in value) \
        if isinstance(value, list | tuple) else None
    if ids is None:
        raise ValueError(f"{name} must be a token id or a list of them, not {value!r}")
    bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab]
    if bad:
        raise ValueError(f"{name} must be token ids in [0, {vocab}), not {bad[0]!r}")
    return ids


def stream(model: CausalLM, input_ids: Any, max_new_tokens: int = 32, *, do_sample: bool = False,
           temperature: float = 1.0, top_k: int = 50, top_p: float = 1.0, repetition_penalty: float = 1.0,
           eos_token_id: int | Sequence[int] | None = None, pad_token_id: int | None = None,
           seed: int | None = None) -> Iterator[torch.Tensor]:
    """Each step's next tokens (int64 ``[B]``) as they are chosen; see the module docstring for the options.
    Everything is checked before the prompt runs; the throughput of the run is left in ``model.stats``."""
    ids = model.check_ids(input_ids, "input_ids")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, not {max_new_tokens!r}")
    t = ids.shape[1]
    if t + max_new_tokens > model.max_seq:
        raise ValueError(f"the prompt's {t} tokens and {max_new_tokens} new ones do not fit in max_seq "
                         f"{model.max_seq}: pass fewer, or load the model with a larger max_seq")
    how = Sampling.of(model.vocab, do_sample, temperature, top_k, top_p, repetition_penalty, eos_token_id,
                      pad_token_id, seed)
    return _steps(model, ids, max_new_tokens, how)


def _steps(model: CausalLM, ids: torch.Tensor, new: int, how: Sampling) -> Iterator[torch.Tensor]:
    b, t = ids.shape
    cache = model.new_cache(b)
    choose = _Chooser(model, ids, how)
    done = torch.zeros(b, dtype=torch.bool)
    model.stats = {}
    if new == 0:
        return
    start = time.perf_counter()
    logits = model(ids, cache)
    prefill = time.perf_counter() - start  # the forward pass (the first choice may load its kernels)
    token = choose(logits)
    model.stats.update(prefill_tokens=b * t, prefill_s=prefill, prefill_tok_s=b * t / prefill)
    decode_start, steps = time.perf_counter(), 0
    for k in range(new):
        if how.pad is not None:
            token = torch.where(done, torch.tensor(how.pad), token)
        if how.eos:
            done |= torch.isin(token, torch.tensor(how.eos))
        yield token
        if k == new - 1 or bool(done.all()):
            break
        logits = model.decode_step(token[:, None], cache)
        token = choose(logits)
        steps += 1
    if steps:
        spent = time.perf_counter() - decode_start
        model.stats.update(decode_steps=steps, decode_s=spent, decode_tok_s=b * steps / spent)


class _Chooser:
    """The next token of each row from its logits: greedy or sampled, with the repetition penalty over the
    tokens each sequence has seen (its prompt and what it generated)."""

    def __init__(self, model: CausalLM, ids: torch.Tensor, how: Sampling):
        self.model, self.how = model, how
        b = ids.shape[0]
        self.penalised = how.repetition_penalty != 1.0
        self.seen = torch.zeros(b, model.vocab, dtype=torch.bool, device=model.device)
        self.seen.scatter_(1, ids.to(model.device), True)
        self.generator = torch.Generator()
        if how.seed is None:
            self.generator.seed()  # a fresh, nondeterministic seed
        else:
            self.generator.manual_seed(how.seed)
        self.slots = None if model.vocab >= CANDIDATES else torch.zeros(model.vocab, dtype=torch.int64)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        how, call = self.how, self.model.call
        if not how.do_sample and not self.penalised:
            token = call("greedy", logits)
        elif how.whole_vocabulary(self.model.vocab):  # top_k=0: no limit, every token may be drawn
            u = torch.rand(logits.shape[0], generator=self.generator).to(self.model.device)
            token = call("sample_all", logits, self.seen, u, how.repetition_penalty, how.temperature)
        else:
            if self.slots is None:
                c, ids = call("candidates", logits, self.seen, how.repetition_penalty)
            else:
                c, ids = call("candidates_k", logits, self.seen, self.slots, how.repetition_penalty)
            if how.do_sample:
                u = torch.rand(logits.shape[0], generator=self.generator).to(self.model.device)
                k = how.top_k or c.shape[1]
                token = call("pick", c, ids, u, how.temperature, k, how.top_p)
            else:
                token = ids[:, 0]
        token = token.to(torch.int64).cpu()
        self.seen.scatter_(1, token[:, None].to(self.model.device), True)
        return token


def _ragged(input_ids: Any) -> bool:
    """Whether ``input_ids`` is a list of prompts of different lengths."""
    return (isinstance(input_ids, list | tuple) and bool(input_ids)
            and all(isinstance(p, list | tuple | torch.Tensor | np.ndarray) for p in input_ids)
            and len({len(p) for p in input_ids}) > 1)


def generate(model: CausalLM, input_ids: Any, max_new_tokens: int = 32, **options: Any) -> Any:
    """The prompt followed by the generated tokens, int64 ``[B, T + new]`` (fewer when every sequence met an
    end-of-sequence token); options as :func:`stream`.

    Prompts of different lengths (a list of lists) run as one batch over a paged KV cache
    (:class:`arke.models.batch.Batch`); each comes back as its own 1-D tensor, prompt then new tokens."""
    if _ragged(input_ids):
        options.pop("pad_token_id", None)  # nothing is padded: each sequence stops on its own
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative integer, not {max_new_tokens!r}")
        checked = [model.check_ids(p, "input_ids") for p in input_ids]
        if any(c.shape[0] != 1 for c in checked):
            raise ValueError("input_ids: each prompt of a ragged batch is one sequence (a list or a 1-D tensor of "
                             "ids), not a batch of them")
        prompts = [c[0] for c in checked]
        if max_new_tokens == 0:
            return prompts
        blocks = sum(-(-(len(p) + max_new_tokens) // 16) for p in prompts)
        batch = model.batch(blocks=max(1, blocks), block_size=16)
        order = [batch.add(p, max_new_tokens, **options) for p in prompts]
        done = batch.run()
        return [torch.cat([p, torch.tensor(done[s], dtype=torch.int64)]) for p, s in zip(prompts, order)]
    ids = model.check_ids(input_ids, "input_ids").cpu()
    steps = list(stream(model, ids, max_new_tokens, **options))
    if not steps:
        return ids
    return torch.cat([ids, torch.stack(steps, dim=1)], dim=1)
