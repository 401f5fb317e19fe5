"""Parallel launches on torch's OpenMP runtime (``arke.targets.llvm.omp``): one pool for torch and Arke.

The same bits as one thread and as Arke's own team; a torch op and an Arke kernel alternating in one
loop, from one Python thread and from several; the default thread count following torch's."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

import arke
from arke.targets.llvm import omp

pytestmark = pytest.mark.skipif(omp.launcher() is None, reason="torch here runs no OpenMP runtime")

SOURCE = """
kernel rowsum(x: f32[M, N]) -> f32[M] { return sum(x[m, n] for n) }
kernel scale(x: f32[M, N], w: f32[N]) -> f32[M, N] { return x[m, n] * w[n] + 1.0 }
"""


def _lib(threads: int | None = None) -> Any:
    return arke.build(arke.loads(SOURCE, "<omp>"), threads=threads)


def test_launches_run_on_the_runtime_torch_loaded_with_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    found = omp.launcher()
    assert found is not None and found.runtime == omp.loaded_runtime()
    lib = _lib()
    x = torch.randn(1031, 333)
    one = lib.rowsum(x, threads=1)
    for threads in (2, 3, 7):
        assert torch.equal(lib.rowsum(x, threads=threads), one)
    monkeypatch.setenv("ARKE_NO_OMP", "1")  # Arke's own team: the same chunks, the same bits
    assert torch.equal(lib.rowsum(x, threads=3), one)


def test_default_thread_count_follows_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARKE_THREADS", raising=False)
    seen: list[int] = []
    real = omp.OmpLauncher.describe

    def spy(self: omp.OmpLauncher, address: int, fixed: Any, chunks: Any) -> Any:
        seen.append(len(chunks))  # each parallel launch is described once (then replayed) or per run
        return real(self, address, fixed, chunks)

    monkeypatch.setattr(omp.OmpLauncher, "describe", spy)
    lib = _lib()
    x = torch.randn(64, 64)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        lib.rowsum(x)
        assert seen == []  # one thread: no parallel region at all
        torch.set_num_threads(2)
        lib.rowsum(x)
        assert seen == [2]
    finally:
        torch.set_num_threads(before)
    assert _lib(threads=3).threads == 3  # an explicit count is kept


def _alternate(lib: Any, lin: torch.nn.Linear, xs: torch.Tensor, want: torch.Tensor, rounds: int) -> None:
    h = torch.randn(4, lin.in_features)
    for _ in range(rounds):
        lin(h)  # a torch op on the OpenMP team
        assert torch.equal(lib.rowsum(xs, threads=2), want)  # then Arke's launch on the same team


def test_torch_ops_and_kernels_alternate_from_one_and_several_threads() -> None:
    lib = _lib()
    lin = torch.nn.Linear(256, 256)
    xs = torch.randn(300, 128)
    want = lib.rowsum(xs, threads=1)
    _alternate(lib, lin, xs, want, 50)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            _alternate(lib, lin, xs, want, 30)
        except BaseException as err:  # reported below
            errors.append(err)

    workers = [threading.Thread(target=work) for _ in range(3)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in workers), "a launch did not finish"
    assert not errors, errors[0]
