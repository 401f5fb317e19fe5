"""A scan dispatch in Triton: one program per row, the scanned axis walked in blocks, each block
scanned in parallel with ``tl.associative_scan`` and joined to the carry of the blocks before.

A row is every point of the op's other axes (the grid is their product). Each block of
``BLOCK`` positions evaluates the body (and the coefficient of a recurrence) at once, scans it
with the kind's combine function, applies the carry and stores; the carry is the block's last
result. ``cumsum``/``cumprod`` and the recurrence are thereby reassociated within a block (the
tolerance rule allows it: spec/language.md §8.9), ``cummax``/``cummin`` and integer scans stay
exact. The recurrence ``h = a * h + b`` scans the pairs ``(a, b)`` with
``(a1, b1) ∘ (a2, b2) = (a1·a2, a2·b1 + b2)``: position ``j`` of a block is then
``A_j · carry + B_j``. An exclusive scan reads the body one position back (the identity at
position 0), so the carry still ends each block. The block order is fixed by the shape alone:
the results are deterministic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.plan.exprs import product
from arke.targets.triton.expr import accumulator, identity

if TYPE_CHECKING:
    from arke.targets.triton.render import _Dispatch, _Env

#: positions per block of the scanned axis
SCAN_BLOCK = 256

#: the combine functions ``tl.associative_scan`` takes (``a`` the earlier part, ``b`` the later: a NaN in
#: either wins max/min, as in the interpreter)
SCAN_HELPERS = '''
@triton.jit
def _ak_scan_add(a, b):
    return a + b


@triton.jit
def _ak_scan_mul(a, b):
    return a * b


@triton.jit
def _ak_scan_max(a, b):
    return tl.where(a != a, a, tl.where((b > a) | (b != b), b, a))


@triton.jit
def _ak_scan_min(a, b):
    return tl.where(a != a, a, tl.where((b < a) | (b != b), b, a))


@triton.jit
def _ak_scan_imax(a, b):
    return tl.maximum(a, b)


@triton.jit
def _ak_scan_imin(a, b):
    return tl.minimum(a, b)


@triton.jit
def _ak_scan_linear(a1, b1, a2, b2):
    return a1 * a2, a2 * b1 + b2
'''


def _combine(kind: str, dtype: DType) -> str:
    if kind in ("sum", "prod"):
        return "_ak_scan_add" if kind == "sum" else "_ak_scan_mul"
    return f"_ak_scan_{'' if dtype.is_float else 'i'}{kind}"


def scan_program(disp: _Dispatch, op: ir.ScanOp) -> None:
    """Emit the body of ``disp``'s function for scan ``op`` (see the module doc)."""
    src = disp.src
    blk = disp.block_for([op.axis], SCAN_BLOCK, "BLOCK")
    outer = [a for a in op.axes if a.name != op.axis]
    disp.grid = product([a.extent for a in outer])
    pid = src.fresh()
    src.line(f"{pid} = tl.program_id(0).to(tl.int64)", 1)
    fixed = disp.decompose(pid, outer, 1) if outer else {}
    acc = accumulator(op.dtype)
    ident = identity("sum" if op.kind == "linear" else op.kind, op.dtype)
    carry = src.fresh()
    # the carry is a scalar (a sum over one lane), as the block's last result will be: a loop keeps its type
    if op.init is None:
        src.line(f"{carry} = tl.sum(tl.full([1], {ident}, {acc}), 0)", 1)
    else:
        e = disp.emitter("[1]", fixed, None, 1, op, _no_env())
        v = e.expr(_typed(op.init, op.dtype))
        src.line(f"{carry} = tl.sum(tl.full([1], 0, {acc}) + ({v}).to({acc}), 0)", 1)
    n = src.dim(op.scan_axis.extent)
    base, offs, pos, mask, omask = (src.fresh() for _ in range(5))
    src.line(f"for {base} in range(0, {n}, {blk}):", 1)
    src.line(f"{offs} = {base} + tl.arange(0, {blk}).to(tl.int64)", 2)
    src.line(f"{pos} = {offs} - 1" if op.exclusive else f"{pos} = {offs}", 2)
    src.line(f"{mask} = ({pos} >= 0) & ({pos} < {n})", 2)
    src.line(f"{omask} = {offs} < {n}", 2)
    e = disp.emitter(f"[{blk}]", {**fixed, op.axis: pos}, mask, 2, op, _no_env())
    x = e.let(f"tl.where({mask}, ({e.expr(_typed(op.body, op.dtype))}).to({acc}), {ident})")
    res = src.fresh()
    if op.kind == "linear":
        assert op.coeff is not None
        one = identity("prod", op.dtype)  # 1 in the accumulator's kind (an integer pair stays integer)
        a = e.let(f"tl.where({mask}, ({e.expr(_typed(op.coeff, op.dtype))}).to({acc}), {one})")
        pa, pb = src.fresh(), src.fresh()
        src.line(f"{pa}, {pb} = tl.associative_scan(({a}, {x}), 0, _ak_scan_linear)", 2)
        src.line(f"{res} = {pa} * {carry} + {pb}", 2)
    else:
        s = e.let(f"tl.associative_scan({x}, 0, {_combine(op.kind, op.dtype)})")
        src.line(f"{res} = {_combine(op.kind, op.dtype)}({carry}, {s})", 2)
    last = src.fresh()
    src.line(f"{last} = tl.arange(0, {blk}) == {blk} - 1", 2)
    src.line(f"{carry} = tl.sum(tl.where({last}, {res}, tl.zeros_like({res})), 0)", 2)
    out = disp.emitter(f"[{blk}]", {**fixed, op.axis: offs}, omask, 2, op, _no_env())
    value = res
    if op.dtype.is_bool:
        value = out.let(f"{res} != 0")
    elif not op.dtype.is_float:
        value = out.let(f"{res}.to({_compute(op.dtype)})")
    out.store(src.buffer(op.result), [ir.Idx(a.name) for a in op.axes], value, op.dtype)


def _typed(e: ir.SExpr, dtype: DType) -> ir.SExpr:
    return e if e.dtype == dtype else ir.Cast(e, dtype)


def _compute(dtype: DType) -> str:
    from arke.targets.triton.expr import COMPUTE

    return COMPUTE[dtype]


def _no_env() -> _Env:
    from arke.targets.triton.render import _Env

    return _Env()
