"""A team of native worker threads for the CPU runtime's parallel launches.

Handing a chunk to a pooled Python thread costs a futex wake-up and a GIL hand-off each way:
70-100 µs per launch on a shared virtual machine, as long as a decode step's whole matrix-vector
product. The team's workers are threads that never return from a JIT-compiled loop: each
watches its slot's sequence number (spinning with ``pause`` for a while after its last job, then
napping in growing ``usleep`` steps, so an idle team costs next to nothing), calls the job's
entry point through a trampoline, and publishes its completion. The calling thread runs the
first chunk itself, then waits for the others.

x86-64 only (its stores are seen in program order, which the hand-off relies on); elsewhere
:func:`team` returns None and the runtime uses a thread pool.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import platform
import threading
from collections.abc import Sequence
from typing import Any

#: Buffers an entry point may take (its trampoline is generated for each count up to this).
MAX_BUFFERS = 48
#: Polls with ``pause`` before a worker starts napping (a few hundred microseconds).
SPINS = 20000
#: Naps of 50 µs before they grow to 1 ms (an idle team then wakes 1000 times a second).
SHORT_NAPS = 200


class _Slot(ctypes.Structure):
    _fields_ = [("seq", ctypes.c_int64), ("done", ctypes.c_int64), ("fn", ctypes.c_void_p),
                ("args", ctypes.c_void_p), ("quit", ctypes.c_int64), ("pad", ctypes.c_int64 * 3)]


def _worker_ir() -> str:
    lines = [
        "declare i32 @usleep(i32)",
        "declare void @llvm.x86.sse2.pause()",
        "define void @arke_worker(ptr %s) {",
        "entry:",
        "  %last = alloca i64",
        "  %idle = alloca i64",
        "  %seqp = getelementptr i64, ptr %s, i64 0",
        "  %donep = getelementptr i64, ptr %s, i64 1",
        "  %fnp = getelementptr i64, ptr %s, i64 2",
        "  %argp = getelementptr i64, ptr %s, i64 3",
        "  %quitp = getelementptr i64, ptr %s, i64 4",
        "  %d0 = load atomic i64, ptr %donep acquire, align 8",
        "  store i64 %d0, ptr %last",
        "  store i64 0, ptr %idle",
        "  br label %poll",
        "poll:",
        "  %q = load atomic i64, ptr %quitp acquire, align 8",
        "  %stop = icmp ne i64 %q, 0",
        "  br i1 %stop, label %exit, label %check",
        "check:",
        "  %seq = load atomic i64, ptr %seqp acquire, align 8",
        "  %l = load i64, ptr %last",
        "  %new = icmp ne i64 %seq, %l",
        "  br i1 %new, label %run, label %wait",
        "run:",
        "  %fn = load ptr, ptr %fnp",
        "  %args = load ptr, ptr %argp",
        "  call void %fn(ptr %args)",
        "  store i64 %seq, ptr %last",
        "  store atomic i64 %seq, ptr %donep release, align 8",
        "  store i64 0, ptr %idle",
        "  br label %poll",
        "wait:",
        "  %n = load i64, ptr %idle",
        "  %n1 = add i64 %n, 1",
        "  store i64 %n1, ptr %idle",
        f"  %hot = icmp ult i64 %n, {SPINS}",
        "  br i1 %hot, label %pause, label %nap",
        "pause:",
        "  call void @llvm.x86.sse2.pause()",
        "  br label %poll",
        "nap:",
        f"  %long = icmp ugt i64 %n, {SPINS + SHORT_NAPS}",
        "  %us = select i1 %long, i32 1000, i32 50",
        "  %r = call i32 @usleep(i32 %us)",
        "  br label %poll",
        "exit:",
        "  ret void",
        "}",
    ]
    for n in range(MAX_BUFFERS + 1):  # arke_call_<n>(args): args = [fn, b0 .. b<n-1>, dims, lo, hi, err, scratch]
        body = [f"define void @arke_call_{n}(ptr %a) {{", "entry:", "  %f = load ptr, ptr %a"]
        names = []
        for k in range(n + 5):
            ty = "i64" if k in (n + 1, n + 2) else "ptr"
            body.append(f"  %p{k} = getelementptr i64, ptr %a, i64 {k + 1}")
            body.append(f"  %v{k} = load {ty}, ptr %p{k}")
            names.append(f"{ty} %v{k}")
        body += [f"  call void %f({', '.join(names)})", "  ret void", "}"]
        lines += body
    return "\n".join(lines)


class Team:
    """``workers`` native threads; :meth:`run` runs a launch's chunks on them and the caller."""

    def __init__(self, workers: int):
        from arke.targets.llvm.jit import _llvm, _new_target_machine, optimise

        llvm = _llvm()
        usleep = ctypes.cast(ctypes.CDLL(None).usleep, ctypes.c_void_p).value
        llvm.add_symbol("usleep", usleep)
        self.engine = llvm.create_mcjit_compiler(optimise(_worker_ir()), _new_target_machine())
        self.engine.finalize_object()
        self.trampolines = [self.engine.get_function_address(f"arke_call_{n}") for n in range(MAX_BUFFERS + 1)]
        worker = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(self.engine.get_function_address("arke_worker"))
        self.slots = (_Slot * workers)()
        self.args = [(ctypes.c_int64 * (MAX_BUFFERS + 6))() for _ in range(workers)]
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.closed = False
        self._worker = worker  # kept alive: the threads run it
        self.threads = [threading.Thread(target=worker, args=(ctypes.addressof(self.slots[k]),), daemon=True,
                                         name=f"arke-team-{k}") for k in range(workers)]
        for t in self.threads:
            t.start()

    def run(self, fn: Any, address: int, fixed: Sequence[int], chunks: Sequence[tuple[int, int, int, int]]) -> None:
        """Run ``fn(*fixed, lo, hi, err, scratch)`` for each chunk: the first here, the rest on the workers.

        ``fixed``: the buffer pointers and the dims pointer; ``address``: ``fn``'s entry point.
        """
        n = len(fixed) - 1
        with self.lock:
            if self.closed:  # replaced by a bigger team while this caller held the old one: run here
                for lo, hi, err, scratch in chunks:
                    fn(*fixed, lo, hi, err, scratch)
                return
            started = []
            for k, (lo, hi, err, scratch) in enumerate(chunks[1:]):
                slot, args = self.slots[k], self.args[k]
                args[0] = address
                for j, v in enumerate(fixed):
                    args[1 + j] = v
                args[n + 2], args[n + 3], args[n + 4], args[n + 5] = lo, hi, err, scratch
                slot.fn = self.trampolines[n]
                slot.args = ctypes.addressof(args)
                slot.seq += 1  # x86 keeps the stores above ahead of this one
                started.append((slot, slot.seq))
            lo, hi, err, scratch = chunks[0]
            fn(*fixed, lo, hi, err, scratch)
            for slot, seq in started:
                while slot.done != seq:
                    pass

    def close(self) -> None:
        """Let the workers leave their loop (after any launch in flight) and wait for them."""
        with self.lock:
            self.closed = True
            for slot in self.slots:
                slot.quit = 1
        for t in self.threads:
            t.join(timeout=1.0)


