"""Sums over several reduce axes on the CUDA-C target, which does not offer batch-reduce contractions
(spec/codegen.md §2): its plan keeps each such sum the generic loop nest, whose CUDA C gives the
interpreter's numbers (compiled for the host) and compiles with NVRTC for sm_80 and sm_90 without
spills. The kernels are tests/targets/test_batch_reduce_targets.py's.
"""

from __future__ import annotations

import cuda_host
import pytest
from codegen_support import assert_conforms, text_module
from gpu_support import ARCHS, assert_assembles_without_spills
from test_batch_reduce_targets import SOURCE, _inputs

from arke.plan.contraction import Contraction
from arke.plan.dispatch import make_plan
from arke.targets.cuda import nvrtc
from arke.targets.cuda.render import RENDERER

CASES = [("moe_down", {"E": 3, "T": 5, "F": 37, "D": 33}), ("three", {"B": 2, "M": 3, "I": 2, "J": 3, "C": 5, "N": 7}),
         ("narrow", {"E": 2, "T": 3, "F": 9, "D": 17}), ("grouped", {"G": 2, "E": 4, "T": 3, "F": 7, "D": 5})]


def _plan(name: str) -> object:
    mod = text_module(SOURCE)
    return make_plan(mod.semantic, mod.kernel_map[name], None, families=RENDERER.families)


@pytest.mark.skipif(not cuda_host.available(), reason="no g++")
@pytest.mark.parametrize(("name", "dims"), CASES, ids=[c[0] for c in CASES])
def test_host_cuda_sums_over_several_axes(name: str, dims: dict[str, int]) -> None:
    plan = _plan(name)
    assert not any(isinstance(d.pattern, Contraction) for d in plan.dispatches)  # type: ignore[attr-defined]
    args = _inputs(name, dims)
    got, err = cuda_host.run(text_module(SOURCE), name, *args)
    assert err == 0
    assert_conforms(got, text_module(SOURCE).kernels[name], *args, what=f"cuda (host) {name}")


@pytest.mark.skipif(not nvrtc.available() or nvrtc.ptxas_path() is None, reason="no NVRTC or ptxas")
@pytest.mark.parametrize("arch", ARCHS)
def test_nvrtc_compiles_them_without_spills(arch: str) -> None:
    for name, _ in CASES:
        source = str(RENDERER.render(_plan(name)).source)  # type: ignore[arg-type]
        assert_assembles_without_spills(nvrtc.compile_ptx(source, arch, kernel=name), arch)
