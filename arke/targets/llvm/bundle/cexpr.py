"""Dims and `where` conditions as C expressions for a bundle's generated guards.

A dim prints (:func:`~arke.ir.shapes.dim_str`) with ``+ - * // % **``, names and integers; here
it becomes C over the ``int64_t`` dim variables (``d_<name>``), every operation checked through
the run time's ``ak_*`` helpers, which set ``bad`` on a 64-bit overflow or a zero divisor (Python's
floor division and modulo, as the guards compute them). The renderers make text only.
"""

from __future__ import annotations

import re

from arke.ir import semantic as S
from arke.ir.shapes import Dim, dim_str

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z_0-9]*)|(//|\*\*|[-+*%()]))")
_BINARY = {"+": "ak_add", "-": "ak_sub", "*": "ak_mul", "//": "ak_floordiv", "%": "ak_mod", "**": "ak_pow"}


def c_dim(d: Dim | int) -> str:
    """``d`` as a checked C expression over ``d_<name>`` (it uses ``int bad`` in the enclosing scope)."""
    text = dim_str(d) if not isinstance(d, int) else str(d)
    tokens = [m.group(m.lastindex or 0) for m in _TOKEN.finditer(text)]
    reader = _Reader(tokens)
    out = reader.sum()
    if reader.i != len(tokens):
        raise ValueError(f"cannot render dim {text!r} as C")
    return out


class _Reader:
    """Python's precedence for ``+ -``, ``* // %``, unary minus and ``**`` (right-associative)."""

    def __init__(self, tokens: list[str]):
        self.t, self.i = tokens, 0

    def peek(self) -> str | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self) -> str:
        tok = self.t[self.i]
        self.i += 1
        return tok

    def sum(self) -> str:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            value = f"{_BINARY[op]}({value}, {self.term()}, &bad)"
        return value

    def term(self) -> str:
        value = self.unary()
        while self.peek() in ("*", "//", "%"):
            op = self.take()
            value = f"{_BINARY[op]}({value}, {self.unary()}, &bad)"
        return value

    def unary(self) -> str:
        if self.peek() == "-":
            self.take()
            return f"ak_sub(0, {self.unary()}, &bad)"
        return self.power()

    def power(self) -> str:
        base = self.atom()
        if self.peek() == "**":
            self.take()
            return f"ak_pow({base}, {self.unary()}, &bad)"
        return base

    def atom(self) -> str:
        tok = self.take()
        if tok == "(":
            value = self.sum()
            if self.take() != ")":
                raise ValueError("expected ')'")
            return value
        if tok.isdigit():
            return f"INT64_C({tok})" if int(tok) < 2**63 else "(bad = 1, INT64_C(0))"
        return f"d_{tok}"


def c_cond(cond: S.Cond) -> str:
    """A condition over dims as a C boolean expression (its dims through :func:`c_dim`)."""
    if isinstance(cond, S.Rel):
        return f"({c_dim(cond.lhs)} {cond.op} {c_dim(cond.rhs)})"
    if isinstance(cond, S.InSet):
        x = c_dim(cond.x)
        return "(" + " || ".join(f"{x} == {c_dim(v)}" for v in cond.values) + ")" if cond.values else "0"
    if cond.op == "not":
        return f"(!{c_cond(cond.parts[0])})"
    joiner = " && " if cond.op == "and" else " || "
    return "(" + joiner.join(c_cond(c) for c in cond.parts) + ")"


def c_string(text: str) -> str:
    """``text`` as a C string literal (``%`` doubled: every message is a printf format)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("%", "%%")
    shown = (ch if 32 <= ord(ch) < 127 else "".join(f"\\{b:03o}" for b in ch.encode()) for ch in escaped)
    return '"' + "".join(shown) + '"'
