"""One SemanticIR op as one linalg op on tensors: loops, indexing maps, operands and the region.

:func:`lower_op` is called by :mod:`arke.targets.mlir.render` for each op of a kernel, in order.
The op's loops are its axes (``parallel``) then its reduce axes (``reduction``). A load whose
subscripts are plain loop indices of the same extent is an *operand* read through an indexing
map; any other load (offsets, gathers, arithmetic on indices) reads with ``tensor.extract`` in
the region, its subscripts checked.

Grouped-query attention reads ``k[b, h / R, j, d]``: when the kernel proves ``H == G * R``
(a ``where H % G == 0`` guard), axis ``h`` becomes two loops, ``h`` over ``G`` and ``h.r``
over ``R``; ``k`` is then read through the map ``(b, h, h.r, i, j, d) -> (b, h, j, d)``,
``q[b, h, i, d]`` through an ``expand_shape`` view of ``q``, and the result is collapsed back.
K and V are never copied or broadcast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim
from arke.targets.mlir.body import COMPUTE, STORAGE, Body, Source, float_literal, hazardous
from arke.targets.mlir.named import named_op

SPLIT_SUFFIX = ".r"


@dataclass(frozen=True)
class Loop:
    name: str
    extent: Dim
    kind: str  # "parallel" | "reduction"


@dataclass
class Tensor:
    """A tensor value of the function: its SSA name, dtype and dims."""

    ssa: str
    dtype: DType
    shape: tuple[Dim, ...]


@dataclass
class Operand:
    """An input read through an indexing map: the (possibly expanded) tensor and its map's loop names."""

    ssa: str
    type: str
    dtype: DType
    results: tuple[str, ...]  # loop names, or "0" for a constant-0 subscript


class FuncContext(Protocol):
    """What an op needs from the function being built (implemented by :mod:`arke.targets.mlir.render`)."""

    def emit(self, line: str) -> None: ...
    def fresh(self, hint: str = "t") -> str: ...
    def dim_index(self, d: Dim) -> str: ...
    def dim_i64(self, d: Dim) -> str: ...
    def same(self, a: Dim, b: Dim) -> bool: ...
    def tensor_type(self, shape: tuple[Dim, ...], elem: str) -> str: ...
    def empty(self, shape: tuple[Dim, ...], elem: str) -> str: ...
    def tensor(self, name: str) -> Tensor: ...
    def scalar(self, name: str) -> str | None: ...
    def divisible(self, whole: Dim, part: Dim) -> bool: ...


@dataclass
class Lowered:
    """What lowering one op made: its result tensor, loops (for the strategy) and check tensor."""

    result: str
    loops: tuple[Loop, ...]
    check: str | None = None


def _as_reduce(op: ir.ContractOp) -> ir.ReduceOp:
    body = ir.Binary("mul", op.lhs, op.rhs, op.dtype.compute if op.dtype.is_float else op.dtype)
    return ir.ReduceOp(op.result, op.dtype, "sum", op.axes, op.reduce_axes, body, op.name)


def loads_of(e: ir.SExpr) -> list[ir.Load]:
    return [x for x in ir.walk(e) if isinstance(x, ir.Load)]


