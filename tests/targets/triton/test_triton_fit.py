"""The Triton target's fit step (arke/targets/triton/fit.py, spec/codegen.md §9.5): a launch that spills at
its rendered options is recompiled with other free ones, never those the strategy fixed (AK4015 then).

The compile cases are few and small (a pointwise map whose strategy sets a block that spills at 4 warps),
compiled ahead of time for sm_90 only: the moves themselves are checked without a compiler."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from codegen_support import text_module

from arke.plan.dispatch import make_plan
from arke.plan.variants import variants
from arke.targets.artifact import LaunchSpec
from arke.targets.triton.fit import MIN_BLOCK, SpillWarning, fit_plan, free_options, moves
from arke.targets.triton.render import RENDERER as TRITON

#: 16384 lanes per program: 4 warps hold 128 values per thread and spill (42 words on sm_90), 8 do not.
WIDE = """
kernel wide(x: f32[N], w: f32[N]) -> f32[N] { return x[n] * w[n] + 1.0 }
kernel pinned(x: f32[N], w: f32[N]) -> f32[N] { return x[n] * w[n] + 1.0 }

@strategy(wide, target = triton) { tile n = 16384 }
@strategy(pinned, target = triton) {
  tile n = 16384
  warps = 4
}
"""


def planned(name: str) -> object:
    mod = text_module(WIDE)
    [(_, strategy)] = variants(mod, mod.kernel_map[name], "triton")
    return make_plan(mod.semantic, mod.kernel_map[name], strategy, families=TRITON.families)


def test_moves_keep_what_the_strategy_fixed() -> None:
    launch = LaunchSpec("k0_d0", None, options=(("BLOCK_M", 64), ("BLOCK_N", 64), ("BLOCK_K", 16), ("num_warps", 4),
                                                ("num_stages", 3)), fixed=("BLOCK_M", "num_stages"))
    free = free_options(launch)
    assert free == ["BLOCK_N", "BLOCK_K", "num_warps"]
    got = moves(dict(launch.options), free)
    assert [m["num_warps"] for m in got] == [8, 4]  # more warps first, then the largest free block halved
    assert got[1]["BLOCK_N"] == 32 and got[1]["BLOCK_M"] == 64 and all(m["num_stages"] == 3 for m in got)
    assert all(m["BLOCK_K"] >= MIN_BLOCK for m in got)  # BLOCK_K is at the smallest block already
    covered = dataclasses.replace(launch, covers=(("BLOCK_N", "D"),))
    assert "BLOCK_N" not in free_options(covered)  # a block sized at each launch is no fit's to change


def test_renderer_marks_the_options_a_strategy_set() -> None:
    [launch] = TRITON.render(planned("pinned")).launches  # type: ignore[arg-type]
    assert set(launch.fixed) == {"BLOCK", "num_warps"}
    [launch] = TRITON.render(planned("wide")).launches  # type: ignore[arg-type]
    assert launch.fixed == ("BLOCK",)


def test_a_spilling_launch_gets_more_warps_and_keeps_its_tile() -> None:
    plan = planned("wide")
    [before] = TRITON.render(plan).launches  # type: ignore[arg-type]
    assert dict(before.options)["num_warps"] == 4
    fitted = fit_plan(plan, ["sm_90"])  # type: ignore[arg-type]
    assert fitted.unfit == () and fitted.changes == (("k0_d0", "num_warps", 4, 8),)
    [entry] = fitted.entries
    assert entry.spills == 0 and dict(entry.options) == {"BLOCK": 16384, "num_warps": 8, "num_stages": 2}
    assert fitted.plan.fitted == (("k0_d0", "num_warps", 8),)
    assert dict(fitted.artifact.launches[0].options)["num_warps"] == 8  # what the runtime launches


def test_a_fixed_strategy_is_AK4015_not_changed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.warns(SpillWarning) as said:
        fitted = fit_plan(planned("pinned"), ["sm_90"], warn=True)  # type: ignore[arg-type]
    [unfit] = fitted.unfit
    assert unfit.spills > 0 and dict(unfit.options)["BLOCK"] == 16384 and dict(unfit.options)["num_warps"] == 4
    assert [c[1] for c in fitted.changes] in ([], ["num_stages"])  # only the stages were free
    assert said[0].message.code == "AK4015"  # type: ignore[union-attr]
    from arke.cli.app import main

    path = tmp_path / "pinned.ak"
    path.write_text(WIDE, encoding="utf-8")
    status = main(["build", str(path), "--target", "triton", "--kernel", "pinned", "--arch", "sm_90", "--emit",
                   "ptx", "-o", str(tmp_path / "pinned.ptx")])
    err = capsys.readouterr().err
    code = "AK4015"  # a build-time code: tests/lang/test_errors.py's BUILD_TIME points here
    assert status == 0 and f"warning[{code}]" in err, err
    assert f"{path}:7:3:" in err and "the strategy fixes BLOCK, num_warps" in err  # at `tile n = 16384`


def test_a_launch_warning_points_at_its_own_strategy() -> None:
    """AK4012/AK4015 of the second strategy's launch point at that strategy's decision, the defaults' at the
    kernel (they pointed at the first strategy, whose launches were fine)."""
    from arke.targets.triton.build_cli import decision_span

    text = ("kernel mm(a: f32[M, K], b: f32[K, N]) -> f32[M, N] { return sum(a[m, k] * b[k, n] for k) }\n"
            "@strategy(mm, target = triton, when M == 1) {\n  tile m = 16\n}\n"
            "@strategy(mm, target = triton) {\n  warps = 1\n  tile m = 128\n}\n")
    assert decision_span("f.ak", text, "mm", (("tile", None),), 0).line == 3
    assert decision_span("f.ak", text, "mm", (("tile", None),), 1).line == 7
    assert decision_span("f.ak", text, "mm", (("warps", None),), 1).line == 6
    assert decision_span("f.ak", text, "mm", (("tile", None),), None).line == 1
