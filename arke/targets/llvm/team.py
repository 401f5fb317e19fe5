"""A team of native worker threads for the CPU runtime's parallel launches.

Handing a chunk to a pooled Python thread costs a futex wake-up and a GIL hand-off each way:
70-100 µs per launch on a shared virtual machine, as long as a decode step's whole matrix-vector
product. The team's workers are threads that never return from a JIT-compiled loop: each
watches its slot's sequence number, calls the job's entry point through a trampoline, and
publishes its completion. The calling thread runs the first chunk itself, then runs every chunk
no worker has claimed yet (a worker claims its job with a compare-and-swap before running it), and
waits only for the chunks workers took: on a busy machine a descheduled worker never holds a
launch up for the OS's time slice.

After its last job a worker spins with ``pause`` for a few hundred microseconds, naps in 50 µs
steps for about 10 ms, and then sleeps in the kernel (``futex`` on its sequence number, with a
1 s timeout as a safety net): an idle team costs nothing. A caller posts jobs with the native
``arke_post``: it bumps each slot's sequence number with a locked instruction and,
only when that worker said it is asleep, wakes it (the worker announces its sleep and re-reads
the sequence number under the same fence, so a wake-up is never lost).

Linux on x86-64 only (its stores are seen in program order, which the hand-off relies on, and
``futex``); elsewhere :func:`team` returns None and the runtime uses a thread pool.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import platform
import sys
import threading
from collections.abc import Sequence
from typing import Any

#: Buffers an entry point may take (its trampoline is generated for each count up to this).
MAX_BUFFERS = 48
#: Polls with ``pause`` before a worker starts napping (a few hundred microseconds).
SPINS = 20000
#: Naps of 50 µs before a worker sleeps in the kernel until the next job (or quit) wakes it.
SHORT_NAPS = 200
_SYS_FUTEX = 202  # x86-64 Linux
_FUTEX_WAIT_PRIVATE, _FUTEX_WAKE_PRIVATE = 128, 129


class _Slot(ctypes.Structure):
    _fields_ = [("seq", ctypes.c_int64), ("done", ctypes.c_int64), ("fn", ctypes.c_void_p),
                ("args", ctypes.c_void_p), ("quit", ctypes.c_int64), ("sleeping", ctypes.c_int64),
                ("claim", ctypes.c_int64), ("pad", ctypes.c_int64)]


def _futex(op: int, word: str, value: str, timeout: str) -> str:
    return (f"call i64 (i64, ...) @syscall(i64 {_SYS_FUTEX}, ptr {word}, i64 {op}, i64 {value}, "
            f"ptr {timeout}, ptr null, i64 0)")


def _worker_ir() -> str:
    lines = [
        "declare i32 @usleep(i32)",
        "declare i64 @syscall(i64, ...)",
        "declare void @llvm.x86.sse2.pause()",
        "@timeout = private constant { i64, i64 } { i64 1, i64 0 }",
        "define void @arke_worker(ptr %s) {",
        "entry:",
        "  %last = alloca i64",
        "  %idle = alloca i64",
        "  %seqp = getelementptr i64, ptr %s, i64 0",
        "  %donep = getelementptr i64, ptr %s, i64 1",
        "  %fnp = getelementptr i64, ptr %s, i64 2",
        "  %argp = getelementptr i64, ptr %s, i64 3",
        "  %quitp = getelementptr i64, ptr %s, i64 4",
        "  %sleepp = getelementptr i64, ptr %s, i64 5",
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
        "  br i1 %new, label %job, label %wait",
        "job:",  # close() bumps the sequence number with no job behind it, after setting quit
        "  %q2 = load atomic i64, ptr %quitp acquire, align 8",
        "  %stop2 = icmp ne i64 %q2, 0",
        "  br i1 %stop2, label %exit, label %run",
        "run:",  # claim the job (the caller may have taken it while this worker was descheduled)
        "  %claimp = getelementptr i64, ptr %s, i64 6",
        "  %want = sub i64 %seq, 1",
        "  %cx = cmpxchg ptr %claimp, i64 %want, i64 %seq seq_cst seq_cst",
        "  %won = extractvalue { i64, i1 } %cx, 1",
        "  br i1 %won, label %call, label %taken",
        "taken:",  # the caller ran it and published its completion
        "  store i64 %seq, ptr %last",
        "  store i64 0, ptr %idle",
        "  br label %poll",
        "call:",
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
        "  br i1 %hot, label %pause, label %cool",
        "pause:",
        "  call void @llvm.x86.sse2.pause()",
        "  br label %poll",
        "cool:",
        f"  %warm = icmp ult i64 %n, {SPINS + SHORT_NAPS}",
        "  br i1 %warm, label %nap, label %sleep",
        "nap:",
        "  %r = call i32 @usleep(i32 50)",
        "  br label %poll",
        "sleep:",  # announce the sleep, then re-read seq: a poster sees one or the other (both fenced)
        "  store atomic i64 1, ptr %sleepp seq_cst, align 8",
        "  %seq2 = load atomic i64, ptr %seqp seq_cst, align 8",
        "  %l2 = load i64, ptr %last",
        "  %moved = icmp ne i64 %seq2, %l2",
        "  br i1 %moved, label %awake, label %block",
        "block:",  # the kernel sleeps only while seq still holds the value seen (its low 32 bits)
        "  %w = and i64 %l2, 4294967295",
        f"  %f = {_futex(_FUTEX_WAIT_PRIVATE, '%seqp', '%w', '@timeout')}",
        "  br label %awake",
        "awake:",
        "  store atomic i64 0, ptr %sleepp seq_cst, align 8",
        "  br label %poll",
        "exit:",
        "  ret void",
        "}",
        # arke_claim(slot, seq): 1 when the caller took job seq (its claim moved from seq - 1), else 0
        "define i64 @arke_claim(ptr %slot, i64 %seq) {",
        "entry:",
        "  %claimp = getelementptr i64, ptr %slot, i64 6",
        "  %want = sub i64 %seq, 1",
        "  %cx = cmpxchg ptr %claimp, i64 %want, i64 %seq seq_cst seq_cst",
        "  %won = extractvalue { i64, i1 } %cx, 1",
        "  %r = zext i1 %won to i64",
        "  ret i64 %r",
        "}",
        # arke_post(slots, n): bump the sequence number of slots 0 .. n-1, waking those asleep
        "define void @arke_post(ptr %slots, i64 %n) {",
        "entry:",
        "  %none = icmp eq i64 %n, 0",
        "  br i1 %none, label %done, label %loop",
        "loop:",
        "  %k = phi i64 [ 0, %entry ], [ %k1, %next ]",
        "  %base = mul i64 %k, 8",
        "  %sp = getelementptr i64, ptr %slots, i64 %base",
        "  %old = atomicrmw add ptr %sp, i64 1 seq_cst",
        "  %slp = getelementptr i64, ptr %sp, i64 5",
        "  %asleep = load atomic i64, ptr %slp seq_cst, align 8",
        "  %wake = icmp ne i64 %asleep, 0",
        "  br i1 %wake, label %wakeup, label %next",
        "wakeup:",
        f"  %r = {_futex(_FUTEX_WAKE_PRIVATE, '%sp', '1', 'null')}",
        "  br label %next",
        "next:",
        "  %k1 = add i64 %k, 1",
        "  %more = icmp ult i64 %k1, %n",
        "  br i1 %more, label %loop, label %done",
        "done:",
        "  ret void",
        "}",
    ]
    return "\n".join(lines) + "\n" + trampolines_ir()


def trampolines_ir() -> str:
    """``arke_call_<n>(args)`` for n buffers: calls ``args[0]`` with the words of a chunk's argument block,
    ``[fn, b0 .. b<n-1>, dims, lo, hi, err, scratch]`` (the same layout for the team and the OpenMP launcher)."""
    lines = []
    for n in range(MAX_BUFFERS + 1):
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
        libc = ctypes.CDLL(None)
        for name in ("usleep", "syscall"):
            llvm.add_symbol(name, ctypes.cast(getattr(libc, name), ctypes.c_void_p).value)
        self.engine = llvm.create_mcjit_compiler(optimise(_worker_ir()), _new_target_machine())
        self.engine.finalize_object()
        self.trampolines = [self.engine.get_function_address(f"arke_call_{n}") for n in range(MAX_BUFFERS + 1)]
        worker = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(self.engine.get_function_address("arke_worker"))
        self._post = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(
            self.engine.get_function_address("arke_post"))
        self._claim = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)(
            self.engine.get_function_address("arke_claim"))
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
                started.append((slot, slot.seq + 1))
            # bumps each started slot's seq (locked: the stores above go first) and wakes sleepers
            self._post(ctypes.addressof(self.slots), len(started))
            lo, hi, err, scratch = chunks[0]
            fn(*fixed, lo, hi, err, scratch)
            # a chunk no worker has claimed yet (its worker descheduled on a busy machine, or waking
            # from its sleep) runs here: the caller never waits for a thread the OS has not scheduled.
            # Chunks are fixed, so which thread runs one never changes a result.
            for (slot, seq), (lo, hi, err, scratch) in zip(started, chunks[1:]):
                if self._claim(ctypes.addressof(slot), seq):
                    fn(*fixed, lo, hi, err, scratch)
                    slot.done = seq
            for slot, seq in started:
                while slot.done != seq:
                    pass

    def close(self) -> None:
        """Let the workers leave their loop (after any launch in flight) and wait for them."""
        with self.lock:
            self.closed = True
            for slot in self.slots:
                slot.quit = 1
            self._post(ctypes.addressof(self.slots), len(self.slots))  # wakes the sleepers to see it
        for t in self.threads:
            t.join(timeout=1.0)


_X86 = platform.machine().lower() in ("x86_64", "amd64") and sys.platform.startswith("linux")
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


_ORPHANS: list[Team] = []  # a forked child's copies of the parent's teams: kept, never torn down there


def _forget_in_child() -> None:
    """A forked child has none of the parent's workers, and a lock some parent thread held stays held."""
    global _TEAM, _TEAM_LOCK
    if _TEAM is not None:
        _ORPHANS.append(_TEAM)
    _TEAM, _TEAM_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)
