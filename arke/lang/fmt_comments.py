"""The formatter's comments: each anchored to a printed token, then written back into the laid-out lines.

A comment alone on its line goes above the line of the code after it; one after code stays
at the end of that code's line (a second one on a joined line moves above). The source's
blank lines between comments, and before code, are kept where the layout allows.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lark import Token

from arke.lang.lark_parser import _lark

if TYPE_CHECKING:
    from arke.lang.fmt_layout import _Line

_CLOSERS = frozenset({"RPAR", "RSQB", "RBRACE"})


@dataclass(frozen=True)
class _Comment:
    text: str
    start: int
    trailing: bool  # after code on its line (else alone on its line)
    anchor: int | None  # start of the printed token it goes with; None: after the last one


class _Comments:
    """The comments of a file, each anchored to a printed token, and the source's blank lines."""

    def __init__(self, tokens: list[Token]):
        code = [t for t in tokens if t.type not in ("WS", "COMMENT")]
        dropped = {id(t) for k, t in enumerate(code)
                   if t.type == "SEMICOLON" or (t.type == "COMMA" and k + 1 < len(code)
                                                and code[k + 1].type in _CLOSERS)}
        #: the tokens the printer writes, in order (`;` and trailing commas are dropped)
        self.printed = [t for t in code if id(t) not in dropped]
        starts = [_start(t) for t in self.printed]
        #: token start -> whether a blank line precedes it in the source
        self.blank: dict[int, bool] = {}
        self.items: list[_Comment] = []
        last_code_line = 0
        for k, tok in enumerate(tokens):
            if tok.type == "WS":
                continue
            before = tokens[k - 1] if k else None
            self.blank[_start(tok)] = before is not None and before.type == "WS" and before.count("\n") >= 2
            if tok.type != "COMMENT":
                last_code_line = tok.end_line or 0
                continue
            at = bisect.bisect_left(starts, _start(tok))
            trailing = last_code_line == tok.line and at > 0
            anchor = starts[at - 1] if trailing else (starts[at] if at < len(starts) else None)
            self.items.append(_Comment(str(tok).rstrip(), _start(tok), trailing, anchor))

    def inside(self, lo: int, lo_leading: int, hi: int) -> bool:
        """Whether a comment goes with a token in [lo, hi] (one alone on its line: in [lo_leading, hi])."""
        return any(c.anchor is not None and (lo if c.trailing else lo_leading) <= c.anchor <= hi
                   for c in self.items)


def _start(tok: Token) -> int:
    return tok.start_pos or 0


# ---------------------------------------------------------------- comments back in


def _with_comments(lines: list[_Line], comments: _Comments) -> str:
    """The text of ``lines`` with every comment at its anchor's line."""
    bare = "\n".join(" " * line.indent + line.text for line in lines)
    out_tokens = list(_lark().lex(bare)) if lines else []
    printed = comments.printed
    if [(t.type, str(t)) for t in out_tokens] != [(t.type, str(t)) for t in printed]:
        raise RuntimeError("the formatter changed the program's tokens (a bug: please report it)")
    line_of = {_start(src): (out.line or 1) - 1 for src, out in zip(printed, out_tokens)}
    first_token: dict[int, int] = {}
    for src, out in zip(printed, out_tokens):
        first_token.setdefault((out.line or 1) - 1, _start(src))
    above: list[list[_Comment]] = [[] for _ in lines]  # the comments alone on their line, above it
    after: list[list[_Comment]] = [[] for _ in lines]  # those at the end of a line of code
    dangling: list[_Comment] = []
    for comment in comments.items:
        if comment.anchor is None:
            dangling.append(comment)
        else:
            (after if comment.trailing else above)[line_of[comment.anchor]].append(comment)

    text: list[str] = []
    blank = comments.blank
    for k, line in enumerate(lines):
        start = first_token[k]
        # every end-of-line comment but the last moves above the line
        group = sorted(above[k] + after[k][:-1], key=lambda c: c.start)
        first = min([start] + [c.start for c in group])
        gap = line.gap if line.gap is not None else int(blank[first])
        if not group and not line.last:
            gap = 0
        if text and gap:
            text.append("")
        indent = " " * (line.comment_indent if line.comment_indent is not None else line.indent)
        for j, comment in enumerate(group):
            if j and line.inner and blank[comment.start]:
                text.append("")
            text.append(indent + comment.text)
        if group and line.last and group[-1].start < start and blank[start]:
            text.append("")
        end = f"  {after[k][-1].text}" if after[k] else ""
        text.append(" " * line.indent + line.text + end)
    for comment in dangling:
        if text and blank[comment.start]:
            text.append("")
        text.append(comment.text)
    return "".join(t.rstrip() + "\n" for t in text)
