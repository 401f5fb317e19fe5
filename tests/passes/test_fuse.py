"""Elementwise fusion: what folds and what stays, the store's rounding kept, and the same results.

Results are compared bit for bit with the unfused kernel (passes_support), except where a
fold changes a reduction's body into ``a * b``: the interpreter then sums by einsum in
another order, and the test allows the reassociation bound instead (see passes_support).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from passes_support import SIZES, assert_same, gamma, optimise

import arke
from arke.ir import semantic as S
from arke.ir.dtypes import DType
from arke.ir.text import read_module
from arke.ir.verify import verify
from arke.passes import fuse_elementwise
from arke.passes.fuse import MAX_BODY_NODES, is_cheap
from arke.passes.rewrite import map_op_exprs, op_exprs, walk
from arke.runtime.interp import run_function

SOURCE = """
kernel bf_sum(x: bf16[M, N]) -> bf16[M] {
  e[m, n] = exp(x[m, n])
  return sum(e[m, n] for n)
}

kernel bf_mixed(x: bf16[M, N], y: f32[M, N]) -> f32[M, N] {
  e[m, n] = exp(x[m, n]) * 3.0
  return f32(e[m, n]) * y[m, n]
}

kernel bf_chain(x: bf16[M, N]) -> bf16[M, N] {
  a[m, n] = x[m, n] * 1.1
  b[m, n] = a[m, n] * 1.1
  return b[m, n] + x[m, n]
}

kernel h_chain(x: f16[M, N], w: f32[N]) -> f32[M, N] {
  a[m, n] = x[m, n] * x[m, n]
  return f32(a[m, n]) * w[n]
}

kernel bf_round_trip(x: bf16[M, N]) -> f32[M, N] {
  a[m, n] = f32(x[m, n]) * 1.1
  b[m, n] = bf16(a[m, n])
  return f32(b[m, n]) + 1.0
}

kernel two_outputs(x: f32[M, N]) -> (a: f32[M, N], b: f32[M, N]) {
  a[m, n] = exp(x[m, n])
  b[m, n] = a[m, n] * 2.0
}

kernel into_contract(x: f32[M, K], w: f32[K, N]) -> f32[M, N] {
  s[m, k] = x[m, k] * 2.0 + 1.0
  return s @ w
}

kernel epilogue_then_sum(x: f32[M, K], w: f32[N, K], b: f32[N]) -> f32[M] {
  h[m, n] = relu(sum(x[m, k] * w[n, k] for k) + b[n])
  return sum(h[m, n] for n)
}

kernel transposed(x: f32[M, N]) -> f32[N, M] {
  t[n, m] = x[m, n]
  return t[n, m] * t[n, m] + sum(t[n, k] for k)
}

kernel broadcast_twice(x: f32[M, N]) -> f32[M, N] {
  r[m] = exp(x[m, 0])
  return x[m, n] * r[m] + sum(x[m, k] * r[m] for k)
}

kernel dot(x: f32[M, N], y: f32[M, N]) -> f32[M] {
  p[m, n] = x[m, n] * y[m, n]
  return sum(p[m, n] for n)
}

