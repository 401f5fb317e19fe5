"""Lengths bounding reductions and block-table extents (spec/language.md §8.11): the checker's
lowering (limits on the reduction, never a contraction, a mean's count), the IR's text and JSON
round trips and the verifier, the formatter, the masked lowering's equivalence, and the
interpreter against independent torch expressions (per-row and scalar lengths of 0, of the
extent, past it and negative; a body whose loads past the length are out of range; paged
attention against a torch loop over gathered blocks)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from paged_support import paged_decode

import arke
from arke.ir import semantic as S
from arke.ir.serialize import from_json, to_json
from arke.ir.text import print_module
from arke.ir.text_read import read_module
from arke.ir.verify import IRVerifyError, verify
from arke.lang.fmt import format_source
from arke.passes.limits import mask_limits
from arke.runtime.interp import run_function

SOURCE = """
kernel stats(x: f32[M, N], n: i64[M], k: i32) -> (s: f32[M], avg: f32[M], hi: f32[M], at: i64[M], dot: f32[M]) {
  s[m] = sum(x[m, j] for j < n[m])
  avg[m] = mean(x[m, j] for j < n[m])
  hi[m] = max(x[m, j] for j < k)
  at[m] = argmax(x[m, j] for j < n[m] + 1)
  dot[m] = sum(x[m, j] * x[m, j] for j < k)
}
kernel table(x: f32[M, N], idx: i64[M, N], n: i64[M]) -> f32[M] {
  return sum(x[m, idx[m, j]] for j < n[m])
}
kernel grid(x: f32[M, N], a: i64, b: i64) -> f32 {
  return sum(x[i, j] for i < a, j < b)
}
kernel blocks(t: i32[B, MB], v: f32[NB, P]) -> f32[B] {
  return sum(v[t[b, j / P], j % P] for j)
}
""" + paged_decode("paged")


@pytest.fixture(scope="module")
def module() -> arke.Module:
    return arke.loads(SOURCE, "<lengths>")


def ops(module: arke.Module, kernel: str) -> tuple[S.Op, ...]:
    return module.semantic.get(module.kernel_map[kernel]).ops


# ---------------------------------------------------------------- checker and IR


def test_lengths_lower_to_limits_and_never_to_a_contraction(module: arke.Module) -> None:
    found = ops(module, "stats")
    assert not any(isinstance(op, S.ContractOp) for op in found)  # x * x under a length is a reduce
    bounded = [op for op in found if isinstance(op, S.ReduceOp) and op.limits]
    assert len(bounded) == 5
    assert all(op.limits[0][0] == "j" and op.limits[0][1].dtype is S.DType.I64 for op in bounded)
    grid = [op for op in ops(module, "grid") if isinstance(op, S.ReduceOp)]
    assert [name for name, _ in grid[0].limits] == ["i", "j"]


def test_block_table_subscripts_give_the_extent(module: arke.Module) -> None:
    (op,) = [op for op in ops(module, "blocks") if isinstance(op, S.ReduceOp)]
    assert str(op.reduce_axes[0].extent) == "MB*P"


def test_text_and_json_round_trip_and_verify(module: arke.Module) -> None:
    text = print_module(module.semantic)
    assert "limits {j = %n[m]}" in text
    again = read_module(text)
    assert again == module.semantic and print_module(again) == text
    assert from_json(to_json(module.semantic)) == module.semantic
    verify(module.semantic)


def test_verifier_rejects_bad_limits(module: arke.Module) -> None:
    fn = module.semantic.get(module.kernel_map["stats"])
    k = next(i for i, op in enumerate(fn.ops) if isinstance(op, S.ReduceOp) and op.limits)
    op = fn.ops[k]
    assert isinstance(op, S.ReduceOp)
    for limits in ((("m", op.limits[0][1]),), (("j", S.Const(1.5, S.DType.F32)),), (("j", S.Idx("j")),)):
        bad = replace(fn, ops=(*fn.ops[:k], replace(op, limits=limits), *fn.ops[k + 1:]))
        with pytest.raises(IRVerifyError):
            verify(S.Module((bad,)))


def test_formatter_keeps_lengths() -> None:
    text = "kernel f(x: f32[M, N], n: i64[M]) -> f32[M] {\n  return sum(x[m, j] for j < n[m] + 1)\n}\n"
    assert format_source(text) == text


def test_an_index_listed_twice_with_lengths(tmp_path: Path) -> None:
    src = "kernel f(x: f32[M, N], n: i64[M]) -> f32[M] {\n  y[m] = sum(x[m, j] for j < n[m], j < 2)\n  return y\n}\n"
    path = tmp_path / "twice.ak"
    path.write_text(src, encoding="utf-8")
    assert {d.code for d in arke.check(path)} == {"AK2101"}  # an index listed twice, even with two lengths


# ---------------------------------------------------------------- interpreter against torch


def _clamped(n: int, extent: int) -> int:
    return min(max(n, 0), extent)


@pytest.mark.parametrize(("m", "n"), [(3, 4097), (3, 17), (1, 1)])
def test_interpreter_against_torch(module: arke.Module, m: int, n: int) -> None:
    g = torch.Generator().manual_seed(m * 10007 + n)
    x = torch.randn(m, n, generator=g)
    lens = torch.tensor([0, n, n + 9][:m] if m > 1 else [n])
    if m == 3 and n == 17:
        lens[2] = -4
    for k in (0, 1, n, n + 3):
        s, avg, hi, at, dot = module.kernels["stats"](x, lens, k=k)
        for r in range(m):
            L, K = _clamped(int(lens[r]), n), _clamped(k, n)
            row = x[r, :L].double()
            assert math.isclose(float(s[r]), float(row.sum()), rel_tol=1e-5, abs_tol=1e-4)
            assert (math.isnan(float(avg[r])) if L == 0 else
                    math.isclose(float(avg[r]), float(row.mean()), rel_tol=1e-5, abs_tol=1e-5))
            assert float(hi[r]) == (float(x[r, :K].max()) if K else -math.inf)
            A = _clamped(int(lens[r]) + 1, n)
            assert int(at[r]) == (int(torch.argmax(x[r, :A])) if A else 0)
            assert math.isclose(float(dot[r]), float((x[r, :K].double() ** 2).sum()), rel_tol=1e-5, abs_tol=1e-4)


def test_loads_past_the_length_are_not_made(module: arke.Module) -> None:
    x = torch.randn(3, 6)
    idx = torch.full((3, 6), 10**9, dtype=torch.int64)  # garbage everywhere past each length
    idx[1, :2] = torch.tensor([5, 0])
    idx[2, :6] = torch.tensor([1, 1, 2, 3, 5, 4])
    n = torch.tensor([0, 2, 6])
    got = module.kernels["table"](x, idx, n)
    want = torch.stack([torch.tensor(0.0), x[1, 5] + x[1, 0], x[2, idx[2]].sum()])
    assert torch.allclose(got, want, atol=1e-6)
    with pytest.raises(arke.GuardError, match="outside"):
        module.kernels["table"](x, idx, torch.tensor([0, 3, 6]))  # a garbage entry inside the length


def test_several_lengths(module: arke.Module) -> None:
    x = torch.randn(5, 7)
    for a, b in ((0, 7), (3, 4), (9, 9), (-1, 2)):
        got = float(module.kernels["grid"](x, a=a, b=b))
        assert math.isclose(got, float(x[: _clamped(a, 5), : _clamped(b, 7)].sum()), rel_tol=1e-5, abs_tol=1e-5)


def _torch_paged(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, blk: torch.Tensor,
                 lens: torch.Tensor) -> torch.Tensor:
    P, G, E = kc.shape[2], kc.shape[1], kc.shape[3]
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        j = torch.arange(int(lens[b]))
        k, v = kc[blk[b, j // P].long(), :, j % P], vc[blk[b, j // P].long(), :, j % P]  # [L, G, E]
        for h in range(q.shape[1]):
            g = h // (q.shape[1] // G)
            out[b, h] = torch.softmax(k[:, g] @ q[b, h] / math.sqrt(E), 0) @ v[:, g]
    return out


def test_paged_attention_against_torch(module: arke.Module) -> None:
    g = torch.Generator().manual_seed(7)
    B, H, G, E, P, MB = 3, 4, 2, 8, 4, 6
    blk = torch.randperm(B * MB, generator=g).to(torch.int32).view(B, MB)
    q, kc, vc = torch.randn(B, H, E, generator=g), torch.randn(B * MB, G, P, E), torch.randn(B * MB, G, P, E)
    lens = torch.tensor([1, MB * P, 13])
    got = module.kernels["paged"](q, kc, vc, blk, lens)
    assert torch.allclose(got, _torch_paged(q, kc, vc, blk, lens), atol=1e-5)
    empty = module.kernels["paged"](q, kc, vc, blk, torch.tensor([0, 5, 99]))
    assert torch.isnan(empty[0]).all() and not torch.isnan(empty[1:]).any()  # 0 / 0, as the masked form


def test_masked_lowering_means_the_same(module: arke.Module) -> None:
    fn = module.semantic.get(module.kernel_map["stats"])
    lowered = mask_limits(fn)
    assert not any(isinstance(op, S.ReduceOp) and op.limits for op in lowered.ops)
    x = torch.randn(3, 9)
    for lens in ([1, 9, 20], [3, -2, 5]):
        args = {"x": x, "n": torch.tensor(lens), "k": torch.tensor(4, dtype=torch.int32)}
        a = run_function(fn, S.Module((fn,)), args)
        b = run_function(lowered, S.Module((lowered,)), args)
        for u, v in zip(a, b, strict=True):
            assert torch.equal(u.nan_to_num(7.0), v.nan_to_num(7.0))
