"""Sums over several reduce axes (batch-reduce contractions on llvm, the generic loop nest where a
target does not offer the form: spec/codegen.md §2) on every runnable target, against the
interpreter by the one tolerance rule.

Two and three reduce axes, with epilogues, batch axes, an outer axis read through ``e / R`` (in
place or through a prologue), prologues on either side, bf16 and int8 operands cast to f32, and
ragged extents (4097 along k and along n, 3 rows, which llvm runs as dot products). ``*_small``
kernels carry small tiles (``tile m = 3, n = 64, k = 40`` on their rows, columns and depth) so
modest shapes cross every block boundary on llvm; the llvm cases also check that the thread count
never changes a result and that prepacked weight panels (decode and the micro-kernel) give the
same sums.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from codegen_support import RUNNABLE, as_dtype, assert_conforms, build, same_bits, seeded, text_module

from arke.ir.dtypes import DType

BODIES = {
    "moe_down": ("(h: f32[E, T, F], wd: f32[E, D, F], b: f32[D]) -> f32[T, D]",
                 "silu(sum(h[e, t, f] * wd[e, d, f] for e, f) + b[d])"),
    "three": ("(x: f32[B, M, I, J, C], w: f32[B, I, J, N, C]) -> f32[B, M, N]",
              "sum(x[b, m, i, j, c] * w[b, i, j, n, c] for i, j, c) * 0.5"),
    "kn": ("(h: f32[E, T, F], w: f32[E, F, D]) -> f32[T, D]", "sum(h[e, t, f] * w[e, f, d] for e, f)"),
    "shifted": ("(x: f32[M, C, J], w: f32[N, C, J]) -> f32[M, N]",
                "sum(x[m, c, j] * w[n, c, (j + 1) % J] for c, j)"),
    "prologues": ("(h: f32[E, T, F], w: i8[E, D, F], s: f32[E, D]) -> f32[T, D]",
                  "sum(silu(h[e, t, f]) * (f32(w[e, d, f]) * s[e, d]) for e, f)"),
    "narrow": ("(h: bf16[E, T, F], w: i8[E, F, D]) -> f32[T, D]", "sum(f32(h[e, t, f]) * f32(w[e, f, d]) for e, f)"),
    "shared_w": ("(h: f32[E, T, F], w: f32[D, F]) -> f32[T, D]", "sum(h[e, t, f] * w[d, f] for e, f)"),
}
GROUPED = """
kernel grouped(h: f32[G, T, F], wd: f32[E, D, F], g: f32[T, E]) -> f32[T, D] where E % G == 0 {
  let R = E / G
  return sum(h[e / R, t, f] * g[t, e] * wd[e, d, f] for e, f)
}
kernel grouped_plain(h: f32[G, T, F], wd: f32[E, D, F]) -> f32[T, D] where E % G == 0 {
  let R = E / G
  return sum(h[e / R, t, f] * wd[e, d, f] for e, f)
}
"""
#: kernel -> its (m, n, k) indices, for the small-tile variant
SMALL = {"moe_down": "t d f", "three": "m n c", "kn": "t d f", "prologues": "t d f", "narrow": "t d f",
         "shared_w": "t d f"}


def _source() -> str:
    out = [f"kernel {n}{sig} {{ return {body} }}" for n, (sig, body) in BODIES.items()]
    for n, axes in SMALL.items():
        m, cols, k = axes.split()
        out.append(f"kernel {n}_small{BODIES[n][0]} {{ return {BODIES[n][1]} }}")
        out.append(f"@strategy({n}_small, target = llvm) {{ tile {m} = 3, {cols} = 64, {k} = 40 }}")
    return "\n".join(out) + GROUPED


SOURCE = _source()
RUN = pytest.mark.parametrize("target", RUNNABLE)


def _inputs(name: str, dims: dict[str, int]) -> list[Any]:
    """Random operands of kernel ``name`` for ``dims`` (int8 weights small, bf16 rounded)."""
    rng = seeded(name, sorted(dims.items()))
    out: list[Any] = []
    for p in text_module(SOURCE).kernels[name].function.params:
        shape = tuple(dims[str(d)] for d in p.type.shape)
        if p.type.dtype is DType.I8:
            out.append(rng.integers(-127, 128, shape).astype(np.int8))
        else:
            out.append(as_dtype(rng.standard_normal(shape) * 0.5, p.type.dtype))  # silu's exp stays finite
    return out


CASES = [
    ("moe_down", {"E": 3, "T": 5, "F": 37, "D": 33}),
    ("moe_down", {"E": 2, "T": 3, "F": 4097, "D": 3}),  # a long k, few rows (dot products on llvm)
    ("moe_down", {"E": 2, "T": 3, "F": 5, "D": 4097}),  # many columns: a ragged last slab and panel
    ("three", {"B": 2, "M": 5, "I": 2, "J": 3, "C": 17, "N": 33}),
    ("three", {"B": 1, "M": 3, "I": 3, "J": 1, "C": 3, "N": 3}),
    ("kn", {"E": 3, "T": 9, "F": 45, "D": 70}),
    ("shifted", {"M": 6, "C": 11, "J": 3, "N": 19}),
    ("prologues", {"E": 2, "T": 7, "F": 41, "D": 33}),
    ("prologues", {"E": 3, "T": 2, "F": 19, "D": 17}),
    ("narrow", {"E": 3, "T": 6, "F": 43, "D": 21}),
    ("grouped", {"G": 2, "E": 4, "T": 5, "F": 29, "D": 18}),
    ("grouped_plain", {"G": 2, "E": 4, "T": 5, "F": 29, "D": 18}),
    ("grouped_plain", {"G": 3, "E": 3, "T": 2, "F": 33, "D": 7}),
    ("shared_w", {"E": 3, "T": 4, "F": 33, "D": 40}),
]


@RUN
@pytest.mark.parametrize("small", [False, True], ids=["default-tiles", "small-tiles"])
@pytest.mark.parametrize(("name", "dims"), CASES, ids=lambda v: v if isinstance(v, str) else
                         ",".join(f"{k}={n}" for k, n in v.items()))
def test_sums_over_several_axes_match_the_interpreter(target: str, small: bool, name: str,
                                                      dims: dict[str, int]) -> None:
    if small and (name not in SMALL or target != "llvm"):
        pytest.skip("no small-tile variant" if name not in SMALL else "the tiles are llvm's: the same kernel elsewhere")
    kernel = f"{name}_small" if small else name
    args = _inputs(kernel, dims)
    got = build(text_module(SOURCE), target).kernels[kernel](*args)
    assert_conforms(got, text_module(SOURCE).kernels[kernel], *args, what=f"{target} {kernel}")


@pytest.mark.skipif("llvm" not in RUNNABLE, reason="llvm cannot run here")
@pytest.mark.parametrize(("name", "dims"), [("moe_down_small", {"E": 3, "T": 7, "F": 90, "D": 130}),
                                            ("moe_down", {"E": 2, "T": 3, "F": 70, "D": 40})])
def test_thread_count_never_changes_the_sums(name: str, dims: dict[str, int]) -> None:
    compiled = build(text_module(SOURCE), "llvm").kernels[name]
    args = _inputs(name, dims)
    one = compiled(*args, threads=1)
    for n in (2, 3):
        assert same_bits(compiled(*args, threads=n), one), f"{name}: {n} threads differ from 1"


@pytest.mark.skipif("llvm" not in RUNNABLE, reason="llvm cannot run here")
@pytest.mark.parametrize("name", ["shared_w", "shared_w_small"])
@pytest.mark.parametrize("t", [2, 9])
def test_prepacked_panels_add_up_over_the_outer_axis(name: str, t: int) -> None:
    """A weight without the outer axis may come prepacked: decode streams its panels once per outer
    step (adding into the sums), the micro-kernel reads them in place."""
    from arke.targets.llvm.jit import host_panel_width
    from arke.targets.llvm.panels import pack_panels

    nr = host_panel_width()
    g = torch.Generator().manual_seed(t)
    h, w = torch.randn(3, t, 45, generator=g), torch.randn(nr + 5, 45, generator=g)
    got = build(text_module(SOURCE), "llvm").kernels[name](h, pack_panels(w, nr))
    assert_conforms(got, text_module(SOURCE).kernels[name], h, w, what=name)
