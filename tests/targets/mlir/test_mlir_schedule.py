"""The MLIR target's strategy half: `parallel_dims`, transform scripts, notes and their checks.

Unit tests read the script text :func:`arke.targets.mlir.schedule.schedule` writes for small
kernels; the end-to-end tests render kernels with the MLIR renderer, apply the script with
``iree-opt --transform-interpreter`` (from the venv's IREE; skipped without it) and verify
the result with ``iree-opt`` again.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import arke
from arke.plan.dispatch import KernelPlan, make_plan
from arke.targets.mlir.schedule import Note, OpLoops, note_diagnostics, parallel_dims, schedule, transform_module

ROOT = Path(__file__).resolve().parents[3]
IREE_OPT = Path(sys.executable).parent / "iree-opt"


def _kernels(path: str) -> str:
    """An example file's kernels, without its strategies."""
    return (ROOT / path).read_text(encoding="utf-8").split("\n@strategy")[0] + "\n"


RMS = _kernels("examples/rmsnorm.ak")  # rmsnorm and softmax
ATT = _kernels("examples/attention.ak")
MM = "kernel mm(a: f32[M, K], b: f32[K, N]) -> f32[M, N] {\n  return sum(a[m, k] * b[k, n] for k)\n}\n"
EMB = "kernel emb(table: f32[V, D], ids: i64[T]) -> f32[T, D] {\n  e[t, d] = table[ids[t], d]\n  return e\n}\n"

RMS_OPS = [OpLoops("0", (("m", "parallel"), ("n", "reduction"))), OpLoops("1", (("m", "parallel"), ("n", "parallel")))]
MM_OPS = [OpLoops("0", (("m", "parallel"), ("n", "parallel"), ("k", "reduction")))]
# grouped-query attention's scores: `h` split into the group `h` and the head in it `h.r`
ATT_OPS = [OpLoops("0", (("b", "parallel"), ("h", "parallel"), ("h.r", "parallel"), ("i", "parallel"),
                         ("j", "parallel"), ("d", "reduction"))),
           OpLoops("1", (("b", "parallel"), ("h", "parallel"), ("i", "parallel"), ("j", "reduction")))]


def plan_of(source: str, kernel: str, families: frozenset[str] | None = frozenset()) -> KernelPlan:
    """The plan of ``kernel`` under its strategy for `mlir` (or for every target), if any."""
    m = arke.loads(source)
    strategy = next((s for s in m.strategies.strategies if s.kernel == kernel and s.target in (None, "mlir")), None)
    return make_plan(m.semantic, kernel, strategy, families=families)


def script_lines(script: str) -> list[str]:
    return [line.strip() for line in script.splitlines()]


def ops_lines(script: str, op: str) -> list[str]:
    """The transform lines after op ``op``'s match, up to the next op's."""
    lines = script_lines(script)
    start = next(k for k, line in enumerate(lines) if f'arke.value = "{op}"' in line)
    end = next((k for k in range(start + 1, len(lines)) if "arke.value" in lines[k] or "yield" in lines[k]),
               len(lines))
    return lines[start + 1:end]


# ---------------------------------------------------------------- parallel_dims


@pytest.mark.parametrize(("source", "kernel", "dims"), [
    (RMS, "rmsnorm", ("m",)),
    (RMS, "softmax", ("m",)),
    (ATT, "attention", ("b", "h", "i")),
    (MM, "mm", ("m", "n")),
    # a transposed write keeps the slices along `m` independent
    ("kernel f(x: f32[M, N]) -> f32[N, M] {\n  s[m] = sum(x[m, n] for n)\n  t[n, m] = x[m, n] / s[m]\n"
     "  return t\n}\n", "f", ("m",)),
    # every row reads row 0 of `s`: no axis is independent
    ("kernel f(x: f32[M, N]) -> f32[M, N] {\n  s[m] = sum(x[m, n] for n)\n  return x[m, n] / s[0]\n}\n", "f", ()),
    # a sum over all of `s`
    ("kernel f(x: f32[M, N]) -> f32[M] {\n  s[m] = sum(x[m, n] for n)\n  return sum(s[k] for k) + s[m]\n}\n",
     "f", ()),
])
def test_parallel_dims(source: str, kernel: str, dims: tuple[str, ...]) -> None:
    m = arke.loads(source)
    assert parallel_dims(m.semantic.get(kernel)) == dims
    assert parallel_dims(make_plan(m.semantic, kernel).function) == dims


