"""Dtype generics (spec/language.md §5.6): checking, specialisations, calls, the interpreter, akc, hover.

The interpreter is checked against torch expressions written here; the targets against the
interpreter are tests/targets/test_generics_targets.py's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import arke
from arke.cli import app as cli
from arke.ir.dtypes import DType
from arke.ir.serialize import from_json, to_json
from arke.ir.text import print_module, read_module
from arke.lang.checker import check_text
from arke.runtime.errors import GuardError

LINEAR = """
kernel linear(x: f32[M, K], w: W[N, K]) -> f32[M, N] where W in {f32, bf16, f16} {
  return sum(x[m, k] * f32(w[n, k]) for k)
}
"""

PROGRAM = LINEAR + """
# y keeps w's dtype; the scale is applied in f32 and rounded once
kernel scaled(w: W[N], s: f32) -> W[N] where W in {f32, bf16, f16} {
  let z = W(0)
  return W(f32(w[n]) * s) + z
}

# integer weights with one scale per output channel
kernel qlinear(x: f32[M, K], w: Q[N, K], ws: f32[N]) -> f32[M, N] where Q in {i8, u8} {
  return sum(x[m, k] * f32(w[n, k]) for k) * ws[n]
}

# two variables: four specialisations
kernel mix(a: A[N], b: B[N]) -> f32[N] where A in {f32, bf16}, B in {i8, u8} {
  return f32(a[n]) + f32(b[n])
}

# a generic kernel calling another: its V binds linear's W
kernel twice(x: f32[M, K], w: V[N, K]) -> f32[M, N] where V in {bf16, f16} {
  return linear(x, w) * 2.0
}

