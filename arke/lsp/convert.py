"""Between Arke's spans and the Language Server Protocol's positions.

A :class:`~arke.lang.source.Span` counts 1-based lines and columns in characters (code
points); LSP counts 0-based lines and columns in the *code units* of the encoding agreed
at ``initialize`` (UTF-16 unless the client offers another), so a column after ``é`` or
``😋`` differs between the two. Every conversion goes through the document's
:class:`~pygls.workspace.position_codec.PositionCodec`, which knows the agreed encoding.

Diagnostics are built by :func:`arke.lang.render.to_lsp`, the function behind
``akc check --format json``, so the editor and the command line show the same codes,
messages, hints, related sites and quick-fix data; only the ranges are recomputed here,
in the agreed encoding (identical to ``akc``'s for UTF-16).
"""

from __future__ import annotations

import bisect
import re
from typing import Any

from lsprotocol import types
from pygls.protocol import default_converter
from pygls.workspace.position_codec import PositionCodec

from arke.lang.diagnostics import Diagnostic
from arke.lang.render import Sources, to_lsp, uri_for
from arke.lang.source import Span

_CONVERTER = default_converter()


_BARE_CR = re.compile(r"\r(?!\n)")


def lsp_text(text: str) -> str:
    """``text`` with each bare CR (an old Mac line end, a line break to LSP as to the checker) as LF: one character
    for one, so every position stays where the client has it, and the server's line indexes count it."""
    return _BARE_CR.sub("\n", text) if "\r" in text else text


class Text:
    """One document's text with a line index: offsets to LSP positions and back."""

    def __init__(self, text: str, codec: PositionCodec):
        self.text = text
        self.codec = codec
        starts = [0]
        pos = text.find("\n")
        while pos >= 0:
            starts.append(pos + 1)
            pos = text.find("\n", pos + 1)
        self.starts = starts

    def line(self, k: int) -> str:
        """The text of 0-based line ``k`` without its line break ('' past the end)."""
        if k < 0 or k >= len(self.starts):
            return ""
        start = self.starts[k]
        end = self.text.find("\n", start)
        return (self.text[start:] if end < 0 else self.text[start:end]).rstrip("\r")

    def position(self, offset: int) -> types.Position:
        """The LSP position of a character offset."""
        offset = max(0, min(offset, len(self.text)))
        k = bisect.bisect_right(self.starts, offset) - 1
        column = offset - self.starts[k]
        return types.Position(k, self.codec.client_num_units(self.text[self.starts[k]:self.starts[k] + column]))

    def offset(self, pos: types.Position) -> int:
        """The character offset of an LSP position (clamped to its line)."""
        if pos.line >= len(self.starts):
            return len(self.text)
        line = self.line(pos.line)
        units = 0
        for k, ch in enumerate(line):
            if units >= pos.character:
                return self.starts[pos.line] + k
            units += self.codec.client_num_units(ch)
        return self.starts[pos.line] + len(line)

    def range(self, start: int, end: int) -> types.Range:
        """The LSP range of the characters ``start`` to ``end``."""
        return types.Range(self.position(start), self.position(end))

    def full_range(self) -> types.Range:
        """The range of the whole document."""
        return self.range(0, len(self.text))


def span_range(span: Span, sources: Sources, codec: PositionCodec) -> types.Range:
    """The LSP range of ``span`` from its lines and columns, as ``akc check --format json`` computes it.

    A column past the end of its line (a file that ends early) is passed on as is.
    """
    return types.Range(_line_col(sources, span.file, span.line, span.col, codec),
                       _line_col(sources, span.file, span.end_line, span.end_col, codec))


def _line_col(sources: Sources, path: str, line: int, col: int, codec: PositionCodec) -> types.Position:
    text = sources.line(path, line)
    if text is None or col - 1 > len(text):
        return types.Position(max(line - 1, 0), max(col - 1, 0))
    return types.Position(line - 1, codec.client_num_units(text[: col - 1]))


def to_diagnostic(diag: Diagnostic, sources: Sources, codec: PositionCodec, uris: dict[str, str]) -> types.Diagnostic:
    """The LSP diagnostic of ``diag``: ``akc``'s JSON object, ranges in the agreed encoding.

    ``uris`` maps the paths of open documents to the URIs the client knows them by (which
    may be spelled differently from ``file://`` + the path, or not be files at all).
    """
    data: dict[str, Any] = to_lsp(diag, sources)
    data["range"] = _CONVERTER.unstructure(span_range(diag.span, sources, codec))
    for related, info in zip(diag.related, data.get("relatedInformation", ())):
        info["location"] = {"uri": uris.get(related.span.file) or uri_for(related.span.file),
                            "range": _CONVERTER.unstructure(span_range(related.span, sources, codec))}
    result: types.Diagnostic = _CONVERTER.structure(data, types.Diagnostic)
    return result


def diagnostic_data(diag: types.Diagnostic) -> dict[str, Any]:
    """The ``data`` of a diagnostic the client sent back (a dict, or {} when it has none)."""
    data = diag.data
    return data if isinstance(data, dict) else {}


__all__ = ["Text", "diagnostic_data", "lsp_text", "span_range", "to_diagnostic"]
