"""The native worker team (``arke.targets.llvm.team``): the same bits as one thread or the thread pool,
concurrent callers, a forked child, and the knob that turns it off."""

from __future__ import annotations

import multiprocessing
import platform
import threading

import pytest
import torch

import arke
from arke.targets.llvm import team

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                reason="the native team is x86-64 only (elsewhere the thread pool runs)")

SOURCE = """
kernel scale(x: f32[M, N], w: f32[N]) -> f32[M, N] { return x[m, n] * w[n] + 1.0 }
kernel rowsum(x: f32[M, N]) -> f32[M] { return sum(x[m, n] for n) }
"""


def _lib() -> object:
    return arke.build(arke.loads(SOURCE, "<team>"))


def test_team_runs_chunks_with_the_same_bits() -> None:
    assert team.team(2) is not None and team.team(1) is None
    lib = _lib()
    x, w = torch.randn(257, 300), torch.randn(300)
    one = lib.rowsum(x, threads=1)  # type: ignore[attr-defined]
    for threads in (2, 3, 4):
        assert torch.equal(lib.rowsum(x, threads=threads), one)  # type: ignore[attr-defined]
    assert torch.equal(lib.scale(x, w, threads=2), x * w + 1.0)  # type: ignore[attr-defined]


def test_without_the_team_the_pool_gives_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    lib = _lib()
    x = torch.randn(129, 1000)
    with_team = lib.rowsum(x, threads=2)  # type: ignore[attr-defined]
    monkeypatch.setenv("ARKE_NO_TEAM", "1")
    assert torch.equal(lib.rowsum(x, threads=2), with_team)  # type: ignore[attr-defined]


def test_concurrent_callers_share_the_team() -> None:
    lib = _lib()
    xs = [torch.randn(64 + k, 500) for k in range(4)]
    want = [lib.rowsum(x, threads=1) for x in xs]  # type: ignore[attr-defined]
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for _ in range(20):
                assert torch.equal(lib.rowsum(xs[k], threads=2), want[k])  # type: ignore[attr-defined]
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def _child(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    x = torch.ones(100, 64)
    queue.put(float(_lib().rowsum(x, threads=2).sum()))  # type: ignore[attr-defined]


def test_a_forked_child_gets_its_own_team() -> None:
    _lib().rowsum(torch.ones(10, 10), threads=2)  # type: ignore[attr-defined]  # the parent's team exists
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue,))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 0 and queue.get(timeout=5) == 6400.0


def _stalled_child(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    lib = _lib()
    x = torch.randn(300, 64, generator=torch.Generator().manual_seed(3))
    one = lib.rowsum(x, threads=1)  # type: ignore[attr-defined]
    found = team.team(4)
    assert found is not None
    for slot in found.slots:  # every worker leaves its loop (its sleep times out within 1 s), no job posted:
        slot.quit = 1         # as if the OS never scheduled them again
    for t in found.threads:
        t.join(timeout=5)
    queue.put(all(torch.equal(lib.rowsum(x, threads=4), one) for _ in range(3)))  # type: ignore[attr-defined]


def test_the_caller_runs_chunks_no_worker_has_claimed() -> None:
    # a launch never waits for a worker that has not started its chunk: the caller claims and runs it
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_stalled_child, args=(queue,))
    proc.start()
    proc.join(timeout=60)
    if proc.is_alive():
        proc.kill()
    assert proc.exitcode == 0 and queue.get(timeout=5) is True
