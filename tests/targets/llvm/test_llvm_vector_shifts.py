"""The llvm target shifts whole vectors (spec/language.md §8.10), its count check kept: the loop vectorizer
turns the int4 unpack's ``>>`` and a per-element ``>>`` into ``lshr``/``ashr`` on vectors, the check of a
computed count into a vector compare or-ed into the error flag, and a bad count is still the
interpreter's ``arith`` GuardError. (Timings: benchmarks/shifts.py.)"""

from __future__ import annotations

import re

import numpy as np
import pytest
from codegen_support import build, same_bits, seeded, text_module

from arke.plan.dispatch import make_plan
from arke.runtime.guards import GuardError
from arke.targets.llvm.jit import optimise
from arke.targets.llvm.render import RENDERER

SOURCE = """
kernel dequant(s: f32[N], w: u8[N, KH], kk: f32[K]) -> y: f32[N, K] where K == 2 * KH {
  y[n, k] = (f32((w[n, k / 2] >> (4 * (k % 2))) & 15) - 8.0) * s[n]
}
kernel unpack_s4(w: u8[N, H]) -> (lo: i32[N, H], hi: i32[N, H]) {
  lo[n, h] = (i32(w[n, h] & 15) ^ 8) - 8
  hi = (i32(w >> 4) ^ 8) - 8
}
kernel shift_var(w: i32[N], c: i32[N]) -> i32[N] { return w[n] >> c[n] }
kernel shift_left_u16(w: u16[N], c: i64[N]) -> u16[N] { return w[n] << c[n] }
"""


def optimised(name: str) -> str:
    mod = text_module(SOURCE)
    plan = make_plan(mod.semantic, mod.kernel_map[name], None, families=RENDERER.families)
    return str(optimise(str(RENDERER.render(plan).source)))


@pytest.mark.parametrize(("name", "op", "width"), [("dequant", "lshr", 8), ("unpack_s4", "lshr", 8),
                                                   ("shift_var", "ashr", 32), ("shift_left_u16", "shl", 16)])
def test_shifts_are_vector_instructions(name: str, op: str, width: int) -> None:
    ir = optimised(name)
    lanes = [int(n) for n in re.findall(rf"= {op} <(\d+) x i{width}>", ir)]
    assert lanes and max(lanes) >= 4, f"{name}: no vector {op} of i{width}"


@pytest.mark.parametrize("name", ["shift_var", "shift_left_u16"])
def test_computed_counts_are_checked_in_the_vector_loop(name: str) -> None:
    ir = optimised(name)
    assert re.search(r"icmp (ult|ugt) <\d+ x i(32|64)>", ir) or re.search(r"or <\d+ x i1>", ir), \
        f"{name}: the count check is not vectorised"


def test_a_bad_count_is_an_arith_error_and_good_ones_the_interpreters_bits() -> None:
    mod = text_module(SOURCE)
    lib = build(mod, "llvm")
    rng = seeded("shift_var")
    w = rng.integers(-2 ** 31, 2 ** 31 - 1, 1027).astype(np.int32)
    c = rng.integers(0, 32, 1027).astype(np.int32)
    assert same_bits(lib.kernels["shift_var"](w, c), mod.kernels["shift_var"](w, c))
    c[700] = 32
    with pytest.raises(GuardError, match="shift count 32 is out of range"):
        lib.kernels["shift_var"](w, c)
    u = rng.integers(0, 2 ** 16, 515).astype(np.uint16)
    k = rng.integers(0, 16, 515).astype(np.int64)
    assert same_bits(lib.kernels["shift_left_u16"](u, k), mod.kernels["shift_left_u16"](u, k))
    k[3] = -1
    with pytest.raises(GuardError, match="shift count -1 is out of range"):
        lib.kernels["shift_left_u16"](u, k)
