"""Rows groups whose rows split into independent chunks: a group norm's groups.

A rows group (:mod:`arke.plan.rows`) runs its members one after another on each row. A group
norm's row (one batch entry: ``C × L`` values, megabytes) is too big for the caches, so every
pass over it reads memory again, and a batch of one or two rows leaves workers idle. Yet its
members never mix channels of different groups: ``s[b, ch]`` sums channel ``ch``, ``mu[b, g]``
reads ``s[b, g * cg + c]`` for ``c < cg`` (group ``g``'s channels only), ``d[b, ch]`` reads
``mu[b, ch / cg]`` (its own group's). Such a row splits into ``J`` chunks (the groups): chunk
``j`` of every member is the slice ``[j·w, (j+1)·w)`` of its first axis after the rows (``w`` that
member's width: ``cg`` channels, one group), and running every member on chunk ``j`` before chunk
``j + 1`` computes exactly what running them on the whole row does — the same elements, each by
the same code in the same order — while the chunk (``cg × L`` values) stays in L2 and the workers
share ``rows × J`` chunks.

:func:`find_split` proves it from the subscripts. Each load of an earlier member's result
must reach the writer's chunk from the reader's at the first position after the rows, in one
of three forms (``a`` the reader's first axis after the rows, ``q`` a dim expression):

* ``a`` itself — the two widths are equal;
* ``a / q`` (floor division) — the writer's width is the reader's divided by ``q``;
* ``a * q + c`` with ``c`` another index of the reader (a later axis or a reduce axis) whose
  extent is ``q`` — the writer's width is the reader's times ``q``.

Starting from one member of width 1 (the coarsest: ``J`` is its extent), the widths follow
from these links; every member must be reached, every width a product of dims (never a
quotient) and the links must agree. Each member's extent must also be ``J ×`` its width, which
the renderer checks per call (see :func:`find_split`).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from arke.ir import semantic as ir
from arke.ir.shapes import Dim, equal
from arke.passes.rewrite import op_exprs
from arke.plan.dispatch import PlanOp
from arke.plan.exprs import loads_in


@dataclass(frozen=True)
class GroupSplit:
    """``chunks`` per row; each member's chunk is ``widths[result]`` elements of its first axis after the rows."""

    chunks: Dim
    widths: dict[str, Dim]


def _links(members: tuple[PlanOp, ...], r: int) -> list[tuple[str, str, str, Dim]] | None:
    """(reader, writer, form, q) for every load of a member's result by a later one; None if one has
    no form above (or the reader has no axis after the rows)."""
    results = {op.result: op for op in members}
    out: list[tuple[str, str, str, Dim]] = []
    for op in members:
        loads = [x for e in op_exprs(op) for x in loads_in(e) if x.src in results and x.src != op.result]
        if not loads:
            continue
        a = op.axes[r].name
        extents = {ax.name: ax.extent for ax in op.axes[r + 1:]}
        if isinstance(op, ir.ReduceOp):
            extents.update({ax.name: ax.extent for ax in op.reduce_axes})
        for x in loads:
            if len(x.indices) <= r:
                return None
            form = _form(x.indices[r], a, extents)
            if form is None:
                return None
            out.append((op.result, x.src, *form))
    return out


def _form(s: ir.SExpr, a: str, extents: dict[str, Dim]) -> tuple[str, Dim] | None:
    if s == ir.Idx(a):
        return "same", sympy.Integer(1)
    if isinstance(s, ir.Binary) and s.op == "div" and s.a == ir.Idx(a) and isinstance(s.b, ir.DimRef):
        return "div", s.b.dim
    if isinstance(s, ir.Binary) and s.op == "add":
        for mul, c in ((s.a, s.b), (s.b, s.a)):
            if (isinstance(mul, ir.Binary) and mul.op == "mul" and isinstance(c, ir.Idx) and c.name in extents):
                for idx, q in ((mul.a, mul.b), (mul.b, mul.a)):
                    if idx == ir.Idx(a) and isinstance(q, ir.DimRef) and equal(extents[c.name], q.dim) is True:
                        return "mul", q.dim
    return None


def find_split(members: tuple[PlanOp, ...], r: int) -> GroupSplit | None:
    """The chunks a rows group's rows split into (see the module's docstring), or None.

    Whether each member's extent is ``chunks ×`` its width can depend on the dims (``C`` a multiple
    of ``G``, which a ``where`` clause states but a plan does not see): the renderer checks it per
    call and runs the whole row as one chunk where it fails."""
    if len(members) < 2 or any(len(op.axes) <= r for op in members):
        return None
    links = _links(members, r)
    if not links:
        return None
    names = {op.result for op in members}
    for root in members:
        widths = _propagate(root.result, links)
        if widths is not None and set(widths) == names:
            return GroupSplit(root.axes[r].extent, widths)
    return None


def _whole(d: Dim) -> bool:
    """Whether ``d`` is a product of dims and integers (no quotient left)."""
    return bool(sympy.fraction(sympy.together(d))[1] == 1)


def _propagate(root: str, links: list[tuple[str, str, str, Dim]]) -> dict[str, Dim] | None:
    """Each member's width from ``root``'s 1 along the links; None where one would be a quotient or two
    links disagree."""
    widths: dict[str, Dim] = {root: sympy.Integer(1)}
    # the writer's width from the reader's, and back: same w_w = w_r; div w_w = w_r / q; mul w_w = w_r * q
    forward = {"same": lambda w, q: w, "div": lambda w, q: w / q, "mul": lambda w, q: w * q}
    backward = {"same": lambda w, q: w, "div": lambda w, q: w * q, "mul": lambda w, q: w / q}
    changed = True
    while changed:
        changed = False
        for reader, writer, form, q in links:
            if reader in widths and writer in widths:
                if equal(forward[form](widths[reader], q), widths[writer]) is not True:
                    return None
                continue
            if reader in widths:
                writer_w = sympy.simplify(forward[form](widths[reader], q))
                if not _whole(writer_w):
                    return None
                widths[writer] = writer_w
                changed = True
            elif writer in widths:
                reader_w = sympy.simplify(backward[form](widths[writer], q))
                if not _whole(reader_w):
                    return None
                widths[reader] = reader_w
                changed = True
    return widths


__all__ = ["GroupSplit", "find_split"]
