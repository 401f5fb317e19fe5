"""Parse `.ak` text into the AST (``arke.lang.ast``), with friendly syntax errors.

The grammar is ``arke/grammar/arke.lark`` (LALR). Syntax errors never show Lark's
internals: they say in words what was expected. When a file has an error, each top-level
item (kernel, strategy, import) is parsed again on its own so one broken kernel does not
hide the errors of the others.
"""

from __future__ import annotations

import itertools
import re
from functools import lru_cache
from importlib import resources
from typing import Any

from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from arke.lang import ast
from arke.lang.diagnostics import Diagnostic, make
from arke.lang.source import Source, Span


@lru_cache(maxsize=1)
def _lark() -> Lark:
    text = resources.files("arke.grammar").joinpath("arke.lark").read_text(encoding="utf-8")
    # cache=True keeps the LALR tables in the temp folder: start-up matters for `akc check`.
    # The basic lexer reserves keywords everywhere (`return` is never a name), which keeps
    # syntax errors where the mistake is rather than a statement later.
    return Lark(text, parser="lalr", lexer="basic", keep_all_tokens=True, maybe_placeholders=True, cache=True)


_VALUE_TOKENS = frozenset({"NAME", "INT", "FLOAT", "BAD_NUMBER", "COMP_OP", "ADD_OP", "MUL_OP", "POW"})


def _edge(children: Any, side: int, base: int) -> int | None:
    """The file offset where the first (side 0) thing in children starts, or the last (-1) ends.

    Tokens count from ``base`` (the start of the parsed text); AST spans are already in the file.
    """
    items = children if side == 0 else reversed(children)
    for c in items:
        if c is None:
            continue
        if isinstance(c, Token):
            pos = c.start_pos if side == 0 else c.end_pos
            return None if pos is None else pos + base
        if isinstance(c, Span):
            return c.start if side == 0 else c.end
        span = getattr(c, "span", None)
        if span is not None:
            return int(span.start if side == 0 else span.end)
        if isinstance(c, tuple | list):
            found = _edge(c, side, base)
            if found is not None:
                return found
    return None


