"""Symbolic dims: SymPy expressions over positive-integer symbols, printed and read back.

A dim is a SymPy expression built from :func:`sym` symbols, integers, ``+ - * **`` and
floor division / modulo (``//`` and ``%``). Every symbol is a positive integer, which lets
SymPy prove things like ``N + 1 > N`` and ``M*N >= M`` on its own.

:func:`parse_dim` reads the text :func:`dim_str` prints (a small recursive-descent reader,
never ``eval``), so IR text round-trips.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from functools import cache
from typing import TypeAlias

import sympy
from sympy.printing.precedence import PRECEDENCE

Dim: TypeAlias = sympy.Expr


@cache
def sym(name: str) -> sympy.Symbol:
    """The dim symbol called ``name`` (positive integer)."""
    return sympy.Symbol(name, integer=True, positive=True)


def const(value: int) -> sympy.Integer:
    return sympy.Integer(value)


def floordiv(a: Dim, b: Dim) -> Dim:
    return sympy.floor(a / b)


def mod(a: Dim, b: Dim) -> Dim:
    return sympy.Mod(a, b)


def ceil_div(a: Dim, b: Dim) -> Dim:
    """``ceil(a / b)`` for positive dims."""
    return sympy.floor((a + b - 1) / b)


def row_major_stride(shape: tuple[Dim, ...], k: int) -> Dim:
    """Elements between neighbours along axis ``k`` of a contiguous row-major tensor of ``shape``."""
    out: Dim = sympy.Integer(1)
    for d in shape[k + 1:]:
        out = out * d
    return out


def dim_str(d: Dim) -> str:
    """Canonical text of a dim: ``M``, ``2*N``, ``H//G``, ``T - S + 1``, ``H % G``."""
    return _Printer().doprint(sympy.sympify(d))


class _Printer(sympy.StrPrinter):
    def _print_floor(self, expr: sympy.floor) -> str:
        # Print num//den so that parse_dim rebuilds this very expression: SymPy keeps
        # (K**2 + 2*K)/N as a product (split it as it is; `together` would factor it to
        # K*(K + 2)) and (M + 1)/2 as the sum M/2 + 1/2 (multiply by the common denominator).
        arg = expr.args[0]
        num, den = sympy.fraction(arg)
        if den == 1:
            den = sympy.Integer(math.lcm(*(int(t.as_coeff_Mul()[0].q) for t in sympy.Add.make_args(arg))))
            num = arg * den
        if den == 1:  # a sum over symbolic denominators: exact in value, if not in form
            num, den = sympy.fraction(sympy.together(arg))
        return f"{self._wrap(num)}//{self._wrap(den)}"

    def parenthesize(self, item: sympy.Basic, level: int, strict: bool = False) -> str:
        # `//` and `%` bind like `*` (as in Python), so a floor or Mod that is a factor or a
        # power's base needs parentheses (SymPy asks at Add level for a negated product):
        # 3*floor((M + 1)/2) is `3*((M + 1)//2)`, not `3*(M + 1)//2`.
        if isinstance(item, (sympy.floor, sympy.Mod)) and level >= PRECEDENCE["Add"]:
            return f"({self._print(item)})"
        return str(super().parenthesize(item, level, strict))

    def _print_Mod(self, expr: sympy.Mod) -> str:
        return f"{self._wrap(expr.args[0])} % {self._wrap(expr.args[1])}"

    def _wrap(self, e: sympy.Expr) -> str:
        # A negative number is wrapped too: `(-4) % M`, not `-4 % M` (read as -(4 % M) in a sum).
        text = self.doprint(e)
        return text if e.is_Atom and not text.startswith("-") else f"({text})"


_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z_0-9]*)|(//|\*\*|[-+*/%()]))")


def dim_tokens(text: str) -> list[str]:
    """The tokens of a dim's text (``+ - * // % / **``, parentheses, names, integers)."""
    tokens: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"bad dim expression {text!r} at {pos}")
        tokens.append(m.group(m.lastindex or 0))
        pos = m.end()
    return tokens


class DimAlgebra:
    """What a dim's text is read into: SymPy expressions here; :mod:`arke.targets.llvm.bundle.cexpr` reads
    the same text into C. ``mul`` takes every factor of a product at once."""

    def const(self, value: int) -> object:
        return sympy.Integer(value)

    def sym(self, name: str) -> object:
        return sym(name)

    def add(self, a: object, b: object) -> object:
        return a + b  # type: ignore[operator]

    def sub(self, a: object, b: object) -> object:
        return a - b  # type: ignore[operator]

    def neg(self, a: object) -> object:
        return -a  # type: ignore[operator]

    def mul(self, factors: list[object]) -> object:
        return sympy.Mul(*factors)

    def floordiv(self, a: object, b: object) -> object:
        return floordiv(a, b)

    def mod(self, a: object, b: object) -> object:
        return mod(a, b)

    def pow(self, a: object, b: object) -> object:
        return sympy.Pow(a, b)


