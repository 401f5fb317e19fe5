"""Every environment knob Arke reads, in one place.

Each knob is a function that reads the environment when it is called (never at import),
so a test can set a variable with ``monkeypatch.setenv`` and see the effect at once.
:data:`KNOBS` lists them with what they do, for ``--help`` texts and the docs.

A knob with a value it cannot use raises :class:`KnobError`, which names the variable,
the value and what it accepts.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

#: Every variable Arke reads, with what it does.
KNOBS: dict[str, str] = {
    "ARKE_CACHE_DIR": "where compiled kernels are cached (default $XDG_CACHE_HOME/arke or ~/.cache/arke)",
    "ARKE_NO_CACHE": "1 = never read or write the on-disk kernel cache (the in-process cache stays)",
    "ARKE_CACHE_LOCK_TIMEOUT": "seconds to wait for another process building the same kernel (default 120)",
    "ARKE_DEBUG": "1 = show tracebacks and debug logging (AKC_DEBUG is the older spelling)",
    "ARKE_DEBUG_PASSES": "1 = print the IR after every pass of the pipeline (to stderr)",
    "ARKE_THREADS": "the CPU worker team's size (default: every core this process may use)",
    "ARKE_NO_REUSE": "1 = allocate every result, temporary and scratch buffer afresh on every call",
    "ARKE_NO_TEAM": "1 = run parallel launches on a Python thread pool instead of the native worker team",
    "ARKE_NO_HUGEPAGES": "1 = keep models' weights and KV caches on torch's memory, not on transparent huge pages",
    "ARKE_NO_REPLAY": "1 = run every decode step of a model through Python, never its recorded launches",
    "ARKE_TUNING_DB": "the tuning database akc tune writes and arke.build reads: a SQLAlchemy URL or a SQLite file "
                      "(default $XDG_CACHE_HOME/arke/tuning.db or ~/.cache/arke/tuning.db)",
    "ARKE_IREE_FLAGS": "extra iree-compile flags for the mlir target, space-separated (part of the cache key)",
}

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


class KnobError(ValueError):
    """An environment variable holds a value Arke cannot use."""


def _flag(name: str) -> bool:
    """Read a yes/no variable; unset or empty means no."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise KnobError(f"{name}={raw!r} is not a yes/no value: use 1 or 0 (or unset it)")


def no_reuse() -> bool:
    """``ARKE_NO_REUSE``: never reuse buffers of earlier calls (see ``arke.runtime.pool``)."""
    return _flag("ARKE_NO_REUSE")


def iree_flags() -> tuple[str, ...]:
    """Extra ``iree-compile`` flags for the mlir target (``ARKE_IREE_FLAGS``, split on spaces)."""
    raw = os.environ.get("ARKE_IREE_FLAGS", "").split()
    bad = [f for f in raw if not f.startswith("--")]
    if bad:
        raise KnobError(f"ARKE_IREE_FLAGS={os.environ['ARKE_IREE_FLAGS']!r}: {bad[0]!r} is not a flag; "
                        "give iree-compile flags, as --iree-opt-data-tiling")
    return tuple(raw)


def no_team() -> bool:
    """``ARKE_NO_TEAM``: run parallel launches on a Python thread pool, not the native worker team
    (``arke.targets.llvm.team``)."""
    return _flag("ARKE_NO_TEAM")


def no_omp() -> bool:
    """``ARKE_NO_OMP``: run parallel launches on Arke's native team, not on the OpenMP runtime torch loaded
    (``arke.targets.llvm.omp``)."""
    return _flag("ARKE_NO_OMP")


def no_replay() -> bool:
    """``ARKE_NO_REPLAY``: never replay a model's recorded decode step (``arke.models.replay``)."""
    return _flag("ARKE_NO_REPLAY")


def no_hugepages() -> bool:
    """``ARKE_NO_HUGEPAGES``: weights and KV caches on torch's memory (``arke.runtime.hugepages``)."""
    return _flag("ARKE_NO_HUGEPAGES")


def cache_dir() -> Path:
    """The directory of the on-disk kernel cache (``ARKE_CACHE_DIR``); it may not exist yet.

    Default: ``$XDG_CACHE_HOME/arke`` when ``XDG_CACHE_HOME`` is an absolute path, else
    ``~/.cache/arke``, else (no home directory) ``<tmp>/arke-cache``.
    """
    explicit = os.environ.get("ARKE_CACHE_DIR", "")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):  # the XDG spec says to ignore relative paths
        return Path(xdg) / "arke"
    try:
        return Path.home() / ".cache" / "arke"
    except RuntimeError:  # no HOME and no passwd entry
        return Path(tempfile.gettempdir()) / "arke-cache"


def cache_disabled() -> bool:
    """True when ``ARKE_NO_CACHE`` says to bypass the on-disk kernel cache."""
    return _flag("ARKE_NO_CACHE")


def cache_lock_timeout() -> float:
    """Seconds to wait for another process that is building the same kernel (``ARKE_CACHE_LOCK_TIMEOUT``).

    After this long the waiting process builds the kernel itself; either way both succeed.
    """
    raw = os.environ.get("ARKE_CACHE_LOCK_TIMEOUT", "").strip()
    if not raw:
        return 120.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0.0:  # also rejects nan
        raise KnobError(f"ARKE_CACHE_LOCK_TIMEOUT={raw!r} is not a number of seconds >= 0 (default 120)")
    return value


def debug() -> bool:
    """True when ``ARKE_DEBUG`` (or the older ``AKC_DEBUG``) is set to anything but a no value.

    Lenient on purpose: a debugging switch never stops a run, so ``ARKE_DEBUG=all`` means yes.
    """
    return any(os.environ.get(name, "").strip().lower() not in _FALSE for name in ("ARKE_DEBUG", "AKC_DEBUG"))


def debug_passes() -> bool:
    """``ARKE_DEBUG_PASSES``: print the IR after each pass (lenient: any value but a "no" is on)."""
    return os.environ.get("ARKE_DEBUG_PASSES", "").strip().lower() not in _FALSE


def threads() -> int | None:
    """``ARKE_THREADS``: the worker team's size, or None for every core."""
    raw = os.environ.get("ARKE_THREADS", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise KnobError(f"ARKE_THREADS={raw!r}: give a positive number of threads")
    return int(raw)
