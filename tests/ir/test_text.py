"""The IR text form: exact round trips, the canonical spelling, and errors for bad text."""

from __future__ import annotations

import math
import re
from pathlib import Path

import gen
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arke.ir import semantic as S
from arke.ir import shapes
from arke.ir.dtypes import DType
from arke.ir.strategy import Decision, Strategy, StrategySet
from arke.ir.text import print_function, print_module, print_strategies, read_module, read_strategies
from arke.ir.text_read import IRSyntaxError
from arke.ir.verify import verify, verify_strategies

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

RMSNORM_TEXT = """\
arke.semantic 1

kernel @rmsnorm(%x: f32[M, N], %w: f32[N], %eps: f32 = 1e-06) -> (f32[M, N] as "y")
  dims M = %x.0, N = %x.1
  where N % 2 == 0
{
  %0 = reduce.sum f32 [m < M] over [n < N] { mul(%x[m, n], %x[m, n]) } name "ss"
  %1 = map f32 [m < M] { rsqrt(add(div(%0[m], f32(dim(N))), %eps[])) } name "inv"
  %2 = map f32 [m < M, n < N] { mul(mul(%x[m, n], %1[m]), %w[n]) } name "y"
  return %2
}

kernel @norm_mm(%a: f32[M, K], %g: f32[K], %b: f32[K, N], %eps: f32 = 1e-05) -> (f32[M, N])
  dims M = %a.0, K = %a.1, N = %b.1
{
  %0 = call @rmsnorm(%a, %g, %eps) : (f32[M, K]) dims {M = M, N = K}
  %1 = contract f32 [i < M, j < N] over [k < K] { %0[i, k], %b[k, j] }
  return %1
}
"""


def test_canonical_text_of_a_known_module() -> None:
    m = gen.rmsnorm_module()
    assert print_module(m) == RMSNORM_TEXT
    assert read_module(RMSNORM_TEXT) == m


@PROPERTY
@given(gen.modules())
def test_module_round_trip(m: S.Module) -> None:
    text = print_module(m)
    back = read_module(text)
    assert back == m
    assert print_module(back) == text


@PROPERTY
@given(gen.modules(max_functions=2).flatmap(gen.strategy_sets))
def test_strategies_round_trip(s: StrategySet) -> None:
    text = print_strategies(s)
    assert read_strategies(text) == s


@settings(max_examples=300, deadline=None)
@given(gen.dims(gen.SYMBOLS))
def test_dims_round_trip_through_dim_str(d: shapes.Dim) -> None:
    assert shapes.parse_dim(shapes.dim_str(d)) == d


M_, N_, H_ = shapes.sym("M"), shapes.sym("N"), shapes.sym("H")
TRICKY_DIMS = [
    3 * shapes.floordiv(M_ + 1, 2),  # once printed `3*(M + 1)//2`
    -shapes.floordiv(M_, 2),
    N_ * shapes.mod(M_, 3),
    shapes.floordiv(M_, N_) ** 2,
    M_**2 - M_,
    shapes.floordiv(H_**2 + 2 * H_, N_),  # not H*(H + 2)
    shapes.floordiv(H_**2 + 2 * H_, 2),  # SymPy keeps H**2/2 + H
    -N_ + shapes.mod(-4, M_),  # `(-4) % M`, not `-(4 % M)`
    M_ + shapes.floordiv(-4, N_),
    (2 * shapes.mod(7, H_)) * (H_ + 7),  # not (2*H + 14)*(7 % H)
    -(M_ + N_) * shapes.floordiv(M_, N_),  # a leading minus stays a factor -1
]


@pytest.mark.parametrize("d", TRICKY_DIMS)
def test_dims_that_need_parentheses(d: shapes.Dim) -> None:
    assert shapes.parse_dim(shapes.dim_str(d)) == d


@pytest.mark.parametrize("d", TRICKY_DIMS)
def test_dims_keep_their_form_inside_ir_text(d: shapes.Dim) -> None:
    x = S.Param("x", S.TensorType(DType.F32, (M_, N_, H_)))
    op = S.MapOp("0", DType.I64, (S.Axis("i", d),), S.DimRef(d))
    guard = S.Guard(S.BoolOp("and", (S.Rel("<", d, -d), S.InSet(d, (d,)))), "g")
    f = S.Function("f", (x,), tuple(S.DimBinding(n, "x", i) for i, n in enumerate("MNH")), (guard,), (op,),
                   ("0",), (op.type,))
    m = S.Module((f,))
    assert read_module(print_module(m)) == m


def _one_map(body: S.SExpr, params: tuple[S.Param, ...] = ()) -> S.Module:
    op = S.MapOp("0", body.dtype, (S.Axis("i", shapes.sym("N")),), body)
    return S.Module((S.Function("f", params, (), (), (op,), ("0",), (op.type,)),))


