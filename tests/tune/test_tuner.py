"""The tuner end to end (arke.tune): the worker survives crashes and hangs and catches a wrong result;
a small search measures the defaults first, records every point, confirms before replacing the
defaults; its choice written as source checks clean and is the strategy it measured; akc tune."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import arke
from arke.cli import app as cli
from arke.ir import strategy as sir
from arke.tune import db as tdb
from arke.tune.source import strategy_block, when_of
from arke.tune.space import knobs, prune, strategy_of
from arke.tune.worker import Worker

SOURCE = "kernel mm(a: f32[M, K], b: f32[K, N]) -> f32[M, N] {\n  return sum(a[m, k] * b[k, n] for k)\n}\n"
DIMS = {"M": 40, "N": 48, "K": 24}


def _request(**extra: object) -> dict[str, object]:
    return {"source": SOURCE, "kernel": "mm", "target": "llvm", "dims": DIMS, "strategy": "", "samples": 3,
            "min_sample_s": 0.001, **extra}


def test_worker_survives_crash_and_hang_and_catches_a_mismatch() -> None:
    worker = Worker()
    try:
        assert worker.request({"op": "crash"}, 30)["status"] == "failed"
        assert worker.request({"op": "hang"}, 2)["status"] == "timeout"
        ok = worker.request(_request(), 120)
        assert ok["status"] == "ok" and len(ok["samples"]) == 3 and worker.restarts == 2
        wrong = worker.request(_request(op="perturb"), 120)
        assert wrong["status"] == "mismatch" and "tolerance" in wrong["error"]
        bad = worker.request(_request(kernel="nope"), 60)
        assert bad["status"] == "failed" and "nope" in bad["error"]
    finally:
        worker.stop()


def test_space_and_pruning() -> None:
    module = arke.loads(SOURCE)
    space = knobs(module, "mm", "llvm", DIMS)
    keys = {k.key for k in space}
    assert {"tile m", "tile n", "tile k", "threads", "pack b"} <= keys
    tile_m = next(k for k in space if k.key == "tile m")
    assert max(v for v in tile_m.values if isinstance(v, int)) <= 16  # the register block's rows
    fine = strategy_of("mm", "llvm", {"tile m": 4, "pack b": "on"}, space)
    assert prune(module, "mm", fine, DIMS) is None
    dropped = sir.Strategy("mm", "llvm", None, (sir.Decision("warps", None, 4),))
    assert "warps" in (prune(module, "mm", dropped, DIMS) or "")


def test_written_strategy_checks_clean_and_is_the_one_measured() -> None:
    strategy = sir.Strategy("mm", "llvm", None, (sir.Decision("tile", "m", 12), sir.Decision("pack", "b", None),
                                                 sir.Decision("threads", None, 2)))
    block = strategy_block("mm", "llvm", strategy, {"M": 1000, "N": 64, "K": 1})
    assert "when K == 1 and M > 512 and M <= 1024 and N > 32 and N <= 64" in block
    module = arke.loads(SOURCE + block)
    (written,) = module.strategies.for_kernel("mm", "llvm")
    assert written.decisions == strategy.decisions
    kernel = arke.build(module).kernels["mm"]
    assert kernel.choose({"M": 700, "N": 50, "K": 1}) == 0 and kernel.choose({"M": 300, "N": 50, "K": 1}) == -1
    assert when_of({"A": 2}) == "A > 1 and A <= 2"


def test_tune_then_build_uses_the_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    monkeypatch.setenv("ARKE_TUNING_DB", url)
    path = tmp_path / "mm.ak"
    path.write_text(SOURCE, encoding="utf-8")
    status = cli.main(["tune", str(path), "--kernel", "mm", "--dims", "M=40,N=48,K=24", "--budget", "4",
                       "--format", "json", "--timeout", "120"])
    out = json.loads(capsys.readouterr().out)
    assert status == 0 and out["kernel"] == "mm" and out["default_s"] > 0 and out["database"] == url
    assert sum(out["outcomes"].values()) >= 2  # the defaults and at least one proposed point
    module = arke.loads(SOURCE)
    key = tdb.Key.make(module.semantic, "mm", "llvm", DIMS)
    records = tdb.Database(url).records(key)
    assert records[0].strategy is None and records[0].outcome == "ok"  # the defaults first
    chosen = tdb.Database(url).chosen(key)
    assert chosen is not None  # a confirmed choice (the defaults, unless a point won beyond the noise)
    assert out["speedup"] >= 1.0 or chosen.strategy is None
    kernel = arke.build(module).kernels["mm"]
    assert kernel.choose(DIMS) == (-1 if chosen.strategy is None else 0)


def test_akc_tune_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mm.ak"
    path.write_text(SOURCE, encoding="utf-8")
    assert cli.main(["tune", str(path), "--kernel", "nope", "--dims", "M=4"]) == 2
    assert "no kernel `nope`" in capsys.readouterr().err
    assert cli.main(["tune", str(path), "--kernel", "mm", "--dims", "M=4"]) == 2
    assert "missing: K, N" in capsys.readouterr().err


def test_exhaustive_search_of_a_small_space(tmp_path: Path) -> None:
    """Every point of the chosen knobs is measured once (the all-unset point is the defaults), candidates
    compiled ahead of their turn; an unknown knob is a clear error."""
    from arke.tune import tune

    path = tmp_path / "mm.ak"
    path.write_text(SOURCE, encoding="utf-8")
    result = tune(path, "mm", DIMS, db=str(tmp_path / "t.db"), decisions=["vectorize n"], exhaustive=True)
    vectorize = next(k for k in knobs(arke.loads(SOURCE), "mm", "llvm", DIMS) if k.key == "vectorize n")
    assert len(result.trials) == len(vectorize.values)  # the defaults, then each width once
    assert {t.outcome for t in result.trials} == {"ok"}
    with pytest.raises(ValueError, match="takes no warps"):
        tune(path, "mm", DIMS, db=str(tmp_path / "t.db"), decisions=["warps"])


def test_akc_tune_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing file, a file with errors, a budget of 0 and a database that cannot be used: clear errors
    (exit 2, or 1 with the diagnostics), never a traceback, nothing measured."""
    bad = tmp_path / "bad.ak"
    bad.write_text("kernel bad(a: f32[M]) -> f32[M] {\n  return a[m] + zz\n}\n", encoding="utf-8")
    good = tmp_path / "mm.ak"
    good.write_text(SOURCE, encoding="utf-8")
    wheres = tmp_path / "where.ak"
    wheres.write_text("kernel g(x: f32[M, N], y: f32[N]) -> f32[M, N] where N % 4 == 0 { return x[m, n] * y[n] }\n",
                      encoding="utf-8")
    fifo = tmp_path / "fifo.ak"
    os.mkfifo(fifo)  # --write must not open it for reading: that blocks until a writer comes
    cases = [([str(tmp_path / "missing.ak"), "--kernel", "mm", "--dims", "M=4,N=4,K=4"], 2, "no such file"),
             ([str(bad), "--kernel", "bad", "--dims", "M=4"], 1, "AK2001"),
             ([str(good), "--kernel", "mm", "--dims", "M=4,N=4,K=4", "--budget", "0"], 2, "at least 1"),
             ([str(good), "--kernel", "mm", "--dims", "M=4,N=4,K=4", "--db", "nosuch://x"], 2, "cannot use"),
             ([str(good), "--kernel", "mm", "--dims", "M=4,N=4,K=4,Z=3"], 2, "has no dim Z"),
             ([str(good), "--kernel", "mm", "--dims", "M=4,N=4,K=4", "--db", str(tmp_path)], 2, "is a folder"),
             ([str(good), "--kernel", "mm", "--dims", "M=4,N=4,K=4", "--write", str(tmp_path)], 2, "is a folder"),
             ([str(good), "--kernel", "mm", "--dims", "M=4,N=4,K=4", "--db", "sqlite:///:memory:"], 2, "in memory"),
             ([str(good), "--kernel", "mm", "--dims", "M=4,N=4,K=4", "--write", str(fifo)], 2, "not a regular file"),
             ([str(good), "--kernel", "mm", "--dims", "M=4,N=4,K=4", "--write", "/dev/zero"], 2, "not a regular file"),
             ([str(wheres), "--kernel", "g", "--dims", "M=4,N=6"], 2, "`N % 4 == 0` does not hold"),
             ([str(good), "--kernel", "mm", "--dims", "M=4,N=4,K=4,M=8"], 2, "gives M twice")]
    for args, status, words in cases:
        assert cli.main(["tune", *args]) == status
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err and "the defaults first" not in err
