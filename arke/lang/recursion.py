"""Python's recursion limit, raised while deep trees are walked: the checker's, the language server's and every
renderer's (an operator chain or a fused chain of statements is a tree hundreds of levels deep, a few Python
frames a level). One mechanism for all of them, safe across threads: each holder asks for a limit, the
process runs at the largest one asked for while any is held, and the limit found first comes back when the last
one lets go (restoring it while another thread still walked a deep tree gave that one a RecursionError)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LOCK = threading.Lock()
_held: list[int] = []
_found = 0


@contextmanager
def deep_recursion(limit: int) -> Iterator[None]:
    """Run the body with Python's recursion limit at least ``limit`` (never lowered below what it was)."""
    global _found
    with _LOCK:
        if not _held:
            _found = sys.getrecursionlimit()
        _held.append(limit)
        sys.setrecursionlimit(max([_found, *_held]))
    try:
        yield
    finally:
        with _LOCK:
            _held.remove(limit)
            sys.setrecursionlimit(max([_found, *_held]))


__all__ = ["deep_recursion"]
