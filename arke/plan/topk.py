"""The topk family: a top-k selection kept whole, on targets that select in one pass over each row.

A target that lists :data:`~arke.plan.families.TOPK` among its families (the llvm target on the
CPU) gets the top-k selections of the *native form* (:func:`native_form`) unlowered: the topk pass
(:mod:`arke.passes.topk`) keeps them, puts a values op and a positions op of one selection next to
each other, and :func:`match_topk` makes them one dispatch, so the row is read once for both.
Every other selection (and every selection on other targets) is lowered to rounds or ranks.

The native form: a literal ``K`` from 1 to :data:`MAX_NATIVE_K` (the per-row buffer is that long),
a float body compared in ``f32`` (``f32``, ``bf16`` or ``f16``) that is one load of a row with the
reduced index as its last subscript, used nowhere else (the row is contiguous: it is scanned in
vectors), possibly widened by a cast to ``f32``, and no length (spec/language.md §8.11).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from arke.ir import semantic as ir
from arke.ir import strategy as sir
from arke.ir.dtypes import DType
from arke.plan.dispatch import Dispatch, PlanOp
from arke.plan.families import TOPK

#: The longest per-row buffer of the native form (a larger literal ``K`` is lowered to ranks).
MAX_NATIVE_K = 64

_FLOATS = (DType.F32, DType.BF16, DType.F16)


@dataclass(frozen=True)
class TopK:
    """A matched top-k dispatch: ``K``, the direction, and which members give values and positions."""

    k: int
    largest: bool
    values: str | None  # the result holding the selected values (None: positions only)
    positions: str | None  # the result holding their positions (None: values only)


def row_load(op: ir.ReduceOp) -> ir.Load | None:
    """The load the native form scans (``x[.., n]``), or None when ``op`` is not of that form."""
    body = op.body
    if isinstance(body, ir.Cast) and body.dtype is DType.F32 and body.x.dtype in _FLOATS:
        body = body.x  # a 16-bit float widened to f32: exact, so the order is the load's
    if not isinstance(body, ir.Load) or body.dtype not in _FLOATS or not body.indices:
        return None
    (axis,) = op.reduce_axes
    n = ir.Idx(axis.name)
    last, rest = body.indices[-1], body.indices[:-1]
    if not (isinstance(last, ir.Idx) and last.name == axis.name):
        return None
    if any(isinstance(x, ir.Idx) and x.name == n.name for s in rest for x in ir.walk(s)):
        return None
    return body


def native_form(op: ir.ReduceOp) -> bool:
    """Whether a top-k selection has the form a :data:`TOPK` target selects natively (module doc)."""
    if op.kind not in ir.TOPK_KINDS or op.limits or len(op.reduce_axes) != 1:
        return False
    k = sympy.sympify(op.axes[-1].extent)
    if not (k.is_Integer and 1 <= int(k) <= MAX_NATIVE_K):
        return False
    return row_load(op) is not None


def same_selection(a: ir.ReduceOp, b: ir.ReduceOp) -> bool:
    """Whether two top-k ops select the same elements (one may give values, the other positions)."""
    def largest(op: ir.ReduceOp) -> bool:
        return op.kind in ("topk", "argtopk")

    return (largest(a) == largest(b) and a.body == b.body and a.axes == b.axes
            and a.reduce_axes == b.reduce_axes and a.kind.startswith("arg") != b.kind.startswith("arg"))


def match_topk(fn: ir.Function, ops: list[PlanOp], start: int, strategy: sir.Strategy | None) -> Dispatch | None:
    """The top-k dispatch at ``ops[start]``: a kept selection and, right after it, its partner (the
    topk pass puts a selection's values and positions next to each other)."""
    op = ops[start]
    if not (isinstance(op, ir.ReduceOp) and op.kind in ir.TOPK_KINDS):
        return None
    members: list[ir.ReduceOp] = [op]
    nxt = ops[start + 1] if start + 1 < len(ops) else None
    if isinstance(nxt, ir.ReduceOp) and nxt.kind in ir.TOPK_KINDS and same_selection(op, nxt):
        members.append(nxt)
    values = next((m.result for m in members if not m.kind.startswith("arg")), None)
    positions = next((m.result for m in members if m.kind.startswith("arg")), None)
    keep = op.axes[:-1]
    pattern = TopK(int(sympy.sympify(op.axes[-1].extent)), op.kind in ("topk", "argtopk"), values, positions)
    return Dispatch(op=members[-1], family=TOPK, parallel=keep[0].name if keep else None,
                    ops=tuple(members), pattern=pattern)
