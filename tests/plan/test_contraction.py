"""The contraction family: which ops are recognised (with which epilogue), and that the packed
micro-kernel and dot-product forms give the interpreter's answer for every layout, dtype,
blocking and thread count.

Small tiles (``tile m = 3, n = 64, k = 40``) make modest shapes cross every block boundary:
several k blocks, several column slabs (tasks), a ragged last panel, row blocks past M.
"""

from __future__ import annotations

from typing import Any

import pytest
from codegen_support import (
    RUNNABLE,
    assert_conforms,
    build,
    random_inputs,
    same_bits,
    seeded,
    std_module,
    text_module,
)

from arke.plan.contraction import Contraction
from arke.plan.dispatch import make_plan

KERNELS = """
kernel nn(a: f32[M, K], b: f32[K, N]) -> f32[M, N] { return sum(a[m, k] * b[k, n] for k) }
kernel nt(a: f32[M, K], b: f32[N, K]) -> f32[M, N] { return sum(a[m, k] * b[n, k] for k) }
kernel tn(a: f32[K, M], b: f32[K, N]) -> f32[M, N] { return sum(a[k, m] * b[k, n] for k) }
kernel tt(a: f32[K, M], b: f32[N, K]) -> f32[M, N] { return sum(b[n, k] * a[k, m] for k) }

# y = W x: no row axis (a matrix-vector product), and B = w's rows along k
kernel matvec(w: f32[N, K], x: f32[K]) -> f32[N] { return sum(w[n, k] * x[k] for k) }

# a batch axis that only one operand has, one read through an index expression (GQA's h / R)
kernel shared(a: f32[B, M, K], b: f32[K, N]) -> f32[B, M, N] { return sum(a[i, m, k] * b[k, n] for k) }
kernel grouped(q: f32[H, M, K], kv: f32[G, N, K]) -> f32[H, M, N] where H % G == 0 {
  let R = H / G
  return sum(q[h, m, k] * kv[h / R, n, k] for k)
}

# epilogues: bias + activation + residual, a product of two contractions
kernel mlp(x: f32[M, K], w: f32[N, K], b: f32[N], r: f32[M, N]) -> f32[M, N] {
  return gelu(sum(x[m, k] * w[n, k] for k) + b[n]) + r[m, n]
}

# 16-bit operands, an f16 result, int8 weights stored [K, N]
kernel half(a: f16[M, K], b: f16[K, N]) -> f16[M, N] { return f16(sum(f32(a[m, k]) * f32(b[k, n]) for k)) }
kernel bfloat(a: bf16[M, K], b: bf16[N, K]) -> f32[M, N] { return sum(f32(a[m, k]) * f32(b[n, k]) for k) }
kernel int8_kn(a: f32[M, K], b: i8[K, N], s: f32[N]) -> f32[M, N] { return sum(a[m, k] * f32(b[k, n]) for k) * s[n] }

# prologues: a fused producer on either side (a norm before a linear layer, dequantised weights)
kernel normed(x: f32[M, K], g: f32[K], w: f32[N, K]) -> f32[M, N] {
  inv[m] = rsqrt(mean(x[m, k] * x[m, k] for k) + 1e-6)
  return sum(x[m, k] * inv[m] * g[k] * w[n, k] for k)
}
kernel dequant(x: f32[M, K], w: i8[K, N], s: f32[N]) -> f32[M, N] {
  wd[k, n] = f32(w[k, n]) * s[n]
  return sum(silu(x[m, k]) * wd[k, n] for k)
}

# not contractions for the micro-kernels: n in both operands; an integer sum
kernel gram(x: f32[M, K]) -> f32[M] { return sum(x[m, k] * x[m, k] for k) }
kernel ints(a: i32[M, K], b: i32[K, N]) -> i32[M, N] { return sum(a[m, k] * b[k, n] for k) }

# the raw sum is a result too: no epilogue folding, both stored
kernel both(a: f32[M, K], b: f32[K, N]) -> (c: f32[M, N], d: f32[M, N]) {
  c[m, n] = sum(a[m, k] * b[k, n] for k)
  d[m, n] = c[m, n] * 2.0
}
"""

SMALL_TILES = "\n".join(f"@strategy({k}, target = llvm) {{ tile m = 3, n = 64, k = 40 }}"
                        for k in ("nn", "nt", "tn", "tt", "shared", "grouped", "mlp", "half", "bfloat", "int8_kn",
                                  "normed", "dequant"))


def kernels(small: bool) -> Any:
    return text_module(KERNELS + ("\n" + SMALL_TILES if small else ""))


