"""The GPU runtime of the cuda target and the llvm target's GPU flavour (arke.targets.nvidia.driver).

Without a GPU (this machine, CI) the tests check what a user meets there: a clear error that
says what to do, architectures checked before anything compiles, and an NVRTC failure reported
against the dispatch and the strategy that made it. With a GPU and cuda-python, every
conformance case runs on both GPU targets against the reference interpreter, and calls keep
the device rules of the other GPU target (tensors stay where they are; two devices, or an
``out=`` on another device, are a GuardError before any launch).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import arke
from arke.library import runnable_targets
from arke.plan.dispatch import make_plan
from arke.runtime.guards import GuardError
from arke.targets import base as targets
from arke.targets.cuda import nvrtc
from arke.targets.nvidia import driver as cuda

# test_conformance.py (its cases) sits one folder up.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from codegen_support import text_module
from test_conformance import CASES, Case, check_case

SRC = """\
kernel scale(x: f32[M, N], w: f32[N]) -> f32[M, N] {
  return x[m, n] * w[n]
}

kernel pick(ids: i64[T], table: f32[V, D]) -> f32[T, D] {
  return table[ids[t], d]
}

@strategy(scale, target = cuda) { warps = 8 }
"""

gpu = pytest.mark.skipif(not cuda.runnable(), reason="needs an NVIDIA GPU and cuda-python")
no_gpu = pytest.mark.skipif(cuda.runnable(), reason="checks the no-GPU path")


@no_gpu
@pytest.mark.parametrize(("target", "arch"), [("cuda", None), ("cuda", "sm_80"), ("llvm", "sm_90")])
def test_without_a_gpu_building_says_what_to_do(target: str, arch: str | None) -> None:
    with pytest.raises(ValueError) as err:
        arke.build(text_module(SRC), target=target, arch=arch)
    assert isinstance(err.value, cuda.CudaUnavailableError)
    assert "torch.cuda.is_available() is False" in str(err.value)
    assert "akc build FILE --target" in str(err.value) and "--emit cubin" in str(err.value)


@no_gpu
def test_cuda_is_not_a_runnable_target_without_a_gpu() -> None:
    assert "cuda" not in runnable_targets()
    assert "llvm" in runnable_targets()


def test_an_unknown_architecture_is_refused_before_anything_else() -> None:
    with pytest.raises(ValueError, match="sm_75"):
        arke.build(text_module(SRC), target="llvm", arch="sm_75")


@pytest.mark.parametrize("target", ["triton", "mlir"])
def test_arch_is_only_for_the_cuda_and_llvm_targets(target: str) -> None:
    with pytest.raises(ValueError, match="arch='sm_90' is for the llvm and cuda targets"):
        arke.build(text_module(SRC), target=target, arch="sm_90")


def test_llvm_without_arch_still_runs_on_the_cpu() -> None:
    lib = arke.build(text_module(SRC), target="llvm")
    assert lib.on_host and lib.arch is None
    x, w = torch.randn(3, 5), torch.randn(5)
    torch.testing.assert_close(lib.scale(x, w), x * w)


@pytest.mark.skipif(not nvrtc.available(), reason="needs NVRTC (pip install 'arke[cuda]')")
def test_an_nvrtc_error_names_the_dispatch_and_the_strategy() -> None:
    from arke.targets.cuda.render import RENDERER

    module = text_module(SRC)
    strategy = module.strategies.for_kernel(module.kernel_map["scale"], "cuda")[0]
    plan = make_plan(module.semantic, module.kernel_map["scale"], strategy, families=RENDERER.families)
    source = RENDERER.render(plan).source
    broken = source.replace("const long long gid", "this is not C; const long long gid", 1)
    with pytest.raises(nvrtc.NvrtcError) as err:
        nvrtc.compile_ptx(broken, "sm_90", kernel="scale", plan=plan)
    text = str(err.value)
    assert "`scale` (dispatch scale_d0" in text and "strategy: warps = 8" in text
    assert "sm_90" in text and "error" in err.value.log


@pytest.mark.skipif(not nvrtc.available(), reason="needs NVRTC (pip install 'arke[cuda]')")
def test_compile_plan_makes_ptx_for_both_gpu_targets_without_a_gpu() -> None:
    module = text_module(SRC)
    for name in ("cuda", "llvm"):
        target = targets.get(name)
        plan = target.plan(module.semantic, module.kernel_map["pick"], None, "sm_80")
        artifact, ptx = cuda.compile_plan(plan, target, "sm_80")
        assert ".visible .entry pick_d0" in ptx
        assert [spec.entry for spec in artifact.launches] == ["pick_d0"]


# -- on a GPU

def _gpu_lib(module: arke.Module, target: str) -> arke.Module:
    return arke.build(module, target=target, arch="sm_90" if target == "llvm" else None)


@gpu
@pytest.mark.parametrize("target", ["cuda", "llvm"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_gpu_matches_interpreter(case: Case, target: str) -> None:
    check_case(case, lambda module, *args, **scalars: getattr(_gpu_lib(module, target), case.kernel)(*args, **scalars),
               f"{target} on the GPU", reassociates=True)


@gpu
@pytest.mark.parametrize("target", ["cuda", "llvm"])
def test_cuda_tensors_stay_on_the_device(target: str) -> None:
    lib = _gpu_lib(text_module(SRC), target)
    x, w = torch.randn(33, 4097, device="cuda"), torch.randn(4097, device="cuda")
    out = lib.scale(x, w)
    assert out.device == x.device
    torch.testing.assert_close(out, x * w)
    host = lib.scale(x.cpu(), w.cpu())
    assert host.device.type == "cpu"
    given = torch.empty_like(x)
    assert lib.scale(x, w, out=given) is given


@gpu
def test_two_devices_or_out_elsewhere_are_refused_before_launch() -> None:
    lib = _gpu_lib(text_module(SRC), "cuda")
    with pytest.raises(GuardError) as err:
        lib.scale(torch.randn(3, 4, device="cuda"), torch.randn(4))
    assert err.value.rule == "device"
    with pytest.raises(GuardError) as err:
        lib.scale(torch.randn(3, 4, device="cuda"), torch.randn(4, device="cuda"), out=torch.empty(3, 4))
    assert err.value.rule == "device"


@gpu
@pytest.mark.parametrize("target", ["cuda", "llvm"])
def test_a_bad_gather_on_the_gpu_is_the_interpreters_error(target: str) -> None:
    lib = _gpu_lib(text_module(SRC), target)
    ids = torch.tensor([0, 7, 1], device="cuda")
    with pytest.raises(GuardError) as err:
        lib.pick(ids, torch.randn(5, 3, device="cuda"))
    assert err.value.rule == "index"


# -- what a call launches (no GPU needed: the driver is only called with these)

MM = """\
kernel mm(a: bf16[M, K], b: bf16[K, N]) -> f32[M, N] {
  return sum(f32(a[m, k]) * f32(b[k, n]) for k)
}

