"""The tuning database: one record per measured configuration, in SQLite by default
(``~/.cache/arke/tuning.db``, or ``ARKE_TUNING_DB`` / ``--db``) or any SQLAlchemy URL (a team's
PostgreSQL server).

A record keys a configuration by the kernel's canonical IR hash, the target and its options, the
dims bucket (:func:`bucket`: a record made at ``M = 1000`` serves calls whose dims fall in the same
power-of-two buckets), the machine identity, arke's and the toolchain's versions and the measurement
protocol (:mod:`arke.tune.machine`); it holds the configuration as StrategyIR JSON, its samples, and
the outcome (``ok``, ``mismatch``, ``failed``, ``timeout``, ``pruned``, ``flagged``). A lookup only
ever returns records whose every key matches: another machine's, toolchain's or protocol's never.

Writers commit one record per transaction, so tuners sharing a database interleave safely (SQLite
waits on its lock for up to 30 s). A SQLite database that is damaged (its header says SQLite, its contents
cannot be read) is reported and set aside by a tuner (renamed ``<name>.corrupt-<time>-<pid>``) and a
new one started, under a lock on ``<name>.lock`` so that tuners finding the same damage at once set it aside
once; a folder, a file that is not SQLite, or a database locked by another process is a
clear error, and nothing is moved. A lookup (a build) never creates or moves a file. Never a traceback,
never data taken for good that is not.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arke.ir import semantic as S
from arke.ir import strategy as sir

#: Outcomes a record may have; only ``ok`` records compete for "best".
OUTCOMES = ("ok", "mismatch", "failed", "timeout", "pruned", "flagged")
#: Seconds a SQLite connection waits on another process's lock before saying the database is locked.
LOCK_TIMEOUT_S = 30.0
#: ... and a build's lookup (not a tuner): it runs its defaults rather than wait on a tuner's lock.
READ_LOCK_TIMEOUT_S = 2.0
#: Seconds to wait for a database server to answer a connection (a dead one must not hang a build).
SERVER_TIMEOUT_S = 5
#: The winner of a tuning run (confirmed against the defaults), per key: what arke.build uses.
CHOSEN = "chosen"


class TuningDatabaseError(Exception):
    """The database cannot be used (a bad URL, a server that refuses); the message says what to do."""


def default_url() -> str:
    """``ARKE_TUNING_DB``, else SQLite at ``$XDG_CACHE_HOME/arke/tuning.db`` (``~/.cache/arke/tuning.db``)."""
    explicit = os.environ.get("ARKE_TUNING_DB", "").strip()
    if explicit:
        return explicit if "://" in explicit else f"sqlite:///{Path(explicit).expanduser()}"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return f"sqlite:///{base / 'arke' / 'tuning.db'}"


def bucket(dims: Mapping[str, int]) -> dict[str, int]:
    """The bucket of each dim (rule ``pow2``): the power of two at or above it (1 and 2 stay as they are)."""
    return {k: 1 << max(0, math.ceil(math.log2(max(1, v)))) for k, v in sorted(dims.items())}


BUCKET_RULE = "pow2"


def kernel_hash(module: S.Module, ir_name: str) -> str:
    """The canonical IR hash of a kernel: its text form and that of every kernel it calls."""
    import hashlib

    from arke.ir.text import print_function

    seen: list[str] = []
    todo = [ir_name]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.append(name)
        todo += [op.callee for op in module.get(name).ops if isinstance(op, S.CallOp)]
    text = "\n".join(print_function(module.get(n)) for n in sorted(seen))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Key:
    """What a record is for, and who measured it: every field must match for a record to be used."""

    kernel: str  # the kernel's canonical IR hash
    target: str
    options: str  # the target's options (arch, device) as JSON
    dims_bucket: str  # JSON of bucket(dims)
    machine: str  # digest of the machine identity
    versions: str  # digest of arke's and the toolchain's versions
    protocol: int

    @staticmethod
    def make(module: S.Module, ir_name: str, target: str, dims: Mapping[str, int], arch: str | None = None,
             device: str = "cpu") -> Key:
        return Key.of(kernel_hash(module, ir_name), target, dims, arch, device)

    @staticmethod
    def of(kernel: str, target: str, dims: Mapping[str, int], arch: str | None = None, device: str = "cpu") -> Key:
        """The key of ``kernel`` (an IR hash, or a layer's :data:`LAYER_PREFIX` digest) measured here."""
        from arke.tune import machine

        return Key(kernel, target, json.dumps({"arch": arch, "device": device}, sort_keys=True),
                   json.dumps(bucket(dims), sort_keys=True), machine.digest(machine.identity(target, device)),
                   machine.digest(machine.versions(target)), machine.PROTOCOL)


@dataclass(frozen=True)
class Record:
    """One measured configuration."""

    key: Key
    dims: dict[str, int]
    strategy: sir.Strategy | None  # None: the defaults
    outcome: str
    samples: tuple[float, ...] = ()
    note: str = ""  # why it failed or was pruned; a rationale (the agent interface)
    kernel_name: str = ""
    created: float = 0.0
    #: a whole-layer plan's strategies (one block per dispatch it changes; ``strategy`` is None then)
    plan: tuple[sir.Strategy, ...] = ()

    @property
    def median(self) -> float:
        if self.outcome != "ok" or not self.samples:
            return math.inf
        s = sorted(self.samples)
        n = len(s)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def strategy_json(strategy: sir.Strategy | None) -> str:
    from arke.ir.serialize import strategies_to_json

    return "" if strategy is None else strategies_to_json(sir.StrategySet((strategy,)))


def strategy_from(text: str) -> sir.Strategy | None:
    from arke.ir.serialize import strategies_from_json

    return None if not text else strategies_from_json(text).strategies[0]


def plan_json(plan: Sequence[sir.Strategy]) -> str:
    from arke.ir.serialize import strategies_to_json

    return strategies_to_json(sir.StrategySet(tuple(plan))) if plan else ""


def plan_from(text: str) -> tuple[sir.Strategy, ...]:
    from arke.ir.serialize import strategies_from_json

    return () if not text else strategies_from_json(text).strategies


#: What a whole-layer plan's key has instead of a kernel's IR hash: ``layer-`` and a digest of the layer.
LAYER_PREFIX = "layer-"


class Database:
    """A tuning database at a SQLAlchemy URL (created with its table on first use)."""

    def __init__(self, url: str | None = None, writer: bool = True):
        if url is not None and not url.strip():
            raise TuningDatabaseError("the tuning database is named by an empty string: name a file or URL, or leave "
                                      "--db out for the default")
        url = url or default_url()
        if url.rstrip("/") in ("sqlite:", "sqlite:/", "sqlite://") or ":memory:" in url:
            raise TuningDatabaseError(f"{url!r} is a database in memory, which keeps no record past this process: "
                                      "name a file (or leave --db out for ~/.cache/arke/tuning.db)")
        self.url = url if "://" in url else f"sqlite:///{Path(url).expanduser().resolve()}"  # a plain file path
        self.writer = writer  # a tuner: may create the database (a lookup never creates or moves anything)
        self._engine: Any = None
        self.notes: list[str] = []  # what was reported (a corrupted file set aside)

    # -------------------------------------------------------------- connection
    def _open(self) -> Any:
        if self._engine is not None:
            return self._engine
        try:
            import sqlalchemy as sa
        except ImportError:
            raise TuningDatabaseError("the tuning database needs SQLAlchemy: pip install 'arke[tune]'") from None
        path = self._sqlite_path()
        if path is not None:
            _check_path(path)
            if self.writer:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as err:
                    raise TuningDatabaseError(f"cannot make the folder of the tuning database {path}: {err}") from None
                # said before anything is measured (SQLite finds it only at the first write): a read-only file or
                # folder (SQLite writes its journal beside the file), an immutable file, a read-only mount
                unwritable = [p for p in (path, path.parent) if p.exists() and not os.access(p, os.W_OK)]
                if unwritable:
                    raise TuningDatabaseError(f"the tuning database {self.shown()} cannot be written ({unwritable[0]} "
                                              "is read-only): make it writable, or give another with --db or "
                                              "ARKE_TUNING_DB (nothing was measured)")
        try:
            # a server that accepts and never answers must not hang a build: libpq's and MySQL's own limit
            server = self.url.split(":", 1)[0].split("+", 1)[0] in ("postgresql", "postgres", "mysql", "mariadb")
            connect = {"timeout": LOCK_TIMEOUT_S if self.writer else READ_LOCK_TIMEOUT_S} if path is not None else \
                {"connect_timeout": SERVER_TIMEOUT_S} if server else {}
            engine = sa.create_engine(self.url, connect_args=connect)
        except Exception as err:
            raise TuningDatabaseError(f"cannot use the tuning database {self.shown()}: {err}") from None
        for attempt in range(4):
            try:
                if self.writer:
                    _metadata(sa).create_all(engine)
                with engine.connect() as c:  # a file that is not a database fails here
                    c.execute(sa.text("SELECT COUNT(*) FROM arke_tuning")).scalar()
                    if self.writer and path is not None:  # a damaged page past the header: before a measurement
                        found = c.execute(sa.text("PRAGMA quick_check")).scalar()  # is made, not at its write
                        if found != "ok":
                            raise RuntimeError(f"database disk image is malformed ({found})")
                break
            except Exception as err:
                engine.dispose()
                text = str(err).lower()
                if attempt < 3 and ("already exists" in text or "disk i/o" in text or "readonly" in text):
                    time.sleep(0.05 * (attempt + 1))  # another process is creating the same new database
                    continue
                if "locked" in text or "busy" in text:
                    raise TuningDatabaseError(f"the tuning database {self.shown()} is locked by another process "
                                              f"(for more than {LOCK_TIMEOUT_S:g} s): try again when it is done") \
                        from None
                if "readonly" in text or "read-only" in text or "permission" in text or "unable to open" in text:
                    raise TuningDatabaseError(f"the tuning database {self.shown()} cannot be written "
                                              f"({str(err).splitlines()[0]}): make the file and its folder writable, "
                                              "or give another with --db or ARKE_TUNING_DB (nothing was moved)") \
                        from None
                damaged = any(w in text for w in ("not a database", "malformed", "corrupt"))
                if path is None or not self.writer or not damaged:
                    raise TuningDatabaseError(f"cannot use the tuning database {self.shown()}: "
                                              f"{type(err).__name__}: {str(err).splitlines()[0]}") from None
                engine = self._set_aside(sa, path, err)  # what the file is now, it decides under a lock
                break
        self._engine = engine
        return engine

    def _set_aside(self, sa: Any, path: Path, err: Exception) -> Any:
        """Rename a damaged SQLite database (its header says it is one) out of the way and start a new one, under
        an exclusive lock beside it: tuners that find the same damage at once rename it once, and a later one
        finds the new database sound and uses it (it renamed the new one, records and all, before)."""
        import fcntl

        if path.exists() and path.stat().st_size and not _is_sqlite(path):  # a user's file: never moved, no lock
            raise TuningDatabaseError(f"cannot use the tuning database {self.shown()}: "
                                      f"{type(err).__name__}: {str(err).splitlines()[0]}") from None
        with open(path.with_name(path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not path.exists() or path.stat().st_size == 0 or _sound(path):  # another set it aside meanwhile
                    engine = sa.create_engine(self.url, connect_args={"timeout": LOCK_TIMEOUT_S})
                    _created(sa, engine)
                    return engine
                return self._rename_and_start(sa, path, err)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _rename_and_start(self, sa: Any, path: Path, err: Exception) -> Any:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = path.with_name(f"{path.name}.corrupt-{stamp}-{os.getpid()}")
        n = 1
        while aside.exists():
            aside, n = path.with_name(f"{path.name}.corrupt-{stamp}-{os.getpid()}-{n}"), n + 1
        path.rename(aside)
        note = (f"the tuning database {path} could not be read ({type(err).__name__}); it was set aside as "
                f"{aside.name} and a new one started")
        self.notes.append(note)
        warnings.warn(note, RuntimeWarning, stacklevel=4)
        engine = sa.create_engine(self.url, connect_args={"timeout": LOCK_TIMEOUT_S})
        _created(sa, engine)
        return engine

    def _sqlite_path(self) -> Path | None:
        prefix = "sqlite:///"
        return Path(self.url[len(prefix):]) if self.url.startswith(prefix) and len(self.url) > len(prefix) else None

    def shown(self) -> str:
        """The URL without its password (what is printed, logged and handed to an agent)."""
        try:
            from sqlalchemy.engine import make_url

            return make_url(self.url).render_as_string(hide_password=True)
        except Exception:  # not a URL SQLAlchemy parses: keep only what follows the credentials
            return self.url.split("@")[-1]

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    # -------------------------------------------------------------- writing and reading
    def add(self, record: Record) -> None:
        """Store one record (its own transaction)."""
        import sqlalchemy as sa

        engine = self._open()
        k = record.key
        row = {"kernel": k.kernel, "target": k.target, "options": k.options, "dims_bucket": k.dims_bucket,
               "machine": k.machine, "versions": k.versions, "protocol": k.protocol, "bucket_rule": BUCKET_RULE,
               "dims": json.dumps(record.dims, sort_keys=True),
               "strategy": plan_json(record.plan) if record.plan else strategy_json(record.strategy),
               "outcome": record.outcome, "samples": json.dumps(list(record.samples)),
               "median": None if math.isinf(record.median) else record.median, "note": record.note[:2000],
               "kernel_name": record.kernel_name, "created": record.created or time.time(),
               "identity": json.dumps(self._identity(k.target, k.options), sort_keys=True)}
        try:
            with engine.begin() as c:
                c.execute(sa.insert(_table(sa)).values(**row))
        except sa.exc.SQLAlchemyError as err:
            raise TuningDatabaseError(f"cannot write to the tuning database {self.shown()}: "
                                      f"{_first_line(err)} "
                                      "(a read-only or damaged file, or a table of another shape: name another "
                                      "database with --db)") from None

    @staticmethod
    def _identity(target: str, options: str) -> dict[str, object]:
        from arke.tune import machine

        return {"machine": machine.identity(target, json.loads(options).get("device", "cpu")),
                "versions": machine.versions(target)}

    def records(self, key: Key, outcome: str | None = None) -> list[Record]:
        """The records for exactly this key (machine, versions and protocol included), oldest first."""
        import sqlalchemy as sa

        t = _table(sa)
        q = sa.select(t).where(t.c.kernel == key.kernel, t.c.target == key.target, t.c.options == key.options,
                               t.c.dims_bucket == key.dims_bucket, t.c.machine == key.machine,
                               t.c.versions == key.versions, t.c.protocol == key.protocol)
        if outcome is not None:
            q = q.where(t.c.outcome == outcome)
        return self._rows(q.order_by(t.c.id), key)

    def _rows(self, query: Any, key: Key | None) -> list[Record]:
        """The records a query selects (``key``: theirs, else each row's own); damaged rows skipped, said once."""
        import sqlalchemy as sa

        out = []
        try:
            rows = self._fetch(query)
        except sa.exc.SQLAlchemyError as err:
            raise TuningDatabaseError(f"cannot read the tuning database {self.shown()}: "
                                      f"{_first_line(err)}") from None
        for row in rows:
            try:
                layer = row.kernel.startswith(LAYER_PREFIX)
                plan = plan_from(row.strategy) if layer else ()
                strategy = None if layer else strategy_from(row.strategy)
                samples = tuple(float(x) for x in json.loads(row.samples))
                dims = {str(a): int(b) for a, b in json.loads(row.dims).items()}
            except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as err:
                self.notes.append(f"record {row.id} of {self.shown()} is damaged ({err}); skipped")
                continue
            found = key or Key(row.kernel, row.target, row.options, row.dims_bucket, row.machine, row.versions,
                               row.protocol)
            out.append(Record(found, dims, strategy, row.outcome, samples, row.note or "", row.kernel_name or "",
                              row.created or 0.0, plan))
        return out

    def _fetch(self, query: Any) -> list[Any]:
        with self._open().connect() as c:
            return list(c.execute(query))

    def chosen_plans(self, key: Key) -> list[Record]:
        """The latest confirmed plan of every dims bucket of ``key``'s layer (its ``dims_bucket`` ignored; every
        other field must match): the blocks a layer built here runs, one bucket's beside the others'."""
        import sqlalchemy as sa

        t = _table(sa)
        q = sa.select(t).where(t.c.kernel == key.kernel, t.c.target == key.target, t.c.options == key.options,
                               t.c.machine == key.machine, t.c.versions == key.versions,
                               t.c.protocol == key.protocol, t.c.outcome == CHOSEN)
        latest: dict[str, Record] = {}
        for record in self._rows(q.order_by(t.c.id), None):
            latest[record.key.dims_bucket] = record
        return [latest[b] for b in sorted(latest)]

    def chosen(self, key: Key) -> Record | None:
        """The latest confirmed winner for this key (what ``arke.build`` uses), or None."""
        found = self.records(key, CHOSEN)
        return found[-1] if found else None

    def best(self, key: Key) -> Record | None:
        """The fastest ``ok`` record for this key, or None."""
        found = self.records(key, "ok")
        return min(found, key=lambda r: r.median) if found else None

    def count(self) -> int:
        import sqlalchemy as sa

        try:
            with self._open().connect() as c:
                return int(c.execute(sa.select(sa.func.count()).select_from(_table(sa))).scalar() or 0)
        except sa.exc.SQLAlchemyError as err:
            raise TuningDatabaseError(f"cannot read the tuning database {self.shown()}: {_first_line(err)}") from None


_TABLES: dict[int, Any] = {}
_SQLITE_HEADER = b"SQLite format 3\x00"


def _first_line(err: Exception) -> str:
    """The driver's own words for a SQLAlchemy error (its ``orig``), first line only."""
    found = getattr(err, "orig", None) or err
    return (str(found).splitlines() or [type(found).__name__])[0]


def _check_path(path: Path) -> None:
    """A SQLite database's path must be a file (or nothing yet): a folder or a device is never used or moved."""
    if path.is_dir():
        raise TuningDatabaseError(f"the tuning database {path} is a folder: name a file in it, as "
                                  f"{path / 'tuning.db'}")
    if path.exists() and not path.is_file():
        raise TuningDatabaseError(f"the tuning database {path} is not a regular file: name a file")


def _created(sa: Any, engine: Any) -> None:
    """The table made in a new database; another process making it at the same moment is as good."""
    try:
        _metadata(sa).create_all(engine)
    except sa.exc.OperationalError as err:
        if "already exists" not in str(err):
            raise


def _sound(path: Path) -> bool:
    """Whether the SQLite file at ``path`` reads whole (its pages check out); False for a damaged one."""
    import sqlite3

    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=LOCK_TIMEOUT_S)) as c:
            return bool(c.execute("PRAGMA quick_check").fetchone() == ("ok",))
    except sqlite3.Error:
        return False


def _is_sqlite(path: Path) -> bool:
    """Whether the file says it is a SQLite database (a damaged one may be set aside; any other file is the user's,
    never renamed)."""
    try:
        with open(path, "rb") as f:
            return f.read(16) == _SQLITE_HEADER
    except OSError:
        return False


def _metadata(sa: Any) -> Any:
    return _table(sa).metadata


def _table(sa: Any) -> Any:
    """The one table (created on first use): every key column indexed together for the lookups."""
    if id(sa) not in _TABLES:
        md = sa.MetaData()
        t = sa.Table(
            "arke_tuning", md,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("kernel", sa.String(64), nullable=False), sa.Column("kernel_name", sa.String(200)),
            sa.Column("target", sa.String(32), nullable=False), sa.Column("options", sa.String(200), nullable=False),
            sa.Column("dims_bucket", sa.Text, nullable=False), sa.Column("bucket_rule", sa.String(32)),
            sa.Column("dims", sa.Text, nullable=False),
            sa.Column("machine", sa.String(64), nullable=False), sa.Column("versions", sa.String(64), nullable=False),
            sa.Column("identity", sa.Text), sa.Column("protocol", sa.Integer, nullable=False),
            sa.Column("strategy", sa.Text, nullable=False), sa.Column("outcome", sa.String(16), nullable=False),
            sa.Column("samples", sa.Text, nullable=False), sa.Column("median", sa.Float),
            sa.Column("note", sa.Text), sa.Column("created", sa.Float),
            sa.Index("arke_tuning_key", "kernel", "target", "options", "dims_bucket", "machine", "versions",
                     "protocol", "outcome"))
        _TABLES[id(sa)] = t
    return _TABLES[id(sa)]


def records_table(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Records as plain dicts (``--format json``, the agent interface)."""
    from arke.ir.text import print_strategy

    return [{"outcome": r.outcome, "median_s": None if math.isinf(r.median) else r.median,
             "strategy": "" if r.strategy is None else print_strategy(r.strategy), "note": r.note} for r in records]
