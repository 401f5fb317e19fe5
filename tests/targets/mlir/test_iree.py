"""The mlir target's runtime (IREE): compiling through the cache, and calling compiled kernels.

* a missing IREE is a clear ValueError naming the ``mlir`` extra, never an ImportError;
* the cache: a second build compiles nothing, a corrupted entry warns and is rebuilt;
* CUDA: sm_80 compiles without a GPU; sm_90 (which IREE 3.13 lacks) and unknown names are
  clear errors before IREE sees them; running on CUDA skips without a GPU;
* calls: ``out=``, bf16/f16/bool through their storage types, NumPy in and out, views,
  results that never alias the inputs, the error flag as the interpreter's GuardError.
"""

from __future__ import annotations

import uuid
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from codegen_support import assert_conforms

import arke
from arke.lang.checker import stdlib_path
from arke.library import Library, runnable_targets
from arke.runtime.cache import CacheWarning, default_cache
from arke.runtime.guards import TORCH_DTYPES, GuardError
from arke.targets.mlir import kernel as iree

needs_iree = pytest.mark.skipif(not iree.iree_available(), reason="IREE is not installed (pip install 'arke[mlir]')")

EXTRA = """
kernel ident(x: f32[N]) -> f32[N] { return x }
kernel both(x: f32[N]) -> (a: f32[N], b: f32[N]) { a = x; b = x }
kernel halves(x: f16[N], y: bf16[N]) -> (a: f16[N], b: bf16[N], c: bool[N]) {
  a = f16(f32(x) * 0.5)
  b = bf16(f32(y) * 0.5)
  c = f32(x) > f32(y)
}
kernel pick(k: bool[N], x: f32[N]) -> f32[N] { return x if k else -x }
kernel idiv(a: i32[N], b: i32[N]) -> i32[N] { return a // b }
"""

# A module that needs no renderer: sum of squares of each row, and no error flag.
_ROWSUM = """func.func @rowsum(%x: tensor<?x?xf32>) -> tensor<?xf32> {
  %c0 = arith.constant 0 : index
  %m = tensor.dim %x, %c0 : tensor<?x?xf32>
  %z = arith.constant 0.0 : f32
  %e = tensor.empty(%m) : tensor<?xf32>
  %i = linalg.fill ins(%z : f32) outs(%e : tensor<?xf32>) -> tensor<?xf32>
  %s = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>],
                       iterator_types = ["parallel", "reduction"]} ins(%x : tensor<?x?xf32>) outs(%i : tensor<?xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %q = arith.mulf %a, %a : f32
    %r = arith.addf %acc, %q : f32
    linalg.yield %r : f32
  } -> tensor<?xf32>
  return %s : tensor<?xf32>
}
"""


def _fresh(source: str = _ROWSUM) -> str:
    """``source`` with a unique comment: a cache key no earlier build used."""
    return f"// {uuid.uuid4()}\n{source}"


@pytest.fixture(scope="module")
def nn() -> arke.Module:
    return arke.load(stdlib_path("std.nn"))


@pytest.fixture(scope="module")
def extra() -> arke.Module:
    return arke.loads(EXTRA, "<test_iree>")


@pytest.fixture(scope="module")
def lib(nn: arke.Module) -> Any:
    if not iree.iree_available():
        pytest.skip("IREE is not installed")
    return arke.build(nn, target="mlir")


@pytest.fixture(scope="module")
def xlib(extra: arke.Module) -> Any:
    if not iree.iree_available():
        pytest.skip("IREE is not installed")
    return arke.build(extra, target="mlir")


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """A cache of the test's own, and the sources IREE is asked to compile."""
    monkeypatch.setenv("ARKE_CACHE_DIR", str(tmp_path))
    seen: list[str] = []
    real = iree._compile

    def counting(source: str, device: str, arch: str | None) -> bytes:
        seen.append(source)
        return real(source, device, arch)

    monkeypatch.setattr(iree, "_compile", counting)
    return seen


# ---------------------------------------------------------------- without IREE


