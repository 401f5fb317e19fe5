"""Syntax errors in words: Lark's errors turned into diagnostics that say what was expected.

No diagnostic shows Lark's internals: terminals are named as a reader would ("a name",
"the end of the file"), the list of what would fit is kept short, an unclosed bracket is
pointed at, and common slips get a hint. Input nested too deep or too long to build a tree
of is reported here too.
"""

from __future__ import annotations

import re
from functools import lru_cache

from lark import Token
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from arke.lang.diagnostics import Diagnostic, make
from arke.lang.lark_parser import _lark
from arke.lang.source import Source

_WORDS = {
    "NAME": "a name",
    "INT": "an integer",
    "FLOAT": "a number",
    "COMP_OP": "a comparison",
    "ADD_OP": "`+` or `-`",
    "MUL_OP": "an operator",
    "$END": "the end of the file",
}


@lru_cache(maxsize=1)
def _terminal_words() -> dict[str, str]:
    words = dict(_WORDS)
    for term in _lark().terminals:
        if term.name not in words and term.pattern.type == "str":
            words[term.name] = f"`{term.pattern.value}`"
    return words


# Terminals that would only continue an expression: listed only when nothing else fits,
# so "expected `)` or `,`" is not drowned in every operator the expression could take.
_CONTINUATIONS = frozenset({"ADD_OP", "MUL_OP", "COMP_OP", "DOT", "LPAR", "LSQB", "IF", "IN", "AND", "OR",
                            "FOR", "__ANON_0", "__ANON_1", "POW", "STAR", "AT"}) | frozenset(
    {"SHIFT_OP", "BITOR_OP", "BITXOR_OP", "BITAND_OP"})  # the bitwise operators (spec §8.10)
_ORDER = ["RBRACE", "RPAR", "RSQB", "COMMA", "EQUAL", "COLON", "LBRACE", "SEMICOLON", "NAME", "INT", "FLOAT"]


def _expected_words(expected: set[str] | frozenset[str]) -> str:
    words = _terminal_words()
    useful = [e for e in expected if e not in _CONTINUATIONS and words.get(e, "") != "`**`"] or list(expected)
    useful.sort(key=lambda e: (_ORDER.index(e) if e in _ORDER else len(_ORDER), e))
    names = list(dict.fromkeys(words.get(e, e.lower()) for e in useful))
    if len(names) > 5:  # a long list helps nobody: say the most useful few
        return ", ".join(names[:4]) + " or another token"
    if len(names) <= 1:
        return names[0] if names else "something else"
    return ", ".join(names[:-1]) + " or " + names[-1]


def _unclosed(text: str) -> tuple[str, int] | None:
    """The innermost bracket left open at the end of ``text`` (ignoring comments)."""
    stack: list[tuple[str, int]] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for m in re.finditer(r"#[^\n]*|[()\[\]{}]", text):
        ch = m.group()
        if ch in "([{":
            stack.append((ch, m.start()))
        elif ch in pairs and stack and stack[-1][0] == pairs[ch]:
            stack.pop()
    return stack[-1] if stack else None


def _accepted(err: UnexpectedInput) -> set[str]:
    """What the parser would really take here (LALR's raw expected set over-approximates)."""
    expected = set(getattr(err, "expected", ()) or ())
    interactive = getattr(err, "interactive_parser", None)
    if interactive is not None:
        try:
            return set(interactive.accepts()) or expected
        except Exception:  # the exact set is a nicety; fall back to LALR's
            return expected
    return expected


def _token_words(tok: Token) -> str:
    if tok.type == "$END":
        return "the end of the file"
    return f"`{tok}`"


def _syntax_diagnostic(err: UnexpectedInput, src: Source, text: str, base: int) -> Diagnostic:
    """The diagnostic of a Lark error in ``text``, which starts at offset ``base`` of the file."""
    if isinstance(err, UnexpectedCharacters):
        pos = (err.pos_in_stream or 0) + base
        char = src.text[pos] if pos < len(src.text) else ""
        hint = ("powers are written `x ** 2`" if char == "^" else
                "Arke source uses names, numbers, operators and brackets; comments start with `#`")
        return make("AK1001", f"unexpected character `{char}`", src.span(pos, pos + 1), hint=hint,
                    replacement="**" if char == "^" else None)
    if isinstance(err, UnexpectedEOF) or (isinstance(err, UnexpectedToken) and err.token.type == "$END"):
        pos = base + len(text.rstrip())
        expected = _expected_words(_accepted(err))
        hint = "the last item is not finished"
        open_ = _unclosed(text)
        if open_ is not None:
            closer = {"(": ")", "[": "]", "{": "}"}[open_[0]]
            line, col = src.position(open_[1] + base)
            hint = f"`{open_[0]}` at line {line}, column {col} is never closed: add `{closer}`"
        return make("AK1003", f"the file ends too early: expected {expected}", src.span(pos, pos), hint=hint)
    assert isinstance(err, UnexpectedToken)
    tok = err.token
    start = (tok.start_pos or 0) + base
    span = src.span(start, (tok.end_pos or 0) + base if tok.end_pos else start + len(str(tok)))

    accepted = _accepted(err)
    expected = _expected_words(accepted)
    return make("AK1002", f"unexpected {_token_words(tok)}: expected {expected}", span,
                hint=_hint_for(tok, accepted))


def _hint_for(tok: Token, expected: set[str] | frozenset[str]) -> str | None:
    text = str(tok)
    if text == "=" and "COMP_OP" in expected:
        return "to compare, write `==`"
    if text == "{" and "RPAR" in expected:
        return "a `)` may be missing before `{`"
    if tok.type == "NAME" and "RPAR" in expected:
        return "a `,` or `)` may be missing"
    if tok.type == "NAME" and "COMMA" in expected:
        return "a `,` may be missing"
    return None


# ---------------------------------------------------------------- too big to parse

MAX_DEPTH = 200


def _too_long(src: Source, text: str, base: int) -> Diagnostic:
    """AK1006 for an expression too long to build a tree of: it is on the longest line of ``text``."""
    lines = text.split("\n")
    longest = max(range(len(lines)), key=lambda k: len(lines[k]))
    start = base + sum(len(line) + 1 for line in lines[:longest])
    indent = len(lines[longest]) - len(lines[longest].lstrip())
    return make("AK1006", "this expression is too long to check", src.span(start + indent, start + len(lines[longest])),
                hint="split it into named steps (`a = ...`, `b = a + ...`)")


def _too_deep(src: Source) -> Diagnostic | None:
    """Brackets nested past MAX_DEPTH: reported up front, before the recursive tree walks."""
    depth = 0
    for m in re.finditer(r"#[^\n]*|[()\[\]{}]", src.text):
        ch = m.group()
        if ch in "([{":
            depth += 1
            if depth > MAX_DEPTH:
                return make("AK1006", f"brackets are nested more than {MAX_DEPTH} deep", src.span(m.start(),
                            m.start() + 1), hint="split the expression into named steps")
        elif ch in ")]}":
            depth = max(0, depth - 1)
    return None
