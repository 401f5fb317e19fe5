"""Source files and spans: where every AST node, IR value and diagnostic points."""

from __future__ import annotations

import bisect
import errno
import os
import re
import stat
from dataclasses import dataclass, field
from typing import BinaryIO

#: The most bytes akc reads from one source file or from standard input (16 MiB, over a hundred times the
#: largest program we know of): a longer one is refused with a message, never read into memory.
MAX_SOURCE_BYTES = 16 * 1024 * 1024
_LONE_CR = re.compile(r"\r(?!\n)")


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
        if "\r" in self.text:  # a lone CR (classic Mac) ends a line, as editors count them: same length, same offsets
            object.__setattr__(self, "text", _LONE_CR.sub("\n", self.text))
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

    def balanced(self, span: Span) -> Span:
        """``span`` widened over the parentheses around its ends that it leaves unmatched (an expression keeps
        the span of what is inside its parentheses, so `not (N > 0)` would end before its last `)`)."""
        text, start, end = self.text, span.start, span.end
        depth = opens = 0
        for ch in text[start:end]:
            if ch == "(":
                depth += 1
            elif ch == ")":
                if depth:
                    depth -= 1
                else:
                    opens += 1  # a `)` whose `(` lies before the span
        while opens:
            k = start - 1
            while k >= 0 and text[k] in " \t\r\n":
                k -= 1
            if k < 0 or text[k] != "(":
                break
            start, opens = k, opens - 1
        while depth:
            k = end
            while k < len(text) and text[k] in " \t\r\n":
                k += 1
            if k >= len(text) or text[k] != ")":
                break
            end, depth = k + 1, depth - 1
        return span if (start, end) == (span.start, span.end) else self.span(start, end)

    @property
    def line_count(self) -> int:
        return len(self._line_starts)


# ---------------------------------------------------------------- reading source files safely


class SourceFileError(OSError):
    """A path that names no regular file (a FIFO, a device, a socket, a folder), or a file too large to read.

    An :class:`OSError`, so every caller that reports unreadable files reports these the same way;
    ``strerror`` says what is wrong and ``hint`` what to do.
    """

    def __init__(self, code: int, message: str, path: str, hint: str) -> None:
        super().__init__(code, message, path)
        self.hint = hint


def file_kind(mode: int) -> str:
    """What a non-regular file is, for messages: ``a FIFO``, ``a character device`` …"""
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def check_regular(path: str, st: os.stat_result, limit: int = MAX_SOURCE_BYTES) -> None:
    """Raise :class:`SourceFileError` unless ``st`` (of ``path``, links followed) is a regular file of at
    most ``limit`` bytes."""
    if not stat.S_ISREG(st.st_mode):
        raise SourceFileError(errno.EINVAL, f"not a regular file (it is {file_kind(st.st_mode)})", path,
                              "only regular files are read as source")
    if st.st_size > limit:
        raise too_large(path, limit)


def too_large(path: str, limit: int = MAX_SOURCE_BYTES) -> SourceFileError:
    return SourceFileError(errno.EFBIG, f"larger than {limit // (1024 * 1024)} MiB, the most akc reads from "
                                        "one source file", path, "split the program into modules")


def read_source_bytes(path: str | os.PathLike[str], limit: int = MAX_SOURCE_BYTES) -> bytes:
    """The bytes of the regular file at ``path`` (a link is followed), at most ``limit`` of them.

    Never blocks on a FIFO and never reads a device: the path is checked with ``stat`` before it is
    opened (without blocking), and the open file again before it is read. Raises :class:`OSError`
    (:class:`SourceFileError` for a file that is not regular or too large).
    """
    name = os.fspath(path)
    check_regular(name, os.stat(name), limit)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(name, flags)
    try:
        check_regular(name, os.fstat(fd), limit)  # replaced between the stat and the open
        with os.fdopen(fd, "rb", closefd=False) as f:
            return read_bounded(f, name, limit)
    finally:
        os.close(fd)


def read_bounded(stream: BinaryIO, name: str, limit: int = MAX_SOURCE_BYTES) -> bytes:
    """Everything ``stream`` holds, or :class:`SourceFileError` once it has given more than ``limit`` bytes."""
    data = stream.read(limit + 1)
    if data is None:  # a non-blocking stream with nothing to read yet
        data = b""
    if len(data) > limit:
        raise too_large(name, limit)
    return data
