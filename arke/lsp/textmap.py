"""Offsets between two versions of a document.

The server keeps the symbols of the last text that parsed (see :mod:`arke.lsp.index`)
while the user types through a syntax error. To use them on the newer text, positions are
carried across the edit: everything before the changed region is where it was, everything
after it is shifted by the change in length, and a position inside the region has no
counterpart (the caller then falls back on the word under the cursor).
"""

from __future__ import annotations

from dataclasses import dataclass


def _common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix, by bisection on slice comparisons (C speed)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: str, b: str, limit: int) -> int:
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid:] == b[len(b) - mid:]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class TextMap:
    """Maps offsets of ``old`` text to ``new`` text and back, around one changed region."""

    old_len: int
    new_len: int
    prefix: int  # characters equal at the start
    suffix: int  # characters equal at the end (not overlapping the prefix)

    @classmethod
    def between(cls, old: str, new: str) -> TextMap:
        """The map from ``old`` to ``new``."""
        if old == new:
            return cls(len(old), len(new), len(old), 0)
        prefix = _common_prefix(old, new)
        suffix = _common_suffix(old, new, min(len(old), len(new)) - prefix)
        return cls(len(old), len(new), prefix, suffix)

    @property
    def identical(self) -> bool:
        return self.old_len == self.new_len == self.prefix

    def to_old(self, offset: int, end: bool = False) -> int | None:
        """Where ``offset`` of the new text was in the old one (None inside the changed region).

        A start offset names the character after it, an ``end`` offset the one before it: at
        the edge of an insertion the two map to different sides.
        """
        return self._map(offset, self.new_len, self.old_len, end)

    def to_new(self, offset: int, end: bool = False) -> int | None:
        """Where ``offset`` of the old text is in the new one (None inside the changed region)."""
        return self._map(offset, self.old_len, self.new_len, end)

    def _map(self, offset: int, src_len: int, dst_len: int, end: bool) -> int | None:
        changed = src_len - self.suffix  # where the unchanged end of the text starts
        if offset < self.prefix or (end and offset == self.prefix):
            return offset
        if offset > changed or (not end and offset == changed):
            return offset - src_len + dst_len
        return None


__all__ = ["TextMap"]
