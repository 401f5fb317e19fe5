"""The Target protocol and the registry (``arke.targets.base``): what every caller asks a target."""

from __future__ import annotations

import pytest

import arke
from arke.ir import strategy as sir
from arke.lang.checker import stdlib_path
from arke.plan.families import TOPK
from arke.targets import base as targets
from arke.targets.artifact import Artifact, LaunchSpec
from arke.targets.space import rounded_up

DIMS = {"M": 33, "K": 17, "N": 4097, "B": 2, "H": 8, "G": 2, "S": 5, "T": 33, "D": 16}


@pytest.fixture(scope="module")
def nn() -> arke.Module:
    return arke.load(stdlib_path("std.nn"))


@pytest.fixture(scope="module")
def attention() -> arke.Module:
    return arke.load(stdlib_path("std.attention"))


def test_unknown_target_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown target 'cpu'") as info:
        targets.get("cpu")
    assert all(name in str(info.value) for name in targets.names())


def test_llvm_always_runs_here_and_every_other_target_says_why_not() -> None:
    assert "llvm" in targets.runnable()
    for target in targets.all_targets():
        why = target.unavailable()
        assert why is None or (isinstance(why, str) and why), target.name
        if why is not None:
            with pytest.raises(ValueError):
                target.require()


@pytest.mark.parametrize("name", targets.names())
def test_options_are_checked_with_what_each_target_takes(name: str) -> None:
    target = targets.get(name)
    if not target.takes_device:
        with pytest.raises(ValueError, match="device='tpu'"):
            target.check_options("tpu", None)
    if not target.takes_arch:
        with pytest.raises(ValueError, match="arch='sm_90' is for the"):
            target.check_options("cpu", "sm_90")
    else:
        assert target.check_options("cpu", "sm_80") == "sm_80"
    assert target.check_options("cpu", None) is None


@pytest.mark.parametrize("name", targets.names())
def test_the_checker_table_comes_from_the_targets(name: str) -> None:
    target = targets.get(name)
    assert target.honours <= set(sir.DECISIONS)
    for decision in target.honours:
        assert name in targets.honouring(decision)
    for family, taken in target.uses.items():
        assert family in targets.FUSED | {targets.SINGLE, TOPK}  # a native top-k has its own row
        assert taken <= target.honours, f"{name} {family}: {sorted(taken - target.honours)} not honoured"
    for decision, values in target.choices.items():
        assert set(values) < set(sir.DECISIONS[decision].choices)


@pytest.mark.parametrize("name", targets.names())
@pytest.mark.parametrize(("module", "kernel"), [("nn", "linear"), ("nn", "rmsnorm"), ("nn", "gelu"),
                                                ("attention", "causal_attention")])
def test_legal_values_are_legal_and_only_where_a_dispatch_takes_the_decision(
        name: str, module: str, kernel: str, request: pytest.FixtureRequest) -> None:
    mod: arke.Module = request.getfixturevalue(module)
    target = targets.get(name)
    plan = target.plan(mod.semantic, mod.kernel_map[kernel], None)
    for dispatch in plan.dispatches:
        taken = target.decisions_for(dispatch)
        extents = targets.dispatch_extents(dispatch, DIMS)
        operands = sorted(targets.dispatch_operands(dispatch))
        for decision, spec in sir.DECISIONS.items():
            subjects: list[str | None] = (list(extents) if spec.subject == "index" else operands
                                          if spec.subject == "operand" else [None])
            for subject in subjects:
                values = target.legal_values(decision, dispatch, DIMS, subject)
                if decision not in taken:
                    assert values == (), f"{name} {dispatch.family}: {decision} {subject} is not taken: {values}"
                    continue
                for v in values:
                    if spec.values == "enum":
                        assert v in (target.choices.get(decision) or spec.choices)
                    elif spec.values in ("pos", "pow2", "split"):
                        assert isinstance(v, int) and v >= (2 if spec.values == "split" else 1)
                        assert spec.maximum is None or v <= spec.maximum
                        if spec.values == "pow2":
                            assert v & (v - 1) == 0
                        if subject in extents:  # (a GPU block runs as a power of two: the one covering it)
                            entry = target.takes_for(None).get(targets.dispatch_family(dispatch), {}).get(decision)
                            least = entry.powers[0] if entry is not None else 0
                            most = max(extents[subject], 1)
                            assert v <= (rounded_up(most, least) if least else most)


def test_cache_keys_follow_the_source() -> None:
    llvm = targets.get("llvm")
    a = Artifact("llvm", "define void @f() { ret void }\n", (LaunchSpec("f", None),))
    b = Artifact("llvm", "define void @g() { ret void }\n", (LaunchSpec("g", None),))
    assert llvm.cache_key(a) == llvm.cache_key(a) != llvm.cache_key(b)


def test_every_emit_has_an_owner() -> None:
    from arke.cli.build import EMITS

    for emit in EMITS:
        assert targets.for_emit(emit), emit
    assert targets.for_emit("vmfb") == ("mlir",) and "llvm" in targets.for_emit("asm")


def test_build_goes_through_the_registry(nn: arke.Module) -> None:
    lib = arke.build(nn, target="llvm")
    assert lib.backend is targets.get("llvm") and lib.on_host
    with pytest.raises(ValueError, match="unknown target"):
        arke.build(nn, target="tpu")


@pytest.mark.parametrize("name", targets.names())
def test_plans_group_what_the_renderer_renders(name: str) -> None:
    """``fused_families`` (read without importing a renderer, by the checker) is the renderer's own."""
    target = targets.get(name)
    for arch in (None, "sm_90") if target.takes_arch else (None,):
        assert target.fused_families(arch) == target.renderer(arch).families, (name, arch)


@pytest.mark.parametrize("name", targets.names())
def test_honours_and_uses_follow_from_takes(name: str) -> None:
    target = targets.get(name)
    assert target.uses == {family: frozenset(entries) for family, entries in target.takes.items()}
    assert target.honours == frozenset(d for entries in target.takes.values() for d in entries)
