"""Small rewriting helpers shared by the passes: walk and rebuild SemanticIR without mutating it.

Everything here returns new frozen nodes (``dataclasses.replace``); nodes that do not change
are returned as they are, so an untouched sub-tree stays shared (and ``==`` stays cheap).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TypeVar

import sympy

from arke.ir import semantic as S
from arke.ir.shapes import Dim, text_form

#: Any one kind of op: a rewrite gives back an op of the kind it was given.
OpT = TypeVar("OpT", bound=S.Op)


children = S.children  # the IR's own: re-exported for the passes


def with_children(e: S.SExpr, new: tuple[S.SExpr, ...]) -> S.SExpr:
    """``e`` with its direct sub-expressions replaced by ``new`` (same order as :func:`children`)."""
    if new == children(e):
        return e
    if isinstance(e, S.Load):
        return replace(e, indices=new)
    if isinstance(e, (S.Unary, S.Cast)):
        return replace(e, x=new[0])
    if isinstance(e, S.Binary):
        return replace(e, a=new[0], b=new[1])
    if isinstance(e, S.Select):
        return replace(e, cond=new[0], a=new[1], b=new[2])
    return e


def map_expr(e: S.SExpr, fn: Callable[[S.SExpr], S.SExpr]) -> S.SExpr:
    """Rebuild ``e`` bottom-up: children first, then ``fn`` on the node with its new children."""
    return fn(with_children(e, tuple(map_expr(c, fn) for c in children(e))))


walk = S.walk


op_exprs = S.op_exprs


def op_uses(op: S.Op) -> list[str]:
    """The values an op reads, once per use (loads in its expressions, or a call's arguments)."""
    if isinstance(op, S.CallOp):
        return list(op.args)
    return [n.src for e in op_exprs(op) for n in walk(e) if isinstance(n, S.Load)]


def result_names(op: S.Op) -> tuple[str, ...]:
    """The SSA values an op defines."""
    return op.results if isinstance(op, S.CallOp) else (op.result,)


def map_op_exprs(op: OpT, fn: Callable[[S.SExpr], S.SExpr]) -> OpT:
    """``op`` with ``fn`` applied bottom-up to every node of its expressions (calls are returned as they are).

    A contract's operands must stay loads: ``fn`` may change their subscripts or source, not their kind.
    """
    if isinstance(op, S.CallOp):
        return op
    if isinstance(op, S.ContractOp):
        lhs, rhs = map_expr(op.lhs, fn), map_expr(op.rhs, fn)
        if not isinstance(lhs, S.Load) or not isinstance(rhs, S.Load):
            raise TypeError("a rewrite turned a contract operand into something other than a load")
        return replace(op, lhs=lhs, rhs=rhs)
    if isinstance(op, S.ScanOp):
        return replace(op, body=map_expr(op.body, fn), coeff=None if op.coeff is None else map_expr(op.coeff, fn),
                       init=None if op.init is None else map_expr(op.init, fn))
    if isinstance(op, S.ReduceOp) and op.limits:
        return replace(op, body=map_expr(op.body, fn), limits=tuple((k, map_expr(e, fn)) for k, e in op.limits))
    return replace(op, body=map_expr(op.body, fn))


def rename_values(op: OpT, names: Mapping[str, str]) -> OpT:
    """``op`` reading (and defining) values under new names: ``names`` maps old to new; others stay."""
    def rename_load(e: S.SExpr) -> S.SExpr:
        if isinstance(e, S.Load) and e.src in names:
            return replace(e, src=names[e.src])
        return e

    def new(v: str) -> str:
        return names.get(v, v)

    if isinstance(op, S.CallOp):
        return replace(op, results=tuple(new(r) for r in op.results), args=tuple(new(a) for a in op.args))
    return replace(map_op_exprs(op, rename_load), result=new(op.result))


def substitute_dim(d: Dim, dims: Mapping[str, Dim]) -> Dim:
    """``d`` with its symbols replaced by name, all at once (``xreplace``: M -> N, N -> M swaps, never chains).

    Symbols are matched by name, not by identity, so a symbol made with other assumptions
    than :func:`arke.ir.shapes.sym`'s is still replaced.
    """
    expr = sympy.sympify(d)
    return text_form(expr.xreplace({s: dims[s.name] for s in expr.free_symbols if s.name in dims}))


def substitute_dims(op: OpT, dims: Mapping[str, Dim]) -> OpT:
    """``op`` with dim symbols replaced simultaneously (see :func:`substitute_dim`).

    Reaches every dim an op holds: axis extents, ``dim(…)`` references, a call's result
    types and dim bindings.
    """
    if not dims:
        return op

    def dim(d: Dim) -> Dim:
        return substitute_dim(d, dims)

    def axes(xs: tuple[S.Axis, ...]) -> tuple[S.Axis, ...]:
        return tuple(S.Axis(a.name, dim(a.extent)) for a in xs)

    def dim_ref(e: S.SExpr) -> S.SExpr:
        return replace(e, dim=dim(e.dim)) if isinstance(e, S.DimRef) else e

    if isinstance(op, S.CallOp):
        types = tuple(S.TensorType(t.dtype, tuple(dim(d) for d in t.shape)) for t in op.types)
        return replace(op, types=types, dims=tuple((k, dim(d)) for k, d in op.dims))
    new = map_op_exprs(op, dim_ref)
    if isinstance(new, S.MapOp | S.ScanOp):
        return replace(new, axes=axes(new.axes))
    return replace(new, axes=axes(new.axes), reduce_axes=axes(new.reduce_axes))


def fresh_names(fn: S.Function) -> Callable[[], str]:
    """A source of SSA names for new ops of ``fn``: numbers after the largest numbered result."""
    used = [int(name) for op in fn.ops for name, _ in S.op_results(op) if name.isdigit()]
    counter = [max(used, default=-1)]

    def fresh() -> str:
        counter[0] += 1
        return str(counter[0])

    return fresh


def renumber(fn: S.Function) -> S.Function:
    """``fn`` with its op results renamed ``"0"``, ``"1"``, … in order (parameters keep their names)."""
    names: dict[str, str] = {}
    for op in fn.ops:
        for r in result_names(op):
            names[r] = str(len(names))
    ops = tuple(rename_values(op, names) for op in fn.ops)
    return replace(fn, ops=ops, results=tuple(names.get(r, r) for r in fn.results))
