"""Generic kernels (spec/language.md §5.6) on every target: each specialisation against the interpreter.

A compiled generic kernel is called as written (its arguments' dtypes pick the specialisation);
the reference is the interpreter's specialisation. Ragged shapes (M = 3, N = 4097, K = 129).
The GPU targets also compile the specialisations for sm_80 and sm_90 without spills: CUDA C
through NVRTC and ptxas, Triton ahead of time — std.decoder's f16 and u8 ones too (the
stdlib-wide GPU compiles take only the layers' f32/bf16/i8, codegen_support.LAYER_DTYPES).
"""

from __future__ import annotations

from typing import Any

import cuda_host
import numpy as np
import pytest
import torch
from codegen_support import RUNNABLE, TARGETS, assert_conforms, build, seeded, std_module, text_module

from arke.plan.dispatch import make_plan

PROGRAM = """
kernel linear(x: f32[M, K], w: W[N, K]) -> f32[M, N] where W in {f32, bf16, f16} {
  return sum(x[m, k] * f32(w[n, k]) for k)
}

# the variable in the output type: each row scaled and stored back in w's dtype
kernel scale_rows(w: W[M, N], s: f32[M]) -> W[M, N] where W in {f32, bf16, f16} {
  return W(f32(w[m, n]) * s[m])
}

# a row reduction over 16-bit or 32-bit inputs, widened first
kernel softmax_w(x: W[M, N]) -> f32[M, N] where W in {f32, bf16, f16} {
  mx[m] = max(f32(x[m, n]) for n)
  e[m, n] = exp(f32(x[m, n]) - mx[m])
  return e[m, n] / sum(e[m, j] for j)
}

kernel qlinear(x: f32[M, K], w: Q[N, K], ws: f32[N]) -> f32[M, N] where Q in {i8, u8} {
  return sum(x[m, k] * f32(w[n, k]) for k) * ws[n]
}
"""

FLOATS = ("f32", "bf16", "f16")
TORCH = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "i8": torch.int8, "u8": torch.uint8}
#: (kernel, its variable, dims)
KERNELS = [("linear", "W", {"M": 3, "K": 129, "N": 33}), ("scale_rows", "W", {"M": 3, "N": 4097}),
           ("softmax_w", "W", {"M": 3, "N": 4097}), ("qlinear", "Q", {"M": 3, "K": 129, "N": 33})]
CASES = [(k, var, dt, dims) for k, var, dims in KERNELS for dt in (FLOATS if var == "W" else ("i8", "u8"))]


def module() -> Any:
    return text_module(PROGRAM)


def inputs(kernel: str, dtype: str, dims: dict[str, int]) -> list[torch.Tensor]:
    """Random arguments in the case's dtype; the generator is seeded by the case."""
    rng = seeded("generics", kernel, dtype, tuple(dims.items()))
    M, N = dims["M"], dims["N"]

    def floats(*shape: int) -> torch.Tensor:
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))

    if kernel == "linear":
        return [floats(M, dims["K"]), floats(N, dims["K"]).to(TORCH[dtype])]
    if kernel == "scale_rows":
        return [floats(M, N).to(TORCH[dtype]), floats(M)]
    if kernel == "softmax_w":
        return [floats(M, N).to(TORCH[dtype])]
    lo = -100 if dtype == "i8" else 0
    w = torch.from_numpy(rng.integers(lo, 100, (N, dims["K"]))).to(TORCH[dtype])
    return [floats(M, dims["K"]), w, torch.from_numpy(rng.random(N).astype(np.float32))]


def _targets() -> list[Any]:
    return [t if t in RUNNABLE else pytest.param(t, marks=pytest.mark.skip(reason=f"{t} cannot run here"))
            for t in TARGETS]


@pytest.mark.parametrize("target", _targets())
@pytest.mark.parametrize(("kernel", "var", "dtype", "dims"), CASES, ids=[f"{k}-{v}={d}" for k, v, d, _ in CASES])
def test_specialisation_matches_interpreter(target: str, kernel: str, var: str, dtype: str,
                                            dims: dict[str, int]) -> None:
    mod = module()
    args = inputs(kernel, dtype, dims)
    got = build(mod, target).kernels[kernel](*args)  # the generic kernel: the arguments bind `var`
    if kernel == "scale_rows":
        assert got.dtype == TORCH[dtype]
    assert_conforms(got, mod.kernels[kernel].specialise(**{var: dtype}), *args,
                    what=f"{target} {kernel} {var}={dtype}")


