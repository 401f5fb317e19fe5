"""Weights packed once into the contraction kernels' panels (``arke.targets.llvm.kernel.pack_panels``)."""

from __future__ import annotations

import pytest
import torch
from codegen_support import assert_conforms

import arke
from arke.targets.llvm.jit import host_panel_width
from arke.targets.llvm.panels import pack_panels

NR = host_panel_width()


MODULE = arke.loads("import std.nn\nimport std.decoder\n", "<panels>")


@pytest.fixture(scope="module")
def lib() -> object:
    return arke.build(MODULE)


@pytest.mark.parametrize(("n", "k"), [(1, 1), (100, 37), (NR * 3, 513), (257, 2048)])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 130])
def test_linear_reads_prepacked_panels(lib: object, m: int, n: int, k: int) -> None:
    """Decode streams the panels, the micro-kernel reads them in place: the result is the linear layer's."""
    g = torch.Generator().manual_seed(n * 1000 + k + m)
    w, x = torch.randn(n, k, generator=g), torch.randn(m, k, generator=g)
    packed = pack_panels(w, NR)
    assert packed.shape == w.shape
    if n > 1 and k > 1:  # the view's elements are in panel order, not row order
        assert not torch.equal(packed, w)
    got, plain = lib.linear(x, packed), lib.linear(x, w)  # type: ignore[attr-defined]
    if m >= 4:  # the same blocks in the same order, only without packing
        assert torch.equal(got, plain)
    assert_conforms(got, MODULE.kernels["linear"], x, w)


@pytest.mark.parametrize("mr", [1, 2, 3])
@pytest.mark.parametrize("m", [1, 2, 3, 5])
def test_register_blocks_of_few_rows_read_panels(mr: int, m: int) -> None:
    """A strategy's register block of fewer rows than decode's panel dots write (``tile`` on the rows): the
    sum tile still holds those rows (it once overflowed the scratch at M = 1 and 2 and corrupted the heap)."""
    src = f"""kernel lin(x: f32[M, K], w: f32[N, K]) -> f32[M, N] {{
  return sum(x[m, k] * w[n, k] for k)
}}
@strategy(lin) {{ tile m = {mr} }}
"""
    module = arke.loads(src, "<few rows>")
    kernel = arke.build(module, tuning="off").kernels["lin"]
    g = torch.Generator().manual_seed(mr * 10 + m)
    x, w = torch.randn(m, 64, generator=g), torch.randn(3 * NR - 5, 64, generator=g)
    for _ in range(3):  # a heap overflow shows by the later calls, if not the first
        got = kernel(x, pack_panels(w, NR))
    assert_conforms(got, module.kernels["lin"], x, w)


def test_epilogues_and_prologues_with_panels(lib: object) -> None:
    """attn_out (residual epilogue) and mlp (norm prologue, two panels halves of one matrix) on panels."""
    g = torch.Generator().manual_seed(7)
    d, f = 40, 2 * NR
    o, wo, x = torch.randn(3, 70, generator=g), torch.randn(d, 70, generator=g), torch.randn(3, d, generator=g)
    # decode sums panels in k order, the dot products in lanes: the interpreter's answer within the rule
    assert_conforms(lib.attn_out(o, pack_panels(wo, NR), x), MODULE.kernels["attn_out"], o, wo, x)  # type: ignore[attr-defined]
    h, wn = torch.randn(2, d, generator=g), torch.rand(d, generator=g)
    gu, wd = torch.randn(2 * f, d, generator=g), torch.randn(d, f, generator=g)
    packed = pack_panels(gu, NR)
    from arke.targets.llvm.panels import register_panels

    gate, up = packed[:f], packed[f:]
    register_panels(gate, NR)
    register_panels(up, NR)
    got = lib.mlp(h, wn, gate, up, pack_panels(wd, NR))  # type: ignore[attr-defined]
    assert_conforms(got, MODULE.kernels["mlp"], h, wn, gu[:f], gu[f:], wd)


def test_a_dispatch_that_cannot_read_panels_refuses(lib: object) -> None:
    """Panels are not in [N, K] order: handing them to anything but a panel-reading contraction is an error."""
    packed = pack_panels(torch.randn(100, 37), NR)
    with pytest.raises(RuntimeError, match="prepacked panels"):
        lib.matmul(torch.randn(2, 100), packed)  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="prepacked panels"):
        lib.relu(packed)  # type: ignore[attr-defined]
