"""Random valid IR for property tests, and a small hand-written module.

``modules()`` draws SemanticIR modules that pass ``arke.ir.verify``: random dims with
``//``, ``%`` and powers, nested scalar expressions over every node kind, all four op
kinds, calls between kernels with dim substitution, guards and output names.
``strategy_sets(module)`` draws legal StrategyIR for a module's kernels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache

import sympy
from hypothesis import strategies as st

from arke.ir import semantic as S
from arke.ir import shapes
from arke.ir.dtypes import DType, can_store
from arke.ir.strategy import (
    ALGORITHMS,
    Decision,
    Strategy,
    StrategySet,
)
from arke.ir.text import cond_text
from arke.ir.verify_nodes import ARITHMETIC, FLOAT_UNARY, NUMERIC_UNARY
from arke.targets import base as targets

SYMBOLS = ("M", "N", "K", "H", "G")
# Includes words the text form must quote (`inf`, `dim`) and a non-identifier.
AXIS_NAMES = ("i", "j", "k", "m", "n", "t", "inf", "dim", "a b")
PARAM_NAMES = ("x", "w", "b", "ids", "mask", "eps", "scale", "q", "k", "v")
ALL_DTYPES = tuple(DType)
NUMERIC = tuple(d for d in DType if not d.is_bool)
INTS = tuple(d for d in DType if d.is_int)
FLOATS = (DType.F16, DType.BF16, DType.F32)

texts = st.text(max_size=12)  # names and guard texts: quotes, backslashes, any unicode


@cache  # building the strategy is slow; drawing from it is not
def dims(symbols: tuple[str, ...]) -> st.SearchStrategy[shapes.Dim]:
    """Integer dims over ``symbols``: sums, differences, products, ``//``, ``%``, squares."""
    leaf = st.sampled_from(list(symbols)).map(shapes.sym) | st.integers(0, 9).map(shapes.const)
    divisor = st.sampled_from(list(symbols)).map(shapes.sym) | st.integers(1, 8).map(shapes.const)

    def extend(inner: st.SearchStrategy[shapes.Dim]) -> st.SearchStrategy[shapes.Dim]:
        pair = st.tuples(inner, inner)
        return st.one_of(
            pair.map(lambda p: p[0] + p[1]),
            pair.map(lambda p: p[0] - p[1]),
            pair.map(lambda p: p[0] * p[1]),
            st.tuples(inner, divisor).map(lambda p: shapes.floordiv(p[0], p[1])),
            st.tuples(inner, divisor).map(lambda p: shapes.mod(p[0], p[1])),
            inner.map(lambda d: d**2),
        )

    return st.recursive(leaf, extend, max_leaves=4)


@cache  # building the strategy is slow; drawing from it is not
def positive_dims(symbols: tuple[str, ...]) -> st.SearchStrategy[shapes.Dim]:
    """Dims that are positive for all positive symbols (they may stand for a callee's symbol)."""
    symbol = st.sampled_from(list(symbols)).map(shapes.sym)
    return st.one_of(symbol, st.builds(lambda s, c: s + c, symbol, st.integers(1, 4)),
                     st.builds(lambda s, c: s * c, symbol, st.integers(2, 4)),
                     st.builds(lambda a, b: a * b, symbol, symbol))


@cache  # building the strategy is slow; drawing from it is not
def conds(symbols: tuple[str, ...]) -> st.SearchStrategy[S.Cond]:
    """Conditions over dims: relations, ``in`` sets, and/or of any arity, not."""
    d = dims(symbols)
    leaf = st.one_of(
        st.builds(S.Rel, st.sampled_from(["==", "!=", "<", "<=", ">", ">="]), d, d),
        st.builds(S.InSet, d, st.lists(d, max_size=3).map(tuple)),
    )

    def extend(inner: st.SearchStrategy[S.Cond]) -> st.SearchStrategy[S.Cond]:
        return st.one_of(
            st.builds(S.BoolOp, st.sampled_from(["and", "or"]), st.lists(inner, max_size=3).map(tuple)),
            inner.map(lambda c: S.BoolOp("not", (c,))),
        )

    return st.recursive(leaf, extend, max_leaves=4)


def scalars(dtype: DType) -> st.SearchStrategy[float | int | bool]:
    """A constant of ``dtype``: floats include inf, -inf, nan (as ``math.nan``), -0.0, and ints."""
    if dtype.is_bool:
        return st.booleans()
    if dtype.is_int:
        return st.integers(-(2**40), 2**40)
    return st.floats(allow_nan=False) | st.just(math.nan) | st.integers(-10, 10)


