"""Hostile calls of a decoder layer (issue 16): two threads filling one KV cache, tensors a layer cannot read.

The layer runs on the reference interpreter (``target="reference"``): the same plan, checks and
cache handling as a compiled layer, without compiling anything.
"""

from __future__ import annotations

import threading
from functools import cache

import pytest
import torch

from arke.models.config import KVCache, LayerConfig
from arke.models.layer import REFERENCE, CompiledLayer
from arke.runtime.errors import GuardError

HIDDEN, TOKENS, MAX_SEQ = 16, 12, 16  # one call of 12 tokens fits the cache, two do not


@cache
def _layer() -> CompiledLayer:
    config = LayerConfig(hidden=HIDDEN, heads=2, kv_heads=1, head_dim=8, intermediate=24, eps=1e-5,
                         inv_freq=tuple(10000.0 ** (-k / 4) for k in range(4)))
    gen = torch.Generator().manual_seed(0)
    shapes = {"input_norm": (16,), "post_norm": (16,), "q": (16, 16), "k": (8, 16), "v": (8, 16), "o": (16, 16),
              "gate": (24, 16), "up": (24, 16), "down": (16, 24)}
    weights = {name: torch.randn(shape, generator=gen) * 0.2 for name, shape in shapes.items()}
    return CompiledLayer(config, weights, target=REFERENCE, max_seq=MAX_SEQ)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(1, TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1))
    return x, torch.arange(TOKENS)[None].contiguous()


def _race(layer: CompiledLayer, x: torch.Tensor, positions: torch.Tensor) -> tuple[list[object], KVCache]:
    """Two threads calling ``layer`` on one new cache at once: what each got (a result or an error), the cache."""
    cache = layer.new_cache()
    start = threading.Barrier(2)
    results: list[object] = []

    def call() -> None:
        start.wait()
        try:
            results.append(layer(x, positions, cache))
        except Exception as err:  # the loser's error, looked at by the test
            results.append(err)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results, cache


def test_two_threads_filling_one_cache_get_a_result_and_a_guard_error() -> None:
    layer = _layer()
    x, positions = _inputs()
    want = layer(x, positions, layer.new_cache())
    for _ in range(5):
        results, cache = _race(layer, x, positions)
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(results) == 2 and len(errors) == 1, results
        err = errors[0]
        assert isinstance(err, GuardError) and err.param == "cache", repr(err)
        assert f"free slots of {MAX_SEQ}" in str(err)
        assert cache.length == TOKENS  # the winner's tokens, nothing of the loser's
        winner = next(r for r in results if isinstance(r, torch.Tensor))
        torch.testing.assert_close(winner, want, rtol=0, atol=0)


@pytest.mark.parametrize("case", ["meta positions", "meta x", "sparse x", "sparse positions"])
def test_a_tensor_the_layer_cannot_read_is_a_guard_error(case: str) -> None:
    layer = _layer()
    x, positions = _inputs()
    what, name = case.split()
    bad = {"meta": lambda t: t.to("meta"), "sparse": lambda t: t.to_sparse()}[what]
    if name == "x":
        x = bad(x)
    else:
        positions = bad(positions)
    cache = layer.new_cache()
    with pytest.raises(GuardError) as err:
        layer(x, positions, cache)
    assert err.value.param == name and str(err.value).startswith(f"kernel `{layer.name}`: {name} is ")
    assert cache.length == 0
