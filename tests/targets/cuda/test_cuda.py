"""The CUDA-C target: every stdlib kernel renders to CUDA C, NVRTC compiles it to PTX for compute_80
and compute_90, and ``ptxas`` assembles it with no spills; the 16-bit float conversions are the
same code compiled for the host with gcc and compared with torch bit for bit; NVRTC errors name
the kernel; ``akc build --target cuda --emit source|ptx|cubin``.

No GPU is needed (nothing is launched). Each kernel compiles once per architecture per process.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
from codegen_support import std_module
from gpu_support import ARCHS, GPU_AK, KERNELS, assert_assembles_without_spills, run_cli, stdlib_source

from arke.plan.dispatch import make_plan
from arke.targets.cuda import nvrtc
from arke.targets.cuda.expr import CONVERT
from arke.targets.cuda.render import RENDERER

needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="no NVRTC (pip install 'arke[cuda]')")
needs_ptxas = pytest.mark.skipif(nvrtc.ptxas_path() is None, reason="no ptxas (it ships with Triton)")


def source(module: str, kernel: str) -> str:
    return stdlib_source(RENDERER, module, kernel)


@cache
def entries(module: str, kernel: str) -> list[tuple[str, int]]:
    """(entry, threads per block) of each launch of a stdlib kernel's default plan."""
    m = std_module(module)
    plan = make_plan(m.semantic, m.kernel_map[kernel], None, families=RENDERER.families)
    return [(spec.entry, dict(spec.options)["block"]) for spec in RENDERER.render(plan).launches]


@cache
def ptx(module: str, kernel: str, arch: str) -> str:
    return nvrtc.compile_ptx(source(module, kernel), arch, kernel=kernel)


@pytest.mark.parametrize(("module", "kernel"), KERNELS)
def test_renders_cuda_c(module: str, kernel: str) -> None:
    text = source(module, kernel)
    for entry, threads in entries(module, kernel):
        assert f'extern "C" __global__ void __launch_bounds__({threads}) {entry}(' in text
        assert threads % 32 == 0 and 32 <= threads <= 1024
    assert "#include" not in text  # NVRTC has no CUDA headers here
    assert "long long* __restrict__ err" in text


@needs_nvrtc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(("module", "kernel"), KERNELS)
def test_nvrtc_compiles_for_each_arch(module: str, kernel: str, arch: str) -> None:
    text = ptx(module, kernel, arch)
    assert f".target {arch}" in text
    for entry, _ in entries(module, kernel):
        assert f".visible .entry {entry}(" in text


#: kernels whose CUDA C spills today, and why (strict: once one stops spilling, its entry must go)
SPILLS = {("std.lm", "candidates"): "a literal top-64 is 64 selection rounds held in registers (the CUDA renderer "
                                    "has no one-pass top-k yet)"}


@needs_nvrtc
@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(("module", "kernel"), [
    pytest.param(m, k, marks=pytest.mark.xfail(reason=SPILLS[m, k], strict=True)) if (m, k) in SPILLS else (m, k)
    for m, k in KERNELS])
def test_ptxas_assembles_without_spills(module: str, kernel: str, arch: str) -> None:
    assert_assembles_without_spills(ptx(module, kernel, arch), arch)


@needs_nvrtc
def test_nvrtc_error_names_the_kernel() -> None:
    broken = 'extern "C" __global__ void broken_d0(float* x) { x[0] = undeclared_thing; }\n'
    with pytest.raises(nvrtc.NvrtcError, match="`broken`") as info:
        nvrtc.compile_ptx(broken, "sm_90", kernel="broken")
    assert "undeclared_thing" in info.value.log and info.value.arch == "sm_90"


# -- the 16-bit conversions, compiled for the host: the same C the kernels include

@cache
def _host_conversions(tmp: str) -> ctypes.CDLL:
    wrappers = """
void widen(const unsigned short* in, float* out, int n, int bf) {
  for (int i = 0; i < n; i++) out[i] = bf ? ak_bf16_to_f32(in[i]) : ak_f16_to_f32(in[i]);
}
void narrow(const float* in, unsigned short* out, int n, int bf) {
  for (int i = 0; i < n; i++) out[i] = bf ? ak_f32_to_bf16(in[i]) : ak_f32_to_f16(in[i]);
}
"""
    src, lib = Path(tmp) / "convert.c", Path(tmp) / "convert.so"
    src.write_text(CONVERT + wrappers, encoding="utf-8")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, capture_output=True)
    dll = ctypes.CDLL(str(lib))
    for f in (dll.widen, dll.narrow):
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    return dll


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_conversions_match_torch_bit_for_bit(dtype: torch.dtype,
                                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    lib = _host_conversions(str(tmp_path_factory.mktemp("convert")))
    bf = int(dtype == torch.bfloat16)
    every = np.arange(1 << 16, dtype=np.uint16)
    got = np.empty(every.size, np.float32)
    lib.widen(every.ctypes.data, got.ctypes.data, every.size, bf)
    want = torch.from_numpy(every.view(np.int16)).view(dtype).float().numpy()
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))  # NaN payloads too
    # narrowing: random bits, every exponent's halfway points, and the edges
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    exps = np.arange(256, dtype=np.uint32) << 23
    low = np.array([0, 1, 0xFFF, 0x1000, 0x1001, 0x2000, 0x3000, 0x7FFF, 0x8000, 0x8001, 0x18000, 0x7FFFFF],
                   np.uint32)
    edges = (exps[:, None] | low[None, :]).ravel()
    bits = np.concatenate([bits, edges, edges | 0x80000000]).astype(np.uint32)
    x = bits.view(np.float32)
    out = np.empty(x.size, np.uint16)
    lib.narrow(x.ctypes.data, out.ctypes.data, x.size, bf)
    expect = torch.from_numpy(x).to(dtype).view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(x)
    np.testing.assert_array_equal(out[~nan], expect[~nan])
    back = torch.from_numpy(out[nan].view(np.int16)).view(dtype).float().numpy()
    assert np.isnan(back).all()


