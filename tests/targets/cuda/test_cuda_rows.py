"""The CUDA-C target's rows family (arke/targets/cuda/rows.py): one block per row, warp-shuffle reductions.

No GPU is needed: the kernels run in the host simulator (``cuda_host``: g++, every thread of a
block a fiber, shuffles and barriers as on the GPU) and are compiled by NVRTC and ptxas.

* every conformance case whose plan (families ``{"rows"}``) has a rows dispatch gives the
  reference interpreter's answer within the rule (``codegen_support.tolerance``);
* norms, softmax and logsumexp in f32, bf16 and f16 (16-bit statistics and inlined 16-bit
  maps rounded as the interpreter rounds them) on ragged rows: 1, 3, 33, 4096 and 4097
  columns; integer and boolean reductions; NaN and all ``-inf`` rows;
* a ``warps`` strategy sets the block (32 to 1024 threads) and still gives the answer; an
  unusable value is refused with the values that work;
* the 16-byte path and the scalar fallback (an unaligned view) give the same bits;
* every stdlib kernel with a rows dispatch compiles for sm_80 and sm_90 with no spills;
* a bad gather subscript inside a member raises the error word and reads nothing outside.
"""

from __future__ import annotations

import dataclasses
import re
from functools import cache
from typing import Any

import cuda_host
import numpy as np
import pytest
import torch
from codegen_support import (
    LAYER_DTYPES,
    STDLIB,
    assert_conforms,
    kernel_names,
    random_inputs,
    same_bits,
    seeded,
    std_module,
    text_module,
)
from gpu_support import ARCHS, assert_assembles_without_spills
from test_conformance import CASES, Case

import arke
from arke.ir.strategy import Decision, Strategy
from arke.plan.dispatch import KernelPlan, make_plan
from arke.targets.artifact import UnsupportedError
from arke.targets.cuda import nvrtc
from arke.targets.cuda.render import PRELUDE, CudaRenderer
from arke.targets.cuda.rows import render_rows

pytestmark = pytest.mark.skipif(not cuda_host.available(), reason="no g++")

ROWS = CudaRenderer(frozenset({"rows"}))

#: Norms and softmax with a 16-bit (or f32) input: statistics of its dtype (``mx``, ``mu``,
#: ``var``: registers rounded to it), a map of it fused into its readers (``e``, rounded there
#: by the casts the fusion adds), sums rounded to it.
FLOATS = """
kernel rmsnorm_{t}(x: {t}[M, N], w: {t}[N], eps: f32 = 1e-6) -> {t}[M, N] {{
  inv[m] = rsqrt(mean(f32(x[m, n]) * f32(x[m, n]) for n) + eps)
  return f32(x[m, n]) * inv[m] * f32(w[n])
}}

kernel softmax_{t}(x: {t}[M, N]) -> {t}[M, N] {{
  mx[m] = max(x[m, n] for n)
  e[m, n] = exp(x[m, n] - mx[m])
  return e[m, n] / sum(e[m, k] for k)
}}

kernel layernorm_{t}(x: {t}[M, N], w: {t}[N], b: {t}[N], eps: f32 = 1e-5) -> {t}[M, N] {{
  mu[m] = mean(x[m, n] for n)
  var[m] = mean((x[m, n] - mu[m]) ** 2 for n)
  return (x[m, n] - mu[m]) * rsqrt(var[m] + eps) * w[n] + b[n]
}}

kernel logsumexp_{t}(x: {t}[M, N]) -> f32[M] {{
  mx[m] = max(x[m, n] for n)
  return f32(mx[m]) + log(sum(exp(f32(x[m, n]) - f32(mx[m])) for n))
}}
"""
#: Differences that are the rounding of a 16-bit statistic (``s``, a register) and of an inlined
#: 16-bit map (``h``: two readers, one at another column, so not fused), scaled up: computed in
#: f32 instead, they would be 0 (sums of 17 16-bit values, or of their roundings, are exact in
#: f32 whatever the order of the additions).
ROUNDING = """
kernel rounding_{t}(x: {t}[M, N]) -> y: f32[M, N] {{
  s[m] = sum(x[m, n] for n)
  w[m] = sum(f32(x[m, n]) for n)
  h[m, n] = x[m, n] * 3
  z[m] = sum(f32(h[m, n]) - f32(x[m, n]) * 3.0 for n)
  y[m, n] = (f32(h[m, (n + 1) % N]) - f32(x[m, (n + 1) % N]) * 3.0 + f32(s[m]) - w[m] + z[m]) * 1024.0
}}
"""
#: (M, N): one element, ragged rows, a 16-byte multiple (the vector path) and one past it
SHAPES = [(1, 1), (5, 3), (2, 33), (3, 4096), (2, 4097)]

