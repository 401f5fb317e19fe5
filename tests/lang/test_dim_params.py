"""The checker on dim parameters (``G: dim``, spec §5.5), declared shapes (``t[i]: f32[N] = ...``, §7.3)
and a `return`'s index that takes the output's axis left (§7.2); the IR they lower to prints, reads back
(text and JSON) and verifies."""

from __future__ import annotations

from dataclasses import replace

import pytest

import arke
from arke.ir import semantic as S
from arke.ir import serialize, text, verify
from arke.ir.dtypes import DType


def codes(source: str) -> list[str]:
    return [d.code for d in arke.check(source) if d.is_error]


def function(source: str, name: str) -> S.Function:
    return arke.loads(source).semantic.get(name)


GOOD = """
kernel split(x: f32[B, C], G: dim = 4) -> f32[B, G, C / G] where C % G == 0, G >= 2 {
  let cg = C / G
  t[b, g, c]: f32[B, G, cg] = x[b, g * cg + c]
  return t
}

kernel halves(x: f32[B, C]) -> f32[B, 2, C / 2] where C % 2 == 0 { return split(x, 2) }
kernel given(x: f32[B, C], K: dim) -> f32[B, K, C / K] where C % K == 0, K >= 2 { return split(x, K) }
kernel aliased(x: f32[B, C]) -> f32[B, 3, C / 3] where C % 3 == 0 {
  let h = 2 + 1
  return split(x, h)
}
kernel scaled(x: f32[N], K: dim) -> f32[N] { return x[n] * f32(K) + f32(K * N) }
"""


def test_dim_parameters_bind_dims_and_lower_to_i64_scalars() -> None:
    assert codes(GOOD) == []
    fn = function(GOOD, "split")
    assert fn.params[1] == S.Param("G", S.TensorType(DType.I64), 4)
    assert S.DimBinding("G", "G", -1) in fn.bindings
    assert [g.text for g in fn.guards] == ["C % G == 0", "G >= 2"]
    assert [str(d) for d in fn.result_types[0].shape] == ["B", "G", "floor(C/G)"]
    for name, bound in (("halves", "2"), ("given", "K"), ("aliased", "3")):
        call = function(GOOD, name).ops[-1]
        assert isinstance(call, S.CallOp) and str(dict(call.dims)["G"]) == bound, (name, call.dims)


def test_ir_of_dim_parameters_round_trips_and_verifies() -> None:
    semantic = arke.loads(GOOD).semantic
    printed = text.print_module(semantic)
    assert "G = %G," in printed or "G = %G\n" in printed
    assert text.read_module(printed) == semantic
    assert serialize.from_json(serialize.to_json(semantic)) == semantic
    assert verify.problems(semantic) == []
    fn = semantic.get("split")
    bad = replace(fn, bindings=tuple(replace(b, param="x") if b.axis < 0 else b for b in fn.bindings))
    assert any("must be an i64 scalar" in p for p in verify.problems(S.Module((bad,))))


@pytest.mark.parametrize(("header", "code"), [
    ("G: dim = 0", "AK3021"), ("G: dim = -2", "AK3021"), ("G: dim = 2.5", "AK3021"), ("G: dim = true", "AK3021"),
    ("G: dim[4]", "AK3021"), ("G: dim, G: dim", "AK2003"), ("x: dim", "AK2003"), ("G: dims", "AK3001"),
])
def test_bad_dim_parameters(header: str, code: str) -> None:
    assert code in codes(f"kernel f(x: f32[N], {header}) -> f32[N] {{ return x }}")


@pytest.mark.parametrize("arg", ["2.0", "s", "x[0]", "0", "N - N", "1 - 2"])
def test_a_call_passes_a_positive_dim_expression(arg: str) -> None:
    source = ("kernel g(x: f32[N], K: dim) -> f32[N] { return x[n] * f32(K) }\n"
              f"kernel f(x: f32[N], s: i64) -> f32[N] {{ return g(x, {arg}) }}\n")
    assert codes(source) == ["AK3021"], arke.check(source)


def test_a_call_with_a_dim_agrees_with_the_callees_axis() -> None:
    source = ("kernel g(x: f32[K], K: dim) -> f32[K] { return x }\n"
              "kernel ok(x: f32[N]) -> f32[N] { return g(x, N) }\n"
              "kernel bad(x: f32[N]) -> f32[N] { return g(x, N + 1) }\n")
    assert codes(source) == ["AK3009"]


