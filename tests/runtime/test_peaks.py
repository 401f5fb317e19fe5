"""The measured limits' JIT'd loops (arke/runtime/peaks.py) and Ctrl-C: the workers always finish first."""

from __future__ import annotations

import threading
import time

import pytest

from arke.runtime import peaks


def test_an_interrupted_wait_still_waits_for_every_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during the FMA peak's measurement unwound the caller, which freed the JIT engine while the worker
    threads still ran its code: a segmentation fault (exit 139), not `akc: interrupted` (130)."""
    done: list[int] = []

    def work(k: int) -> None:
        time.sleep(0.2)
        done.append(k)

    workers = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for w in workers:
        w.start()
    real = threading.Thread.join
    calls = []

    def interrupted_once(self: threading.Thread, timeout: float | None = None) -> None:
        calls.append(self)
        if len(calls) == 1:
            raise KeyboardInterrupt
        real(self, timeout)

    monkeypatch.setattr(threading.Thread, "join", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        peaks._join(workers)
    assert sorted(done) == [0, 1] and not any(w.is_alive() for w in workers)