def _identity(kind: str, dtype: DType) -> str:
    """The MLIR literal of a reduction's identity in its accumulator type."""
    if dtype.is_float:
        value = {"sum": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf")}[kind]
        return float_literal(value)
    if dtype.is_bool:
        return {"sum": "0", "prod": "1", "max": "0", "min": "1"}[kind]
    bits = int(COMPUTE[dtype][1:])
    return str({"sum": 0, "prod": 1, "max": -(2 ** (bits - 1)), "min": 2 ** (bits - 1) - 1}[kind])


class OpLowering:
    """Lowers one op; see the module docstring."""

    def __init__(self, ctx: FuncContext, op: ir.MapOp | ir.ReduceOp | ir.ContractOp, guards: tuple[ir.Guard, ...]):
        self.ctx = ctx
        self.op: ir.MapOp | ir.ReduceOp = _as_reduce(op) if isinstance(op, ir.ContractOp) else op
        self.guards = guards
        axes = [Loop(a.name, a.extent, "parallel") for a in self.op.axes]
        red = [Loop(a.name, a.extent, "reduction") for a in getattr(self.op, "reduce_axes", ())]
        self.extent = {a.name: a.extent for a in (*axes, *red)}
        self.splits = self._splits()
        self.loops: list[Loop] = []
        for a in (*axes, *red):
            if a.name in self.splits:
                outer, inner = self.splits[a.name]
                self.loops += [Loop(a.name, outer, a.kind), Loop(a.name + SPLIT_SUFFIX, inner, a.kind)]
            else:
                self.loops.append(a)

    # ------------------------------------------------------------ GQA splits

    def _splits(self) -> dict[str, tuple[Dim, Dim]]:
        """Axes read as ``a / X`` whose extent is provably ``Y * X`` (Y the read tensor's dim there)."""
        found: dict[str, tuple[Dim, Dim]] = {}
        bad: set[str] = set()
        for ld in loads_of(self.op.body):
            shape = self._shape(ld.src)
            if shape is None:
                continue
            for s, y in zip(ld.indices, shape):
                if not (isinstance(s, ir.Binary) and s.op in ("div", "floordiv") and isinstance(s.a, ir.Idx)
                        and isinstance(s.b, ir.DimRef) and s.a.name in self.extent):
                    continue
                a, x = s.a.name, s.b.dim
                e = self.extent[a]
                if not self._is_product(e, y, x):
                    bad.add(a)
                    continue
                if a in found and not (self.ctx.same(found[a][0], y) and self.ctx.same(found[a][1], x)):
                    bad.add(a)
                found.setdefault(a, (y, x))
        return {a: v for a, v in found.items() if a not in bad}

    def _is_product(self, e: Dim, y: Dim, x: Dim) -> bool:
        """Whether ``e == y * x`` for every legal call (``x`` may be ``e // y`` under a ``e % y == 0`` guard)."""
        if self.ctx.same(e, y * x):
            return True
        if not self.ctx.divisible(e, y):
            return False
        exact = sympy.sympify(x).replace(sympy.floor, lambda arg: arg)
        return bool(sympy.simplify(exact * y - e) == 0)

    def _shape(self, name: str) -> tuple[Dim, ...] | None:
        if self.ctx.scalar(name) is not None:
            return None
        return self.ctx.tensor(name).shape

    # ------------------------------------------------------------ loads

    def subscript_map(self, ld: ir.Load) -> tuple[tuple[str, ...], tuple[int, ...]] | None:
        """The loops a load's subscripts read (and the positions to expand), or None if not an affine read."""
        shape = self._shape(ld.src)
        if shape is None:
            return None
        out: list[str] = []
        expand: list[int] = []
        for p, (s, extent) in enumerate(zip(ld.indices, shape)):
            if isinstance(s, ir.Idx) and s.name in self.extent:
                if s.name in self.splits and self.ctx.same(extent, self.extent[s.name]):
                    out += [s.name, s.name + SPLIT_SUFFIX]
                    expand.append(p)
                    continue
                if s.name not in self.splits and self.ctx.same(extent, self.extent[s.name]):
                    out.append(s.name)
                    continue
                return None
            if isinstance(s, ir.Binary) and isinstance(s.a, ir.Idx) and s.a.name in self.splits \
                    and isinstance(s.b, ir.DimRef):
                y, x = self.splits[s.a.name]
                if s.op in ("div", "floordiv") and self.ctx.same(s.b.dim, x) and self.ctx.same(extent, y):
                    out.append(s.a.name)
                    continue
                if s.op == "mod" and self.ctx.same(s.b.dim, x) and self.ctx.same(extent, x):
                    out.append(s.a.name + SPLIT_SUFFIX)
                    continue
                return None
            if isinstance(s, ir.Const) and not isinstance(s.value, float) and int(s.value) == 0 \
                    and self.ctx.same(extent, sympy.Integer(1)):
                out.append("0")
                continue
            return None
        names = [n for n in out if n != "0"]
        if len(set(names)) != len(names):
            return None
        return tuple(out), tuple(expand)

    def plain(self, ld: ir.Load, p: int) -> bool:
        """Whether subscript ``p`` of an extracted load needs no range check (a loop of the same extent)."""
        s = ld.indices[p]
        shape = self._shape(ld.src) or ()
        if isinstance(s, ir.Idx) and s.name in self.extent and s.name not in self.splits:
            return self.ctx.same(shape[p], self.extent[s.name])
        return isinstance(s, ir.Const) and not isinstance(s.value, float) and int(s.value) == 0

    def operand(self, ld: ir.Load, names: tuple[str, ...], expand: tuple[int, ...],
                cache: dict[tuple[str, tuple[str, ...]], Operand]) -> Operand:
        key = (ld.src, names)
        if key in cache:
            return cache[key]
        t = self.ctx.tensor(ld.src)
        ssa, shape = t.ssa, t.shape
        if expand:
            groups: list[list[int]] = []
            new_shape: list[Dim] = []
            k = 0
            for p, d in enumerate(shape):
                if p in expand:
                    y, x = self.splits[_axis_at(ld, p)]
                    groups.append([k, k + 1])
                    new_shape += [y, x]
                    k += 2
                else:
                    groups.append([k])
                    new_shape.append(d)
                    k += 1
            old_type = self.ctx.tensor_type(shape, STORAGE[t.dtype])
            new_type = self.ctx.tensor_type(tuple(new_shape), STORAGE[t.dtype])
            sizes = ", ".join(self._size(d) for d in new_shape)
            v = self.ctx.fresh("x")
            self.ctx.emit(f"{v} = tensor.expand_shape {ssa} {_groups(groups)} output_shape [{sizes}] "
                          f": {old_type} into {new_type}")
            ssa, shape = v, tuple(new_shape)
        found = Operand(ssa, self.ctx.tensor_type(shape, STORAGE[t.dtype]), t.dtype, names)
        cache[key] = found
        return found

    def _size(self, d: Dim) -> str:
        static = sympy.sympify(d)
        return str(int(static)) if static.is_Integer else self.ctx.dim_index(d)

    def affine_map(self, names: tuple[str, ...], loops: list[Loop]) -> str:
        dims = ", ".join(f"d{k}" for k in range(len(loops)))
        pos = {lp.name: k for k, lp in enumerate(loops)}
        results = ", ".join("0" if n == "0" else f"d{pos[n]}" for n in names)
        return f"affine_map<({dims}) -> ({results})>"

    # ------------------------------------------------------------ the region

    def region(self, loops: list[Loop], exprs: Callable[[Body], None], prefix: str,
               cache: dict[tuple[str, tuple[str, ...]], Operand], operands: list[tuple[Operand, str]]) -> Body:
        """A Body whose loads resolve against ``loops``; affine loads become ``operands`` (with block args)."""
        pos = {lp.name: k for k, lp in enumerate(loops)}
        index_memo: dict[str, str] = {}

        def index(name: str) -> str:
            if name in index_memo:
                return index_memo[name]
            if name in self.splits:
                outer, inner = raw(name), raw(name + SPLIT_SUFFIX)
                x = self.ctx.dim_i64(self.splits[name][1])
                m = body.let(f"arith.muli {outer}, {x} : i64")
                v = body.let(f"arith.addi {m}, {inner} : i64")
            else:
                v = raw(name)
            index_memo[name] = v
            return v

        def raw(name: str) -> str:
            i = body.let(f"linalg.index {pos[name]} : index")
            return body.let(f"arith.index_cast {i} : index to i64")

        def dim(d: ir.DimRef) -> str:
            return self.ctx.dim_i64(d.dim)

        def source(ld: ir.Load) -> Source:
            scalar = self.ctx.scalar(ld.src)
            if scalar is not None:
                return Source(arg=scalar)
            mapped = self.subscript_map(ld)
            if mapped is not None and all(n == "0" or n in pos for n in mapped[0]):
                op = self.operand(ld, mapped[0], mapped[1], cache)
                for o, arg in operands:
                    if o is op:
                        return Source(arg=arg)
                arg = f"%{prefix}in{len(operands)}"
                operands.append((op, arg))
                return Source(arg=arg)
            t = self.ctx.tensor(ld.src)
            checked = tuple(not self.plain(ld, p) for p in range(len(ld.indices)))
            return Source(tensor=t.ssa, tensor_type=self.ctx.tensor_type(t.shape, STORAGE[t.dtype]),
                          extents=tuple(self.ctx.dim_i64(d) for d in t.shape), checked=checked)

        body = Body(index, dim, source, prefix)
        exprs(body)
        return body


def _axis_at(ld: ir.Load, p: int) -> str:
    s = ld.indices[p]
    assert isinstance(s, ir.Idx)
    return s.name


def _groups(groups: list[list[int]]) -> str:
    return "[" + ", ".join("[" + ", ".join(str(i) for i in g) + "]" for g in groups) + "]"


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
        acc = _acc_dtype(op.dtype) if reduce else op.dtype
        acc_ty = STORAGE[acc] if reduce else STORAGE[op.dtype]
        result: list[str] = []

        def exprs(body: Body) -> None:
            v = body.value(op.body, op.dtype if op.dtype.is_bool or not reduce else acc)
            if isinstance(op, ir.ReduceOp):
                if op.dtype.is_bool:
                    v = body.let(f"arith.extui {v} : i1 to i8")
                v = body.combine(op.kind, "%out", v, "i8u" if op.dtype.is_bool else acc_ty)
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
        ins = self._inputs(operands, [lp.name for lp in par])
        r = self._generic(tag, ins, (init, out_type, tuple(lp.name for lp in par)), body, result[0], acc_ty)
        if reduce and op.dtype != acc:
            r = self._round(r, out_shape, acc, op.dtype)
        r = self._collapse(r, par, STORAGE[op.dtype])
        lowered = Lowered(r, tuple(self.loops))
        if body.flags:
            lowered.check = self._check(tag)
        return lowered

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
        self.ctx.emit(f"{v} = tensor.collapse_shape {r} {_groups(groups)} : {src_type} into {dst_type}")
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


def _acc_dtype(dtype: DType) -> DType:
    """The type a reduction accumulates in: f32 for every float, the type itself otherwise."""
    return DType.F32 if dtype.is_float else dtype


def _elem(tensor_type: str) -> str:
    return tensor_type[tensor_type.rindex("x") + 1:-1] if "x" in tensor_type else tensor_type[7:-1]