class _Build(Transformer[Token, Any]):
    """Lark tree -> AST nodes. Each method gets the rule's meta (positions) and children."""

    def __init__(self, source: Source, base: int = 0):
        super().__init__(visit_tokens=False)
        self.src = source
        self.base = base  # where the parsed text starts in the file
        self.diags: list[Diagnostic] = []

    # -- helpers
    def _call_userfunc(self, tree: Any, new_children: Any = None) -> Any:
        # Positions come from the children (the parser keeps every token), which is about
        # twice as fast as Lark's propagate_positions; punctuation is dropped here.
        children = tree.children if new_children is None else new_children
        first, last = _edge(children, 0, self.base), _edge(children, -1, self.base)
        span = self.src.span(first, last) if first is not None and last is not None else self.src.span(self.base,
                                                                                                      self.base)
        kept = [c for c in children if not (isinstance(c, Token) and c.type not in _VALUE_TOKENS)]
        return getattr(self, tree.data)(span, kept)

    def atom(self, span: Span, c: list[Any]) -> Any:
        return c[0]  # a parenthesised expression keeps the span of what is inside

    def _tok(self, tok: Token) -> Span:
        return self.src.span((tok.start_pos or 0) + self.base, (tok.end_pos or 0) + self.base)

    # -- module
    def start(self, span: Span, items: list[Any]) -> ast.Module:
        items = [i for i in items if i is not None]
        return ast.Module(
            self.src.path,
            tuple(i for i in items if isinstance(i, ast.Import)),
            tuple(i for i in items if isinstance(i, ast.Kernel)),
            tuple(i for i in items if isinstance(i, ast.Strategy)),
        )

    def empty_item(self, span: Span, _: list[Any]) -> None:
        return None

    def dotted_name(self, span: Span, parts: list[Token]) -> Token:
        # A token (a str with positions), so the import's span reaches the module name's end.
        return Token("NAME", ".".join(str(p) for p in parts), start_pos=parts[0].start_pos, end_pos=parts[-1].end_pos)

    def name_list(self, span: Span, names: list[Token]) -> tuple[Token, ...]:
        return tuple(names)

    def import_stmt(self, span: Span, c: list[Any]) -> ast.Import:
        return ast.Import(str(c[0]), None, span)

    def from_import(self, span: Span, c: list[Any]) -> ast.Import:
        return ast.Import(str(c[0]), tuple(str(n) for n in c[1]), span)

    # -- kernels
    def kernel(self, span: Span, c: list[Any]) -> ast.Kernel:
        name, params, outputs, where, *body = c
        return ast.Kernel(
            str(name), self._tok(name), tuple(params or ()), tuple(outputs or ()), tuple(where or ()),
            tuple(body), span,
        )

    def params(self, span: Span, c: list[ast.Param]) -> tuple[ast.Param, ...]:
        return tuple(c)

    def param(self, span: Span, c: list[Any]) -> ast.Param:
        return ast.Param(str(c[0]), c[1], c[2], span)

    def tensor_type(self, span: Span, c: list[Any]) -> ast.TypeExpr:
        return ast.TypeExpr(str(c[0]), self._tok(c[0]), c[1], span)

    def scalar_type(self, span: Span, c: list[Any]) -> ast.TypeExpr:
        return ast.TypeExpr(str(c[0]), self._tok(c[0]), None, span)

    def dims(self, span: Span, c: list[ast.Expr]) -> tuple[ast.Expr, ...]:
        return tuple(c)

    def single_output(self, span: Span, c: list[Any]) -> tuple[ast.Output, ...]:
        return (ast.Output(None, c[0], span),)

    def named_output(self, span: Span, c: list[Any]) -> tuple[ast.Output, ...]:
        return (ast.Output(str(c[0]), c[1], span),)

    def output_list(self, span: Span, c: list[ast.Output]) -> tuple[ast.Output, ...]:
        return tuple(c)

    def named_out(self, span: Span, c: list[Any]) -> ast.Output:
        return ast.Output(str(c[0]), c[1], span)

    def anon_out(self, span: Span, c: list[Any]) -> ast.Output:
        return ast.Output(None, c[0], span)

    def where_clause(self, span: Span, c: list[ast.Expr]) -> tuple[ast.Expr, ...]:
        return tuple(c)

    def let_stmt(self, span: Span, c: list[Any]) -> ast.Let:
        return ast.Let(span, str(c[0]), self._tok(c[0]), c[1])

    def define_stmt(self, span: Span, c: list[Any]) -> ast.Define:
        names, spans = c[1]
        return ast.Define(span, str(c[0]), self._tok(c[0]), names, spans, c[2])

    def assign_stmt(self, span: Span, c: list[Any]) -> ast.Assign:
        return ast.Assign(span, str(c[0]), self._tok(c[0]), c[1])

    def multi_assign_stmt(self, span: Span, c: list[Any]) -> ast.MultiAssign:
        names, value = c[:-1], c[-1]
        return ast.MultiAssign(span, tuple(str(n) for n in names), tuple(self._tok(n) for n in names),
                               value)

    def return_stmt(self, span: Span, c: list[Any]) -> ast.Return:
        return ast.Return(span, tuple(c))

    def index_vars(self, span: Span, c: list[Token]) -> tuple[tuple[str, ...], tuple[Span, ...]]:
        return tuple(str(t) for t in c), tuple(self._tok(t) for t in c)

    # -- expressions
    def ternary(self, span: Span, c: list[Any]) -> ast.Ternary:
        then, cond, other = c
        return ast.Ternary(span, cond, then, other)

    def or_op(self, span: Span, c: list[Any]) -> ast.Binary:
        return ast.Binary(span, "or", c[0], c[1])

    def and_op(self, span: Span, c: list[Any]) -> ast.Binary:
        return ast.Binary(span, "and", c[0], c[1])

    def not_op(self, span: Span, c: list[Any]) -> ast.Unary:
        return ast.Unary(span, "not", c[0])

    def compare(self, span: Span, c: list[Any]) -> ast.Binary:
        return ast.Binary(span, str(c[1]), c[0], c[2])

    def binop(self, span: Span, c: list[Any]) -> ast.Binary:
        return ast.Binary(span, str(c[1]), c[0], c[2])

    def matmul(self, span: Span, c: list[Any]) -> ast.Binary:
        return ast.Binary(span, "@", c[0], c[1])

    def pow_op(self, span: Span, c: list[Any]) -> ast.Binary:
        return ast.Binary(span, "**", c[0], c[2])

    def unop(self, span: Span, c: list[Any]) -> ast.Expr:
        op, operand = str(c[0]), c[1]
        # Fold the sign into a literal: `-inf`, `-1` are constants, not negations.
        if isinstance(operand, ast.Num):
            value = operand.value if op == "+" else -operand.value
            return ast.Num(span, value, operand.is_int)
        return ast.Unary(span, op, operand)

    def in_set(self, span: Span, c: list[Any]) -> ast.InSet:
        return ast.InSet(span, c[0], c[1])

    def int_list(self, span: Span, c: list[ast.Expr]) -> tuple[ast.Expr, ...]:
        return tuple(c)

    def index(self, span: Span, c: list[Any]) -> ast.Index:
        return ast.Index(span, str(c[0]), self._tok(c[0]), c[1])

    def qualname(self, span: Span, c: list[Token]) -> tuple[str, Span]:
        first, last = self._tok(c[0]), self._tok(c[-1])
        return ".".join(str(t) for t in c), first.cover(last)

    def call(self, span: Span, c: list[Any]) -> ast.Call:
        (name, name_span), args = c
        return ast.Call(span, name, name_span, tuple(args or ()))

    def reduce(self, span: Span, c: list[Any]) -> ast.Expr:
        (name, name_span), body, (names, spans) = c
        return ast.Reduce(span, name, name_span, body, names, spans)

    def args(self, span: Span, c: list[ast.Expr]) -> tuple[ast.Expr, ...]:
        return tuple(c)

    def name(self, span: Span, c: list[Token]) -> ast.Expr:
        text = str(c[0])
        if text == "inf":
            return ast.Num(span, float("inf"), False)
        return ast.Name(span, text)

    def int_lit(self, span: Span, c: list[Token]) -> ast.Num:
        return ast.Num(span, int(str(c[0])), True)

    def bad_number(self, span: Span, c: list[Token]) -> ast.Num:
        text = str(c[0])
        self.diags.append(make("AK1005", f"malformed number `{text}`: its exponent has no digits", span,
                               hint=f"write the exponent's digits, as in `{text.rstrip('eE+-')}e-3`"))
        return ast.Num(span, 0.0, False)

    def float_lit(self, span: Span, c: list[Token]) -> ast.Num:
        return ast.Num(span, float(str(c[0])), False)

    # -- strategies
    def strategy(self, span: Span, c: list[Any]) -> ast.Strategy:
        annotation, name, opts, *decisions = c
        if str(annotation) != "strategy":
            self.diags.append(make("AK1002", f"unknown annotation `@{annotation}`", self._tok(annotation),
                                   hint="the only annotation is `@strategy(kernel, target = T)`",
                                   replacement="strategy"))
        targets = [o for o in opts if isinstance(o, tuple)]
        target = targets[0][1] if targets else None
        whens = [o for o in opts if not isinstance(o, tuple)]
        for what, extra in (("target", [t[0] for t in targets[1:]]), ("when", whens[1:])):
            for item in extra:
                where = self._tok(item) if isinstance(item, Token) else item.span
                self.diags.append(make("AK4007", f"`{what}` is given twice", where,
                                       hint=f"a strategy has one `{what}`; write a second strategy for another"))
        return ast.Strategy(
            str(name), self._tok(name), str(target) if target is not None else None,
            self._tok(target) if target is not None else None, whens[0] if whens else None,
            tuple(decisions), span,
        )

    def strategy_opts(self, span: Span, c: list[Any]) -> list[Any]:
        return c

    def opt_target(self, span: Span, c: list[Token]) -> tuple[Token, Token]:
        if str(c[0]) != "target":
            self.diags.append(make("AK1002", f"unknown strategy option `{c[0]}`", self._tok(c[0]),
                                   hint="write `target = NAME` or `when CONDITION`", replacement="target"))
        return c[0], c[1]

    def opt_when(self, span: Span, c: list[ast.Expr]) -> ast.Expr:
        return c[0]

    def decision_value(self, span: Span, c: list[Any]) -> ast.Decision:
        return ast.Decision(str(c[0]), self._tok(c[0]), c[1][0], (), span)

    def decision_items(self, span: Span, c: list[Any]) -> ast.Decision:
        return ast.Decision(str(c[0]), self._tok(c[0]), None, tuple(c[1:]), span)

    def ditem(self, span: Span, c: list[Any]) -> ast.DecisionItem:
        return ast.DecisionItem(str(c[0]), c[1][0] if c[1] is not None else None, span)

    # Decision values travel with their span, so a decision's span covers its value.
    def dv_int(self, span: Span, c: list[Token]) -> tuple[int, Span]:
        return int(str(c[0])), span

    def dv_name(self, span: Span, c: list[Token]) -> tuple[str, Span]:
        return str(c[0]), span

    def dv_list(self, span: Span, c: list[Token]) -> tuple[tuple[int, ...], Span]:
        return tuple(int(str(t)) for t in c), span


