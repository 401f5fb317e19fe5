"""Reductions bounded by lengths (spec/language.md §8.11) lowered to masked ones, for plans whose
renderers loop over whole extents.

``reduce.K [..] over [j < T] limits {j = n} { B }`` becomes::

    reduce.K [..] over [j < T] { select(lt(j, n), B[j := min(j, max(n, 1) - 1)], identity) }

The select keeps exactly the terms below the length, and the identity (``0``, ``1``, ``-inf`` /
``+inf`` or the integer type's extremes) changes nothing: the same value as the bounded
reduction. The body is evaluated at a *clamped* position, below the length, so a load past it
(a block table's garbage past a sequence's end) is never made; the one difference is an empty
range (``n <= 0``), where position 0 is evaluated and its loads must be in range
(spec/codegen.md §2). A target whose loops stop at the length itself (llvm) plans without this.
"""

from __future__ import annotations

import math
from dataclasses import replace

from arke.ir import semantic as S
from arke.ir.dtypes import INT_RANGE, DType
from arke.passes.rewrite import map_expr

I64 = DType.I64


def mask_limits(fn: S.Function) -> S.Function:
    """``fn`` with every bounded reduction written as a masked one (see the module doc)."""
    if not any(isinstance(op, S.ReduceOp) and op.limits for op in fn.ops):
        return fn
    return replace(fn, ops=tuple(masked(op) if isinstance(op, S.ReduceOp) and op.limits else op for op in fn.ops))


def masked(op: S.ReduceOp) -> S.ReduceOp:
    """One bounded reduction as a masked reduction over its whole extents."""
    at: dict[str, S.SExpr] = {}
    inside: S.SExpr | None = None
    for name, n in op.limits:
        last = S.Binary("sub", S.Binary("max", n, S.Const(1, I64), I64), S.Const(1, I64), I64)
        at[name] = S.Binary("min", S.Idx(name), last, I64)
        below = S.Binary("lt", S.Idx(name), n, DType.BOOL)
        inside = below if inside is None else S.Binary("and", inside, below, DType.BOOL)
    assert inside is not None

    def clamp(e: S.SExpr) -> S.SExpr:
        if isinstance(e, S.Idx) and e.name in at:
            return at[e.name] if e.dtype == I64 else S.Cast(at[e.name], e.dtype)
        return e

    body = map_expr(op.body, clamp)
    return replace(op, body=S.Select(inside, body, identity(op.kind, body.dtype), body.dtype), limits=())


def identity(kind: str, dtype: DType) -> S.Const:
    """The element that leaves a ``kind`` reduction of ``dtype`` terms unchanged (for ``argmax``/``argmin``:
    the one no term loses to)."""
    if kind == "sum":
        return S.Const(False if dtype.is_bool else 0.0 if dtype.is_float else 0, dtype)
    if kind == "prod":
        return S.Const(True if dtype.is_bool else 1.0 if dtype.is_float else 1, dtype)
    larger = kind in ("max", "argmax")  # an arg-reduction's masked terms never beat a real one (ties: the first)
    if dtype.is_bool:
        return S.Const(not larger, dtype)
    if dtype.is_float:
        return S.Const(-math.inf if larger else math.inf, dtype)
    low, high = INT_RANGE[dtype]
    return S.Const(low if larger else high, dtype)