def read_dim(text: str, algebra: DimAlgebra) -> object:
    """A dim's text (as :func:`dim_str` prints it) read into ``algebra``."""
    tokens = dim_tokens(text)
    reader = _DimReader(tokens, algebra)
    value = reader.sum()
    if reader.i != len(tokens):
        raise ValueError(f"bad dim expression {text!r}")
    return value


def parse_dim(text: str) -> Dim:
    """Read a dim printed by :func:`dim_str` (``+ - * // % **``, parentheses, names, integers)."""
    value: Dim = read_dim(text, DimAlgebra())
    return value


class _DimReader:
    def __init__(self, tokens: list[str], algebra: DimAlgebra):
        self.t, self.a = tokens, algebra
        self.i = 0

    def peek(self) -> str | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ValueError("dim expression ends early")
        self.i += 1
        return tok

    def sum(self) -> object:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term()
            value = self.a.add(value, rhs) if op == "+" else self.a.sub(value, rhs)
        return value

    def term(self) -> object:
        # The factors of a product are multiplied at once, as SymPy holds them: two at a time,
        # 2*(H + 7)*(H % 2) would distribute the 2 over the sum first. A leading minus is a
        # factor -1 for the same reason (-(H + 7)*x is not (-H - 7)*x).
        factors: list[object] = []
        while self.peek() == "-":
            self.take()
            factors.append(self.a.const(-1))
        factors.append(self.power())
        while self.peek() in ("*", "//", "%", "/"):
            op = self.take()
            rhs = self.unary()
            if op == "*":
                factors.append(rhs)
            else:
                lhs = self.a.mul(factors)
                factors = [self.a.mod(lhs, rhs) if op == "%" else self.a.floordiv(lhs, rhs)]
        return self.a.mul(factors)

    def unary(self) -> object:
        if self.peek() == "-":
            self.take()
            return self.a.neg(self.unary())
        return self.power()

    def power(self) -> object:
        # `**` binds tighter than a leading minus and groups to the right, as in Python.
        base = self.atom()
        if self.peek() == "**":
            self.take()
            return self.a.pow(base, self.unary())
        return base

    def atom(self) -> object:
        tok = self.take()
        if tok == "(":
            value = self.sum()
            if self.take() != ")":
                raise ValueError("expected ')'")
            return value
        if tok.isdigit():
            return self.a.const(int(tok))
        if re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", tok):
            return self.a.sym(tok)
        raise ValueError(f"unexpected {tok!r} in dim expression")


def free_dims(d: Dim) -> set[str]:
    return {s.name for s in sympy.sympify(d).free_symbols}


@cache
def text_form(d: Dim) -> Dim:
    """``d`` in the form :func:`parse_dim` reads back from :func:`dim_str`.

    Substituting into a floor can leave a form the text does not keep: ``floor(2*K/M)`` with
    ``K = M + 1`` is ``floor(2*(M + 1)/M)``, which prints and reads back as
    ``floor((2*M + 2)/M)``, equal in value but not in structure. Every substitution goes
    through here, so IR always prints and reads back to itself.
    """
    e = sympy.sympify(d)
    if not e.has(sympy.floor, sympy.Mod):
        return e
    for _ in range(4):  # reading can simplify further (Mod(-M, 2) is Mod(M, 2)): to a fixed point
        back = parse_dim(dim_str(e))
        if back == e:
            break
        e = back
    return e


def evaluate(d: Dim, env: Mapping[str, int]) -> int:
    """The integer value of a dim once its symbols are known (compiled once per dim: launches are hot)."""
    try:
        value = _compiled(sympy.sympify(d))(env)
    except KeyError as missing:
        raise ValueError(f"dim {dim_str(d)} is not determined by {dict(env)}: {missing} is unknown") from None
    if isinstance(value, Fraction):
        if value.denominator != 1:
            raise ValueError(f"dim {dim_str(d)} is not an integer for {dict(env)}")
        value = value.numerator
    return int(value)


Number = int | Fraction


def value(d: Dim, env: Mapping[str, object]) -> object:
    """A dim's value for these bindings, not converted to ``int``: torch's symbolic sizes (``SymInt``)
    stay symbolic, so a fake implementation's result shapes follow its inputs'."""
    return _compiled(sympy.sympify(d))(env)  # type: ignore[arg-type]


@cache
def _compiled(d: sympy.Expr) -> Callable[[Mapping[str, int]], Number]:
    """``d`` as a Python function of the dim values, exact (integers and fractions)."""
    if d.is_Integer:
        n = int(d)
        return lambda env: n
    if d.is_Rational:
        q = Fraction(int(d.p), int(d.q))
        return lambda env: q
    if d.is_Symbol:
        name = d.name
        return lambda env: env[name]
    parts = [_compiled(a) for a in d.args]
    if d.is_Add:
        return lambda env: sum(f(env) for f in parts)
    if d.is_Mul:
        def product(env: Mapping[str, int]) -> Number:
            out: Number = 1
            for f in parts:
                out = out * f(env)
            return out
        return product
    if d.is_Pow and d.exp.is_Integer:
        base, e = parts[0], int(d.exp)
        return lambda env: Fraction(base(env)) ** e if e < 0 else base(env) ** e
    if isinstance(d, sympy.floor):
        # floor(p / q) of integer-valued p and q is p // q: exact for ints, and it keeps torch's symbolic
        # sizes symbolic (fake implementations evaluate result shapes on them)
        num, den = (_compiled(e) for e in d.args[0].as_numer_denom())
        return lambda env: num(env) // den(env)
    if isinstance(d, sympy.Mod):
        a, b = parts
        return lambda env: a(env) % b(env)
    raise ValueError(f"dim {dim_str(d)} cannot be evaluated")


