"""Worker threads for the language server: one lane per open document, a small pool for formatting.

:class:`Workers` is a tiny thread pool whose threads are daemons: the server's ``exit`` is never held
up by a check still running (the standard ``ThreadPoolExecutor`` joins its threads at interpreter
exit). A job that has not started can be cancelled (its future's ``cancel()``); one that runs cannot
be stopped from outside — a thread cannot be interrupted safely (SymPy's caches, half-updated state) —
so the server stops *waiting* for it instead, and :meth:`Workers.current` tells how long it has run.

It also reads files the way an editor's server must (:func:`read_regular`): only regular files, and
only up to a size, so a ``file:`` URI naming ``/dev/zero`` or a FIFO cannot hang or fill the server.
"""

from __future__ import annotations

import os
import queue
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

#: The largest file the server reads from disk for a document that is not open (bytes).
MAX_FILE = 64 * 1024 * 1024


class Workers:
    """Up to ``size`` daemon threads running submitted jobs in order (``size=1``: a lane)."""

    def __init__(self, name: str, size: int = 1) -> None:
        self.name, self.size = name, size
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...], Any] | None] = \
            queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._running: dict[int, tuple[Any, float]] = {}  # thread id -> (its job's tag, when it started)
        self._lock = threading.Lock()
        self.closed = False

    def submit(self, fn: Callable[..., T], *args: Any, tag: Any = None) -> Future[T]:
        """Run ``fn(*args)`` on a worker; ``tag`` is what :meth:`current` reports while it runs."""
        future: Future[T] = Future()
        with self._lock:
            if self.closed:
                raise RuntimeError(f"the {self.name} workers are closed")
            self._jobs.put((future, fn, args, tag))
            if len(self._threads) < self.size:
                thread = threading.Thread(target=self._work, name=f"{self.name}-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        return future

    def current(self) -> tuple[Any, float] | None:
        """The tag of the job that has run longest and for how many seconds (None when all are idle)."""
        with self._lock:
            running = list(self._running.values())
        if not running:
            return None
        tag, started = min(running, key=lambda r: r[1])
        return tag, time.monotonic() - started

    def alive(self) -> bool:
        """Whether a thread is still working (a closed pool's last job may still run)."""
        return any(t.is_alive() for t in self._threads)

    def close(self) -> None:
        """Take no more jobs; the threads end once the queued ones are done (a queued job may be cancelled)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            for _ in self._threads:
                self._jobs.put(None)

    def _work(self) -> None:
        me = threading.get_ident()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn, args, tag = job
            if not future.set_running_or_notify_cancel():
                continue
            with self._lock:
                self._running[me] = (tag, time.monotonic())
            try:
                result = fn(*args)
            except BaseException as err:  # handed to whoever waits, as ThreadPoolExecutor does
                future.set_exception(err)
            else:
                future.set_result(result)
            finally:
                with self._lock:
                    self._running.pop(me, None)


def read_regular(path: str | None, limit: int = MAX_FILE) -> str | None:
    """The text of ``path`` if it is a regular UTF-8 file of at most ``limit`` bytes, else None."""
    if not path:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
        return data.decode("utf-8") if len(data) <= limit else None
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


__all__ = ["MAX_FILE", "Workers", "read_regular"]
