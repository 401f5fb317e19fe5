"""Scans on the LLVM target's GPU flavour (arke/targets/llvm/nvptx.py: one thread per row, the row
scanned in sequence in the interpreter's order).

* run on the host (tests/support/nvptx_host.py: the NVPTX module JIT-compiled for this CPU) against
  the interpreter, every form and a sample of dtypes of tests/support/scan_cases.py at ragged shapes:
  float sums, products and recurrences within the one tolerance rule, max/min (NaN from the first NaN
  on) and every integer scan value for value;
* lowered to PTX for sm_80 and sm_90 and assembled by ptxas without spills.
"""

from __future__ import annotations

from typing import Any

import nvptx_host
import pytest
import scan_cases
from codegen_support import assert_conforms, results
from gpu_support import assert_assembles_without_spills

from arke.plan.dispatch import make_plan
from arke.targets.llvm.nvptx import RENDERER
from arke.targets.nvidia import ptx as nvptx


@pytest.mark.parametrize(("name", "dims"), scan_cases.CASES, ids=lambda v: str(v))
def test_scans_on_the_host_conform(name: str, dims: dict[str, int]) -> None:
    args = scan_cases.inputs(name, dims)
    got: Any
    got, err = nvptx_host.run(scan_cases.module(), name, *args)
    assert err == 0
    reference = scan_cases.module().kernels[name]
    assert_conforms(got, reference, *args, what=f"{name} {dims} on llvm nvptx (host)")
    want = results(reference(*args))
    for k in scan_cases.EXACT.get(name, ()):
        scan_cases.assert_exact(results(got)[k], want[k], f"{name} {dims} on llvm nvptx (host): result {k}")


def test_a_scan_is_one_thread_per_row() -> None:
    plan = make_plan(scan_cases.module().semantic, "recur", None, families=RENDERER.families)
    artifact = RENDERER.render(plan)
    scans = [launch for launch in artifact.launches if launch.parallel_extent == "M"]
    assert len(scans) == 3  # each of the three scans along n: one thread per row m


@pytest.mark.skipif(nvptx.ptxas_path() is None, reason="no ptxas (it ships with Triton)")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", ["floats", "ints", "recur", "selective_scan"])
def test_scans_assemble_without_spills(arch: str, name: str) -> None:
    plan = make_plan(scan_cases.module().semantic, name, None, families=RENDERER.families)
    ptx = nvptx.compile_ptx(str(RENDERER.render(plan).source), arch)
    assert_assembles_without_spills(ptx, arch)
