"""A rows group whose rows split into independent chunks (arke.plan.rows_split): a group norm's groups
run as (row, group) pairs on the workers, with the interpreter's answer, for every thread count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from codegen_support import assert_conforms, build, same_bits, seeded, text_module

from arke.plan.dispatch import make_plan
from arke.plan.rows_split import find_split

GROUP_NORM = (Path(__file__).resolve().parents[3] / "benchmarks" / "operators" / "operators.ak").read_text()

SOURCE = """
kernel rms(x: f32[M, N], w: f32[N]) -> f32[M, N] {
  inv[m] = rsqrt(mean(x[m, n] * x[m, n] for n) + 1e-6)
  return x[m, n] * inv[m] * w[n]
}
"""

SHAPES = [(1, 4, 2, 1), (2, 6, 3, 17), (1, 12, 12, 5), (3, 8, 1, 33), (1, 10, 5, 4097)]


@pytest.mark.parametrize(("b", "c", "g", "length"), SHAPES)
def test_group_norm_split_matches_the_interpreter(b: int, c: int, g: int, length: int) -> None:
    module = text_module(GROUP_NORM)
    rng = seeded("gn", b, c, g, length)
    x, w, bias = (rng.standard_normal(s).astype(np.float32) for s in ((b, c, length), (c,), (c,)))
    kernel = build(module, "llvm").kernels["group_norm"]
    got = kernel(x, w, bias, g, threads=3)
    assert_conforms(got, module.kernels["group_norm"], x, w, bias, G=g)
    assert same_bits(got, kernel(x, w, bias, g, threads=1))


def test_group_norm_rows_split_by_group_and_a_plain_norm_does_not() -> None:
    module = text_module(GROUP_NORM)
    plan = make_plan(module.semantic, module.kernel_map["group_norm"], None, bounded=True)
    (d,) = [d for d in plan.dispatches if d.family == "rows"]
    split = find_split(d.members, d.pattern.rows)  # type: ignore[union-attr]
    assert split is not None and str(split.chunks) == "G"
    plain = text_module(SOURCE)
    plan = make_plan(plain.semantic, plain.kernel_map["rms"], None, bounded=True)
    assert all(find_split(d.members, d.pattern.rows) is None  # type: ignore[union-attr]
               for d in plan.dispatches if d.family == "rows")


COARSE = """
kernel widen(x: f32[R, G, K], y: f32[R, N], Q: dim = 3) -> f32[R, N] {
  t[r, g] = sum(exp(x[r, g, k]) for k)
  return y[r, n] * t[r, n / Q]
}
"""


@pytest.mark.parametrize(("g", "n"), [(3, 9), (3, 7), (4, 2)])
def test_a_split_whose_dims_do_not_divide_runs_the_row_whole(g: int, n: int) -> None:
    """N = 7 is not G · Q = 9: the per-call check runs each row as one chunk (same answer)."""
    module = text_module(COARSE)
    plan = make_plan(module.semantic, module.kernel_map["widen"], None, bounded=True)
    (d,) = [d for d in plan.dispatches if d.family == "rows"]
    assert find_split(d.members, d.pattern.rows) is not None  # type: ignore[union-attr]
    rng = seeded("widen", g, n)
    x, y = rng.standard_normal((5, g, 6)).astype(np.float32), rng.standard_normal((5, n)).astype(np.float32)
    got = build(module, "llvm").kernels["widen"](x, y, 3, threads=2)
    assert_conforms(got, module.kernels["widen"], x, y, Q=3)
