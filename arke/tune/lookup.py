"""What ``arke.build`` asks the tuning database: the confirmed strategy for a kernel at a call's dims
on this machine and toolchain (:class:`arke.tune.db.Key`), or None. Never an error: a database that
is missing is no record, one that cannot be read is a warning (once) and no record."""

from __future__ import annotations

import stat
import time
import warnings
import weakref
from collections.abc import Mapping
from pathlib import Path

from arke.ir import semantic as S
from arke.ir import strategy as sir

_WARNED: set[str] = set()
#: answers already read from a SQLite database, with the files' state they were read at: a model's
#: layers ask for the same kernels at the same dims, and each query costs milliseconds
_ANSWERS: dict[tuple[object, ...], tuple[object, sir.Strategy | None]] = {}
_MAX_ANSWERS = 512
_HASHES: dict[int, dict[str, str]] = {}  # id(module) -> kernel -> its IR hash (dropped with the module)


def _kernel_hash(module: S.Module, ir_name: str) -> str:
    from arke.tune import db as tdb

    hashes = _HASHES.get(id(module))
    if hashes is None:
        hashes = _HASHES[id(module)] = {}
        weakref.finalize(module, _HASHES.pop, id(module), None)
    if ir_name not in hashes:
        hashes[ir_name] = tdb.kernel_hash(module, ir_name)
    return hashes[ir_name]


def _stamp(url: str) -> object:
    """The state of a SQLite database: its header's change counter (bumped by every committed write) and
    its files' sizes and times (the write-ahead log's too); None for a server, whose answers are not kept
    (another process may write there at any time)."""
    if not url.startswith("sqlite:///"):
        return None
    path = Path(url[len("sqlite:///"):])
    stamp: list[object] = []
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a FIFO would block the open (the database refuses it)
            return None
        with open(path, "rb") as f:
            stamp.append(f.read(100)[24:28])
    except OSError:
        stamp.append(None)
    for file in (path, path.with_name(path.name + "-wal")):
        try:
            st = file.stat()
            stamp.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            stamp.append(None)
    return tuple(stamp)


def _readable(url: str) -> bool:
    """False where nothing was ever tuned here (no SQLite file: a build makes no file), or where the database
    failed a lookup moments ago (:func:`_resting`)."""
    return not (url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists()) and not _resting(url)


def _once(key: str, text: str) -> None:
    """Warn ``text`` the first time ``key`` comes up in this process (a build asks again for every kernel)."""
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(text, RuntimeWarning, stacklevel=6)


#: Seconds a database that could not be read is left alone: every kernel and shape of a model load looks
#: up, and each would wait out a lock or a dead server again.
RETRY_S = 60.0
_DOWN: dict[str, float] = {}  # url -> when a lookup last failed (time.monotonic)


def _resting(url: str) -> bool:
    """Whether ``url`` failed a lookup less than :data:`RETRY_S` ago (then the defaults run without asking)."""
    failed = _DOWN.get(url)
    return failed is not None and time.monotonic() - failed < RETRY_S


def _unreadable(url: str, err: Exception) -> None:
    _DOWN[url] = time.monotonic()
    _once(url, f"the tuning database {url.split('@')[-1]} cannot be read ({type(err).__name__}: {err}); "
               f"kernels run their defaults, and it is not asked again for {RETRY_S:g} s "
               "(arke.build(..., tuning='off') skips it)")


def _said(url: str, notes: list[str]) -> None:
    """The database's notes (damaged rows skipped), each said once."""
    for note in notes:
        _once(note, f"{note}; rerun `akc tune` to measure it again")


def _usable(strategy: sir.Strategy, module: S.Module, url: str) -> sir.Strategy | None:
    """A record's strategy if every decision is one the language could have written (a known kind, a legal
    value for its kind); else None (the defaults run) and a warning, once: a damaged or foreign record never
    fails or silently changes a kernel."""
    from arke.tune.space import legal_decision

    why = next((r for d in strategy.decisions if (r := legal_decision(d, module, strategy.kernel)) is not None), None)
    pairs = [(d.kind, d.subject) for d in strategy.decisions]
    if why is None and len(set(pairs)) < len(pairs):
        twice = next(p for p in pairs if pairs.count(p) > 1)
        why = f"`{twice[0]}{' ' + twice[1] if twice[1] else ''}` is given twice"
    if why is None:
        return strategy
    note = (f"the tuning database {url.split('@')[-1]} holds a strategy for `{strategy.kernel}` that cannot be used "
            f"({why}); the kernel runs its defaults: rerun `akc tune` for it")
    _once(note, note)
    return None


def tuned_strategy(module: S.Module, ir_name: str, target: str, dims: Mapping[str, int], arch: str | None = None,
                   device: str = "cpu", url: str | None = None) -> sir.Strategy | None:
    """The key's ``chosen`` record's strategy (None: no record, or the defaults were confirmed)."""
    from arke.tune import db as tdb

    url = url or tdb.default_url()
    if not _readable(url):
        return None
    stamp = _stamp(url)
    kernel = _kernel_hash(module, ir_name)
    memo = (url, kernel, ir_name, target, repr(sorted(tdb.bucket(dims).items())), arch, device)
    if stamp is not None:
        kept = _ANSWERS.get(memo)
        if kept is not None and kept[0] == stamp:
            return kept[1]
    try:
        database = tdb.Database(url, writer=False)
        try:
            found = database.chosen(tdb.Key.of(kernel, target, dims, arch, device))
        finally:
            database.close()
    except Exception as err:  # a broken or unreachable database never fails a build
        _unreadable(url, err)
        return None
    _said(url, database.notes)
    answer = None if found is None or found.strategy is None else \
        _usable(sir.Strategy(ir_name, target, None, found.strategy.decisions), module, url)
    if stamp is not None:
        if len(_ANSWERS) >= _MAX_ANSWERS:
            _ANSWERS.pop(next(iter(_ANSWERS)))
        _ANSWERS[memo] = (stamp, answer)
    return answer


def tuned_plan(layer: str, target: str, device: str = "cpu", url: str | None = None) -> tuple[sir.Strategy, ...]:
    """The confirmed plans of every call shape tuned for the layer keyed ``layer`` here (in bucket order)."""
    from arke.tune import db as tdb

    url = url or tdb.default_url()
    if not _readable(url):
        return ()
    try:
        database = tdb.Database(url, writer=False)
        try:
            found = database.chosen_plans(tdb.Key.of(layer, target, {}, None, device))
        finally:
            database.close()
    except Exception as err:  # a broken or unreachable database never fails a layer
        _unreadable(url, err)
        return ()
    return tuple(s for record in found for s in record.plan)
