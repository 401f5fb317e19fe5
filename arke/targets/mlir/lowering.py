"""The linalg ops one SemanticIR op lowers to, and the tensor that says whether its checks failed.

:class:`Lowering` is called by :mod:`arke.targets.mlir.render` for each op of a kernel, in
order (``Lowering(ctx, op, guards).lower(tag)``). A named op where one fits
(:mod:`arke.targets.mlir.named`), else one ``linalg.generic`` over the op's loops
(:class:`arke.targets.mlir.ops.OpLowering` works out the loops, operands and region): a
reduction accumulates in f32 from a ``linalg.fill`` of its identity and is rounded to a 16-bit
result by a second generic; a split axis's two loops are collapsed back into one dim. When the
region checks subscripts or integer divisors, a second generic over just the loops they depend
on computes one flag per element, or-ed into a 0-d ``i8`` tensor (:meth:`Lowering._check`).
"""

from __future__ import annotations

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim
from arke.targets.literals import float_literal
from arke.targets.mlir.body import COMPUTE, STORAGE, Body, Source, hazardous
from arke.targets.mlir.named import named_op
from arke.targets.mlir.ops import SPLIT_SUFFIX, Loop, Lowered, Operand, OpLowering, reassociation


def _identity(kind: str, dtype: DType) -> str:
    """The MLIR literal of a reduction's identity in its accumulator type."""
    if dtype.is_float:
        value = {"sum": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf")}[kind]
        return float_literal(value)
    if dtype.is_bool:
        return {"sum": "0", "prod": "1", "max": "0", "min": "1"}[kind]
    bits = int(COMPUTE[dtype][1:])
    if dtype.is_unsigned:  # -1: every bit set, the largest value
        return {"sum": "0", "prod": "1", "max": "0", "min": "-1"}[kind]
    return str({"sum": 0, "prod": 1, "max": -(2 ** (bits - 1)), "min": 2 ** (bits - 1) - 1}[kind])


class Lowering(OpLowering):
    """:class:`OpLowering` plus the emission of the linalg op(s)."""

    def lower(self, tag: str) -> Lowered:
        op = self.op
        named = named_op(self, tag)
        if named is not None:
            return named
        cache: dict[tuple[str, tuple[str, ...]], Operand] = {}
        operands: list[tuple[Operand, str]] = []
        reduce = isinstance(op, ir.ReduceOp)
        tied = reduce and may_fold_away(op.body)
        acc = _acc_dtype(op.dtype) if reduce else op.dtype
        acc_ty = STORAGE[acc] if reduce else STORAGE[op.dtype]
        result: list[str] = []

        def exprs(body: Body) -> None:
            v = body.value(op.body, op.dtype if op.dtype.is_bool or not reduce else acc)
            if isinstance(op, ir.ReduceOp):
                if op.dtype.is_bool:
                    v = body.let(f"arith.extui {v} : i1 to i8")
                if tied:
                    v = self._kept_term(body, v, acc_ty)
                unsigned = op.dtype.is_bool or op.dtype.is_unsigned
                v = body.combine(op.kind, "%out", v, acc_ty + "u" if unsigned else acc_ty)
            else:
                v = body.store_value(v, op.dtype)
            result.append(v)

        body = self.region(self.loops, exprs, "b", cache, operands)
        par = [lp for lp in self.loops if lp.kind == "parallel"]
        out_shape = tuple(lp.extent for lp in par)
        out_type = self.ctx.tensor_type(out_shape, acc_ty)
        init = self.ctx.empty(out_shape, acc_ty)
        if reduce:
            assert isinstance(op, ir.ReduceOp)
            filled = self.ctx.fresh("f")
            self.ctx.emit(f"{filled} = linalg.fill ins({self._literal(op.kind, op.dtype)} : {acc_ty}) "
                          f"outs({init} : {out_type}) -> {out_type}")
            init = filled
        red = [lp for lp in self.loops if lp.kind == "reduction"]
        ins = self._inputs(operands, [lp.name for lp in (*par, *red)] if tied else [lp.name for lp in par])
        if tied:
            ins.append(self._opaque_zero(red))
        r = self._generic(tag, ins, (init, out_type, tuple(lp.name for lp in par)), body, result[0], acc_ty)
        if reduce and op.dtype != acc:
            r = self._round(r, out_shape, acc, op.dtype)
        r = self._collapse(r, par, STORAGE[op.dtype])
        lowered = Lowered(r, tuple(self.loops))
        if body.flags:
            lowered.check = self._check(tag)
        return lowered

    @staticmethod
    def _kept_term(body: Body, v: str, ty: str) -> str:
        """A reduction's term ``v`` tied to :meth:`_opaque_zero`'s block argument: ``zero == 0 ? v : 0``, where
        :func:`may_fold_away` says IREE may fold it.

        IREE folds a term that reads no input (``x ** 0``, ``x * 0 + 1`` on integers, ``n`` alone), and its CPU
        vectorizer then adds it once per vector of the reduced loop, not once per element (``sum(x ** 0 for
        n)`` over 3 gave 1). A term that reads an input it cannot see through is reduced element by element."""
        zero = body.let("arith.constant 0 : i8")
        keep = body.let(f"arith.cmpi eq, %zero, {zero} : i8")
        other = body.let(f"arith.constant {'0.0' if ty.startswith('f') else '0'} : {ty.rstrip('u')}")
        return body.let(f"arith.select {keep}, {v}, {other} : {ty.rstrip('u')}")

    def _opaque_zero(self, red: list[Loop]) -> tuple[str, str, tuple[str, ...], str]:
        """An input over the reduced loops holding zeros IREE cannot see (behind an optimization barrier, its
        dynamic sizes tied), read as ``%zero`` by :meth:`_kept_term`: bytes, one per reduced element."""
        shape = tuple(lp.extent for lp in red)
        t = self.ctx.tensor_type(shape, "i8")
        c = self.ctx.fresh("c")
        self.ctx.emit(f"{c} = arith.constant 0 : i8")
        filled = self.ctx.fresh("f")
        self.ctx.emit(f"{filled} = linalg.fill ins({c} : i8) outs({self.ctx.empty(shape, 'i8')} : {t}) -> {t}")
        kept = self.ctx.fresh("c")
        self.ctx.emit(f"{kept} = util.optimization_barrier {filled} : {t}")
        sizes = [self._size(d) for d in shape if not isinstance(sympy.sympify(d), sympy.Integer)]
        if sizes:
            tied = self.ctx.fresh("c")
            self.ctx.emit(f"{tied} = flow.tensor.tie_shape {kept} : {t}{{{', '.join(sizes)}}}")
            kept = tied
        return kept, t, tuple(lp.name for lp in red), "%zero"

    def _literal(self, kind: str, dtype: DType) -> str:
        v = self.ctx.fresh("c")
        ty = STORAGE[_acc_dtype(dtype)]
        self.ctx.emit(f"{v} = arith.constant {_identity(kind, dtype)} : {ty}")
        return v

    def _inputs(self, operands: list[tuple[Operand, str]], covered: list[str],
                loops: list[Loop] | None = None) -> list[tuple[str, str, tuple[str, ...], str]]:
        """(ssa, type, map loop names, block arg) of each input, plus a shape carrier for loops nothing reads."""
        ins = [(o.ssa, o.type, o.results, arg) for o, arg in operands]
        seen = set(covered) | {n for _, _, names, _ in ins for n in names}
        missing = [lp for lp in (self.loops if loops is None else loops) if lp.name not in seen]
        if missing:
            # linalg takes loop bounds from its operands' shapes: a loop nothing reads (a reduction
            # over an index only used in arithmetic) gets an empty tensor of its extent to read.
            shape = tuple(lp.extent for lp in missing)
            ins.append((self.ctx.empty(shape, "i8"), self.ctx.tensor_type(shape, "i8"),
                        tuple(lp.name for lp in missing), "%carrier"))
        return ins

    def _generic(self, tag: str, ins: list[tuple[str, str, tuple[str, ...], str]],
                 out: tuple[str, str, tuple[str, ...]], body: Body, value: str, out_elem: str,
                 loops: list[Loop] | None = None, iterators: list[str] | None = None) -> str:
        loops = self.loops if loops is None else loops
        iterators = [lp.kind for lp in loops] if iterators is None else iterators
        maps = [self.affine_map(names, loops) for _, _, names, _ in ins] + [self.affine_map(out[2], loops)]
        its = ", ".join(f'"{k}"' for k in iterators)
        head = f"{{indexing_maps = [{', '.join(maps)}], iterator_types = [{its}]}}"
        ins_text = (f" ins({', '.join(s for s, _, _, _ in ins)} : {', '.join(t for _, t, _, _ in ins)})"
                    if ins else "")
        r = self.ctx.fresh("r")
        self.ctx.emit(f"{r} = linalg.generic {head}{ins_text} outs({out[0]} : {out[1]}) "
                      f"attrs = {{arke.value = \"{tag}\"}} {{")
        args = [f"{arg}: {_elem(t)}" for _, t, _, arg in ins] + [f"%out: {out_elem}"]
        self.ctx.emit(f"^bb0({', '.join(args)}):")
        for line in body.lines:
            self.ctx.emit("  " + line)
        self.ctx.emit(f"  linalg.yield {value} : {out_elem}")
        self.ctx.emit(f"}} -> {out[1]}")
        return r

    def _round(self, r: str, shape: tuple[Dim, ...], acc: DType, dtype: DType) -> str:
        """An f32 accumulator rounded to a 16-bit float result (stored as its bits)."""
        loops = [Loop(f"e{k}", d, "parallel") for k, d in enumerate(shape)]
        names = tuple(lp.name for lp in loops)
        body = Body(lambda n: "", lambda d: "", lambda ld: Source(), "q")
        v = body.store_value("%in", dtype)
        init = self.ctx.empty(shape, STORAGE[dtype])
        in_type = self.ctx.tensor_type(shape, STORAGE[acc])
        out_type = self.ctx.tensor_type(shape, STORAGE[dtype])
        return self._generic("", [(r, in_type, names, "%in")], (init, out_type, names), body, v, STORAGE[dtype],
                             loops)

    def _collapse(self, r: str, par: list[Loop], elem: str) -> str:
        """The result with each split axis's two loops collapsed back into one dim."""
        if not any(lp.name.endswith(SPLIT_SUFFIX) for lp in par):
            return r
        groups: list[list[int]] = []
        for k, lp in enumerate(par):
            if lp.name.endswith(SPLIT_SUFFIX):
                groups[-1].append(k)
            else:
                groups.append([k])
        src_type = self.ctx.tensor_type(tuple(lp.extent for lp in par), elem)
        dst_type = self.ctx.tensor_type(tuple(self.extent[lp.name] for lp in par
                                              if not lp.name.endswith(SPLIT_SUFFIX)), elem)
        v = self.ctx.fresh("c")
        self.ctx.emit(f"{v} = tensor.collapse_shape {r} {reassociation(groups)} : {src_type} into {dst_type}")
        return v

    def _check(self, tag: str) -> str:
        """A 0-d ``i8`` tensor that is 1 when some checked subscript or integer divisor of the op was bad.

        The checked values (subscripts of extracted loads, integer divisors) are evaluated over
        just the loops they depend on, one flag per element, then or-ed together."""
        cache: dict[tuple[str, tuple[str, ...]], Operand] = {}
        operands: list[tuple[Operand, str]] = []
        flag: list[str] = []
        hazards = self._hazards()
        needed: set[str] = set()
        for h in hazards:
            needed |= self._free(h[0])
        # Only the loops the checked values depend on (a gather's ids vary along t, not d).
        loops = [lp for lp in self.loops if lp.name in needed]

        def exprs(body: Body) -> None:
            for e, extent in hazards:
                v = body.value(e) if extent is None else body.value(e, DType.I64)
                if extent is not None:
                    body.in_range(v, self.ctx.dim_i64(extent))
            bad = body.any_bad()
            assert bad is not None
            flag.append(body.let(f"arith.extui {bad} : i1 to i8"))

        body = self.region(loops, exprs, "k", cache, operands)
        # One flag per element of the check's loops, then an `or` over all of them: IREE 3.13's
        # CUDA target fails to distribute a generic that reduces every loop into one value.
        shape = tuple(lp.extent for lp in loops)
        names = tuple(lp.name for lp in loops)
        flags_type = self.ctx.tensor_type(shape, "i8")
        init = self.ctx.empty(shape, "i8")
        ins = self._inputs(operands, list(names), loops)
        flags = self._generic(tag + ".check", ins, (init, flags_type, names), body, flag[0], "i8", loops,
                              ["parallel"] * len(loops))
        if not loops:
            return flags
        zero = self.ctx.fresh("c")
        self.ctx.emit(f"{zero} = arith.constant 0 : i8")
        none = self.ctx.fresh("f")
        self.ctx.emit(f"{none} = linalg.fill ins({zero} : i8) outs({self.ctx.empty((), 'i8')} : tensor<i8>) "
                      "-> tensor<i8>")
        r = self.ctx.fresh("r")
        self.ctx.emit(f"{r} = linalg.reduce ins({flags} : {flags_type}) outs({none} : tensor<i8>) "
                      f"dimensions = {list(range(len(loops)))}")
        self.ctx.emit("  (%fin: i8, %facc: i8) {")
        self.ctx.emit("    %for = arith.ori %fin, %facc : i8")
        self.ctx.emit("    linalg.yield %for : i8")
        self.ctx.emit("  }")
        return r

    def _hazards(self) -> list[tuple[ir.SExpr, Dim | None]]:
        """What the op checks: (subscript, the extent it must be under) of every extracted load, and
        (division, None) of every checked integer division, modulo or power."""
        out: list[tuple[ir.SExpr, Dim | None]] = []
        for x in ir.walk(self.op.body):
            if isinstance(x, ir.Load) and self.ctx.scalar(x.src) is None and self.subscript_map(x) is None:
                shape = self.ctx.tensor(x.src).shape
                out += [(s, shape[p]) for p, s in enumerate(x.indices) if not self.plain(x, p)]
            elif hazardous(x):
                out.append((x, None))
        return out

    def _free(self, e: ir.SExpr) -> set[str]:
        """The loops ``e`` depends on (an affine load: the loops of its map)."""
        if isinstance(e, ir.Idx) and e.name in self.extent:
            return {e.name, e.name + SPLIT_SUFFIX} if e.name in self.splits else {e.name}
        if isinstance(e, ir.Load) and self.ctx.scalar(e.src) is None:
            mapped = self.subscript_map(e)
            if mapped is not None:
                return {n for n in mapped[0] if n != "0"}
        out: set[str] = set()
        for c in ir.children(e):
            out |= self._free(c)
        return out


#: Integer ops IREE folds to a constant when both operands are the same value (``x - x``, ``x == x``); on floats
#: it cannot (``inf - inf``, ``nan == nan``: the NaN tests of top-k and arg-reductions stay as they are).
_SAME_FOLDS = frozenset({"sub", "xor", "eq", "ne", "lt", "le", "gt", "ge"})


def may_fold_away(term: ir.SExpr) -> bool:
    """Whether IREE may fold a reduction's ``term`` into one that reads no input (then :meth:`Lowering._kept_term`
    ties it to one): it reads none already, or holds what folds to a constant whatever the input: an integer
    product or ``and`` with 0, a power of 0, an integer op on two equal operands. A term of none of these
    (every norm, softmax, product, top-k round) keeps IREE's fused, vectorised reduction as it is: the tie costs a
    byte read, a compare and a select per element, and an input that stops fusion (3x on rmsnorm)."""
    loads = False
    for e in ir.walk(term):
        if isinstance(e, ir.Load):
            loads = True
        elif isinstance(e, ir.Binary):
            integer = not e.a.dtype.is_float
            if e.op in _SAME_FOLDS and integer and e.a == e.b:
                return True
            if e.op in ("mul", "and") and integer and any(isinstance(x, ir.Const) and not x.value for x in (e.a, e.b)):
                return True
            if e.op == "pow" and isinstance(e.b, ir.Const) and not e.b.value:
                return True
    return not loads


def _acc_dtype(dtype: DType) -> DType:
    """The type a reduction accumulates in: f32 for every float, the type itself otherwise."""
    return DType.F32 if dtype.is_float else dtype


def _elem(tensor_type: str) -> str:
    return tensor_type[tensor_type.rindex("x") + 1:-1] if "x" in tensor_type else tensor_type[7:-1]
