"""The contraction family: matmul-like ops recognised from plain math, with a fused epilogue.

An op is a contraction when it is ``sum(A * B for k)`` over one reduce axis ``k`` of two
loads (a :class:`~arke.ir.semantic.ContractOp`, or a ``reduce.sum`` of a product of two
loads, each perhaps cast to f32: bf16/f16 activations or int8 weights), where

* ``n``, the result's last axis, indexes only ``B`` (lanes of the micro-kernel run along it);
* ``m``, when there is one, is the innermost result axis that indexes only ``A`` (rows of the
  micro-kernel), and
* every other result axis is a *batch* axis: it may appear in either load, in any
  subscript expression (GQA's ``h / R``), but never together with ``m``, ``n`` or ``k``.

``m``, ``n`` and ``k`` must be plain subscripts (so an operand's address is affine in them),
and the result a float.

A sum over several reduce axes (``sum(h[e, t, f] * wd[e, d, f] for e, f)``: a mixture of
experts' down projection) is a *batch-reduce* contraction for the targets whose renderer lists
:data:`BATCH_REDUCE` among its families: ``k`` is the innermost reduce axis that both sides index,
every load using it as a plain subscript; the others (``outer``) may appear in either side in any
subscript, like batch axes, and run as loops around the k loop, each step accumulating
``A_e · B_e`` into the same sums (the epilogue is applied once, after the last). Plans for other
targets leave such sums to the generic loop nest, as they do when no reduce axis qualifies.

An elementwise op that reads the contraction's result only at the
same element (``+ bias[n]``, ``silu(g) * u``, ``* scale[n]``) and nothing else reads it is
folded in as the *epilogue*: applied to each finished element, so the raw contraction
never reaches memory. Anything else stays with the generic loop nest, which is always
correct.

An epilogue ``acc-expr if cond else other`` (or ``other if cond else acc-expr``) whose condition
reads only the batch axes and ``m``, and whose other branch does not read the sum, is a **row
condition** (``rows_when``): a row where it is false needs no sum at all (the routed tokens of
an expert in a mixture of experts: ``sum(x[t, d] * w[e, f, d] for d) if routed[t, e] else 0.0``).
A renderer may run the contraction over the rows where it holds only (a grouped product with a
data-dependent row count per batch entry) and store the other branch elsewhere; one that
ignores it computes every row and the epilogue selects, with the same result.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from arke.ir import semantic as ir
from arke.ir import strategy as sir
from arke.ir.dtypes import DType
from arke.ir.shapes import equal
from arke.passes.rewrite import map_expr
from arke.plan.dispatch import Dispatch, PlanOp, readers

#: The form a renderer lists among its ``families`` when its contraction family loops over extra
#: reduce axes (``Contraction.outer``); plans for it offer the multi-axis form (the default plan too).
BATCH_REDUCE = "batch-reduce"

#: Operand storage types the micro-kernels read (converted to f32 as they are loaded or packed).
OPERAND_DTYPES = frozenset({DType.F32, DType.BF16, DType.F16, DType.I8})

#: The form a renderer lists among its ``families`` when it runs an *integer* contraction: ``sum(i32(a[m, k])
#: * i32(b[n, k]) for k)`` of two int8 loads, both contiguous along k, into an i32 result (exact: the sums
#: are the interpreter's bits), on a unit that multiplies int8 (AMX's ``TDPBSSD``). Plans for other
#: renderers leave such a sum to the generic loop nest.
INT8_CONTRACTION = "int8-contraction"


@dataclass(frozen=True)
class Contraction:
    """A recognised contraction ``C[batch.., m, n] = sum(A(.., m, k) * B(.., k, n) for k)``.

    ``a`` and ``b`` are the two sides of the product: each either a plain load (casts
    stripped; the fast paths read it in place) or an elementwise *prologue* expression (a
    fused producer such as a norm's ``x[m, k] * inv[m] * w[k]``), evaluated once per element
    as the operand is packed. ``m`` is None when no result axis indexes only ``A`` (a
    matrix-vector product). ``epilogue`` is the folded elementwise op (its loads of ``result``
    read the finished element), or None. ``outer``: the other reduce axes of a batch-reduce
    contraction, outermost first (empty for one reduce axis); the sums run over them around ``k``.
    """

    result: str
    a: ir.SExpr
    b: ir.SExpr
    m: str | None
    n: str
    k: str
    batch: tuple[str, ...]
    epilogue: ir.MapOp | None = None
    outer: tuple[str, ...] = ()
    rows_when: ir.SExpr | None = None  # the row condition, in the contraction's axis names (see above)

    def plain_a(self) -> ir.Load | None:
        """``a`` as a load the micro-kernel can broadcast from in place (m and k plain subscripts)."""
        return _plain_operand(self.a, (self.m, self.k))

    def plain_b(self) -> ir.Load | None:
        """``b`` as a load whose panels can be copied directly (k and n plain subscripts)."""
        return _plain_operand(self.b, (self.k, self.n))


def _plain_position(load: ir.Load, axis: str) -> int | None:
    """Where ``axis`` is a whole subscript of ``load``, if that is its only use there; else None."""
    where = [p for p, s in enumerate(load.indices) if s == ir.Idx(axis)]
    uses = [p for p, s in enumerate(load.indices) if any(isinstance(x, ir.Idx) and x.name == axis
                                                        for x in ir.walk(s))]
    return where[0] if len(where) == 1 and uses == where else None


def _plain_operand(e: ir.SExpr, axes: tuple[str | None, ...]) -> ir.Load | None:
    """The load under an (optional) cast to f32, if the micro-kernels can read it in place."""
    if isinstance(e, ir.Cast) and e.dtype in (DType.F32, DType.I32):  # (i32: an integer contraction's int8)
        e = e.x
    if not isinstance(e, ir.Load) or e.dtype not in OPERAND_DTYPES:
        return None
    if any(isinstance(x, ir.Load) for s in e.indices for x in ir.walk(s)):
        return None
    if any(a is not None and _plain_position(e, a) is None for a in axes):
        return None
    return e


def _axes(e: ir.SExpr) -> set[str]:
    return {x.name for x in ir.walk(e) if isinstance(x, ir.Idx)}


def _factors(e: ir.SExpr) -> list[ir.SExpr]:
    """The factors of a float product tree, left to right."""
    if isinstance(e, ir.Binary) and e.op == "mul" and e.dtype is DType.F32:
        return _factors(e.a) + _factors(e.b)
    return [e]


def _product(fs: list[ir.SExpr]) -> ir.SExpr:
    out = fs[0]
    for f in fs[1:]:
        out = ir.Binary("mul", out, f, DType.F32)
    return out


def contraction_of(op: PlanOp, batch_reduce: bool = False, integer: bool = False) -> Contraction | None:
    """``op`` as a contraction, or None when it is not one the micro-kernels can run; ``batch_reduce``:
    a sum over several reduce axes may be one (its renderer loops over the extra ones); ``integer``: an
    int8 × int8 → i32 sum may be one (:data:`INT8_CONTRACTION`)."""
    if integer and op.dtype is DType.I32:
        return _integer_contraction(op)
    if isinstance(op, ir.ContractOp):
        if op.lhs.dtype is not DType.F32 and op.lhs.dtype not in OPERAND_DTYPES:
            return None
        factors: list[ir.SExpr] = [_f32(op.lhs), _f32(op.rhs)]
    elif isinstance(op, ir.ReduceOp) and op.kind == "sum" and op.body.dtype is DType.F32 and not op.limits:
        factors = _factors(op.body)
    else:
        return None
    if not op.dtype.is_float or not op.axes or not op.reduce_axes or len(factors) < 2:
        return None
    if len(op.reduce_axes) > 1 and not batch_reduce:
        return None
    if any(x.dtype is not DType.F32 for x in factors):
        return None
    n = op.axes[-1].name
    b_side = [f for f in factors if n in _axes(f)]
    a_side = [f for f in factors if n not in _axes(f)]
    if not a_side or not b_side:
        return None
    reduced = [a.name for a in op.reduce_axes]
    k = reduced[0] if len(reduced) == 1 else _depth(reduced, a_side, b_side)
    if k is None:
        return None
    a_axes = set().union(*(_axes(f) for f in a_side))
    b_axes = set().union(*(_axes(f) for f in b_side))
    only_a = [x.name for x in op.axes[:-1] if x.name in a_axes and x.name not in b_axes]
    # the innermost axis only A has is the micro-kernel's rows; any others (a batch of
    # activations against one weight) are batch axes like the shared ones
    m = only_a[-1] if only_a else None
    batch = tuple(x.name for x in op.axes[:-1] if x.name != m)
    outer = tuple(r for r in reduced if r != k)
    return Contraction(op.result, _product(a_side), _product(b_side), m, n, k, batch, outer=outer)


def _integer_contraction(op: PlanOp) -> Contraction | None:
    """``sum(i32(a[.., m, k]) * i32(b[.., n, k]) for k)`` of two int8 loads contiguous along k, as a contraction."""
    if not isinstance(op, ir.ReduceOp) or op.kind != "sum" or op.limits or len(op.reduce_axes) != 1 or not op.axes:
        return None
    body = op.body
    if not (isinstance(body, ir.Binary) and body.op == "mul" and body.dtype is DType.I32):
        return None
    sides = []
    for f in (body.a, body.b):
        if not (isinstance(f, ir.Cast) and f.dtype is DType.I32 and isinstance(f.x, ir.Load) and f.x.dtype is DType.I8):
            return None
        sides.append(f)
    n, k = op.axes[-1].name, op.reduce_axes[0].name
    a_side = [f for f in sides if n not in _axes(f)]
    b_side = [f for f in sides if n in _axes(f)]
    if len(a_side) != 1 or len(b_side) != 1:
        return None
    a_axes, b_axes = _axes(a_side[0]), _axes(b_side[0])
    only_a = [x.name for x in op.axes[:-1] if x.name in a_axes and x.name not in b_axes]
    m = only_a[-1] if only_a else None
    c = Contraction(op.result, a_side[0], b_side[0], m, n, k, tuple(x.name for x in op.axes[:-1] if x.name != m))
    pa, pb = c.plain_a(), c.plain_b()
    if pa is None or pb is None or pa.indices[-1] != ir.Idx(k) or pb.indices[-1] != ir.Idx(k):
        return None
    return c


def _depth(reduced: list[str], a_side: list[ir.SExpr], b_side: list[ir.SExpr]) -> str | None:
    """The micro-kernel's k of a sum over several axes: the innermost reduce axis that both sides
    index, every load that uses it as a whole subscript of its own (so both operands' addresses
    step evenly along it and B's panels pack as for one axis); None when no axis qualifies."""
    def plain(side: list[ir.SExpr], axis: str) -> bool:
        loads = [x for f in side for x in ir.walk(f) if isinstance(x, ir.Load) and axis in _axes(x)]
        return bool(loads) and all(_plain_position(x, axis) is not None for x in loads)

    return next((r for r in reversed(reduced) if plain(a_side, r) and plain(b_side, r)), None)


def _f32(load: ir.Load) -> ir.SExpr:
    return load if load.dtype is DType.F32 else ir.Cast(load, DType.F32)


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


def row_condition(c: Contraction, axes: tuple[ir.Axis, ...], epi: ir.MapOp) -> ir.SExpr | None:
    """The condition under which a row of ``epi`` (an epilogue of ``c``, whose op has ``axes``) needs
    its sum, renamed to the contraction's axes; None when the epilogue is not such a select."""
    body = epi.body
    if c.m is None or not isinstance(body, ir.Select):
        return None

    def reads(e: ir.SExpr) -> bool:
        return any(isinstance(x, ir.Load) and x.src == c.result for x in ir.walk(e))

    if reads(body.cond) or reads(body.a) == reads(body.b):
        return None
    cond = body.cond if reads(body.a) else ir.Unary("not", body.cond, DType.BOOL)
    names = {mine.name: theirs.name for mine, theirs in zip(epi.axes, axes)}
    rows = {*c.batch, c.m}
    if any(isinstance(x, ir.Idx) and names.get(x.name) not in rows for x in ir.walk(cond)):
        return None
    return map_expr(cond, lambda e: ir.Idx(names[e.name]) if isinstance(e, ir.Idx) else e)


def match_contraction(fn: ir.Function, ops: list[PlanOp], start: int,
                      strategy: sir.Strategy | None, batch_reduce: bool = False,
                      integer: bool = False) -> Dispatch | None:
    """A contraction dispatch at ``ops[start]`` (with its epilogue), or None; ``batch_reduce``: the
    target renders contractions over several reduce axes (:data:`BATCH_REDUCE`); ``integer``: it
    renders int8 × int8 → i32 ones (:data:`INT8_CONTRACTION`)."""
    op = ops[start]
    c = contraction_of(op, batch_reduce, integer)
    if c is None:
        return None
    # workers always split the batch axes and the n range (a `parallel` decision cannot change
    # a contraction's result, only its speed)
    epi = _epilogue(fn, ops, start, c)
    if epi is None:
        return Dispatch(op, "contraction", c.n, pattern=c)
    c = replace(c, epilogue=epi, rows_when=row_condition(c, op.axes, epi))
    return Dispatch(epi, "contraction", c.n, ops=(op, epi), pattern=c, internal=(op.result,))


__all__ = ["BATCH_REDUCE", "INT8_CONTRACTION", "Contraction", "contraction_of", "match_contraction", "row_condition"]
