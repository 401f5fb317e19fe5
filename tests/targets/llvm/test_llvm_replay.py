"""A CPU kernel's launches prepared once per set of buffers and replayed (arke.targets.llvm.replay): the same
results whichever buffers a call brings, in any order, and a weight packed into panels after a call is read
as panels by the next."""

from __future__ import annotations

import gc

import pytest
import torch

import arke
from arke.runtime import panels
from arke.targets.llvm.jit import host_panel_width
from arke.targets.llvm.panels import register_panels


@pytest.fixture(scope="module")
def lib() -> arke.Library:
    return arke.build(arke.loads("import std.nn\n"), threads=2)


def _programs(lib: arke.Library, name: str) -> int:
    kernel = getattr(lib, name).variant(-1)
    return sum(len(s.programs) for s in kernel._sized.values())


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_buffers_in_any_order_give_the_same_results(lib: arke.Library, threads: int) -> None:
    g = torch.Generator().manual_seed(threads)
    xs = [torch.randn(5, 777, generator=g) for _ in range(3)]
    outs = [torch.empty(5, 777) for _ in range(3)]
    want = [torch.softmax(x, dim=-1) for x in xs]
    for k in (0, 1, 2, 1, 0, 2, 2):
        outs[k].fill_(float("nan"))
        lib.softmax(xs[k], out=outs[k], threads=threads)
        torch.testing.assert_close(outs[k], want[k])
        assert torch.equal(outs[k], lib.softmax(xs[k], threads=threads))
    assert _programs(lib, "softmax") >= 3  # one per (input, output) pair, each built once


def test_a_weight_registered_as_panels_after_a_call_is_read_as_panels(lib: arke.Library) -> None:
    nr = host_panel_width()
    x, w = torch.randn(2, 64), torch.randn(nr, 64)
    plain = lib.linear(x, w)
    torch.testing.assert_close(plain, x @ w.T, rtol=1e-5, atol=1e-5)
    before = panels.generation()
    # w's own storage rewritten in panel order ([1][K][nr]) and declared so: the same matrix, read as panels
    w.copy_(w.clone().T.contiguous().view(nr, 64))
    register_panels(w, nr)
    assert panels.generation() > before
    torch.testing.assert_close(lib.linear(x, w), plain, rtol=1e-5, atol=1e-5)
    before = panels.generation()
    del w
    gc.collect()
    assert panels.generation() > before  # a view that dies changes what a pointer may hold