#: Reductions with free axes (``tanh`` and ``abs`` keep them from the contraction family): each
#: score reduced by a warp (``k[j, d]``: lanes along ``d``) and kept in scratch, each ``u[i, d]``
#: by a thread (``v[j, d]``: threads along ``d``); one kernel per block size.
WARPS = """
kernel softmax_w{w}(x: f32[M, N]) -> f32[M, N] {{
  mx[m] = max(x[m, n] for n)
  e[m, n] = exp(x[m, n] - mx[m])
  return e[m, n] / sum(e[m, k] for k)
}}

kernel attn_w{w}(q: f32[S, D], k: f32[T, D], v: f32[T, D]) -> (p: f32[S, T], o: f32[S, D]) {{
  s[i, j] = sum(tanh(q[i, d] * k[j, d]) for d)
  mx[i] = max(s[i, j] for j)
  p[i, j] = exp(s[i, j] - mx[i])
  u[i, d] = sum(p[i, j] * abs(v[j, d]) for j)
  o[i, d] = u[i, d] / sum(p[i, j] for j)
}}

@strategy(softmax_w{w}, target = cuda) {{ warps = {w} }}
@strategy(attn_w{w}, target = cuda) {{ warps = {w} }}
"""
WARP_COUNTS = [1, 2, 8, 32]

OTHERS = """
kernel istats(x: i32[M, N]) -> (a: i32[M, N], c: i64[M]) {
  mx[m] = max(x[m, n] for n)
  mn[m] = min(x[m, n] for n)
  a[m, n] = x[m, n] * 3 - mx[m] + mn[m]
  c[m] = sum(x[m, n] > 0 for n)
}

kernel bytes(x: i8[M, N]) -> i8[M, N] {
  s[m] = sum(x[m, n] for n)
  p[m] = prod(x[m, n] for n)
  return x[m, n] - s[m] + p[m]
}

kernel flags(x: bool[M, N], y: f32[M, N]) -> (a: bool[M], e: bool[M], z: f32[M, N]) {
  a[m] = max(x[m, n] for n)
  e[m] = min(x[m, n] for n)
  z[m, n] = y[m, n] if a[m] and not e[m] else -y[m, n]
}

kernel divided32(x: i32[M, N], y: i32[M, N]) -> i32[M, N] {
  s[m] = sum(x[m, n] / y[m, n] for n)
  return x[m, n] % y[m, n] + s[m]
}

kernel divided64(x: i64[M, N], y: i64[M, N]) -> i64[M, N] {
  s[m] = sum(x[m, n] / y[m, n] for n)
  return x[m, n] % y[m, n] + s[m]
}

kernel gathered(ids: i64[M, N], table: f32[V]) -> f32[M, N] {
  s[m] = sum(table[ids[m, n]] for n)
  return table[ids[m, n]] / s[m]
}

kernel twostats(x: f32[M, N]) -> (a: f32[M], b: f32[M, N]) {
  a[m] = sum(x[m, n] for n)
  b[m, n] = x[m, n] - a[m]
}

kernel rowrank(x: f32[M, N]) -> f32[M, N] {
  p[m, n] = exp(x[m, n] - max(x[m, j] for j))
  r[m, n] = sum(f32(p[m, j] > p[m, n]) for j)
  return p[m, n] * r[m, n]
}

kernel heads(x: f32[B, H, N], g: f32[H, N]) -> f32[B, H, N] {
  mx[b, h] = max(x[b, h, n] for n)
  e[b, h, n] = exp(x[b, h, n] - mx[b, h]) * g[h, n]
  return e[b, h, n] / sum(e[b, h, k] for k)
}
"""


