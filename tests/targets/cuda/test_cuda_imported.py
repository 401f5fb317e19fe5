"""A kernel imported from the standard library (`from std.nn import linear`: its plan is named
``std.nn.linear``) gets C and PTX entries that are identifiers (``std_nn_linear_d0``), on the CUDA-C
target and the LLVM target's NVPTX flavour: run on the host against the interpreter, compiled for sm_90."""

from __future__ import annotations

import cuda_host
import numpy as np
import pytest
from codegen_support import assert_conforms, text_module

from arke.plan.dispatch import make_plan
from arke.targets.cuda import nvrtc
from arke.targets.cuda.render import RENDERER

SOURCE = "from std.nn import linear\n"


def test_the_entries_are_identifiers() -> None:
    module = text_module(SOURCE)
    plan = make_plan(module.semantic, module.kernel_map["linear"], None, families=RENDERER.families)
    entries = [launch.entry for launch in RENDERER.render(plan).launches]
    assert entries and all(e.isidentifier() and e.startswith("std_nn_linear_d0") for e in entries), entries


@pytest.mark.skipif(not cuda_host.available(), reason="no host C++ compiler for the CUDA C")
def test_an_imported_kernel_runs_on_the_host() -> None:
    module = text_module(SOURCE)
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((3, 33)).astype(np.float32), rng.standard_normal((17, 33)).astype(np.float32)
    got, err = cuda_host.run(module, "linear", x, w)
    assert err == 0
    assert_conforms(got, module.kernels["linear"], x, w, what="cuda (host) imported linear")


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC is not installed")
def test_an_imported_kernel_compiles_to_ptx() -> None:
    module = text_module(SOURCE)
    plan = make_plan(module.semantic, module.kernel_map["linear"], None, families=RENDERER.families)
    assert ".entry std_nn_linear_d0" in nvrtc.compile_ptx(str(RENDERER.render(plan).source), "sm_90", kernel="linear")
