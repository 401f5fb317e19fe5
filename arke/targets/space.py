"""Where a target takes each strategy decision: the tables behind ``Target.honoured`` and ``legal_values``.

A target's ``TARGET.takes`` maps a dispatch family (``attention``, ``contraction``, ``rows``, or
:data:`SINGLE` for a dispatch of one op) to the decisions its renderer for that family reads, each
a :class:`Takes` saying on which *roles* of the dispatch it applies. A role names the indices (or
operands) that play one part in a dispatch, worked out from the plan alone by :func:`subject_roles`:

==================  =====================================================================
every dispatch      ``index`` (every index of its ops), ``operand`` (every tensor it loads),
                    ``axis`` (result indices), ``reduced`` (reduced indices), ``last`` (the
                    innermost result index), ``last_reduced`` (the innermost reduced index)
``contraction``     ``m``, ``n``, ``k``, ``batch``; operands ``a``, ``b`` (loaded by either side
                    of the product; the epilogue's are neither)
``attention``       ``query``, ``key``, ``feature``, ``value``, ``batch``; operands ``q``, ``k``, ``v``
``rows``            ``rows`` (the shared row indices), ``lead`` (the first: what workers split),
                    ``inner`` (the result indices after the rows)
``topk``            ``rows`` (the indices a native top-k keeps: what workers split)
==================  =====================================================================

A target may add roles of its own (the llvm target's ``looped``: the indices its CPU code gives a
loop of their own). Nothing here imports a target's renderer, torch or a compiler: the checker
reads these tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from arke.ir import semantic as ir
from arke.plan.families import TOPK

if TYPE_CHECKING:
    from arke.plan.dispatch import Dispatch

#: the families a plan may fuse ops into; any other dispatch is one op (pointwise, reduction ...)
FUSED = frozenset({"attention", "contraction", "rows"})
#: the name under which the tables list what single-op dispatches take
SINGLE = "single"

#: role -> how a message names it
ROLE_WORDS: dict[str, str] = {
    "index": "any index", "operand": "any operand it reads", "axis": "a result index",
    "reduced": "a reduced index", "last": "the innermost result index", "last_reduced": "the innermost reduced index",
    "m": "a contraction's rows", "n": "a contraction's columns", "k": "a contraction's depth",
    "batch": "a batch index", "a": "an operand of the product", "b": "an operand of the product",
    "query": "the query index", "key": "the key index", "feature": "the feature index of the scores",
    "value": "the value index", "q": "q", "v": "v",
    "rows": "a row index", "lead": "the first row index", "inner": "an index after the rows",
    "looped": "an index with a loop of its own",
}


@dataclass(frozen=True)
class Takes:
    """How the dispatches of one family take one decision (an entry of ``Target.takes``).

    ``roles``: for a decision about indices or operands, the roles of the subjects it applies to
    (None: any index or operand of the dispatch). ``values``: the values of an enum decision that
    are lowered as asked (None: all). ``unless``: (decision, values) pairs under which this one is
    ignored (``split j`` under ``algorithm = flash``). ``why``: why a subject or value outside
    these is dropped, for the AK4014 warning and ``akc build --explain``.
    """

    roles: frozenset[str] | None = None
    values: tuple[str, ...] | None = None
    unless: tuple[tuple[str, tuple[str, ...]], ...] = ()
    why: str = ""
    #: the largest value lowered as written, per role of the subject (a register block's rows), and why
    limits: tuple[tuple[str, int, str], ...] = ()
    #: values run rounded up to a power of two of at least this (0: as written), and why (GPU blocks)
    powers: tuple[int, str] = (0, "")


def takes(roles: str | None = None, *, values: tuple[str, ...] | None = None,
          unless: Mapping[str, tuple[str, ...]] | None = None, why: str = "",
          limits: Mapping[str, tuple[int, str]] | None = None, powers: tuple[int, str] = (0, "")) -> Takes:
    """A :class:`Takes` with ``roles`` written as one string (``"m n k"``); ``limits``: role -> (the largest
    value lowered as written, what bounds it); ``powers``: (the least value, why) where values run rounded up
    to a power of two."""
    return Takes(None if roles is None else frozenset(roles.split()), values,
                 tuple((unless or {}).items()), why,
                 tuple((role, most, what) for role, (most, what) in (limits or {}).items()), powers)


#: How a reason says a decision is taken but not as written (its value changed: a register block's limit, a
#: GPU block's power of two); AK4014 words such a reason "does not run as written", not "has no effect".
RUNS_AS = "would run as"


def rounded_up(value: int, least: int) -> int:
    """The power of two a block of ``value`` runs as: the smallest that is at least ``value`` and ``least``."""
    return max(least, 1 << max(0, int(value) - 1).bit_length())


def uses_of(table: Mapping[str, Mapping[str, Takes]]) -> dict[str, frozenset[str]]:
    """Family -> the decisions it takes, from a ``takes`` table (a target's ``uses``)."""
    return {family: frozenset(entries) for family, entries in table.items()}


def honours_of(table: Mapping[str, Mapping[str, Takes]]) -> frozenset[str]:
    """Every decision some family of a ``takes`` table takes (a target's ``honours``)."""
    return frozenset(d for entries in table.values() for d in entries)


def dispatch_family(dispatch: Dispatch) -> str:
    """The row of the tables a dispatch reads: its fused family, or :data:`SINGLE` for one op."""
    if dispatch.family == TOPK:  # a native top-k (its own row of the tables, even of one op)
        return TOPK
    grouped = dispatch.pattern is not None or len(dispatch.members) > 1
    return dispatch.family if dispatch.family in FUSED and grouped else SINGLE


def family_words(family: str) -> str:
    """``a contraction dispatch``, ``a single-op dispatch``."""
    return "a single-op dispatch" if family == SINGLE else f"an {family} dispatch" if family[0] in "aeiou" \
        else f"a {family} dispatch"


def roles_words(roles: frozenset[str] | None) -> str:
    """How a message names the subjects a :class:`Takes` applies to (``the rows m, the columns n``)."""
    if roles is None:
        return "any index"
    words = list(dict.fromkeys(ROLE_WORDS.get(r, r) for r in sorted(roles)))
    return ", ".join(words[:-1]) + (" or " if len(words) > 1 else "") + words[-1]


def _reduced(op: ir.MapOp | ir.ReduceOp | ir.ContractOp | ir.ScanOp) -> tuple[ir.Axis, ...]:
    if isinstance(op, ir.ScanOp):
        return (op.scan_axis,)  # each prefix is a reduction along it
    return () if isinstance(op, ir.MapOp) else op.reduce_axes


def _loads(e: ir.SExpr) -> set[str]:
    return {x.src for x in ir.walk(e) if isinstance(x, ir.Load)}


def subject_roles(dispatch: Dispatch) -> dict[str, frozenset[str]]:
    """Role -> the index (or operand) names that play it in ``dispatch`` (see the module doc)."""
    from arke.passes.rewrite import op_exprs
    from arke.plan.attention import FEATURE, QUERY, VALUE, Attention
    from arke.plan.contraction import Contraction
    from arke.plan.rows import RowGroup

    members = dispatch.members
    out: dict[str, set[str]] = {
        "axis": {a.name for op in members for a in op.axes},
        "reduced": {a.name for op in members for a in _reduced(op)},
        "operand": {s for op in members for e in op_exprs(op) for s in _loads(e)},
        "last": {dispatch.op.axes[-1].name} if dispatch.op.axes else set(),
        "last_reduced": {_reduced(dispatch.op)[-1].name} if _reduced(dispatch.op) else set(),
    }
    out["index"] = out["axis"] | out["reduced"]
    p = dispatch.pattern
    family = dispatch_family(dispatch)
    if family == "contraction" and isinstance(p, Contraction):
        out.update(m={p.m} if p.m is not None else set(), n={p.n}, k={p.k}, batch=set(p.batch),
                   a=_loads(p.a), b=_loads(p.b))
    elif family == "attention" and isinstance(p, Attention):
        named = {role: a.name for a, role in zip(dispatch.op.axes, p.out_axes)}
        first = members[0]
        out.update(query={named[QUERY]} if QUERY in named else set(), key={p.key_index},
                   value={named[VALUE]} if VALUE in named else set(),
                   feature={_reduced(first)[0].name} if _reduced(first) else set(),
                   batch={named[r] for r in p.batch if r in named},
                   q=_loads(p.q), k=_loads(p.k), v={p.v.src})
        if FEATURE in named:  # a result over the feature role (never, but harmless)
            out["feature"].add(named[FEATURE])
        out["index"] |= out["key"]  # the key index is the pattern's (``key_index``): no result axis has it
    elif family == "rows" and isinstance(p, RowGroup):
        out.update(rows={a.name for op in members for a in op.axes[:p.rows]},
                   lead={op.axes[0].name for op in members if op.axes},
                   inner={a.name for op in members for a in op.axes[p.rows:]})
    elif family == TOPK:
        out["rows"] = {a.name for a in dispatch.op.axes[:-1]}
    return {role: frozenset(names) for role, names in out.items()}


__all__ = ["FUSED", "ROLE_WORDS", "SINGLE", "Takes", "dispatch_family", "family_words", "honours_of",
           "roles_words", "subject_roles", "takes", "uses_of"]