@pytest.mark.parametrize("value", [math.inf, -math.inf, 0.1, -0.0, 5e-324, 1.7976931348623157e308, 1e16, 1.5e-10])
def test_floats_come_back_bit_for_bit(value: float) -> None:
    m = _one_map(S.Const(value, DType.F32))
    (op,) = read_module(print_module(m)).functions[0].ops
    assert isinstance(op, S.MapOp) and isinstance(op.body, S.Const)
    assert repr(op.body.value) == repr(value) and type(op.body.value) is float


def test_nan_reads_as_math_nan() -> None:
    m = _one_map(S.Const(math.nan, DType.F32))
    assert "{ nan }" in print_module(m)
    assert read_module(print_module(m)) == m  # the reader gives math.nan itself


@pytest.mark.parametrize(("node", "spelling"), [
    (S.Const(1, DType.F32), "1 : f32"),  # an int literal in a float constant stays an int
    (S.Const(1.0, DType.F32), "1.0"),
    (S.Const(True, DType.I8), "true : i8"),
    (S.Const(2**70, DType.I64), str(2**70)),
    (S.Idx("i", DType.I32), "i : i32"),
    (S.Cast(S.DimRef(shapes.floordiv(shapes.sym("N"), 2)), DType.F16), "f16(dim(N//2))"),
    (S.Binary("lt", S.Idx("i"), S.DimRef(shapes.sym("N")), DType.BOOL), "lt(i, dim(N))"),
    (S.Select(S.Const(False, DType.BOOL), S.Const(1.0, DType.F16), S.Const(2.0, DType.F16), DType.F16),
     "select(false, 1.0 : f16, 2.0 : f16)"),
    (S.Load("missing", (S.Idx("i"),), DType.BF16), '%missing[i] : bf16'),  # no source: dtype written
])
def test_dtype_is_written_only_when_not_implied(node: S.SExpr, spelling: str) -> None:
    m = _one_map(node)
    assert f"{{ {spelling} }}" in print_module(m)
    assert read_module(print_module(m)) == m


def test_odd_names_are_quoted() -> None:
    body = S.Binary("add", S.Idx("inf"), S.Load("my x", (S.Idx("dim"),), DType.I64), DType.I64)
    op = S.MapOp("0", DType.I64, (S.Axis("inf", shapes.sym("N")), S.Axis("dim", shapes.sym("N"))), body)
    f = S.Function("lib.f", (S.Param("my x", S.TensorType(DType.I64, (shapes.sym("N"),))),), (), (), (op,),
                   ("0",), (op.type,))
    m = S.Module((f,))
    text = print_module(m)
    assert 'kernel @"lib.f"(%"my x": i64[N])' in text
    assert '["inf" < N, "dim" < N] { add("inf", %"my x"["dim"]) }' in text
    assert read_module(text) == m


def test_conditions_keep_their_structure() -> None:
    M, N = shapes.sym("M"), shapes.sym("N")
    a, b, c = S.Rel("==", M, N), S.InSet(N, (shapes.const(64), shapes.const(128))), S.Rel("<", M, 2 * N)
    cases: dict[S.Cond, str] = {
        S.BoolOp("and", (a, S.BoolOp("or", (b, c)))): "M == N and (N in {64, 128} or M < 2*N)",
        S.BoolOp("and", (S.BoolOp("and", (a, b)), c)): "(M == N and N in {64, 128}) and M < 2*N",
        S.BoolOp("not", (S.BoolOp("or", (a, c)),)): "not (M == N or M < 2*N)",
        S.BoolOp("or", (a,)): "or(M == N)",
        S.BoolOp("and", ()): "and()",
        S.InSet(M, ()): "M in {}",
    }
    for cond, text in cases.items():
        f = S.Function("f", (S.Param("x", S.TensorType(DType.F32, (M, N))),),
                       (S.DimBinding("M", "x", 0), S.DimBinding("N", "x", 1)),
                       (S.Guard(cond, "as written"),), (), (), ())
        printed = print_function(f)
        assert f"  where {text} as \"as written\"\n" in printed
        assert read_module("arke.semantic 1\n" + printed).functions[0] == f


def test_hand_written_text_with_comments_and_free_layout() -> None:
    text = """
    # a comment before the header
    arke.semantic 1
    kernel @k(%x: f32[N]) -> (f32[N] as "y") dims N = %x.0 {   # a comment
      %0 = map f32 [i < N] { exp(%x[i]) }
      return %0 }
    """
    (f,) = read_module(text).functions
    assert f.output_names == ("y",)
    assert f.ops[0] == S.MapOp("0", DType.F32, (S.Axis("i", shapes.sym("N")),),
                               S.Unary("exp", S.Load("x", (S.Idx("i"),), DType.F32), DType.F32))