# ---------------------------------------------------------------- the attribute


@pytest.mark.parametrize(("strategy", "attribute"), [
    ("", '{parallel_dims = ["m"]}'),
    ("parallel m\n  vectorize n = 16", '{parallel_dims = ["m"]}'),
    ("parallel m = 4", '{parallel_dims = ["m"], parallelism = 4}'),
    ("parallel m\n  threads = 8", '{parallel_dims = ["m"], parallelism = 8}'),
    ("parallel m = 2\n  threads = 8", '{parallel_dims = ["m"], parallelism = 8}'),  # threads is the worker count
])
def test_attribute_states_parallelism_only_when_asked(strategy: str, attribute: str) -> None:
    plan = plan_of(RMS + f"@strategy(rmsnorm, target = mlir) {{\n  {strategy}\n}}\n", "rmsnorm")
    assert schedule(plan, RMS_OPS).attribute == attribute


# ---------------------------------------------------------------- the script


def test_script_is_a_transform_module_calling_the_kernels_sequence() -> None:
    sched = schedule(plan_of(RMS, "rmsnorm"), RMS_OPS)
    assert sched.script.startswith("module attributes {transform.with_named_sequence} {")
    assert "transform.named_sequence @arke_rmsnorm(" in sched.sequence
    assert "transform.named_sequence @__transform_main(" in sched.script
    assert "transform.include @arke_rmsnorm failures(propagate) (%root)" in sched.script
    assert 'attributes {sym_name = "rmsnorm"}' in sched.script
    assert "arke.value" not in sched.script  # no decision: no op is touched
    both = transform_module([sched.sequence, schedule(plan_of(RMS, "softmax"), RMS_OPS).sequence])
    assert both.count("transform.include") == 2 and "@arke_softmax" in both


def test_parallel_vectorize_levels() -> None:
    plan = plan_of(RMS + "@strategy(rmsnorm, target = mlir) {\n  parallel m\n  vectorize n = 16\n}\n", "rmsnorm")
    sched = schedule(plan, RMS_OPS)
    for op in ("0", "1"):
        lines = ops_lines(sched.script, op)
        assert "tile_using_forall" in lines[0] and "tile_sizes [1, 0]" in lines[0]
        assert "tile_using_for" in lines[1] and "tile_sizes [1, 16]" in lines[1]
        assert lines[2].startswith("transform.structured.vectorize") and "vector_sizes [1, 16]" in lines[2]
    assert sched.notes == ()


def test_parallel_takes_its_count_then_threads_then_tile() -> None:
    def first(strategy: str) -> str:
        plan = plan_of(MM + f"@strategy(mm, target = mlir) {{\n  {strategy}\n}}\n", "mm")
        return ops_lines(schedule(plan, MM_OPS).script, "0")[0]

    assert "num_threads [4, 0, 0]" in first("parallel m = 4")
    assert "num_threads [8, 0, 0]" in first("parallel m\n  threads = 8")
    assert "num_threads [8, 0, 0]" in first("threads = 8")  # alone: the first parallel dim
    assert "tile_sizes [32, 0, 0]" in first("parallel m\n  tile m = 32")
    assert "tile_sizes [1, 1, 0]" in first("parallel m, n")
    # `tile m` used as the chunk of the forall does not tile again
    plan = plan_of(MM + "@strategy(mm, target = mlir) {\n  parallel m\n  tile m = 32, k = 8\n}\n", "mm")
    assert "tile_sizes [0, 0, 8]" in ops_lines(schedule(plan, MM_OPS).script, "0")[1]


