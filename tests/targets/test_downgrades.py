"""Visible downgrades (AK4014): a strategy decision no dispatch of its kernel honours is a warning at the
decision, from ``arke.check`` when the plan shows it and from ``arke.build`` (a Python warning carrying
the code) otherwise; the targets' tables (``Target.takes``) agree with ``honours``, ``uses``, their
renderers' families and ``legal_values``."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import arke
from arke.ir import strategy as sir
from arke.lang.checker import stdlib_path
from arke.plan.dispatch import make_plan
from arke.plan.families import TOPK
from arke.targets import base as targets
from arke.targets import downgrades
from arke.targets.downgrades import StrategyDowngradeWarning
from arke.targets.space import FUSED, SINGLE, dispatch_family, honours_of, uses_of

ROOT = Path(__file__).resolve().parents[2]

# a contraction and a rows dispatch: no attention core
KERNEL = """\
kernel centred(x: f32[M, K], w: f32[N, K]) -> f32[M, N] {
  y[m, n] = sum(x[m, i] * w[n, i] for i)
  top[m] = max(y[m, n] for n)
  return y[m, n] - top[m]
}
"""
ON_LLVM = KERNEL + """
@strategy(centred, target = llvm) {
  tile m = 4, n = 64
  algorithm = split_kv
  split i = 4
}
"""
EVERY_TARGET = KERNEL + """
@strategy(centred) {
  algorithm = split_kv
  split i = 4
  warps = 4
  tile m = 4
}
"""


def _warnings(source: str) -> list[tuple[str, int, int, str]]:
    return [(d.code, d.span.line, d.span.col, d.message) for d in arke.check(source) if not d.is_error]


def _call(source: str, calls: int) -> None:
    """Build ``source`` for llvm and call its kernel ``calls`` times (compiling its variant once)."""
    import torch

    lib = arke.build(arke.loads(source), target="llvm")
    x, w = torch.randn(9, 5), torch.randn(3, 5)
    for _ in range(calls):
        lib.centred(x, w)


def _built_warnings(source: str, calls: int = 2) -> list[StrategyDowngradeWarning]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _call(source, calls)
    return [c.message for c in caught if isinstance(c.message, StrategyDowngradeWarning)]


# ---------------------------------------------------------------- akc check


def test_split_kv_and_split_on_a_kernel_without_attention_warn_at_check_at_each_decision() -> None:
    got = _warnings(ON_LLVM)
    assert [(code, line, col) for code, line, col, _ in got] == [("AK4014", 9, 3), ("AK4014", 10, 3)]
    assert "no attention core" in got[0][3] and "`centred`" in got[0][3] and "`llvm`" in got[0][3]
    assert "split i = 4" in got[1][3] and "depth" in got[1][3]
    hint = next(d.hint for d in arke.check(ON_LLVM) if d.span.line == 10)
    assert hint is not None and "attention dispatches on the key index" in hint and "contraction [y]" in hint


def test_a_strategy_for_every_target_warns_at_check_only_where_no_target_takes_it() -> None:
    got = _warnings(EVERY_TARGET)
    # split i: mlir splits any reduced loop; warps: triton and cuda take it; tile m: every target
    assert [(code, line) for code, line, _, _ in got] == [("AK4014", 8)]
    assert "on any target" in got[0][3]


def test_an_index_decision_among_several_points_at_its_item() -> None:
    source = KERNEL + "@strategy(centred, target = llvm) {\n  tile m = 4, i = 64\n  unroll m = 2, i = 4\n}\n"
    got = _warnings(source)
    assert [(code, line, col) for code, line, col, _ in got] == [("AK4014", 8, 10)], got  # `m = 2`


def test_honoured_decisions_are_quiet() -> None:
    source = KERNEL + ("@strategy(centred, target = llvm) {\n  tile m = 4, n = 64, i = 128\n  vectorize n = 16\n"
                       "  unroll i = 4\n  pack x\n  parallel n\n  threads = 2\n}\n"
                       "@strategy(centred, target = triton) { tile m = 32, n = 64, i = 32; warps = 4; stages = 2 }\n")
    assert _warnings(source) == []


@pytest.mark.parametrize("path", [*sorted((ROOT / "examples").glob("*.ak")),
                                  *sorted(stdlib_path("std.nn").parent.glob("*.ak"))], ids=lambda p: p.name)
def test_examples_and_the_standard_library_have_no_downgrades(path: Path) -> None:
    assert [str(d) for d in arke.check(path) if d.code == downgrades.CODE] == []


def test_check_with_strategies_imports_no_torch_triton_or_llvmlite(tmp_path: Path) -> None:
    (tmp_path / "k.ak").write_text(ON_LLVM + EVERY_TARGET.replace(KERNEL, ""), encoding="utf-8")
    code = (
        "import sys\n"
        "import arke\n"
        f"codes = sorted({{d.code for d in arke.check({str(tmp_path / 'k.ak')!r})}})\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'llvmlite'))\n"
        "print('CODES', codes, 'HEAVY', heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "NO_COLOR": "1"})
    assert proc.stdout.splitlines()[-1] == "CODES ['AK4014'] HEAVY []", proc.stderr


# ---------------------------------------------------------------- arke.build


def test_arke_build_warns_with_the_code_once_per_decision() -> None:
    got = _built_warnings(ON_LLVM)
    assert [w.code for w in got] == ["AK4014", "AK4014"]  # two calls, one compile: each decision once
    assert [downgrades.words(w.downgrade.decision) for w in got] == ["algorithm = split_kv", "split i = 4"]
    assert all(w.downgrade.kernel == "centred" and w.downgrade.target == "llvm" for w in got)
    assert str(got[0]).startswith("AK4014: `algorithm = split_kv` has no effect on kernel `centred` on target `llvm`")


def test_arke_build_warns_for_what_only_the_target_shows() -> None:
    with pytest.warns(StrategyDowngradeWarning) as caught:
        _call(EVERY_TARGET, 1)
    said = {downgrades.words(w.message.downgrade.decision): str(w.message) for w in caught.list
            if isinstance(w.message, StrategyDowngradeWarning)}
    assert sorted(said) == ["algorithm = split_kv", "split i = 4", "warps = 4"]  # tile m is honoured
    assert said["warps = 4"].startswith("AK4014: `warps = 4` has no effect on kernel `centred` on target `llvm`")


def test_the_defaults_and_honoured_strategies_build_without_warnings() -> None:
    assert _built_warnings(KERNEL + "@strategy(centred, target = llvm) { tile m = 4; vectorize n = 16 }\n") == []
    assert _built_warnings(KERNEL) == []


def test_build_time_leaves_out_what_the_check_reported() -> None:
    module = arke.loads(EVERY_TARGET)
    strategy = module.strategies.strategies[0]
    llvm = targets.get("llvm")
    at_check = [downgrades.words(g.decision) for g in downgrades.check_time(module.semantic, "centred", strategy)]
    at_build = [downgrades.words(g.decision) for g in downgrades.build_time(llvm, module.semantic, "centred", strategy)]
    assert at_check == ["algorithm = split_kv"]
    assert at_build == ["split i = 4", "warps = 4"]
    gpu = downgrades.build_time(llvm, module.semantic, "centred", strategy, arch="sm_90")
    assert "tile m = 4" in [downgrades.words(g.decision) for g in gpu]  # the GPU flavour takes no decisions


# ---------------------------------------------------------------- the tables


def _dispatch(source: str, kernel: str, target: str = "llvm", arch: str | None = None) -> list[object]:
    module = arke.loads(source)
    t = targets.get(target)
    return list(make_plan(module.semantic, module.kernel_map[kernel], None, t.fused_families(arch)).dispatches)


def test_llvm_contraction_and_attention_take_what_their_renderers_read() -> None:
    llvm = targets.get("llvm")
    contraction, rows = _dispatch(KERNEL, "centred")
    assert (dispatch_family(contraction), dispatch_family(rows)) == ("contraction", "rows")  # type: ignore[arg-type]
    takes = [("tile", "m"), ("tile", "n"), ("tile", "i"), ("vectorize", "n"), ("unroll", "i"), ("pack", "x"),
             ("pack", "w"), ("parallel", "n")]
    for kind, subject in takes:
        assert llvm.honoured(sir.Decision(kind, subject, None), contraction) is None, (kind, subject)  # type: ignore[arg-type]
    for kind, subject in (("vectorize", "m"), ("unroll", "n"), ("parallel", "m"), ("split", "i")):
        assert llvm.honoured(sir.Decision(kind, subject, None), contraction), (kind, subject)  # type: ignore[arg-type]
    attention = arke.load(ROOT / "examples" / "attention.ak")
    [core] = make_plan(attention.semantic, "attention", None).dispatches
    split = sir.Decision("split", "j", 8)
    assert llvm.honoured(split, core) is None and llvm.honoured(sir.Decision("split", "d", 8), core)
    assert llvm.honoured(split, core, (sir.Decision("algorithm", None, "flash"), split)) == \
        "`algorithm = flash` does not use it"
    assert targets.get("triton").honoured(sir.Decision("algorithm", None, "materialized"), core)  # runs as flash


@pytest.mark.parametrize("name", targets.names())
def test_honours_and_uses_come_from_the_takes_table(name: str) -> None:
    target = targets.get(name)
    assert target.honours == honours_of(target.takes)
    assert dict(target.uses) == uses_of(target.takes)
    assert set(target.takes) <= FUSED | {SINGLE, TOPK}  # a native top-k has its own row


@pytest.mark.parametrize("name", targets.names())
@pytest.mark.parametrize("arch", [None, "sm_90"])
def test_fused_families_are_the_renderers(name: str, arch: str | None) -> None:
    target = targets.get(name)
    if arch is not None and not target.takes_arch:
        pytest.skip("no architecture to choose")
    try:
        renderer = target.renderer(arch)
    except ImportError as err:
        pytest.skip(f"renderer needs {err.name}")
    assert target.fused_families(arch) == renderer.families


@pytest.mark.parametrize("name", targets.names())
@pytest.mark.parametrize(("module", "kernel"), [("std.nn", "linear"), ("std.nn", "rmsnorm"), ("std.nn", "softmax"),
                                                ("std.attention", "causal_attention")])
def test_legal_values_are_empty_exactly_where_the_decision_is_dropped(name: str, module: str, kernel: str) -> None:
    mod = arke.load(stdlib_path(module))
    target = targets.get(name)
    dims = {"M": 33, "K": 17, "N": 64, "B": 2, "H": 8, "G": 2, "S": 5, "T": 33, "D": 16}
    for dispatch in make_plan(mod.semantic, mod.kernel_map[kernel], None, target.fused_families()).dispatches:
        roles = target.subject_roles(dispatch)
        for kind, spec in sir.DECISIONS.items():
            pool = sorted(roles["index"]) if spec.subject == "index" else sorted(roles["operand"]) \
                if spec.subject == "operand" else [None]
            for subject in pool:
                dropped = target.honoured(sir.Decision(kind, subject, None), dispatch)
                values = target.legal_values(kind, dispatch, dims, subject)
                if dropped is not None and spec.values != "enum":
                    assert values == (), (name, kind, subject, dropped)
                elif spec.values != "enum" and subject is not None and spec.subject == "index":
                    assert values, (name, kind, subject)


@pytest.mark.parametrize(("decision", "clamped"), [("tile m = 64", False), ("tile n = 100000000", False),
                                                   ("tile k = 9000", False), ("tile m = 16", True)])
def test_a_tile_beyond_what_the_contraction_lowers_warns_and_runs_clamped(decision: str, clamped: bool) -> None:
    """`tile m` is the micro-kernel's register rows (16 at most), `tile n` / `tile k` a task's packed scratch:
    larger values are AK4014 (they ran clamped without a word, or allocated hundreds of GB), and the kernel still
    gives the interpreter's answer."""
    import torch

    src = ("kernel mm(a: f32[M, K], b: f32[K, N]) -> f32[M, N] { return sum(a[m, k] * b[k, n] for k) }\n"
           f"@strategy(mm, target = llvm) {{ {decision} }}\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lib = arke.build(arke.loads(src, "<tiles>"))
        a, b = torch.randn(33, 70), torch.randn(70, 20)
        torch.testing.assert_close(lib.mm(a, b), a @ b, rtol=1e-5, atol=1e-4)
    found = [w for w in caught if issubclass(w.category, StrategyDowngradeWarning)]
    assert (not found) if clamped else (found and "at most" in str(found[0].message))


def test_a_triton_block_that_runs_rounded_up_warns_with_the_value_that_runs() -> None:
    """Triton's blocks are powers of two (tl.dot's at least 16): `tile m = 24` runs as 32, said as AK4014, and
    the tuner's legal values are the blocks that run."""
    src = ("kernel mm(a: f32[M, K], b: f32[K, N]) -> f32[M, N] { return sum(a[m, k] * b[k, n] for k) }\n"
           "@strategy(mm, target = triton) { tile m = 24, n = 64, k = 1 }\n")
    said = {d.span.col: d.message for d in arke.check(src) if d.code == "AK4014"}
    assert set(said) == {39, 55}, said  # `tile n = 64` runs as written
    assert "would run as 32" in said[39] and "would run as 16" in said[55] and "does not run as written" in said[39]
    mod = arke.loads(src.splitlines()[0] + "\n")
    target = targets.get("triton")
    (dispatch,) = make_plan(mod.semantic, mod.kernel_map["mm"], None, target.fused_families()).dispatches
    values = target.legal_values("tile", dispatch, {"M": 5, "K": 40, "N": 8}, "m")
    assert values and all(v >= 16 and v & (v - 1) == 0 for v in values), values


def test_a_dropped_decision_is_not_handed_to_llvm() -> None:
    """`vectorize n` on a scan's recurrence is AK4014: the loop metadata must not ask LLVM for it either (its own
    'loop not vectorized' warning went to stderr, raw)."""
    src = ("kernel cs(x: f32[M, N]) -> f32[M, N] { return cumsum(x[m, n] for n) }\n"
           "@strategy(cs, target = llvm) { vectorize n = 2 }\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lib = arke.build(arke.loads(src, "<scan-hint>"))
    assert "llvm.loop.vectorize.width" not in lib.kernels["cs"].source()
