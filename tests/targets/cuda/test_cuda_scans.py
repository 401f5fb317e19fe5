"""CUDA C scans (arke/targets/cuda/scan.py: a block per row, the scanned axis split over its threads,
warp shuffles then a block combine of warp totals, carried across chunks).

* on the host (tests/support/cuda_host.py: fibers for a block's threads, shuffles and barriers as
  rendezvous) against the interpreter, every form and a sample of dtypes of
  tests/support/scan_cases.py at ragged shapes: float sums, products and recurrences within the one
  tolerance rule, max/min (NaN from the first NaN on) and every integer scan value for value;
* NVRTC for sm_80 and sm_90, assembled by ptxas without spills.
"""

from __future__ import annotations

from typing import Any

import cuda_host
import pytest
import scan_cases
from codegen_support import assert_conforms, results
from gpu_support import assert_assembles_without_spills

from arke.plan.dispatch import make_plan
from arke.targets.cuda import nvrtc
from arke.targets.cuda.render import RENDERER

#: the host runs a block's threads as fibers, a few ms a block: the kernel that also scans along its first
#: axis (a block per column) gets rows of 300 (three chunks, a ragged last one) instead of 4097
HOST_CASES = [(n, {"M": 3, "N": 300} if n == "floats" and d.get("N") == 4097 else d) for n, d in scan_cases.CASES]


@pytest.mark.skipif(not cuda_host.available(), reason="no g++")
@pytest.mark.parametrize(("name", "dims"), HOST_CASES, ids=lambda v: str(v))
def test_scans_on_the_host_conform(name: str, dims: dict[str, int]) -> None:
    args = scan_cases.inputs(name, dims)
    got: Any
    got, err = cuda_host.run(scan_cases.module(), name, *args)
    assert err == 0
    reference = scan_cases.module().kernels[name]
    assert_conforms(got, reference, *args, what=f"{name} {dims} on cuda (host)")
    want = results(reference(*args))
    for k in scan_cases.EXACT.get(name, ()):
        scan_cases.assert_exact(results(got)[k], want[k], f"{name} {dims} on cuda (host): result {k}")


def test_a_scan_splits_its_row_over_a_block() -> None:
    plan = make_plan(scan_cases.module().semantic, "recur", None, families=RENDERER.families)
    artifact = RENDERER.render(plan)
    source = str(artifact.source)
    assert source.count("__shfl_up_sync") == 6 and source.count("__syncthreads") == 6  # 3 scans, pairs shuffled
    assert [launch.grid for launch in artifact.launches].count(("M",)) == 3  # each scan: one block per row


@pytest.mark.skipif(not nvrtc.available() or nvrtc.ptxas_path() is None, reason="no NVRTC or ptxas")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", ["floats", "ints", "recur", "selective_scan"])
def test_scans_compile_without_spills(arch: str, name: str) -> None:
    plan = make_plan(scan_cases.module().semantic, name, None, families=RENDERER.families)
    ptx = nvrtc.compile_ptx(str(RENDERER.render(plan).source), arch, kernel=name)
    assert_assembles_without_spills(ptx, arch)
