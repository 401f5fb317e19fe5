"""``sin`` and ``cos`` of every f32 argument on every runnable target and on the CUDA C run on the host,
against the interpreter by the tolerance rule and against NumPy in f64: the MLIR and CUDA-C renderers
reduce the argument exactly in f64 (arke/targets/turns.py). Before, MLIR took a multiple of 2π off in f64
(inf at 1e30) and CUDA-C took ``sinpi(x / π)`` (0 past 2**53); both compiled for sm_80 and sm_90 too."""

from __future__ import annotations

import math

import cuda_host
import numpy as np
import pytest
import torch
from codegen_support import RUNNABLE, assert_conforms, build, text_module
from gpu_support import ARCHS, assert_assembles_without_spills

from arke.targets.cuda import nvrtc
from arke.targets.turns import CHUNK_BITS, CHUNKS

SOURCE = """
kernel trig(x: f32[N]) -> (s: f32[N], c: f32[N]) {
  s = sin(x)
  c = cos(x)
}
"""
#: The tolerance rule's allowance for sin and cos of an exact argument, in units of 2**-24 (as Triton's test).
ALLOWED = 32


def arguments() -> np.ndarray:
    """Small, mid-range and huge arguments of both signs, random f32 bit patterns and special values."""
    rng = np.random.default_rng(11)
    huge = np.exp(rng.uniform(0.0, 88.0, 1024)) * rng.choice([-1.0, 1.0], 1024)
    bits = rng.integers(0, 2 ** 32, 1024, dtype=np.uint64).astype(np.uint32).view(np.float32)
    bits = bits[np.isfinite(bits) & ((np.abs(bits) > 1e-37) | (bits == 0))]  # mlir flushes subnormals (§7)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 3.4028235e38, -3.4028235e38, np.pi, 1e12, 1e15, 1e25, 1e30,
               -7.0e22, 16367173 * 2.0 ** 72, 2.0 ** 53, 2.0 ** 24 + 2, 131071.0, 1e-30]
    return np.concatenate([rng.uniform(-10, 10, 512), rng.uniform(-3e5, 3e5, 512), huge, bits,
                           special]).astype(np.float32)


def _check(s: np.ndarray, c: np.ndarray, x: np.ndarray, what: str) -> None:
    finite = np.isfinite(x)
    for got, exact in ((s, np.sin), (c, np.cos)):
        err = np.abs(got[finite].astype(np.float64) - exact(x[finite].astype(np.float64))) * 2.0 ** 24
        assert err.max() <= ALLOWED / 4, f"{what}: {exact.__name__}({x[finite][err.argmax()]!r}) off by {err.max():.1f}"
        assert np.isnan(got[~finite]).all()
    assert np.signbit(s[x == 0]).tolist() == np.signbit(x[x == 0]).tolist()  # sin(±0) = ±0


def test_the_chunks_are_the_digits_of_one_over_two_pi() -> None:
    assert all(math.frexp(c)[0] * 2 ** CHUNK_BITS == int(math.frexp(c)[0] * 2 ** CHUNK_BITS) for c in CHUNKS)
    assert abs(sum(CHUNKS) - 1 / (2 * math.pi)) < 1e-17


@pytest.mark.parametrize("target", RUNNABLE)
def test_sin_and_cos_of_every_f32_on_the_targets(target: str) -> None:
    x = arguments()
    module = text_module(SOURCE)
    s, c = build(module, target).trig(torch.from_numpy(x))
    _check(s.numpy(), c.numpy(), x, target)
    assert_conforms((s, c), module.kernels["trig"], torch.from_numpy(x), what=f"{target} sin/cos")


@pytest.mark.skipif(not cuda_host.available(), reason="no host C++ compiler for the CUDA C")
def test_sin_and_cos_of_every_f32_in_the_cuda_c_on_the_host() -> None:
    x = arguments()
    module = text_module(SOURCE)
    (s, c), err = cuda_host.run(module, "trig", x)
    assert err == 0
    _check(np.asarray(s), np.asarray(c), x, "cuda (host)")
    assert_conforms((torch.from_numpy(np.asarray(s)), torch.from_numpy(np.asarray(c))), module.kernels["trig"],
                    torch.from_numpy(x), what="cuda (host) sin/cos")


@pytest.mark.skipif(not nvrtc.available() or nvrtc.ptxas_path() is None, reason="no NVRTC or ptxas")
@pytest.mark.parametrize("arch", ARCHS)
def test_the_cuda_trig_compiles_without_local_memory(arch: str) -> None:
    from arke.plan.dispatch import make_plan
    from arke.targets.cuda.render import RENDERER

    module = text_module(SOURCE)
    plan = make_plan(module.semantic, module.kernel_map["trig"], None, families=RENDERER.families)
    assert_assembles_without_spills(nvrtc.compile_ptx(str(RENDERER.render(plan).source), arch, kernel="trig"), arch)
