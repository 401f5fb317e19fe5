"""Ahead-of-time Triton compiles for sm_90 and sm_80 with no GPU: PTX, cubin, resources, limits.

The hand-written artifacts follow the Triton target's contract (``b<i>`` buffer pointers,
``d<j>`` dims, the options as constexprs); ``test_stdlib_kernels_compile`` compiles what the
renderer makes of every stdlib kernel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("triton")

from codegen_support import LAYER_DTYPES, kernel_names

import arke
from arke.plan.dispatch import KernelPlan, make_plan
from arke.targets.artifact import Artifact, LaunchSpec
from arke.targets.nvidia import cubin
from arke.targets.triton import aot as triton_aot
from arke.targets.triton.render import RENDERER as TRITON

ADD_AK = "kernel add2(x: f32[N], y: f32[N]) -> f32[N] {\n  return x[n] + y[n]\n}\n"
ADD_PY = '''import triton
import triton.language as tl


@triton.jit
def add2_0(b0, b1, b2, d0, BLOCK_N: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = offs < d0
    tl.store(b2 + offs, tl.load(b0 + offs, mask=m) + tl.load(b1 + offs, mask=m), mask=m)
'''

MM_AK = ("kernel mm(a: bf16[M, K], b: bf16[K, N]) -> f32[M, N] {\n"
         "  return sum(f32(a[m, k]) * f32(b[k, n]) for k)\n}\n")
MM_PY = '''import triton
import triton.language as tl


@triton.jit
def mm_0(b0, b1, b2, d0, d1, d2, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(d1, BLOCK_K)):
        kk = k * BLOCK_K + rk
        a = tl.load(b0 + rm[:, None] * d1 + kk[None, :], mask=(rm[:, None] < d0) & (kk[None, :] < d1), other=0.0)
        b = tl.load(b1 + kk[:, None] * d2 + rn[None, :], mask=(kk[:, None] < d1) & (rn[None, :] < d2), other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(b2 + rm[:, None] * d2 + rn[None, :], acc, mask=(rm[:, None] < d0) & (rn[None, :] < d2))
'''


def plan_of(source: str, name: str) -> KernelPlan:
    mod = arke.loads(source, "<test>")
    return make_plan(mod.semantic, mod.kernel_map[name])


def add_artifact(block: int = 1024, warps: int = 4) -> Artifact:
    launch = LaunchSpec("add2_0", None, (0, 1, 2), None, ("cdiv(N, 1024)",),
                        (("BLOCK_N", block), ("num_warps", warps), ("num_stages", 1)))
    return Artifact("triton", ADD_PY, (launch,))


def mm_artifact(bm: int, bn: int, bk: int, warps: int, stages: int) -> Artifact:
    launch = LaunchSpec("mm_0", None, (0, 1, 2), None, (f"cdiv(M, {bm})", f"cdiv(N, {bn})"),
                        (("BLOCK_M", bm), ("BLOCK_N", bn), ("BLOCK_K", bk), ("num_warps", warps),
                         ("num_stages", stages)))
    return Artifact("triton", MM_PY, (launch,))


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_pointwise_compiles_to_ptx_and_cubin(arch: str) -> None:
    plan = plan_of(ADD_AK, "add2")
    [entry] = triton_aot.compile_artifact(add_artifact(), plan, arch)
    assert entry.arch == arch and entry.entry == "add2_0" and entry.kernel == plan.name
    assert f".target sm_{arch[3:]}" in entry.ptx and ".entry add2_0" in entry.ptx
    assert entry.cubin[:4] == b"\x7fELF"
    assert 0 < entry.registers <= 255 and entry.spills == 0 and entry.shared < 1024
    assert (entry.num_warps, entry.num_stages) == (4, 1)
    table = cubin.resource_table([entry])
    assert "regs" in table and "add2_0" in table


def test_signature_follows_the_plan() -> None:
    plan = plan_of(MM_AK, "mm")
    mod, tmp = triton_aot.load_module(MM_PY)
    try:
        sig, consts = triton_aot.signature(mod.mm_0, mm_artifact(64, 64, 32, 4, 2).launches[0], plan)
    finally:
        tmp.cleanup()
    assert sig == {"b0": "*bf16", "b1": "*bf16", "b2": "*fp32", "d0": "i64", "d1": "i64", "d2": "i64",
                   "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
    assert consts == {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}


def test_unknown_parameter_is_named() -> None:
    bad = Artifact("triton", ADD_PY.replace("b2, d0", "out, d0").replace("tl.store(b2", "tl.store(out"),
                   add_artifact().launches)
    with pytest.raises(ValueError, match="parameter `out`"):
        triton_aot.compile_artifact(bad, plan_of(ADD_AK, "add2"), "sm_90")


def test_matmul_tiles_fit_and_report_shared_memory() -> None:
    plan = plan_of(MM_AK, "mm")
    [entry] = triton_aot.compile_artifact(mm_artifact(128, 128, 64, 8, 3), plan, "sm_90")
    assert 32 * 1024 <= entry.shared <= 227 * 1024  # bf16 tiles staged in shared memory
    assert entry.registers > 32


def test_tiles_too_big_for_shared_memory_are_a_build_error() -> None:
    plan = plan_of(MM_AK, "mm")
    with pytest.raises(triton_aot.ResourceError) as info:
        triton_aot.compile_artifact(mm_artifact(128, 128, 128, 8, 5), plan, "sm_80")
    err = info.value
    assert err.what == "shared memory" and err.need > err.limit == 163 * 1024
    assert "mm_0" in str(err) and "sm_80" in str(err) and "num_stages=5" in str(err)


def test_arch_names() -> None:
    assert cubin.arch_of("sm_90") == (90, 227 * 1024)
    assert cubin.arch_of("sm80")[0] == 80
    with pytest.raises(ValueError, match="sm_90"):
        cubin.arch_of("sm_70")


# ---------------------------------------------------------------- every stdlib kernel the renderer makes

STDLIB = Path(arke.__file__).resolve().parent / "stdlib"


def _stdlib_kernels() -> list[Any]:
    params = []
    for path in sorted(STDLIB.glob("*.ak")):
        mod = arke.load(path)
        params += [pytest.param(path.name, name, id=f"{path.stem}.{name}") for name in kernel_names(mod, LAYER_DTYPES)]
    return params


@pytest.mark.parametrize(("file", "name"), _stdlib_kernels())
def test_stdlib_kernels_compile(file: str, name: str) -> None:
    """Every stdlib kernel renders and compiles for sm_90 and sm_80 at its defaults, or, where those need
    more shared memory than the GPU has, fitted as a GPU build fits it (arke.targets.triton.fit: 16-bit
    attention over a head dim known only at run time covers it with a block of up to 128, and its other
    blocks are halved until it launches) — about 30 s for the lot on 2 cores."""
    from arke.targets.triton.fit import fit_plan

    mod = arke.load(STDLIB / file)
    ir_name = mod.kernel_map[name]
    strategies = mod.strategies.for_kernel(ir_name, "triton")
    plan = make_plan(mod.semantic, ir_name, strategies[0] if strategies else None,
                     families=TRITON.families)
    artifact = TRITON.render(plan)
    try:
        entries = triton_aot.compile_artifact_archs(artifact, plan, ["sm_90", "sm_80"])
    except triton_aot.ResourceError:
        fitted = fit_plan(plan, ["sm_90", "sm_80"])
        artifact, entries = fitted.artifact, fitted.entries
    assert [e.arch for e in entries] == ["sm_90"] * len(artifact.launches) + ["sm_80"] * len(artifact.launches)
    assert all(e.cubin and ".entry" in e.ptx for e in entries)


def test_tiles_no_architecture_holds_are_refused_before_compiling() -> None:
    """512 × 512 × 512 blocks in 8 stages: Triton would take minutes to find they need megabytes of shared
    memory; a lower bound (one byte an element) refuses them at once."""
    plan = plan_of(MM_AK, "mm")
    with pytest.raises(triton_aot.ResourceError) as info:
        triton_aot.compile_artifact(mm_artifact(512, 512, 512, 32, 8), plan, "sm_80")
    assert info.value.need > info.value.limit and not info.value.entry.cubin  # refused, not compiled