_X86 = platform.machine().lower() in ("x86_64", "amd64")
_TEAM: Team | None = None  # one team for the process, grown when a launch wants more chunks
_UNAVAILABLE = False  # the team could not be made here (no usleep, no JIT): the thread pool runs
_TEAM_LOCK = threading.Lock()


def _usable(found: Team | None, workers: int) -> bool:
    return found is not None and found.pid == os.getpid() and len(found.slots) >= workers


def team(threads: int) -> Team | None:
    """The process's team, with at least ``threads - 1`` workers (None where no team is available)."""
    global _TEAM, _UNAVAILABLE
    if threads < 2 or not _X86 or _UNAVAILABLE:
        return None
    found = _TEAM
    if _usable(found, threads - 1):
        return found
    with _TEAM_LOCK:
        old = _TEAM
        if _usable(old, threads - 1):
            return old
        mine = old is not None and old.pid == os.getpid()  # a forked child's copy has no threads behind it
        try:
            _TEAM = Team(max(threads - 1, len(old.slots) if old is not None and mine else 0))
        except (OSError, RuntimeError, AttributeError):
            _UNAVAILABLE = True
            return None
        if old is not None and mine:
            old.close()
        return _TEAM


@atexit.register
def _close_all() -> None:  # workers must leave their loop before the slots are freed
    if _TEAM is not None and _TEAM.pid == os.getpid():
        _TEAM.close()
