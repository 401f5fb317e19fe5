"""akc tune --ray: a local Ray cluster (started here, stopped after) whose node
is this machine measures the candidates; the records land in the database given, under this
machine's key, and the confirmed choice is what a build here uses. Skipped, with the reason,
where Ray is not installed."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

import arke
from arke.cli import app as cli
from arke.tune import db as tdb

ray = pytest.importorskip("ray", reason="akc tune --ray needs the distributed extra (pip install 'arke[distributed]')")

SOURCE = "kernel mm(a: f32[M, K], b: f32[K, N]) -> f32[M, N] {\n  return sum(a[m, k] * b[k, n] for k)\n}\n"
DIMS = {"M": 40, "N": 48, "K": 24}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_cluster_that_cannot_be_reached_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "mm.ak"
    source.write_text(SOURCE)
    code = cli.main(["tune", str(source), "--kernel", "mm", "--dims", "M=40,N=48,K=24", "--budget", "2",
                     "--db", str(tmp_path / "t.db"), "--ray", f"127.0.0.1:{_free_port()}"])
    assert code == 2
    assert "Ray cluster" in capsys.readouterr().err


def test_akc_tune_on_two_ray_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A local cluster of two nodes (its own processes, stopped after; both are this machine): candidates
    run on both lanes, the confirmation on the first; the records land under this machine's key."""
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    try:
        two = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    except Exception as err:  # e.g. no room for the object store
        pytest.skip(f"a local Ray cluster could not be started here: {type(err).__name__}: {err}")
    source, db = tmp_path / "mm.ak", str(tmp_path / "tuning.db")
    source.write_text(SOURCE)
    try:
        two.add_node(num_cpus=1)
        two.wait_for_nodes()
        code = cli.main(["tune", str(source), "--kernel", "mm", "--dims", "M=40,N=48,K=24", "--budget", "6",
                         "--db", db, "--ray", str(two.address), "--format", "json"])
    finally:
        ray.shutdown()
        two.shutdown()
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert any(n.startswith("measured on 2 Ray nodes") for n in out["notes"]), out["notes"]
    assert sum(out["outcomes"].values()) == 6 and out["outcomes"].get("ok", 0) >= 4
    database = tdb.Database(db)
    try:
        key = tdb.Key.make(arke.loads(SOURCE).semantic, "mm", "llvm", DIMS)
        assert len([r for r in database.records(key) if r.outcome != tdb.CHOSEN]) >= 6
        assert database.chosen(key) is not None
    finally:
        database.close()
