"""Conditions over dims taken together (arke.lang.satisfy): a contradiction is proved or nothing is said."""

from __future__ import annotations

import itertools
import random

import pytest
import sympy

from arke.ir import semantic as ir
from arke.lang.satisfy import may_hold

N, M = sympy.Symbol("N"), sympy.Symbol("M")


def rel(op: str, lhs: object, rhs: object) -> ir.Rel:
    return ir.Rel(op, sympy.sympify(lhs), sympy.sympify(rhs))


@pytest.mark.parametrize(("conds", "holds"), [
    ([rel("==", N, 4), rel("==", N, 5)], False),
    ([rel(">", N, 4), rel("<", N, 3)], False),
    ([rel("<", N, 1)], False),
    ([rel("==", sympy.Mod(N, 64), 0), rel("<", N, 32)], False),
    ([rel("==", sympy.Mod(N, 64), 0), rel("<=", N, 64)], True),
    ([ir.InSet(N, (sympy.Integer(1), sympy.Integer(2))), rel(">=", N, 3)], False),
    ([ir.InSet(N, (sympy.Integer(1), sympy.Integer(8))), rel(">=", N, 3)], True),
    ([rel("!=", N, 1), rel("<=", N, 1)], False),
    ([rel("<=", 2 * N + 1, 6), rel(">", N, 2)], False),
    ([rel("<=", 2 * N + 1, 7), rel(">", N, 2)], True),
    ([ir.BoolOp("or", (rel("<", N, 1), rel("==", N, 3))), rel(">", N, 2)], True),
    ([ir.BoolOp("or", (rel("<", N, 1), rel("<", M, 1)))], False),
    ([rel("<", N, M), rel(">", N, M)], True),  # two dims in one relation: not reasoned about (no false proof)
    ([ir.BoolOp("not", (rel(">", N, 0),))], False),  # `not` pushed down to the comparisons
    ([ir.BoolOp("not", (rel("==", N, N),))], False),
    ([ir.BoolOp("not", (ir.BoolOp("or", (rel("<", N, 3), rel(">", N, 9))),)), rel(">", N, 9)], False),
    ([ir.BoolOp("not", (ir.BoolOp("and", (rel(">", N, 3), rel("<", N, 9))),)), rel("==", N, 5)], False),
    ([ir.BoolOp("not", (ir.BoolOp("and", (rel(">", N, 3), rel("<", N, 9))),)), rel("==", N, 9)], True),
    ([ir.BoolOp("not", (ir.InSet(N, (sympy.Integer(1), sympy.Integer(2))),)), rel("<=", N, 2)], False),
    ([ir.BoolOp("not", (ir.InSet(N, (sympy.Integer(1), sympy.Integer(2))),)), rel("<=", N, 3)], True),
    ([ir.BoolOp("not", (ir.BoolOp("not", (rel("<", N, 1),)),))], False),
])
def test_contradictions_are_proved(conds: list[ir.Cond], holds: bool) -> None:
    assert may_hold(conds) is holds


def test_no_satisfiable_conjunction_is_called_a_contradiction() -> None:
    """Random conjunctions over one dim: wherever a value in 1..300 satisfies them all, they may hold."""
    rng = random.Random(7)
    ops = ("==", "!=", "<", "<=", ">", ">=")
    for _ in range(600):
        conds: list[ir.Cond] = []
        for _ in range(rng.randint(1, 3)):
            kind = rng.random()
            if kind < 0.6:
                conds.append(rel(rng.choice(ops), rng.randint(1, 3) * N + rng.randint(-5, 5), rng.randint(-3, 60)))
            elif kind < 0.8:
                m = rng.randint(1, 16)
                conds.append(rel("==", sympy.Mod(N, m), rng.randint(0, m - 1)))
            else:
                conds.append(ir.InSet(N, tuple(sympy.Integer(rng.randint(1, 40)) for _ in range(3))))

        def holds(c: ir.Cond, v: int) -> bool:
            if isinstance(c, ir.InSet):
                return v in {int(x) for x in c.values}
            assert isinstance(c, ir.Rel)
            a, b = int(sympy.sympify(c.lhs).subs(N, v)), int(sympy.sympify(c.rhs).subs(N, v))
            return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[c.op]

        solvable = any(all(holds(c, v) for c in conds) for v in range(1, 301))
        if solvable:
            assert may_hold(conds), conds


def test_two_dims_are_bounded_each() -> None:
    for a, b in itertools.product((1, 5), (1, 5)):
        assert may_hold([rel(">=", N, a), rel(">=", M, b)])
    assert not may_hold([rel(">=", N, 5), rel("<=", M, 0)])


def test_linear_verdicts_are_sound_and_agree_with_sympy() -> None:
    """The fast verdict of a one-dim linear clause (signatures.decide_cond's first try) never contradicts
    the values it claims, nor SymPy's decision where SymPy makes one."""
    from arke.ir.shapes import decide
    from arke.lang.satisfy import linear_verdict
    from arke.lang.signatures import cond_sympy

    rng = random.Random(11)
    pos = sympy.Symbol("N", integer=True, positive=True)
    for _ in range(120):
        op = rng.choice(["==", "!=", "<", "<=", ">", ">="])
        a = rng.choice([-3, -2, -1, 1, 2, 3, sympy.Rational(1, 2)])
        lhs, rhs = a * pos + rng.randint(-6, 6), sympy.Integer(rng.randint(-6, 6))
        verdict = linear_verdict(op, lhs, rhs)
        assert verdict is not None and (verdict[0] is None or type(verdict[0]) is bool)  # not SymPy's true
        truth = [bool(ir_holds(op, lhs.subs(pos, v), rhs)) for v in range(1, 200)]
        if verdict[0] is True:
            assert all(truth), (op, lhs, rhs)
        elif verdict[0] is False:
            assert not any(truth), (op, lhs, rhs)
        else:
            assert any(truth) and not all(truth), (op, lhs, rhs)
        slow = decide(cond_sympy(ir.Rel(op, lhs, rhs)))
        assert slow is None or slow == verdict[0], (op, lhs, rhs, slow, verdict)


def ir_holds(op: str, a: sympy.Expr, b: sympy.Expr) -> bool:
    return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
