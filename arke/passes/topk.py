"""Top-k selections lowered to the other ops: ``reduce.topk bottomk argtopk argbottomk`` (spec/ir.md
§2.5) become maps and ``max``/``min``/``sum`` reductions that every target already runs.

The order (spec/language.md §8.3) is a total order on ``(value, position)``: for ``topk`` NaN first,
then values from the largest down; for ``bottomk`` values from the smallest up, then NaN; equal
values (and NaNs) by lower position. Values are compared in the body's compute dtype (``f32`` for
16-bit floats, ``i64`` for booleans), exactly as computed.

**Rounds** (a literal ``K`` up to :data:`MAX_ROUNDS`): round ``r`` finds the first element after
round ``r - 1``'s pick ``(vp, pp)`` in that order (``vp`` a map: the body read at ``pp`` once a
row) — each round two reductions over the row, linear in ``N``; only the previous pick is
needed, since every earlier pick comes before it::

    %m_r = reduce.max C [..] over [n < N] { select(after(n) and x == x, x, -inf) }     # the best number left
    %p_r = reduce.min i64 [..] over [n < N] {                                          # topk: NaN first
             select(after(n) and x != x, n, select(after(n) and x == %m_r, n + N, 2 * N)) }
    %q_r = map i64 [..] { p_r - N if p_r >= N else p_r }

(``bottomk``: ``min`` of the numbers, and a number's position preferred to a NaN's). Both
reductions are exact in any order (``max``/``min`` of values, ``min`` of positions), so every
target's lanes, threads and tiles pick the interpreter's element. ``K <= N`` (a guard) makes
sure every round has an element left. The picks become one ``i64`` map over ``[.., j < K]``; a
value is the body read at its position (a gather), so it is the element's own value (``-0.0``
stays ``-0.0``).

**Ranks** (a ``K`` given by a dim, or above :data:`MAX_ROUNDS`): each element's rank is the
number of elements before it, a ``sum`` over a second copy of the axis (quadratic in ``N``),
and position ``j`` is the ``min`` of the positions whose rank is ``j`` (ranks are a permutation).

A values op and a positions op over the same body, axes and direction share one selection.

**Kept** (``native``): a target that selects natively (the llvm target on the CPU: ``arke.plan.topk``)
passes a predicate; the selections it holds stay ``reduce.topk`` ops, and the partner of one (the
positions of a values op, or the reverse) is moved up right after it, so the two are one dispatch.
Moving it is safe: its body is the same, so everything it reads is computed before the first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import sympy

from arke.ir import semantic as S
from arke.ir.dtypes import INT_RANGE, DType
from arke.passes.rewrite import fresh_names, map_expr

#: Literal ``K`` up to this many rounds; a larger one ranks every element (each round costs a pass).
MAX_ROUNDS = 64

_B = DType.BOOL
_I = DType.I64


def _bin(op: str, a: S.SExpr, b: S.SExpr, dtype: DType = _B) -> S.SExpr:
    return S.Binary(op, a, b, dtype)


def _and(a: S.SExpr | None, b: S.SExpr) -> S.SExpr:
    return b if a is None else _bin("and", a, b)


def _or(*parts: S.SExpr) -> S.SExpr:
    out = parts[0]
    for p in parts[1:]:
        out = _bin("or", out, p)
    return out


def _nan(x: S.SExpr) -> S.SExpr:
    return _bin("ne", x, x)


def _num(x: S.SExpr) -> S.SExpr:
    return _bin("eq", x, x)


def _at(e: S.SExpr, axis: str, where: S.SExpr) -> S.SExpr:
    """``e`` with position ``axis`` replaced by ``where`` (its loads become gathers)."""
    def put(x: S.SExpr) -> S.SExpr:
        if not (isinstance(x, S.Idx) and x.name == axis):
            return x
        return where if where.dtype == x.dtype else S.Cast(where, x.dtype)  # an index read as i8 stays i8

    return map_expr(e, put)


def _before(largest: bool, float_: bool, xa: S.SExpr, a: S.SExpr, xb: S.SExpr, b: S.SExpr) -> S.SExpr:
    """Whether element ``(xa, a)`` comes before ``(xb, b)`` in the selection's order."""
    ahead = _bin("gt" if largest else "lt", xa, xb)
    tie = _and(_bin("eq", xa, xb), _bin("lt", a, b))
    if not float_:
        return _or(ahead, tie)
    if largest:  # a NaN before every number, NaNs by position
        return _or(_and(_nan(xa), _or(_num(xb), _bin("lt", a, b))), ahead, tie)
    return _or(ahead, tie, _and(_nan(xb), _or(_num(xa), _bin("lt", a, b))))


def lower_topk(fn: S.Function, native: Callable[[S.ReduceOp], bool] | None = None) -> S.Function:
    """``fn`` with every top-k selection lowered (see the module doc), except those ``native`` holds."""
    if not any(isinstance(op, S.ReduceOp) and op.kind in S.TOPK_KINDS for op in fn.ops):
        return fn
    fresh = fresh_names(fn)

    shared: dict[tuple[object, ...], str] = {}
    ops: list[S.Op] = []
    moved: set[str] = set()  # kept partners already placed after their selection
    for k, op in enumerate(fn.ops):
        if not (isinstance(op, S.ReduceOp) and op.kind in S.TOPK_KINDS):
            ops.append(op)
            continue
        if native is not None and native(op):
            if op.result not in moved:
                ops.append(op)
                partner = _partner(op, fn.ops[k + 1:])
                if partner is not None:
                    ops.append(partner)
                    moved.add(partner.result)
            continue
        keep, rank, (axis,) = op.axes[:-1], op.axes[-1], op.reduce_axes
        largest = op.kind in ("topk", "argtopk")
        key = (largest, op.body, keep, axis, rank.extent)
        if key not in shared:
            shared[key] = _positions(op, largest, fresh, ops)
        where = S.Load(shared[key], tuple(S.Idx(a.name) for a in op.axes), _I)
        if op.kind.startswith("arg"):
            ops.append(S.MapOp(op.result, _I, op.axes, where, op.name))
        else:
            value = _at(op.body, axis.name, where)
            value = value if value.dtype == op.dtype else S.Cast(value, op.dtype)
            ops.append(S.MapOp(op.result, op.dtype, op.axes, value, op.name))
    return replace(fn, ops=tuple(ops))


