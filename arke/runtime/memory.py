"""Memory plans: the buffers of a sequence of kernel calls placed in one arena by lifetime.

A buffer lives from the step that writes it to the last step that reads it. Two buffers
whose lifetimes overlap never share bytes; any others may. Placement is greedy (each buffer
at the lowest aligned offset clear of every placed buffer it overlaps in time, in a few
orders, the smallest arena kept), which for the chains of a decoder layer reaches or comes
close to the lower bound: the largest set of buffers alive at one step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

#: Offsets are multiples of this (a cache line; vector loads never straddle two buffers' lines).
ALIGN = 64


@dataclass
class Slot:
    """One buffer of the plan: its shape and dtype, the steps it lives over, its byte offset."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    first: int
    last: int
    offset: int = -1

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * torch.empty((), dtype=self.dtype).element_size()

    def overlaps(self, other: Slot) -> bool:
        return self.first <= other.last and other.first <= self.last


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class MemoryPlan:
    """Buffers placed in one arena; :meth:`bind` gives each a view of an arena tensor."""

    slots: list[Slot] = field(default_factory=list)
    arena_bytes: int = 0

    def add(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, first: int, last: int) -> None:
        if any(s.name == name for s in self.slots):
            raise ValueError(f"buffer {name!r} is planned twice")
        self.slots.append(Slot(name, shape, dtype, first, min(max(first, last), 1 << 30)))

    def place(self) -> MemoryPlan:
        """Give every buffer its offset; returns self.

        Greedy placement (each buffer at the lowest aligned offset clear of the placed buffers
        it overlaps in time) in a few orders — largest first, longest-lived first, earliest
        first — keeping the smallest arena."""
        orders = [lambda s: (-s.nbytes, s.first, s.name), lambda s: (s.first - s.last, -s.nbytes, s.name),
                  lambda s: (s.first, -s.nbytes, s.name)]
        best: dict[str, int] | None = None
        for order in orders:
            offsets = self._greedy(sorted(self.slots, key=order))
            size = max((offsets[s.name] + _aligned(s.nbytes) for s in self.slots), default=0)
            if best is None or size < self.arena_bytes:
                best, self.arena_bytes = offsets, size
        for s in self.slots:
            s.offset = (best or {}).get(s.name, 0)
        return self

    @staticmethod
    def _greedy(slots: list[Slot]) -> dict[str, int]:
        placed: list[tuple[Slot, int]] = []
        for slot in slots:
            busy = sorted((at, at + _aligned(p.nbytes)) for p, at in placed if p.overlaps(slot))
            at = 0
            for lo, hi in busy:
                if at + _aligned(slot.nbytes) <= lo:
                    break
                at = max(at, hi)
            placed.append((slot, at))
        return {s.name: at for s, at in placed}

    def peak_live_bytes(self) -> int:
        """The most bytes alive at any one step: what no placement can go below."""
        steps = {s.first for s in self.slots} | {s.last for s in self.slots}
        return max((sum(s.nbytes for s in self.slots if s.first <= t <= s.last) for t in steps), default=0)

    def bind(self, arena: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of ``arena`` (a uint8 tensor of at least :attr:`arena_bytes`), one per buffer name."""
        if arena.numel() < self.arena_bytes:
            raise ValueError(f"the arena has {arena.numel()} bytes; the plan needs {self.arena_bytes}")
        return {s.name: arena[s.offset:s.offset + s.nbytes].view(s.dtype).view(s.shape) for s in self.slots}

    def table(self) -> str:
        """One line per buffer: name, shape, bytes, steps and offset."""
        rows = [f"{s.name:<14} {list(s.shape)!s:<22} {s.nbytes:>12,} B  steps {s.first}-{s.last}  at {s.offset:,}"
                for s in sorted(self.slots, key=lambda s: (s.first, s.name))]
        rows.append(f"arena {self.arena_bytes:,} B; peak live {self.peak_live_bytes():,} B")
        return "\n".join(rows)
