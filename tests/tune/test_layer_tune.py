"""Whole-layer plans (arke.models.tune, arke.tune.layer): a small layer tuned for a prefill and a decode
shape records every plan it measures and a chosen plan per shape; a layer built afterwards runs that
plan (and stays the reference's layer); the plan written as source checks clean and is the same
plan; the worker catches a wrong layer; bad arguments are clear errors; akc tune-model on a folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import arke.models
from arke.cli import app as cli
from arke.models import plans
from arke.models.config import LayerConfig, random_weights
from arke.models.layer import REFERENCE, CompiledLayer
from arke.tune import db as tdb
from arke.tune.layer_worker import TOLERANCE
from arke.tune.worker import Worker

CONFIG = LayerConfig(hidden=64, heads=8, kv_heads=2, head_dim=16, intermediate=96, eps=1e-5,
                     inv_freq=tuple(1 / 10000 ** (i / 8) for i in range(8)))
MAX_SEQ = 64


def _layer(**options: object) -> CompiledLayer:
    return CompiledLayer(CONFIG, random_weights(CONFIG, 1), max_seq=MAX_SEQ, **options)  # type: ignore[arg-type]


def _decisions(plan: tuple[object, ...]) -> list[tuple[str, object]]:
    return sorted((s.kernel, str(s.when), tuple(map(str, s.decisions))) for s in plan)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, str]:
    db = str(tmp_path_factory.mktemp("layer-tune") / "tuning.db")
    result = arke.models.tune(_layer(tuning="off"), prefill=[16], decode_context=[20], budget=4, dispatch_budget=1,
                              db=db, seed=1)
    return result, db


def _each_shape_is_measured_recorded_and_confirmed(tuned: tuple[object, str]) -> None:
    result, db = tuned
    phases = result.phases  # type: ignore[attr-defined]
    assert [p.name for p in phases] == ["prefill 16", "decode at 20"]
    database = tdb.Database(db)
    try:
        for p in phases:
            assert p.result.default.outcome == "ok" and p.result.default.plan == ""  # the defaults first
            assert len(p.result.trials) >= 2
            key = tdb.Key.of(plans.identity(CONFIG, "f32", str(torch.float32)), "llvm", {"B": 1, "T": p.tokens})
            records = database.records(key)
            assert sum(r.outcome != tdb.CHOSEN for r in records) >= len(p.result.trials)
            chosen = database.chosen(key)
            assert chosen is not None and chosen.plan  # the choice, as blocks: the defaults pinned if they stayed
            # a block per kernel call of the shape, whichever won
            assert {s.kernel.split("__")[0] for s in chosen.plan} == {
                "std.decoder." + d.kernel for d in p.dispatches}
            assert p.result.speedup >= 1.0
        # the layer-level space: the attention algorithm per phase and (several cores) the thread count
        assert all(t.plan for p in phases for t in p.result.trials[1:])
    finally:
        database.close()


def _a_layer_built_here_runs_the_chosen_plan(tuned: tuple[object, str], monkeypatch: pytest.MonkeyPatch) -> None:
    result, db = tuned
    monkeypatch.setenv("ARKE_TUNING_DB", db)
    layer = _layer()
    written = plans.strategies(result.plan())  # type: ignore[attr-defined]
    assert layer.plan and _decisions(layer.plan) == _decisions(written)
    assert _layer(tuning="off").plan == ()
    reference = CompiledLayer(CONFIG, random_weights(CONFIG, 1), max_seq=MAX_SEQ, target=REFERENCE)
    g = torch.Generator().manual_seed(5)
    for t, context in ((16, 0), (1, 20)):
        x = torch.randn(1, t, CONFIG.hidden, generator=g)
        pos = (context + torch.arange(t))[None]
        caches = []
        for lay in (layer, reference):
            cache = lay.new_cache(1)
            cache.k[:, :, :context] = 0.5
            cache.v[:, :, :context] = -0.25
            cache.length = context
            caches.append(cache)
        got, want = layer(x, pos, caches[0]), reference(x, pos, caches[1])
        assert float((got - want).abs().max()) <= TOLERANCE["f32"] * float((want - x).abs().max())


def _the_written_plan_is_source_that_checks_and_loads(tuned: tuple[object, str], tmp_path: Path) -> None:
    result, _ = tuned
    file = tmp_path / "plan.ak"
    file.write_text(result.plan())  # type: ignore[attr-defined]
    assert cli.main(["check", str(file)]) == 0
    from_file = _layer(plan=file)
    assert _decisions(from_file.plan) == _decisions(plans.strategies(result.plan()))  # type: ignore[attr-defined]
    assert _decisions(_layer(plan=str(file)).plan) == _decisions(from_file.plan)


def test_a_tuned_layer(tuned: tuple[object, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One tuning run (the fixture's), three checks of it: in one test, so it is measured once."""
    _each_shape_is_measured_recorded_and_confirmed(tuned)
    _a_layer_built_here_runs_the_chosen_plan(tuned, monkeypatch)
    _the_written_plan_is_source_that_checks_and_loads(tuned, tmp_path)