def test_declared_shapes_give_extents_and_store_their_dtype() -> None:
    source = """
kernel f(pos: i64[S], R: dim) -> (a: f32[S, R], b: f32[S]) {
  a[s, e] = f32(pos[s]) * f32(e)
  t[s]: f32[S] = pos[s]                  # i64 -> f32 converts as on store
  b[s] = t[s]
}
kernel g(x: f32[S]) -> f32[S] {
  w[i]: f32[S] = 1                        # a weak literal
  return x[i] * w[i]
}
"""
    assert codes(source) == []
    fn = function(source, "f")
    t = next(op for op in fn.ops if isinstance(op, S.MapOp) and op.name == "t")
    assert t.dtype == DType.F32


@pytest.mark.parametrize(("body", "code"), [
    ("t[i, j]: f32[N] = x[i] * f32(j)\n  return x", "AK3022"),
    ("t[i]: f32 = x[i]\n  return x", "AK3022"),
    ("y[i]: f32[N] = x[i]", "AK3022"),
    ("t[i]: i32[N] = x[i]\n  return x", "AK3016"),
    ("t[i]: f32[M] = x[i]\n  return x", "AK2001"),
    ("t[i]: f32[N + 1] = x[i]\n  return x", "AK3003"),
    ("t[i]: f33[N] = x[i]\n  return x", "AK3001"),
])
def test_bad_declared_shapes(body: str, code: str) -> None:
    source = f"kernel f(x: f32[N]) -> y: f32[N] {{\n  {body}\n}}\n"
    assert code in codes(source), arke.check(source)


def test_a_return_gives_its_one_extentless_index_the_axis_left() -> None:
    assert codes("kernel f(x: f32[N]) -> f32[N] { return x[N - 1 - i] }") == []
    assert codes("kernel f(x: f32[M, N]) -> f32[N, M] { return x[m, N - 1 - j] }") == []
    two = codes("kernel f(x: f32[M, N]) -> f32[M, N] { return x[M - 1 - i, N - 1 - j] }")
    assert two == ["AK2105", "AK2105"]
    fn = function("kernel f(x: f32[N], K: dim) -> f32[K] where K <= N { return x[N - K + k] }", "f")
    assert [str(a.extent) for a in fn.ops[-1].axes] == ["K"]


def test_the_extent_hint_offers_a_declared_shape() -> None:
    [d] = [d for d in arke.check("kernel f(x: f32[N]) -> f32[N] {\n  t[i] = x[2 * i]\n  return x\n}\n")
           if d.is_error]
    assert d.code == "AK2105" and "declared shape" in (d.hint or "") and "K: dim" in (d.hint or "")


def test_a_call_that_leaves_a_dim_parameter_out_binds_its_default() -> None:
    import numpy as np

    source = """
kernel gn(x: f32[B, C], G: dim = 2) -> f32[B, G] where C % G == 0 {
  let cg = C / G
  xg[n, g, c]: f32[B, G, cg] = x[n, g * cg + c]
  return mean(xg[n, g, c] for c)
}
kernel caller(x: f32[B, C]) -> f32[B, 2] where C % 2 == 0 { return gn(x) }
"""
    module = arke.loads(source)
    call = module.semantic.get("caller").ops[-1]
    assert isinstance(call, S.CallOp) and str(dict(call.dims)["G"]) == "2"
    x = np.arange(24, dtype=np.float32).reshape(3, 8)
    np.testing.assert_allclose(arke.interpret(module.kernels["caller"], x), x.reshape(3, 2, 4).mean(-1))


def test_a_strategy_may_choose_by_a_dim_parameter() -> None:
    source = """
kernel rows(x: f32[N], K: dim) -> y: f32[N, K] { y[n, k] = x[n] * f32(k) }
@strategy(rows, target = llvm, when K == 4) { parallel n }
@strategy(rows, target = llvm, when K > 8 and N > 1) { vectorize k = 8 }
"""
    assert codes(source) == []
    module = arke.loads(source)
    whens = [s.when for s in module.strategies.for_kernel("rows", "llvm")]
    assert len(whens) == 2 and all(w is not None for w in whens)
