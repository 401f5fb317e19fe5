"""Inlining on hand-written kernels that call kernels: nested calls, swapped and compound dims,
several outputs, default scalar arguments, a returned parameter, one value passed twice.

Each kernel is checked structurally (no call left, values numbered densely in order, names
kept) and on the interpreter, bit for bit, before and after the whole pipeline.
"""

from __future__ import annotations

import zlib

import pytest
import sympy
from passes_support import SIZES, assert_same, optimise

import arke
from arke.ir import semantic as S
from arke.ir.shapes import sym
from arke.ir.text import read_module
from arke.ir.verify import verify
from arke.passes import inline_all, inline_calls
from arke.passes.rewrite import op_uses, result_names

SOURCE = """
from std.nn import rmsnorm, softmax, log_softmax, linear

kernel inner(x: f32[P, Q]) -> f32[P, Q] {
  return exp(x[p, q] * f32(Q) - f32(P))
}

kernel middle(y: f32[A, B], w: f32[B]) -> f32[A, B] {
  return inner(y) * w
}

kernel outer(z: f32[M, N], v: f32[N]) -> f32[M, N] {
  return middle(z, v) + log_softmax(middle(z, v))
}

kernel colsum(x: f32[M, N]) -> f32[N] {
  return sum(x[m, n] * f32(M) for m)
}

kernel swapped(x: f32[N, M]) -> f32[M] {
  return colsum(x)
}

kernel swap_twice(x: f32[M, N]) -> (a: f32[N], b: f32[N]) {
  a = colsum(x)
  b = swapped(x)
}

kernel pairs(x: f32[N]) -> y: f32[N / 2] where N % 2 == 0 {
  y[i] = x[2 * i] + x[2 * i + 1]
}

kernel quads(x: f32[K]) -> f32[K / 2 / 2] where K % 4 == 0 {
  return pairs(pairs(x))
}

kernel stats(x: f32[M, N]) -> (mu: f32[M], var: f32[M]) {
  mu[m] = mean(x[m, n] for n)
  var[m] = mean((x[m, n] - mu[m]) ** 2 for n)
}

kernel normalize(x: f32[M, N]) -> f32[M, N] {
  mu, var = stats(x)
  return (x[m, n] - mu[m]) * rsqrt(var[m] + 1e-5)
}

kernel scaled(x: f32[M, N], s: f32 = 2.0, t: f32 = 0.5) -> f32[M, N] {
  return x * s + t
}

kernel defaults(x: f32[M, N], w: f32[N]) -> f32[M, N] {
  a = scaled(x)
  b = scaled(a, 3.0)
  return scaled(b, 1.5, -1.0) + rmsnorm(a, w)
}

kernel passthru(x: f32[M, N], w: f32[N]) -> (y: f32[M, N], z: f32[M, N]) {
  y = x
  z = rmsnorm(x, w)
}

kernel use_passthru(x: f32[M, N], w: f32[N]) -> f32[M, N] {
  y, z = passthru(x, w)
  return y + softmax(z)
}

kernel both(x: f32[M, K], w: f32[K, K]) -> f32[M, K] {
  return linear(x, w) + linear(linear(x, w), w)
}

kernel same_twice(x: f32[N, N]) -> f32[N, N] {
  return linear(x, x)
}
"""

#: Kernels of SOURCE, with the dims each must be run at (others draw every dim from 1, 3, 17).
DIMS: dict[str, list[dict[str, int]]] = {
    "quads": [dict(K=4), dict(K=12), dict(K=68)],
}
CALLERS = ["outer", "swapped", "swap_twice", "quads", "normalize", "defaults", "use_passthru", "both", "same_twice"]


@pytest.fixture(scope="module")
def module() -> S.Module:
    return arke.loads(SOURCE).semantic


def _dims(fn: S.Function, name: str) -> list[dict[str, int]]:
    if name in DIMS:
        return DIMS[name]
    names = [b.dim for b in fn.bindings]
    return [dict.fromkeys(names, n) for n in SIZES] + [{d: SIZES[(k + 1) % 3] for k, d in enumerate(names)}]


