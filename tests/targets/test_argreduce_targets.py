"""Arg-reductions (``argmax``/``argmin``, spec §8.3) on every runnable target against the
interpreter, positions exactly: every input dtype and kind of row (ties, NaN, infinities, signed
zeros, integer extremes), rows and columns, ragged shapes (N = 4097 after many full vectors,
M = 3), 1 and 2 threads; the composed kernels (a gather of the value, a count, computed and
boolean bodies, an axis that may be empty); and the CUDA C, run on the host and compiled for
sm_80 and sm_90 without spills."""

from __future__ import annotations

from typing import Any

import cuda_host
import numpy as np
import pytest
from argreduce_support import COMPOSED, DTYPES, kinds, rows_source, values
from codegen_support import RUNNABLE, assert_conforms, build, seeded, text_module
from gpu_support import ARCHS, assert_assembles_without_spills

from arke.targets.cuda import nvrtc
from arke.targets.cuda.render import RENDERER

NAMES = ("amax", "amin", "cmax", "cmin")
SHAPES = [(3, 4097), (6, 33)]
CASES = [(d, k, s) for d in DTYPES for k in kinds(d) for s in SHAPES] + [(d, "random", (1, 1)) for d in DTYPES]


def _sampled_kinds(dtype: str) -> tuple[str, ...]:
    """Two value kinds per dtype, rotating so that the float (integer) dtypes together cover every kind."""
    ks, i = kinds(dtype), DTYPES.index(dtype)
    return ks[2 * i % len(ks)], ks[(2 * i + 1) % len(ks)]


def _id(case: tuple[str, str, tuple[int, int]]) -> str:
    dtype, kind, (m, n) = case
    return f"{dtype}-{kind}-{m}x{n}"


@pytest.mark.parametrize("target", RUNNABLE)
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_positions_equal_the_interpreter(target: str, case: tuple[str, str, tuple[int, int]]) -> None:
    dtype, kind, shape = case
    if target == "triton" and shape[1] > 33 and kind not in _sampled_kinds(dtype):
        pytest.skip("long rows in Triton's CPU interpreter: two kinds per dtype, every kind over the dtypes")
    module = text_module(rows_source(dtype))
    x = values(kind, dtype, shape, seeded("argreduce-targets", *case))
    lib = build(module, target)
    # columns of a long row are a launch per column in Triton's CPU interpreter: rows only there
    for name in NAMES if shape[1] <= 33 else NAMES[:2]:
        kernel = f"{name}_{dtype}"
        for threads in (1, 2):
            got = lib.kernels[kernel](x, threads=threads)
            assert_conforms(got, module.kernels[kernel], x, what=f"{target} {kernel} {kind} threads={threads}")


def composed_inputs(rng: np.random.Generator) -> dict[str, tuple[Any, ...]]:
    logits = values("nan", "f32", (5, 4097), rng)
    label = np.asarray(rng.integers(0, 4097, 5), dtype=np.int64)
    return {
        "greedy_step": (logits, label),
        "nearest": (values("ties", "f16", (3, 4097), rng), np.array([0.5, -1.0, 9.0], dtype=np.float16)),
        "value_and_position": (values("inf", "bf16", (6, 33), rng),),
        "tail": (values("ties", "f32", (3, 17), rng), values("zeros", "f32", (3, 16), rng)),
    }


@pytest.mark.parametrize("target", RUNNABLE)
def test_composed_kernels_equal_the_interpreter(target: str) -> None:
    module = text_module(COMPOSED)
    lib = build(module, target)
    for name, args in composed_inputs(seeded("argreduce-composed-targets")).items():
        assert_conforms(lib.kernels[name](*args), module.kernels[name], *args, what=f"{target} {name}")
    empty = (np.ones((2, 1), dtype=np.float32), np.ones((2, 0), dtype=np.float32))
    assert_conforms(lib.kernels["tail"](*empty), module.kernels["tail"], *empty, what=f"{target} tail, empty axis")


# ---------------------------------------------------------------- CUDA C without a GPU

needs_host = pytest.mark.skipif(not cuda_host.available(), reason="no g++")


@needs_host
@pytest.mark.parametrize("case", [c for c in CASES if c[1] in ("random", "nan", "ties", "extreme")], ids=_id)
def test_cuda_c_on_the_host_equals_the_interpreter(case: tuple[str, str, tuple[int, int]]) -> None:
    dtype, kind, shape = case
    module = text_module(rows_source(dtype))
    x = values(kind, dtype, shape, seeded("argreduce-cuda-host", *case))
    # the host runs every thread of a launch in turn: columns (a block per column) only on a short row
    for name in NAMES if shape[1] <= 33 else NAMES[:2]:
        got, err = cuda_host.run(module, f"{name}_{dtype}", x)
        assert err == 0
        assert_conforms(got, module.kernels[f"{name}_{dtype}"], x, what=f"cuda (host) {name}_{dtype} {kind}")


@needs_host
def test_composed_cuda_c_on_the_host_equals_the_interpreter() -> None:
    module = text_module(COMPOSED)
    for name, args in composed_inputs(seeded("argreduce-composed-host")).items():
        got, err = cuda_host.run(module, name, *args)
        assert err == 0
        assert_conforms(got, module.kernels[name], *args, what=f"cuda (host) {name}")


@pytest.mark.skipif(not nvrtc.available() or nvrtc.ptxas_path() is None, reason="no NVRTC or ptxas")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", ["rows", "composed"])
def test_cuda_c_compiles_without_spills(source: str, arch: str) -> None:
    from arke.plan.dispatch import make_plan

    texts = [rows_source(d) for d in DTYPES] if source == "rows" else [COMPOSED]
    for text in texts:
        module = text_module(text)
        for kernel, ir_name in module.kernel_map.items():
            plan = make_plan(module.semantic, ir_name, None, families=RENDERER.families)
            ptx = nvrtc.compile_ptx(str(RENDERER.render(plan).source), arch, kernel=kernel)
            assert_assembles_without_spills(ptx, arch)