def test_split_is_a_partial_reduction_in_chunks() -> None:
    plan = plan_of(MM + "@strategy(mm, target = mlir) {\n  split k = 4\n  tile k = 16\n}\n", "mm")
    lines = ops_lines(schedule(plan, MM_OPS).script, "0")
    assert "tile_reduction_using_forall" in lines[0] and "num_threads = [0, 0, 4]" in lines[0]
    partial = lines[0].split(",")[1].strip()
    assert lines[1].startswith("%tiled") and f"tile_using_for {partial} tile_sizes [0, 0, 16]" in lines[1]


def test_unroll_innermost_loops_first() -> None:
    plan = plan_of(RMS + "@strategy(rmsnorm, target = mlir) {\n  unroll m = 2, n = 4\n}\n", "rmsnorm")
    lines = ops_lines(schedule(plan, RMS_OPS).script, "0")
    tiled = re.match(r"%\w+, (%\w+), (%\w+) = transform.structured.tile_using_for %\w+ tile_sizes \[1, 1\]",
                     lines[0])
    assert tiled, lines
    outer, inner = tiled.groups()
    assert lines[1:] == [f"transform.loop.unroll {inner} factor = 4 : !transform.any_op",
                         f"transform.loop.unroll {outer} factor = 2 : !transform.any_op"]
    # with a vector level, its loops are the innermost
    plan = plan_of(RMS + "@strategy(rmsnorm, target = mlir) {\n  vectorize n = 8\n  unroll n = 2\n}\n", "rmsnorm")
    lines = ops_lines(schedule(plan, RMS_OPS).script, "0")
    assert len(lines) == 3 and "tile_sizes [1, 8]" in lines[0] and "factor = 2" in lines[2]
    assert lines[2].split()[1] == lines[0].split(",")[2].split("=")[0].strip()


def test_decisions_touch_only_the_ops_with_their_loops() -> None:
    # `split j` concerns the reductions over `j`; `parallel h` the group loop `h`, never `h.r`
    plan = plan_of(ATT + "@strategy(attention, target = mlir) {\n  parallel h = 2\n  split j = 4\n}\n", "attention")
    sched = schedule(plan, ATT_OPS)
    scores, row_max = ops_lines(sched.script, "0"), ops_lines(sched.script, "1")
    assert len(scores) == 1 and "num_threads [0, 2, 0, 0, 0, 0]" in scores[0]
    assert "num_threads [0, 2, 0, 0]" in row_max[0] and "num_threads = [0, 0, 0, 4]" in row_max[1]
    assert sched.notes == ()


@pytest.mark.parametrize(("strategy", "decision", "subject"), [
    ("algorithm = flash", "algorithm", None),
    ("algorithm = split_kv\n  split j = 8", "algorithm", None),
    ("warps = 8\n  stages = 3", "warps", None),
])
def test_what_cannot_be_expressed_is_a_note(strategy: str, decision: str, subject: str | None) -> None:
    plan = plan_of(ATT + f"@strategy(attention) {{\n  {strategy}\n}}\n", "attention")
    notes = schedule(plan, ATT_OPS).notes
    assert any(n.decision == decision and n.subject == subject and n.message for n in notes), notes


def test_pack_and_an_unused_index_are_notes() -> None:
    plan = plan_of(MM + "@strategy(mm) {\n  pack b\n  tile n = 64\n}\n", "mm")
    # as if the renderer had made no loop over `n`
    notes = schedule(plan, [OpLoops("0", (("m", "parallel"), ("k", "reduction")))]).notes
    assert [(n.decision, n.subject) for n in notes] == [("pack", "b"), ("tile", "n")]
    assert schedule(plan_of(MM + "@strategy(mm) {\n  algorithm = materialized\n}\n", "mm"), MM_OPS).notes == ()


