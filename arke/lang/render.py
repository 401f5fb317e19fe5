"""Diagnostics for people and for editors.

Two renderings of the same :class:`~arke.lang.diagnostics.Diagnostic`:

* **Text** (``akc check``), in the style of compilers people already know::

      examples/attention.ak:9:35: error[AK2104]: index `e` is not bound on the left of `=`
         9 |   s[b, h, i, j] = sum(q[b, h, i, e] * k[b, h / R, j, d] for d) / sqrt(D)
           |                                 ^ did you mean `d`?

  Colours (through ``rich``, imported only then) are used only when the output is a
  terminal and ``NO_COLOR`` is not set (``FORCE_COLOR`` forces them); otherwise the text
  is plain and identical from run to run.
* **LSP** (``akc check --format json`` and the language server): ``Diagnostic`` objects
  of the Language Server Protocol, with 0-based ranges counted in UTF-16 code units.

The renderer needs the text of the files the spans point into: a :class:`Sources` holds
the texts it was given and reads any other file from disk on first use.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from arke.lang.diagnostics import Diagnostic, Severity
from arke.lang.source import Source, Span, read_source_bytes

#: How each severity is labelled in text, and its colour.
_LABELS: dict[Severity, tuple[str, str]] = {
    Severity.ERROR: ("error", "bold red"),
    Severity.WARNING: ("warning", "bold yellow"),
    Severity.INFO: ("info", "bold blue"),
    Severity.HINT: ("hint", "bold cyan"),
}
_NOTE_STYLE = "bold cyan"
_GUTTER_STYLE = "bold blue"
_TAB = 4

# C0/C1 control characters (tab aside) would move the cursor or inject escapes in a
# terminal: each is shown as one replacement character, which keeps carets aligned.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


# ---------------------------------------------------------------- source texts


class Sources:
    """The texts of source files by path: the ones given, then any other read from disk once.

    Paths that are not files (``<input>``, ``-``, ``<unknown>``) have text only if given.
    A file that cannot be read renders without its source lines.
    """

    def __init__(self, texts: Mapping[str, str] | None = None):
        self._files: dict[str, Source | None] = {}
        for path, text in (texts or {}).items():
            self.add(path, text)

    def add(self, path: str, text: str) -> None:
        """Record the text of ``path`` (what was checked, which may differ from the disk)."""
        self._files[path] = Source(path, text.removeprefix("\ufeff"))  # as check_text reads it

    def get(self, path: str) -> Source | None:
        """The source of ``path``, or None when it is unknown and unreadable."""
        if path not in self._files:
            self._files[path] = _read_source(path)
        return self._files[path]

    def line(self, path: str, line: int) -> str | None:
        """The text of 1-based ``line`` of ``path`` without its line break, or None."""
        src = self.get(path)
        if src is None or line < 1 or line > src.line_count:
            return None
        return src.line_text(line).rstrip("\r")


def _read_source(path: str) -> Source | None:
    if not path or path == "-" or path.startswith("<"):
        return None
    try:
        data = read_source_bytes(path)  # never a FIFO or a device: a diagnostic about one must not hang
    except OSError:
        return None
    return Source(path, data.decode("utf-8", errors="replace").removeprefix("\ufeff"))  # as check_text reads it


def _as_sources(sources: Sources | Mapping[str, str] | None) -> Sources:
    return sources if isinstance(sources, Sources) else Sources(sources)


# ---------------------------------------------------------------- text: building lines

#: A rendered line: (text, rich style or "") pieces.
Line = list[tuple[str, str]]


def _clean(text: str) -> str:
    return _CONTROL.sub("\ufffd", text)


def _cell_width(text: str) -> int:
    """Terminal cells taken by ``text`` (wide East Asian characters take two, combining marks none)."""
    width = 0
    for ch in text:
        if unicodedata.combining(ch):
            continue
        width += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return width


def _column(line: str, col: int) -> int:
    """The display cell (0-based) where 1-based character column ``col`` of ``line`` starts."""
    prefix = line[: max(col - 1, 0)]
    return _cell_width(prefix.expandtabs(_TAB)) + max(col - 1 - len(line), 0)


@dataclass(frozen=True)
class _Mark:
    """One underlined source line: its number, text and the cells [start, end) to underline."""

    number: int
    text: str
    start: int
    end: int
    first: bool  # starts with `^` (the span starts on this line)


def _marks(span: Span, sources: Sources) -> list[_Mark | None]:
    """The source lines to show under a header for ``span`` (None stands for skipped lines)."""
    first = sources.line(span.file, span.line)
    if first is None:
        return []
    end_line, end_col = span.end_line, span.end_col
    if end_line > span.line and end_col <= 1:  # the span ends at a line break: stop at the line before
        end_line -= 1
        end_col = len(sources.line(span.file, end_line) or "") + 1
    last = sources.line(span.file, end_line) if end_line > span.line else None
    start = _column(first, span.col)
    if last is None:
        end = _column(first, end_col) if end_line == span.line else _cell_width(first.expandtabs(_TAB))
        return [_Mark(span.line, first, start, max(end, start + 1), True)]
    out: list[_Mark | None] = [
        _Mark(span.line, first, start, max(_cell_width(first.expandtabs(_TAB)), start + 1), True)
    ]
    if end_line - span.line > 1:
        out.append(None)
    indent = len(last) - len(last.lstrip())
    lo = _column(last, indent + 1)
    out.append(_Mark(end_line, last, lo, max(_column(last, end_col), lo + 1), False))
    return out


def _excerpt(span: Span, sources: Sources, style: str, hint: str | None) -> list[Line]:
    """Source lines of ``span`` with ``^~~~`` under it and ``hint`` after the last underline."""
    marks = _marks(span, sources)
    if not marks:
        return [[("  = ", _GUTTER_STYLE), ("hint: ", "bold"), (_clean(hint), "")]] if hint else []
    width = max(len(str(m.number)) for m in marks if m is not None)
    blank = " " * width + " | "
    lines: list[Line] = []
    for i, mark in enumerate(marks):
        if mark is None:
            lines.append([(" " * width + " ...", _GUTTER_STYLE)])
            continue
        text = _clean(mark.text).expandtabs(_TAB)
        lines.append([(f"{mark.number:>{width}} | ", _GUTTER_STYLE), (text, "")])
        under = ("^" if mark.first else "~") + "~" * (mark.end - mark.start - 1)
        row: Line = [(blank, _GUTTER_STYLE), (" " * mark.start, ""), (under, style)]
        if hint and i == len(marks) - 1:
            row.append((" " + _clean(hint), style))
        lines.append(row)
    return lines


def diagnostic_lines(diag: Diagnostic, sources: Sources | Mapping[str, str] | None = None) -> list[Line]:
    """The text rendering of one diagnostic as styled lines (header, source, related notes)."""
    srcs = _as_sources(sources)
    label, style = _LABELS.get(diag.severity, ("error", "bold red"))
    lines: list[Line] = [[
        (f"{diag.span}: ", "bold"),
        (f"{label}[{diag.code}]", style),
        (": " + _clean(diag.message), "bold"),
    ]]
    lines += _excerpt(diag.span, srcs, style, diag.hint)
    for rel in diag.related:
        lines.append([(f"{rel.span}: ", "bold"), ("note", _NOTE_STYLE), (": " + _clean(rel.message), "")])
        lines += _excerpt(rel.span, srcs, _NOTE_STYLE, None)
    return lines


def render_text(diagnostics: Iterable[Diagnostic], sources: Sources | Mapping[str, str] | None = None) -> str:
    """Plain text of ``diagnostics`` (no colour), one block per diagnostic, ending in a newline."""
    srcs = _as_sources(sources)
    out: list[str] = []
    for diag in diagnostics:
        out += ["".join(text for text, _ in line) for line in diagnostic_lines(diag, srcs)]
    return "".join(line.rstrip() + "\n" for line in out)


# ---------------------------------------------------------------- text: output


def use_color(stream: IO[str]) -> bool:
    """Whether to colour output to ``stream``: a terminal, unless ``NO_COLOR``; or ``FORCE_COLOR``."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):  # a closed or odd stream: plain text is always safe
        return False


