"""bf16 contractions on the CPU's matrix units (AMX tiles, AVX512-BF16) give the interpreter's answer.

Each unit's code is rendered and compiled for a CPU that has it on any x86-64 host (compiling needs
no such CPU); it is run where this host has the unit (and Linux permits AMX), else the run is
skipped with the reason. Shapes are ragged: rows past a 32-row block, a 4097-column slab tail,
depths that are not a multiple of the 32-deep tiles, both layouts of ``B``, an epilogue, batch axes.
"""

from __future__ import annotations

import platform
from typing import Any

import numpy as np
import pytest
import torch
from codegen_support import assert_conforms, same_bits, seeded, text_module

from arke.plan.contraction import INT8_CONTRACTION
from arke.plan.dispatch import make_plan
from arke.targets.llvm.gemm_bf16 import matrix_unit
from arke.targets.llvm.isa import AMX, AMX_INT8, DPBF16, INT8_UNITS, UNITS, VNNI, missing
from arke.targets.llvm.jit import compile_object
from arke.targets.llvm.kernel import CPUKernel
from arke.targets.llvm.render import LLVMRenderer

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                reason="the matrix units named here are x86-64 ones")

SOURCE = """
kernel lin(x: bf16[M, K], w: bf16[N, K]) -> f32[M, N] {
  return sum(f32(x[m, k]) * f32(w[n, k]) for k)
}

kernel mm(x: bf16[M, K], w: bf16[K, N]) -> bf16[M, N] {
  return bf16(sum(f32(x[m, k]) * f32(w[k, n]) for k))
}

kernel lin_act(x: bf16[M, K], w: bf16[N, K], b: f32[N]) -> bf16[M, N] {
  y[m, n] = sum(f32(x[m, k]) * f32(w[n, k]) for k)
  return bf16(silu(y[m, n] + b[n]))
}

kernel bmm(q: bf16[H, S, E], k: bf16[H, T, E]) -> f32[H, S, T] {
  return sum(f32(q[h, s, e]) * f32(k[h, t, e]) for e)
}

kernel normed(x: bf16[M, K], w: bf16[N, K]) -> f32[M, N] {
  return sum(f32(x[m, k]) * 0.5 * f32(w[n, k]) for k)
}

kernel full(x: f32[M, K], w: f32[N, K]) -> f32[M, N] {
  return sum(x[m, k] * w[n, k] for k)
}

kernel qlin(x: i8[M, K], w: i8[N, K]) -> i32[M, N] {
  return sum(i32(x[m, k]) * i32(w[n, k]) for k)
}

kernel w8a8(x: i8[M, K], w: i8[N, K], sx: f32[M], sw: f32[N]) -> bf16[M, N] {
  acc[m, n] = sum(i32(x[m, k]) * i32(w[n, k]) for k)
  return bf16(f32(acc[m, n]) * sx[m] * sw[n])
}

kernel qmm(x: i8[M, K], w: i8[K, N]) -> i32[M, N] {
  return sum(i32(x[m, k]) * i32(w[k, n]) for k)
}
"""

#: a CPU of the host's architecture that has each unit (the code compiles for it on any x86-64 host)
CPUS = {AMX: "sapphirerapids", AMX_INT8: "sapphirerapids", DPBF16: "cooperlake", VNNI: "cascadelake"}

CASES: list[tuple[str, dict[str, int]]] = [
    ("lin", {"M": 3, "K": 67, "N": 70}),
    ("lin", {"M": 37, "K": 100, "N": 33}),
    ("lin", {"M": 65, "K": 33, "N": 4097}),
    ("lin", {"M": 64, "K": 1100, "N": 96}),  # three k-blocks, the last with a tail
    ("mm", {"M": 33, "K": 45, "N": 61}),
    ("mm", {"M": 1, "K": 17, "N": 4097}),
    ("lin_act", {"M": 40, "K": 50, "N": 70}),
    ("bmm", {"H": 3, "S": 35, "T": 19, "E": 40}),
]


def _kernel(name: str, units: frozenset[str], threads: int = 2) -> tuple[CPUKernel, Any]:
    module = text_module(SOURCE)
    renderer = LLVMRenderer(512, units)
    plan = make_plan(module.semantic, module.kernel_map[name], None, renderer.families)
    artifact = renderer.render(plan)
    return CPUKernel(plan, artifact, compile_object(artifact.source), module.semantic, threads), module