kernel chain(x: f32[N]) -> f32[N] {
  a[n] = x[n] * x[n] + 0.5
  b[n] = a[n] * a[n] - 0.5
  c[n] = b[n] * b[n] + 0.25
  d[n] = c[n] * c[n] - 0.25
  e[n] = d[n] * d[n] + 0.125
  f[n] = e[n] * e[n] - 0.125
  g[n] = f[n] * f[n] + 0.0625
  h[n] = g[n] * g[n] - 0.0625
  i[n] = h[n] * h[n] + 0.5
  j[n] = i[n] * i[n] - 0.5
  return j[n] * j[n]
}
"""
NAMES = ["bf_sum", "bf_mixed", "bf_chain", "h_chain", "bf_round_trip", "two_outputs", "into_contract",
         "broadcast_twice", "chain", "epilogue_then_sum"]


@pytest.fixture(scope="module")
def module() -> S.Module:
    return arke.loads(SOURCE).semantic


def _nodes(op: S.Op) -> list[S.SExpr]:
    return [n for e in op_exprs(op) for n in walk(e)]


def _all_dims(fn: S.Function) -> list[dict[str, int]]:
    names = [b.dim for b in fn.bindings]
    return [dict.fromkeys(names, n) for n in SIZES] + [{d: SIZES[(k + 2) % 3] for k, d in enumerate(names)}]


@pytest.mark.parametrize("name", NAMES)
def test_fused_kernels_compute_the_same_bits(module: S.Module, name: str) -> None:
    fn = optimise(module, name)
    for k, dims in enumerate(_all_dims(module.get(name))):
        assert_same(module, name, fn, dims, seed=1000 + k)


def test_a_reduction_that_changes_form_agrees_within_the_reassociation_bound(module: S.Module) -> None:
    fn = optimise(module, "dot")
    assert len(fn.ops) == 1  # sum(x * y): the interpreter now runs it as an einsum

    def bound(args: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        terms = (args["x"].double() * args["y"].double()).abs()
        return [2 * gamma(terms.shape[1]) * terms.sum(1) + 1e-30]

    for n in (1, 3, 17, 1000):
        assert_same(module, "dot", fn, {"M": 5, "N": n}, seed=n, reorder_bound=bound)


def test_a_reduction_that_reads_through_a_transposed_view_agrees_within_the_bound(module: S.Module) -> None:
    """``sum(t[n, k] for k)`` read a stored row of t; fused, it reads a column of x, summed in another order."""
    fn = optimise(module, "transposed")

    def bound(args: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        x = args["x"].double().abs()
        return [2 * gamma(x.shape[0]) * x.sum(0)[:, None] + 1e-30]

    for dims in [*_all_dims(module.get("transposed")), {"M": 1000, "N": 7}]:
        assert_same(module, "transposed", fn, dims, seed=7, reorder_bound=bound)


def test_16_bit_producers_keep_their_rounding(module: S.Module) -> None:
    """A bf16/f16 map rounds when it stores; the fold makes that an explicit cast, and it matters."""
    for name, dtype in (("bf_mixed", DType.BF16), ("h_chain", DType.F16)):
        fn = optimise(module, name)
        casts = [n for op in fn.ops for n in _nodes(op) if isinstance(n, S.Cast) and n.dtype == dtype]
        assert casts, f"no {dtype} cast left in @{name}"
        # Without those casts the kernel computes something else: the test above would see it.
        unrounded = replace(fn, ops=tuple(map_op_exprs(op, _drop_casts_to(dtype)) for op in fn.ops))
        verify(S.Module((unrounded,)))
        x = torch.linspace(-2, 2, 3 * 17).reshape(3, 17).to(torch.bfloat16 if dtype == DType.BF16 else torch.float16)
        other = {"y": torch.ones(3, 17)} if name == "bf_mixed" else {"w": torch.ones(17)}
        want = run_function(module.get(name), module, {"x": x, **other})[0]
        assert torch.equal(run_function(fn, S.Module((fn,)), {"x": x, **other})[0], want)
        assert not torch.equal(run_function(unrounded, S.Module((unrounded,)), {"x": x, **other})[0], want)


def _drop_casts_to(dtype: DType):
    def drop(e: S.SExpr) -> S.SExpr:
        if isinstance(e, S.Cast) and e.dtype == dtype and e.x.dtype == dtype:
            return e.x
        return e
    return drop


def test_an_exact_16_bit_value_is_not_cast_again(module: S.Module) -> None:
    (op,) = optimise(module, "bf_round_trip").ops
    casts = [n for n in _nodes(op) if isinstance(n, S.Cast) and n.dtype == DType.BF16]
    assert len(casts) == 1  # bf16(a): only the user's cast, no second rounding


def test_what_is_not_folded(module: S.Module) -> None:
    two = optimise(module, "two_outputs")
    assert len(two.ops) == 2  # a is a result: stored, and b reads it
    contract = optimise(module, "into_contract")
    assert [type(op) for op in contract.ops] == [S.MapOp, S.ContractOp]
    scaled, mm = contract.ops
    assert isinstance(scaled, S.MapOp) and isinstance(mm, S.ContractOp) and mm.lhs.src == scaled.result
    # h reads a contract's result: it is the contract's epilogue, kept for the codegen.
    ops = optimise(module, "epilogue_then_sum").ops
    assert [type(op) for op in ops] == [S.ContractOp, S.MapOp, S.ReduceOp] and ops[1].name == "h"
    # r[m] is read by the output map and by sum(x[m, k] * r[m] for k), which the lowering
    # makes a contract (with a rank-1 operand): a contract operand stays a load, so r stays.
    ops = optimise(module, "broadcast_twice").ops
    assert [type(op) for op in ops] == [S.MapOp, S.ContractOp, S.MapOp] and ops[0].name == "r"


def test_cheap_producers_fold_into_every_reader(module: S.Module) -> None:
    fn = optimise(module, "transposed")  # t is a permuted load: cheap, read by two ops three times
    assert all(n.src == "x" for op in fn.ops for n in _nodes(op) if isinstance(n, S.Load) and n.src != "0")
    assert len(fn.ops) == 2
    assert is_cheap(S.Cast(S.Load("x", (S.Idx("m"), S.Const(0, DType.I64)), DType.F32), DType.BF16))
    assert not is_cheap(S.Load("x", (S.Load("ids", (S.Idx("t"),), DType.I64),), DType.F32))  # a gather


def test_bodies_stay_bounded(module: S.Module) -> None:
    fn = optimise(module, "chain")
    assert 1 < len(fn.ops) < 11  # some folds done, the doubling ones refused
    assert all(len(list(_nodes(op))) <= MAX_BODY_NODES for op in fn.ops)


TEXT = """arke.semantic 1

kernel @k(%x: f32[N], %a: i32[N]) -> (f32[N], i64[N])
  dims N = %x.0
{
  %0 = map f32 [i < N] { mul(%x[i], f32(i : i32)) }
  %1 = map f32 [j < N] { add(%0[j], 1.0) }
  %2 = map i64 [i < N] { %a[i] }
  %3 = map i64 [j < N] { mul(%2[sub(dim(N), add(j, 1))], 3) }
  return %1, %3
}
"""


def test_subscripts_and_widening_get_casts() -> None:
    """An i32 index gets an i64 subscript cast to i32; an i32 body stored in i64 is cast when folded."""
    module = read_module(TEXT)
    verify(module)
    fn = fuse_elementwise(module.get("k"))
    verify(S.Module((fn,)))
    first, second = fn.ops
    assert isinstance(first, S.MapOp) and isinstance(second, S.MapOp)
    assert S.Cast(S.Idx("j"), DType.I32) in list(walk(first.body))
    assert any(isinstance(n, S.Cast) and n.dtype == DType.I64 and isinstance(n.x, S.Load) for n in walk(second.body))
    args = {"x": torch.randn(17), "a": torch.randint(-9, 9, (17,), dtype=torch.int32)}
    for b, a in zip(run_function(module.get("k"), module, args), run_function(fn, S.Module((fn,)), args)):
        assert torch.equal(b, a)