def test_notes_are_AK4013_warnings_at_their_decisions() -> None:
    source = ATT + "@strategy(attention) {\n  algorithm = flash\n  warps = 8\n}\n"
    plan = plan_of(source, "attention")
    diags = note_diagnostics(schedule(plan, ATT_OPS).notes, "attention", "attention.ak", source)
    assert [d.code for d in diags] == ["AK4013", "AK4013"]
    assert all(not d.is_error for d in diags)
    lines = source.split("\n")
    assert [lines[d.span.line - 1].strip() for d in diags] == ["algorithm = flash", "warps = 8"]
    pack = note_diagnostics([Note("pack", "b", "`pack b` is not expressed")], "mm", "mm.ak",
                            MM + "@strategy(mm) {\n  pack b\n}\n")
    assert pack[0].code == "AK4013" and (pack[0].span.line, pack[0].span.col) == (5, 8)


# ---------------------------------------------------------------- the checker


def _codes(source: str) -> list[tuple[str, bool]]:
    return [(d.code, d.is_error) for d in arke.check(source)]


def test_pack_has_no_effect_on_mlir() -> None:
    assert _codes(MM + "@strategy(mm, target = mlir) {\n  pack b\n}\n") == [("AK4009", False)]
    assert _codes(MM + "@strategy(mm, target = llvm) {\n  pack b\n}\n") == []


def test_mlir_lowers_only_the_materialized_algorithm() -> None:
    for algorithm in ("flash", "split_kv"):
        source = ATT + f"@strategy(attention, target = mlir) {{\n  algorithm = {algorithm}\n}}\n"
        diags = arke.check(source)
        assert [(d.code, d.is_error) for d in diags] == [("AK4004", True)]
        assert diags[0].hint and "materialized" in diags[0].hint
        fixed = source[:diags[0].span.start] + diags[0].replacement + source[diags[0].span.end:]  # type: ignore[operator]
        assert arke.check(fixed) == []
    assert _codes(ATT + "@strategy(attention, target = mlir) {\n  algorithm = materialized\n}\n") == []
    assert _codes(ATT + "@strategy(attention) {\n  algorithm = flash\n}\n") == []


# ---------------------------------------------------------------- end to end, with iree-opt


def _renderer() -> Any:
    return pytest.importorskip("arke.targets.mlir.render").RENDERER