def _dense(fn: S.Function) -> None:
    """Op results are "0", "1", … in order and every value is defined before it is used."""
    defined = {p.name for p in fn.params}
    for k, op in enumerate(fn.ops):
        assert result_names(op) == (str(k),)
        assert set(op_uses(op)) <= defined
        defined.add(str(k))


@pytest.mark.parametrize("name", CALLERS)
def test_inlined_kernels_compute_the_same(module: S.Module, name: str) -> None:
    inlined = inline_calls(module, name)
    verify(S.Module((inlined,)))
    _dense(inlined)
    optimised = optimise(module, name)
    _dense(optimised)
    for k, dims in enumerate(_dims(module.get(name), name)):
        seed = zlib.crc32(name.encode()) + k
        assert_same(module, name, inlined, dims, seed)
        assert_same(module, name, optimised, dims, seed)


def test_swapped_dims_are_replaced_at_once(module: S.Module) -> None:
    """colsum[M, N] called with {M = N, N = M}: chained substitution would give N, N."""
    call = next(op for op in module.get("swapped").ops if isinstance(op, S.CallOp))
    assert dict(call.dims) == {"M": sym("N"), "N": sym("M")}
    (op,) = inline_calls(module, "swapped").ops
    assert isinstance(op, S.ReduceOp)
    assert [a.extent for a in op.axes] == [sym("M")] and [a.extent for a in op.reduce_axes] == [sym("N")]
    assert isinstance(op.body, S.Binary) and isinstance(op.body.b, S.Cast)
    assert op.body.b.x == S.DimRef(sym("N"))  # the callee's dim(M) is the caller's N


def test_compound_dims_and_nested_calls(module: S.Module) -> None:
    fn = inline_calls(module, "quads")
    K = sym("K")
    extents = [op.axes[0].extent for op in fn.ops if isinstance(op, S.MapOp)]
    assert extents == [sympy.floor(K / 2), sympy.floor(sympy.floor(K / 2) / 2)]  # pairs' N//2 at N = K, then K//2
    assert {b.dim for b in fn.bindings} == {"K"}


def test_multi_output_call_and_returned_parameter(module: S.Module) -> None:
    fn = inline_calls(module, "use_passthru")
    last = fn.ops[-1]
    assert isinstance(last, S.MapOp)
    assert "x" in op_uses(last)  # passthru's `y` is its parameter: the caller's %x itself
    fn = inline_calls(module, "swap_twice")
    assert len(fn.results) == 2 and len(set(fn.results)) == 2


def test_default_scalars_fold_into_constants(module: S.Module) -> None:
    fn = optimise(module, "defaults")
    for op in fn.ops:
        assert not (isinstance(op, S.MapOp) and not op.axes), "a constant scalar map is left"


def test_names_are_kept(module: S.Module) -> None:
    names = [op.name for op in inline_calls(module, "normalize").ops]
    assert names.count("mu") == 1 and names.count("var") == 1


def test_calls_of_a_callee_with_the_same_value_twice(module: S.Module) -> None:
    (op,) = inline_calls(module, "same_twice").ops
    assert isinstance(op, S.ContractOp) and op.lhs.src == op.rhs.src == "x"


def test_inline_all_keeps_every_kernel(module: S.Module) -> None:
    inlined = inline_all(module)
    verify(inlined)
    assert [f.name for f in inlined.functions] == [f.name for f in module.functions]
    assert inlined.get("inner") == module.get("inner")  # nothing to inline: the very same function


CYCLE = """arke.semantic 1

kernel @f(%x: f32[N]) -> (f32[N])
  dims N = %x.0
{
  %0 = call @g(%x) : (f32[N]) dims {N = N}
  return %0
}

kernel @g(%x: f32[N]) -> (f32[N])
  dims N = %x.0
{
  %0 = call @f(%x) : (f32[N]) dims {N = N}
  return %0
}
"""


def test_a_call_cycle_is_an_error_not_a_hang() -> None:
    with pytest.raises(ValueError, match="cycle: @f -> @g -> @f"):
        inline_calls(read_module(CYCLE), "f")
    with pytest.raises(ValueError, match="not in the module"):
        inline_calls(read_module(CYCLE.split("kernel @g")[0]), "f")
