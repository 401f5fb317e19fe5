"""The Triton target's scans (``tl.associative_scan``, arke/targets/triton/scan.py) compiled ahead of time
for sm_90 and sm_80 with no GPU: every form of tests/support/scan_cases.py (sums, products, max/min,
exclusive, booleans, 8-bit to 64-bit integers, the recurrence's pairs, the selective scan) makes PTX and
a cubin that spills nothing. Their numbers under the interpreter are tests/targets/test_scans.py's."""

from __future__ import annotations

import pytest
import scan_cases

pytest.importorskip("triton")

from arke.plan.dispatch import make_plan
from arke.targets.triton import aot as triton_aot
from arke.targets.triton.render import RENDERER as TRITON


@pytest.mark.parametrize("name", ["floats", "ints", "recur", "selective_scan"])
def test_scans_compile_for_sm90_and_sm80_without_spills(name: str) -> None:
    mod = scan_cases.module()
    plan = make_plan(mod.semantic, mod.kernel_map[name], None, families=TRITON.families)
    artifact = TRITON.render(plan)
    scans = [d for d in plan.dispatches if d.family == "scan"]
    assert scans and "tl.associative_scan" in str(artifact.source)
    entries = triton_aot.compile_artifact_archs(artifact, plan, ["sm_90", "sm_80"])
    assert [e.arch for e in entries] == ["sm_90"] * len(artifact.launches) + ["sm_80"] * len(artifact.launches)
    for e in entries:
        assert e.cubin and ".entry" in e.ptx, e.entry
        assert e.spills == 0, f"{e.entry} on {e.arch} spills {e.spills} bytes"
