"""A model's decode step recorded as its native launches, to be replayed without the Python between them.

A decode step of GPT-2 runs 50 kernels, each a few hundred microseconds of streamed weights. The
Python between them (call checks, argument lists, cache appends) is little work, but it runs with
caches the kernels just flushed: 6 µs of interpreter work takes 35 µs after a 10 MB stream here, and a
step spent 7 of its 29 ms there. A :class:`Recording` holds the step's launches as the CPU runtime
prepared them (:class:`arke.targets.llvm.replay.Program`) with the few per-step actions between them (the
KV cache append, the attention's length), so :mod:`arke.models.replay` replays the whole step as one
loop.

While a recording is on (:func:`record`, this thread only), the llvm runtime hands it each launch it runs
(:meth:`Recording.program`), and anything that ran otherwise marks it failed (:meth:`Recording.fail`):
a failed recording is never replayed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

_LOCAL = threading.local()


class Recording:
    """The native launches and per-step actions of one decode step, in order."""

    def __init__(self) -> None:
        self.steps: list[Callable[[int], None]] = []  # each takes the step's start (the cache's length)
        self.keep: list[Any] = []  # every buffer the launches point into, alive as long as the recording
        self.programs = 0
        self.failed: str | None = None
        self.varying: dict[str, int] = {}  # scalars of the next kernel call that follow the step: name -> offset

    def program(self, program: Any, lock: threading.Lock, buffers: list[Any], explain: Callable[[], None]) -> None:
        """A launch sequence that ran (``program.run()`` replays it; ``explain`` raises its error)."""
        self.keep.append(buffers)
        self.programs += 1

        def step(start: int) -> None:
            with lock:  # the kernel's scratch: one call of it at a time
                ok = program.run()
            if not ok:
                explain()
        self.steps.append(step)

    def action(self, fn: Callable[[int], None], *keep: Any) -> None:
        """Work between launches that depends on the step's start (a cache append, a length)."""
        self.keep.extend(keep)
        self.steps.append(fn)

    def vary(self, name: str, offset: int) -> None:
        """The next kernel call's scalar ``name`` is the step's start + ``offset`` (not the value it is given)."""
        self.varying[name] = offset

    def take_varying(self) -> dict[str, int]:
        found, self.varying = self.varying, {}
        return found

    def fail(self, why: str) -> None:
        """Something in the step ran outside the recording: it must not be replayed."""
        if self.failed is None:
            self.failed = why

    def check(self, ok: bool, why: str) -> None:
        """:meth:`fail` unless ``ok``."""
        if not ok:
            self.fail(why)


def recording() -> Recording | None:
    """The recording on in this thread, if any."""
    return getattr(_LOCAL, "recording", None)


@contextlib.contextmanager
def record(rec: Recording) -> Iterator[Recording]:
    """Record this thread's launches into ``rec`` for the duration."""
    if recording() is not None:
        raise RuntimeError("a recording is already on in this thread")
    _LOCAL.recording = rec
    try:
        yield rec
    finally:
        _LOCAL.recording = None


def counted(rec: Recording | None, name: str, run: Callable[[], Any]) -> Any:
    """``run()``, one kernel call: with a recording on it must have recorded exactly one launch sequence."""
    if rec is None:
        return run()
    before = rec.programs
    got = run()
    rec.check(rec.programs == before + 1, f"kernel `{name}` ran without a replayable launch sequence")
    return got
