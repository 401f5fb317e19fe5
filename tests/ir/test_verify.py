"""The verifier: generated IR passes, and each kind of broken IR is rejected with a clear message."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import gen
import pytest
from hypothesis import HealthCheck, given, settings

import arke
from arke.ir import semantic as S
from arke.ir import shapes
from arke.ir.dtypes import DType
from arke.ir.serialize import from_json, to_json
from arke.ir.strategy import Decision, Strategy, StrategySet
from arke.ir.text import print_module, print_strategies, read_module, read_strategies
from arke.ir.verify import IRVerifyError, problems, strategy_problems, verify, verify_strategies

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
F32, I64, BOOL = DType.F32, DType.I64, DType.BOOL
M, N, K = shapes.sym("M"), shapes.sym("N"), shapes.sym("K")
BASE = gen.rmsnorm_module()


@PROPERTY
@given(gen.modules())
def test_generated_modules_verify(m: S.Module) -> None:
    verify(m)


@PROPERTY
@given(gen.modules(max_functions=2).flatmap(lambda m: gen.strategy_sets(m).map(lambda s: (m, s))))
def test_generated_strategies_verify(ms: tuple[S.Module, StrategySet]) -> None:
    verify_strategies(ms[1], ms[0])


def test_the_hand_written_module_verifies() -> None:
    verify(BASE)


ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = sorted([*(ROOT / "examples").glob("*.ak"), *Path(str(resources.files("arke.stdlib"))).glob("*.ak")])


@pytest.mark.parametrize("path", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_front_end_ir_verifies_and_round_trips(path: Path) -> None:
    """What the checker builds from real programs keeps every invariant and survives text and JSON."""
    m = arke.load(str(path))
    verify(m.semantic)
    verify_strategies(m.strategies, m.semantic)
    assert read_module(print_module(m.semantic)) == m.semantic
    assert from_json(to_json(m.semantic)) == m.semantic
    assert read_strategies(print_strategies(m.strategies)) == m.strategies


# ---------------------------------------------------------------- broken modules

Edit = Callable[[S.Function], S.Function]


def fn(index: int, edit: Edit) -> Callable[[S.Module], S.Module]:
    """Edit the module's ``index``-th function."""
    def apply(m: S.Module) -> S.Module:
        funcs = list(m.functions)
        funcs[index] = edit(funcs[index])
        return replace(m, functions=tuple(funcs))

    return apply


def op(index: int, n: int, **changes: object) -> Callable[[S.Module], S.Module]:
    """Replace fields of op ``n`` of function ``index``."""
    def edit(f: S.Function) -> S.Function:
        ops = list(f.ops)
        ops[n] = replace(ops[n], **changes)  # type: ignore[arg-type]
        return replace(f, ops=tuple(ops))

    return fn(index, edit)


def body(e: S.SExpr, axes: tuple[S.Axis, ...] = (S.Axis("m", M), S.Axis("n", N))) -> Callable[[S.Module], S.Module]:
    """Make the body of rmsnorm's last map (over ``m < M, n < N``) ``e``."""
    return op(0, 2, body=e, axes=axes, dtype=e.dtype)


def x(*idx: S.SExpr) -> S.Load:
    return S.Load("x", idx, F32)


m_, n_ = S.Idx("m"), S.Idx("n")
NOT_A_NUMBER: Any = "big"
one = S.Const(1.0, F32)

