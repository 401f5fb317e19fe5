"""Kernels of several fused dispatches in one module: DeepSeek-V2's MLA decode and the two minimal
kernels that once crashed its llvm build (issue 17: ``invalid redefinition of function
'llvm.masked.load.v16f32.p0'``, two emitters spelling one intrinsic two ways).

* ``attn_then_proj``: an attention core followed by a contraction over its output (the
  attention tiles' masked loads next to the contraction's dot products);
* ``two_scores``: a score that is the sum of two contractions, feeding softmax · V;
* ``mla_decode``: multi-head latent attention at decode with the up-projections absorbed: the
  query's no-rope part goes through ``W_UK`` into the latent space, the score is
  ``q_lat · c_kv + q_rope · k_rope``, and the output is ``(p · c_kv)`` through ``W_UV``.

The interpreter is checked against torch (MLA against the un-absorbed form: per-head keys and
values up-projected from the latent cache, then ``scaled_dot_product_attention``); every runnable
target against the interpreter by the one tolerance rule, on ragged shapes (T = 4097 included),
in f32 and bf16 (Triton under its CPU interpreter); the CUDA C runs in the host simulator and
compiles (NVRTC + ptxas) for sm_80 and sm_90 without spills; ``akc build`` succeeds for every
target.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import cuda_host
import pytest
import torch
from codegen_support import RUNNABLE, TARGETS, assert_conforms, build, random_inputs, seeded, text_module
from gpu_support import ARCHS, assert_assembles_without_spills, run_cli

import arke
from arke.plan.dispatch import make_plan
from arke.targets.cuda import nvrtc
from arke.targets.cuda.render import RENDERER as CUDA

SOURCE = """
# (a) an attention core followed by a contraction over its output (w's rows run along d, a linear's weight)
kernel attn_then_proj_{t}(q: {t}[H, D], k: {t}[T, D], v: {t}[T, D], w: {t}[E, D]) -> f32[H, E] {{
  s[h, j] = sum(f32(q[h, d]) * f32(k[j, d]) for d) / sqrt(D)
  mx[h] = max(s[h, j] for j)
  p[h, j] = exp(s[h, j] - mx[h])
  o[h, d] = sum(p[h, j] * f32(v[j, d]) for j) / sum(p[h, j] for j)
  return sum(o[h, d] * f32(w[e, d]) for d)
}}

# (b) a score that is the sum of two contractions, feeding softmax . V
kernel two_scores_{t}(q: {t}[H, D], k: {t}[T, D], qr: {t}[H, R], kr: {t}[T, R], v: {t}[T, D]) -> f32[H, D] {{
  s[h, j] = sum(f32(q[h, d]) * f32(k[j, d]) for d) + sum(f32(qr[h, r]) * f32(kr[j, r]) for r)
  mx[h] = max(s[h, j] for j)
  p[h, j] = exp(s[h, j] - mx[h])
  return sum(p[h, j] * f32(v[j, d]) for j) / sum(p[h, j] for j)
}}

# MLA decode, up-projections absorbed: P no-rope and R rope dims per head, a latent of C, V per head
kernel mla_decode_{t}(q_nope: {t}[B, H, P], q_rope: {t}[B, H, R], c_kv: {t}[B, T, C], k_rope: {t}[B, T, R],
                      w_uk: {t}[H, P, C], w_uv: {t}[H, C, V]) -> f32[B, H, V] {{
  q_lat[b, h, c] = sum(f32(q_nope[b, h, p]) * f32(w_uk[h, p, c]) for p)
  s[b, h, t] = (sum(q_lat[b, h, c] * f32(c_kv[b, t, c]) for c)
                + sum(f32(q_rope[b, h, r]) * f32(k_rope[b, t, r]) for r)) / sqrt(P + R)
  mx[b, h] = max(s[b, h, t] for t)
  p[b, h, t] = exp(s[b, h, t] - mx[b, h])
  o_lat[b, h, c] = sum(p[b, h, t] * f32(c_kv[b, t, c]) for t) / sum(p[b, h, t] for t)
  return sum(o_lat[b, h, c] * f32(w_uv[h, c, v]) for c)
}}
"""

DTYPES = ("f32", "bf16")
ONES = {"H": 1, "D": 1, "T": 1, "E": 1, "R": 1, "B": 1, "P": 1, "C": 1, "V": 1}
SHAPES: dict[str, list[dict[str, int]]] = {
    "attn_then_proj": [ONES, {"H": 3, "D": 17, "T": 33, "E": 5}, {"H": 3, "D": 64, "T": 4097, "E": 33}],
    "two_scores": [ONES, {"H": 3, "D": 17, "T": 33, "R": 7}, {"H": 3, "D": 16, "T": 4097, "R": 8}],
    "mla_decode": [ONES, {"B": 2, "H": 3, "P": 5, "R": 4, "T": 33, "C": 17, "V": 6},
                   {"B": 1, "H": 4, "P": 16, "R": 8, "T": 4097, "C": 64, "V": 16}],
}
#: shapes small enough for the CUDA host simulator
SMALL = {name: shapes[:2] for name, shapes in SHAPES.items()}


def module(dtype: str) -> arke.Module:
    return text_module(SOURCE.format(t=dtype))


def cases(shapes: dict[str, list[dict[str, int]]]) -> list[Any]:
    return [pytest.param(name, dims, dtype, id=f"{name}-{dtype}-" + ",".join(f"{k}={v}" for k, v in dims.items()))
            for name, all_dims in shapes.items() for dims in all_dims for dtype in DTYPES]


def inputs(name: str, dims: dict[str, int], dtype: str) -> tuple[arke.Kernel, list[Any]]:
    kernel = module(dtype).kernels[f"{name}_{dtype}"]
    return kernel, random_inputs(kernel, dims, seeded(name, dtype, sorted(dims.items())))


# ---------------------------------------------------------------- the interpreter against torch


def _f64(args: list[Any]) -> list[torch.Tensor]:
    return [torch.as_tensor(a).to(torch.float64) for a in args]


def torch_reference(name: str, args: list[Any]) -> torch.Tensor:
    """The kernel's meaning written independently in torch (float64)."""
    if name == "attn_then_proj":
        q, k, v, w = _f64(args)
        p = torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1)
        return (p @ v) @ w.T
    if name == "two_scores":
        q, k, qr, kr, v = _f64(args)
        return torch.softmax(q @ k.T + qr @ kr.T, dim=-1) @ v
    q_nope, q_rope, c_kv, k_rope, w_uk, w_uv = _f64(args)
    # un-absorbed: every head's keys and values up-projected from the latent cache
    k_nope = torch.einsum("btc,hpc->bhtp", c_kv, w_uk)
    values = torch.einsum("btc,hcv->bhtv", c_kv, w_uv)
    heads = q_nope.shape[1]
    query = torch.cat([q_nope, q_rope], dim=-1).unsqueeze(2)  # [B, H, 1, P + R]
    keys = torch.cat([k_nope, k_rope.unsqueeze(1).expand(-1, heads, -1, -1)], dim=-1)
    out = torch.nn.functional.scaled_dot_product_attention(query, keys, values)
    return out.squeeze(2)


