"""The contraction family: matmul-like ops recognised from plain math, with a fused epilogue.

An op is a contraction when it is ``sum(A * B for k)`` over one reduce axis ``k`` of two
loads (a :class:`~arke.ir.semantic.ContractOp`, or a ``reduce.sum`` of a product of two
loads, each perhaps cast to f32: bf16/f16 activations or int8 weights), where

* ``n``, the result's last axis, indexes only ``B`` (lanes of the micro-kernel run along it);
* ``m``, when there is one, indexes only ``A`` (rows of the micro-kernel), and
* every other result axis is a *batch* axis: it may appear in either load, in any
  subscript expression (GQA's ``h / R``), but never together with ``m``, ``n`` or ``k``.

``m``, ``n`` and ``k`` must be plain subscripts (so an operand's address is affine in them),
and the result a float. An elementwise op that reads the contraction's result only at the
same element (``+ bias[n]``, ``silu(g) * u``, ``* scale[n]``) and nothing else reads it is
folded in as the *epilogue*: applied to each finished element, so the raw contraction
never reaches memory. Anything else stays with the generic loop nest, which is always
correct.
"""

from __future__ import annotations

from dataclasses import dataclass

from arke.codegen.plan import Dispatch, PlanOp, op_exprs, readers
from arke.ir import semantic as ir
from arke.ir import strategy as sir
from arke.ir.dtypes import DType
from arke.ir.shapes import equal

#: Operand storage types the micro-kernels read (converted to f32 as they are loaded or packed).
OPERAND_DTYPES = frozenset({DType.F32, DType.BF16, DType.F16, DType.I8})


@dataclass(frozen=True)
class Contraction:
    """A recognised contraction ``C[batch.., m, n] = sum(A[..m..k..] * B[..k..n..] for k)``.

    ``a`` and ``b`` are the two loads (casts stripped); ``m`` is None when no result axis
    indexes only ``A`` (a matrix-vector product). ``epilogue`` is the folded elementwise op
    (its loads of ``result`` read the finished element), or None.
    """

    result: str
    a: ir.Load
    b: ir.Load
    m: str | None
    n: str
    k: str
    batch: tuple[str, ...]
    epilogue: ir.MapOp | None = None


def _plain_position(load: ir.Load, axis: str) -> int | None:
    """Where ``axis`` is a whole subscript of ``load``, if that is its only use there; else None."""
    where = [p for p, s in enumerate(load.indices) if s == ir.Idx(axis)]
    uses = [p for p, s in enumerate(load.indices) if any(isinstance(x, ir.Idx) and x.name == axis
                                                        for x in ir.walk(s))]
    return where[0] if len(where) == 1 and uses == where else None


def _mentions(load: ir.Load, axis: str) -> bool:
    return any(isinstance(x, ir.Idx) and x.name == axis for s in load.indices for x in ir.walk(s))


def _operand(e: ir.SExpr) -> ir.Load | None:
    """The load under an (optional) cast to f32, if it is one the micro-kernels read."""
    if isinstance(e, ir.Cast) and e.dtype is DType.F32:
        e = e.x
    if isinstance(e, ir.Load) and e.dtype in OPERAND_DTYPES and not any(
            isinstance(x, ir.Load) for s in e.indices for x in ir.walk(s)):
        return e
    return None


def contraction_of(op: PlanOp) -> Contraction | None:
    """``op`` as a contraction, or None when it is not one the micro-kernels can run."""
    if isinstance(op, ir.ContractOp):
        pair = (_operand(op.lhs), _operand(op.rhs))
    elif isinstance(op, ir.ReduceOp) and op.kind == "sum" and isinstance(op.body, ir.Binary) \
            and op.body.op == "mul" and op.body.dtype is DType.F32:
        pair = (_operand(op.body.a), _operand(op.body.b))
    else:
        return None
    lhs, rhs = pair
    if lhs is None or rhs is None or not op.dtype.is_float or not op.axes or len(op.reduce_axes) != 1:
        return None
    k = op.reduce_axes[0].name
    n = op.axes[-1].name
    if _mentions(lhs, n) == _mentions(rhs, n):
        return None
    a, b = (rhs, lhs) if _mentions(lhs, n) else (lhs, rhs)
    if _plain_position(b, n) is None or _plain_position(a, k) is None or _plain_position(b, k) is None:
        return None
    only_a = [x.name for x in op.axes[:-1] if _mentions(a, x.name) and not _mentions(b, x.name)]
    if len(only_a) > 1:
        return None
    m = only_a[0] if only_a else None
    if m is not None and _plain_position(a, m) is None:
        return None
    batch = tuple(x.name for x in op.axes[:-1] if x.name != m)
    return Contraction(op.result, a, b, m, n, k, batch)


def _epilogue(fn: ir.Function, ops: list[PlanOp], start: int, c: Contraction) -> ir.MapOp | None:
    """The elementwise op right after the contraction that can be folded into it, if any."""
    if start + 1 >= len(ops) or c.result in fn.results:
        return None
    op, nxt = ops[start], ops[start + 1]
    if not isinstance(nxt, ir.MapOp) or len(nxt.axes) != len(op.axes):
        return None
    if not all(equal(x.extent, y.extent) for x, y in zip(nxt.axes, op.axes)):
        return None
    same = tuple(ir.Idx(x.name) for x in nxt.axes)
    loads = [x for x in ir.walk(nxt.body) if isinstance(x, ir.Load) and x.src == c.result]
    if not loads or any(x.indices != same for x in loads):
        return None
    if readers(ops[start + 2:], c.result):
        return None
    return nxt


def match_contraction(fn: ir.Function, ops: list[PlanOp], start: int,
                      strategy: sir.Strategy | None) -> Dispatch | None:
    """A contraction dispatch at ``ops[start]`` (with its epilogue), or None."""
    op = ops[start]
    c = contraction_of(op)
    if c is None:
        return None
    # workers always split the batch axes and the n range (a `parallel` decision cannot change
    # a contraction's result, only its speed)
    epi = _epilogue(fn, ops, start, c)
    if epi is None:
        return Dispatch(op, "contraction", c.n, pattern=c)
    c = Contraction(c.result, c.a, c.b, c.m, c.n, c.k, c.batch, epi)
    return Dispatch(epi, "contraction", c.n, ops=(op, epi), pattern=c, internal=(op.result,))


__all__ = ["Contraction", "contraction_of", "match_contraction", "op_exprs"]
