"""Paged attention is attention (spec/language.md §8.11, arke/plan/paged.py): decode attention whose
k and v rows come through a block table, bounded by a per-sequence length, is the attention family
on llvm and triton, reading k/v in place (row-addressed, never gathered into a hoisted copy) and skipping the
keys past the length; plans for targets that mask lengths keep it on their generic paths."""

from __future__ import annotations

import math

import pytest
from codegen_support import text_module
from paged_support import paged_decode

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.plan.attention import KEY, Attention
from arke.plan.dispatch import make_plan
from arke.targets import base as targets

PAGED = paged_decode() + """
kernel paged_prefill(q: f32[B, T, H, E], kc: f32[NB, G, P, E], vc: f32[NB, G, P, E], blk: i32[B, MB],
                     lens: i64[B]) -> f32[B, T, H, E]
  where H % G == 0
{
  let R = H / G
  s[b, t, h, j] = sum(q[b, t, h, e] * kc[blk[b, j / P], h / R, j % P, e] for e)
  mx[b, t, h] = max(s[b, t, h, j] for j < lens[b])
  p[b, t, h, j] = exp(s[b, t, h, j] - mx[b, t, h])
  return sum(p[b, t, h, j] * vc[blk[b, j / P], h / R, j % P, e] for j < lens[b])
         / sum(p[b, t, h, j] for j < lens[b])
}
kernel mixed_lengths(q: f32[B, H, E], kc: f32[NB, G, P, E], vc: f32[NB, G, P, E], blk: i32[B, MB],
                     lens: i64[B]) -> f32[B, H, E]
  where H % G == 0
{
  let R = H / G
  s[b, h, j] = sum(q[b, h, e] * kc[blk[b, j / P], h / R, j % P, e] for e)
  mx[b, h] = max(s[b, h, j] for j < lens[b])
  p[b, h, j] = exp(s[b, h, j] - mx[b, h])
  return sum(p[b, h, j] * vc[blk[b, j / P], h / R, j % P, e] for j < lens[b] - 1) / sum(p[b, h, j] for j < lens[b])
}
"""


def _plan(kernel: str, target: str) -> object:
    module = text_module(PAGED)
    return targets.get(target).plan(module.semantic, module.kernel_map[kernel], None)


@pytest.mark.parametrize("target", ["llvm", "triton"])
@pytest.mark.parametrize("kernel", ["paged_decode", "paged_prefill"])
def test_paged_attention_is_the_attention_family(kernel: str, target: str) -> None:
    plan = _plan(kernel, target)
    (d,) = plan.dispatches  # type: ignore[attr-defined]
    assert d.family == "attention"
    pat = d.pattern
    assert isinstance(pat, Attention)
    assert pat.k_rows and pat.v_rows and not pat.k_direct  # through the table, in place
    assert pat.group is not None  # GQA: the R heads of a KV head share each key row
    (bound,) = [b for b in pat.bounds if b.upper]
    assert "lens" in {x.src for x in _loads(bound.limit)}  # the tiles past the length are skipped
    assert KEY in {x.name for x in _idx(pat.score)}  # and the keys past it in the last tile masked
    assert not any(b.name.startswith("kp_") for b in plan.buffers)  # type: ignore[attr-defined]


def test_different_lengths_are_not_one_attention_core() -> None:
    plan = _plan("mixed_lengths", "llvm")
    assert all(d.family != "attention" for d in plan.dispatches)  # type: ignore[attr-defined]


@pytest.mark.parametrize("target", ["llvm", "triton"])
def test_different_lengths_mask_on_every_target(target: str) -> None:
    """No attention core: on a target that masks lengths every reduction of the plan is a masked one."""
    plan = _plan("mixed_lengths", target)
    assert all(d.family != "attention" for d in plan.dispatches)  # type: ignore[attr-defined]
    if target == "triton":
        assert all(not getattr(op, "limits", ()) for d in plan.dispatches for op in d.members)  # type: ignore[attr-defined]


