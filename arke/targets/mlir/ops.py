"""What one SemanticIR op reads as a linalg op on tensors: its loops, indexing maps, operands and region.

:class:`OpLowering` works these out for :class:`arke.targets.mlir.lowering.Lowering`, which
emits the linalg op(s); the data both pass around (:class:`Loop`, :class:`Tensor`,
:class:`Operand`, :class:`Lowered`) and what they need of the function being built
(:class:`FuncContext`) are here.

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
from arke.targets.mlir.body import STORAGE, Body, Source

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
            self.ctx.emit(f"{v} = tensor.expand_shape {ssa} {reassociation(groups)} output_shape [{sizes}] "
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


def reassociation(groups: list[list[int]]) -> str:
    """The reassociation of ``tensor.expand_shape``/``collapse_shape``: ``[[0, 1], [2]]``."""
    return "[" + ", ".join("[" + ", ".join(str(i) for i in g) + "]" for g in groups) + "]"
