"""The `.ak` formatter: one canonical layout for every program (``akc fmt``, editors' "format").

:func:`format_source` parses the text with the language's own grammar and prints the tree
again, token for token, in this layout:

* two-space indentation; one statement or decision per line; no `;`, no trailing commas;
* one space around binary operators and ``=``, after ``,`` and ``:``; none inside brackets,
  none after a unary ``-``/``+``;
* items in their order, one blank line between them (between two imports, as written);
  blank lines inside a body are kept, at most one in a row;
* a kernel header is one line ``kernel f(PARAMS) -> OUT {`` when it fits in :data:`WIDTH`
  columns and has no ``where``. Otherwise the parameters fill lines aligned after ``(``,
  ``    -> OUT`` gets its own line once the header does not fit on one, each ``where`` is
  ``  where A, B`` on its own line, and ``{`` stands alone;
* a statement longer than :data:`WIDTH` breaks before the loosest operators, each
  continuation line starting with its operator, 4 columns in (an operand broken again
  continues under its own start); brackets break inside, aligned after the opening one.

Comments are kept where they are. A comment on its own line stays on its own line before
the code that follows it; a comment after code stays at the end of that code's line.
Where lines are joined, a second end-of-line comment moves to its own line above. A
parameter, output or ``where`` list holding a comment is laid out one entry per line,
so each comment stays with its entry.

The layout depends only on the tree (and on where comments sit), never on the old layout,
so formatting is idempotent; the printed tokens are checked to be the parsed ones.

This module is the entry point: ``arke.lang.fmt_layout`` (which defines :data:`WIDTH`)
lays the tree out as lines and ``arke.lang.fmt_comments`` puts the comments back in.
"""

from __future__ import annotations

from collections.abc import Sequence

from arke.lang.diagnostics import Diagnostic
from arke.lang.fmt_comments import _Comments, _with_comments
from arke.lang.fmt_layout import _Printer
from arke.lang.lark_parser import _lark
from arke.lang.parser import parse
from arke.lang.source import Source


class FormatError(ValueError):
    """The text does not parse, so it was not formatted; ``diagnostics`` are the syntax errors."""

    def __init__(self, diagnostics: Sequence[Diagnostic]):
        self.diagnostics = tuple(diagnostics)
        super().__init__("\n".join(str(d) for d in self.diagnostics))


def format_source(text: str, path: str = "<input>") -> str:
    """The canonical layout of `.ak` source ``text`` (``path`` names it in diagnostics).

    Raises :class:`FormatError` carrying the syntax diagnostics when the text does not parse.
    The result ends with one newline (an empty program gives ``""``).
    """
    if text.startswith("\ufeff"):  # a byte-order mark is white space to the parser
        text = " " + text[1:]
    text = Source(path, text).text  # lone CRs as line ends, as the parser reads them
    _, diagnostics = parse(text, path)
    syntax = [d for d in diagnostics if d.code.startswith("AK1")]
    if syntax:
        raise FormatError(syntax)
    lark = _lark()
    tokens = list(lark.lex(text, dont_ignore=True))
    comments = _Comments(tokens)
    lines = _Printer(comments).module(lark.parse(text))
    return _with_comments(lines, comments)