def test_strategy_text() -> None:
    s = StrategySet((
        Strategy("attention", "triton", S.Rel("==", shapes.sym("S"), shapes.const(1)), (
            Decision("algorithm", None, "flash"), Decision("tile", "i", 128), Decision("pack", "w", None),
            Decision("parallel", "m", None))),
        Strategy("rmsnorm", None, None, ()),
    ))
    text = print_strategies(s)
    assert text == ("arke.strategy 1\n\nstrategy @attention target triton when S == 1 {\n  algorithm = flash;\n"
                    "  tile i = 128;\n  pack w;\n  parallel m;\n}\n\nstrategy @rmsnorm {\n}\n")
    assert read_strategies(text) == s


@given(st.text(max_size=20))
def test_any_string_survives_quoting(name: str) -> None:
    s = StrategySet((Strategy(name, name, None, (Decision(name, name, name),)),))
    assert read_strategies(print_strategies(s)) == s


BAD_TEXT = [
    ("arke.strategy 1", "not arke.semantic text"),
    ("arke.semantic 2", "version 2 is not supported"),
    ("arke.semantic 1 kernel @f() -> () { return", "unexpected end of text"),
    ("arke.semantic 1 kernel @f(%x: f33) -> () { return }", "unknown dtype 'f33'"),
    ("arke.semantic 1 kernel @f() -> () { %0, %1 = map f32 [] { 1.0 } return }", "a map op defines one value"),
    ("arke.semantic 1 kernel @f() -> () { %0 = contract f32 [] over [] { 1.0, 2.0 } return }", "two loads"),
    ("arke.semantic 1 kernel @f() -> () { %0 = map f32 [] { select(true, 1.0) } return }", "three operands"),
    ("arke.semantic 1 kernel @f() -> () { %0 = map f32 [] { f16(1.0, 2.0) } return }", "one operand"),
    ("arke.semantic 1 kernel @f() -> () { %0 = map f32 [] { %y[] } return }", "write the dtype of this load"),
    ("arke.semantic 1 kernel @f() -> () { %0 = map f32 [] { f16(1.0) : f32 } return }", "a cast to f16"),
    ("arke.semantic 1 kernel @f() -> () where xor(N == 1) { return }", "unknown condition 'xor'"),
    ("arke.semantic 1 kernel @f() -> () { %0 = map f32 [] { 1.0 } name \"a\\q\" return }", "bad string"),
    ("arke.semantic 1 kernel @f() -> () { %0 = map f32 [i < N] { 1.0 } ", "unexpected end of text"),
    ("arke.semantic 1 kernel @f() -> () { %0 = map f32 [i <= N] { 1.0 } return }", "unexpected '=': expected"),
    ("arke.semantic 1 kernel @f() -> () { $ }", "unexpected character '$'"),
]


@pytest.mark.parametrize(("text", "message"), BAD_TEXT)
def test_bad_text_gives_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(IRSyntaxError) as info:
        read_module(text)
    assert message in str(info.value)


def test_syntax_errors_say_where() -> None:
    with pytest.raises(IRSyntaxError) as info:
        read_module("arke.semantic 1\nkernel @f() -> ()\n{\n  %0 = map f32 [] { 1.0 ]\n  return\n}\n")
    assert (info.value.line, info.value.column) == (4, 25)
    assert "expected" in info.value.message


def test_bad_strategy_text() -> None:
    with pytest.raises(IRSyntaxError, match="unexpected 'tile'"):
        read_strategies("arke.strategy 1 strategy @f { warps = 8 tile i = 1; }")
    with pytest.raises(IRSyntaxError, match="version 9"):
        read_strategies("arke.strategy 9")


SPEC = Path(__file__).resolve().parents[2] / "spec" / "ir.md"
SPEC_BLOCKS = re.findall(r"^```(ir|ir-strategy)\n(.*?)^```$", SPEC.read_text(encoding="utf-8"), re.M | re.S)


@pytest.mark.parametrize(("kind", "text"), SPEC_BLOCKS)
def test_spec_examples_read_verify_and_print_back(kind: str, text: str) -> None:
    if kind == "ir":
        m = read_module(text)
        verify(m)
        assert print_module(m) == text
    else:
        s = read_strategies(text)
        verify_strategies(s)
        assert print_strategies(s) == text


def test_spec_has_examples() -> None:
    assert [kind for kind, _ in SPEC_BLOCKS] == ["ir", "ir", "ir-strategy"]  # the example, scans (§2.4), strategies


def _grammar_words() -> list[str]:
    from importlib import resources

    text = resources.files("arke.grammar").joinpath("ir.lark").read_text(encoding="utf-8")
    return sorted({w for w in re.findall(r'"([A-Za-z_][A-Za-z_0-9]*)"', text)})


@pytest.mark.parametrize("word", _grammar_words())
def test_every_word_of_the_ir_grammar_survives_as_a_name(word: str) -> None:
    s = StrategySet((Strategy(word, word, None, (Decision(word, word, word),)),))
    assert read_strategies(print_strategies(s)) == s