# -- akc build --target cuda

def test_cli_emits_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "k.ak"
    path.write_text(GPU_AK, encoding="utf-8")
    status, out, _ = run_cli(capsys, "build", str(path), "--target", "cuda", "--emit", "source", "--kernel", "add2")
    assert status == 0 and '__global__ void __launch_bounds__(128) add2_d0(' in out
    status, _, _ = run_cli(capsys, "build", str(path), "--target", "cuda", "-o", str(tmp_path / "cu"))
    assert status == 0
    assert sorted(p.name for p in (tmp_path / "cu").iterdir()) == ["add2.sm_90.cu", "mm.sm_90.cu"]


def test_cli_missing_nvrtc_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "k.ak"
    path.write_text(GPU_AK, encoding="utf-8")
    monkeypatch.setattr(nvrtc, "library_path", lambda: None)
    nvrtc._library.cache_clear()
    try:
        status, _, err = run_cli(capsys, "build", str(path), "--target", "cuda", "--emit", "ptx")
        assert status == 2 and "pip install 'arke[cuda]'" in err and "Traceback" not in err
        with pytest.raises(nvrtc.NvrtcMissingError, match=r"arke\[cuda\]"):
            nvrtc.compile_ptx("", "sm_90")
    finally:
        nvrtc._library.cache_clear()


def test_cli_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "k.ak"
    path.write_text(GPU_AK, encoding="utf-8")
    status, _, err = run_cli(capsys, "build", str(path), "--target", "cuda", "--arch", "sm_70", "--emit", "ptx")
    assert status == 2 and "sm_90" in err
    status, _, err = run_cli(capsys, "build", str(path), "--target", "cuda", "--emit", "asm")
    assert status == 2 and "source, ptx, cubin" in err


STRATEGIES = GPU_AK + """
@strategy(mm, target = cuda, when M > 64) { tile m = 64, n = 64, k = 32; warps = 4; stages = 2 }
@strategy(add2, target = cuda) { warps = 8 }
"""


def test_cli_builds_each_strategy_variant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "k.ak"
    path.write_text(STRATEGIES, encoding="utf-8")
    status, _, _ = run_cli(capsys, "build", str(path), "--target", "cuda", "-o", str(tmp_path / "cu"))
    assert status == 0
    # mm's strategy has a `when`: a call may also take the defaults, so both are built
    assert sorted(p.name for p in (tmp_path / "cu").iterdir()) == [
        "add2.sm_90.cu", "mm.defaults.sm_90.cu", "mm.strategy.sm_90.cu"]
    tuned = (tmp_path / "cu" / "mm.strategy.sm_90.cu").read_text()
    default = (tmp_path / "cu" / "mm.defaults.sm_90.cu").read_text()
    assert "__launch_bounds__(128) mm_d0(" in tuned and "__launch_bounds__(256) mm_d0(" in default
    assert "ak_mma_bf16" in tuned and "ak_cp_async16" in tuned


@needs_nvrtc
@needs_ptxas
def test_cli_reports_warps_and_shared_memory_per_variant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "k.ak"
    path.write_text(STRATEGIES, encoding="utf-8")
    status, _, err = run_cli(capsys, "build", str(path), "--target", "cuda", "--emit", "ptx", "--kernel", "mm")
    assert status == 0
    rows = [line.split() for line in err.splitlines() if line.startswith("mm.")]
    assert {r[0] for r in rows} == {"mm.strategy", "mm.defaults"}, err


def test_cli_an_impossible_decision_is_reported_against_the_kernel(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "k.ak"
    path.write_text(GPU_AK + "@strategy(mm, target = cuda) { tile m = 64, n = 64, k = 20 }\n", encoding="utf-8")
    status, _, err = run_cli(capsys, "build", str(path), "--target", "cuda", "--emit", "source", "--kernel", "mm")
    assert status == 1 and "Traceback" not in err
    assert "error[AK4004]: `mm`" in err and "tile k = 20" in err, err