@pytest.mark.parametrize("target", ["cuda", "mlir"])
def test_targets_that_mask_lengths_plan_no_lengths(target: str) -> None:
    """Without loops that stop at a length, the plan's reductions are masked ones over the extent."""
    plan = _plan("paged_decode", target)
    for d in plan.dispatches:  # type: ignore[attr-defined]
        assert not isinstance(d.pattern, Attention) or not (d.pattern.k_rows or d.pattern.v_rows)
        assert all(not getattr(op, "limits", ()) for op in d.members)


def test_make_plan_without_bounded_loops_has_no_lengths() -> None:
    module = text_module(PAGED)
    plan = make_plan(module.semantic, module.kernel_map["paged_decode"])
    assert all(not getattr(op, "limits", ()) for d in plan.dispatches for op in d.members)


def _loads(e: object) -> list:
    from arke.ir import semantic as ir

    assert isinstance(e, ir.Const | ir.Idx | ir.DimRef | ir.Load | ir.Unary | ir.Binary | ir.Select | ir.Cast)
    return [x for x in ir.walk(e) if isinstance(x, ir.Load)]


def _idx(e: object) -> list:
    from arke.ir import semantic as ir

    assert isinstance(e, ir.Const | ir.Idx | ir.DimRef | ir.Load | ir.Unary | ir.Binary | ir.Select | ir.Cast)
    return [x for x in ir.walk(e) if isinstance(x, ir.Idx)]


@pytest.mark.parametrize("algorithm", ["flash", "split_kv", "materialized"])
def test_every_algorithm_reads_through_the_table(algorithm: str) -> None:
    """Each algorithm of the llvm attention dispatch gives the interpreter's answer through the table
    (``materialized`` looks each value row up as it goes; the others keep a row table per key tile)."""
    import numpy as np
    from codegen_support import assert_conforms, build, seeded

    module = text_module(PAGED + f"@strategy(paged_decode, target = llvm) {{\n  algorithm = {algorithm}\n}}\n")
    rng = seeded("paged-algorithms", algorithm)
    b, h, g, e, p, mb = 3, 4, 2, 8, 4, 9
    blk = rng.permutation(b * mb).reshape(b, mb).astype(np.int32)
    kc, vc = (rng.standard_normal((b * mb, g, p, e)).astype(np.float32) for _ in range(2))
    args = (rng.standard_normal((b, h, e)).astype(np.float32), kc, vc, blk, np.array([0, 36, 13]))
    got = build(module, "llvm").kernels["paged_decode"](*args, threads=2)
    assert_conforms(got, module.kernels["paged_decode"], *args, what=algorithm)


WINDOWED = """
kernel paged_window(q: f32[N, H, E], kc: f32[NB, G, P, E], vc: f32[NB, G, P, E], blk: i32[S, MB],
                    seq: i64[N], pos: i64[N], window: i64) -> f32[N, H, E]
  where H % G == 0
{
  let R = H / G
  s[n, h, j] = sum(q[n, h, e] * kc[blk[seq[n], j / P], h / R, j % P, e] for e)
  c[n, h, j] = s[n, h, j] if j > pos[n] - window else -inf
  mx[n, h] = max(c[n, h, j] for j < pos[n] + 1)
  p[n, h, j] = exp(c[n, h, j] - mx[n, h])
  return sum(p[n, h, j] * vc[blk[seq[n], j / P], h / R, j % P, e] for j < pos[n] + 1)
         / sum(p[n, h, j] for j < pos[n] + 1)
}
"""


def test_a_window_the_plan_does_not_track_stays_in_the_unmasked_score() -> None:
    """Through a block table a window's lower bound is not a tracked key bound (keys below it cannot be
    skipped: their table lookups could fail), so the tiles "inside every row's bounds" — below the
    length only — still apply the window's mask (it was dropped once: decode past the window was wrong)."""
    module = text_module(WINDOWED)
    plan = targets.get("llvm").plan(module.semantic, module.kernel_map["paged_window"], None)
    (d,) = plan.dispatches
    pat = d.pattern
    assert isinstance(pat, Attention)
    assert [b.upper for b in pat.bounds] == [True]  # the length only
    inner = pat.inner
    assert inner is not None
    masks = [x for x in ir.walk(inner) if isinstance(x, ir.Select) and x.b == ir.Const(-math.inf, DType.F32)]
    assert masks and "window" in {x.src for m in masks for x in ir.walk(m.cond) if isinstance(x, ir.Load)}
