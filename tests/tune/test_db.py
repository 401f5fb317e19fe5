"""The tuning database (arke.tune.db): keys, reuse within a dims bucket, refusal across machines,
versions and protocols, concurrent writers, a corrupted file, and a real PostgreSQL server."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
import warnings
from pathlib import Path

import postgres_support
import pytest

import arke
from arke.ir import strategy as sir
from arke.tune import db as tdb
from arke.tune.lookup import tuned_strategy

SOURCE = "kernel mm(a: f32[M, K], b: f32[K, N]) -> f32[M, N] {\n  return sum(a[m, k] * b[k, n] for k)\n}\n"
TILE = sir.Strategy("mm", "llvm", None, (sir.Decision("tile", "m", 12),))


def _key(dims: dict[str, int]) -> tdb.Key:
    module = arke.loads(SOURCE)
    return tdb.Key.make(module.semantic, module.kernel_map["mm"], "llvm", dims)


def _record(key: tdb.Key, outcome: str = "ok", samples: tuple[float, ...] = (1e-3, 1.1e-3, 0.9e-3),
            strategy: sir.Strategy | None = TILE) -> tdb.Record:
    return tdb.Record(key, {"M": 100, "N": 100, "K": 100}, strategy, outcome, samples, kernel_name="mm")


def test_keys_bucket_reuse_and_refusal(tmp_path: Path) -> None:
    database = tdb.Database(str(tmp_path / "t.db"))
    key = _key({"M": 1000, "N": 100, "K": 64})
    assert key == _key({"M": 600, "N": 128, "K": 64})  # the same power-of-two buckets
    assert key != _key({"M": 1025, "N": 100, "K": 64})
    database.add(_record(key))
    database.add(_record(key, samples=(5e-4, 6e-4, 7e-4), strategy=None))
    database.add(_record(key, "mismatch", ()))
    assert len(database.records(key)) == 3 and database.best(key).strategy is None  # the faster one
    assert database.best(key).median == pytest.approx(6e-4)
    for other in (dataclasses.replace(key, machine="another-cpu"), dataclasses.replace(key, versions="llvm-99"),
                  dataclasses.replace(key, protocol=key.protocol + 1), dataclasses.replace(key, target="mlir"),
                  dataclasses.replace(key, kernel="0" * 32)):
        assert database.records(other) == [] and database.best(other) is None
    row = json.loads(_identity_row(tmp_path / "t.db"))
    assert row["machine"]["cpu"]["cores"] >= 1 and "LLVM" in row["versions"] and "arke" in row["versions"]


def _identity_row(path: Path) -> str:
    with sqlite3.connect(path) as c:
        return str(c.execute("SELECT identity FROM arke_tuning LIMIT 1").fetchone()[0])


def test_build_uses_the_chosen_record_only_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """arke.build runs the key's chosen strategy where the source has none; tuning='off', another bucket,
    another machine or an explicit @strategy keep their own."""
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    monkeypatch.setenv("ARKE_TUNING_DB", url)
    dims = {"M": 40, "N": 48, "K": 24}
    key = _key(dims)
    database = tdb.Database(url)
    database.add(_record(key, tdb.CHOSEN))
    database.add(_record(dataclasses.replace(key, machine="elsewhere"), tdb.CHOSEN,
                         strategy=sir.Strategy("mm", "llvm", None, (sir.Decision("tile", "m", 3),))))
    module = arke.loads(SOURCE)
    found = tuned_strategy(module.semantic, module.kernel_map["mm"], "llvm", dims)
    assert found is not None and found.decisions == TILE.decisions
    kernel = arke.build(module).kernels["mm"]
    source = kernel.variant(kernel.choose(dims)).artifact.source
    assert "ptr noalias %a11, i64 %sak" in source  # the 12-row register block
    assert kernel.choose({"M": 4000, "N": 48, "K": 24}) == -1  # no record for that bucket
    off = arke.build(module, tuning="off").kernels["mm"]
    assert off.choose(dims) == -1
    own = arke.loads(SOURCE + "@strategy(mm, target = llvm) { tile m = 4 }\n")
    mine = arke.build(own).kernels["mm"]
    assert mine.choose(dims) == 0 and mine.strategies()[0].decisions[0].value == 4
    with pytest.raises(ValueError, match="tuning is 'on'"):
        arke.build(module, tuning="maybe")


def test_lookups_are_kept_until_the_database_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model's layers ask for the same kernels at the same dims: the answer is read once, and read again
    once the file changes (a record written by akc tune, here or in another process)."""
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    dims = {"M": 40, "N": 48, "K": 24}
    database = tdb.Database(url)
    database.add(_record(_key({"M": 1, "N": 1, "K": 1}), tdb.CHOSEN))  # another bucket
    opened = []
    real = tdb.Database

    def counted(*args: object, **kwargs: object) -> tdb.Database:
        opened.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tdb, "Database", counted)
    modules = [arke.loads(SOURCE) for _ in range(3)]  # one per layer: distinct objects, the same kernel
    assert all(tuned_strategy(m.semantic, m.kernel_map["mm"], "llvm", dims, url=url) is None for m in modules)
    assert len(opened) == 1
    database.add(_record(_key(dims), tdb.CHOSEN))
    found = tuned_strategy(modules[0].semantic, modules[0].kernel_map["mm"], "llvm", dims, url=url)
    assert found is not None and found.decisions == TILE.decisions and len(opened) == 2
    assert tuned_strategy(modules[1].semantic, modules[1].kernel_map["mm"], "llvm", dims, url=url) == found
    assert len(opened) == 2


