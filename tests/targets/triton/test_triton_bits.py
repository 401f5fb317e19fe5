"""Bits and unsigned dtypes in the Triton target, compiled ahead of time for sm_90 and sm_80 with
no GPU (its numbers under the interpreter are tests/targets/test_bits.py's)."""

from __future__ import annotations

import pytest
from codegen_support import text_module
from test_bits import INTS, MIXED, OPS

from arke.plan.dispatch import make_plan
from arke.targets.triton import aot as triton_aot
from arke.targets.triton.fit import fit_plan
from arke.targets.triton.render import RENDERER as TRITON

KERNELS = [pytest.param(OPS.format(t=t), f"ops_{t}", id=f"ops_{t}") for t in INTS] + [
    pytest.param(MIXED, k, id=k) for k in ("mixed", "reduce_u", "unpack_s4", "int4_linear")]


def compiled(text: str, name: str) -> list[triton_aot.CompiledEntry]:
    """The kernel's launches compiled for sm_90 and sm_80, fitted (the int4 linear's contraction with a
    dequantising prologue spills at 4 warps on both archs, f32 weights too: 8 warps fit)."""
    mod = text_module(text)
    plan = make_plan(mod.semantic, mod.kernel_map[name], None, families=TRITON.families)
    fitted = fit_plan(plan, ["sm_90", "sm_80"])
    artifact, entries = fitted.artifact, fitted.entries
    assert [e.arch for e in entries] == ["sm_90"] * len(artifact.launches) + ["sm_80"] * len(artifact.launches)
    assert all(e.cubin and ".entry" in e.ptx for e in entries)
    return entries


@pytest.mark.parametrize(("text", "name"), KERNELS)
def test_bits_compile_for_sm90_and_sm80_without_spills(text: str, name: str) -> None:
    assert all(e.spills == 0 for e in compiled(text, name))
