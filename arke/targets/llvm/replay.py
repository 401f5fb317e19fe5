"""A CPU kernel's launches prepared once for one set of buffers, then replayed.

A decode step calls the same kernels on the same buffers over and over: the memory plan's
outputs and temporaries, the layer's weights, the KV cache. Preparing each launch (pointer lists,
the chunks' argument blocks, the dims array with the prepacked panels' addresses, scratch from
the pool) cost 45-60 µs of Python per kernel call, about 3 ms of GPT-2's 30 ms decode step.

A :class:`Program` holds all of that as native arrays, built once for a call's buffer addresses
and sizes; a later call with the same addresses, sizes, thread count and launcher replays it:
one ctypes call per launch. Its scratch and error words are the kernel's own (one call of a
kernel uses them at a time; a concurrent call of the same kernel takes the prepared-per-call path).
The key holds :func:`arke.runtime.panels.generation`, so a weight packed into panels (or freed)
after a program was built is never read through a stale one.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import torch

#: Programs kept per call sizes (a layer's kernel is called on each layer's weights).
KEEP = 48


class Program:
    """The native calls of one kernel call: replayed with :meth:`run`."""

    __slots__ = ("errors", "keep", "steps")

    def __init__(self, errors: Any) -> None:
        self.steps: list[Callable[[], object]] = []
        self.errors = errors  # the kernel's error words (one per chunk)
        self.keep: list[object] = []  # the native arrays the steps point into

    def single(self, fn: Callable[..., None], args: Sequence[int | Any]) -> None:
        """A launch run on the calling thread: ``fn(*args)``."""
        fixed = tuple(args)
        self.keep.append(fixed)
        self.steps.append(lambda: fn(*fixed))

    def omp(self, launcher: Any, address: int, fixed: Sequence[int], chunks: Sequence[tuple[int, int, int, int]],
            threads: int) -> None:
        """A launch as one parallel region of the OpenMP runtime (:class:`~.omp.OmpLauncher`)."""
        desc, blocks = launcher.describe(address, fixed, chunks)
        self.keep += [desc, blocks]
        start, where, team = launcher.start, ctypes.addressof(desc), max(1, min(threads, len(chunks)))

        def step() -> None:
            desc[0] = 0  # the chunks' claim counter
            start(where, team)
        self.steps.append(step)

    def crew(self, team: Any, fn: Callable[..., None], address: int, fixed: Sequence[int],
             chunks: Sequence[tuple[int, int, int, int]]) -> None:
        """A launch on Arke's native team (:class:`~.team.Team`)."""
        fixed, chunks = list(fixed), list(chunks)
        self.keep += [team, fixed, chunks]
        self.steps.append(lambda: team.run(fn, address, fixed, chunks))

    def run(self) -> bool:
        """The launches in order, up to one that raised its error word (then False). The error words are
        zero before and after (a launch only ever sets them)."""
        errors = self.errors
        for step in self.steps:
            step()
            if any(errors):  # a later launch may read what this one could not write
                ctypes.memset(errors, 0, ctypes.sizeof(errors))
                return False
        return True


class Scratch:
    """A kernel's own scratch and error words for its replayed programs.

    The smaller ones it outgrows stay alive with it, so every program built on them stays valid (all of
    them run under the kernel's one lock); they are only ever outgrown a few times."""

    __slots__ = ("address", "bytes", "errors", "retired", "tensor")

    def __init__(self) -> None:
        self.tensor: torch.Tensor | None = None
        self.address, self.bytes = 0, 0
        self.errors = (ctypes.c_int64 * 1)()
        self.retired: list[object] = []

    def fit(self, nbytes: int, words: int) -> None:
        """At least ``nbytes`` of scratch and ``words`` error words for the programs built from now on."""
        if nbytes > self.bytes:
            self.retired.append(self.tensor)
            self.tensor = torch.empty(nbytes, dtype=torch.uint8)
            self.address, self.bytes = self.tensor.data_ptr(), nbytes
        if words > len(self.errors):
            self.retired.append(self.errors)
            self.errors = (ctypes.c_int64 * words)()
