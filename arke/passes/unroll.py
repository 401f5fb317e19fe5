"""Small reductions unrolled: a reduce over a few terms known when the kernel is built becomes a map.

A :class:`~arke.ir.semantic.ReduceOp` whose reduce axes all have integer-literal extents, at
most :data:`MAX_TERMS` terms in all, is replaced by a :class:`~arke.ir.semantic.MapOp` over
the same axes whose body combines the terms written out one by one (the reduce axes replaced
by the constants ``0, 1, …`` in row-major order): a causal conv window
``sum(w[c, k] * x[b, c, l + k - 3] ... for k)`` over ``w: f32[C, 4]``, a 2-tap gather, a
mixture of a few fixed experts. The elementwise fusion that runs next then folds it into the
map that reads it, so the dispatch is one pointwise loop (vectorised along its inner axis)
instead of a reduction, a contraction or a rows group over a row of four.

A reduction whose extent is a dim (``for k`` over ``w: f32[C, W]``) is not unrolled, even when
it is small at run time: the plan is made once for every size. Nor is a ``ContractOp`` (``@``),
whose operands every target lowers as stored tensors.

**Meaning.** The interpreter's reduction rules are kept term by term: float terms are combined
in ``f32`` (a bf16/f16 body is already computed in f32, so widening it is exact) and the sum is
rounded to the result's dtype by an explicit cast, as the stored reduction result is; integer
terms are combined in ``i64`` and wrap to the result's dtype when cast (two's complement
addition and multiplication wrap the same in any order); ``max``/``min`` are the binary ops,
which propagate NaN as the reductions do. Sums of floats are added left to right — one fixed
order, within the reduction tolerance of the interpreter's (spec/codegen.md §7). Boolean
reductions are left as they are.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import sympy

from arke.ir import semantic as S
from arke.ir.dtypes import DType
from arke.passes.rewrite import map_expr

#: A reduction over at most this many terms (the product of its literal extents) is unrolled.
MAX_TERMS = 16

_COMBINE = {"sum": "add", "prod": "mul", "max": "max", "min": "min"}


def literal_terms(op: S.ReduceOp) -> int | None:
    """The number of terms of ``op`` when every reduce extent is an integer literal, else None."""
    count = 1
    for a in op.reduce_axes:
        extent = sympy.sympify(a.extent)
        if not extent.is_Integer:
            return None
        count *= int(extent)
    return count


def unrollable(op: S.Op) -> bool:
    """Whether :func:`unroll_small_reductions` replaces ``op`` (see the module doc)."""
    if not isinstance(op, S.ReduceOp) or op.kind not in _COMBINE or not op.reduce_axes or op.limits:
        return False  # a length (spec §8.11) stops the terms at run time: not written out
    if op.dtype.is_bool or op.body.dtype.is_bool:
        return False
    terms = literal_terms(op)
    return terms is not None and 1 <= terms <= MAX_TERMS


def unroll_small_reductions(fn: S.Function) -> S.Function:
    """``fn`` with every small literal-extent reduction written out as a map (see the module doc)."""
    ops = tuple(unrolled(op) if isinstance(op, S.ReduceOp) and unrollable(op) else op for op in fn.ops)
    return fn if ops == fn.ops else replace(fn, ops=ops)


def unrolled(op: S.ReduceOp) -> S.MapOp:
    """``op`` as a map whose body combines its terms in row-major order of the reduce axes."""
    acc = DType.F32 if op.dtype.is_float else DType.I64
    names = [a.name for a in op.reduce_axes]
    ranges = [range(int(sympy.sympify(a.extent))) for a in op.reduce_axes]
    total: S.SExpr | None = None
    for point in itertools.product(*ranges):
        term = _at(op.body, dict(zip(names, point)))
        if term.dtype != acc:
            term = S.Cast(term, acc)
        total = term if total is None else S.Binary(_COMBINE[op.kind], total, term, acc)
    assert total is not None  # unrollable: at least one term
    if op.dtype != acc:
        total = S.Cast(total, op.dtype)  # the stored result's rounding (bf16/f16) or wrap (narrow ints)
    return S.MapOp(op.result, op.dtype, op.axes, total, op.name)


def _at(body: S.SExpr, point: dict[str, int]) -> S.SExpr:
    """``body`` with each reduce index replaced by its constant at ``point``."""
    def place(e: S.SExpr) -> S.SExpr:
        if isinstance(e, S.Idx) and e.name in point:
            return S.Const(point[e.name], e.dtype)
        return e

    return map_expr(body, place)


__all__ = ["MAX_TERMS", "literal_terms", "unroll_small_reductions", "unrollable", "unrolled"]
