"""SemanticIR's local rules: what is wrong with one dim, condition, literal or scalar-expression node.

Each function returns its messages (empty when the piece is valid) without context; the
callers (``verify_function``, ``verify``) say where the piece is.
"""

from __future__ import annotations

import sympy

from arke.ir import semantic as S
from arke.ir import shapes

#: Unary ops on floats only; ``neg abs relu`` take any number and ``not`` a bool.
FLOAT_UNARY = frozenset(S.UNARY_OPS) - {"neg", "abs", "relu", "not", "bitnot"}
NUMERIC_UNARY = frozenset({"neg", "abs", "relu"})
LOGICAL = frozenset({"and", "or"})
#: Binary ops whose operands and result share one numeric dtype (the bitwise ops: one integer dtype,
#: and the shifts' count is i64).
ARITHMETIC = frozenset(S.BINARY_OPS) - S.COMPARISONS - LOGICAL - S.BITWISE


def _dim_problems(d: shapes.Dim, bound: set[str] | None) -> list[str]:
    """A dim must be an integer expression; with ``bound``, its symbols must be among them."""
    expr = sympy.sympify(d)
    out = []
    unbound = sorted(shapes.free_dims(expr) - bound) if bound is not None else []
    if unbound:
        out.append(f"dim {shapes.dim_str(expr)} uses {', '.join(unbound)}, not bound by `dims`")
    if expr.is_integer is not True:
        out.append(f"dim {shapes.dim_str(expr)} is not an integer expression")
    return out


def _cond_problems(c: S.Cond, bound: set[str] | None) -> list[str]:
    if isinstance(c, S.Rel):
        out = [] if c.op in ("==", "!=", "<", "<=", ">", ">=") else [f"unknown relation {c.op!r}"]
        return out + _dim_problems(c.lhs, bound) + _dim_problems(c.rhs, bound)
    if isinstance(c, S.InSet):
        return [m for d in (c.x, *c.values) for m in _dim_problems(d, bound)]
    if isinstance(c, S.BoolOp):
        out = []
        if c.op not in ("and", "or", "not") or (c.op == "not" and len(c.parts) != 1):
            out.append(f"a condition combines parts with 'and' or 'or', or negates one with 'not' "
                       f"(found {c.op!r} of {len(c.parts)})")
        return out + [m for part in c.parts for m in _cond_problems(part, bound)]
    return [f"not a condition: {c!r}"]


def _literal_problem(value: object, dtype: S.DType) -> str | None:
    """bool values for bool; ints for integer dtypes; ints or floats for float dtypes."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = (isinstance(value, bool) if dtype.is_bool
          else number and isinstance(value, int) if dtype.is_int else number)
    return None if ok else f"{value!r} is not a value of dtype {dtype}"


def _unary_problems(e: S.Unary) -> list[str]:
    if e.op not in S.UNARY_OPS:
        return [f"unknown unary op {e.op!r}"]
    if e.op == "not":
        ok = e.x.dtype.is_bool and e.dtype.is_bool
        return [] if ok else [f"not of {e.x.dtype} typed {e.dtype}: not takes and gives bool"]
    if e.x.dtype != e.dtype:
        return [f"{e.op} of {e.x.dtype} typed {e.dtype}: a unary op keeps its operand's dtype (cast first)"]
    if e.op in FLOAT_UNARY and not e.dtype.is_float:
        return [f"{e.op} of {e.x.dtype}: it takes a float (cast first)"]
    if e.op in NUMERIC_UNARY and e.dtype.is_bool:
        return [f"{e.op} of bool: it takes a number"]
    if e.op == "bitnot" and not e.dtype.is_int:
        return [f"bitnot of {e.dtype}: it takes an integer"]
    return []


def _binary_problems(e: S.Binary) -> list[str]:
    if e.op not in S.BINARY_OPS:
        return [f"unknown binary op {e.op!r}"]
    a, b = e.a.dtype, e.b.dtype
    if e.op in S.COMPARISONS:
        out = [] if a == b else [f"{e.op} of {a} and {b}: both operands need one dtype (cast one)"]
        return out + ([] if e.dtype.is_bool else [f"{e.op} typed {e.dtype}: comparisons give bool"])
    if e.op in LOGICAL:
        ok = a.is_bool and b.is_bool and e.dtype.is_bool
        return [] if ok else [f"{e.op} of {a} and {b} typed {e.dtype}: it takes and gives bool"]
    if e.op in S.SHIFTS:
        ok = a == e.dtype and a.is_int and b is S.DType.I64
        return [] if ok else [f"{e.op} of {a} by {b} typed {e.dtype}: it shifts an integer of the node's dtype "
                              "by an i64 count"]
    if not a == b == e.dtype:
        return [f"{e.op} of {a} and {b} typed {e.dtype}: operands need the node's dtype (insert a cast)"]
    if e.op in S.BITWISE and not e.dtype.is_int:
        return [f"{e.op} of {e.dtype}: bitwise ops take integers"]
    return [f"{e.op} of bool: arithmetic takes numbers"] if e.dtype.is_bool else []
