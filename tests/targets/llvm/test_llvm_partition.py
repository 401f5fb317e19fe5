"""Maps that index their vector axis through ``%``, ``/`` and comparisons (arke/targets/llvm/partition.py):
the llvm target partitions the axis at the breakpoints and runs each piece as vector code, or the generic
loop where a piece's checks fail. Each kernel against the interpreter (assert_conforms) on ragged, tiny and
wide rows, divisors from dims, pieces that do not fill a vector; errors where the interpreter stops; and
the partitioned rotary's vector loop free of integer division (a fact about the code, not a timing)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from codegen_support import as_dtype, assert_conforms, build, seeded, text_module

from arke.ir.dtypes import DType
from arke.plan.dispatch import make_plan
from arke.runtime.guards import GuardError
from arke.targets.llvm.jit import optimise
from arke.targets.llvm.partition import analyse
from arke.targets.llvm.render import RENDERER

SOURCE = """
kernel partial_rotary(x: f32[T, H, D], cos: f32[T, RD], sin: f32[T, RD]) -> y: f32[T, H, D]
  where RD % 2 == 0, RD <= D
{
  let half = RD / 2
  y[t, h, d] = x[t, h, d] * cos[t, d % RD] + (-1.0 if d < half else 1.0)
      * x[t, h, (d + half) % RD] * sin[t, d % RD] if d < RD else x[t, h, d]
}
kernel rotary(x: bf16[T, D], cos: f32[T, D], sin: f32[T, D]) -> bf16[T, D] where D % 2 == 0 {
  let half = D / 2
  return bf16(f32(x[t, d]) * cos[t, d] + (-1.0 if d < half else 1.0) * f32(x[t, (d + half) % D]) * sin[t, d])
}
kernel rotary_half(x: f16[T, D], cos: f16[T, R], sin: f16[T, R]) -> f16[T, D] where R <= D {
  return x[t, d] * cos[t, d % R] + x[t, (d + R / 2) % R] * sin[t, d % R] if d < R else x[t, d]
}
kernel roll(x: f32[M, N], s: f32[S]) -> y: f32[M, N] { y[i, j] = x[i, (j + S) % N] }
kernel mirror(x: f32[M, N], s: f32[S]) -> y: f32[M, N] { y[i, j] = x[i, (S - j) % N] }
kernel group_scale(x: f32[M, K], g: f32[M, KG]) -> y: f32[M, K] where K % KG == 0 {
  let size = K / KG
  y[m, k] = x[m, k] * g[m, k / size]
}
kernel bands(x: f32[M, N], a: f32[A], b: f32[B]) -> y: f32[M, N] {
  y[i, j] = (x[i, j] if j < A else 2.0 * x[i, j]) if j >= B and j != A + 1 else -x[i, j] - f32(j)
}
kernel causal(x: f32[M, N]) -> y: f32[M, N] { y[i, j] = x[i, j] if j <= i else 0.0 }
kernel shift_right(x: f32[N]) -> y: f32[N] { y[i] = x[(i + N - 1) % N] if i > 0 else 0.0 }
kernel left_pad(x: f32[M, N], w: f32[P]) -> y: f32[M, N] {
  y[i, j] = x[i, (j + N - P) % N] if j >= P else 0.0
}
kernel causal_conv(x: f32[C, L], w: f32[C, 4]) -> y: f32[C, L] {
  y[c, l] = silu(sum(w[c, k] * (x[c, max(l + k - 3, 0)] if l + k >= 3 else 0.0) for k))
}
kernel clamped(x: f32[M, N]) -> y: f32[M, N] { y[i, j] = x[i, min(j + 2, N - 1)] - x[i, max(j - 2, 0)] }
kernel gates(x: f32[M, N], a: f32[A], b: f32[B]) -> y: f32[M, N] {
  y[i, j] = silu(x[i, j]) if j < max(A, B) else sigmoid(x[i, j]) * f32(j)
}
kernel unguarded(x: f32[M, N]) -> y: f32[M, N] { y[i, j] = x[i, j - 1] if j > 0 else 0.0 }
kernel by_dim(x: f32[M, N], s: f32[S]) -> y: f32[M, N] { y[i, j] = x[i, j % (S - 2)] }
kernel wraps_past_i64(x: f32[M, N]) -> y: f32[M, N] {
  y[i, j] = x[i, (j + 9223372036854775807) % N] if j + 9223372036854775000 < 9223372036854775790 else -x[i, j]
}
"""


def run(name: str, *args: object) -> object:
    m = text_module(SOURCE)
    return assert_conforms(build(m, "llvm").kernels[name](*args), m.kernels[name], *args, what=name)


def normal(rng: np.random.Generator, *shape: int, dtype: DType = DType.F32) -> object:
    return as_dtype(rng.standard_normal(shape), dtype)


@pytest.mark.parametrize(("t", "h", "d", "rd"), [(3, 2, 80, 32), (2, 1, 4097, 4096), (1, 3, 3, 2), (2, 2, 10, 6),
                                                  (2, 2, 36, 36), (1, 1, 200, 34)])
def test_partial_rotary(t: int, h: int, d: int, rd: int) -> None:
    rng = seeded("partial_rotary", t, h, d, rd)
    run("partial_rotary", normal(rng, t, h, d), normal(rng, t, rd), normal(rng, t, rd))


@pytest.mark.parametrize(("t", "d"), [(3, 64), (2, 4098), (2, 2), (1, 18)])
def test_full_rotary_bf16(t: int, d: int) -> None:
    rng = seeded("rotary", t, d)
    run("rotary", normal(rng, t, d, dtype=DType.BF16), normal(rng, t, d), normal(rng, t, d))


@pytest.mark.parametrize(("t", "d", "r"), [(2, 80, 32), (3, 4097, 33), (1, 3, 3)])
def test_partial_rotary_f16(t: int, d: int, r: int) -> None:
    rng = seeded("rotary_half", t, d, r)
    run("rotary_half", *(normal(rng, t, n, dtype=DType.F16) for n in (d, r, r)))


@pytest.mark.parametrize(("m", "n", "s"), [(3, 4097, 5), (2, 3, 7), (2, 40, 40), (3, 17, 100)])
def test_divisors_and_offsets_from_dims(m: int, n: int, s: int) -> None:
    rng = seeded("roll", m, n, s)
    x = normal(rng, m, n)
    run("roll", x, normal(rng, s))
    run("mirror", x, normal(rng, s))


@pytest.mark.parametrize("n", [5, 37, 4097])
def test_offsets_that_wrap_i64_are_not_partitioned(n: int) -> None:
    """`j + (2**63 - 1)` wraps (spec §9.3): the pieces' exact breakpoints would be wrong there."""
    rng = seeded("wraps_past_i64", n)
    run("wraps_past_i64", normal(rng, 2, n))