def rows_plan(module: arke.Module, kernel: str, strategy: Strategy | None = None) -> KernelPlan:
    return make_plan(module.semantic, module.kernel_map.get(kernel, kernel), strategy, families=ROWS.families)


@cache
def has_rows(module: str, kernel: str) -> bool:
    """Whether the kernel's plan for the rows renderer has a rows dispatch."""
    plan = rows_plan(std_module(module), kernel)
    return any(d.family == "rows" and d.pattern is not None for d in plan.dispatches)


def floats(t: str) -> arke.Module:
    return text_module(FLOATS.format(t=t))


def warps_module() -> arke.Module:
    return text_module("".join(WARPS.format(w=w) for w in WARP_COUNTS))


def strategy(module: arke.Module, kernel: str) -> Strategy:
    found = module.strategies.for_kernel(module.kernel_map.get(kernel, kernel), "cuda")
    assert len(found) == 1
    return found[0]


def run(module: arke.Module, kernel: str, *args: Any, strategy: Strategy | None = None,
        **scalars: Any) -> tuple[Any, int]:
    return cuda_host.run(module, kernel, *args, renderer=ROWS, strategy=strategy, **scalars)


def check(module: arke.Module, kernel: str, dims: dict[str, int], *, strategy: Strategy | None = None,
          **options: Any) -> Any:
    """Run ``kernel`` on random inputs through the simulator; it matches the interpreter within
    the rule (codegen_support.tolerance). Returns its results."""
    args = random_inputs(module.kernels[kernel], dims, seeded("cuda-rows", kernel, dims), **options)
    got, err = run(module, kernel, *args, strategy=strategy)
    assert err == 0, f"{kernel} {dims}: the error word was raised on in-range inputs"
    assert_conforms(got, module.kernels[kernel], *args, what=f"cuda rows {kernel} {dims}")
    return got


# ---------------------------------------------------------------- conformance


ROW_CASES = [c for c in CASES if has_rows(c.module, c.member)]


def test_rows_cases_cover_the_row_kernels() -> None:
    kernels = {c.kernel for c in ROW_CASES}
    assert {"softmax", "logsumexp", "log_softmax", "layernorm", "rmsnorm", "cross_entropy", "attention",
            "topk_routing", "attn_in"} <= kernels


@pytest.mark.parametrize("case", ROW_CASES, ids=lambda c: c.id)
def test_rows_conformance_case_matches_interpreter(case: Case) -> None:
    cuda_host.check_host_case(case, ROWS, "cuda rows (host)")


# ---------------------------------------------------------------- dtypes and ragged rows


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"M={s[0]},N={s[1]}")
@pytest.mark.parametrize("name", ["rmsnorm", "softmax", "layernorm", "logsumexp"])
@pytest.mark.parametrize("t", ["f32", "bf16", "f16"])
def test_norms_in_each_dtype_match_interpreter(t: str, name: str, shape: tuple[int, int]) -> None:
    m, n = shape
    check(floats(t), f"{name}_{t}", {"M": m, "N": n})


@pytest.mark.parametrize("t", ["bf16", "f16"])
def test_internal_16_bit_values_are_rounded_as_the_interpreter_rounds_them(t: str) -> None:
    module = text_module(ROUNDING.format(t=t))
    _, dispatch, _ = _rows_dispatch(module, f"rounding_{t}")
    assert len(dispatch.members) == 5 and len(dispatch.internal) == 4  # s, w, z: registers; h: inlined
    got = check(module, f"rounding_{t}", {"M": 6, "N": 17})
    assert float(torch.as_tensor(got).abs().max()) > 1.0  # the roundings are there to see


