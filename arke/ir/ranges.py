"""Subscripts proved in range: the LLVM target checks them no more, and a call that has no other way to
fail is known not to fail (:func:`arke.runtime.outputs.can_fail`).

A subscript that is not a plain index of the axis is checked on every access (an error flag, a select
of a safe index): ``qkv[n, (H + h) * E + e]`` in GPT-2's q/k/v split paid a compare, a flag update and
a select per element, and the checks kept LLVM from vectorising the loop. :func:`in_range` bounds the
subscript by interval arithmetic over its indices (each in ``[0, extent - 1]`` wherever the loop body
runs), constants, dims and remainders by a dim or a positive constant (``j % P`` is in ``[0, P)``), and
proves ``0 <= lo`` and ``hi <= extent - 1`` symbolically: dims are non-negative integers, and a `where`
equality the call checked before the kernel ran (``C == 3 * H * E``, :func:`facts`) replaces its dim.
Anything it cannot bound (a load, a division, a product of signs it does not know) keeps its check.
"""

from __future__ import annotations

from collections.abc import Mapping

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim

Interval = tuple[sympy.Expr, sympy.Expr]


def facts(fn: ir.Function) -> dict[sympy.Symbol, sympy.Expr]:
    """The dims ``fn``'s `where` equalities define (``C == 3 * H * E`` gives ``C -> 3 * H * E``): every
    call checks its guards before a kernel runs (Python and bundles alike)."""
    out: dict[sympy.Symbol, sympy.Expr] = {}
    for g in fn.guards:
        cond = g.cond
        if isinstance(cond, ir.Rel) and cond.op == "==":
            lhs, rhs = sympy.sympify(cond.lhs), sympy.sympify(cond.rhs)
            if isinstance(lhs, sympy.Symbol) and lhs not in rhs.free_symbols:
                out.setdefault(lhs, rhs)
            elif isinstance(rhs, sympy.Symbol) and rhs not in lhs.free_symbols:
                out.setdefault(rhs, lhs)
    return out


def _interval(e: ir.SExpr, extents: Mapping[str, Dim]) -> Interval | None:
    if isinstance(e, ir.Idx):
        if e.name not in extents:
            return None
        top = sympy.sympify(extents[e.name]) - 1
        return sympy.Integer(0), top
    if isinstance(e, ir.Const):
        if isinstance(e.value, bool) or not isinstance(e.value, int):
            return None
        return sympy.Integer(e.value), sympy.Integer(e.value)
    if isinstance(e, ir.DimRef):
        d = sympy.sympify(e.dim)
        return d, d
    if isinstance(e, ir.Cast):  # an integer made i64 keeps its value (a narrower result may wrap)
        return _interval(e.x, extents) if e.dtype is DType.I64 and e.x.dtype.is_int else None
    # i64 arithmetic only: narrower integers wrap where the bounds would not
    if isinstance(e, ir.Binary) and e.dtype is DType.I64 and e.op in ("add", "sub", "mul"):
        a, b = _interval(e.a, extents), _interval(e.b, extents)
        if a is None or b is None:
            return None
        if e.op == "add":
            return a[0] + b[0], a[1] + b[1]
        if e.op == "sub":
            return a[0] - b[1], a[1] - b[0]
        if _nonnegative(a[0]) and _nonnegative(b[0]):  # both factors >= 0: the ends multiply
            return a[0] * b[0], a[1] * b[1]
    if isinstance(e, ir.Binary) and e.dtype is DType.I64 and e.op == "mod":  # Python's modulo by m >= 1: [0, m)
        m = _interval(e.b, extents)
        if m is not None and m[0] == m[1] and _at_least_one(m[0]):
            return sympy.Integer(0), m[0] - 1
    return None


def _at_least_one(x: sympy.Expr) -> bool:
    """Whether ``x`` is >= 1 for every value of its dims: a dim itself is (every call checks that its dims are
    at least 1), as is a positive constant; a dim expression may not be (``D - 5``, ``H / G``)."""
    return _nonnegative(x - 1, positive=True)


def _nonnegative(x: sympy.Expr, positive: bool = False) -> bool:
    """Whether ``x`` is >= 0 for every value of its dims (non-negative integers; ``positive``: at least 1)."""
    kind = {"positive": True} if positive else {"nonnegative": True}
    dims = {s: sympy.Symbol(s.name, integer=True, **kind) for s in x.free_symbols}
    return bool(sympy.expand(x.subs(dims)).is_nonnegative)


def in_range(s: ir.SExpr, extent: Dim, extents: Mapping[str, Dim],
             known: Mapping[sympy.Symbol, sympy.Expr]) -> bool:
    """Whether subscript ``s`` lies in ``[0, extent)`` wherever it is evaluated (see the module's docstring)."""
    if not s.dtype.is_int:
        return False
    span = _interval(s, extents)
    if span is None:
        return False
    lo, hi = (sympy.sympify(v).subs(known) for v in span)
    top = sympy.sympify(extent).subs(known) - 1
    return _nonnegative(lo) and _nonnegative(top - hi)


__all__ = ["facts", "in_range"]
