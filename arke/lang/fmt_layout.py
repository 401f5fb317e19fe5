"""The formatter's layout: the parse tree printed as lines, broken where they would pass :data:`WIDTH`.

:class:`_Printer` prints each node on one line when it fits; otherwise it breaks a chain of
operators of one precedence level before its operators, a bracketed list inside its
brackets, and lays out kernel headers, ``where`` clauses, statements and strategies in the
canonical form ``arke.lang.fmt`` describes. Lists holding a comment go one entry per line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lark import Token, Tree

from arke.lang.fmt_comments import _Comments, _start

#: The line width a layout tries to stay within (a longer name or literal may overflow).
WIDTH = 100
#: Indentation of a body, and of continuation lines past their statement.
INDENT = 2
CONTINUATION = 4

Node = Tree[Token] | Token

# Tokens that carry a value; the rest (keywords, punctuation) follow from the rule.
_VALUE = frozenset({"NAME", "INT", "FLOAT", "BAD_NUMBER", "COMP_OP", "ADD_OP", "MUL_OP", "POW", "SHIFT_OP",
                    "BITOR_OP", "BITXOR_OP", "BITAND_OP", "INVERT_OP"})
# How a rule prints on one line, from the texts of its children; `rule/n` when it has n of them.
_FORMS = {
    **dict.fromkeys(("name", "int_lit", "float_lit", "bad_number", "dv_int", "dv_name", "scalar_type", "anon_out"),
                    "{0}"),
    "atom": "({0})", "not_op": "not {0}", "in_set": "{0} in {{{1}}}", "index": "{0}[{1}]", "tensor_type": "{0}[{1}]",
    "call/1": "{0}()", "call/2": "{0}({1})", "reduce": "{0}({1} for {2})", "for_option": "{0} = {1}",
    "for_bound": "{0} {1} {2}",
    "param/2": "{0}: {1}", "param/3": "{0}: {1} = {2}", "named_out": "{0}: {1}",
    "single_output": "-> {0}", "named_output": "-> {0}: {1}",
    "ditem/1": "{0}", "ditem/2": "{0} = {1}", "decision_value": "{0} = {1}", "opt_target": "{0} = {1}",
    "opt_when": "when {0}", "import_stmt": "import {0}", "from_import": "from {0} import {1}",
}
# Rules that are lists: their items joined by ", ", in brackets for some.
_LISTS = {**dict.fromkeys(("args", "int_list", "dims", "index_vars", "for_items", "name_list", "params"), "{}"),
          "output_list": "-> ({})", "dv_list": "[{}]"}
# Binary operators by precedence level; operands of one level print as one chain.
_LEVELS = {"or_op": "or", "and_op": "and", "compare": "cmp", "matmul": "mul", "pow_op": "pow"}
_BINOP_LEVELS = {"ADD_OP": "add", "MUL_OP": "mul", "SHIFT_OP": "shift", "BITAND_OP": "bitand",
                 "BITXOR_OP": "bitxor", "BITOR_OP": "bitor"}


@dataclass
class _Line:
    """One output line before comments go in.

    ``gap``: blank lines before the line and the comments above it: 0, 1, or None for the
    source's. ``inner``: keep the source's blank lines between those comments; ``last``: and
    between them and the line. ``comment_indent``: where comments above it start.
    """

    indent: int
    text: str
    gap: int | None = None
    inner: bool = True
    last: bool = True
    comment_indent: int | None = None


def _cont(parts: list[str]) -> list[_Line]:
    """Continuation lines: the parts of a layout after its first (each carries its indentation)."""
    out = []
    for part in parts:
        stripped = part.lstrip(" ")
        out.append(_Line(len(part) - len(stripped), stripped, 0, False, False))
    return out


def _end(parts: list[str], col: int) -> int:
    """The column after a layout that started at ``col``."""
    return col + len(parts[0]) if len(parts) == 1 else len(parts[-1])


def _kids(node: Node | None) -> list[Node]:
    """The children that matter: subtrees and value tokens (keywords and punctuation follow from the rule)."""
    if not isinstance(node, Tree):
        return []
    return [c for c in node.children if c is not None and not (isinstance(c, Token) and c.type not in _VALUE)]


def _edge_token(node: Node, last: bool = False) -> Token:
    while isinstance(node, Tree):
        children = [c for c in node.children if c is not None]
        node = children[-1] if last else children[0]
    return node


def _is(node: Node, kind: str) -> bool:
    return isinstance(node, Tree) and node.data == kind


def _level(node: Node) -> str | None:
    if not isinstance(node, Tree):
        return None
    if node.data == "binop":
        op = node.children[1]
        kind = op.type if isinstance(op, Token) else "MUL_OP"
        return _BINOP_LEVELS.get(kind, "mul")
    return _LEVELS.get(str(node.data))


class _Printer:
    """Lays the parse tree (all tokens kept) out as :class:`_Line` s."""

    def __init__(self, comments: _Comments):
        self.comments = comments
        self._flats: dict[int, str] = {}

    # -- one line

    def flat(self, node: Node) -> str:
        """The text of ``node`` on one line."""
        key = id(node)
        if key not in self._flats:
            self._flats[key] = self._flat(node)
        return self._flats[key]

    def _flat(self, node: Node) -> str:
        if isinstance(node, Token):
            return str(node)
        chain = self.chain(node)
        if len(chain) > 1:
            return " ".join(f"{op} {self.flat(x)}" if op else self.flat(x) for op, x in chain)
        kind, kids = str(node.data), _kids(node)
        texts = [self.flat(k) for k in kids]
        if kind == "unop":
            return self._sign(kids[0], kids[1]) + texts[1]
        if kind in _LISTS:
            return _LISTS[kind].format(", ".join(texts))
        if kind in ("qualname", "dotted_name"):
            return ".".join(texts)
        if kind == "decision_items":
            return f"{texts[0]} {', '.join(texts[1:])}"
        form = _FORMS.get(f"{kind}/{len(texts)}", _FORMS.get(kind))
        if form is None:
            raise NotImplementedError(f"the formatter has no rule for `{kind}`")
        return form.format(*texts)

    def _sign(self, sign: Node, operand: Node) -> str:
        """A unary sign, spaced from another sign: `- -x`, not `--x`."""
        return f"{sign} " if self.flat(operand)[0] in "+-~" and str(sign) != "~" else str(sign)

    def chain(self, node: Node) -> list[tuple[str | None, Node]]:
        """``a + b - c`` as [(None, a), ('+', b), ('-', c)]: operands of one precedence level.

        A conditional ``a if c else b if d else e`` is one chain too. Anything else is [(None, node)].
        """
        level = _level(node)
        if _is(node, "ternary"):
            parts: list[tuple[str | None, Node]] = []
            other: Node = node
            while isinstance(other, Tree) and other.data == "ternary":
                then, cond, other = _kids(other)
                parts += [("else" if parts else None, then), ("if", cond)]
            return [*parts, ("else", other)]
        if level is None:
            return [(None, node)]
        rest: list[tuple[str | None, Node]] = []
        while _level(node) == level and isinstance(node, Tree):
            left, op, right = node.children
            rest.append((str(op), right))
            node = left
            if level in ("cmp", "pow"):  # comparisons do not chain; `**` groups to the right
                break
        return [(None, node), *reversed(rest)]

    # -- several lines

    def layout(self, node: Node, col: int, cont: int, tail: int = 0) -> list[str]:
        """``node`` from column ``col``, broken where it would pass :data:`WIDTH`.

        ``tail`` columns follow it on its last line; continuation lines start at ``cont``.
        The first part has no indentation, the others carry theirs.
        """
        text = self.flat(node)
        if col + len(text) + tail <= WIDTH or isinstance(node, Token):
            return [text]
        chain = self.chain(node)
        if _is(node, "ternary"):
            return self._ternary(chain, col, cont, tail)
        if len(chain) > 1:
            return self._chain(chain, col, cont, tail)
        kind, kids = node.data, _kids(node)
        if kind == "atom":
            return self._wrap("(", self.layout(kids[0], col + 1, col + 1, tail + 1), ")")
        if kind in ("unop", "not_op"):
            op = "not " if kind == "not_op" else self._sign(kids[0], kids[1])
            return self._wrap(op, self.layout(kids[-1], col + len(op), cont, tail), "")
        if kind in ("call", "index") and len(kids) > 1:
            name = self.flat(kids[0])
            opener, closer = ("(", ")") if kind == "call" else ("[", "]")
            start = col + len(name) + 1
            return self._wrap(name + opener, self.items(_kids(kids[1]), start, start, tail + 1), closer)
        if kind == "reduce":
            name, after = self.flat(kids[0]), f" for {self.flat(kids[2])})"
            start = col + len(name) + 1
            return self._wrap(name + "(", self.layout(kids[1], start, start, tail + len(after)), after)
        return [text]

    @staticmethod
    def _wrap(before: str, parts: list[str], after: str) -> list[str]:
        return [before + parts[0], *parts[1:-1], parts[-1] + after] if len(parts) > 1 \
            else [before + parts[0] + after]

    def _chain(self, chain: list[tuple[str | None, Node]], col: int, cont: int, tail: int) -> list[str]:
        """A chain filled greedily; a line that breaks starts with the operator at ``cont``."""
        if len(chain) == 1:
            return self.layout(chain[0][1], col, cont, tail)
        first_op = chain[1][0] or ""
        parts = self.layout(chain[0][1], col, cont + len(first_op) + 1, 0)
        for k, (op, operand) in enumerate(chain[1:], 1):
            need = tail if k == len(chain) - 1 else 0
            piece = f"{op} {self.flat(operand)}"
            if _end(parts, col) + 1 + len(piece) + need <= WIDTH:
                parts[-1] += " " + piece
                continue
            start = cont + len(op or "") + 1
            sub = self.layout(operand, start, start, need)
            parts.append(" " * cont + f"{op} " + sub[0])
            parts += sub[1:]
        return parts

    def _ternary(self, chain: list[tuple[str | None, Node]], col: int, cont: int, tail: int) -> list[str]:
        """``a if c`` on the first line, then each ``else b if d`` and the last ``else e`` on its own."""
        groups = [chain[k:k + 2] for k in range(0, len(chain), 2)]
        parts: list[str] = []
        for k, group in enumerate(groups):
            need = tail if k == len(groups) - 1 else 0
            if k == 0:
                parts = self._chain(group, col, cont, need)
                continue
            start = cont + len("else ")
            sub = self._chain([(None, group[0][1]), *group[1:]], start, start, need)
            parts += [" " * cont + "else " + sub[0], *sub[1:]]
        return parts

    def items(self, nodes: Sequence[Node], col: int, align: int, tail: int = 0,
              one_per_line: bool = False) -> list[str]:
        """``a, b, c`` from column ``col``, filled into lines that start at ``align``."""
        parts: list[str] = []
        for k, node in enumerate(nodes):
            need = tail if k == len(nodes) - 1 else 1
            if not parts:
                parts = self.layout(node, col, align, need)
                continue
            text = self.flat(node)
            if not one_per_line and _end(parts, col) + 2 + len(text) + need <= WIDTH:
                parts[-1] += ", " + text
                continue
            parts[-1] += ","
            sub = self.layout(node, align, align, need)
            parts += [" " * align + sub[0], *sub[1:]]
        return parts

    def _commented(self, items: Sequence[Node], first: Token, last: Token) -> bool:
        """Whether a comment sits inside a list (from ``first`` to ``last``) of ``items``."""
        if not items:
            return False
        second = _start(_edge_token(items[1])) if len(items) > 1 else _start(last) + 1
        return self.comments.inside(_start(first), second, _start(last))

    # -- the file

    def module(self, tree: Tree[Token]) -> list[_Line]:
        lines: list[_Line] = []
        previous = None
        for item in tree.children:
            if not isinstance(item, Tree) or item.data == "empty_item":
                continue
            kind = str(item.data)
            if kind == "kernel":
                new = self.kernel(item)
            elif kind == "strategy":
                new = self.strategy(item)
            else:
                new = [_Line(0, self.flat(item))]
            imports = previous in ("import_stmt", "from_import") and kind in ("import_stmt", "from_import")
            new[0].gap = 0 if previous is None else (None if imports else 1)
            lines += new
            previous = kind
        return lines

    def kernel(self, node: Tree[Token]) -> list[_Line]:
        c = node.children
        params = _kids(c[3])
        head = f"kernel {c[1]}("
        # from `kernel` on: a comment after the keyword or the name ends the header's first line, and after a
        # pass it sits after `)` (in the list): the list goes one entry per line from the first pass, so a
        # second pass keeps it so
        explode = self._commented(params, _edge_token(node), _edge_token(c[4]))
        plines = self.items(params, len(head), len(head), 1, explode) or [""]
        plines[0] = head + plines[0]
        plines[-1] += ")"
        outputs, where = c[5], c[6]
        body_open = where is None
        text = plines[0] + (f" {self.flat(outputs)}" if outputs is not None else "") + (" {" if body_open else "")
        one_line = len(plines) == 1 and len(text) <= WIDTH
        if one_line and isinstance(outputs, Tree) and outputs.data == "output_list":
            one_line = len(self._outputs(outputs)) == 1  # a comment in it puts one output per line
        lines: list[_Line]
        if one_line:
            lines = [_Line(0, text)]
        else:
            body_open = False
            lines = [_Line(0, plines[0]), *_cont(plines[1:])]
            if isinstance(outputs, Tree):
                lines += self._outputs(outputs)
        if isinstance(where, Tree):
            conds = _kids(where)
            explode = self._commented(conds, _edge_token(where), _edge_token(where, last=True))
            col = INDENT + len("where ")
            parts = self.items(conds, col, col, 0, explode)
            lines += [_Line(INDENT, "where " + parts[0], 0, False, False), *_cont(parts[1:])]
        if not body_open:
            lines.append(_Line(0, "{", 0, False, False))
        body = [s for s in c[8:-1] if isinstance(s, Tree)]
        for k, stmt in enumerate(body):
            lines += self.statement(stmt, 0 if k == 0 else None)
        lines.append(_Line(0, "}", None if body else 0, True, False, INDENT))
        return lines

    def _outputs(self, outputs: Tree[Token]) -> list[_Line]:
        """``    -> OUT`` on its own line; an output list fills lines aligned after its ``(``."""
        if outputs.data != "output_list":
            return [_Line(CONTINUATION, self.flat(outputs), 0, False, False)]
        items = _kids(outputs)
        c = [t for t in outputs.children if isinstance(t, Token)]
        # from `->` on: a comment after the arrow ends up after `)` (in the list) once formatted, so it lays the
        # list out one output per line from the first pass, as a second pass would
        explode = self._commented(items, c[0], c[-1])
        col = CONTINUATION + len("-> (")
        parts = self.items(items, col, col, 1, explode)
        parts[0] = "-> (" + parts[0]
        parts[-1] += ")"
        return [_Line(CONTINUATION, parts[0], 0, False, False), *_cont(parts[1:])]

    def statement(self, node: Tree[Token], gap: int | None) -> list[_Line]:
        kids = _kids(node)
        kind = node.data
        if kind == "let_stmt":
            prefix = f"let {kids[0]} = "
        elif kind == "define_stmt":
            declared = [k for k in kids[2:-1] if isinstance(k, Tree)]  # `t[i]: f32[N] = ...` (spec §7.3)
            prefix = f"{kids[0]}[{self.flat(kids[1])}]" + "".join(f": {self.flat(d)}" for d in declared) + " = "
        elif kind == "assign_stmt":
            prefix = f"{kids[0]} = "
        elif kind == "multi_assign_stmt":
            prefix = ", ".join(str(k) for k in kids[:-1]) + " = "
        else:
            prefix = "return "
        col = INDENT + len(prefix)
        if kind == "return_stmt" and len(kids) > 1:
            parts = self.items(kids, col, col)
        else:
            parts = self.layout(kids[-1], col, INDENT + CONTINUATION)
        return [_Line(INDENT, prefix + parts[0], gap), *_cont(parts[1:])]

    def strategy(self, node: Tree[Token]) -> list[_Line]:
        c = node.children
        text = f"@{c[1]}({c[3]}"
        parts = [text]
        for opt in _kids(c[4]):
            if isinstance(opt, Tree) and opt.data == "opt_when":
                col = _end(parts, 0) + len(", when ")
                sub = self.layout(_kids(opt)[0], col, CONTINUATION, 3)
                parts[-1] += ", when " + sub[0]
                parts += sub[1:]
            else:
                parts[-1] += ", " + self.flat(opt)
        parts[-1] += ") {"
        lines = [_Line(0, parts[0]), *_cont(parts[1:])]
        decisions = [d for d in c[7:-1] if isinstance(d, Tree)]
        lines += [_Line(INDENT, self.flat(d), 0 if k == 0 else None) for k, d in enumerate(decisions)]
        lines.append(_Line(0, "}", None if decisions else 0, True, False, INDENT))
        return lines
