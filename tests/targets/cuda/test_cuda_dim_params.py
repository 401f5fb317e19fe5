"""Dim parameters and declared shapes in the CUDA C target without a GPU: the C compiled for the host
against the interpreter (ragged shapes, several values of one dim parameter through one build, a kernel
whose only inputs are dims), and NVRTC compiles every kernel for sm_80 and sm_90 with no spills."""

from __future__ import annotations

import cuda_host
import numpy as np
import pytest
from codegen_support import assert_conforms, seeded, text_module
from gpu_support import ARCHS, assert_assembles_without_spills
from test_dim_params_targets import DIMS, group_norm_inputs, rope_inputs

from arke.plan.dispatch import make_plan
from arke.targets.cuda import nvrtc
from arke.targets.cuda.render import RENDERER

needs_gxx = pytest.mark.skipif(not cuda_host.available(), reason="no g++")
needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="no NVRTC (pip install 'arke[cuda]')")
needs_ptxas = pytest.mark.skipif(nvrtc.ptxas_path() is None, reason="no ptxas (it ships with Triton)")
NAMES = ("group_norm", "pair_norm", "rope", "last_k", "grid")


def host(name: str, *args: object) -> object:
    got, err = cuda_host.run(text_module(DIMS), name, *args)
    assert err == 0, f"{name}: the error word was raised on in-range inputs"
    return got


@needs_gxx
def test_host_group_norm_conforms_on_ragged_shapes() -> None:
    kernels = text_module(DIMS).kernels
    for shape, groups in (((3, 6, 4097), 3), ((3, 6, 5), 2), ((1, 4, 3), 4)):
        x, w, b = group_norm_inputs(shape)
        assert_conforms(host("group_norm", x, w, b, groups), kernels["group_norm"], x, w, b, groups,
                        what=f"cuda G={groups} {shape}")
    x, w, b = group_norm_inputs((3, 6, 5))
    assert_conforms(host("pair_norm", x, w, b), kernels["pair_norm"], x, w, b, what="cuda pair_norm")


@needs_gxx
def test_host_rope_and_dim_outputs_conform() -> None:
    kernels = text_module(DIMS).kernels
    x, pos = rope_inputs(5, 18)
    assert_conforms(host("rope", x, pos), kernels["rope"], x, pos, what="cuda rope")
    x = seeded("cuda last_k").standard_normal((3, 97)).astype(np.float32)
    for k in (1, 97):
        assert_conforms(host("last_k", x, k), kernels["last_k"], x, k, what=f"cuda last_k K={k}")
    np.testing.assert_array_equal(host("grid", 2, 5), np.arange(10).reshape(2, 5))


@needs_nvrtc
@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", NAMES)
def test_nvrtc_compiles_dim_parameters_without_spills(name: str, arch: str) -> None:
    m = text_module(DIMS)
    plan = make_plan(m.semantic, m.kernel_map[name], None, families=RENDERER.families)
    ptx = nvrtc.compile_ptx(str(RENDERER.render(plan).source), arch, kernel=name)
    assert f".target {arch}" in ptx
    assert_assembles_without_spills(ptx, arch)