def test_plan_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="AK1002"):
        _layer(plan="@strategy(mlp, target = llvm) { tile 1 }\n")
    with pytest.raises(ValueError, match="defines kernels"):
        _layer(plan="kernel f(x: f32[N]) -> f32[N] {\n  return x[n]\n}\n")
    with pytest.raises(ValueError, match="no such plan file"):
        _layer(plan="missing-plan.ak")
    with pytest.raises(ValueError, match="tuning is"):
        _layer(tuning="maybe")


def test_tune_arguments_are_checked(tmp_path: Path) -> None:
    layer, db = _layer(tuning="off"), str(tmp_path / "t.db")
    with pytest.raises(ValueError, match="max_seq"):
        arke.models.tune(layer, prefill=[MAX_SEQ + 1], db=db)
    with pytest.raises(ValueError, match="max_seq"):
        arke.models.tune(layer, decode_context=[MAX_SEQ], db=db)
    with pytest.raises(ValueError, match="at least one shape"):
        arke.models.tune(layer, db=db)
    with pytest.raises(ValueError, match="positive integers"):
        arke.models.tune(layer, prefill=[0], db=db)
    with pytest.raises(ValueError, match="reference"):
        arke.models.tune(CompiledLayer(CONFIG, random_weights(CONFIG), max_seq=8, target=REFERENCE), prefill=[4])


def test_the_worker_catches_a_wrong_layer_and_a_plan_that_fails() -> None:
    layer = _layer(tuning="off")
    request = {"op": "layer", "layer": plans.spec(layer), "calls": [[5, 3]], "samples": 2, "min_sample_s": 0.001}
    worker = Worker()
    try:
        ok = worker.request(request, 300)
        assert ok["status"] == "ok" and len(ok["samples"]) == 2 and "5@3" in ok["calls"]
        wrong = worker.request({**request, "perturb": True}, 300)
        assert wrong["status"] == "mismatch" and "layer's update" in wrong["error"]
        bad = worker.request({**request, "plan": "@strategy(mlp, target = llvm) { tile nope = 4 }\n"}, 300)
        assert bad["status"] == "failed" and "nope" in bad["error"]
    finally:
        worker.stop()


def test_plans_from_another_machine_are_never_used(tmp_path: Path) -> None:
    db = str(tmp_path / "t.db")
    identity = plans.identity(CONFIG, "f32", str(torch.float32))
    key = tdb.Key.of(identity, "llvm", {"B": 1, "T": 8})
    plan = plans.strategies("@strategy(mlp, target = llvm, when N == 8) {\n  threads = 1\n}\n")
    other = tdb.Key(key.kernel, key.target, key.options, key.dims_bucket, "another-machine", key.versions,
                    key.protocol)
    database = tdb.Database(db)
    database.add(tdb.Record(other, {"B": 1, "T": 8}, None, tdb.CHOSEN, (1.0,), plan=plan))
    assert database.chosen_plans(key) == []
    database.add(tdb.Record(key, {"B": 1, "T": 8}, None, tdb.CHOSEN, (1.0,), plan=plan))
    assert [r.plan for r in database.chosen_plans(key)] == [plan]
    database.close()


