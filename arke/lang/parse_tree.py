"""Lark's parse tree turned into AST nodes (``arke.lang.ast``), each with its span in the file.

The grammar keeps every token, so positions come from the tokens themselves; a tree parsed
from one item of a file (after a syntax error) is shifted by ``base`` to the item's place.
The few problems the tree alone shows (a malformed number, an unknown annotation or
strategy option, an option given twice) are collected as diagnostics on the way.
"""

from __future__ import annotations

from typing import Any

from lark import Token, Transformer

from arke.lang import ast
from arke.lang.diagnostics import Diagnostic, make
from arke.lang.source import Source, Span

_VALUE_TOKENS = frozenset({"NAME", "INT", "FLOAT", "BAD_NUMBER", "COMP_OP", "ADD_OP", "MUL_OP", "POW",
                           "SHIFT_OP", "BITOR_OP", "BITXOR_OP", "BITAND_OP", "INVERT_OP"})


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
        declared = c[2] if len(c) == 4 else None  # `[":" type]`: absent, it may leave no placeholder
        return ast.Define(span, str(c[0]), self._tok(c[0]), names, spans, c[-1], declared)

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
        if isinstance(operand, ast.Num) and op in ("+", "-"):
            value = operand.value if op == "+" else -operand.value
            return ast.Num(span, value, operand.is_int, op + operand.text)
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
        (name, name_span), body, (names, spans, options, bounds) = c
        if name in ast.SCANS:
            return ast.Scan(span, name, name_span, body, names, spans, options, bounds)
        return ast.Reduce(span, name, name_span, body, names, spans, options, bounds)

    def for_items(self, span: Span, c: list[Any]
                  ) -> tuple[tuple[str, ...], tuple[Span, ...], tuple[ast.Option, ...], tuple[ast.Bound, ...]]:
        names = [(str(t), self._tok(t)) if isinstance(t, Token) else (t.name, t.name_span)
                 for t in c if isinstance(t, Token | ast.Bound)]  # a bounded index is listed too
        options = tuple(o for o in c if isinstance(o, ast.Option))
        bounds = tuple(b for b in c if isinstance(b, ast.Bound))
        return tuple(n for n, _ in names), tuple(s for _, s in names), options, bounds

    def for_bound(self, span: Span, c: list[Any]) -> ast.Bound:
        return ast.Bound(span, str(c[0]), self._tok(c[0]), str(c[1]), c[2])

    def for_option(self, span: Span, c: list[Any]) -> ast.Option:
        return ast.Option(span, str(c[0]), self._tok(c[0]), c[1])

    def args(self, span: Span, c: list[ast.Expr]) -> tuple[ast.Expr, ...]:
        return tuple(c)

    def name(self, span: Span, c: list[Token]) -> ast.Expr:
        text = str(c[0])
        if text == "inf":
            return ast.Num(span, float("inf"), False, text)
        return ast.Name(span, text)

    def int_lit(self, span: Span, c: list[Token]) -> ast.Num:
        return ast.Num(span, ast.int_value(str(c[0])), True, str(c[0]))

    def bad_number(self, span: Span, c: list[Token]) -> ast.Num:
        text = str(c[0])
        self.diags.append(make("AK1005", f"malformed number `{text}`: its exponent has no digits", span,
                               hint=f"write the exponent's digits, as in `{text.rstrip('eE+-')}e-3`"))
        return ast.Num(span, 0.0, False, text)

    def float_lit(self, span: Span, c: list[Token]) -> ast.Num:
        return ast.Num(span, float(str(c[0])), False, str(c[0]))

    # -- strategies
    def strategy(self, span: Span, c: list[Any]) -> ast.Strategy:
        annotation, name, opts, *decisions = c
        if str(annotation) != "strategy":
            self.diags.append(make("AK1002", f"unknown annotation `@{annotation}`", self._tok(annotation),
                                   hint="the only annotation is `@strategy(kernel, target = T)`",
                                   replacement="strategy"))
        # an unknown option (`arch = sm90`) is AK1002 already: its value is no target to report again
        targets = [o for o in opts if isinstance(o, tuple) and str(o[0]) == "target"]
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
        return ast.int_value(str(c[0])), span

    def dv_name(self, span: Span, c: list[Token]) -> tuple[str, Span]:
        return str(c[0]), span

    def dv_list(self, span: Span, c: list[Token]) -> tuple[tuple[int, ...], Span]:
        return tuple(ast.int_value(str(t)) for t in c), span

