"""Named linalg ops where they fit: ``linalg.matmul``/``batch_matmul`` for plain f32 matrix
products (transposed operands through ``indexing_maps``), ``linalg.transpose`` for
permutations, and no op at all for an identity copy (tensors are values).
:mod:`arke.targets.mlir.lowering` renders everything else as ``linalg.generic``.
"""

from __future__ import annotations

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.targets.mlir.body import STORAGE
from arke.targets.mlir.ops import Lowered, Operand, OpLowering


def named_op(self: OpLowering, tag: str) -> Lowered | None:
    """``linalg.matmul``/``batch_matmul`` for plain f32 matrix products, ``linalg.transpose`` for
    permutations; None when the op is not one of these."""
    op = self.op
    if self.splits:  # a split axis needs its expand/collapse views: the generic path has them
        return None
    if isinstance(op, ir.MapOp) and isinstance(op.body, ir.Load) and op.body.dtype == op.dtype:
        return _transpose(self, tag, op.body)
    if not (isinstance(op, ir.ReduceOp) and op.kind == "sum" and op.dtype is DType.F32):
        return None
    b = op.body
    if not (isinstance(b, ir.Binary) and b.op == "mul" and isinstance(b.a, ir.Load) and isinstance(b.b, ir.Load)
            and b.a.dtype is DType.F32 and b.b.dtype is DType.F32):
        return None
    names = [lp.name for lp in self.loops]
    if len(names) not in (3, 4) or len(op.reduce_axes) != 1:
        return None
    ma, mb = self.subscript_map(b.a), self.subscript_map(b.b)
    if ma is None or mb is None or "0" in ma[0] or "0" in mb[0]:
        return None
    *batch, m, n, k = names
    lhs_ok = {(*batch, m, k), (*batch, k, m)}
    rhs_ok = {(*batch, k, n), (*batch, n, k)}
    a, bb = b.a, b.b
    if ma[0] in rhs_ok and mb[0] in lhs_ok:
        a, bb, ma, mb = bb, a, mb, ma
    if ma[0] not in lhs_ok or mb[0] not in rhs_ok:
        return None
    cache: dict[tuple[str, tuple[str, ...]], Operand] = {}
    oa, ob = self.operand(a, ma[0], (), cache), self.operand(bb, mb[0], (), cache)
    out_shape = tuple(lp.extent for lp in self.loops[:-1])
    out_type = self.ctx.tensor_type(out_shape, "f32")
    init = self.ctx.empty(out_shape, "f32")
    zero = self.ctx.fresh("c")
    self.ctx.emit(f"{zero} = arith.constant 0.0 : f32")
    filled = self.ctx.fresh("f")
    self.ctx.emit(f"{filled} = linalg.fill ins({zero} : f32) outs({init} : {out_type}) -> {out_type}")
    maps = ", ".join(self.affine_map(x, self.loops) for x in (ma[0], mb[0], tuple(names[:-1])))
    kind = "linalg.batch_matmul" if batch else "linalg.matmul"
    r = self.ctx.fresh("r")
    self.ctx.emit(f"{r} = {kind} indexing_maps = [{maps}] ins({oa.ssa}, {ob.ssa} : {oa.type}, {ob.type}) "
                  f"outs({filled} : {out_type}) {{arke.value = \"{tag}\"}} -> {out_type}")
    return Lowered(r, tuple(self.loops))


def _transpose(self: OpLowering, tag: str, ld: ir.Load) -> Lowered | None:
    mapped = self.subscript_map(ld)
    names = [lp.name for lp in self.loops]
    if mapped is None or mapped[1] or sorted(mapped[0]) != sorted(names) or len(names) == 0:
        return None
    t = self.ctx.tensor(ld.src)
    if mapped[0] == tuple(names):
        return Lowered(t.ssa, tuple(self.loops))  # values are immutable: the same tensor
    perm = [mapped[0].index(n) for n in names]
    shape = tuple(lp.extent for lp in self.loops)
    elem = STORAGE[t.dtype]
    init = self.ctx.empty(shape, elem)
    r = self.ctx.fresh("r")
    self.ctx.emit(f"{r} = linalg.transpose ins({t.ssa} : {self.ctx.tensor_type(t.shape, elem)}) "
                  f"outs({init} : {self.ctx.tensor_type(shape, elem)}) permutation = {perm} "
                  f"{{arke.value = \"{tag}\"}}")
    return Lowered(r, tuple(self.loops))