def test_akc_tune_model_on_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_attention_heads=8, num_key_value_heads=2,
                                   head_dim=16, num_hidden_layers=1, vocab_size=32, max_position_embeddings=128)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "model")
    db, plan = str(tmp_path / "t.db"), tmp_path / "plan.ak"
    code = cli.main(["tune-model", str(tmp_path / "model"), "--prefill", "8", "--budget", "2", "--dispatch-budget",
                     "1", "--max-seq", "32", "--db", db, "--write", str(plan), "--format", "json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["phase"] for p in out["phases"]] == ["prefill 8"] and out["phases"][0]["tuned_s"] > 0
    assert plan.read_text().startswith("import std.decoder") and cli.main(["check", str(plan)]) == 0
    assert cli.main(["tune-model", str(tmp_path / "model"), "--db", db]) == 2  # no shape: a usage error
    # an existing file is never overwritten (checked before tuning), nor are digits other than 0-9 counts
    assert cli.main(["tune-model", str(tmp_path / "model"), "--prefill", "8", "--db", db, "--write", str(plan)]) == 2
    assert "exists" in capsys.readouterr().err and plan.read_text().startswith("import std.decoder")
    assert cli.main(["tune-model", str(tmp_path / "model"), "--prefill", "\u00b2", "--db", db]) == 2
    assert cli.main(["tune-model", str(tmp_path), "--prefill", "8", "--db", db]) == 2  # not a model folder


def test_a_bf16_layer_is_tuned_on_its_own_kernels(tmp_path: Path) -> None:
    """bf16 activations end to end (HalfLayer): its own kernels, its packed weights, its tolerance."""
    from arke.models.layer_half import HalfLayer

    half = HalfLayer(CONFIG, random_weights(CONFIG, 1), dtype=torch.bfloat16, max_seq=MAX_SEQ, tuning="off")
    result = arke.models.tune(half, prefill=[8], budget=2, dispatch_budget=1, db=str(tmp_path / "t.db"))
    phase = result.phases[0]
    assert phase.result.default.outcome == "ok", phase.result.default.note
    assert sum(t.outcome == "ok" for t in phase.result.trials) >= 1
    kernels = {s.kernel for s in plans.strategies(result.plan())}
    assert "std.decoder.swiglu_h__A_bf16" in kernels and "std.decoder.mlp__W_f32" not in kernels


def test_candidates_come_from_a_kernel_search_and_read_the_packed_weights(tmp_path: Path) -> None:
    """A call's candidates: the layer's own decisions first, then points of a kernel-level search of that call
    (recorded in the database), each one that can read the layer's packed weight panels."""
    import arke
    from arke.models.layer import LAYER_SOURCE
    from arke.tune.layer import Phase, _candidates, _unreadable_panels, _variants

    layer, db = _layer(tuning="off"), str(tmp_path / "t.db")
    module = arke.loads(LAYER_SOURCE, "<decoder layer>")
    mlp = [d for d in plans.dispatches(layer, 1, 16) if d.tag == "mlp"]
    phase = Phase("prefill 16", 16, [(16, 0)], mlp)
    panels = {tag: set(v.panel_reads) for tag, v in _variants(module, "llvm", "", mlp).items()}
    assert layer.packed_weights and panels["mlp"]
    _candidates(module, phase, "llvm", 4, None, db, 0, 300.0, panels, lambda _: None)
    found = phase.candidates["mlp"]
    assert found[0] == ()  # the layer's own choice: mlp runs its defaults
    for decisions in found[1:]:
        variants = _variants(module, "llvm", plans.block(mlp[0], "llvm", decisions), mlp)
        assert _unreadable_panels(variants, panels) is None
    database = tdb.Database(db)
    try:
        assert database.count() >= 4  # the kernel-level search's records
    finally:
        database.close()