def print_lines(lines: Iterable[Line], stream: IO[str], color: bool | None = None) -> None:
    """Write styled lines to ``stream``: through rich when colouring, as plain text otherwise."""
    if color is None:
        color = use_color(stream)
    if not color:
        stream.write("".join("".join(t for t, _ in line).rstrip() + "\n" for line in lines))
        stream.flush()
        return
    from rich.console import Console  # costs import time: only when colouring
    from rich.text import Text

    console = Console(file=stream, force_terminal=True, no_color=False, highlight=False, soft_wrap=True,
                      emoji=False, markup=False)
    for line in lines:
        console.print(Text.assemble(*((t, s) if s else t for t, s in line)))


def print_diagnostics(
    diagnostics: Iterable[Diagnostic],
    sources: Sources | Mapping[str, str] | None = None,
    stream: IO[str] | None = None,
    color: bool | None = None,
) -> None:
    """Print ``diagnostics`` for a person to ``stream`` (stdout by default).

    ``color``: None decides by :func:`use_color`; True or False forces it.
    """
    import sys

    srcs = _as_sources(sources)
    lines = [line for diag in diagnostics for line in diagnostic_lines(diag, srcs)]
    print_lines(lines, stream or sys.stdout, color)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def summary(diagnostics: Iterable[Diagnostic], files: int) -> str:
    """The closing line of ``akc check``: ``2 errors, 1 warning in 3 files`` or ``ok: 3 files``."""
    diags = list(diagnostics)
    errors = sum(d.severity == Severity.ERROR for d in diags)
    warnings = sum(d.severity == Severity.WARNING for d in diags)
    if not errors and not warnings:
        return f"ok: {_plural(files, 'file')}"
    parts = ([_plural(errors, "error")] if errors else []) + ([_plural(warnings, "warning")] if warnings else [])
    return f"{', '.join(parts)} in {_plural(files, 'file')}"


