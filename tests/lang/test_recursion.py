"""One raised recursion limit for the checker, the language server and the renderers (arke/lang/recursion.py)."""

from __future__ import annotations

import sys
import threading

from arke.lang.recursion import deep_recursion


def test_the_largest_limit_held_runs_and_the_first_comes_back() -> None:
    start = sys.getrecursionlimit()
    with deep_recursion(start + 3000):
        with deep_recursion(start + 1000):  # a smaller one held inside never lowers it
            assert sys.getrecursionlimit() == start + 3000
        assert sys.getrecursionlimit() == start + 3000
    assert sys.getrecursionlimit() == start


def test_a_holder_leaving_keeps_another_threads_limit() -> None:
    """The checker restored the limit it found while a renderer in another thread still walked a deep tree."""
    start = sys.getrecursionlimit()
    inside, leave = threading.Event(), threading.Event()
    seen: list[int] = []

    def render() -> None:
        with deep_recursion(start + 3000):
            inside.set()
            leave.wait(10)
            seen.append(sys.getrecursionlimit())

    worker = threading.Thread(target=render)
    worker.start()
    inside.wait(10)
    with deep_recursion(start + 2000):
        pass
    leave.set()
    worker.join()
    assert seen == [start + 3000] and sys.getrecursionlimit() == start