@pytest.mark.parametrize(("name", "dims", "dtype"), cases(SHAPES))
def test_interpreter_matches_torch(name: str, dims: dict[str, int], dtype: str) -> None:
    kernel, args = inputs(name, dims, dtype)
    got = torch.as_tensor(kernel(*args)).to(torch.float64)
    torch.testing.assert_close(got, torch_reference(name, args), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- every target against the interpreter


def _targets() -> list[Any]:
    return [t if t in RUNNABLE else pytest.param(t, marks=pytest.mark.skip(reason=f"{t} cannot run here"))
            for t in TARGETS]


@pytest.mark.parametrize("target", _targets())
@pytest.mark.parametrize(("name", "dims", "dtype"), cases(SHAPES))
def test_target_matches_interpreter(name: str, dims: dict[str, int], dtype: str, target: str) -> None:
    kernel, args = inputs(name, dims, dtype)
    compiled = build(module(dtype), target).kernels[kernel.name]
    assert_conforms(compiled(*args), kernel, *args, what=f"{target} {name}_{dtype} {dims}")


def test_the_kernels_plan_several_fused_dispatches() -> None:
    """What made the crash: more than one fused family (each with its own emitter) in one module."""
    m = module("f32")
    for name in SHAPES:
        families = [d.family for d in make_plan(m.semantic, m.kernel_map[f"{name}_f32"], None,
                                                frozenset({"rows", "contraction", "attention"})).dispatches]
        assert "attention" in families and "contraction" in families, (name, families)


def test_llvm_module_declares_each_intrinsic_once() -> None:
    from arke.targets.llvm.declarations import symbol
    from arke.targets.llvm.render import LLVMRenderer

    m = module("bf16")
    for bits in (512, 256, 128):
        for name in SHAPES:
            plan = make_plan(m.semantic, m.kernel_map[f"{name}_bf16"], None,
                             frozenset({"rows", "contraction", "attention"}))
            lines = [ln for ln in str(LLVMRenderer(bits).render(plan).source).splitlines()
                     if ln.startswith(("declare ", "define internal"))]
            names = [symbol(ln) for ln in lines]
            assert len(names) == len(set(names)), (name, bits, sorted(n for n in names if names.count(n) > 1))
            assert any("masked.load" in n for n in names), (name, bits)


# ---------------------------------------------------------------- cuda: the host simulator, NVRTC and ptxas


@pytest.mark.skipif(not cuda_host.available(), reason="no g++")
@pytest.mark.parametrize(("name", "dims", "dtype"), cases(SMALL))
def test_cuda_host_matches_interpreter(name: str, dims: dict[str, int], dtype: str) -> None:
    kernel, args = inputs(name, dims, dtype)
    got, err = cuda_host.run(module(dtype), kernel.name, *args, renderer=CUDA)
    assert err == 0, "the error word was raised on in-range inputs"
    assert_conforms(got, kernel, *args, what=f"cuda (host) {name}_{dtype} {dims}")


@pytest.mark.skipif(not nvrtc.available() or nvrtc.ptxas_path() is None, reason="no NVRTC or ptxas")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_compiles_without_spills(dtype: str, arch: str) -> None:
    m = module(dtype)
    for name in SHAPES:
        plan = make_plan(m.semantic, m.kernel_map[f"{name}_{dtype}"], None, families=CUDA.families)
        ptx = nvrtc.compile_ptx(str(CUDA.render(plan).source), arch, kernel=name)
        assert_assembles_without_spills(ptx, arch)


@pytest.mark.parametrize("target", TARGETS)
def test_akc_builds_every_target(target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The command the crash was met with (exit 3) builds the file for each target."""
    source = tmp_path / "mla.ak"
    source.write_text(SOURCE.format(t="f32"))
    status, _, err = run_cli(capsys, "build", str(source), "--target", target, "-o", str(tmp_path / "out"))
    assert status == 0, err