BROKEN: list[tuple[str, Callable[[S.Module], S.Module], str]] = [
    # SSA
    ("defined twice", op(0, 1, result="0"), "@rmsnorm %0 (map \"inv\"): %0 is defined twice"),
    ("used before defined", op(0, 0, body=S.Load("1", (m_,), F32)), "%1 is used before it is defined"),
    ("undefined", body(S.Load("zz", (), F32)), "%zz is not defined"),
    ("result name", op(0, 2, result="y"), "op result %y is not a decimal name like %0"),
    ("param name", fn(0, lambda f: replace(f, params=(*f.params, S.Param("7", S.TensorType(F32))))),
     "parameter name '7' is not an identifier"),
    ("param twice", fn(0, lambda f: replace(f, params=(*f.params, f.params[0]))), "parameter %x is declared twice"),
    # loads and indices
    ("rank", body(x(m_)), "load of %x has 1 subscripts, %x has rank 2: %x[m]"),
    ("load dtype", body(S.Load("x", (m_, n_), DType.F16)), "load of %x is typed f16, but %x is f32"),
    ("float subscript", body(x(m_, one)), "subscript 1 is f32; subscripts are integers"),
    ("foreign index", body(x(m_, S.Idx("k"))), "index `k` is not an axis of this op (axes: m, n)"),
    ("float index", body(x(m_, S.Idx("n", F32))), "index `n` has dtype f32; indices are integers"),
    ("axis twice", body(x(m_, m_), (S.Axis("m", M), S.Axis("m", N))), "axis `m` appears twice"),
    ("reduce index in a map", op(0, 1, body=S.Load("x", (m_, n_), F32)), "index `n` is not an axis of this op"),
    # dtypes
    ("mixed add", body(S.Binary("add", x(m_, n_), S.Cast(m_, I64), F32)),
     "add of f32 and i64 typed f32: operands need the node's dtype (insert a cast)"),
    ("comparison type", body(S.Binary("lt", x(m_, n_), one, F32)), "lt typed f32: comparisons give bool"),
    ("compare mixed", body(S.Binary("eq", x(m_, n_), m_, BOOL)), "eq of f32 and i64: both operands need one dtype"),
    ("and of floats", body(S.Binary("and", one, one, BOOL)), "and of f32 and f32 typed bool: it takes and gives bool"),
    ("not of float", body(S.Unary("not", one, BOOL)), "not of f32 typed bool"),
    ("select cond", body(S.Select(one, one, one, F32)), "select's condition is f32, not bool"),
    ("select branches", body(S.Select(S.Const(True, BOOL), one, S.Const(1, I64), F32)),
     "select of f32 and i64 typed f32"),
    ("exp of int", body(S.Cast(S.Unary("exp", m_, I64), F32)), "exp of i64: it takes a float"),
    ("abs of bool", body(S.Cast(S.Unary("abs", S.Const(True, BOOL), BOOL), F32)), "abs of bool: it takes a number"),
    ("unary changes dtype", body(S.Unary("exp", x(m_, n_), DType.F16)), "keeps its operand's dtype"),
    ("arith on bool", body(S.Cast(S.Binary("add", S.Const(True, BOOL), S.Const(True, BOOL), BOOL), F32)),
     "add of bool: arithmetic takes numbers"),
    ("unknown unary", body(S.Unary("expm1", one, F32)), "unknown unary op 'expm1'"),
    ("unknown binary", body(S.Binary("atan2", one, one, F32)), "unknown binary op 'atan2'"),
    ("const value", body(S.Cast(S.Const(1.5, DType.I32), F32)), "constant 1.5 is not a value of dtype i32"),
    ("bool const", body(S.Cast(S.Const(1, BOOL), F32)), "constant 1 is not a value of dtype bool"),
    ("dimref dtype", body(S.DimRef(N, F32)), "dim(…) has dtype f32; dims are integers"),
    ("body not storable", op(0, 2, dtype=DType.I32), "the body is f32, which is not stored into i32 without a cast"),
    ("reduce kind", op(0, 0, kind="mean"), "unknown reduction 'mean': expected one of sum, max, min, prod"),
    ("sum of bools", op(0, 0, dtype=BOOL, body=S.Const(True, BOOL)), "reduce.sum of a bool body"),
    # dims
    ("unbound dim", body(S.Cast(S.DimRef(shapes.sym("Q")), F32)), "dim Q uses Q, not bound by `dims`"),
    ("non-integer dim", op(0, 1, axes=(S.Axis("m", M / 2),)), "extent of axis `m`: dim M/2 is not an integer"),
    ("guard dim", fn(0, lambda f: replace(f, guards=(S.Guard(S.Rel("<", M, shapes.sym("T")), "M < T"),))),
     "guard `M < T`: dim T uses T, not bound by `dims`"),
    ("bad relation", fn(0, lambda f: replace(f, guards=(S.Guard(S.Rel("=~", M, N), "?"),))), "unknown relation '=~'"),
    ("bad boolop", fn(0, lambda f: replace(f, guards=(S.Guard(S.BoolOp("not", ()), "?"),))),
     "negates one with 'not' (found 'not' of 0)"),
    ("binding twice", fn(0, lambda f: replace(f, bindings=(*f.bindings, f.bindings[0]))), "dim M is bound twice"),
    ("binding param", fn(0, lambda f: replace(f, bindings=(S.DimBinding("M", "q", 0), f.bindings[1]))),
     "dim M is bound to %q, which is not a parameter"),
    ("binding axis", fn(0, lambda f: replace(f, bindings=(S.DimBinding("M", "x", 2), f.bindings[1]))),
     "dim M is bound to axis 2 of %x, which has rank 2"),
    ("binding extent", fn(0, lambda f: replace(f, bindings=(S.DimBinding("M", "x", 1), f.bindings[1]))),
     "dim M is bound to %x.1, whose extent is N, not M"),
    ("tensor default", fn(0, lambda f: replace(f, params=(replace(f.params[0], default=1.0), *f.params[1:]))),
     "%x has a default but is a tensor of rank 2"),
    ("default type", fn(0, lambda f: replace(f, params=(*f.params[:2], replace(f.params[2], default=NOT_A_NUMBER)))),
     "the default of %eps: 'big' is not a value of dtype f32"),
    # results
    ("result undefined", fn(0, lambda f: replace(f, results=("9",))), "@rmsnorm: returns %9, which is not defined"),
    ("result type", fn(0, lambda f: replace(f, result_types=(S.TensorType(F32, (M,)),))),
     "returns %2 of type f32[M, N] as f32[M]"),
    ("result count", fn(0, lambda f: replace(f, results=("2", "1"))), "returns 2 values but declares 1 result types"),
    ("output names", fn(0, lambda f: replace(f, output_names=("y", "z"))), "has 2 output names for 1 results"),
    # contract and calls
    ("contract operand", op(1, 1, lhs=one), "the contract's lhs is not a load: 1.0"),
    ("contract dtypes", op(1, 1, rhs=S.Load("b", (S.Idx("k"), S.Idx("j")), DType.F16)),
     "contract of f32 with f16: both operands need one dtype"),
    ("missing callee", op(1, 0, callee="nope"), "@norm_mm %0 (call): calls @nope, which is not in the module"),
    ("arg count", op(1, 0, args=("a", "g")), "passes 2 arguments; @rmsnorm takes 3"),
    ("arg undefined", op(1, 0, args=("a", "g", "e")), "%e is not defined"),
    ("result count", op(1, 0, results=("0", "5")), "defines 2 values with 1 types; @rmsnorm returns 1"),
    ("arg type", op(1, 0, dims=(("M", M), ("N", M))), "argument %x of @rmsnorm is f32[M, M], but %a is f32[M, K]"),
    ("dims keys", op(1, 0, dims=(("M", M),)), "binds the callee's dims ['M']; @rmsnorm has dims ['M', 'N']"),
    ("call result type", op(1, 0, types=(S.TensorType(F32, (M, N)),)),
     "%0 is typed f32[M, N], but @rmsnorm returns f32[M, K]"),
    ("recursion", fn(0, lambda f: replace(f, ops=(*f.ops, S.CallOp(("3",), (S.TensorType(F32, (M, N)),), "rmsnorm",
                                                                   ("x", "w", "eps"), (("M", M), ("N", N)))))),
     "calls form a cycle: @rmsnorm -> @rmsnorm"),
    # module
    ("function twice", lambda m: replace(m, functions=(*m.functions, m.functions[0])), "@rmsnorm: defined twice"),
    ("version", lambda m: replace(m, version=2), "module: version 2, expected 1"),
]