@dataclass(frozen=True)
class Ctx:
    """What an expression may use: dim symbols, the op's axes, the values defined so far."""

    symbols: tuple[str, ...]
    axes: tuple[str, ...]
    values: tuple[tuple[str, S.TensorType], ...]

    def loadable(self, dtype: DType, depth: int) -> list[str]:
        # A load of a tensor has subscripts, so it needs depth left for them.
        return [n for n, t in self.values if t.dtype == dtype and (t.rank == 0 or depth > 0)]

    def type_of(self, name: str) -> S.TensorType:
        return dict(self.values)[name]


@st.composite
def sexprs(draw: st.DrawFn, ctx: Ctx, dtype: DType, depth: int) -> S.SExpr:
    """A well-typed scalar expression of ``dtype``, at most ``depth`` nodes deep (plus leaves)."""
    kinds = ["const"]
    if ctx.loadable(dtype, depth):
        kinds += ["load", "load"]
    if dtype.is_int:
        kinds += ["dimref"] + ["idx"] * 3 * bool(ctx.axes)
    if depth > 0:
        kinds += ["cast", "select"]
        kinds += ["compare", "logic", "not"] if dtype.is_bool else ["unary", "binary", "binary"]
    kind = draw(st.sampled_from(kinds))
    sub = depth - 1
    if kind == "const":
        return S.Const(draw(scalars(dtype)), dtype)
    if kind == "idx":
        return S.Idx(draw(st.sampled_from(ctx.axes)), dtype)
    if kind == "dimref":
        return S.DimRef(draw(dims(ctx.symbols)), dtype)
    if kind == "load":
        return draw(loads(ctx, draw(st.sampled_from(ctx.loadable(dtype, depth))), sub))
    if kind == "cast":
        return S.Cast(draw(sexprs(ctx, draw(st.sampled_from(ALL_DTYPES)), sub)), dtype)
    if kind == "select":
        return S.Select(draw(sexprs(ctx, DType.BOOL, sub)), draw(sexprs(ctx, dtype, sub)),
                        draw(sexprs(ctx, dtype, sub)), dtype)
    if kind == "compare":
        operand = draw(st.sampled_from(ALL_DTYPES))
        return S.Binary(draw(st.sampled_from(sorted(S.COMPARISONS))), draw(sexprs(ctx, operand, sub)),
                        draw(sexprs(ctx, operand, sub)), dtype)
    if kind == "logic":
        return S.Binary(draw(st.sampled_from(["and", "or"])), draw(sexprs(ctx, dtype, sub)),
                        draw(sexprs(ctx, dtype, sub)), dtype)
    if kind == "not":
        return S.Unary("not", draw(sexprs(ctx, dtype, sub)), dtype)
    if kind == "unary":
        ops = sorted(NUMERIC_UNARY | (FLOAT_UNARY if dtype.is_float else {"bitnot"} if dtype.is_int else set()))
        return S.Unary(draw(st.sampled_from(ops)), draw(sexprs(ctx, dtype, sub)), dtype)
    if dtype.is_int and draw(st.booleans()):  # bitwise ops and shifts (an i64 count)
        op = draw(st.sampled_from(sorted(S.BITWISE)))
        count = DType.I64 if op in S.SHIFTS else dtype
        return S.Binary(op, draw(sexprs(ctx, dtype, sub)), draw(sexprs(ctx, count, sub)), dtype)
    return S.Binary(draw(st.sampled_from(sorted(ARITHMETIC))), draw(sexprs(ctx, dtype, sub)),
                    draw(sexprs(ctx, dtype, sub)), dtype)


@st.composite
def loads(draw: st.DrawFn, ctx: Ctx, src: str, depth: int) -> S.Load:
    """A load of ``src`` with one integer subscript per axis (gathers included)."""
    t = ctx.type_of(src)
    indices = tuple(draw(sexprs(ctx, draw(st.sampled_from(INTS)), max(depth, 0))) for _ in range(t.rank))
    return S.Load(src, indices, t.dtype)


@st.composite
def domains(draw: st.DrawFn, symbols: tuple[str, ...], reduce: bool) -> tuple[tuple[S.Axis, ...], tuple[S.Axis, ...]]:
    names = draw(st.lists(st.sampled_from(AXIS_NAMES), unique=True, max_size=5))
    split = draw(st.integers(0, len(names))) if reduce else len(names)
    axes = tuple(S.Axis(n, draw(dims(symbols))) for n in names)
    return axes[:split], axes[split:]


