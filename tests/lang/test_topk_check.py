"""The checker on top-k selections (spec §8.3): what they lower to (one reduce op whose last axis is
the rank, positions i64, values the body's dtype, a K <= N guard once), and every malformed form
with its code and span: the rank index missing, unbound or used by the value, options, the
reduced index already bound or listed twice, K > N between literals, an intermediate whose rank
has no extent."""

from __future__ import annotations

import pytest

import arke
from arke.ir import semantic as S
from arke.lang.diagnostics import Diagnostic


def errors(source: str) -> list[Diagnostic]:
    return [d for d in arke.check(source) if d.severity.name == "ERROR"]


def covered(source: str, d: Diagnostic) -> str:
    return source[d.span.start:d.span.end]


def test_lowers_to_one_reduce_op_with_the_rank_last() -> None:
    src = """kernel f(x: f16[M, N], s: i64[K]) -> (v: f16[K, M], i: i64[M, K]) {
  v[j, m] = topk(x[m, n] * 2.0 for n, j)
  i[m, j] = argbottomk(x[m, n] for n, j)
}"""
    fn = arke.loads(src).semantic.functions[0]
    picks = [op for op in fn.ops if isinstance(op, S.ReduceOp)]
    assert [(op.kind, op.dtype, [a.name for a in op.axes]) for op in picks] == [
        ("topk", S.DType.F16, ["m", "j"]), ("argbottomk", S.DType.I64, ["m", "j"])]
    assert [g.text for g in fn.guards] == ["K <= N (`topk` keeps K values from rows of N)"]


def test_no_guard_when_the_where_clause_or_literals_prove_it() -> None:
    src = "kernel f(x: f32[M, 8]) -> v: f32[M, 8] { v[m, j] = topk(x[m, n] for n, j) }"
    assert arke.loads(src).semantic.functions[0].guards == ()
    src = "kernel f(x: f32[M, N], s: i64[K]) -> v: f32[M, K] where K <= N { v[m, j] = topk(x[m, n] for n, j) }"
    assert len(arke.loads(src).semantic.functions[0].guards) == 1  # the where clause's own


BAD = [
    ("v[m, j] = topk(x[m, n] for n)", "AK2112", "topk"),
    ("v[m, j] = topk(x[m, n] for n, j, k)", "AK2112", "topk"),
    ("v[m, j] = topk(x[m, n] for n, q)", "AK2112", "q"),
    ("v[m, j] = topk(x[m, n] + f32(j) for n, j)", "AK2112", "j"),
    ("v[m, j] = topk(x[m, n] for n, j, largest = false)", "AK2112", "largest"),
    ("v[m, j] = topk(x[m, j] for j, j)", "AK2101", "j"),
    ("v[m, j] = topk(x[m, m] for m, j)", "AK2102", "m"),
]


@pytest.mark.parametrize(("body", "code", "at"), BAD)
def test_malformed_selections(body: str, code: str, at: str) -> None:
    src = f"kernel f(x: f32[M, N]) -> v: f32[M, 4] {{\n  {body}\n}}"
    [d] = errors(src)
    assert (d.code, covered(src, d)) == (code, at), str(d)
    if at == "largest":
        assert "bottomk" in (d.hint or "")


def test_literal_k_above_literal_n() -> None:
    src = "kernel f(x: f32[M, 3]) -> v: f32[M, 4] {\n  v[m, j] = argtopk(x[m, n] for n, j)\n}"
    [d] = errors(src)
    assert d.code == "AK3023" and covered(src, d) == "argtopk" and "4 values from rows of 3" in d.message


def test_an_intermediate_rank_needs_an_extent() -> None:
    src = "kernel f(x: f32[M, N]) -> f32[M] {\n  t[m, j] = topk(x[m, n] for n, j)\n  return t[m, 0]\n}"
    assert [d.code for d in errors(src)] == ["AK2105"]
