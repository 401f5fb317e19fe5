"""Source files and spans: where every AST node, IR value and diagnostic points."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Span:
    """A half-open region of one source file. Lines and columns are 1-based, as editors show them."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int
    start: int = 0  # character offsets, for slicing the text
    end: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def cover(self, other: Span) -> Span:
        """The smallest span holding both ``self`` and ``other`` (same file)."""
        first = self if self.start <= other.start else other
        end = self if self.end >= other.end else other
        return Span(self.file, first.line, first.col, end.end_line, end.end_col, first.start, end.end)


NO_SPAN = Span("<unknown>", 1, 1, 1, 1, 0, 0)


@dataclass(frozen=True)
class Source:
    """The text of one file with a line index, so offsets map to (line, column) quickly."""

    path: str
    text: str
    _line_starts: tuple[int, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        starts = [0]
        for i, ch in enumerate(self.text):
            if ch == "\n":
                starts.append(i + 1)
        object.__setattr__(self, "_line_starts", tuple(starts))

    def line_text(self, line: int) -> str:
        """The text of 1-based ``line`` without its newline ('' past the end)."""
        if line < 1 or line > len(self._line_starts):
            return ""
        start = self._line_starts[line - 1]
        end = self.text.find("\n", start)
        return self.text[start:] if end < 0 else self.text[start:end]

    def position(self, offset: int) -> tuple[int, int]:
        """1-based (line, column) of a character offset."""
        offset = max(0, min(offset, len(self.text)))
        line = bisect.bisect_right(self._line_starts, offset)
        return line, offset - self._line_starts[line - 1] + 1

    def span(self, start: int, end: int) -> Span:
        """The span of characters ``start`` to ``end`` (offsets)."""
        line, col = self.position(start)
        end_line, end_col = self.position(max(start, end))
        return Span(self.path, line, col, end_line, end_col, start, max(start, end))

    @property
    def line_count(self) -> int:
        return len(self._line_starts)