def _inputs(name: str, dims: dict[str, int], seed: int) -> list[torch.Tensor]:
    rng, d = seeded("units", name, seed), dims
    shapes = {"lin": [(d.get("M"), d.get("K")), (d.get("N"), d.get("K"))],
              "mm": [(d.get("M"), d.get("K")), (d.get("K"), d.get("N"))],
              "lin_act": [(d.get("M"), d.get("K")), (d.get("N"), d.get("K"))],
              "bmm": [(d.get("H"), d.get("S"), d.get("E")), (d.get("H"), d.get("T"), d.get("E"))]}[name]
    args = [torch.from_numpy(rng.standard_normal(s).astype(np.float32)).bfloat16() for s in shapes]
    if name == "lin_act":
        args.append(torch.from_numpy(rng.standard_normal(d["N"]).astype(np.float32)))
    return args


@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize(("name", "dims"), CASES, ids=[f"{n}-{'-'.join(map(str, d.values()))}" for n, d in CASES])
def test_unit_matches_the_interpreter(unit: str, name: str, dims: dict[str, int]) -> None:
    why = missing(unit)
    if why is not None:
        pytest.skip(why)
    kernel, module = _kernel(name, frozenset({unit}))
    assert unit in kernel.artifact.meta["units"]
    args = _inputs(name, dims, sum(dims.values()))
    assert_conforms(kernel(*args), module.kernels[name], *args)


@pytest.mark.parametrize("unit", UNITS)
def test_unit_results_do_not_depend_on_threads(unit: str) -> None:
    why = missing(unit)
    if why is not None:
        pytest.skip(why)
    args = _inputs("lin", {"M": 70, "K": 300, "N": 1000}, 7)
    one, _ = _kernel("lin", frozenset({unit}), threads=1)
    assert same_bits(one(*args), one(*args, threads=3))


@pytest.mark.parametrize("unit", UNITS)
def test_unit_code_compiles_for_a_cpu_that_has_it(unit: str) -> None:
    module = text_module(SOURCE)
    plan = make_plan(module.semantic, module.kernel_map["lin"])
    source = LLVMRenderer(512, frozenset({unit})).render(plan).source
    assert ("tdpbf16ps" if unit == AMX else "dpbf16ps.512") in source
    assert len(compile_object(source, CPUS[unit])) > 0


def test_which_contractions_take_a_unit() -> None:
    module = text_module(SOURCE)
    every = frozenset(UNITS)

    def unit_of(name: str, units: frozenset[str] = every) -> str | None:
        plan = make_plan(module.semantic, module.kernel_map[name])
        d = next(d for d in plan.dispatches if d.family == "contraction")
        return matrix_unit(plan, d.pattern, units)  # type: ignore[arg-type]

    assert unit_of("lin") == AMX  # the best unit given
    assert unit_of("lin", frozenset({DPBF16})) == DPBF16
    assert unit_of("lin", frozenset()) is None
    assert unit_of("full") is None  # f32 operands: the f32 path
    assert unit_of("normed") is None  # a prologue (its f32 values are not bf16): the f32 path
    plan = make_plan(module.semantic, module.kernel_map["lin"])
    assert "tdpbf16ps" not in LLVMRenderer(256, every).render(plan).source  # no AVX-512: no unit


@pytest.mark.parametrize("unit", UNITS)
def test_unit_treats_subnormal_bf16_inputs_as_zero(unit: str) -> None:
    """spec/codegen.md §7: a bf16 subnormal input counts as 0 on the units (the f32 path keeps it)."""
    why = missing(unit)
    if why is not None:
        pytest.skip(why)
    x = torch.zeros(33, 40, dtype=torch.bfloat16)
    w = torch.zeros(35, 40, dtype=torch.bfloat16)
    x[5, 7] = 5e-39  # subnormal in bf16 (the smallest normal is 1.18e-38)
    w[3, 7] = 2.0 ** 100
    x[6, 8], w[4, 8] = 1.5, 2.0  # a normal product stays exact
    with_unit, _ = _kernel("lin", frozenset({unit}))
    plain, _ = _kernel("lin", frozenset())
    got, want = torch.as_tensor(with_unit(x, w)), torch.as_tensor(plain(x, w))
    assert float(want[5, 3]) == pytest.approx(float(x[5, 7].float()) * 2.0 ** 100)
    assert float(got[5, 3]) == 0.0
    assert float(got[6, 4]) == float(want[6, 4]) == 3.0


