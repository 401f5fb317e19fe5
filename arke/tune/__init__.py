"""Measured strategy search (``akc tune``, :func:`tune`), its database, and strategies written as source.

See :mod:`arke.tune.search` for the search and its confirmation, :mod:`arke.tune.worker` for how a
candidate is checked and timed, :mod:`arke.tune.db` for the records, :mod:`arke.tune.source` for
``--write``. ``arke.build`` uses a kernel's confirmed record where the source has no strategy for the
target (:func:`arke.tune.lookup.tuned_strategy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from arke.tune.search import TuneResult


def tune(source: Any, kernel: str, dims: Any, **options: Any) -> TuneResult:
    """Tune ``kernel`` at ``dims`` (see :func:`arke.tune.search.tune` for the options)."""
    from arke.tune.search import tune as run

    return run(source, kernel, dims, **options)


__all__ = ["tune"]