@pytest.mark.parametrize(("m", "k", "kg"), [(2, 4096, 2), (3, 96, 3), (2, 5, 5), (1, 64, 1)])
def test_a_quotient_of_the_axis(m: int, k: int, kg: int) -> None:
    rng = seeded("group_scale", m, k, kg)
    run("group_scale", normal(rng, m, k), normal(rng, m, kg))


@pytest.mark.parametrize(("n", "a", "b"), [(40, 7, 3), (40, 3, 7), (4097, 100, 2000), (3, 1, 1), (19, 30, 1)])
def test_nested_conditions(n: int, a: int, b: int) -> None:
    rng = seeded("bands", n, a, b)
    run("bands", normal(rng, 3, n), normal(rng, a), normal(rng, b))


@pytest.mark.parametrize(("m", "n"), [(37, 37), (5, 4097), (40, 3)])
def test_a_breakpoint_from_an_outer_index(m: int, n: int) -> None:
    rng = seeded("causal", m, n)
    run("causal", normal(rng, m, n))


@pytest.mark.parametrize("n", [1, 3, 4097])
def test_a_map_of_one_index(n: int) -> None:
    run("shift_right", normal(seeded("shift", n), n))


@pytest.mark.parametrize(("n", "p"), [(33, 5), (3, 3), (4097, 17)])
def test_a_padded_window(n: int, p: int) -> None:
    rng = seeded("pad", n, p)
    run("left_pad", normal(rng, 2, n), normal(rng, p))


