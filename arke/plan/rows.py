"""The rows family: consecutive ops over the same leading rows, run row by row in one dispatch.

A normalisation is a few passes over each row: statistics (``max``, ``sum``, ``mean``) and
then a map that uses them. One dispatch per op reads the whole input from memory once per
pass; grouped, each worker takes a static range of rows and runs every member on one row
before the next, so the row (16 KB for 4096 floats) is still in the L1/L2 cache when the
later members read it again, and memory is read once.

The group starting at ``ops[start]`` is the longest run of consecutive ops (two or more)
that share ``r`` leading *row axes*:

* every member's first ``r`` axes have equal extents, and the axis split across workers
  is its first axis (a strategy's ``parallel`` decision naming another axis stops the run);
* every load of an earlier member's result subscripts the row positions with exactly the
  reader's own row axes, in order (``mx[m]``, ``p[t, f]``): a member only ever reads the
  row it is on, so running the members one after another per row computes exactly what
  running them one after another over the whole tensor does;
* contractions are left to their own family (the run ends where a family tried before rows
  matches: a contraction with a norm folded in as its prologue, an attention core), and a
  reduction over a row axis cannot be a member (its row axes are its result axes, never its
  reduce axes).

Among the ``r`` that give the longest run, the largest is taken (more rows to share out).
Members' results that only later members read, and that the kernel does not return, are
``internal``: they live per row in the worker (a register, or a scratch row) and never
reach memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from arke.ir import semantic as ir
from arke.ir import strategy as sir
from arke.ir.shapes import Dim, equal
from arke.passes.rewrite import map_expr, op_exprs
from arke.plan.dispatch import Dispatch, PlanOp, parallel_axis, readers


@dataclass(frozen=True)
class RowGroup:
    """A matched rows group: its members share their first ``rows`` axes."""

    rows: int


def match_rows(fn: ir.Function, ops: list[PlanOp], start: int, strategy: sir.Strategy | None) -> Dispatch | None:
    """The rows group that starts at ``ops[start]``, or None when fewer than two ops qualify."""
    best: tuple[int, list[PlanOp]] | None = None
    claimed = cache(lambda k: _claimed_elsewhere(fn, ops, k, strategy))
    for r in range(1, len(ops[start].axes) + 1):
        run = row_run(ops, start, r, strategy, claimed)
        if len(run) < 2 or (best is not None and len(run) < len(best[1])):
            break  # a larger r only adds conditions: the run cannot grow again
        best = (r, run)
    if best is None:
        return None
    r, members = best
    last = members[-1]
    inside = {id(op) for op in members}
    results = set(fn.results)
    internal = tuple(op.result for op in members[:-1] if op.result not in results
                     and all(id(reader) in inside for reader in readers(ops, op.result)))
    return Dispatch(op=last, family="rows", parallel=last.axes[0].name, ops=tuple(members),
                    pattern=RowGroup(r), internal=internal)


def row_run(ops: list[PlanOp], start: int, r: int, strategy: sir.Strategy | None,
            claimed: Callable[[int], bool] = lambda k: False) -> list[PlanOp]:
    """The longest run of ops from ``ops[start]`` that may share ``r`` row axes (perhaps shorter
    than 2); ``claimed(k)``: another family takes ``ops[k]``, which ends the run."""
    first = ops[start]
    if len(first.axes) < r:
        return []
    rows = [a.extent for a in first.axes[:r]]
    run: list[PlanOp] = []
    for k in range(start, len(ops)):
        op = ops[k]
        if isinstance(op, ir.ReduceOp) and op.limits:
            break  # a reduction bounded by a length runs its own loop (spec/language.md §8.11)
        if not _fits(op, rows, strategy) or not _reads_own_rows(op, {m.result for m in run}, r):
            break
        if k > start and claimed(k):
            break
        run.append(op)
    return run


def _claimed_elsewhere(fn: ir.Function, ops: list[PlanOp], k: int, strategy: sir.Strategy | None) -> bool:
    """Whether a family tried before rows matches at ``ops[k]`` (a contraction with a norm folded
    in as its prologue, an attention core): it keeps that op, and the group ends before it."""
    from arke.plan.dispatch import matchers

    for match in matchers():
        if match is match_rows:
            return False
        if match(fn, ops, k, strategy) is not None:
            return True
    return False


def _fits(op: PlanOp, rows: list[Dim], strategy: sir.Strategy | None) -> bool:
    """Whether ``op`` can be a member over these row extents (on its own, before its reads)."""
    if isinstance(op, ir.ContractOp | ir.ScanOp) or len(op.axes) < len(rows):
        return False
    if any(equal(a.extent, e) is not True for a, e in zip(op.axes, rows)):
        return False
    return parallel_axis(op, strategy) == op.axes[0].name


def _reads_own_rows(op: PlanOp, earlier: set[str], r: int) -> bool:
    """Whether every load of an ``earlier`` member's result reads ``op``'s own row (see the module doc)."""
    own = tuple(ir.Idx(a.name) for a in op.axes[:r])
    for e in op_exprs(op):
        for x in ir.walk(e):
            if isinstance(x, ir.Load) and x.src in earlier:
                at = tuple(ir.Idx(s.name) if isinstance(s, ir.Idx) else s for s in x.indices[:r])
                if at != own:
                    return False
    return True


def rename(e: ir.SExpr, names: dict[str, str]) -> ir.SExpr:
    """``e`` with its axis indices renamed (``Idx(k)`` -> ``Idx(names[k])``); other nodes as they are."""
    return map_expr(e, lambda x: ir.Idx(names.get(x.name, x.name), x.dtype) if isinstance(x, ir.Idx) else x)