def test_an_amx_kernel_refuses_to_load_without_the_tile_permission(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where Linux refused the tile data (a tile instruction would fault), loading says what to do."""
    import arke.targets.llvm.isa as isa

    module = text_module(SOURCE)
    plan = make_plan(module.semantic, module.kernel_map["lin"])
    artifact = LLVMRenderer(512, frozenset({AMX})).render(plan)
    obj = compile_object(artifact.source, CPUS[AMX])
    monkeypatch.setattr(isa, "amx_permitted", lambda: False)
    with pytest.raises(RuntimeError, match="tile data permission"):
        CPUKernel(plan, artifact, obj, module.semantic, 1)


INT8_CASES: list[tuple[str, dict[str, int]]] = [
    ("qlin", {"M": 3, "K": 67, "N": 70}),
    ("qlin", {"M": 37, "K": 100, "N": 33}),
    ("qlin", {"M": 65, "K": 33, "N": 4097}),
    ("qlin", {"M": 40, "K": 5000, "N": 50}),  # two k-blocks, the last with a tail
    ("w8a8", {"M": 1, "K": 45, "N": 17}),
    ("qlin", {"M": 1, "K": 130, "N": 70}),  # blocks of 1, 2, 4 rows inside M: the smaller micro-kernels
    ("qlin", {"M": 2, "K": 200, "N": 33}),
    ("qlin", {"M": 7, "K": 64, "N": 40}),
    ("qlin", {"M": 12, "K": 90, "N": 64}),
    ("w8a8", {"M": 33, "K": 130, "N": 61}),
]


def _int8_inputs(name: str, d: dict[str, int]) -> list[Any]:
    rng = seeded("int8", name, *d.values())
    x = rng.integers(-128, 128, (d["M"], d["K"])).astype(np.int8)
    w = rng.integers(-128, 128, (d["N"], d["K"])).astype(np.int8)
    if name == "qlin":
        return [x, w]
    return [x, w, rng.random(d["M"]).astype(np.float32) / 127, rng.random(d["N"]).astype(np.float32) / 127]


@pytest.mark.parametrize("unit", INT8_UNITS)
@pytest.mark.parametrize(("name", "dims"), INT8_CASES,
                         ids=[f"{n}-{'-'.join(map(str, d.values()))}" for n, d in INT8_CASES])
def test_int8_unit_sums_are_exact(unit: str, name: str, dims: dict[str, int]) -> None:
    """int8 x int8 -> i32 on AMX or VNNI (sign bits flipped, corrected per column): the interpreter's
    bits (the sums are exact), epilogue included."""
    why = missing(unit)
    if why is not None:
        pytest.skip(why)
    kernel, module = _kernel(name, frozenset({unit}))
    assert [d.family for d in kernel.plan.dispatches] == ["contraction"]
    args = _int8_inputs(name, dims)
    got = kernel(*args)
    if name == "qlin":
        exact = torch.from_numpy(args[0]).long() @ torch.from_numpy(args[1]).long().T
        assert torch.equal(torch.as_tensor(got), exact.int())
    assert_conforms(got, module.kernels[name], *args)
    assert same_bits(got, kernel(*args, threads=1))


def test_int8_contractions_are_planned_only_for_a_renderer_with_the_unit() -> None:
    module = text_module(SOURCE)

    def families(name: str, units: frozenset[str]) -> list[str]:
        plan = make_plan(module.semantic, module.kernel_map[name], None, LLVMRenderer(512, units).families)
        return [d.family for d in plan.dispatches]

    assert INT8_CONTRACTION in LLVMRenderer(512, frozenset({AMX_INT8})).families
    assert INT8_CONTRACTION not in LLVMRenderer(256, frozenset({AMX_INT8})).families  # no AVX-512: no tiles
    assert families("qlin", frozenset({AMX_INT8})) == ["contraction"]
    assert families("qlin", frozenset({AMX})) != ["contraction"]  # the generic loop nest: exact anyway
    assert families("qmm", frozenset({AMX_INT8})) != ["contraction"]  # B along n: not the unit's form
    assert [d.family for d in make_plan(module.semantic, module.kernel_map["qlin"]).dispatches] != ["contraction"]
    int8 = LLVMRenderer(512, frozenset({AMX_INT8}))
    plan = make_plan(module.semantic, module.kernel_map["qlin"], None, int8.families)
    with pytest.raises(ValueError, match="int8 unit"):
        LLVMRenderer(512, frozenset()).render(plan)  # an internal error, never wrong code
    source = LLVMRenderer(512, frozenset({AMX_INT8})).render(plan).source
    assert "tdpbssd" in source and len(compile_object(source, CPUS[AMX_INT8])) > 0
    source = LLVMRenderer(512, frozenset({VNNI})).render(plan).source
    assert "vpdpbusd" in source and len(compile_object(source, CPUS[VNNI])) > 0
    assert "tdpbssd" in LLVMRenderer(512, frozenset({AMX_INT8, VNNI})).render(plan).source  # AMX first
