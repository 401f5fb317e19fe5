"""Whether conditions over dims can hold together: the checker's proof that a kernel's `where` clauses
contradict each other (AK3007) or that a strategy's `when` never holds for the dims a call can have (AK4016).

Each clause alone is decided with SymPy (:func:`arke.lang.signatures.decide_cond`); this module looks at
several at once. It is sound, not complete: it answers "never" only with a proof, and "maybe" otherwise.
The proof is interval reasoning over positive integers: every top-level ``and`` part that bounds one dim
linearly (``N > 4``, ``2 * M <= 7``, ``N == 4``, ``N in {1, 2}``, ``N % 64 == 0``) narrows that dim's range and set, and
an empty range or set for some dim is a contradiction. An ``or`` holds where one of its sides may; other
parts (``not``, relations of several dims, ``%``) constrain nothing here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import sympy

from arke.ir import semantic as ir
from arke.ir.shapes import Dim


@dataclass
class _Range:
    lo: int = 1  # every dim is a positive integer
    hi: float = math.inf
    values: set[int] | None = None  # an `in` set or an equality, where one applies
    excluded: set[int] = field(default_factory=set)
    residues: list[tuple[int, int]] = field(default_factory=list)  # (m, r): x % m == r

    def empty(self) -> bool:
        if self.lo > self.hi:
            return True
        if self.values is not None:
            return not any(self.lo <= v <= self.hi and v not in self.excluded and all(v % m == r for m, r in
                                                                                       self.residues)
                           for v in self.values)
        if any(self.lo + (r - self.lo) % m > self.hi for m, r in self.residues):  # no multiple in range
            return True
        if self.hi - self.lo < 64:  # a short range: every value of it excluded
            return all(v in self.excluded for v in range(self.lo, int(self.hi) + 1))
        return False


_NEGATED = {"==": "!=", "!=": "==", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}
#: ``a op b`` as ``b op' a`` (both sides multiplied by -1)
_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _holds(op: str, diff: sympy.Expr) -> bool:
    """``diff op 0`` for a number ``diff`` (a Python bool: SymPy's comparisons give its own true and false)."""
    return bool({"==": diff == 0, "!=": diff != 0, "<": diff < 0, "<=": diff <= 0, ">": diff > 0,
                 ">=": diff >= 0}[op])


def _parts(c: ir.Cond) -> list[ir.Cond]:
    if isinstance(c, ir.BoolOp) and c.op == "not":  # De Morgan: `not` pushed down to the comparisons
        c = _negate(c.parts[0])
    if isinstance(c, ir.BoolOp) and c.op == "and":
        return [q for p in c.parts for q in _parts(p)]
    return [c]


def _negate(c: ir.Cond) -> ir.Cond:
    """``not c`` without a `not` at its top (an ``in`` set stays negated: it only excludes values)."""
    if isinstance(c, ir.Rel):
        return ir.Rel(_NEGATED[c.op], c.lhs, c.rhs)
    if isinstance(c, ir.BoolOp) and c.op == "not":
        return c.parts[0]
    if isinstance(c, ir.BoolOp):
        return ir.BoolOp("or" if c.op == "and" else "and", tuple(_negate(p) for p in c.parts))
    return ir.BoolOp("not", (c,))


def _linear(expr: sympy.Expr) -> tuple[sympy.Symbol, sympy.Rational, sympy.Rational] | None:
    """``a * x + b`` of one symbol ``x`` with rational ``a != 0`` and ``b``: (x, a, b); else None."""
    syms = expr.free_symbols
    if len(syms) != 1:
        return None
    x = next(iter(syms))
    try:
        poly = sympy.Poly(expr, x)
    except sympy.PolynomialError:
        return None
    if poly.degree() != 1:
        return None
    a, b = poly.all_coeffs()
    if not (a.is_Rational and b.is_Rational) or a == 0:
        return None
    assert isinstance(x, sympy.Symbol)
    return x, sympy.Rational(a), sympy.Rational(b)


def linear_verdict(op: str, lhs: Dim, rhs: Dim) -> tuple[bool | None] | None:
    """``(verdict,)`` of ``lhs op rhs`` over every positive integer value of its one dim, where ``lhs - rhs`` is
    ``a * x + b`` (True: holds for all, False: for none, None: for some); None where it is not of that form.
    What SymPy's assumptions decide too, without their cost (~5 ms a clause)."""
    diff = sympy.expand(sympy.sympify(lhs) - sympy.sympify(rhs))
    if diff.is_Number:
        return (_holds(op, diff),)
    found = _linear(diff)
    if found is None:
        return None
    _, a, b = found
    first = a + b  # the value at x = 1; from there it only grows (a > 0) or only falls (a < 0)
    if op in ("==", "!="):
        root = -b / a
        some = bool(root.is_integer and root >= 1)
        return (None if some else op == "!=",)
    if a < 0:  # a x + b op 0  <=>  (-a) x + (-b) op' 0
        op, first = _FLIPPED[op], -first
    # now increasing from `first`: `>`/`>=` hold for all where they hold at x = 1 (else eventually);
    # `<`/`<=` hold for none where they fail at x = 1 (else for some)
    at_one = _holds(op, first)
    return ((True if at_one else None) if op in (">", ">=") else (None if at_one else False),)


def _narrow(ranges: dict[sympy.Symbol, _Range], c: ir.Cond) -> bool:
    """Narrow ``ranges`` by ``c`` where it bounds one dim; False where ``c`` alone can never hold."""
    if isinstance(c, ir.Rel):
        lhs, rhs = sympy.sympify(c.lhs), sympy.sympify(c.rhs)
        if c.op == "==" and rhs.is_Integer and isinstance(lhs, sympy.Mod):  # x % m == r
            x, m = lhs.args
            if isinstance(x, sympy.Symbol) and m.is_Integer and int(m) > 0:
                if not 0 <= int(rhs) < int(m):
                    return False
                ranges.setdefault(x, _Range()).residues.append((int(m), int(rhs)))
            return True
        diff = lhs - rhs
        if diff.is_Number:
            return _holds(c.op, diff)
        found = _linear(diff)
        if found is None:
            return True
        x, a, b = found
        op = c.op if a > 0 else _FLIPPED.get(c.op, c.op)
        t = -b / a  # a x + b op 0  <=>  x op' t
        r = ranges.setdefault(x, _Range())
        if op == "==":
            r.values = {int(t)} & (r.values if r.values is not None else {int(t)}) if t.is_integer else set()
        elif op == "!=":
            if t.is_integer:
                r.excluded.add(int(t))
        elif op in ("<", "<="):
            r.hi = min(r.hi, math.ceil(t) - 1 if op == "<" else math.floor(t))
        else:
            r.lo = max(r.lo, math.floor(t) + 1 if op == ">" else math.ceil(t))
        return True
    if isinstance(c, ir.InSet):
        x = sympy.sympify(c.x)
        values = [sympy.sympify(v) for v in c.values]
        if not isinstance(x, sympy.Symbol) or not all(v.is_Integer for v in values):
            return True
        r = ranges.setdefault(x, _Range())
        members = {int(v) for v in values}
        r.values = members if r.values is None else r.values & members
        return True
    if c.op == "or":
        return any(may_hold([p]) for p in c.parts)
    if c.op == "not" and isinstance(c.parts[0], ir.InSet):  # x not in {...}: those values excluded
        x = sympy.sympify(c.parts[0].x)
        values = [sympy.sympify(v) for v in c.parts[0].values]
        if isinstance(x, sympy.Symbol) and all(v.is_Integer for v in values):
            ranges.setdefault(x, _Range()).excluded.update(int(v) for v in values)
    return True


#: ``or`` clauses split into cases (each disjunct with the other clauses) up to this many cases; past it each
#: ``or`` is only refuted alone (sound either way: fewer proofs, never a false one).
_CASES = 64


def may_hold(conds: Iterable[ir.Cond]) -> bool:
    """False only where the conjunction of ``conds`` provably holds for no positive dims (see the module)."""
    parts = [p for c in conds for p in _parts(c)]
    ors = [p for p in parts if isinstance(p, ir.BoolOp) and p.op == "or"]
    cases = 1
    for o in ors:
        cases *= len(o.parts)
    if ors and cases <= _CASES:
        rest = [p for p in parts if p is not ors[0]]
        return any(may_hold([*rest, d]) for d in ors[0].parts)
    ranges: dict[sympy.Symbol, _Range] = {}
    for p in parts:
        if not _narrow(ranges, p):
            return False
    return not any(r.empty() for r in ranges.values())
