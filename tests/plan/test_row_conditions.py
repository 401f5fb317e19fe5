"""Row conditions of contractions (arke/plan/contraction.py ``rows_when``, spec/language.md §8.12): which
epilogues say which rows need their sums, and which do not; the fuse pass keeps such an epilogue with its
contraction (it does not move into the next map)."""

from __future__ import annotations

import pytest
from codegen_support import text_module

from arke.ir import semantic as ir
from arke.ir.text import sexpr_text
from arke.passes import run_passes
from arke.plan.contraction import Contraction
from arke.plan.dispatch import make_plan
from arke.targets import downgrades
from arke.targets.llvm import TARGET

HEAD = "kernel k(x: f32[T, D], w: f32[E, F, D], r: bool[T, E], g: f32[T, E], o: f32[E, F]) -> y: f32[E, T, F] {\n"


def conditions(body: str) -> list[str | None]:
    """The row condition of each contraction dispatch of kernel ``k`` with ``body``."""
    mod = text_module(HEAD + body + "\n}\n")
    plan = make_plan(mod.semantic, "k", None, families=frozenset({"rows", "contraction", "attention"}))
    found = [d.pattern for d in plan.dispatches if isinstance(d.pattern, Contraction)]
    return [None if c.rows_when is None else sexpr_text(c.rows_when) for c in found]


@pytest.mark.parametrize(("body", "want"), [
    ("  y[e, t, f] = sum(x[t, d] * w[e, f, d] for d) if r[t, e] else 0.0", "%r[t, e] : bool"),
    # the other branch first: the condition negated
    ("  y[e, t, f] = o[e, f] if g[t, e] == 0.0 else silu(sum(x[t, d] * w[e, f, d] for d)) * g[t, e]",
     "not(eq(%g[t, e] : f32, 0.0))"),
    # a condition on the batch index alone
    ("  y[e, t, f] = sum(x[t, d] * w[e, f, d] for d) if e < 2 else 0.0", "lt(e, 2)"),
])
def test_row_conditions_are_recognised(body: str, want: str) -> None:
    assert conditions(body) == [want]


@pytest.mark.parametrize("body", [
    # the condition reads the column index f: a mask, not a routing
    "  y[e, t, f] = sum(x[t, d] * w[e, f, d] for d) if f < 3 else 0.0",
    # both branches read the sum
    "  h[e, t, f] = sum(x[t, d] * w[e, f, d] for d)\n  y[e, t, f] = h[e, t, f] if r[t, e] else 2.0 * h[e, t, f]",
    # the select is not the epilogue's top
    "  y[e, t, f] = 1.0 + (sum(x[t, d] * w[e, f, d] for d) if r[t, e] else 0.0)",
])
def test_other_selects_are_no_row_conditions(body: str) -> None:
    assert conditions(body) == [None]


def test_each_branch_its_own_sum() -> None:
    # two sums, one per branch: the second (the epilogue's own) is needed where the first is not
    body = "  y[e, t, f] = sum(x[t, d] * w[e, f, d] for d) if r[t, e] else 2.0 * sum(x[t, d] * w[e, f, d] for d)"
    assert conditions(body) == [None, "not(%r[t, e] : bool)"]


def test_a_row_condition_stays_with_its_contraction() -> None:
    body = ("  h[e, t, f] = sum(x[t, d] * w[e, f, d] for d) if r[t, e] else 0.0\n"
            "  y[e, t, f] = silu(h[e, t, f]) * o[e, f]")
    # h's select stays h's epilogue (it would otherwise move into y's map, and h's product could skip nothing)
    assert conditions(body) == ["%r[t, e] : bool"]
    mod = text_module(HEAD + body + "\n}\n")
    maps = [op for op in run_passes(mod.semantic, "k").ops if isinstance(op, ir.MapOp)]
    assert len(maps) == 2


def test_explain_names_the_routed_rows() -> None:
    mod = text_module(HEAD + "  y[e, t, f] = sum(x[t, d] * w[e, f, d] for d) if r[t, e] else 0.0\n}\n")
    text = downgrades.explain(TARGET, mod.semantic, "k", mod.strategies.for_kernel("k", TARGET.name), "k")
    assert "routed: computes the rows where `%r[t, e] : bool` only" in text