@pytest.mark.parametrize(("c", "length"), [(3, 4097), (2, 3), (2, 1), (5, 20)])
def test_a_causal_window(c: int, length: int) -> None:
    rng = seeded("conv", c, length)
    run("causal_conv", normal(rng, c, length), normal(rng, c, 4))


@pytest.mark.parametrize(("m", "n"), [(2, 4097), (3, 3), (2, 1), (1, 5), (2, 40)])
def test_clamped_subscripts(m: int, n: int) -> None:
    run("clamped", normal(seeded("clamped", m, n), m, n))


@pytest.mark.parametrize(("n", "a", "b"), [(40, 7, 30), (4097, 3000, 5), (3, 1, 2)])
def test_activations_on_either_side(n: int, a: int, b: int) -> None:
    rng = seeded("gates", n, a, b)
    run("gates", normal(rng, 2, n), normal(rng, a), normal(rng, b))


def test_a_guarded_negative_subscript_is_still_an_error() -> None:
    # spec/language.md §10: both arms are computed, so x[i, j - 1] is read at j = 0 too
    x = normal(seeded("unguarded"), 2, 40)
    for fn in (text_module(SOURCE).kernels["unguarded"], build(text_module(SOURCE), "llvm").kernels["unguarded"]):
        with pytest.raises(GuardError):
            fn(x)


@pytest.mark.parametrize("s", [1, 2, 5, 50])
def test_divisors_that_may_not_be_positive(s: int) -> None:
    # S - 2 is -1 (Python's modulo: every subscript 0), 0 (an error) or positive
    rng = seeded("by_dim", s)
    x, w = normal(rng, 2, 40), normal(rng, s)
    m = text_module(SOURCE)
    if s == 2:
        for fn in (m.kernels["by_dim"], build(m, "llvm").kernels["by_dim"]):
            with pytest.raises(GuardError):
                fn(x, w)
    else:
        run("by_dim", x, w)


def optimised(name: str) -> str:
    m = text_module(SOURCE)
    plan = make_plan(m.semantic, m.kernel_map[name], None, families=RENDERER.families)
    return str(optimise(str(RENDERER.render(plan).source)))


def test_the_partitioned_rotary_divides_nowhere_in_its_vector_loop() -> None:
    ir = optimised("partial_rotary")
    blocks = re.split(r"\n(?=[\w.]+:)", ir)  # basic blocks: a label starts each
    vector = [b for b in blocks if re.search(r"<16 x float>", b)]
    assert vector, "no vector code"
    assert any("masked.load" in b for b in vector) and any("masked.store" in b for b in vector)
    for b in vector:
        assert not re.search(r"= (s|u)(div|rem) ", b), f"an integer division in a vector block:\n{b[:400]}"


def test_what_is_partitioned() -> None:
    m = text_module(SOURCE)
    ops = {f.name: f.ops[-1] for f in m.semantic.functions}
    rot = analyse(ops[m.kernel_map["partial_rotary"]], 16)
    assert rot is not None and len(rot.wraps) == 2 and len(rot.conditions) == 2 and len(rot.loads) == 4
    assert analyse(ops[m.kernel_map["causal"]], 16) is not None
    # short constant periods (an int4 unpack's k % 2) are left to LLVM's own vector code
    dequant = text_module("kernel q(x: f32[N, K]) -> f32[N, K] { return x[n, k] * f32(k % 2) }")
    assert analyse(dequant.semantic.functions[0].ops[-1], 16) is None