def test_concurrent_writers(tmp_path: Path) -> None:
    url = str(tmp_path / "shared.db")
    key = _key({"M": 64, "N": 64, "K": 64})
    tdb.Database(url).count()  # the table exists before the writers race

    def write(n: int) -> None:
        mine = tdb.Database(url)
        for k in range(10):
            mine.add(_record(key, samples=(1e-3 * (n + 1), 1e-3 * (k + 1))))
        mine.close()

    workers = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert tdb.Database(url).count() == 40


def test_a_corrupted_file_is_set_aside(tmp_path: Path) -> None:
    """A damaged SQLite database (its header says it is one) is set aside by a tuner, under a name of its own each
    time; a lookup (a build) never moves it and runs the defaults."""
    path = tmp_path / "tuning.db"
    damaged = b"SQLite format 3\x00" + b"this is not a database" * 100
    module = arke.loads(SOURCE)
    path.write_bytes(damaged)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tuned_strategy(module.semantic, module.kernel_map["mm"], "llvm", {"M": 1, "N": 1, "K": 1},
                              url=f"sqlite:///{path}") is None
    assert path.read_bytes() == damaged and any("cannot be read" in str(w.message) for w in caught)
    for _ in range(2):
        path.write_bytes(damaged)
        database = tdb.Database(str(path))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert database.count() == 0
        assert any("set aside" in str(w.message) for w in caught) and database.notes
    aside = [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 2 and all(p.read_bytes() == damaged for p in aside)


def test_a_damaged_table_page_behind_a_good_header_is_set_aside_before_a_measurement(tmp_path: Path) -> None:
    """A database whose header and schema read well but whose table's page is damaged passed the opening
    count: the tuner measured, then failed at the write and lost the measurement. A writer checks the pages
    (SQLite's quick_check) as it opens, and sets such a file aside."""
    path = tmp_path / "tuning.db"
    first = tdb.Database(str(path))
    first.add(_record(_key({"M": 64, "N": 64, "K": 64})))
    first.close()
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big") or 65536
    data[page:page + 3000] = b"Z" * 3000  # page 2: the table's root
    path.write_bytes(bytes(data))
    database = tdb.Database(str(path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        database.add(_record(_key({"M": 8, "N": 8, "K": 8})))
    assert any("set aside" in str(w.message) for w in caught) and database.count() == 1
    assert [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]


def test_tuners_that_find_the_same_damage_set_it_aside_once(tmp_path: Path) -> None:
    """Four tuners opening one damaged file at once: each renamed whatever was at the path, so one renamed the
    new database another had just started (its records gone from the live file), and others failed with
    "table arke_tuning already exists" or "malformed". Under the lock beside it, the file is set aside once and
    every writer's record lands in the new database."""
    path = tmp_path / "tuning.db"
    path.write_bytes(b"SQLite format 3\x00" + b"this is not a database" * 100)
    errors: list[BaseException] = []

    def tune(n: int) -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mine = tdb.Database(str(path))
                mine.add(_record(_key({"M": 8 * (n + 1), "N": 8, "K": 8})))
                mine.close()
        except BaseException as err:  # a failing writer is the finding
            errors.append(err)

    workers = [threading.Thread(target=tune, args=(n,)) for n in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors
    assert len([p for p in tmp_path.iterdir() if ".corrupt-" in p.name]) == 1
    assert tdb.Database(str(path)).count() == 4


@pytest.mark.parametrize("what", ["folder", "text"])
def test_what_is_not_a_database_is_never_moved(tmp_path: Path, what: str) -> None:
    """A folder, or a file that is not SQLite (a user's), named as the database: a clear error for a tuner, a
    warning and the defaults for a build; nothing is renamed or created."""
    path = tmp_path / "db"
    if what == "folder":
        path.mkdir()
        (path / "mine.txt").write_text("keep")
    else:
        path.write_text("my notes, not a database")
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    with pytest.raises(tdb.TuningDatabaseError, match=r"is a folder|not a database"):
        tdb.Database(str(path)).count()
    module = arke.loads(SOURCE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tuned_strategy(module.semantic, module.kernel_map["mm"], "llvm", {"M": 1, "N": 1, "K": 1},
                              url=f"sqlite:///{path}") is None
    assert caught
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


def test_a_locked_database_is_not_set_aside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.db"
    tdb.Database(str(path)).add(_record(_key({"M": 8, "N": 8, "K": 8})))
    monkeypatch.setattr(tdb, "LOCK_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(tdb.TuningDatabaseError, match="locked by another process"):
            tdb.Database(str(path)).count()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert not [p for p in tmp_path.iterdir() if ".corrupt-" in p.name] and tdb.Database(str(path)).count() == 1


def test_a_build_does_not_wait_on_a_locked_database_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tuner's lock: a build's lookup waits a short while (not a tuner's 30 s), warns, runs the defaults, and
    does not ask again for a minute (a model load looks up every kernel at every shape)."""
    import time

    from arke.tune import lookup

    path = tmp_path / "t.db"
    tdb.Database(str(path)).add(_record(_key({"M": 8, "N": 8, "K": 8}), tdb.CHOSEN))
    monkeypatch.setattr(tdb, "READ_LOCK_TIMEOUT_S", 0.3)
    monkeypatch.setattr(lookup, "_DOWN", {})
    module = arke.loads(SOURCE)
    url = f"sqlite:///{path}"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for dims in ({"M": 8, "N": 8, "K": 8}, {"M": 64, "N": 64, "K": 64}, {"M": 8, "N": 8, "K": 8}):
                start = time.perf_counter()
                assert tuned_strategy(module.semantic, module.kernel_map["mm"], "llvm", dims, url=url) is None
                took = time.perf_counter() - start
        assert took < 0.2 and any("not asked again" in str(w.message) for w in caught)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    monkeypatch.setattr(lookup, "RETRY_S", 0.0)  # a minute later: asked again, and read
    assert tuned_strategy(module.semantic, module.kernel_map["mm"], "llvm", {"M": 8, "N": 8, "K": 8},
                          url=url) is not None


@pytest.mark.parametrize("url", ["", "sqlite://", "sqlite:///:memory:"])
def test_a_database_that_keeps_nothing_is_refused(url: str) -> None:
    with pytest.raises(tdb.TuningDatabaseError, match=r"empty string|in memory"):
        tdb.Database(url)


@pytest.mark.parametrize(("decisions", "why"), [
    ('[{"kind": "frobnicate", "subject": null, "value": 1}]', "unknown decision"),
    ('[{"kind": "vectorize", "subject": "n", "value": -8}]', "out of its range"),
    ('[{"kind": "threads", "subject": null, "value": 0}]', "out of its range"),
    ('[{"kind": "tile", "subject": "m", "value": "abc"}]', "whole number"),
    ('[{"kind": "tile", "subject": "zz", "value": 4}]', "no index `zz`"),
])
def test_a_record_the_kernel_cannot_use_runs_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          decisions: str, why: str) -> None:
    """A chosen record whose strategy no source could have written (damaged or foreign): the kernel runs its
    defaults, correctly, with a warning saying why; never a crash in the call."""
    import torch

    path = tmp_path / "t.db"
    monkeypatch.setenv("ARKE_TUNING_DB", str(path))
    dims = {"M": 8, "N": 8, "K": 8}
    tdb.Database(str(path)).add(_record(_key(dims), tdb.CHOSEN))
    with sqlite3.connect(path) as c:
        text = c.execute("SELECT strategy FROM arke_tuning").fetchone()[0]
        record = json.loads(text)
        record["strategies"][0]["decisions"] = json.loads(decisions)
        c.execute("UPDATE arke_tuning SET strategy = ?", (json.dumps(record),))
    module = arke.loads(SOURCE)
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = arke.build(module).mm(a, b)
    assert torch.allclose(got, a @ b, atol=1e-5)
    assert any(why in str(w.message) for w in caught), [str(w.message) for w in caught]


def test_a_damaged_row_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    database = tdb.Database(str(path))
    key = _key({"M": 8, "N": 8, "K": 8})
    database.add(_record(key))
    database.add(_record(key))
    with sqlite3.connect(path) as c:
        c.execute("UPDATE arke_tuning SET samples = 'not json' WHERE id = 1")
    assert len(database.records(key)) == 1 and "damaged" in database.notes[0]


def test_a_bad_url_is_a_clear_error() -> None:
    with pytest.raises(tdb.TuningDatabaseError, match="cannot use the tuning database"):
        tdb.Database("nosuchdialect://x/y").count()


@pytest.mark.skipif(postgres_support.unavailable() is not None, reason=str(postgres_support.unavailable()))
def test_postgresql_server(tmp_path: Path) -> None:
    """The same records on a real PostgreSQL server (started for the test), by two writers."""
    with postgres_support.running_postgres(tmp_path) as url:
        key = _key({"M": 64, "N": 64, "K": 64})
        first, second = tdb.Database(url), tdb.Database(url)
        first.add(_record(key))
        second.add(_record(key, samples=(1e-4, 2e-4, 3e-4), strategy=None))
        second.add(_record(key, tdb.CHOSEN))
        assert len(first.records(key)) == 3 and first.best(key).strategy is None
        assert first.chosen(key).strategy.decisions == TILE.decisions
        assert first.records(dataclasses.replace(key, machine="x")) == []
        first.close()
        second.close()


def test_a_server_that_never_answers_is_an_error_in_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PostgreSQL server that accepts connections and never answers (a hung host) must not hang akc tune or
    every build that looks a strategy up: the connection gives up after SERVER_TIMEOUT_S."""
    import socket
    import time

    pytest.importorskip("psycopg")
    monkeypatch.setattr(tdb, "SERVER_TIMEOUT_S", 1)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.extend(server.accept()[0] for _ in range(8)), daemon=True).start()
    start = time.monotonic()
    with pytest.raises(tdb.TuningDatabaseError, match=r"cannot use|cannot be read|timeout"):
        tdb.Database(f"postgresql://u:p@127.0.0.1:{server.getsockname()[1]}/db").count()
    assert time.monotonic() - start < 60  # four tries of one second, not forever
    server.close()


def test_a_fifo_named_as_the_database_is_never_opened(tmp_path: Path) -> None:
    """Looking a strategy up must not open a FIFO (it blocks until a writer comes): the defaults run."""
    import os

    os.mkfifo(tmp_path / "t.db")
    module = arke.loads(SOURCE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = tuned_strategy(module.semantic, module.kernel_map["mm"], "llvm", {"M": 4, "N": 4, "K": 4},
                               url=f"sqlite:///{tmp_path / 't.db'}")
    assert found is None
