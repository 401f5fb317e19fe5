"""Attention of bf16 q and k on the CPU's bf16 units (:mod:`arke.targets.llvm.attention_amx`: AMX tiles,
else AVX512-BF16 dot products) gives the interpreter's answer, under every algorithm, on ragged shapes: a
head dim that is not a multiple of the 32-feature tile step (odd, too), query rows past a 16-row tile, a
last key tile that is short, grouped queries, causal masks and decode. Each unit's code is rendered and
compiled for a CPU that has it on any x86-64 host; it runs where this host has the unit (and Linux
permits AMX), else the run is skipped with the reason.
"""

from __future__ import annotations

import platform
from typing import Any

import numpy as np
import pytest
import torch
from codegen_support import assert_conforms, same_bits, seeded, text_module

from arke.plan.dispatch import make_plan
from arke.targets.llvm.isa import AMX, DPBF16, missing
from arke.targets.llvm.jit import compile_object
from arke.targets.llvm.kernel import CPUKernel
from arke.targets.llvm.render import LLVMRenderer

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="AMX is an x86-64 unit")

SOURCE = """
kernel causal(q: bf16[H, S, E], k: bf16[G, T, E], v: bf16[G, T, E]) -> bf16[H, S, E]
  where H % G == 0
{
  let R = H / G
  s[h, i, j] = sum(f32(q[h, i, e]) * f32(k[h / R, j, e]) for e) / sqrt(f32(E))
  c[h, i, j] = s[h, i, j] if j <= i + T - S else -inf
  mx[h, i] = max(c[h, i, j] for j)
  p[h, i, j] = exp(c[h, i, j] - mx[h, i])
  return bf16(sum(p[h, i, j] * f32(v[h / R, j, e]) for j) / sum(p[h, i, j] for j))
}

kernel full(q: bf16[S, H, E], k: bf16[T, H, E], v: f32[T, H, E]) -> f32[S, H, E] {
  s[i, h, j] = sum(f32(q[i, h, e]) * f32(k[j, h, e]) for e) * 0.125
  mx[i, h] = max(s[i, h, j] for j)
  p[i, h, j] = exp(s[i, h, j] - mx[i, h])
  return sum(p[i, h, j] * v[j, h, e] for j) / sum(p[i, h, j] for j)
}
"""

CASES = [("causal", {"H": 8, "G": 2, "S": 70, "T": 70, "E": 64}),
         ("causal", {"H": 4, "G": 4, "S": 37, "T": 100, "E": 40}),
         ("causal", {"H": 2, "G": 1, "S": 1, "T": 129, "E": 17}),  # decode, odd head dim
         ("causal", {"H": 3, "G": 3, "S": 5, "T": 5, "E": 96}),
         ("full", {"S": 33, "H": 2, "T": 65, "E": 32})]
ALGORITHMS = ["flash", "split_kv", "materialized"]


#: unit -> what its code calls (per 16 x 16 x 32 tile step on AMX, per 16 lanes' pairs on AVX512-BF16)
CALLS = {AMX: "call void @llvm.x86.tdpbf16ps", DPBF16: "call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512"}


def _kernel(name: str, algorithm: str, threads: int = 2, unit: str = AMX) -> tuple[CPUKernel, Any]:
    module = text_module(SOURCE + f"\n@strategy({name}) {{ algorithm = {algorithm} }}\n")
    renderer = LLVMRenderer(512, frozenset({unit}))
    (strategy,) = module.strategies.for_kernel(module.kernel_map[name], "llvm")
    plan = make_plan(module.semantic, module.kernel_map[name], strategy, renderer.families, bounded=True)
    artifact = renderer.render(plan)
    return CPUKernel(plan, artifact, compile_object(artifact.source), module.semantic, threads), module


def _inputs(name: str, d: dict[str, int]) -> list[torch.Tensor]:
    rng = seeded("amx-attention", name, *d.values())
    if name == "causal":
        shapes = [(d["H"], d["S"], d["E"]), (d["G"], d["T"], d["E"]), (d["G"], d["T"], d["E"])]
    else:
        shapes = [(d["S"], d["H"], d["E"]), (d["T"], d["H"], d["E"]), (d["T"], d["H"], d["E"])]
    out = [torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    return [out[0].bfloat16(), out[1].bfloat16(), out[2].bfloat16() if name == "causal" else out[2]]


@pytest.mark.parametrize("unit", [AMX, DPBF16])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(("name", "dims"), CASES, ids=[f"{n}-{'-'.join(map(str, d.values()))}" for n, d in CASES])
def test_unit_scores_match_the_interpreter(name: str, dims: dict[str, int], algorithm: str, unit: str) -> None:
    why = missing(unit)
    if why is not None:
        pytest.skip(why)
    kernel, module = _kernel(name, algorithm, unit=unit)
    assert kernel.artifact.meta["units"] == unit
    # the scores on the unit; with bf16 v and result p · v too (rounding p to bf16), but not materialized
    source = kernel.artifact.source
    pv_too = name == "causal" and algorithm != "materialized"
    if unit == AMX:
        assert (source.count(CALLS[AMX]) > 1) == pv_too
    else:  # the values' loop over key pairs (dp_values: `vk`) only where p · v runs on the unit
        assert CALLS[DPBF16] in source and ("b.vk." in source) == pv_too
    args = _inputs(name, dims)
    got = kernel(*args)
    assert_conforms(got, module.kernels[name], *args)
    assert same_bits(got, kernel(*args, threads=1))


@pytest.mark.parametrize(("unit", "cpu"), [(AMX, "sapphirerapids"), (DPBF16, "cooperlake"), (DPBF16, "znver4")])
def test_unit_attention_compiles_for_a_cpu_with_the_unit(unit: str, cpu: str) -> None:
    module = text_module(SOURCE)
    renderer = LLVMRenderer(512, frozenset({unit}))
    source = renderer.render(make_plan(module.semantic, module.kernel_map["causal"], None, renderer.families)).source
    assert CALLS[unit] in source and ("ldtilecfg" in source) == (unit == AMX)
    assert len(compile_object(source, cpu)) > 0


def test_f32_or_f16_attention_keeps_the_vector_path() -> None:
    module = text_module(SOURCE.replace("bf16", "f16"))
    renderer = LLVMRenderer(512, frozenset({AMX}))
    artifact = renderer.render(make_plan(module.semantic, module.kernel_map["causal"], None, renderer.families))
    assert "tdpbf16ps" not in artifact.source and "units" not in artifact.meta