@st.composite
def ops(draw: st.DrawFn, ctx: Ctx, result: str) -> S.Op:
    """A map, reduce or contract op defining ``result`` (calls are made by ``functions``)."""
    name = draw(st.none() | texts)
    numeric = [n for n, t in ctx.values if not t.dtype.is_bool]
    kind = draw(st.sampled_from(["map", "reduce", "contract"] if numeric else ["map", "reduce"]))
    axes, raxes = draw(domains(ctx.symbols, reduce=kind != "map"))
    inner = replace(ctx, axes=tuple(a.name for a in axes + raxes))
    depth = draw(st.integers(0, 3))
    if kind == "contract":
        lhs = draw(loads(inner, draw(st.sampled_from(numeric)), 1))
        same = [n for n, t in ctx.values if t.dtype == lhs.dtype]
        rhs = draw(loads(inner, draw(st.sampled_from(same)), 1))
        dtype = draw(st.sampled_from([d for d in NUMERIC if can_store(lhs.dtype, d)]))
        return S.ContractOp(result, dtype, axes, raxes, lhs, rhs, name)
    if kind == "reduce":
        one = S.REDUCE_KINDS + S.ARG_KINDS + (S.TOPK_KINDS if axes else ())
        reduction = draw(st.sampled_from(one if len(raxes) == 1 else S.REDUCE_KINDS))
        if reduction in S.TOPK_KINDS:  # the last axis is the rank, which the body does not use
            body_dtype = draw(st.sampled_from(ALL_DTYPES))
            ranked = replace(ctx, axes=tuple(a.name for a in axes[:-1] + raxes))
            body = draw(sexprs(ranked, body_dtype, depth))
            dtype = DType.I64 if reduction.startswith("arg") else body_dtype
            return S.ReduceOp(result, dtype, reduction, axes, raxes, body, name)
        limits: tuple[tuple[str, S.SExpr], ...] = ()
        if raxes and draw(st.booleans()):  # a length (language §8.11): i64 over the kept axes only
            limits = ((raxes[-1].name, draw(sexprs(replace(ctx, axes=tuple(a.name for a in axes)), DType.I64, 1))),)
        if reduction in S.ARG_KINDS:  # a position (i64) of a body of any dtype
            body_dtype = draw(st.sampled_from(ALL_DTYPES))
            return S.ReduceOp(result, DType.I64, reduction, axes, raxes, draw(sexprs(inner, body_dtype, depth)), name,
                              limits)
        dtype = draw(st.sampled_from(NUMERIC if reduction in ("sum", "prod") else ALL_DTYPES))
        return S.ReduceOp(result, dtype, reduction, axes, raxes, draw(sexprs(inner, dtype, depth)), name, limits)
    dtype = draw(st.sampled_from(ALL_DTYPES))
    body_dtype = draw(st.sampled_from(FLOATS)) if dtype.is_float else dtype  # floats round when stored
    return S.MapOp(result, dtype, axes, draw(sexprs(inner, body_dtype, depth)), name)


@st.composite
def params(draw: st.DrawFn, symbols: tuple[str, ...]) -> list[S.Param]:
    """Tensor and scalar parameters; the first has one plain axis per symbol, so each is bound."""
    names = draw(st.lists(st.sampled_from(PARAM_NAMES), unique=True, min_size=1, max_size=4))
    out = [S.Param(names[0], S.TensorType(draw(st.sampled_from(NUMERIC)), tuple(shapes.sym(s) for s in symbols)))]
    for n in names[1:]:
        dtype = draw(st.sampled_from(ALL_DTYPES))
        if draw(st.booleans()):
            default = draw(st.none() | scalars(dtype))
            out.append(S.Param(n, S.TensorType(dtype), default))
        else:
            shape = draw(st.lists(st.sampled_from(symbols).map(shapes.sym) | dims(symbols), max_size=3))
            out.append(S.Param(n, S.TensorType(dtype, tuple(shape))))
    return out


@st.composite
def calls(draw: st.DrawFn, callee: S.Function, symbols: tuple[str, ...],
          first_result: int) -> tuple[list[S.Param], S.CallOp]:
    """A call of ``callee`` and the caller parameters passed to it (types with dims substituted)."""
    mapping = tuple((b.dim, draw(positive_dims(symbols))) for b in callee.bindings)
    subs = {shapes.sym(k): v for k, v in mapping}

    def at(t: S.TensorType) -> S.TensorType:
        return S.TensorType(t.dtype, tuple(shapes.text_form(sympy.sympify(d).subs(subs, simultaneous=True))
                                           for d in t.shape))

    args = [S.Param(f"a{i}", at(p.type), p.default) for i, p in enumerate(callee.params)]
    results = tuple(str(first_result + i) for i in range(len(callee.results)))
    op = S.CallOp(results, tuple(at(t) for t in callee.result_types), callee.name, tuple(a.name for a in args),
                  mapping, draw(st.none() | texts))
    return args, op