def canonical(d: Dim) -> Dim:
    """``d`` with nested floor divisions merged: ``(K//2)//2`` is ``K//4`` for every integer K,
    which SymPy does not see on its own."""

    def merge(e: sympy.Expr) -> sympy.Expr:
        coeff, rest = e.args[0].as_coeff_Mul()
        if isinstance(rest, sympy.floor) and coeff.is_Rational and coeff > 0 and coeff.p == 1:
            return sympy.floor(rest.args[0] / coeff.q)  # floor(floor(y) / c) == floor(y / c), c a positive int
        return e

    d = sympy.sympify(d)
    for _ in range(8):
        new = d.replace(lambda e: isinstance(e, sympy.floor), merge)
        if new == d:
            break
        d = new
    return d


def equal(a: Dim, b: Dim) -> bool | None:
    """True or False when SymPy can decide ``a == b`` for every positive value of the symbols.

    Uses ``expand`` and the symbols' assumptions, never ``simplify``: this runs on every
    index use in ``akc check``, which must stay fast.
    """
    if a == b:
        return True
    diff = sympy.expand(canonical(a) - canonical(b))
    if diff == 0:
        return True
    if diff.is_number:
        return False
    if diff.is_zero is False:
        return False
    return None


def decide(cond: sympy.Basic) -> bool | None:
    """True/False when a boolean condition over dims holds for every (or no) positive value."""
    if cond is sympy.true or cond is True:
        return True
    if cond is sympy.false or cond is False:
        return False
    if isinstance(cond, sympy.Not):
        inner = decide(cond.args[0])
        return None if inner is None else not inner
    if isinstance(cond, sympy.And | sympy.Or):
        verdicts = [decide(a) for a in cond.args]
        if isinstance(cond, sympy.And):
            return False if False in verdicts else (True if all(v is True for v in verdicts) else None)
        return True if True in verdicts else (False if all(v is False for v in verdicts) else None)
    if isinstance(cond, sympy.core.relational.Relational):
        diff = sympy.expand(cond.lhs - cond.rhs)
        holds = {"<": diff.is_negative, "<=": diff.is_nonpositive, ">": diff.is_positive,
                 ">=": diff.is_nonnegative, "==": diff.is_zero,
                 "!=": None if diff.is_zero is None else not diff.is_zero}.get(cond.rel_op)
        if holds is not None:
            return bool(holds)
        fails = {"<": diff.is_nonnegative, "<=": diff.is_positive, ">": diff.is_nonpositive,
                 ">=": diff.is_negative}.get(cond.rel_op)
        if fails:
            return False
    return None


def decide_in(x: Dim, values: Sequence[Dim], budget: int = 32) -> bool | None:
    """:func:`decide` for ``x in {values}``: True/False when it holds for every (or no) positive value.

    Linear in the set, where ``Or(Eq(x, v) ...)`` handed to SymPy costs milliseconds a value:
    literal values are compared as Python integers, a bound of ``x`` rules out whole ranges of
    them, and SymPy is asked about at most ``budget`` values one by one. A set that is not
    settled within that is left to run time (None), which is always sound.
    """
    x = sympy.sympify(x)
    numbers: set[int] = set()
    symbolic: list[sympy.Expr] = []
    for v in values:
        e = sympy.sympify(v)
        if e.is_Integer:
            numbers.add(int(e))
        elif e not in symbolic:
            symbolic.append(e)
    if x.is_Integer:
        if int(x) in numbers:
            return True
        candidates = list(symbolic)  # x is a number and no literal is it; a symbolic value may be
    else:
        if any(x == v for v in symbolic):
            return True
        # x depends on dims, so no number equals it for every value: each is either ruled out or unsure.
        positive, nonnegative = x.is_positive, x.is_nonnegative
        left = sorted(c for c in numbers if not ((positive and c <= 0) or (nonnegative and c < 0)))
        if left and ((x - left[-1]).is_positive or (x - left[0]).is_negative):
            left = []
        candidates = [*symbolic, *(const(c) for c in left)]
    unsure = False
    for n, v in enumerate(candidates):
        if n >= budget:
            return None
        verdict = decide(sympy.Eq(x, v))
        if verdict is True:
            return True
        if verdict is None:
            unsure = True
            # Only a symbolic value can equal a symbolic x for every value of the dims: once none is
            # left (or x is a number), nothing can make the membership certain.
            if x.is_Integer or n + 1 >= len(symbolic):
                return None
    return None if unsure else False
