"""Recording kernel calls as their native launches (arke.runtime.record) and replaying them: the same results
as calling again, a launch's error raised as the call raises it, and anything not replayable marked."""

from __future__ import annotations

import pytest
import torch

import arke
from arke.runtime.record import Recording, counted, record, recording


@pytest.fixture(scope="module")
def lib() -> arke.Library:
    return arke.build(arke.loads("import std.nn\n"), threads=2)


def _replay(rec: Recording, start: int = 0) -> None:
    for step in rec.steps:
        step(start)


def test_a_replay_reruns_the_launches_on_the_recorded_buffers(lib: arke.Library) -> None:
    x = torch.randn(37, 300)
    out = torch.empty(37, 300)
    rec = Recording()
    with record(rec):
        counted(recording(), "softmax", lambda: lib.softmax(x, out=out))
    assert rec.failed is None and rec.programs == 1 and recording() is None
    x.copy_(torch.randn(37, 300))  # new values in the same buffer
    out.zero_()
    _replay(rec)
    assert torch.equal(out, lib.softmax(x))


def test_a_replayed_launch_raises_the_calls_error(lib: arke.Library) -> None:
    ids, table = torch.tensor([0, 3, 1]), torch.randn(5, 8)
    rec = Recording()
    with record(rec):
        got = lib.embedding(ids, table)
    assert torch.equal(got, table[ids])
    ids[1] = 9  # past the table: the launch raises its error word
    with pytest.raises(arke.GuardError) as info:
        _replay(rec)
    assert info.value.rule == "index"


def test_launches_not_replayable_mark_the_recording(lib: arke.Library, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARKE_NO_TEAM", "1")  # launches on a Python thread pool: prepared as they run
    rec = Recording()
    with record(rec):
        lib.softmax(torch.randn(64, 256))
    assert rec.failed is not None and "one by one" in rec.failed
    rec = Recording()
    with record(rec):
        counted(rec, "nothing", lambda: None)  # a kernel call that recorded no launches
    assert rec.failed == "kernel `nothing` ran without a replayable launch sequence"


def test_recordings_do_not_nest() -> None:
    with record(Recording()), pytest.raises(RuntimeError, match="already on"), record(Recording()):
        pass
    assert recording() is None


def test_an_argument_copied_at_each_call_marks_the_recording(lib: arke.Library) -> None:
    x = torch.randn(300, 37).T  # a strided view: the call runs on a copy a replay would not refresh
    rec = Recording()
    with record(rec):
        got = lib.softmax(x)
    assert torch.equal(got, lib.softmax(x.contiguous()))
    assert rec.failed is not None and "argument `x` is a strided view" in rec.failed