@pytest.mark.usefixtures("no_iree")
def test_missing_iree_names_the_extra(nn: arke.Module) -> None:
    assert not iree.iree_available() and "mlir" not in runnable_targets()
    for attempt in (lambda: Library(nn, "mlir", None), lambda: arke.build(nn, target="mlir"),
                    lambda: iree.compile_vmfb(_ROWSUM)):
        with pytest.raises(ValueError, match=r"pip install 'arke\[mlir\]'") as caught:
            attempt()
        assert isinstance(caught.value, iree.IREEMissingError)
        assert "iree-base-compiler" in str(caught.value)


def test_device_is_only_for_the_mlir_target(nn: arke.Module) -> None:
    with pytest.raises(ValueError, match="device='cuda' is for the mlir target"):
        Library(nn, "llvm", None, device="cuda")


@needs_iree
def test_an_unknown_device_is_a_clear_error(nn: arke.Module) -> None:
    with pytest.raises(iree.IREEError, match="cpu or cuda"):
        Library(nn, "mlir", None, device="tpu")


# ---------------------------------------------------------------- compiling and the cache


@needs_iree
def test_a_second_build_compiles_nothing(compiles: list[str]) -> None:
    source = _fresh()
    first = iree.compile_vmfb(source)
    assert iree.compile_vmfb(source) == first
    default_cache()._memory.clear()  # the next read comes from the disk
    assert iree.compile_vmfb(source) == first
    assert compiles == [source]


@needs_iree
def test_a_corrupted_entry_warns_and_is_rebuilt(compiles: list[str], tmp_path: Path) -> None:
    source = _fresh()
    first = iree.compile_vmfb(source)
    (entry,) = tmp_path.rglob("*.entry")
    blob = bytearray(entry.read_bytes())
    blob[-100] ^= 0xFF
    entry.write_bytes(bytes(blob))
    default_cache()._memory.clear()
    with pytest.warns(CacheWarning, match="corrupted entry"):
        again = iree.compile_vmfb(source)
    assert again == first and len(compiles) == 2


