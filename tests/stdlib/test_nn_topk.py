"""Top-k kernels on the reference interpreter against torch: ``topk50`` (top-k sampling's
candidates) against torch.topk, and ``route_top2`` (Mixtral routing) against softmax over
torch.topk's two values; tied logits against a stable sort (the lower id first)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from codegen_support import std_module, text_module
from topk_support import TOPK50

from arke.runtime.guards import GuardError


@pytest.mark.parametrize("shape", [(3, 4097), (2, 50), (1, 32000)])
def test_topk50(shape: tuple[int, int], rng: np.random.Generator) -> None:
    logits = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    v, ids = text_module(TOPK50).kernels["topk50"](logits)
    want = torch.topk(logits, 50, dim=-1)
    assert torch.equal(ids, want.indices) and torch.equal(v, want.values)


def test_topk50_ties_and_short_rows() -> None:
    logits = torch.arange(60, dtype=torch.float32).remainder(3).reshape(1, 60)
    v, ids = text_module(TOPK50).kernels["topk50"](logits)
    want = torch.sort(logits, descending=True, stable=True)
    assert torch.equal(ids, want.indices[:, :50]) and torch.equal(v, want.values[:, :50])
    with pytest.raises(GuardError, match="50 <= V"):
        text_module(TOPK50).kernels["topk50"](torch.zeros(2, 49))


@pytest.mark.parametrize("shape", [(64, 8), (3, 2), (5, 64)])
def test_route_top2(shape: tuple[int, int], rng: np.random.Generator) -> None:
    logits = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    w, expert = std_module("std.nn").kernels["route_top2"](logits)
    top = torch.topk(logits, 2, dim=-1)
    assert torch.equal(expert, top.indices)
    torch.testing.assert_close(w, torch.softmax(top.values, dim=-1))
    torch.testing.assert_close(w, torch.softmax(logits, -1).gather(1, expert) /
                               torch.softmax(logits, -1).gather(1, expert).sum(-1, keepdim=True))


def test_route_top2_ties() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    w, expert = std_module("std.nn").kernels["route_top2"](logits)
    assert expert.tolist() == [[1, 2], [0, 1]]
    torch.testing.assert_close(w, torch.full((2, 2), 0.5))
