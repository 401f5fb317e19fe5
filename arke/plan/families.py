"""Kernel families: what kind of loop nest a dispatch is, which decides how targets lower it.

* ``pointwise``   — a map of an elementwise expression
* ``layout``      — a map whose body is one load of permuted/broadcast subscripts (transpose, copy)
* ``gather``      — a map reading through data-dependent subscripts (embedding, loss targets)
* ``reduction``   — a reduce op (norms, softmax statistics, logsumexp)
* ``contraction`` — a contract op (matmul, bmm, linear, attention's products)
* ``scan``        — a scan op (cumsum, the linear recurrence of a selective scan): rows in
  parallel, each in sequence along the scanned axis
* ``rows``        — consecutive ops over the same leading rows, run row by row in one dispatch
  (a norm's or softmax's statistics and the map that uses them; :mod:`arke.plan.rows`)
* ``topk``        — a top-k selection kept whole (its values and positions together), on targets
  that list :data:`TOPK` among their families (:mod:`arke.plan.topk`); elsewhere it is lowered
"""

from __future__ import annotations

from arke.ir import semantic as ir

FAMILIES = ("pointwise", "layout", "gather", "reduction", "contraction", "rows", "attention", "scan", "topk")
#: the family of a native top-k dispatch, and the token a target lists among its families to get one
TOPK = "topk"


def subexprs(e: ir.SExpr) -> list[ir.SExpr]:
    """``e`` and every expression inside it, parents first."""
    return list(ir.walk(e))


def is_gather(e: ir.SExpr) -> bool:
    """Whether some load's subscript reads a tensor (a data-dependent address)."""
    return any(isinstance(x, ir.Load) and any(isinstance(y, ir.Load) for i in x.indices for y in subexprs(i))
               for x in subexprs(e))


def family(op: ir.MapOp | ir.ReduceOp | ir.ContractOp | ir.ScanOp) -> str:
    """The family of one dispatch."""
    if isinstance(op, ir.ScanOp):
        return "scan"
    if isinstance(op, ir.ContractOp):
        return "contraction"
    if isinstance(op, ir.ReduceOp):
        return "reduction"
    if is_gather(op.body):
        return "gather"
    body = op.body
    if isinstance(body, ir.Load) and all(isinstance(i, ir.Idx | ir.Const) for i in body.indices):
        return "layout"
    return "pointwise"
