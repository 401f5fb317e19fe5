"""Reductions bounded by lengths and paged attention (spec/language.md §8.11) on every runnable
target against the interpreter, by the one tolerance rule: scalar and per-row lengths of 0, of
the extent, past it and negative, ragged shapes (N = 4097, M = 3), every reduction kind, a gather
whose table holds garbage past each row's length, and paged decode attention through a block
table (llvm runs it as the attention family; the other targets as masked generic reductions).
The CUDA C also runs on the host and compiles for sm_80 and sm_90 without spills."""

from __future__ import annotations

from typing import Any

import cuda_host
import numpy as np
import pytest
from codegen_support import RUNNABLE, assert_conforms, build, seeded, text_module
from gpu_support import ARCHS, assert_assembles_without_spills
from paged_support import paged_decode

from arke.targets.cuda import nvrtc
from arke.targets.cuda.render import RENDERER

SOURCE = """
kernel stats(x: f32[M, N], n: i64[M], k: i64) -> (s: f32[M], avg: f32[M], hi: f32[M], lo: f32[M], pr: f32[M],
                                                  at: i64[M], cnt: i64[M]) {
  s[m] = sum(x[m, j] for j < n[m])
  avg[m] = mean(x[m, j] for j < n[m])
  hi[m] = max(x[m, j] for j < n[m])
  lo[m] = min(x[m, j] for j < k)
  pr[m] = prod(1.0 + 0.001 * x[m, j] for j < n[m])
  at[m] = argmax(x[m, j] for j < n[m])
  cnt[m] = sum(i64(x[m, j] > 0.0) for j < n[m] - 1)
}
kernel gathered(x: f32[M, N], idx: i32[M, N], n: i32[M]) -> y: f32[M] {
  y[m] = sum(x[m, idx[m, j]] * 2.0 for j < n[m])
}
""" + paged_decode()

ROWS = [(3, 4097), (3, 17), (1, 1)]
# (B, H, G, E, P, MB, lengths): empty, the whole extent, past it, ragged; 4097 keys in the last
PAGED = [(3, 4, 2, 8, 4, 5, (0, 20, 7)), (2, 8, 2, 20, 16, 3, (48, 33)), (2, 2, 1, 8, 16, 257, (4097, 4112))]


def row_inputs(m: int, n: int) -> dict[str, tuple[Any, ...]]:
    rng = seeded("lengths", m, n)
    x = rng.standard_normal((m, n)).astype(np.float32)
    lens = np.array([0, n, n + 7][:m] if m > 1 else [n], dtype=np.int64)
    lens[-1] = -3 if m == 3 and n == 17 else lens[-1]  # a negative length is an empty range
    idx = rng.integers(0, n, (m, n)).astype(np.int32)
    short = np.array([min(n, 5), n // 2, 1][:m], dtype=np.int32)
    for r in range(m):
        idx[r, max(int(short[r]), 1):] = 10**6  # garbage past the length: never read
    return {"stats": (x, lens), "gathered": (x, idx, short)}


def paged_inputs(case: tuple[Any, ...]) -> tuple[Any, ...]:
    b, h, g, e, p, mb, lengths = case
    rng = seeded("paged", case)
    nb = b * mb + 1
    blk = rng.permutation(nb)[: b * mb].reshape(b, mb).astype(np.int32)
    q = rng.standard_normal((b, h, e)).astype(np.float32)
    kc = rng.standard_normal((nb, g, p, e)).astype(np.float32)
    vc = rng.standard_normal((nb, g, p, e)).astype(np.float32)
    return q, kc, vc, blk, np.array(lengths, dtype=np.int64)


@pytest.mark.parametrize("target", RUNNABLE)
def test_bounded_reductions_equal_the_interpreter(target: str) -> None:
    module = text_module(SOURCE)
    lib = build(module, target)
    for m, n in ROWS:
        inputs = row_inputs(m, n)
        for k in (0, n // 3, n, n + 1):
            args = inputs["stats"]
            assert_conforms(lib.stats(*args, k=k), module.kernels["stats"], *args, k=k,
                            what=f"{target} stats {m}x{n} k={k}")
        args = inputs["gathered"]
        assert_conforms(lib.gathered(*args), module.kernels["gathered"], *args, what=f"{target} gathered {m}x{n}")


# mlir runs the same kernel as spec/language.md §8.11's example (tests/targets/test_spec_examples.py):
# IREE spends ~80 s compiling its gathers, once is enough for the suite's budget
@pytest.mark.parametrize("target", [t for t in RUNNABLE if t != "mlir"])
@pytest.mark.parametrize("case", PAGED, ids=lambda c: f"B{c[0]}H{c[1]}G{c[2]}E{c[3]}P{c[4]}MB{c[5]}")
def test_paged_decode_equals_the_interpreter(target: str, case: tuple[Any, ...]) -> None:
    module = text_module(SOURCE)
    if target in ("triton", "mlir") and case != PAGED[0]:
        pytest.skip("Triton's CPU interpreter and IREE's compile are slow: the first case covers them")
    args = paged_inputs(case)
    for threads in (1, 2):
        got = build(module, target).kernels["paged_decode"](*args, threads=threads)
        assert_conforms(got, module.kernels["paged_decode"], *args, what=f"{target} paged {case} threads={threads}")


# ---------------------------------------------------------------- CUDA C without a GPU

@pytest.mark.skipif(not cuda_host.available(), reason="no g++")
def test_cuda_c_on_the_host_equals_the_interpreter() -> None:
    module = text_module(SOURCE)
    inputs = row_inputs(3, 17)
    for name, args, scalars in (("stats", inputs["stats"], {"k": 5}), ("gathered", inputs["gathered"], {}),
                                ("paged_decode", paged_inputs(PAGED[0]), {})):
        got, err = cuda_host.run(module, name, *args, **scalars)
        assert err == 0
        assert_conforms(got, module.kernels[name], *args, what=f"cuda (host) {name}", **scalars)


@pytest.mark.skipif(not nvrtc.available() or nvrtc.ptxas_path() is None, reason="no NVRTC or ptxas")
@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_c_compiles_without_spills(arch: str) -> None:
    from arke.plan.dispatch import make_plan

    module = text_module(SOURCE)
    for kernel, ir_name in module.kernel_map.items():
        plan = make_plan(module.semantic, ir_name, None, families=RENDERER.families)
        ptx = nvrtc.compile_ptx(str(RENDERER.render(plan).source), arch, kernel=kernel)
        assert_assembles_without_spills(ptx, arch)
