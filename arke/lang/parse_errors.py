"""Syntax errors in words: Lark's errors turned into diagnostics that say what was expected.

No diagnostic shows Lark's internals: terminals are named as a reader would ("a name",
"the end of the file"), the list of what would fit is kept short, an unclosed bracket is
pointed at, and common slips get a hint. Input nested too deep or too long to build a tree
of is reported here too.
"""

from __future__ import annotations

import re
from functools import lru_cache

from lark import Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from arke.lang.diagnostics import Diagnostic, make
from arke.lang.lark_parser import _lark
from arke.lang.source import Source, Span

#: Every terminal of the grammar that is not a fixed string, in words; a fixed string is shown as
#: itself (`` `->` ``). A terminal named here by ``None`` is never listed as expected (a malformed
#: number is lexed only to be reported). tests/lang/test_parse_messages.py checks that every
#: terminal of arke.lark has its words, so a new one cannot leak its grammar name.
_WORDS: dict[str, str | None] = {
    "NAME": "a name",
    "INT": "an integer",
    "FLOAT": "a number",
    "COMP_OP": "a comparison",
    "ADD_OP": "`+` or `-`",
    "SHIFT_OP": "`<<` or `>>`",
    "MUL_OP": "an operator",
    "BAD_NUMBER": None,
    "WS": None,
    "COMMENT": None,
    "$END": "the end of the file",
}

#: Operators of other languages that Arke does not have, and what to write instead. An entry is
#: only consulted where the grammar refuses the characters, so one the language gains (lexed as
#: its own token then) is simply never met; drop it when that happens.
FOREIGN_OPERATORS: dict[str, tuple[str, str | None]] = {  # operator -> (hint, the quick fix's text)
    ">>>": ("Arke has no `>>>`: `>>` shifts in zeros on the unsigned dtypes (`u8`, `u16`, `u32`) and copies "
            "the sign bit on signed ones; convert first for a logical shift, as in `u32(x) >> 4`", None),
    "&&": ("write `and`", "and"),
    "||": ("write `or`", "or"),
    "!": ("write `not`", "not "),
    "===": ("write `==`", "=="),
    "!==": ("write `!=`", "!="),
    "<>": ("write `!=`", "!="),
}
_OPERATOR_CHARS = "<>=!&|~"


@lru_cache(maxsize=1)
def terminal_words() -> dict[str, str | None]:
    """Each terminal's words (None: never shown); a terminal missing here is a grammar change
    that needs its entry in ``_WORDS``."""
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
    words = terminal_words()
    shown = [e for e in expected if words.get(e)]  # a terminal without words is never named
    useful = [e for e in shown if e not in _CONTINUATIONS and words.get(e) != "`**`"] or shown
    useful.sort(key=lambda e: (_ORDER.index(e) if e in _ORDER else len(_ORDER), e))
    names = list(dict.fromkeys(str(words[e]) for e in useful))
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
        foreign = _foreign_operator(src, pos, pos + 1)
        if foreign is not None:
            return make("AK1001", f"`{foreign[0]}` is not an operator in Arke", foreign[1], hint=foreign[2],
                        replacement=foreign[3])
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

    foreign = _foreign_operator(src, start, span.end)
    if foreign is not None:
        return make("AK1002", f"`{foreign[0]}` is not an operator in Arke", foreign[1], hint=foreign[2],
                    replacement=foreign[3])
    chained = _chained_comparison(err, src, text, base)
    if chained is not None:
        return chained
    accepted = _accepted(err)
    expected = _expected_words(accepted)
    return make("AK1002", f"unexpected {_token_words(tok)}: expected {expected}", span,
                hint=_hint_for(tok, accepted))


def _foreign_operator(src: Source, start: int, end: int) -> tuple[str, Span, str, str | None] | None:
    """The run of operator characters around ``[start, end)`` when it is another language's
    operator (:data:`FOREIGN_OPERATORS`): (its text, its span, what to write instead, the fix)."""
    text = src.text
    while start > 0 and text[start - 1] in _OPERATOR_CHARS:
        start -= 1
    while end < len(text) and text[end] in _OPERATOR_CHARS:
        end += 1
    run = text[start:end]
    if run not in FOREIGN_OPERATORS:
        return None
    return run, src.span(start, end), *FOREIGN_OPERATORS[run]


def _chained_comparison(err: UnexpectedToken, src: Source, text: str, base: int) -> Diagnostic | None:
    """``a < b < c``: a comparison right after a comparison. The diagnostic covers the chain and
    its fix is ``a < b and b < c``."""
    if err.token.type != "COMP_OP" or err.interactive_parser is None:
        return None
    stack = err.interactive_parser.parser_state.value_stack
    if len(stack) < 3 or not (isinstance(stack[-2], Token) and stack[-2].type == "COMP_OP"):
        return None
    left, middle = _tokens_of(stack[-3]), _tokens_of(stack[-1])
    if not left or not middle:
        return None
    start, mid_start, mid_end = left[0].start_pos or 0, middle[0].start_pos or 0, middle[-1].end_pos or 0
    op = err.token
    right_end = _operand_end(text, op.end_pos or 0)
    first = text[start:mid_start].rstrip()  # `a <`
    mid = text[mid_start:mid_end]
    if right_end is None:
        return make("AK1002", "comparisons do not chain", src.span(base + start, base + (op.end_pos or 0)),
                    hint=f"join two comparisons with `and`, as in `{first} {mid} and {mid} {op} ...`")
    right = text[op.end_pos or 0:right_end].strip()
    fix = f"{first} {mid} and {mid} {op} {right}"
    return make("AK1002", f"comparisons do not chain: `{text[start:right_end].strip()}` is not one comparison",
                src.span(base + start, base + right_end), hint=f"write `{fix}`", replacement=fix)


def _tokens_of(node: Tree[Token] | Token) -> list[Token]:
    if isinstance(node, Token):
        return [node]
    return [t for t in node.scan_values(lambda v: isinstance(v, Token))]


# the tokens an arithmetic operand may be made of (names, numbers, operators, subscripts, calls)
_OPERAND = frozenset({"NAME", "INT", "FLOAT", "ADD_OP", "MUL_OP", "POW", "AT", "DOT", "LPAR", "RPAR", "LSQB",
                      "RSQB", "COMMA"})


def _operand_end(text: str, at: int) -> int | None:
    """Where the arithmetic operand that starts after offset ``at`` of ``text`` ends (None when
    it does not lex or is empty)."""
    depth, end = 0, None
    try:
        for tok in _lark().lex(text[at:]):
            if tok.type not in _OPERAND or (depth == 0 and tok.type in ("RPAR", "RSQB", "COMMA")):
                break
            depth += tok.type in ("LPAR", "LSQB")
            depth -= tok.type in ("RPAR", "RSQB")
            end = at + (tok.end_pos or 0)
    except UnexpectedInput:
        pass
    return end if depth == 0 else None


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