kernel attend(q: bf16[B, H, S, D], k: bf16[B, G, T, D], v: bf16[B, G, T, D]) -> bf16[B, H, S, D]
  where H % G == 0
{
  let R = H / G
  s[b, h, i, j] = sum(f32(q[b, h, i, d]) * f32(k[b, h / R, j, d]) for d) / sqrt(f32(D))
  mx[b, h, i] = max(s[b, h, i, j] for j)
  p[b, h, i, j] = exp(s[b, h, i, j] - mx[b, h, i])
  return bf16(sum(p[b, h, i, j] * f32(v[b, h / R, j, d]) for j) / sum(p[b, h, i, j] for j))
}
"""


def _kernel(name: str) -> cuda.CudaKernel:
    module = text_module(MM)
    renderer = targets.get("cuda").renderer()
    plan = make_plan(module.semantic, module.kernel_map[name], None, families=renderer.families)
    return cuda.CudaKernel(plan, renderer.render(plan), module.semantic, "", "sm_90", "cuda")


def test_the_dims_choose_what_launches_and_its_shape() -> None:
    kernel = _kernel("mm")
    decode = kernel.launches_for({"M": 3, "K": 19, "N": 37})
    assert [launch.entry for launch in decode] == ["mm_d0_mv"]  # M <= 4: the matrix-vector form only
    tiled = kernel.launches_for({"M": 130, "K": 72, "N": 129})
    assert [launch.entry for launch in tiled] == ["mm_d0"]
    (launch,) = tiled
    assert launch.grid == (4, 1, 1) and launch.block == 256  # 2 x 2 tiles of 128 x 128, 8 warps
    assert 48 * 1024 < launch.shared <= 99 * 1024 and launch.words == 1
    assert launch.buffers == (0, 1, 2)


def test_attention_decode_launches_split_kv_with_its_scratch() -> None:
    kernel = _kernel("attend")
    decode = kernel.launches_for({"B": 1, "H": 8, "G": 2, "S": 1, "T": 4096, "D": 64})
    assert len(decode) == 1 and decode[0].entry.endswith("s") and decode[0].words > 16
    prefill = kernel.launches_for({"B": 1, "H": 8, "G": 2, "S": 512, "T": 512, "D": 64})
    assert len(prefill) == 1 and not prefill[0].entry.endswith("s") and prefill[0].grid[0] > 1


def test_kernel_params_point_at_each_argument() -> None:
    import ctypes

    values = [0x1000, 0xDEAD0, 0]
    params, held = cuda.kernel_params(values)
    got = [ctypes.cast(params[k], ctypes.POINTER(ctypes.c_void_p)).contents.value or 0 for k in range(3)]
    assert got == values and len(held) == 3
