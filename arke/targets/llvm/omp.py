"""Parallel launches on the OpenMP runtime torch has loaded: one pool of worker threads for torch and Arke.

torch's CPU wheels run ATen's parallel regions on OpenMP (libgomp). After each region its
workers spin for a while (libgomp's default wait policy) waiting for the next one. A second
pool of threads in the process, Arke's own team, then fights them for the cores: a decode
step alternating with torch ops ran at half its speed alone (issue 20). Running Arke's launches
as OpenMP parallel regions of the *same* runtime hands them to those spinning workers instead,
so torch ops and Arke kernels share one team. No environment variable is read or set: the
team's size is the launch's thread count (by default ``torch.get_num_threads()``), its waiting
is the runtime's.

A launch is one call of ``arke_omp_launch(desc, threads)``, JIT-compiled against the runtime's
``GOMP_parallel`` (libgomp's entry point, which LLVM's and Intel's runtimes also export). Every
thread of the region, the caller included, claims chunks with an atomic counter until none are
left: the chunks are fixed, so which thread runs one never changes a result, and a thread that
wakes late finds the work done. A forked child (libgomp's pool is not fork-safe) and a process
whose torch uses no OpenMP runtime use the native team (:mod:`.team`) instead.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from collections.abc import Callable, Sequence

from arke.targets.llvm.team import MAX_BUFFERS, trampolines_ir

#: the OpenMP runtimes whose ``GOMP_parallel`` a launch may call (libgomp; LLVM's and Intel's export it too)
_RUNTIME = re.compile(r"/lib(gomp|omp|iomp5)(-[0-9a-f]+)?\.so(\.[0-9]+)*$")


def _body_ir() -> str:
    # desc: [next (atomic), count, trampoline, first argument block, bytes per block]
    return "\n".join([
        "declare void @GOMP_parallel(ptr, ptr, i32, i32)",
        "define internal void @arke_omp_body(ptr %d) {",
        "entry:",
        "  %cp = getelementptr i64, ptr %d, i64 1",
        "  %count = load i64, ptr %cp",
        "  %tp = getelementptr i64, ptr %d, i64 2",
        "  %tramp = load ptr, ptr %tp",
        "  %bp = getelementptr i64, ptr %d, i64 3",
        "  %base = load ptr, ptr %bp",
        "  %sp = getelementptr i64, ptr %d, i64 4",
        "  %stride = load i64, ptr %sp",
        "  br label %claim",
        "claim:",
        "  %k = atomicrmw add ptr %d, i64 1 monotonic",
        "  %more = icmp slt i64 %k, %count",
        "  br i1 %more, label %run, label %done",
        "run:",
        "  %off = mul i64 %k, %stride",
        "  %a = getelementptr i8, ptr %base, i64 %off",
        "  call void %tramp(ptr %a)",
        "  br label %claim",
        "done:",
        "  ret void",
        "}",
        "define void @arke_omp_launch(ptr %d, i64 %threads) {",
        "entry:",
        "  %t = trunc i64 %threads to i32",
        "  call void @GOMP_parallel(ptr @arke_omp_body, ptr %d, i32 %t, i32 0)",
        "  ret void",
        "}",
    ])


def loaded_runtime() -> str | None:
    """The path of the OpenMP runtime torch runs its parallel regions on, when it has loaded one."""
    import torch

    if "OpenMP" not in torch.__config__.parallel_info().split("ATen parallel backend:")[-1]:
        return None
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(" ")[-1]
                if _RUNTIME.search(path):
                    return path
    except OSError:
        pass
    return None


class OmpLauncher:
    """Runs a launch's chunks as one parallel region of the process's OpenMP runtime."""

    def __init__(self, runtime: str):
        from arke.targets.llvm.jit import _llvm, _new_target_machine, optimise

        lib = ctypes.CDLL(runtime, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)  # the copy torch loaded, not a second one
        llvm = _llvm()
        llvm.add_symbol("GOMP_parallel", ctypes.cast(lib.GOMP_parallel, ctypes.c_void_p).value)
        self.runtime = runtime
        self.engine = llvm.create_mcjit_compiler(optimise(_body_ir() + "\n" + trampolines_ir()),
                                                 _new_target_machine())
        self.engine.finalize_object()
        self.trampolines = [self.engine.get_function_address(f"arke_call_{n}") for n in range(MAX_BUFFERS + 1)]
        self._launch = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(
            self.engine.get_function_address("arke_omp_launch"))
        self.pid = os.getpid()

    def describe(self, address: int, fixed: Sequence[int],
                 chunks: Sequence[tuple[int, int, int, int]]) -> tuple[ctypes.Array[ctypes.c_int64],
                                                                       ctypes.Array[ctypes.c_int64]]:
        """The native launch of entry point ``address`` on each chunk ``(lo, hi, err, scratch)`` with
        ``fixed`` (the buffer pointers and the dims pointer): the descriptor :meth:`start` takes (its
        first word, the claim counter, must be 0 at the start) and the argument blocks it points into."""
        n = len(fixed) - 1
        width = n + 6
        blocks = (ctypes.c_int64 * (width * len(chunks)))()
        for k, (lo, hi, err, scratch) in enumerate(chunks):
            at = k * width
            blocks[at] = address
            blocks[at + 1:at + 1 + len(fixed)] = list(fixed)
            blocks[at + n + 2], blocks[at + n + 3], blocks[at + n + 4], blocks[at + n + 5] = lo, hi, err, scratch
        desc = (ctypes.c_int64 * 5)(0, len(chunks), self.trampolines[n], ctypes.addressof(blocks), 8 * width)
        return desc, blocks

    def run(self, address: int, fixed: Sequence[int], chunks: Sequence[tuple[int, int, int, int]],
            threads: int) -> None:
        """Run entry point ``address`` on each chunk ``(lo, hi, err, scratch)`` with ``fixed`` (the buffer
        pointers and the dims pointer) on up to ``threads`` threads of the runtime, the caller among them."""
        desc, blocks = self.describe(address, fixed, chunks)
        self.start(ctypes.addressof(desc), max(1, min(threads, len(chunks))))
        del blocks  # alive until the region has ended

    @property
    def start(self) -> Callable[[int, int], None]:
        """``start(descriptor address, threads)``: one parallel region over a :meth:`describe`'d launch."""
        return self._launch


_LAUNCHER: OmpLauncher | None = None
_TRIED = False
_LOCK = threading.Lock()


def launcher() -> OmpLauncher | None:
    """The process's OpenMP launcher (None without a loaded OpenMP runtime, or in a forked child)."""
    global _LAUNCHER, _TRIED
    found = _LAUNCHER
    if found is not None:
        return found if found.pid == os.getpid() else None
    if _TRIED:
        return None
    with _LOCK:
        if not _TRIED:
            runtime = loaded_runtime()
            try:
                _LAUNCHER = OmpLauncher(runtime) if runtime is not None else None
            except (OSError, AttributeError, RuntimeError):  # no GOMP_parallel in it, or no JIT here
                _LAUNCHER = None
            _TRIED = True
    return _LAUNCHER if _LAUNCHER is not None and _LAUNCHER.pid == os.getpid() else None

