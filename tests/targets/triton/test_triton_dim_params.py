"""Dim parameters and declared shapes in the Triton target, compiled ahead of time for sm_90 and sm_80
with no GPU and no spills (their numbers under the interpreter are test_dim_params_targets.py's)."""

from __future__ import annotations

import pytest
from codegen_support import text_module
from test_dim_params_targets import DIMS

from arke.plan.dispatch import make_plan
from arke.targets.triton import aot as triton_aot
from arke.targets.triton.render import RENDERER as TRITON

NAMES = ["group_norm", "pair_norm", "rope", "last_k", "grid"]


@pytest.mark.parametrize("name", NAMES)
def test_dim_parameters_compile_for_sm90_and_sm80_without_spills(name: str) -> None:
    mod = text_module(DIMS)
    plan = make_plan(mod.semantic, mod.kernel_map[name], None, families=TRITON.families)
    artifact = TRITON.render(plan)
    entries = triton_aot.compile_artifact_archs(artifact, plan, ["sm_90", "sm_80"])
    assert [e.arch for e in entries] == ["sm_90"] * len(artifact.launches) + ["sm_80"] * len(artifact.launches)
    assert all(e.cubin and ".entry" in e.ptx for e in entries)
    assert all(e.spills == 0 for e in entries)