def dispatch_patterns(module: Any, name: str) -> list[Any]:
    plan = make_plan(module.semantic, module.kernel_map.get(name, name))
    return [(d.family, d.pattern) for d in plan.dispatches]


@pytest.mark.parametrize(("module", "name", "rows", "epilogue"), [
    ("std.nn", "matmul", True, False), ("std.nn", "linear", True, False), ("std.nn", "linear_bias", True, True),
    ("std.nn", "bmm", True, False), ("std.nn", "linear_int8", True, True), ("std.nn", "linear_bf16", True, True),
    ("kernels", "tn", True, False), ("kernels", "matvec", False, False), ("kernels", "mlp", True, True),
])
def test_contractions_are_recognised(module: str, name: str, rows: bool, epilogue: bool) -> None:
    mod = kernels(False) if module == "kernels" else std_module(module)
    found = dispatch_patterns(mod, name)
    assert len(found) == 1, found
    family, c = found[0]
    assert family == "contraction" and isinstance(c, Contraction)
    assert (c.m is not None) == rows and (c.epilogue is not None) == epilogue


def test_fused_producers_become_prologues() -> None:
    normed = dispatch_patterns(kernels(False), "normed")[-1][1]
    assert normed.plain_a() is None and normed.plain_b() is not None
    dequant = dispatch_patterns(kernels(False), "dequant")[-1][1]
    assert dequant.plain_a() is None and dequant.plain_b() is None


def test_swiglu_folds_the_gate_into_the_second_contraction() -> None:
    found = dispatch_patterns(std_module("std.nn"), "swiglu")
    assert [f for f, _ in found] == ["contraction", "contraction"]
    assert found[0][1].epilogue is None and found[1][1].epilogue is not None


@pytest.mark.parametrize("name", ["gram", "ints"])
def test_other_sums_stay_generic(name: str) -> None:
    assert all(p is None for _, p in dispatch_patterns(kernels(False), name))


def test_a_sum_that_is_also_a_result_is_stored() -> None:
    found = dispatch_patterns(kernels(False), "both")
    assert found[0][0] == "contraction" and found[0][1].epilogue is None and len(found) == 2


CASES = [
    *[(k, {"M": 7, "K": 97, "N": 150}) for k in ("nn", "nt", "tn", "tt", "mlp", "half", "bfloat", "int8_kn")],
    *[(k, {"M": 2, "K": 97, "N": 150}) for k in ("nn", "nt", "tn", "tt", "mlp", "bfloat")],  # few rows
    *[(k, {"M": 10, "K": 97, "N": 70}) for k in ("normed", "dequant")],
    *[(k, {"M": 1, "K": 45, "N": 33}) for k in ("normed", "dequant")],
    ("nt", {"M": 1, "K": 1, "N": 1}),
    ("matvec", {"N": 67, "K": 45}),
    ("shared", {"B": 3, "M": 5, "K": 41, "N": 70}),
    ("grouped", {"H": 6, "G": 2, "M": 4, "K": 9, "N": 65}),
    ("both", {"M": 5, "K": 9, "N": 33}),
]


@pytest.mark.parametrize("target", RUNNABLE)
@pytest.mark.parametrize("small", [True, False], ids=["small-tiles", "default-tiles"])
@pytest.mark.parametrize(("name", "dims"), CASES, ids=lambda v: v if isinstance(v, str) else
                         ",".join(f"{k}={n}" for k, n in v.items()))
def test_contraction_matches_interpreter(target: str, small: bool, name: str, dims: dict[str, int]) -> None:
    mod = kernels(small)
    args = random_inputs(mod.kernels[name], dims, seeded(name, dims))
    assert_conforms(build(mod, target).kernels[name](*args), mod.kernels[name], *args, what=name)


@pytest.mark.parametrize("target", RUNNABLE)
@pytest.mark.parametrize(("name", "dims"), [("nt", {"M": 9, "K": 130, "N": 700}), ("nt", {"M": 3, "K": 130, "N": 700}),
                                            ("grouped", {"H": 4, "G": 2, "M": 5, "K": 50, "N": 129})])
def test_thread_count_never_changes_a_contraction(target: str, name: str, dims: dict[str, int]) -> None:
    mod = kernels(True)
    args = random_inputs(mod.kernels[name], dims, seeded("threads", name, dims))
    compiled = build(mod, target).kernels[name]
    one = compiled(*args, threads=1)
    for n in (2, 3, 7):
        assert same_bits(compiled(*args, threads=n), one), f"{name}: {n} threads differ from 1"