# ---------------------------------------------------------------- errors in words

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
                            "FOR", "__ANON_0", "__ANON_1", "POW", "STAR", "AT"})
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


# The start of every top-level item: used to parse items one by one after an error.
_ITEM_START = re.compile(r"^[ \t]*(?:kernel\b|@|import\b|from\b)", re.MULTILINE)


def parse(text: str, path: str = "<input>") -> tuple[ast.Module, list[Diagnostic]]:
    """Parse a `.ak` file. Returns the module (possibly partial) and syntax diagnostics.

    Never raises for bad input: every problem becomes a diagnostic.
    """
    if text.startswith("\ufeff"):  # a byte-order mark: white space, so offsets stay exact
        text = " " + text[1:]
    src = Source(path, text)
    diags: list[Diagnostic] = []
    too_deep = _too_deep(src)
    if too_deep is not None:
        return ast.Module(path, (), (), ()), [too_deep]
    try:
        module = _parse_one(src, text, diags)
        return module, sorted(diags, key=lambda d: (d.span.start, d.code))
    except UnexpectedInput as err:
        first = _syntax_diagnostic(err, src, text, 0)
    except RecursionError:  # an extremely long expression: find it item by item below
        first = _too_long(src, text, 0)
    # Recover: parse each top-level item alone, its positions shifted to its place in the file.
    starts = [m.start() for m in _ITEM_START.finditer(text)] + [len(text)]
    diags = []
    kernels: list[ast.Kernel] = []
    strategies: list[ast.Strategy] = []
    imports: list[ast.Import] = []
    for a, b in itertools.pairwise(starts):
        chunk = text[a:b]
        try:
            part = _parse_one(src, chunk, diags, a)
        except UnexpectedInput as err:
            diags.append(_syntax_diagnostic(err, src, chunk, a))
            continue
        except RecursionError:
            diags.append(_too_long(src, chunk, a))
            continue
        kernels += part.kernels
        strategies += part.strategies
        imports += part.imports
    if not diags:  # the error lies before the first item, or between items
        diags.append(first)
    module = ast.Module(path, tuple(imports), tuple(kernels), tuple(strategies))
    return module, sorted(set(diags), key=lambda d: (d.span.start, d.code))


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


def _parse_one(src: Source, text: str, diags: list[Diagnostic], base: int = 0) -> ast.Module:
    tree = _lark().parse(text)
    builder = _Build(src, base)
    try:
        module: ast.Module = builder.transform(tree)
    except VisitError as err:  # a bug in the builder, not in the input: surface the cause
        raise err.orig_exc from err
    diags.extend(builder.diags)
    return module

