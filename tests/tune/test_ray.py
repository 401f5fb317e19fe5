"""akc tune --ray: a local Ray cluster (started here, stopped after) whose node
is this machine measures the candidates; the records land in the database given, under this
machine's key, and the confirmed choice is what a build here uses. Skipped, with the reason,
where Ray is not installed."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
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


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A one-node Ray cluster on this machine (its own head processes, stopped after: never another's)."""
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    try:
        one = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    except Exception as err:  # e.g. no room for the object store
        pytest.skip(f"a local Ray cluster could not be started here: {type(err).__name__}: {err}")
    try:
        yield str(one.address)
    finally:
        ray.shutdown()
        one.shutdown()


def test_akc_tune_on_a_ray_cluster(cluster: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "mm.ak"
    source.write_text(SOURCE)
    db = str(tmp_path / "tuning.db")
    code = cli.main(["tune", str(source), "--kernel", "mm", "--dims", "M=40,N=48,K=24", "--budget", "5", "--db", db,
                     "--ray", cluster, "--format", "json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert sum(out["outcomes"].values()) == 5 and out["outcomes"].get("ok", 0) >= 1
    assert any(n.startswith("measured on 1 Ray node") for n in out["notes"]), out["notes"]
    database = tdb.Database(db)
    try:
        key = tdb.Key.make(arke.loads(SOURCE).semantic, "mm", "llvm", DIMS)
        records = database.records(key)
        assert len([r for r in records if r.outcome != tdb.CHOSEN]) >= 5  # filed under this machine's key
        assert database.chosen(key) is not None
    finally:
        database.close()


def test_a_cluster_that_cannot_be_reached_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "mm.ak"
    source.write_text(SOURCE)
    code = cli.main(["tune", str(source), "--kernel", "mm", "--dims", "M=40,N=48,K=24", "--budget", "2",
                     "--db", str(tmp_path / "t.db"), "--ray", f"127.0.0.1:{_free_port()}"])
    assert code == 2
    assert "Ray cluster" in capsys.readouterr().err


def test_two_nodes_measure_side_by_side(tmp_path: Path) -> None:
    """Two nodes of one (local) cluster: candidates run on both lanes, the confirmation on the first."""
    from ray.cluster_utils import Cluster

    from arke.tune import tune

    if ray.is_initialized():
        ray.shutdown()
    two = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        two.add_node(num_cpus=1)
        two.wait_for_nodes()
        result = tune(SOURCE, "mm", DIMS, budget=6, db=str(tmp_path / "t.db"), ray=two.address)
        assert any(n.startswith("measured on 2 Ray nodes") for n in result.notes), result.notes
        assert len(result.trials) == 6 and result.default.outcome == "ok"
        assert sum(t.outcome == "ok" for t in result.trials) >= 4
    finally:
        ray.shutdown()
        two.shutdown()
