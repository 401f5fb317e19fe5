"""The checker on arg-reductions (spec §8.3): `argmax`/`argmin` are reductions that give `i64`
positions, over exactly one index, usable wherever an `i64` element is."""

from __future__ import annotations

import arke
from arke.ir import semantic as S
from arke.lsp.words import reduction_doc


def codes(text: str) -> list[str]:
    return [d.code for d in arke.check(text)]


def test_arg_reductions_give_i64_of_any_body() -> None:
    module = arke.loads("""
kernel f(x: bf16[M, N], k: i8[M, N]) -> (a: i64[M], b: i64[N], c: i64[M], d: f32[M], e: i64) {
  a[m] = argmax(x[m, n] for n)
  b[n] = argmin(k[m, n] for m)
  c[m] = argmax(x[m, n] > 0.0 for n) * 2 + 1
  d[m] = f32(x[m, argmin(x[m, j] for j)])
  e = sum(argmax(k[m, n] for n) for m)
}
""")
    fn = module.semantic.get(module.kernel_map["f"])
    args = [op for op in fn.ops if isinstance(op, S.ReduceOp) and op.kind in S.ARG_KINDS]
    assert [op.kind for op in args] == ["argmax", "argmin", "argmax", "argmin", "argmax"]
    assert all(op.dtype is S.DType.I64 and len(op.reduce_axes) == 1 for op in args)
    assert [op.body.dtype for op in args] == [S.DType.BF16, S.DType.I8, S.DType.BOOL, S.DType.BF16, S.DType.I8]


def test_one_index_only() -> None:
    diags = arke.check("kernel f(x: f32[M, N]) -> i64 {\n  return argmin(x[m, n] for m, n)\n}\n")
    assert [d.code for d in diags] == ["AK3008"]
    assert "one index" in diags[0].message and diags[0].hint
    assert (diags[0].span.line, diags[0].span.col) == (2, 32)  # the second index


def test_arg_reductions_are_reductions_not_unknown_functions() -> None:
    assert codes("kernel f(x: f32[M, N]) -> i64[M] { return argmax(x[m, n] for n) }") == []
    assert codes("kernel f(x: f32[M, N]) -> i64[M] { return argmox(x[m, n] for n) }") == ["AK2002"]
    # the result is an i64: storing it into a narrower integer needs a cast, like any i64
    assert codes("kernel f(x: f32[M, N]) -> i32[M] { return argmax(x[m, n] for n) }") == ["AK3016"]
    assert codes("kernel f(x: f32[M, N]) -> i32[M] { return i32(argmax(x[m, n] for n)) }") == []


def test_hover_says_what_an_arg_reduction_gives() -> None:
    for name in ("argmax", "argmin"):
        doc = reduction_doc(name)
        assert "i64" in doc and "NaN" in doc and "first" in doc