def test_a_compiled_call_outside_the_set_is_a_guard_error() -> None:
    from arke.runtime.errors import GuardError

    lib = build(module(), "llvm")
    with pytest.raises(GuardError, match=r"\{f32, bf16, f16\}") as err:
        lib.kernels["linear"](torch.zeros(3, 4), torch.zeros(5, 4, dtype=torch.int8))
    assert err.value.rule == "dtype"
    lin = lib.kernels["linear"]
    lin(torch.zeros(3, 4), torch.zeros(5, 4, dtype=torch.bfloat16))
    lin(torch.zeros(3, 4), torch.zeros(5, 4, dtype=torch.float16))
    # one compiled specialisation per dtype, each remembered by the arguments' dtypes
    assert lin.specialise(W="bf16") is lin.specialise(W="bf16")
    assert lin.specialise(W="bf16") is not lin.specialise(W="f16")
    assert lin.specialise(W="bf16").function.name == "linear__W_bf16"


# ---------------------------------------------------------------- cuda: on the host, and NVRTC for both archs

MEMBERS = [(k + f"__{v}_{d}", inputs(k, d, dims)) for k, v, d, dims in CASES]


@pytest.mark.parametrize(("member", "args"), MEMBERS, ids=[m for m, _ in MEMBERS])
def test_cuda_host_matches_interpreter(member: str, args: list[torch.Tensor]) -> None:
    mod = module()
    got, err = cuda_host.run(mod, member, *args)
    assert err == 0
    assert_conforms(got, mod.kernels[member], *args, what=f"cuda (host) {member}")


# std.decoder's f16 and u8 members (its f32, bf16 and i8 ones: tests/targets/cuda/test_cuda.py, as every stdlib kernel)
DECODER = ["attn_in__W_f16", "mlp__W_f16", "attn_out_q__Q_u8", "expert_q__Q_u8"]
GPU_MEMBERS = [("program", m) for m, _ in MEMBERS] + [("std.decoder", m) for m in DECODER]


def _module_of(where: str) -> Any:
    return module() if where == "program" else std_module(where)


@pytest.mark.parametrize(("where", "member"), GPU_MEMBERS, ids=[f"{w}.{m}" for w, m in GPU_MEMBERS])
def test_cuda_compiles_for_sm80_and_sm90_without_spills(where: str, member: str) -> None:
    from gpu_support import ARCHS, assert_assembles_without_spills

    from arke.targets.cuda import nvrtc
    from arke.targets.cuda.render import RENDERER

    if not nvrtc.available() or nvrtc.ptxas_path() is None:
        pytest.skip("no NVRTC or ptxas")
    mod = _module_of(where)
    plan = make_plan(mod.semantic, mod.kernel_map[member], None, families=RENDERER.families)
    source = RENDERER.render(plan).source
    for arch in ARCHS:
        assert_assembles_without_spills(nvrtc.compile_ptx(source, arch, member, plan), arch)


# Triton ahead of time (each compile takes seconds): the f16 and u8 members of this file's kernels and of
# the smallest decoder kernels; f32, bf16 and i8 are compiled for every stdlib kernel in
# tests/targets/triton/test_triton_aot.py. (Triton's f32 contraction spills 4 words on sm_80, std.nn's
# `linear` as much: the same IR, not a cost of generics.)
TRITON_MEMBERS = [("program", m) for m, _ in MEMBERS if m.endswith(("_f16", "_u8"))] + [
    ("std.decoder", "attn_out__W_f16"), ("std.decoder", "attn_out_q__Q_u8")]


@pytest.mark.parametrize(("where", "member"), TRITON_MEMBERS, ids=[f"{w}.{m}" for w, m in TRITON_MEMBERS])
def test_triton_compiles_for_sm80_and_sm90_without_spills(where: str, member: str) -> None:
    pytest.importorskip("triton")
    from arke.targets.triton import aot as triton_aot
    from arke.targets.triton.render import RENDERER as TRITON

    mod = _module_of(where)
    plan = make_plan(mod.semantic, mod.kernel_map[member], None, families=TRITON.families)
    artifact = TRITON.render(plan)
    entries = triton_aot.compile_artifact_archs(artifact, plan, ["sm_90", "sm_80"])
    assert entries and all(e.cubin and e.spills == 0 for e in entries)
