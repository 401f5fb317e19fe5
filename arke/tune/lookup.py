"""What ``arke.build`` asks the tuning database: the confirmed strategy for a kernel at a call's dims
on this machine and toolchain (:class:`arke.tune.db.Key`), or None. Never an error: a database that
is missing is no record, one that cannot be read is a warning (once) and no record."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path

from arke.ir import semantic as S
from arke.ir import strategy as sir

_WARNED: set[str] = set()


def _readable(url: str) -> bool:
    """False where nothing was ever tuned here (no SQLite file): a build makes no file."""
    return not (url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists())


def _unreadable(url: str, err: Exception) -> None:
    if url not in _WARNED:
        _WARNED.add(url)
        warnings.warn(f"the tuning database {url.split('@')[-1]} cannot be read ({type(err).__name__}: {err}); "
                      "kernels run their defaults (arke.build(..., tuning='off') skips it)",
                      RuntimeWarning, stacklevel=5)


def tuned_strategy(module: S.Module, ir_name: str, target: str, dims: Mapping[str, int], arch: str | None = None,
                   device: str = "cpu", url: str | None = None) -> sir.Strategy | None:
    """The key's ``chosen`` record's strategy (None: no record, or the defaults were confirmed)."""
    from arke.tune import db as tdb

    url = url or tdb.default_url()
    if not _readable(url):
        return None
    try:
        database = tdb.Database(url)
        try:
            found = database.chosen(tdb.Key.make(module, ir_name, target, dims, arch, device))
        finally:
            database.close()
    except Exception as err:  # a broken or unreachable database never fails a build
        _unreadable(url, err)
        return None
    if found is None or found.strategy is None:
        return None
    return sir.Strategy(ir_name, target, None, found.strategy.decisions)


def tuned_plan(layer: str, target: str, device: str = "cpu", url: str | None = None) -> tuple[sir.Strategy, ...]:
    """The confirmed plans of every call shape tuned for the layer keyed ``layer`` here (in bucket order)."""
    from arke.tune import db as tdb

    url = url or tdb.default_url()
    if not _readable(url):
        return ()
    try:
        database = tdb.Database(url)
        try:
            found = database.chosen_plans(tdb.Key.of(layer, target, {}, None, device))
        finally:
            database.close()
    except Exception as err:  # a broken or unreachable database never fails a layer
        _unreadable(url, err)
        return ()
    return tuple(s for record in found for s in record.plan)