@st.composite
def functions(draw: st.DrawFn, name: str, callees: Sequence[S.Function] = ()) -> S.Function:
    """A valid kernel; it may call the ``callees``."""
    symbols = tuple(draw(st.lists(st.sampled_from(SYMBOLS), unique=True, min_size=1, max_size=3)))
    plist = draw(params(symbols))
    bindings = tuple(S.DimBinding(s, plist[0].name, i) for i, s in enumerate(symbols))
    unused = [s for s in SYMBOLS if s not in symbols]
    if unused and draw(st.booleans()):  # a dim parameter (`G: dim`): an i64 scalar binding a dim by its value
        g = draw(st.sampled_from(unused))
        plist.insert(draw(st.integers(1, len(plist))), S.Param(g, S.TensorType(DType.I64),
                                                              draw(st.none() | st.integers(1, 64))))
        bindings += (S.DimBinding(g, g, -1),)
        symbols += (g,)
    values = [(p.name, p.type) for p in plist]
    body: list[S.Op] = []
    counter = draw(st.integers(0, 20))  # op results are decimal, not necessarily from 0
    call_at = draw(st.integers(0, 3)) if len(callees) > 0 and draw(st.booleans()) else -1
    for n in range(draw(st.integers(1, 4))):
        op: S.Op
        if n == call_at:
            args, op = draw(calls(draw(st.sampled_from(list(callees))), symbols, counter))
            plist += args
            values += [(a.name, a.type) for a in args]
        else:
            op = draw(ops(Ctx(symbols, (), tuple(values)), str(counter)))
        body.append(op)
        values += S.op_results(op)
        counter += len(S.op_results(op))
    chosen = draw(st.lists(st.sampled_from([v for v, _ in values]), min_size=1, max_size=3))
    types = dict(values)
    names = draw(st.just(()) | st.tuples(*[st.none() | texts for _ in chosen]))
    # A guard's text is usually the condition as printed (the text form then leaves it out).
    guards = draw(st.lists(st.builds(lambda c, t: S.Guard(c, cond_text(c) if t is None else t),
                                     conds(symbols), st.none() | texts), max_size=2))
    # a generic kernel's specialisation (spec/language.md §5.6): dtype variables, any names, any dtypes
    specialisation = draw(st.lists(st.tuples(st.sampled_from(["W", "Q", "A_b", "specialise", "in"]),
                                             st.sampled_from(list(DType))), max_size=2, unique_by=lambda p: p[0]))
    return S.Function(name, tuple(plist), bindings, tuple(guards), tuple(body), tuple(chosen),
                      tuple(types[v] for v in chosen), tuple(names), tuple(specialisation))


@st.composite
def modules(draw: st.DrawFn, max_functions: int = 3) -> S.Module:
    """A valid module of 1..``max_functions`` kernels; each may call the ones before it."""
    funcs: list[S.Function] = []
    for i in range(draw(st.integers(1, max_functions))):
        funcs.append(draw(functions(f"f{i}", funcs)))
    return S.Module(tuple(funcs))


@st.composite
def strategy_sets(draw: st.DrawFn, module: S.Module) -> StrategySet:
    """Legal strategies for ``module``'s kernels."""
    out = []
    for _ in range(draw(st.integers(0, 3))):
        f = draw(st.sampled_from(module.functions))
        target = draw(st.none() | st.sampled_from(targets.names()))
        symbols = [b.dim for b in f.bindings]
        when = draw(st.none() | conds(tuple(symbols))) if symbols else None
        decisions = draw(st.lists(decisions_for(f, target), max_size=5))
        unique = list({(d.kind, d.subject): d for d in decisions}.values())
        out.append(Strategy(f.name, target, when, tuple(unique)))
    return StrategySet(tuple(out))


