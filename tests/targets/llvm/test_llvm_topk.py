"""The llvm target's native top-k (arke/targets/llvm/topk.py: one pass per row, a sorted buffer of K,
a vector threshold test) against the interpreter, bit for bit: random rows, many ties, all-equal rows,
NaNs, ±0, ±inf (a row of -inf), ascending rows (every element a winner), ragged N (3, 17, 4097), K in
{1, 2, 5, 50, 64}, values and positions together and each alone, bf16 input, a selection along a
tensor's only axis, 1 and 2 threads bit-identical; and which selections take the native form (the
others are lowered to rounds or ranks, as on every other target)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from argreduce_support import values
from codegen_support import assert_matches, build, same_bits, seeded, text_module

import arke
from arke.plan.families import TOPK
from arke.targets import base as targets

KS = (1, 2, 5, 50, 64)

SOURCE = "\n".join(
    [f"""
kernel top{k}(x: f32[M, N]) -> (v: f32[M, {k}], i: i64[M, {k}]) {{
  v[m, j] = topk(x[m, n] for n, j)
  i[m, j] = argtopk(x[m, n] for n, j)
}}
""" for k in KS]
    + [f"""
kernel bot{k}(x: f32[M, N]) -> (i: i64[M, {k}], v: f32[M, {k}]) {{
  i[m, j] = argbottomk(x[m, n] for n, j)
  v[m, j] = bottomk(x[m, n] for n, j)
}}
""" for k in (2, 50)]
    + ["""
kernel argtop50(x: f32[M, N]) -> i: i64[M, 50] {
  i[m, j] = argtopk(x[m, n] for n, j)
}

kernel bottom5(x: f32[M, N]) -> v: f32[M, 5] {
  v[m, j] = bottomk(x[m, n] for n, j)
}

kernel top5_bf16(x: bf16[M, N]) -> (v: bf16[M, 5], i: i64[M, 5]) {
  v[m, j] = topk(x[m, n] for n, j)
  i[m, j] = argtopk(x[m, n] for n, j)
}

kernel bot50_bf16(x: bf16[B, H, N]) -> (v: bf16[B, H, 50], i: i64[B, H, 50]) {
  v[b, h, j] = bottomk(x[b, h, n] for n, j)
  i[b, h, j] = argbottomk(x[b, h, n] for n, j)
}

kernel vec5(x: f32[N]) -> (v: f32[5], i: i64[5]) {
  v[j] = topk(x[n] for n, j)
  i[j] = argtopk(x[n] for n, j)
}

kernel squared(x: f32[M, N]) -> i: i64[M, 5] {
  i[m, j] = argtopk(x[m, n] * x[m, n] for n, j)
}

kernel top65(x: f32[M, N]) -> i: i64[M, 65] {
  i[m, j] = argtopk(x[m, n] for n, j)
}
"""])

KINDS = ("random", "ties", "equal", "nan", "inf", "zeros", "ascending")


def _rows(kind: str, dtype: str, shape: tuple[int, int], rng: np.random.Generator) -> Any:
    if kind != "ascending":
        return values(kind, dtype, shape, rng)
    x = torch.arange(shape[0] * shape[1], dtype=torch.float32).reshape(shape) / 7.0  # each one beats all before it
    return x.to(torch.bfloat16) if dtype == "bf16" else x.numpy()


def _check(lib: Any, module: arke.Module, name: str, x: Any, what: str) -> None:
    one = lib.kernels[name](x, threads=1)
    two = lib.kernels[name](x, threads=2)
    assert same_bits(one, two), f"{what}: 1 and 2 threads differ"
    want = module.kernels[name](x)
    assert_matches(one, want, rtol=0, atol=0, what=what)
    assert same_bits(one, want), f"{what}: not the interpreter's bits"


@pytest.fixture(scope="module")
def topk_lib() -> tuple[arke.Module, Any]:
    module = text_module(SOURCE)
    return module, build(module, "llvm")


@pytest.mark.parametrize("n", [3, 17, 4097])
def test_native_selections_equal_the_interpreter(topk_lib: tuple[arke.Module, Any], n: int) -> None:
    module, lib = topk_lib
    names = [f"top{k}" for k in KS] + ["bot2", "bot50", "argtop50", "bottom5"]
    for kind in KINDS:
        x = _rows(kind, "f32", (5, n), seeded("llvm-topk", kind, n))
        for name in names:
            k = int(name.lstrip("abcdefghijklmnopqrstuvwxyz_") or 0)
            if k <= n:
                _check(lib, module, name, x, f"{name} {kind} N={n}")


@pytest.mark.parametrize("kind", ["random", "ties", "nan", "zeros", "ascending"])
def test_bf16_rows_and_batches(topk_lib: tuple[arke.Module, Any], kind: str) -> None:
    module, lib = topk_lib
    rng = seeded("llvm-topk-bf16", kind)
    _check(lib, module, "top5_bf16", _rows(kind, "bf16", (4, 300), rng), f"top5_bf16 {kind}")
    x = _rows(kind, "bf16", (6, 1000), rng).reshape(2, 3, 1000)
    _check(lib, module, "bot50_bf16", x, f"bot50_bf16 {kind}")


def test_one_row_of_a_vector(topk_lib: tuple[arke.Module, Any]) -> None:
    module, lib = topk_lib
    for kind in ("random", "nan", "zeros"):
        x = values(kind, "f32", (1, 4097), seeded("llvm-topk-vec", kind))[0]
        _check(lib, module, "vec5", np.ascontiguousarray(x), f"vec5 {kind}")


def test_other_forms_are_lowered_and_still_agree(topk_lib: tuple[arke.Module, Any]) -> None:
    module, lib = topk_lib
    x = values("ties", "f32", (3, 100), seeded("llvm-topk-lowered"))
    for name in ("squared", "top65"):
        _check(lib, module, name, x, name)


def test_which_selections_are_native(topk_lib: tuple[arke.Module, Any]) -> None:
    module, _ = topk_lib
    target = targets.get("llvm")

    def families(name: str) -> list[str]:
        plan = target.plan(module.semantic, module.kernel_map[name], None)
        return [d.family for d in plan.dispatches]

    assert families("top50") == [TOPK]  # values and positions: one dispatch, one pass per row
    assert families("argtop50") == [TOPK] and families("vec5") == [TOPK]
    assert TOPK not in families("squared") and TOPK not in families("top65")  # a computed body; K > 64
    for other in ("triton", "cuda", "mlir"):  # the other targets lower every selection
        assert TOPK not in targets.get(other).fused_families()


def test_k_above_the_row_is_still_a_guard_error(topk_lib: tuple[arke.Module, Any]) -> None:
    _, lib = topk_lib
    with pytest.raises(arke.GuardError):
        lib.kernels["top5"](np.zeros((2, 4), dtype=np.float32))