def _apply(payload: str, script: str, tmp_path: Path) -> str:
    """``payload`` after the transform ``script``, checked to verify."""
    if not IREE_OPT.exists():
        pytest.skip(f"no iree-opt next to {sys.executable}")
    (tmp_path / "payload.mlir").write_text(payload)
    (tmp_path / "script.mlir").write_text(script)
    done = subprocess.run([str(IREE_OPT), f"--transform-preload-library=transform-library-paths={tmp_path}/script.mlir",
                           "--transform-interpreter", str(tmp_path / "payload.mlir")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{done.stderr[:4000]}\n--- script:\n{script}"
    check = subprocess.run([str(IREE_OPT), "-"], input=done.stdout, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stderr[:4000]
    return done.stdout


E2E = [
    # examples/rmsnorm.ak's llvm strategies, for mlir
    ("rmsnorm", RMS, "rmsnorm", "parallel m\n  vectorize n = 16", ("scf.forall", "vector.mask")),
    ("softmax", RMS, "softmax", "parallel m\n  vectorize n = 16", ("scf.forall", "vector.mask")),
    ("rmsnorm-threads-split-unroll", RMS, "rmsnorm", "threads = 4\n  split n = 4\n  unroll n = 4",
     ("scf.forall", "linalg.reduce")),
    ("attention-tile-parallel", ATT, "attention", "parallel b, h\n  tile i = 16, j = 32", ("scf.forall", "scf.for")),
    ("attention-split", ATT, "attention", "parallel h = 2\n  split j = 4", ("scf.forall", "linalg.reduce")),
    ("attention-vectorize-unroll", ATT, "attention", "parallel i\n  vectorize d = 8\n  unroll j = 2",
     ("scf.forall", "vector.mask")),
    ("attention-every-target", ATT, "attention", "algorithm = flash\n  tile i = 64\n  warps = 4", ("scf.for",)),
    ("matmul-everything", MM, "mm",
     "parallel m = 4\n  tile n = 64, k = 32\n  vectorize n = 16\n  unroll k = 4\n  split k = 2",
     ("scf.forall", "linalg.reduce", "vector.mask")),
    ("matmul-threads", MM, "mm", "threads = 8", ("scf.forall",)),
    # a gather (`tensor.extract` in the region) vectorises too, along either loop
    ("gather-inner", EMB, "emb", "parallel t = 2\n  vectorize d = 8", ("scf.forall", "vector.mask")),
    ("gather-outer", EMB, "emb", "vectorize t = 4\n  unroll d = 2", ("vector.mask",)),
]


@pytest.mark.parametrize(("source", "kernel", "strategy", "expect"), [e[1:] for e in E2E], ids=[e[0] for e in E2E])
def test_script_applies_and_verifies(source: str, kernel: str, strategy: str, expect: tuple[str, ...],
                                     tmp_path: Path) -> None:
    renderer = _renderer()
    target = "" if "algorithm = flash" in strategy else ", target = mlir"  # flash is AK4004 on mlir
    art = renderer.render(plan_of(source + f"@strategy({kernel}{target}) {{\n  {strategy}\n}}\n", kernel,
                                  renderer.families))
    out = _apply(art.source, art.meta["transform"], tmp_path)
    for what in expect:
        assert what in out, f"no {what} after the transform"
    notes = json.loads(art.meta["notes"])
    if kernel == "attention" and "flash" in strategy:
        assert {n["decision"] for n in notes} == {"algorithm", "warps"}
    else:
        assert notes == []
    assert "arke.schedule" in art.source and "parallel_dims = [" in art.source


def test_one_script_for_two_kernels(tmp_path: Path) -> None:
    """Value tags repeat across kernels (both have a `0`): a kernel's sequence touches only its function."""
    renderer = _renderer()
    source = RMS + "@strategy(rmsnorm, target = mlir) {\n  parallel m = 2\n}\n"
    funcs, sequences = [], []
    for kernel, ops in (("rmsnorm", RMS_OPS), ("softmax", [])):
        plan = plan_of(source, kernel, renderer.families)
        art = renderer.render(plan)
        assert re.findall(r'arke.value = "(\w+)"', art.source)[:2] == ["0", "1"]
        funcs.append("\n".join(art.source.splitlines()[1:-1]))  # the func.func inside the module
        sequences.append(schedule(plan, ops).sequence)
    out = _apply("module {\n" + "\n".join(funcs) + "\n}\n", transform_module(sequences), tmp_path)
    rms, soft = out.split("func.func @softmax")
    assert rms.count("scf.forall (") == 2 and "scf.forall" not in soft


def test_arke_build_warns_what_the_schedule_drops() -> None:
    """`split n` on a scan's axis has no reduction loop to split. `arke.build` warned it as AK4013 from the
    schedule's notes while `akc check` said nothing; the target now drops it in `honoured`, so it is AK4014, said
    once (the schedule's own note for the same decision is not repeated)."""
    pytest.importorskip("iree.compiler", reason="the mlir target needs IREE (pip install 'arke[mlir]')")
    import warnings

    import numpy as np

    from arke.targets.downgrades import StrategyDowngradeWarning

    module = arke.loads("kernel cs(x: f32[M, N]) -> f32[M, N] { return cumsum(x[m, n] for n) }\n"
                        "@strategy(cs, target = mlir) { split n = 4; parallel m }\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        arke.build(module, target="mlir").cs(np.ones((3, 5), np.float32))
    found = [w.message for w in caught if isinstance(w.message, StrategyDowngradeWarning)]
    assert [w.code for w in found] == ["AK4014"] and "iree_linalg_ext.scan" in str(found[0]), found
