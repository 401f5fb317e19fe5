"""Bits and unsigned dtypes in the CUDA C target without a GPU: the host-compiled C against the
interpreter (bit for bit on integers, every integer dtype, ragged sizes), a shift count out of
range raises the error word, and NVRTC compiles the kernels for sm_80 and sm_90 with no spills."""

from __future__ import annotations

from functools import cache

import cuda_host
import numpy as np
import pytest
from codegen_support import assert_conforms, seeded, text_module
from gpu_support import ARCHS, assert_assembles_without_spills
from test_bits import INT4_SHAPES, INTS, MIXED, OPS, int4_inputs, ints, ops_inputs

from arke.targets.cuda import nvrtc
from arke.targets.cuda.render import RENDERER

needs_gxx = pytest.mark.skipif(not cuda_host.available(), reason="no g++")
needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="no NVRTC (pip install 'arke[cuda]')")
needs_ptxas = pytest.mark.skipif(nvrtc.ptxas_path() is None, reason="no ptxas (it ships with Triton)")


@cache
def module(text: str) -> object:
    return text_module(text)


def host(name: str, text: str, *args: object) -> object:
    got, err = cuda_host.run(module(text), name, *args)
    assert err == 0, f"{name}: the error word was raised on in-range inputs"
    return got


@needs_gxx
@pytest.mark.parametrize("t", INTS)
def test_host_bits_match_interpreter(t: str) -> None:
    text = OPS.format(t=t)
    for n in (3, 4097):
        a, b, c = ops_inputs(t, n)
        assert_conforms(host(f"ops_{t}", text, a, b, c), module(text).kernels[f"ops_{t}"], a, b, c, what=f"cuda {t}")


@needs_gxx
def test_host_mixed_reductions_and_int4_match_interpreter() -> None:
    m = module(MIXED)
    rng = seeded("cuda-mixed")
    a, b, c, d = ints("u8", 4097, rng), ints("i8", 4097, rng), ints("u32", 4097, rng), ints("i32", 4097, rng)
    x = np.abs(rng.standard_normal(4097) * 100).astype(np.float32)
    assert_conforms(host("mixed", MIXED, a, b, c, d, x), m.kernels["mixed"], a, b, c, d, x, what="cuda mixed")
    for rows, cols in ((3, 17), (3, 4097)):
        ra, rc = ints("u8", rows * cols, rng).reshape(rows, cols), ints("u32", rows * cols, rng).reshape(rows, cols)
        assert_conforms(host("reduce_u", MIXED, ra, rc), m.kernels["reduce_u"], ra, rc, what="cuda reduce_u")
    for dims in INT4_SHAPES:
        xs, w, scale = int4_inputs(dims, "cuda")
        assert_conforms(host("int4_linear", MIXED, xs, w, scale), m.kernels["int4_linear"], xs, w, scale,
                        what=f"cuda int4 {dims}")


@needs_gxx
def test_host_shift_count_out_of_range_raises_the_error_word() -> None:
    a = np.arange(4, dtype=np.uint32)
    _, err = cuda_host.run(module(MIXED), "shift_by", a, np.array([0, 32, 1, 2], dtype=np.int64))
    assert err == 1
    _, err = cuda_host.run(module(MIXED), "shift_by", a, np.array([0, -1, 1, 2], dtype=np.int64))
    assert err == 1
    got, err = cuda_host.run(module(MIXED), "shift_by", a, np.array([0, 31, 1, 2], dtype=np.int64))
    assert err == 0
    np.testing.assert_array_equal(got, [0, 1 << 31, 4, 12])


KERNELS = [(OPS.format(t=t), f"ops_{t}") for t in INTS] + [(MIXED, k) for k in
                                                            ("mixed", "reduce_u", "int4_linear", "unpack_s4")]


@needs_nvrtc
@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(("text", "name"), KERNELS, ids=[k for _, k in KERNELS])
def test_nvrtc_compiles_bits_without_spills(text: str, name: str, arch: str) -> None:
    from arke.plan.dispatch import make_plan

    m = module(text)
    plan = make_plan(m.semantic, m.kernel_map[name], None, families=RENDERER.families)
    ptx = nvrtc.compile_ptx(str(RENDERER.render(plan).source), arch, kernel=name)
    assert f".target {arch}" in ptx
    assert_assembles_without_spills(ptx, arch)
