"""Attention through a block table, and attention bounded by a length (spec/language.md §8.11).

A paged KV cache reads a key's row through a table: ``kc[blk[b, j / P], g, j % P, e]``. For the
attention matcher (:mod:`arke.plan.attention`) such a ``k`` or ``v`` is *row-addressed*: one load
whose innermost subscript is the feature role alone (``D`` for ``k``, ``E`` for ``v``) on an axis
of that extent, and whose other subscripts are any integer expressions (gathers included) of the
key and batch roles. A renderer computes each key's row address once (the table lookup, checked
like any subscript) and reads the row in place: the cache is never gathered into a copy.

A core whose row max and two sums are bounded by one length (``max(s for j < n)``, the same
``n`` after renaming the axes to roles) is attention over the keys below it: the score
expression gets the mask ``j < n`` (``-inf`` past it: ``exp`` makes those weights exactly 0,
so the sums equal the bounded ones), and the length is a key bound, so tiles past it are
skipped. The scores an intermediate ``s`` would hold past the length are never computed; an
out-of-range load there, which the interpreter (computing ``s`` everywhere) reports, is not.
Only targets whose renderers read rows through a table and honour lengths (``paged``) get
these matches; the others plan bounded reductions as masked ones, and a row-addressed ``v``
is not attention for them.
"""

from __future__ import annotations

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, equal

F32 = DType.F32
HALF = (DType.BF16, DType.F16)


def row_addressed(fn: ir.Function, e: ir.SExpr | None, feature: str, extents: dict[str, Dim],
                  others: tuple[str, ...]) -> bool:
    """Whether ``e`` is one load whose last subscript is ``feature`` alone (on an axis of its extent)
    and whose other subscripts use none of ``others`` (the query and the other feature role)."""
    if not isinstance(e, ir.Load) or e.dtype not in (F32, *HALF):
        return False
    shape = fn.value_types()[e.src].shape
    if len(shape) != len(e.indices) or e.indices[-1] != ir.Idx(feature):
        return False
    if equal(shape[-1], extents[feature]) is not True:
        return False
    for sub in e.indices[:-1]:
        names = {x.name for x in ir.walk(sub) if isinstance(x, ir.Idx)}
        if names & {feature, *others}:
            return False
    return True


def shared_limit(limits: list[ir.SExpr | None]) -> ir.SExpr | tuple[()] | None:
    """The one length of the core's three reductions (already renamed to roles); None when there is
    none; ``()`` when some are bounded and some not, or by different lengths (not attention)."""
    if all(x is None for x in limits):
        return None
    first = limits[0]
    if first is None or any(x != first for x in limits):
        return ()
    return first


def masked_score(score: ir.SExpr, limit: ir.SExpr, key: str) -> ir.SExpr:
    """``score`` with the keys at or past ``limit`` masked to ``-inf``."""
    below = ir.Binary("lt", ir.Idx(key), limit, DType.BOOL)
    return ir.Select(below, score, ir.Const(-float("inf"), F32), F32)