def _partner(op: S.ReduceOp, later: tuple[S.Op, ...]) -> S.ReduceOp | None:
    """The first later op giving the other half (values or positions) of ``op``'s selection."""
    from arke.plan.topk import same_selection

    return next((o for o in later if isinstance(o, S.ReduceOp) and o.kind in S.TOPK_KINDS
                 and same_selection(op, o)), None)


def _positions(op: S.ReduceOp, largest: bool, fresh: Callable[[], str], ops: list[S.Op]) -> str:
    """Emit into ``ops`` the selection's positions, an ``i64`` map over ``op.axes``; its name."""
    keep, rank, (axis,) = op.axes[:-1], op.axes[-1], op.reduce_axes
    body = op.body
    dt = DType.I64 if body.dtype.is_bool else body.dtype.compute
    x = body if body.dtype == dt else S.Cast(body, dt)
    extent = sympy.sympify(rank.extent)
    if extent.is_Integer and int(extent) <= MAX_ROUNDS:
        return _rounds(op, int(extent), largest, x, fresh, ops)
    n = S.Idx(axis.name)
    names = {a.name for a in op.axes + op.reduce_axes}
    other = axis.name + "_"
    while other in names:
        other += "_"
    xm = _at(x, axis.name, S.Idx(other))
    before = _before(largest, dt.is_float, xm, S.Idx(other), x, n)
    ranks = fresh()
    ops.append(S.ReduceOp(ranks, _I, "sum", (*keep, axis), (S.Axis(other, axis.extent),),
                          S.Select(before, S.Const(1, _I), S.Const(0, _I), _I)))
    here = tuple(S.Idx(a.name) for a in keep)
    hit = _bin("eq", S.Load(ranks, (*here, n), _I), S.Idx(rank.name))
    out = fresh()
    ops.append(S.ReduceOp(out, _I, "min", op.axes, (axis,), S.Select(hit, n, S.DimRef(axis.extent), _I)))
    return out


def _rounds(op: S.ReduceOp, k: int, largest: bool, x: S.SExpr, fresh: Callable[[], str], ops: list[S.Op]) -> str:
    keep, rank, (axis,) = op.axes[:-1], op.axes[-1], op.reduce_axes
    dt, is_float = x.dtype, x.dtype.is_float
    here = tuple(S.Idx(a.name) for a in keep)
    n, count = S.Idx(axis.name), S.DimRef(axis.extent)
    if is_float:
        sentinel = S.Const(float("-inf") if largest else float("inf"), dt)
    else:
        low, high = INT_RANGE[dt]
        sentinel = S.Const(low if largest else high, dt)
    picks: list[str] = []
    for _ in range(k):
        after: S.SExpr | None = None
        if picks:  # the previous pick's value, read once per row (not once per element)
            pp = S.Load(picks[-1], here, _I)
            value = fresh()
            ops.append(S.MapOp(value, dt, keep, _at(x, axis.name, pp)))
            after = _before(largest, is_float, S.Load(value, here, dt), pp, x, n)
        if is_float:  # the best number left (NaNs are picked by position below)
            best: S.SExpr = S.Select(_and(after, _num(x)), x, sentinel, dt)
        else:
            best = x if after is None else S.Select(after, x, sentinel, dt)
        m = fresh()
        ops.append(S.ReduceOp(m, dt, "max" if largest else "min", keep, (axis,), best))
        hit = _and(after, _bin("eq", x, S.Load(m, here, dt)))
        p = fresh()
        if not is_float:
            ops.append(S.ReduceOp(p, _I, "min", keep, (axis,), S.Select(hit, n, count, _I)))
            picks.append(p)
            continue
        nan = _and(after, _nan(x))
        first, second = (nan, hit) if largest else (hit, nan)
        late = S.Binary("add", n, count, _I)
        ops.append(S.ReduceOp(p, _I, "min", keep, (axis,),
                              S.Select(first, n, S.Select(second, late, S.DimRef(2 * axis.extent), _I), _I)))
        q = fresh()
        found = S.Load(p, here, _I)
        ops.append(S.MapOp(q, _I, keep, S.Select(_bin("lt", found, count), found,
                                                 S.Binary("sub", found, count, _I), _I)))
        picks.append(q)
    out = fresh()
    if not picks:  # K = 0: nothing is selected (an empty result)
        ops.append(S.MapOp(out, _I, op.axes, S.Const(0, _I)))
        return out
    j = S.Idx(rank.name)
    table: S.SExpr = S.Load(picks[-1], here, _I)
    for r in range(k - 2, -1, -1):
        table = S.Select(_bin("eq", j, S.Const(r, _I)), S.Load(picks[r], here, _I), table, _I)
    ops.append(S.MapOp(out, _I, op.axes, table))
    return out