@needs_iree
def test_extra_iree_flags_reach_the_compiler_and_the_key(compiles: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    source = _fresh()
    plain = iree.compile_vmfb(source)
    monkeypatch.setenv("ARKE_IREE_FLAGS", "--iree-opt-data-tiling")
    tiled = iree.compile_vmfb(source)  # another key: compiled again, not the plain entry
    assert compiles == [source, source] and tiled[:4] == plain[:4]  # (a rowsum has no matmul to tile)
    monkeypatch.setenv("ARKE_IREE_FLAGS", "data-tiling")
    with pytest.raises(ValueError, match=r"ARKE_IREE_FLAGS.*not a flag"):
        iree.compile_vmfb(source)


@needs_iree
def test_a_kernel_built_twice_compiles_once(nn: arke.Module, compiles: list[str]) -> None:
    first = iree.build_kernel(nn.semantic, nn.kernel_map["rmsnorm"], None)
    second = iree.build_kernel(nn.semantic, nn.kernel_map["rmsnorm"], None)
    assert len(compiles) == 1 and first.artifact.source == second.artifact.source


@needs_iree
def test_mlir_that_iree_rejects_is_reported_as_a_compiler_bug() -> None:
    bad = ("func.func @f(%a: tensor<f32>) -> tensor<f32> {\n"
           "  %x = arith.addf %a, %a : tensor<i32>\n  return %x : tensor<f32>\n}")
    with pytest.raises(iree.IREEError, match="bug in arke's mlir renderer") as caught:
        iree.compile_vmfb(_fresh(bad))
    assert "error:" in str(caught.value) and "Invoked with" not in str(caught.value)


@needs_iree
def test_cuda_sm80_compiles_without_a_gpu(compiles: list[str]) -> None:
    import iree.runtime as rt

    data = iree.compile_vmfb(_fresh(), "cuda")  # the default architecture, sm_80
    assert data[:2] == b"PK" and len(compiles) == 1
    module = rt.VmModule.copy_buffer(rt.VmInstance(), data)
    assert "rowsum" in module.function_names
    assert iree.compile_vmfb(_fresh(), "cuda", "sm_86")[:2] == b"PK"


@needs_iree
@pytest.mark.parametrize("arch", ["sm_90", "sm_90a", "sm_100", "ampere", "sm80"])
def test_architectures_iree_lacks_are_clear_errors(arch: str, compiles: list[str]) -> None:
    # checked before IREE sees them: it fails on sm_90 and crashes on names it does not know
    with pytest.raises(iree.IREEError, match="sm_80, sm_86, sm_87, sm_89") as caught:
        iree.compile_vmfb(_ROWSUM, "cuda", arch)
    assert "PTX" in str(caught.value) and "22147" in str(caught.value) and not compiles


@needs_iree
def test_arch_is_only_for_cuda() -> None:
    with pytest.raises(iree.IREEError, match="for device 'cuda'"):
        iree.compile_vmfb(_ROWSUM, "cpu", "sm_80")
    with pytest.raises(iree.IREEError, match="cpu or cuda"):
        iree.compile_vmfb(_ROWSUM, "gpu")


# ---------------------------------------------------------------- running on the CPU


@needs_iree
def test_the_abi_storage_types_match_the_renderer() -> None:
    from arke.targets.mlir.render import abi_dtype

    spelled = {torch.float32: "f32", torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64"}
    for dtype, stored in TORCH_DTYPES.items():
        assert abi_dtype(dtype) == spelled[iree.ABI_VIEWS.get(dtype, stored)], dtype


@needs_iree
def test_rmsnorm_matches_the_interpreter(lib: Any, nn: arke.Module) -> None:
    x, w = torch.randn(7, 33), torch.randn(33)
    rmsnorm = nn.kernels["rmsnorm"]
    assert_conforms(lib.rmsnorm(x, w, eps=1e-5), rmsnorm, x, w, eps=1e-5)
    for _ in range(3):  # the library's fast path (a remembered signature) gives the same
        assert_conforms(lib.rmsnorm(x, w), rmsnorm, x, w)
    got = lib.rmsnorm(x.numpy(), w.numpy())
    assert isinstance(got, np.ndarray)
    assert_conforms(got, rmsnorm, x.numpy(), w.numpy())


@needs_iree
def test_views_and_unaligned_tensors_are_read_correctly(lib: Any, nn: arke.Module) -> None:
    base = torch.randn(9, 41)
    # a slice, a column-major view, and a contiguous tensor 4 bytes past IREE's 64-byte alignment
    for x in (base[1:, 3:36], base.t().contiguous().t()[:, :40], base.flatten()[1:].view(8, 46)):
        w = torch.randn(x.shape[1])
        assert_conforms(lib.rmsnorm(x, w), nn.kernels["rmsnorm"], x.contiguous(), w)


@needs_iree
def test_out_is_written_and_returned(lib: Any, nn: arke.Module) -> None:
    x, w = torch.randn(4, 16), torch.randn(16)
    out = torch.full((4, 16), float("nan"))
    assert lib.rmsnorm(x, w, out=out) is out
    assert_conforms(out, nn.kernels["rmsnorm"], x, w)
    with pytest.raises(GuardError, match="shape"):
        lib.rmsnorm(x, w, out=torch.empty(4, 15))
    with pytest.raises(GuardError, match="overlaps"):
        lib.rmsnorm(x, w, out=x)


@needs_iree
def test_out_takes_one_tensor_per_result(xlib: Any) -> None:
    x = torch.randn(6)
    a, b = torch.empty(6), torch.empty(6)
    assert xlib.both(x, out=(a, b)) == (a, b)
    assert torch.equal(a, x) and torch.equal(b, x)


@needs_iree
def test_bf16_in_and_out(lib: Any, nn: arke.Module) -> None:
    x, w = torch.randn(5, 24).to(torch.bfloat16), torch.randn(12, 24).to(torch.bfloat16)
    got = lib.linear_bf16(x, w)
    assert got.dtype == torch.bfloat16 and got.shape == (5, 12)
    assert torch.equal(got, nn.kernels["linear_bf16"](x, w))
    out = torch.empty(5, 12, dtype=torch.bfloat16)
    assert lib.linear_bf16(x, w, out=out) is out and torch.equal(out, got)


@needs_iree
def test_f16_bf16_and_bool_cross_as_their_storage(xlib: Any, extra: arke.Module) -> None:
    x, y = torch.randn(10).to(torch.float16), torch.randn(10).to(torch.bfloat16)
    got, want = xlib.halves(x, y), extra.kernels["halves"](x, y)
    assert [g.dtype for g in got] == [torch.float16, torch.bfloat16, torch.bool]
    for g, r in zip(got, want):
        assert torch.equal(g, r)
    k, v = torch.tensor([True, False, True]), torch.tensor([1.0, 2.0, 3.0])
    assert torch.equal(xlib.pick(k, v), torch.tensor([1.0, -2.0, 3.0]))


@needs_iree
def test_results_never_alias_inputs_or_each_other(xlib: Any) -> None:
    x = torch.randn(8)
    y = xlib.ident(x)
    assert torch.equal(y, x) and y.data_ptr() != x.data_ptr()
    a, b = xlib.both(x)
    a += 1
    assert torch.equal(b, x)


@needs_iree
def test_an_out_of_range_id_is_the_interpreters_guard_error(lib: Any) -> None:
    table = torch.randn(5, 3)
    assert lib.kernels["embedding"].variant(-1).artifact.meta["errors"] == "1"
    assert torch.equal(lib.embedding(torch.tensor([4, 0]), table), table[[4, 0]])
    with pytest.raises(GuardError, match="outside its axis 0 of size 5") as caught:
        lib.embedding(torch.tensor([0, 7, 1]), table)
    assert caught.value.rule == "index"


@needs_iree
def test_integer_division_by_zero_is_a_guard_error(xlib: Any) -> None:
    a = torch.tensor([7, -7, 9], dtype=torch.int32)
    assert torch.equal(xlib.idiv(a, torch.tensor([2, 2, 4], dtype=torch.int32)),
                       torch.tensor([3, -4, 2], dtype=torch.int32))
    with pytest.raises(GuardError):
        xlib.idiv(a, torch.tensor([2, 0, 4], dtype=torch.int32))


@needs_iree
def test_threads_is_accepted(lib: Any, nn: arke.Module) -> None:
    x, w = torch.randn(3, 8), torch.randn(8)
    assert_conforms(lib.rmsnorm(x, w, threads=3), nn.kernels["rmsnorm"], x, w)
    kernel = lib.kernels["rmsnorm"].variant(-1)
    assert isinstance(kernel, iree.IREEKernel)
    assert_conforms(kernel(x, w, threads=1), nn.kernels["rmsnorm"], x, w)
    assert len({id(lib.kernels["rmsnorm"].variant(-1)) for _ in range(2)}) == 1


@needs_iree
def test_the_device_copy_path_gives_the_same_results(lib: Any, xlib: Any) -> None:
    # what a CUDA kernel does with its arguments (host copies through IREE's allocator),
    # exercised on the CPU device so it runs without a GPU
    from arke.runtime.guards import prepare_args

    for library, name, arrays in ((lib, "rmsnorm", (torch.randn(3, 8), torch.randn(8))),
                                  (xlib, "halves", (torch.randn(4).half(), torch.randn(4).bfloat16()))):
        kernel = library.kernels[name].variant(-1)
        args, _, _ = prepare_args(kernel.plan.function, arrays, {})
        inputs = [args[n] for n, _ in kernel._params]
        for a, b in zip(kernel._invoke_device(inputs), kernel._invoke_host(inputs)):
            assert torch.equal(a, b)


# ---------------------------------------------------------------- CUDA


@needs_iree
def test_cuda_without_a_gpu_says_so(nn: arke.Module) -> None:
    if iree.cuda_runnable():
        pytest.skip("a CUDA GPU is present")
    with pytest.raises(iree.IREEError, match="no CUDA GPU is present"):
        arke.build(nn, target="mlir", device="cuda")


@needs_iree
def test_cuda_runs_rmsnorm_and_bf16(nn: arke.Module) -> None:
    if not iree.cuda_runnable():
        pytest.skip("no CUDA GPU (IREE's cuda driver found none)")
    lib = arke.build(nn, target="mlir", device="cuda")
    x, w = torch.randn(6, 32), torch.randn(32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_conforms(lib.rmsnorm(x, w), nn.kernels["rmsnorm"], x, w)
    xb, wb = torch.randn(4, 16).bfloat16(), torch.randn(8, 16).bfloat16()
    assert torch.equal(lib.linear_bf16(xb, wb), nn.kernels["linear_bf16"](xb, wb))
    if torch.cuda.is_available():
        got = lib.rmsnorm(x.cuda(), w.cuda())
        assert got.device.type == "cuda"
        assert_conforms(got.cpu(), nn.kernels["rmsnorm"], x, w)
