"""Arg-reductions lowered to the other reductions: ``argmax``/``argmin`` become a ``max``/``min``
of the body and a ``min`` of the positions that hold it.

``reduce.argmax i64 [..] over [n < N] { B }`` (spec/ir.md §2.5) becomes::

    %v = reduce.max C [..] over [n < N] { C(B) }                        # C: B's compute dtype
    %r = reduce.min i64 [..] over [n < N] { select(or(eq(C(B), %v[..]), ne(C(B), C(B))), n, dim(N)) }

``max`` propagates NaN, so where a row holds a NaN ``%v`` is NaN, no element equals it and the
positions kept are the NaNs' (``ne(x, x)`` holds for a NaN only): the first NaN, as the
interpreter's arg-reduction gives; elsewhere no element is NaN and the positions kept are
those equal to the maximum, ``-0.0`` equal to ``+0.0`` (the first of them, as torch's).
The value is held in the body's compute dtype (``f32`` for 16-bit arithmetic), so it is
exactly a value some element has, unrounded. Both reductions are exact in any order: ``max``
and an integer ``min`` do not depend on how lanes, threads or tiles split the axis, so every
target gives the same position, and the rows family runs both in one pass over each row.
A row always holds a position that is kept, so the ``min`` is below ``N``; over an axis whose
extent may be 0 (a compound dim) a map turns the empty ``min`` (the largest ``i64``) into 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import sympy

from arke.ir import semantic as S
from arke.ir.dtypes import DType
from arke.passes.rewrite import fresh_names


def lower_arg_reductions(fn: S.Function) -> S.Function:
    """``fn`` with every ``reduce.argmax``/``reduce.argmin`` lowered (see the module doc)."""
    if not any(isinstance(op, S.ReduceOp) and op.kind in S.ARG_KINDS for op in fn.ops):
        return fn
    fresh = fresh_names(fn)

    ops: list[S.Op] = []
    for op in fn.ops:
        if isinstance(op, S.ReduceOp) and op.kind in S.ARG_KINDS:
            ops.extend(_lowered(op, fresh))
        else:
            ops.append(op)
    return replace(fn, ops=tuple(ops))


def _lowered(op: S.ReduceOp, fresh: Callable[[], str]) -> list[S.Op]:
    (axis,) = op.reduce_axes
    body = op.body
    dt = body.dtype.compute
    value = body if body.dtype == dt else S.Cast(body, dt)
    best = fresh()
    here = tuple(S.Idx(a.name) for a in op.axes)
    kind = "max" if op.kind == "argmax" else "min"
    first = S.ReduceOp(best, dt, kind, op.axes, op.reduce_axes, value, limits=op.limits)
    hit: S.SExpr = S.Binary("eq", value, S.Load(best, here, dt), DType.BOOL)
    if dt.is_float:
        hit = S.Binary("or", hit, S.Binary("ne", value, value, DType.BOOL), DType.BOOL)
    extent = sympy.sympify(axis.extent)
    # a length (spec §8.11) may leave the range empty at run time
    empty_possible = bool(op.limits) or not (extent.is_Symbol or (extent.is_Integer and int(extent) >= 1))
    where = fresh() if empty_possible else op.result
    positions = S.Select(hit, S.Idx(axis.name), S.DimRef(axis.extent), DType.I64)
    second = S.ReduceOp(where, DType.I64, "min", op.axes, op.reduce_axes, positions,
                        None if empty_possible else op.name, op.limits)
    if not empty_possible:
        return [first, second]
    found = S.Load(where, here, DType.I64)
    inside = S.Binary("lt", found, S.DimRef(axis.extent), DType.BOOL)
    fix = S.MapOp(op.result, DType.I64, op.axes, S.Select(inside, found, S.Const(0, DType.I64), DType.I64), op.name)
    return [first, second, fix]
