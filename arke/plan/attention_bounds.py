"""The key bounds of an attention's mask (``select(j <= i + c and ..., x, -inf)``): which keys a row can
see, so tiles outside every row's bounds are skipped and tiles inside them need no mask test."""

from __future__ import annotations

import math
from dataclasses import dataclass

from arke.ir import semantic as ir
from arke.ir.dtypes import DType

KEY = "J"  # the key role (arke.plan.attention.KEY)
F32 = DType.F32


def _uses(e: ir.SExpr, role: str) -> bool:
    return any(isinstance(x, ir.Idx) and x.name == role for x in ir.walk(e))


@dataclass(frozen=True)
class KeyBound:
    """A bound the mask puts on the key index: ``j < limit`` (``upper``) or ``j >= limit``.

    ``limit`` is an i64 expression over the row's roles (never ``J``); keys outside the
    bounds of every row of a tile are skipped (the mask would give them ``-inf``).
    """

    upper: bool
    limit: ir.SExpr


_UPPER = {"le": (True, 1), "lt": (True, 0), "ge": (False, 0), "gt": (False, 1)}
_FLIP = {"le": "ge", "lt": "gt", "ge": "le", "gt": "lt"}


def _bounds(score: ir.SExpr, scores: str) -> tuple[KeyBound, ...]:
    """Key bounds of ``select(j <= i + c and ..., x, -inf)``: tiles beyond every row's bound are skipped.

    Only when nothing that can fail would go unevaluated by skipping keys (a load at the
    key, an integer division): the interpreter raises such errors for every key."""
    if not (isinstance(score, ir.Select) and score.b == ir.Const(-math.inf, F32)):
        return ()
    for x in ir.walk(score):
        if not _uses(x, KEY):
            continue
        if isinstance(x, ir.Load) and x.src != scores:
            return ()
        if isinstance(x, ir.Binary) and x.op in ("div", "floordiv", "mod", "pow") and not x.dtype.is_float:
            return ()
    found: list[KeyBound] = []
    level: ir.SExpr = score
    while isinstance(level, ir.Select) and level.b == ir.Const(-math.inf, F32):  # nested masks bound keys too
        found += [b for c in _conjuncts(level.cond) if (b := _bound(c)) is not None]
        level = level.a
    return tuple(found)


def unmasked(score: ir.SExpr, bounds: tuple[KeyBound, ...]) -> ir.SExpr | None:
    """``score`` without its outer ``select(cond, x, -inf)`` masks whose every conjunct is one of ``bounds``
    (what the key tiles inside every row's bounds compute), or None when it has no such mask. A mask that
    states a bound the plan does not track (one left out because skipping keys could skip a failing
    load: a paged cache's window) stays, and so do the masks inside it."""
    inner = score
    while (isinstance(inner, ir.Select) and inner.b == ir.Const(-math.inf, F32)
           and all(_bound(c) in bounds for c in _conjuncts(inner.cond))):
        inner = inner.a
    return None if inner is score else inner


def _conjuncts(cond: ir.SExpr) -> list[ir.SExpr]:
    """``a and b and ...`` as ``[a, b, ...]``."""
    if isinstance(cond, ir.Binary) and cond.op == "and":
        return [*_conjuncts(cond.a), *_conjuncts(cond.b)]
    return [cond]


def _bound(c: ir.SExpr) -> KeyBound | None:
    """The key bound a comparison ``j + x <= e`` (any of <, <=, >, >=, either side) states, or None."""
    if not (isinstance(c, ir.Binary) and c.op in _UPPER):
        return None
    op, lhs, rhs = c.op, c.a, c.b
    if _uses(rhs, KEY) and not _uses(lhs, KEY):
        op, lhs, rhs = _FLIP[op], rhs, lhs
    while isinstance(lhs, ir.Binary) and lhs.op in ("add", "sub") and not lhs.dtype.is_float:
        # j + x < e  is  j < e - x;  j - x < e  is  j < e + x;  x + j < e  is  j < e - x
        if lhs.op == "add" and _uses(lhs.b, KEY) and not _uses(lhs.a, KEY):
            lhs = ir.Binary("add", lhs.b, lhs.a, lhs.dtype)
        if _uses(lhs.b, KEY) or lhs.a.dtype != rhs.dtype:
            break
        rhs = ir.Binary("sub" if lhs.op == "add" else "add", rhs, lhs.b, rhs.dtype)
        lhs = lhs.a
    if lhs != ir.Idx(KEY) or _uses(rhs, KEY) or rhs.dtype.is_float or rhs.dtype.is_bool:
        return None
    upper, plus = _UPPER[op]
    limit: ir.SExpr = rhs if rhs.dtype == DType.I64 else ir.Cast(rhs, DType.I64)
    if plus:
        limit = ir.Binary("add", limit, ir.Const(1, DType.I64), DType.I64)
    return KeyBound(upper, limit)