@pytest.mark.parametrize(("label", "breakage", "message"), BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_ir_is_rejected(label: str, breakage: Callable[[S.Module], S.Module], message: str) -> None:
    with pytest.raises(IRVerifyError) as info:
        verify(breakage(BASE))
    assert any(message in p for p in info.value.problems), "\n".join(info.value.problems)
    assert message in str(info.value)


def test_all_problems_are_reported_at_once() -> None:
    broken = body(S.Binary("add", x(m_), S.Load("zz", (), F32), F32))(BASE)
    found = problems(broken)
    assert len(found) == 2
    assert found[0].startswith('@rmsnorm %2 (map "y"): load of %x has 1 subscripts')


# ---------------------------------------------------------------- broken strategies


def strategy(*decisions: Decision, kernel: str = "norm_mm", target: str | None = "llvm",
             when: S.Cond | None = None) -> StrategySet:
    return StrategySet((Strategy(kernel, target, when, decisions),))


BROKEN_STRATEGIES: list[tuple[str, StrategySet, str]] = [
    ("unknown kind", strategy(Decision("tiles", "i", 4)), "unknown decision `tiles`: expected one of tile,"),
    ("target", strategy(target="tpu"), "unknown target 'tpu'"),
    ("no effect", strategy(Decision("warps", None, 4)), "`warps` has no effect on target llvm"),
    ("needs index", strategy(Decision("tile", None, 4)), "`tile` needs an index: `tile i = …`"),
    ("whole kernel", strategy(Decision("threads", "i", 4)), "`threads` applies to the whole kernel"),
    ("not pos", strategy(Decision("tile", "i", 0)), "`tile` must be at least 1 (found 0)"),
    ("not pow2", strategy(Decision("vectorize", "i", 12)), "`vectorize` must be a power of two (found 12)"),
    ("split of 1", strategy(Decision("split", "k", 1)), "`split` must be at least 2 (found 1)"),
    ("too big", strategy(Decision("unroll", "i", 128)), "`unroll` is at most 64 (found 128)"),
    ("not int", strategy(Decision("tile", "i", "big")), "`tile` takes an integer (found 'big')"),
    ("enum", strategy(Decision("algorithm", None, "fast")), "`algorithm` is one of materialized, flash, split_kv"),
    ("takes no value", strategy(Decision("pack", "b", 2)), "`pack` takes no value (found 2)"),
    ("needs value", strategy(Decision("tile", "i", None)), "`tile` needs a value"),
    ("twice", strategy(Decision("tile", "i", 4), Decision("tile", "i", 8)), "`tile i` is decided twice"),
    ("kernel", strategy(kernel="nope"), "no kernel @nope in the module"),
    ("index", strategy(Decision("tile", "z", 4)), "`tile z`: @norm_mm has no index `z` (indices: i, j, k)"),
    ("parallel reduce", strategy(Decision("parallel", "k", None)),
     "`parallel k`: `k` is only ever reduced, and running a reduction in parallel would change its order"),
    ("split free", strategy(Decision("split", "i", 4)), "`split i`: `i` is never reduced"),
    ("pack scalar", strategy(Decision("pack", "eps", None)), "`pack eps`: @norm_mm has no tensor parameter %eps"),
    ("target choice", strategy(Decision("algorithm", None, "flash"), target="mlir"),
     "target mlir cannot lower `algorithm = flash` (only materialized)"),
    ("when dims", strategy(when=S.Rel("==", shapes.sym("S"), shapes.const(1))), "`when`: dim S uses S, not bound"),
]


@pytest.mark.parametrize(("label", "s", "message"), BROKEN_STRATEGIES, ids=[b[0] for b in BROKEN_STRATEGIES])
def test_broken_strategies_are_rejected(label: str, s: StrategySet, message: str) -> None:
    with pytest.raises(IRVerifyError) as info:
        verify_strategies(s, BASE)
    assert any(message in p for p in info.value.problems), "\n".join(info.value.problems)
    assert info.value.problems[0].startswith("strategy 0 (@")


def test_strategies_without_a_module_check_only_the_vocabulary() -> None:
    s = strategy(Decision("tile", "z", 4), Decision("parallel", "k", None), kernel="anything",
                 when=S.Rel("==", shapes.sym("S"), shapes.const(1)))
    assert strategy_problems(s) == []
    assert strategy_problems(strategy(Decision("warps", None, 3))) == [
        "strategy 0 (@norm_mm target llvm): `warps` has no effect on target llvm (it applies to cuda, triton)",
        "strategy 0 (@norm_mm target llvm): `warps` must be a power of two (found 3)",
    ]
