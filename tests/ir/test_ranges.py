"""Subscripts proved in range (:mod:`arke.ir.ranges`): bounds by interval arithmetic over indices, constants
and dims, `where` equalities taken as facts; anything unbounded or possibly outside keeps its check. The
LLVM target then emits no check for a proved subscript, a call whose only checks were proved cannot fail,
and the compiled kernels still give the interpreter's answer when the workers' ranges split rows."""

from __future__ import annotations

import numpy as np
import pytest
import sympy
from codegen_support import assert_conforms, build, seeded, text_module

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.ranges import facts, in_range
from arke.runtime.outputs import can_fail

H, E, C, N = (sympy.Symbol(s) for s in "HECN")
I64 = DType.I64


def idx(name: str) -> ir.Idx:
    return ir.Idx(name)


def add(a: ir.SExpr, b: ir.SExpr) -> ir.Binary:
    return ir.Binary("add", a, b, I64)


def mul(a: ir.SExpr, b: ir.SExpr) -> ir.Binary:
    return ir.Binary("mul", a, b, I64)


def sub(a: ir.SExpr, b: ir.SExpr) -> ir.Binary:
    return ir.Binary("sub", a, b, I64)


EXTENTS = {"h": H, "e": E}
SPLIT_K = add(mul(add(ir.DimRef(H), idx("h")), ir.DimRef(E)), idx("e"))  # (H + h) * E + e


@pytest.mark.parametrize(("subscript", "extent", "known", "proved"), [
    (SPLIT_K, C, {C: 3 * H * E}, True),  # GPT-2's k of the fused q/k/v
    (SPLIT_K, C, {}, False),  # without the `where`, C is any dim
    (SPLIT_K, 2 * H * E, {}, True),
    (add(mul(add(ir.DimRef(H), idx("h")), ir.DimRef(E)), add(idx("e"), ir.Const(1, I64))), 2 * H * E, {}, False),
    (sub(idx("e"), ir.Const(1, I64)), E, {}, False),  # -1 at e = 0
    (sub(sub(ir.DimRef(E), ir.Const(1, I64)), idx("e")), E, {}, True),  # E - 1 - e: reversed
    (mul(idx("h"), ir.Const(-1, I64)), H, {}, False),  # a negative factor
    (ir.Binary("div", idx("e"), ir.Const(2, I64), I64), E, {}, False),  # no bound for a division
    (ir.Binary("add", ir.Cast(idx("e"), DType.I32), ir.Const(0, DType.I32), DType.I32), E, {}, False),  # i32 wraps
    (ir.Cast(idx("e"), I64), E, {}, True),
    (ir.Binary("mod", add(idx("e"), ir.DimRef(H)), ir.DimRef(H), I64), H, {}, True),  # a paged slot: j % P
    (ir.Binary("mod", idx("e"), ir.Const(7, I64), I64), 7, {}, True),
    (ir.Binary("mod", idx("e"), ir.Const(7, I64), I64), 6, {}, False),
    (ir.Binary("mod", idx("e"), sub(ir.DimRef(H), ir.Const(5, I64)), I64), H, {}, False),  # H - 5 may be <= 0
    (ir.Binary("mod", idx("e"), ir.Const(-3, I64), I64), 3, {}, False),  # Python's modulo: in (-3, 0]
])
def test_in_range(subscript: ir.SExpr, extent: sympy.Expr, known: dict[sympy.Symbol, sympy.Expr], proved: bool) -> None:
    assert in_range(subscript, extent, EXTENTS, known) is proved


SOURCE = """
kernel split(qkv: f32[N, C], b: f32[H, E]) -> (q: f32[N, H, E], k: f32[N, H, E], v: f32[N, H, E])
  where C == 3 * H * E
{
  q[n, h, e] = qkv[n, h * E + e] + b[h, e]
  k[n, h, e] = qkv[n, (H + h) * E + e] + b[h, e]
  v[n, h, e] = qkv[n, (2 * H + h) * E + e] - b[h, e]
}
kernel shifted(x: f32[N, E]) -> f32[N, E] {
  return x[n, e + 1] if e + 1 < E else 0.0
}
"""


def test_where_equalities_are_facts() -> None:
    fn = text_module(SOURCE).semantic
    split = fn.get(text_module(SOURCE).kernel_map["split"])
    assert {str(k): str(v) for k, v in facts(split).items()} == {"C": "3*E*H"}


def test_proved_subscripts_lose_their_checks_and_cannot_fail() -> None:
    module = text_module(SOURCE)
    split = module.semantic.get(module.kernel_map["split"])
    assert not can_fail(split, module.semantic)
    assert can_fail(module.semantic.get(module.kernel_map["shifted"]), module.semantic)
    source = build(module, "llvm").kernels["split"].variant(-1).artifact.source
    assert "store i1" not in source.replace("store i1 false, ptr %errflag", "")


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("dims", [{"N": 5, "H": 3, "E": 7}, {"N": 1, "H": 1, "E": 1}, {"N": 4, "H": 12, "E": 64}])
def test_split_conforms_whatever_the_workers_ranges(dims: dict[str, int], threads: int) -> None:
    """The workers' flat ranges start and end inside rows (runs of the last axis): every element once."""
    module = text_module(SOURCE)
    rng = seeded("split", dims)
    n, h, e = dims["N"], dims["H"], dims["E"]
    qkv = rng.standard_normal((n, 3 * h * e)).astype(np.float32)
    b = rng.standard_normal((h, e)).astype(np.float32)
    got = build(module, "llvm").kernels["split"](qkv, b, threads=threads)
    assert_conforms(got, module.kernels["split"], qkv, b, what=f"split {dims} on {threads} threads")