def test_internal_values_live_in_registers_or_scratch() -> None:
    text, launch = render_rows(*_rows_dispatch(floats("bf16"), "softmax_bf16"))
    assert "__shfl_xor_sync" in text and "__shared__ float" in text
    assert text.count("ak_bf16_to_f32(ak_f32_to_bf16(") >= 2  # mx's register and the fused e, rounded
    assert launch.scratch is None and launch.grid == ("M",) and dict(launch.options)["block"] == 128
    _, launch = render_rows(*_rows_dispatch(warps_module(), "attn_w1"))
    assert launch.scratch is not None and "S*T" in launch.scratch  # the scores of every row


def test_integer_and_boolean_reductions() -> None:
    module = text_module(OTHERS)
    for n in (1, 33, 200):
        check(module, "istats", {"M": 3, "N": n})
        check(module, "bytes", {"M": 4, "N": n})
        check(module, "flags", {"M": 5, "N": n})


@pytest.mark.parametrize("t", ["i32", "i64"])
def test_integer_division_in_members(t: str) -> None:
    module = text_module(OTHERS)
    name = f"divided{t[1:]}"
    rng = seeded("cuda-rows-div", t)
    x = rng.integers(-1000, 1000, (3, 37)).astype(np.int32 if t == "i32" else np.int64)
    y = (rng.integers(1, 50, (3, 37)) * rng.choice([-1, 1], (3, 37))).astype(x.dtype)
    if t == "i64":  # past 32 bits: the 64-bit division
        x[0] *= 1 << 33
        y[1] *= 1 << 35
    got, err = run(module, name, x, y)
    assert err == 0
    assert_conforms(got, module.kernels[name], x, y, what=f"{name}: floor division and Python's modulo")
    y[2, 5] = 0  # divides as 1, and raises the error word
    _, err = run(module, name, x, y)
    assert err == 1


@pytest.mark.parametrize("n", [1, 37, 300])
def test_returned_statistics_and_wide_internal_maps(n: int) -> None:
    """A statistic the kernel returns (stored once per row, read by the next member from its
    register); a wide internal map read at other columns (inlined into a reduction with free axes)."""
    module = text_module(OTHERS)
    check(module, "twostats", {"M": 3, "N": n})
    check(module, "rowrank", {"M": 4, "N": n})


def test_two_row_axes_flatten_into_the_grid() -> None:
    module = text_module(OTHERS)
    plan = rows_plan(module, "heads")
    assert ROWS.render(plan).launches[0].grid == ("B*H",)
    check(module, "heads", {"B": 2, "H": 3, "N": 37})


