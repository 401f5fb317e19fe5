"""Batch-reduce contractions (spec/codegen.md §2): which sums over several reduce axes the plan makes
contractions (and with which ``k``, outer axes, rows and epilogue), which stay generic, and that only
targets whose renderer lists :data:`~arke.plan.contraction.BATCH_REDUCE` are offered the form.

Plans only: the numbers are tests/targets/test_batch_reduce_targets.py's.
"""

from __future__ import annotations

from typing import Any

import pytest
from codegen_support import TARGETS, text_module

from arke.plan.contraction import BATCH_REDUCE, Contraction
from arke.plan.dispatch import make_plan
from arke.targets import base as targets

SOURCE = """
# a mixture of experts' down projection, the gate folded in as an epilogue
kernel moe_down(h: f32[E, T, F], wd: f32[E, D, F], b: f32[D]) -> f32[T, D] {
  return silu(sum(h[e, t, f] * wd[e, d, f] for e, f) + b[d])
}

# three reduce axes and a batch axis: k is the innermost (c); the others loop outside it
kernel three(x: f32[B, M, I, J, C], w: f32[B, I, J, N, C]) -> f32[B, M, N] {
  return sum(x[b, m, i, j, c] * w[b, i, j, n, c] for i, j, c)
}

# the innermost reduce axis is not plain in w (j is read through a modulo): k is c, j loops outside
kernel shifted(x: f32[M, C, J], w: f32[N, C, J]) -> f32[M, N] {
  return sum(x[m, c, j] * w[n, c, (j + 1) % J] for c, j)
}

# an outer reduce axis may be read through any subscript, like a batch axis (grouped experts)
kernel grouped(h: f32[G, T, F], wd: f32[E, D, F]) -> f32[T, D] where E % G == 0 {
  let R = E / G
  return sum(h[e / R, t, f] * wd[e, d, f] for e, f)
}

# bf16 and int8 operands cast to f32
kernel narrow(h: bf16[E, T, F], wd: i8[E, F, D]) -> f32[T, D] {
  return sum(f32(h[e, t, f]) * f32(wd[e, f, d]) for e, f)
}

# not contractions: every reduce axis inside a non-plain subscript of x; an integer sum; a length
kernel window(x: f32[M, K], w: f32[N, C, J]) -> f32[M, N] where K == C + J - 1 {
  return sum(x[m, c + j] * w[n, c, j] for c, j)
}
kernel ints(a: i32[E, M, K], b: i32[E, K, N]) -> i32[M, N] { return sum(a[e, m, k] * b[e, k, n] for e, k) }
kernel bounded(a: f32[E, M, K], b: f32[E, K, N], lens: i64[M]) -> f32[M, N] {
  return sum(a[e, m, k] * b[e, k, n] for e, k < lens[m])
}
"""


def patterns(name: str, families: frozenset[str] | None = None, bounded: bool = False) -> list[tuple[str, Any]]:
    mod = text_module(SOURCE)
    plan = make_plan(mod.semantic, mod.kernel_map[name], None, families, bounded)
    return [(d.family, d.pattern) for d in plan.dispatches]


@pytest.mark.parametrize(("name", "m", "n", "k", "outer", "batch", "epilogue"), [
    ("moe_down", "t", "d", "f", ("e",), (), True),
    ("three", "m", "n", "c", ("i", "j"), ("b",), False),
    ("shifted", "m", "n", "c", ("j",), (), False),
    ("grouped", "t", "d", "f", ("e",), (), False),
    ("narrow", "t", "d", "f", ("e",), (), False),
])
def test_sums_over_several_axes_are_contractions(name: str, m: str, n: str, k: str, outer: tuple[str, ...],
                                                 batch: tuple[str, ...], epilogue: bool) -> None:
    found = patterns(name)
    assert len(found) == 1, found
    family, c = found[0]
    assert family == "contraction" and isinstance(c, Contraction)
    assert (c.m, c.n, c.k, c.outer, c.batch) == (m, n, k, outer, batch)
    assert (c.epilogue is not None) == epilogue


def test_plain_operands_are_read_in_place() -> None:
    """The outer axes are at their current values in an operand's address: plain loads stay plain."""
    c = patterns("moe_down")[0][1]
    assert c.plain_a() is not None and c.plain_b() is not None
    narrow = patterns("narrow")[0][1]
    assert narrow.plain_a() is not None and narrow.plain_b() is not None  # casts stripped


@pytest.mark.parametrize("name", ["window", "ints"])
def test_other_sums_stay_generic(name: str) -> None:
    assert all(p is None for _, p in patterns(name)), patterns(name)


@pytest.mark.parametrize("bounded", [True, False], ids=["bounded", "masked"])
def test_a_sum_with_a_length_stays_generic(bounded: bool) -> None:
    assert all(p is None for _, p in patterns("bounded", bounded=bounded))


def test_only_targets_that_loop_over_reduce_axes_get_the_form() -> None:
    """Without ``batch-reduce`` in the families the sum is the generic loop nest; one reduce axis is
    a contraction either way."""
    assert all(p is None for _, p in patterns("moe_down", frozenset({"contraction"})))
    assert [f for f, _ in patterns("moe_down", frozenset({"contraction", BATCH_REDUCE}))] == ["contraction"]


@pytest.mark.parametrize("target", TARGETS)
def test_each_target_plans_what_its_renderer_declares(target: str) -> None:
    t = targets.get(target)
    mod = text_module(SOURCE)
    plan = t.plan(mod.semantic, mod.kernel_map["moe_down"], None)
    fused = [d.pattern for d in plan.dispatches if isinstance(d.pattern, Contraction)]
    if BATCH_REDUCE in t.fused_families():
        assert len(fused) == 1 and fused[0].outer == ("e",), plan.dispatches
    else:
        assert not fused, (target, plan.dispatches)
