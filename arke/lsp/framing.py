"""Cutting the client's byte stream into frames (``Content-Length: N`` headers, a blank line, N bytes).

pygls' own reader trusts every header: a frame whose length is too short leaves the rest of
its body in front of the next header, which then never matches again; one whose length is too
long swallows the start of the next frame, and the server waits for bytes that never come; a
huge length is allocated as asked. This reader keeps its own buffer and resynchronises:

* **Junk** (anything that is not a header block) is skipped up to the next ``Content-Length:``
  header, and reported. A header may have other headers around it (``Content-Type``), in any
  case, with bare ``\\n`` line ends.
* **A length beyond** :data:`MAX_BODY` is refused before anything is allocated; what follows
  is skipped as junk up to the next header.
* **A length too long** shows in one of two ways. Either a complete header block turns up
  inside the body — which no valid JSON can contain (outside a string ``Content-Length`` is no
  JSON token, inside one a raw line break is not allowed) — and the body is cut there; or no
  byte comes for a while (:data:`STALL_S`, the caller's timer) and what did come is a complete
  JSON value, which is then taken as the body.
* **A length too short** gives a body that is not JSON (the caller answers a parse error) and
  junk in front of the next header (skipped).

The reader only cuts: :meth:`FrameReader.feed` returns :class:`Frame` events, each a body (to
decode and handle) or a problem to report, or both (a body taken from a broken frame).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

#: The largest body accepted (bytes): a bigger ``Content-Length`` is refused without allocating.
MAX_BODY = 64 * 1024 * 1024
#: Seconds without a byte after which an incomplete body that is complete JSON is taken as it is.
STALL_S = 1.0
#: A header block longer than this (bytes) is no header block.
MAX_HEADER = 8192

#: Bytes kept at the end of junk: they may be the start of a header.
_TAIL = 32
_NAME = b"content-length:"
_START = re.compile(rb"content-length[ \t]*:", re.IGNORECASE)
# The length's line, then any further header lines (not a second length), then the blank line.
_BLOCK = re.compile(rb"content-length[ \t]*:[ \t]*(\d+)[ \t]*\r?\n"
                    rb"(?:(?!content-length)[!-9;-~]+[ \t]*:[^\r\n]*\r?\n)*\r?\n", re.IGNORECASE)
# What may stand before the length's header without being junk: other headers, blank space.
_HARMLESS = re.compile(rb"(?:\s|[!-9;-~]+[ \t]*:[^\r\n]*\r?\n)*")
_BLANK = re.compile(rb"\r?\n\r?\n")


@dataclass(frozen=True)
class Frame:
    """One event: a body to handle, a problem to report, or a body taken from a broken frame (both)."""

    body: bytes | None = None
    problem: str | None = None


def is_json(data: bytes) -> bool:
    """Whether ``data`` is one complete JSON value (and nothing else but blank space)."""
    try:
        json.loads(data)
    except (ValueError, RecursionError):
        return False
    return True


class FrameReader:
    """Turns the bytes read from the client into frames, resynchronising after a broken one."""

    def __init__(self, max_body: int = MAX_BODY) -> None:
        self.max_body = max_body
        self._buf = bytearray()
        self._length: int | None = None  # the body's declared length, while reading one
        self._scanned = 0  # how far the current body has been searched for a header
        self._junk = 0  # bytes skipped and not yet reported
        self._tried = -1  # the length of the incomplete body last tried as JSON on a stall
        self._told = False  # whether the incomplete body was reported

    @property
    def waiting(self) -> bool:
        """Whether a stall would settle something (an incomplete body, junk not yet reported)."""
        return self._length is not None or self._junk > 0

    def feed(self, data: bytes) -> list[Frame]:
        """The events the bytes ``data`` complete."""
        self._buf += data
        events: list[Frame] = []
        while self._step(events):
            pass
        return events

    def stalled(self) -> list[Frame]:
        """No byte came for a while: settle an incomplete body that is complete JSON, report junk."""
        events: list[Frame] = []
        buf, length = self._buf, self._length
        if length is None:
            self._report_junk(events)
            return events
        if len(buf) >= length:  # it waited on a header that straddles the body's end: none came
            events.append(Frame(bytes(buf[:length])))
            del buf[:length]
            self._end_body()
        elif len(buf) != self._tried and is_json(bytes(buf)):
            events.append(Frame(bytes(buf), f"a frame said Content-Length {length} but its body "
                                            f"ended after {len(buf)} bytes"))
            buf.clear()
            self._end_body()
        else:
            self._tried = len(buf)
            if not self._told:
                self._told = True
                events.append(Frame(None, f"waiting for the rest of a frame: {len(buf)} of the {length} "
                                          f"bytes its Content-Length announced have come"))
            return events
        while self._step(events):
            pass
        return events

    def eof(self) -> list[Frame]:
        """The client closed its end: what is left."""
        events = self.stalled()
        if self._length is not None:
            events.append(Frame(None, f"the input ended inside a frame ({len(self._buf)} of "
                                      f"{self._length} bytes)"))
        self._skip(len(self._buf))
        self._report_junk(events)
        return events

    # ------------------------------------------------------------ the two states

    def _step(self, events: list[Frame]) -> bool:
        """One step; whether another may follow."""
        return self._header(events) if self._length is None else self._body(events)

    def _header(self, events: list[Frame]) -> bool:
        """Looking for a header block: skip what precedes it, then start its body."""
        buf = self._buf
        start = _START.search(buf)
        if start is None:
            self._skip(len(buf) - _TAIL)  # what is left may begin a header
            return False
        s = start.start()
        block = _BLOCK.match(buf, s)
        if block is None:
            if _pending(buf, s):
                self._skip(s)
                return False
            self._skip(start.end(), harmless=False)  # no header after all
            return True
        digits, end = bytes(block.group(1)), block.end()  # (the match reads the buffer, which moves)
        self._skip(s)
        self._report_junk(events)
        del buf[:end - s]
        if len(digits) > 12 or int(digits) > self.max_body:
            shown = digits.decode() if len(digits) <= 20 else f"{digits[:8].decode()}... ({len(digits)} digits)"
            events.append(Frame(None, f"a frame's Content-Length {shown} is beyond the limit of "
                                      f"{self.max_body} bytes: refused, and what follows skipped up to "
                                      f"the next header"))
            return True
        self._length = int(digits)
        return True

    def _body(self, events: list[Frame]) -> bool:
        """Reading a body: cut it where a header block shows that its length was too long."""
        buf, length = self._buf, self._length
        assert length is not None
        cut = _first_block(buf, max(0, self._scanned - 256), length)
        if cut is not None:
            events.append(Frame(bytes(buf[:cut]), f"a frame said Content-Length {length} but the "
                                                  f"next frame's header began after {cut} bytes"))
            del buf[:cut]
            self._end_body()
            return True
        self._scanned = min(len(buf), length)
        if len(buf) < length:
            return False
        body = bytes(buf[:length])
        if _straddles(buf, length) and not is_json(body):
            return False  # the next header may begin inside this body: wait until it is whole (or a stall)
        del buf[:length]
        self._end_body()
        events.append(Frame(body))
        return True

    def _end_body(self) -> None:
        self._length, self._scanned, self._tried, self._told = None, 0, -1, False

    def _skip(self, n: int, harmless: bool | None = None) -> None:
        """Drop the first ``n`` bytes, counted as junk unless ``harmless`` (by default: unless they are
        blank space and header lines)."""
        if n <= 0:
            return
        if harmless is None:
            harmless = _HARMLESS.fullmatch(self._buf, 0, n) is not None
        if not harmless:
            self._junk += n
        del self._buf[:n]

    def _report_junk(self, events: list[Frame]) -> None:
        if self._junk:
            events.append(Frame(None, f"skipped {self._junk} bytes that were not part of a frame"))
            self._junk = 0


def _starts(buf: bytearray, lo: int, hi: int) -> list[int]:
    """Where a ``Content-Length:`` begins at ``lo`` to ``hi`` (it may run on past ``hi``)."""
    found = []
    m = _START.search(buf, lo)
    while m is not None and m.start() < hi:
        found.append(m.start())
        m = _START.search(buf, m.start() + 1)
    return found


def _first_block(buf: bytearray, lo: int, hi: int) -> int | None:
    """Where the first complete header block beginning at ``lo`` to ``hi`` begins."""
    return next((s for s in _starts(buf, lo, hi) if _BLOCK.match(buf, s) is not None), None)


def _straddles(buf: bytearray, length: int) -> bool:
    """Whether a header may be beginning inside the body's last bytes, not yet whole."""
    near_end = _starts(buf, max(0, length - MAX_HEADER), length)
    if any(_BLOCK.match(buf, s) is None and _pending(buf, s) for s in near_end):
        return True
    # The first bytes of one, at the very end of what came.
    return any(len(buf) - k < length and _NAME.startswith(bytes(buf[-k:]).lower()) for k in range(1, len(_NAME)))


def _pending(buf: bytearray, s: int) -> bool:
    """Whether the ``Content-Length:`` at ``s`` (whose block does not match) may still become a header
    block: no blank line after it yet, and not too long."""
    return len(buf) - s < MAX_HEADER and _BLANK.search(buf, s) is None


__all__ = ["MAX_BODY", "STALL_S", "Frame", "FrameReader", "is_json"]