# ---------------------------------------------------------------- LSP


def uri_for(path: str) -> str:
    """The LSP document URI of ``path``: ``file://`` and the absolute path; ``-``, ``<input>`` as given."""
    if not path or path == "-" or path.startswith("<") or "://" in path:
        return path
    return Path(os.path.abspath(path)).as_uri()


def _utf16(text: str) -> int:
    # a lone surrogate (legal in JSON text) counts one unit, as an editor counts it: never an encoding error
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def lsp_position(path: str, line: int, col: int, sources: Sources) -> dict[str, int]:
    """LSP ``Position`` of 1-based (line, col): 0-based, the character counted in UTF-16 units."""
    text = sources.line(path, line)
    if text is None or col - 1 > len(text):
        return {"line": max(line - 1, 0), "character": max(col - 1, 0)}
    return {"line": line - 1, "character": _utf16(text[: col - 1])}


def lsp_range(span: Span, sources: Sources | Mapping[str, str] | None = None) -> dict[str, dict[str, int]]:
    """LSP ``Range`` of ``span`` (0-based, end exclusive)."""
    srcs = _as_sources(sources)
    return {
        "start": lsp_position(span.file, span.line, span.col, srcs),
        "end": lsp_position(span.file, span.end_line, span.end_col, srcs),
    }


def to_lsp(diag: Diagnostic, sources: Sources | Mapping[str, str] | None = None) -> dict[str, Any]:
    """One LSP ``Diagnostic`` object (a JSON-ready dict) for ``diag``.

    The message carries the hint on a second line; ``data.replacement`` is the quick fix
    (the text to put at ``range``) when the diagnostic has one.
    """
    srcs = _as_sources(sources)
    message = diag.message + (f"\nhint: {diag.hint}" if diag.hint else "")
    out: dict[str, Any] = {
        "range": lsp_range(diag.span, srcs),
        "severity": int(diag.severity),
        "code": diag.code,
        "source": "akc",
        "message": message,
    }
    if diag.related:
        out["relatedInformation"] = [
            {"location": {"uri": uri_for(r.span.file), "range": lsp_range(r.span, srcs)}, "message": r.message}
            for r in diag.related
        ]
    if diag.replacement is not None:
        out["data"] = {"replacement": diag.replacement}
    return out


def file_report(path: str, diagnostics: Iterable[Diagnostic],
                sources: Sources | Mapping[str, str] | None = None) -> dict[str, Any]:
    """``{"path", "uri", "diagnostics"}``: one file's entry in ``akc check --format json``."""
    srcs = _as_sources(sources)
    return {"path": path, "uri": uri_for(path), "diagnostics": [to_lsp(d, srcs) for d in diagnostics]}


__all__ = [
    "Sources",
    "diagnostic_lines",
    "file_report",
    "lsp_range",
    "print_diagnostics",
    "render_text",
    "summary",
    "to_lsp",
    "uri_for",
    "use_color",
]
