"""Dims and `where` conditions as C expressions for a bundle's generated guards.

A dim's text (:func:`~arke.ir.shapes.dim_str`: ``+ - * // % **``, names, integers) is read with the
IR's own reader (:func:`~arke.ir.shapes.read_dim`) into C over the ``int64_t`` dim variables
(``d_<name>``), every operation checked through the run time's ``ak_*`` helpers, which set ``bad``
on a 64-bit overflow or a zero divisor (Python's floor division and modulo, as the guards compute
them). The renderers make text only.
"""

from __future__ import annotations

from arke.ir import semantic as S
from arke.ir.shapes import Dim, DimAlgebra, dim_str, read_dim


class _C(DimAlgebra):
    """A dim's operations as checked C (each uses ``int bad`` in the enclosing scope)."""

    def const(self, value: int) -> object:
        if value < 0:
            return f"ak_sub(0, {self.const(-value)}, &bad)"
        return f"INT64_C({value})" if value < 2**63 else "(bad = 1, INT64_C(0))"

    def sym(self, name: str) -> object:
        return f"d_{name}"

    def add(self, a: object, b: object) -> object:
        return f"ak_add({a}, {b}, &bad)"

    def sub(self, a: object, b: object) -> object:
        return f"ak_sub({a}, {b}, &bad)"

    def neg(self, a: object) -> object:
        return f"ak_sub(0, {a}, &bad)"

    def mul(self, factors: list[object]) -> object:
        out = factors[0]
        for f in factors[1:]:
            out = f"ak_mul({out}, {f}, &bad)"
        return out

    def floordiv(self, a: object, b: object) -> object:
        return f"ak_floordiv({a}, {b}, &bad)"

    def mod(self, a: object, b: object) -> object:
        return f"ak_mod({a}, {b}, &bad)"

    def pow(self, a: object, b: object) -> object:
        return f"ak_pow({a}, {b}, &bad)"


def c_dim(d: Dim | int | str) -> str:
    """``d`` (a dim, or its text as plans and artifacts hold it) as a checked C expression over ``d_<name>``
    (it uses ``int bad`` in the enclosing scope)."""
    text = d if isinstance(d, str) else str(d) if isinstance(d, int) else dim_str(d)
    return str(read_dim(text, _C()))


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