@pytest.mark.parametrize("n", [33, 4096])
def test_nan_and_infinite_rows(n: int) -> None:
    module = floats("f32")
    x = seeded("cuda-rows-nan", n).standard_normal((4, n)).astype(np.float32)
    x[1, n // 2] = np.nan  # max propagates NaN: the whole row is NaN
    x[2, :] = -np.inf  # exp(-inf - -inf) is NaN
    x[3, 0] = np.inf
    for name in ("softmax_f32", "logsumexp_f32"):
        got, err = run(module, name, x)
        assert err == 0
        assert_conforms(got, module.kernels[name], x, what=f"{name} with NaN and inf")


# ---------------------------------------------------------------- strategies


@pytest.mark.parametrize("w", WARP_COUNTS)
def test_warps_set_the_block_and_keep_the_answer(w: int) -> None:
    module = warps_module()
    for kernel, dims in ((f"softmax_w{w}", {"M": 3, "N": 1000}), (f"attn_w{w}", {"S": 3, "T": 70, "D": 45})):
        tuned = strategy(module, kernel)
        artifact = ROWS.render(rows_plan(module, kernel, tuned))
        rows = [launch for launch in artifact.launches if launch.entry in artifact.source and
                re.search(rf"__launch_bounds__\({32 * w}\) {launch.entry}\(", artifact.source)]
        assert rows and all(dict(launch.options)["block"] == 32 * w for launch in rows)
        check(module, kernel, dims, strategy=tuned)


def test_default_block_is_four_warps_and_the_head_is_the_abi_one() -> None:
    artifact = ROWS.render(rows_plan(floats("f32"), "softmax_f32"))
    head = ('extern "C" __global__ void __launch_bounds__(128) softmax_f32_d0(const float* __restrict__ b0, '
            'float* __restrict__ b1, const long long* __restrict__ dims, long long* __restrict__ err) {')
    assert artifact.source.splitlines().count(head) == 1
    assert cuda_host._ENTRY.findall(artifact.source) == [("softmax_f32_d0", head[head.index("(const") + 1:-3])]
    launch = artifact.launches[0]
    assert dict(launch.options)["block"] == 128 and launch.grid == ("M",) and launch.buffers == (0, 1)


@pytest.mark.parametrize("value", [3, 64, 0])
def test_unusable_warps_are_refused(value: int) -> None:
    plan, dispatch, entry = _rows_dispatch(floats("f32"), "softmax_f32")
    plan = dataclasses.replace(plan, decisions=(Decision("warps", None, value),))
    with pytest.raises(UnsupportedError, match=rf"`warps = {value}`.*1, 2, 4, 8, 16 or 32 warps"):
        render_rows(plan, dispatch, entry)


# ---------------------------------------------------------------- the vector path


@pytest.mark.parametrize("t", ["f32", "bf16"])
def test_vector_and_scalar_paths_give_the_same_bits(t: str) -> None:
    module = floats(t)
    dtype = torch.float32 if t == "f32" else torch.bfloat16
    x = torch.from_numpy(seeded("cuda-rows-bits", t).standard_normal((3, 4096)).astype(np.float32)).to(dtype)
    w = torch.from_numpy(seeded("cuda-rows-bits-w", t).standard_normal(4096).astype(np.float32)).to(dtype)
    spare = torch.empty(x.numel() + 1, dtype=dtype)
    shifted = spare[1:].view(3, 4096)  # the same values 2 or 4 bytes past a 16-byte boundary
    shifted.copy_(x)
    assert x.data_ptr() % 16 == 0 and shifted.data_ptr() % 16 != 0
    for name, args in ((f"softmax_{t}", ()), (f"rmsnorm_{t}", (w,)), (f"logsumexp_{t}", ())):
        aligned, err = run(module, name, x, *args)
        unaligned, err2 = run(module, name, shifted, *args)
        assert err == err2 == 0
        assert same_bits(aligned, unaligned), f"{name}: the vector path and the scalar path differ"
        assert_conforms(aligned, module.kernels[name], x, *args, what=f"{name} (vector path)")


def test_rows_of_a_multiple_of_the_vector_are_read_sixteen_bytes_at_a_time() -> None:
    text, _ = render_rows(*_rows_dispatch(floats("bf16"), "rmsnorm_bf16"))
    assert "*(const ak_vec16*)" in text and "*(ak_vec16*)" in text  # vector loads, and the row stored so
    assert "% 8LL == 0" in text  # 8 bf16 per 16 bytes


# ---------------------------------------------------------------- NVRTC and ptxas


ROW_KERNELS = [(m, k) for m in STDLIB for k in kernel_names(std_module(m), LAYER_DTYPES) if has_rows(m, k)]


def _rows_dispatch(module: arke.Module, kernel: str, tuned: Strategy | None = None) -> tuple[Any, Any, str]:
    plan = rows_plan(module, kernel, tuned)
    k, d = next((k, d) for k, d in enumerate(plan.dispatches) if d.family == "rows" and d.pattern is not None)
    return plan, d, f"{kernel}_d{k}"


def _rows_source(plan: KernelPlan) -> str:
    """The plan's rows functions alone (the other dispatches are test_cuda.py's business)."""
    texts = [render_rows(plan, d, f"{plan.name}_d{k}")[0] for k, d in enumerate(plan.dispatches)
             if d.family == "rows" and d.pattern is not None]
    assert texts
    return PRELUDE + "\n\n".join(texts) + "\n"


def _assembles(source: str, kernel: str) -> None:
    for arch in ARCHS:
        ptx = nvrtc.compile_ptx(source, arch, kernel=kernel)
        assert f".target {arch}" in ptx
        assert_assembles_without_spills(ptx, arch)


needs_nvrtc = pytest.mark.skipif(not nvrtc.available() or nvrtc.ptxas_path() is None,
                                 reason="no NVRTC or ptxas (pip install 'arke[cuda]' triton)")


@needs_nvrtc
@pytest.mark.parametrize(("module", "kernel"), [
    pytest.param(m, k, marks=pytest.mark.xfail(reason="a literal top-64 is 64 selection rounds held in registers "
                                                       "(the CUDA renderer has no one-pass top-k yet)", strict=True))
    if (m, k) == ("std.lm", "candidates") else (m, k) for m, k in ROW_KERNELS], ids=lambda v: str(v))
def test_stdlib_rows_kernels_assemble_without_spills(module: str, kernel: str) -> None:
    _assembles(_rows_source(rows_plan(std_module(module), kernel)), kernel)


#: (module of this file, kernel): every kernel written here, each block size
TEST_KERNELS = [*((f"floats-{t}", f"{name}_{t}") for t in ("bf16", "f16")
                  for name in ("rmsnorm", "softmax", "layernorm", "logsumexp")),
                *((f"rounding-{t}", f"rounding_{t}") for t in ("bf16", "f16")),
                *(("warps", f"{name}_w{w}") for w in WARP_COUNTS for name in ("softmax", "attn")),
                *(("others", k) for k in ("istats", "bytes", "flags", "divided32", "divided64", "gathered", "twostats",
                                          "rowrank", "heads"))]


def _test_module(label: str) -> arke.Module:
    kind, _, t = label.partition("-")
    return {"floats": lambda: floats(t), "rounding": lambda: text_module(ROUNDING.format(t=t)),
            "warps": warps_module, "others": lambda: text_module(OTHERS)}[kind]()


@needs_nvrtc
@pytest.mark.parametrize(("label", "kernel"), TEST_KERNELS, ids=lambda v: str(v))
def test_test_kernels_assemble_without_spills(label: str, kernel: str) -> None:
    module = _test_module(label)
    tuned = strategy(module, kernel) if label == "warps" else None
    _assembles(_rows_source(rows_plan(module, kernel, tuned)), kernel)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("bad", [7, -1, 1 << 40])
def test_bad_gather_in_a_member_raises_the_error_word(bad: int) -> None:
    module = text_module(OTHERS)
    ids = seeded("cuda-rows-gather").integers(0, 7, (3, 40)).astype(np.int64)
    table = seeded("cuda-rows-table").random(7).astype(np.float32) + 1.0
    good, err = run(module, "gathered", ids, table)
    assert err == 0
    assert_conforms(good, module.kernels["gathered"], ids, table, what="gathered")
    ids[1, 17] = bad  # read by the row's sum (a block reduction) and by the map
    got, err = run(module, "gathered", ids, table)
    assert err == 1
    assert np.isfinite(got).all()  # clamped: the bad id reads table[0], never outside the table


def test_bad_target_of_cross_entropy_raises_the_error_word() -> None:
    module = std_module("std.nn")
    logits, target = random_inputs(module.kernels["cross_entropy"], {"M": 5, "V": 33}, seeded("cuda-rows-ce"),
                                   ids={"target": "V"})
    _, err = run(module, "cross_entropy", logits, target)
    assert err == 0
    target = np.array(target, copy=True)
    target[2] = 33
    got, err = run(module, "cross_entropy", logits, target)
    assert err == 1 and np.isfinite(got).all()
