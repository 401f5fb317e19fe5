"""The LLVM target's GPU flavour: every stdlib kernel renders to NVPTX LLVM IR, lowers to PTX for
sm_80 and sm_90, and ``ptxas`` assembles it with no spills; the inline float math is checked
on the host (the same IR, JIT-compiled); ``akc build --target llvm --arch ... --emit ptx|cubin``.

No GPU is needed (nothing is launched). Each kernel compiles once per architecture per process.
"""

from __future__ import annotations

import ctypes
import math
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gpu_support import ARCHS, GPU_AK, KERNELS, assert_assembles_without_spills, run_cli, stdlib_source

from arke.targets.llvm.nvptx import RENDERER
from arke.targets.llvm.nvptx_math import FUNCTIONS, nvptx_math
from arke.targets.nvidia import ptx as nvptx
from arke.targets.nvidia.simt import entry_name

needs_ptxas = pytest.mark.skipif(nvptx.ptxas_path() is None, reason="no ptxas (it ships with Triton)")


def source(module: str, kernel: str) -> str:
    return stdlib_source(RENDERER, module, kernel)


@cache
def ptx(module: str, kernel: str, arch: str) -> str:
    return nvptx.compile_ptx(source(module, kernel), arch)


@pytest.mark.parametrize(("module", "kernel"), KERNELS)
def test_renders_nvptx_ir(module: str, kernel: str) -> None:
    text = source(module, kernel)
    assert 'target triple = "nvptx64-nvidia-cuda"' in text
    assert f'define ptx_kernel void @"{entry_name(kernel, 0)}"(' in text
    assert "ptr addrspace(1)" in text and "llvm.nvvm.read.ptx.sreg.tid.x" in text
    # nothing NVPTX cannot lower without libdevice
    for bad in ("@llvm.log.f32", "@llvm.log2.f32", "@llvm.sin.f32", "@llvm.cos.f32", "@llvm.pow.f32",
                "@tanhf", "@erff"):
        assert bad not in text


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(("module", "kernel"), KERNELS)
def test_ptx_for_each_arch(module: str, kernel: str, arch: str) -> None:
    text = ptx(module, kernel, arch)
    assert f".target {arch}" in text and ".visible .entry" in text
    assert "ld.global" in text or "st.global" in text  # address spaces inferred back to global


@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(("module", "kernel"), KERNELS)
def test_ptxas_assembles_without_spills(module: str, kernel: str, arch: str) -> None:
    assert_assembles_without_spills(ptx(module, kernel, arch), arch)


# -- the inline float math, JIT-compiled for the host: the same IR the GPU kernels inline

_KEEP: list[Any] = []  # engines stay alive while their functions may be called

REFERENCE = {"log": np.log, "log2": np.log2, "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
             "erf": np.vectorize(math.erf), "exp": np.exp}


def _host_function(op: str, arity: int) -> Any:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    name, defs = nvptx_math(op)
    params = ", ".join(f"float %a{k}" for k in range(arity))
    src = "\n".join(dict.fromkeys(defs)) + f"\ndefine float @w({params}) {{\n  %r = call float @{name}({params})\n" \
                                            "  ret float %r\n}\n"
    mod = llvm.parse_assembly(src)
    mod.verify()
    engine = llvm.create_mcjit_compiler(mod, llvm.Target.from_default_triple().create_target_machine())
    engine.finalize_object()
    _KEEP.append(engine)
    return ctypes.CFUNCTYPE(ctypes.c_float, *([ctypes.c_float] * arity))(engine.get_function_address("w"))


@pytest.mark.parametrize(("op", "ulps"), [("log", 1), ("log2", 1), ("sin", 2), ("cos", 2), ("tanh", 2),
                                          ("erf", 4), ("exp", 1)])
def test_inline_math_is_accurate(op: str, ulps: int) -> None:
    f = _host_function(op, 1)
    rng = np.random.default_rng(0)
    if op.startswith("log"):
        x = np.concatenate([rng.uniform(0, 1e4, 1000), np.exp(rng.uniform(-85, 85, 1000)), [1e-42, 1.0]])
    else:
        x = np.concatenate([rng.uniform(-20, 20, 1000), rng.uniform(-1.5, 1.5, 1000)])
    x = x.astype(np.float32)
    got = np.array([f(v) for v in x], np.float32).astype(np.float64)
    want = REFERENCE[op](x.astype(np.float64))
    err = np.abs(got - want) / np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    assert np.nanmax(err) <= ulps
    special = [0.0, np.inf, -np.inf, np.nan]
    got_s = [f(v) for v in special]
    with np.errstate(all="ignore"):
        want_s = [float(REFERENCE[op](np.float64(v))) for v in special]
    np.testing.assert_array_equal(got_s, want_s)


@pytest.mark.parametrize("op", ["sin", "cos"])
def test_inline_trig_of_huge_arguments(op: str) -> None:
    """From 8192 on, |x| is taken to [-π, π] exactly in f64 first (the Cody-Waite steps alone gave garbage at
    1e12 and beyond): within 4 units of 2**-24 of the exact value for every f32 magnitude."""
    f = _host_function(op, 1)
    rng = np.random.default_rng(5)
    edges = [8192.0, np.nextafter(np.float32(8192.0), 0), 1e12, 1e30, 3.4028235e38, -7e22]
    x = np.concatenate([np.exp(rng.uniform(9.0, 88.7, 2000)) * rng.choice([-1.0, 1.0], 2000), edges]).astype(np.float32)
    got = np.array([f(v) for v in x], np.float64)
    err = np.abs(got - REFERENCE[op](x.astype(np.float64))) * 2.0 ** 24
    assert err.max() <= 4, f"{op}({x[err.argmax()]!r}) off by {err.max():.1f} units of 2**-24"


def test_inline_pow() -> None:
    f = _host_function("pow", 2)
    for a, b in [(2.0, 10.0), (-2.0, 3.0), (-2.0, 2.0), (0.0, 2.0), (0.0, -1.0), (-2.0, 0.5), (1.0, math.nan),
                 (math.nan, 0.0), (3.0, -2.0), (0.5, 1.5)]:
        with np.errstate(all="ignore"):
            want = float(np.power(np.float64(a), np.float64(b)))
        got = f(a, b)
        assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, rel=1e-6), (a, b)
    assert set(FUNCTIONS) >= {"log", "log2", "sin", "cos", "tanh", "erf", "pow"}


# -- akc build --target llvm --arch ... --emit ptx|cubin

def test_cli_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "k.ak"
    path.write_text(GPU_AK, encoding="utf-8")
    status, _, err = run_cli(capsys, "build", str(path), "--target", "llvm", "--arch", "sm_70", "--emit", "ptx")
    assert status == 2 and "sm_90" in err
    status, _, err = run_cli(capsys, "build", str(path), "--target", "llvm", "--arch", "sm_90", "--emit", "cubin")
    assert status == 2 and "-o PATH" in err
