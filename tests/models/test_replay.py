"""Decode steps recorded and replayed (arke.models.replay): bit-identical to the usual path step after step,
for every replayable architecture and batches of several sequences; recorded again when the settings or the
cache change; the usual path wherever a step cannot be replayed."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch
from test_causal_lm import VOCAB, loaded, prompt

from arke.models.replay import unreplayable

REPLAYED = ("llama", "mistral", "gpt2")  # a Llama-family layer (Mistral: its sliding window), GPT-2's layer


def _twins(lm, batch: int = 2, length: int = 9):  # type: ignore[no-untyped-def]
    """Two caches holding the same prompt, and the first token after it."""
    ids = torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(3))
    usual, replayed = lm.new_cache(batch), lm.new_cache(batch)
    logits = lm(ids, usual)
    assert torch.equal(logits, lm(ids, replayed))
    return usual, replayed, logits.argmax(-1)


@pytest.mark.parametrize("arch", REPLAYED)
def test_replayed_steps_are_the_usual_steps_bit_for_bit(arch: str) -> None:
    lm = loaded(arch)
    assert unreplayable(lm) is None
    usual, replayed, token = _twins(lm)
    for _ in range(8):  # past Mistral's window of 5
        want = lm(token[:, None], usual)
        got = lm.decode_step(token[:, None], replayed)
        assert torch.equal(got, want)
        assert replayed.graph.recording is not None, replayed.graph.failed
        token = want.argmax(-1)
    assert replayed.length == usual.length
    for a, b in zip(usual.layers, replayed.layers):
        assert torch.equal(a.k[:, :, :usual.length], b.k[:, :, :usual.length])
        assert torch.equal(a.v[:, :, :usual.length], b.v[:, :, :usual.length])


def test_a_step_is_recorded_again_for_another_cache_or_thread_count() -> None:
    lm = loaded("llama")
    usual, replayed, token = _twins(lm)
    _, other, other_token = _twins(lm, batch=1)
    threads = torch.get_num_threads()
    try:
        for k in range(6):
            if k == 3:
                torch.set_num_threads(1)  # the recorded launches assumed the old count
            want = lm(token[:, None], usual)
            got = lm.decode_step(token[:, None], replayed)
            assert torch.equal(got, want)
            lm.decode_step(other_token[:, None], other)  # alternating caches: each step recorded anew
            token = want.argmax(-1)
    finally:
        torch.set_num_threads(threads)


def test_steps_that_cannot_be_replayed_run_the_usual_path(monkeypatch: pytest.MonkeyPatch) -> None:
    mixtral = loaded("mixtral")
    assert unreplayable(mixtral) == "mixture-of-experts layers"
    monkeypatch.setenv("ARKE_NO_REPLAY", "1")
    assert unreplayable(loaded("gpt2")) == "ARKE_NO_REPLAY is set"
    monkeypatch.delenv("ARKE_NO_REPLAY")
    monkeypatch.setenv("ARKE_NO_TEAM", "1")  # launches on a thread pool: prepared as they run, not recorded
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # one thread runs no pool (and records): an earlier test may have left torch at 1
    try:
        for lm in (mixtral, loaded("gpt2")):
            usual, replayed, token = _twins(lm)
            for _ in range(3):
                want = lm(token[:, None], usual)
                assert torch.equal(lm.decode_step(token[:, None], replayed), want)
                token = want.argmax(-1)
    finally:
        torch.set_num_threads(threads)
    assert replayed.graph.recording is None and "one by one" in replayed.graph.failed


def test_generation_from_several_threads_matches_one_at_a_time() -> None:
    lm = loaded("gpt2")
    prompts = [prompt(5 + k, seed=k) for k in range(3)]
    want = [lm.generate(p, 12) for p in prompts]
    got: list[torch.Tensor | None] = [None] * 3

    def run(k: int) -> None:
        got[k] = lm.generate(prompts[k], 12)
    workers = [threading.Thread(target=run, args=(k,)) for k in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for g, w in zip(got, want):
        assert g is not None and torch.equal(g, w)


def test_a_step_that_does_not_fit_is_refused_before_anything_runs() -> None:
    lm = loaded("gpt2")
    cache = lm.new_cache(1)
    lm(prompt(lm.max_seq - 1), cache)
    token = torch.tensor([[1]])
    lm.decode_step(token, cache)  # the last slot: recorded
    k = cache.layers[0].k.clone()
    with pytest.raises(Exception, match="do not fit"):
        lm.decode_step(token, cache)
    assert cache.length == lm.max_seq and torch.equal(cache.layers[0].k, k)


def _batch_script(lm) -> tuple[list[dict[int, int]], object]:  # type: ignore[no-untyped-def]
    """Sequences joining, decoding, leaving and finishing over a paged cache: each step's tokens."""
    batch = lm.batch(blocks=48, block_size=4)  # small blocks: the block tables widen as sequences grow
    g = torch.Generator().manual_seed(7)
    for n in (5, 9, 3):
        batch.add(torch.randint(0, VOCAB, (n,), generator=g).tolist(), 14)
    steps = [batch.step() for _ in range(5)]
    batch.add(torch.randint(0, VOCAB, (6,), generator=g).tolist(), 6)  # joins a running batch
    steps += [batch.step() for _ in range(3)]
    batch.remove(batch.active[1])  # leaves
    while batch.active:
        steps.append(batch.step())
    return steps, batch


@pytest.mark.parametrize("arch", REPLAYED)
def test_batched_decode_steps_replayed_equal_the_usual_path(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    lm = loaded(arch)
    got, batch = _batch_script(lm)
    assert batch._graph is not None and batch._graph.failed is None  # type: ignore[attr-defined]
    monkeypatch.setenv("ARKE_NO_REPLAY", "1")
    want, batch = _batch_script(lm)
    assert batch._graph is None  # type: ignore[attr-defined]
    assert got == want


def test_a_recorded_step_lives_as_long_as_its_cache() -> None:
    lm = loaded("gpt2")
    _, cache, token = _twins(lm)
    lm.decode_step(token[:, None], cache)
    assert cache.graph.recording is not None
    keys = weakref.ref(cache.layers[0].k)
    del cache
    gc.collect()
    assert keys() is None  # the recording pinned nothing of the cache once the cache is gone