def decisions_for(f: S.Function, target: str | None) -> st.SearchStrategy[Decision]:
    """One legal decision for kernel ``f`` on ``target``."""
    free = sorted({a.name for op in f.ops if not isinstance(op, S.CallOp) for a in op.axes})
    reduced = sorted({a.name for op in f.ops if isinstance(op, (S.ReduceOp, S.ContractOp)) for a in op.reduce_axes})
    tensors = [p.name for p in f.params if p.type.rank]
    pow2 = st.integers(0, 5).map(lambda e: 2**e)
    options: list[st.SearchStrategy[Decision]] = [
        st.builds(Decision, st.just("algorithm"), st.none(),
                  st.sampled_from(targets.narrowed_choices("algorithm", target) or ALGORITHMS)),
    ]
    def honoured(kind: str) -> bool:
        return target is None or target in targets.honouring(kind)

    if free or reduced:
        index = st.sampled_from(free + reduced)
        options += [st.builds(Decision, st.just(kind), index, values) for kind, values in
                    (("tile", st.integers(1, 512)), ("vectorize", pow2), ("unroll", st.integers(1, 64)))
                    if honoured(kind)]
    if free and honoured("parallel"):
        options.append(st.builds(Decision, st.just("parallel"), st.sampled_from(free), st.none() | st.integers(1, 64)))
    if reduced and honoured("split"):
        options.append(st.builds(Decision, st.just("split"), st.sampled_from(reduced), st.integers(2, 64)))
    if tensors and (target is None or target in targets.honouring("pack")):
        options.append(st.builds(Decision, st.just("pack"), st.sampled_from(tensors), st.none()))
    if target is None or target in targets.honouring("threads"):
        options.append(st.builds(Decision, st.just("threads"), st.none(), st.integers(1, 1024)))
    if target is None or {"warps", "stages"} <= targets.get(target).honours:
        options += [st.builds(Decision, st.just("warps"), st.none(), pow2),
                    st.builds(Decision, st.just("stages"), st.none(), st.integers(1, 8))]
    return st.one_of(options)


# ---------------------------------------------------------------- a hand-written module


def rmsnorm_module() -> S.Module:
    """``rmsnorm`` (reduce, map, scalar parameter, guard, named output) and a kernel that calls it
    and multiplies by a matrix (call with dim substitution, contract)."""
    M, N, K = shapes.sym("M"), shapes.sym("N"), shapes.sym("K")
    f32 = DType.F32

    def load(src: str, *axes: str) -> S.Load:
        return S.Load(src, tuple(S.Idx(a) for a in axes), f32)

    x_sq = S.Binary("mul", load("x", "m", "n"), load("x", "m", "n"), f32)
    mean = S.Binary("div", load("0", "m"), S.Cast(S.DimRef(N), f32), f32)
    inv = S.Unary("rsqrt", S.Binary("add", mean, S.Load("eps", (), f32), f32), f32)
    y = S.Binary("mul", S.Binary("mul", load("x", "m", "n"), load("1", "m"), f32), load("w", "n"), f32)
    rmsnorm = S.Function(
        name="rmsnorm",
        params=(S.Param("x", S.TensorType(f32, (M, N))), S.Param("w", S.TensorType(f32, (N,))),
                S.Param("eps", S.TensorType(f32), 1e-06)),
        bindings=(S.DimBinding("M", "x", 0), S.DimBinding("N", "x", 1)),
        guards=(S.Guard(S.Rel("==", shapes.mod(N, 2), 0), "N % 2 == 0"),),
        ops=(S.ReduceOp("0", f32, "sum", (S.Axis("m", M),), (S.Axis("n", N),), x_sq, "ss"),
             S.MapOp("1", f32, (S.Axis("m", M),), inv, "inv"),
             S.MapOp("2", f32, (S.Axis("m", M), S.Axis("n", N)), y, "y")),
        results=("2",),
        result_types=(S.TensorType(f32, (M, N)),),
        output_names=("y",),
    )
    norm_mm = S.Function(
        name="norm_mm",
        params=(S.Param("a", S.TensorType(f32, (M, K))), S.Param("g", S.TensorType(f32, (K,))),
                S.Param("b", S.TensorType(f32, (K, N))), S.Param("eps", S.TensorType(f32), 1e-05)),
        bindings=(S.DimBinding("M", "a", 0), S.DimBinding("K", "a", 1), S.DimBinding("N", "b", 1)),
        guards=(),
        ops=(S.CallOp(("0",), (S.TensorType(f32, (M, K)),), "rmsnorm", ("a", "g", "eps"), (("M", M), ("N", K))),
             S.ContractOp("1", f32, (S.Axis("i", M), S.Axis("j", N)), (S.Axis("k", K),),
                          load("0", "i", "k"), load("b", "k", "j"))),
        results=("1",),
        result_types=(S.TensorType(f32, (M, N)),),
    )
    return S.Module((rmsnorm, norm_mm))