kernel fixed(x: f32[M, K], w: bf16[N, K]) -> f32[M, N] { return linear(x, w) }
"""


def codes(text: str) -> list[str]:
    return sorted(d.code for d in arke.check(text) if d.is_error)


def errors(text: str) -> list[str]:
    return [d.message for d in arke.check(text) if d.is_error]


@pytest.fixture(scope="module")
def module() -> arke.Module:
    return arke.loads(PROGRAM)


# ---------------------------------------------------------------- checking


def test_each_combination_is_a_specialised_function(module: arke.Module) -> None:
    names = [f.name for f in module.semantic.functions]
    for n in ("linear__W_f32", "linear__W_bf16", "linear__W_f16", "qlinear__Q_i8", "qlinear__Q_u8",
              "mix__A_f32__B_i8", "mix__A_f32__B_u8", "mix__A_bf16__B_i8", "mix__A_bf16__B_u8",
              "twice__V_bf16", "twice__V_f16"):
        assert n in names
    f = module.semantic.get("mix__A_bf16__B_u8")
    assert f.specialisation == (("A", DType.BF16), ("B", DType.U8))
    assert [p.type.dtype for p in f.params] == [DType.BF16, DType.U8]
    out = module.semantic.get("scaled__W_f16")
    assert out.result_types[0].dtype is DType.F16  # the variable in an output type
    assert not module.semantic.get("fixed").specialisation
    calls = [op.callee for op in module.semantic.get("twice__V_f16").ops if hasattr(op, "callee")]
    assert calls == ["linear__W_f16"]  # the caller's dtype picked the callee's specialisation
    assert module.generics["mix"].constraint() == "A in {f32, bf16}, B in {i8, u8}"


def test_specialisations_print_and_read_back(module: arke.Module) -> None:
    text = print_module(module.semantic)
    assert "kernel @linear__W_bf16(%x: f32[M, K], %w: bf16[N, K])" in text
    assert "  specialise A = bf16, B = u8\n" in text
    assert read_module(text) == module.semantic
    js = to_json(module.semantic)
    assert '"specialisation": [["W", "bf16"]]' in js
    assert from_json(js) == module.semantic


def test_an_error_of_one_member_says_which() -> None:
    text = "kernel low(w: W[N]) -> W[N] where W in {u8, i8, f32} { return w & W(15) }"
    found = [d for d in arke.check(text) if d.is_error]
    assert [d.code for d in found] == ["AK3019"]
    assert found[0].message.endswith("(when W = f32)")
    # an error every member makes is reported once, without a member
    text = "kernel f(w: W[N]) -> f32[N] where W in {f32, bf16} { return w[n] + undefined[n] }"
    found = [d for d in arke.check(text) if d.is_error]
    assert [d.code for d in found] == ["AK2001"] and "when" not in found[0].message
    # two members failing alike each say so
    text = "kernel f(w: W[N]) -> W[N] where W in {f32, bf16, i8} { return w ^ w }"
    msgs = errors(text)
    assert len(msgs) == 2 and any("W = f32" in m for m in msgs) and any("W = bf16" in m for m in msgs)


def test_declarations() -> None:
    assert codes("kernel f(x: W[N]) -> W[N] where W in {f32, float} { return x }") == ["AK3025"]
    assert codes("kernel f(x: W[N]) -> W[N] where W in {f32, f32} { return x }") == ["AK3025"]
    assert codes("kernel g(x: f32[N]) -> W[N] where W in {f32, bf16} { return W(x) }") == ["AK3026"]
    assert codes("kernel g(x: f32[N], s: W) -> f32[N] where W in {f32, bf16} { return x }") == ["AK3026"]
    assert codes("kernel f(x: W[N]) -> W[N] where W in {f32}, W in {bf16} { return x }") == ["AK2113"]
    assert codes("kernel f(x: f32[N]) -> f32[N] where f32 in {f32, bf16} { return x }") == ["AK2113"]
    assert codes("kernel f(x: f32[N]) -> f32[N] where N in {f32, bf16} { return x }") == ["AK2113"]
    # named like a parameter: refused, so `x[N]` is an unknown dtype as well
    assert codes("kernel f(x: x[N]) -> f32[N] where x in {f32, bf16} { return f32(x) }") == ["AK2113", "AK3001"]
    # a variable used but never declared: an unknown dtype, whose hint says how to declare it
    found = [d for d in arke.check("kernel f(x: W[N]) -> f32[N] { return f32(x) }") if d.is_error]
    assert [d.code for d in found] == ["AK3001"] and "where W in" in (found[0].hint or "")
    # dim sets still work beside dtype sets
    assert codes("kernel f(x: W[N]) -> W[N] where N in {1, 2}, W in {f32} { return x }") == []


def test_too_many_combinations() -> None:
    sets = ", ".join(f"{v} in {{f32, bf16, f16, i8, u8}}" for v in "ABC")
    text = f"kernel f(a: A[N], b: B[N], c: C[N]) -> f32[N] where {sets} {{ return f32(a) }}"
    assert codes(text) == ["AK3025"]  # 125 > 64


def test_calls_bind_and_check_the_set() -> None:
    bad = LINEAR + "kernel g(x: f32[M, K], w: i8[N, K]) -> f32[M, N] { return linear(x, w) }"
    found = [d for d in arke.check(bad) if d.is_error]
    assert [d.code for d in found] == ["AK3027"] and "{f32, bf16, f16}" in found[0].message
    # a caller whose set is wider than the callee's: the member outside it is the error
    wide = LINEAR + "kernel g(x: f32[M, K], w: V[N, K]) -> f32[M, N] where V in {bf16, i8} { return linear(x, w) }"
    msgs = errors(wide)
    assert len(msgs) == 1 and "(when V = i8)" in msgs[0]
    # the count is still checked
    assert codes(LINEAR + "kernel g(x: f32[M, K]) -> f32[M, M] { return linear(x) }") == ["AK3008"]


def test_strategies_apply_to_each_specialisation() -> None:
    mod = arke.loads(LINEAR + "@strategy(linear, target = llvm) { tile n = 4 }")
    kernels = sorted(s.kernel for s in mod.strategies.strategies)
    assert kernels == ["linear__W_bf16", "linear__W_f16", "linear__W_f32"]


# ---------------------------------------------------------------- the interpreter against torch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_interpreter_linear_and_scaled(module: arke.Module, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(17)
    x, w = torch.randn(3, 33, generator=g), torch.randn(17, 33, generator=g).to(dtype)
    got = module.kernels["linear"](x, w)
    torch.testing.assert_close(got, x.double().matmul(w.double().T).float(), rtol=1e-5, atol=1e-5)
    v = torch.randn(4097, generator=g).to(dtype)
    got = module.kernels["scaled"](v, 0.5)
    assert got.dtype == dtype
    torch.testing.assert_close(got, (v.float() * 0.5).to(dtype), rtol=0, atol=0)
    if dtype != torch.float32:
        got = module.kernels["twice"](x, w)
        torch.testing.assert_close(got, 2 * x.double().matmul(w.double().T).float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
def test_interpreter_quantised(module: arke.Module, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    lo = -100 if dtype == torch.int8 else 0
    x, w = torch.randn(3, 17, generator=g), torch.randint(lo, 100, (5, 17), generator=g).to(dtype)
    ws = torch.rand(5, generator=g)
    got = module.kernels["qlinear"](x, w, ws)
    torch.testing.assert_close(got, (x.double() @ w.double().T * ws.double()).float(), rtol=1e-5, atol=1e-4)
    a, b = torch.randn(7, generator=g).to(torch.bfloat16), torch.randint(lo, 100, (7,), generator=g).to(dtype)
    torch.testing.assert_close(module.kernels["mix"](a, b), a.float() + b.float(), rtol=0, atol=0)


def test_a_dtype_outside_the_set_is_a_guard_error(module: arke.Module) -> None:
    x = torch.randn(3, 5)
    with pytest.raises(GuardError) as err:
        module.kernels["linear"](x, torch.zeros(4, 5, dtype=torch.int8))
    assert err.value.rule == "dtype" and err.value.param == "w" and "{f32, bf16, f16}" in str(err.value)
    with pytest.raises(GuardError) as err:
        module.kernels["linear"](x)
    assert err.value.rule == "missing"
    # by name too
    y = module.kernels["linear"](x, w=torch.ones(2, 5, dtype=torch.float16))
    torch.testing.assert_close(y, x.sum(1, keepdim=True).expand(3, 2))


def test_specialise_by_name(module: arke.Module) -> None:
    k = module.kernels["linear"].specialise(W="bf16")
    assert k.function.name == "linear__W_bf16"
    with pytest.raises(ValueError, match="one of"):
        module.kernels["linear"].specialise(W="i8")
    with pytest.raises(ValueError, match="no dtype variable"):
        module.kernels["linear"].specialise(V="f32")
    with pytest.raises(ValueError, match="needs a dtype"):
        module.kernels["mix"].specialise(A="f32")
    with pytest.raises(TypeError, match="generic"):
        _ = module.kernels["linear"].function


# ---------------------------------------------------------------- akc and the language server


def test_akc_build_takes_dtypes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "lin.ak"
    path.write_text(LINEAR + "kernel plain(x: f32[N]) -> f32[N] { return x * 2.0 }\n")
    assert cli.main(["build", str(path), "--dtypes", "W=bf16"]) == 0
    out = capsys.readouterr().out
    assert "linear__W_bf16" in out and "linear__W_f16" not in out and "plain" in out
    assert cli.main(["build", str(path), "--kernel", "linear__W_f16"]) == 0  # without: each specialisation
    assert "linear__W_f16" in capsys.readouterr().out
    assert cli.main(["build", str(path), "--dtypes", "W=i8"]) == 2
    assert "one of f32, bf16, f16" in capsys.readouterr().err
    assert cli.main(["build", str(path), "--dtypes", "V=f32"]) == 2
    status = cli.main(["build", str(path), "--explain", "--kernel", "linear", "--dtypes", "W=f16",
                       "--dims", "M=3,K=5,N=7"])
    assert status == 0 and "contraction" in capsys.readouterr().out


def test_hover_shows_the_constraint() -> None:
    from arke.lsp.hover import hover_markdown
    from arke.lsp.index import DocumentIndex

    index = DocumentIndex(PROGRAM, "<test>", check_text(PROGRAM, "<test>"))
    at = PROGRAM.index("kernel linear") + len("kernel ")
    occ = index.at(at)
    assert occ is not None
    text = hover_markdown(index, occ.symbol)
    assert text is not None and "W in {f32, bf16, f16}" in text and "bound by `w`" in text
    occ = index.at(PROGRAM.index("w: W[N, K]"))
    assert occ is not None
    text = hover_markdown(index, occ.symbol)
    assert text is not None and "w: W[N, K]" in text and "generic" in text
