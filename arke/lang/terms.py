"""Typed terms: what the checker knows about an expression while it lowers it to SemanticIR.

An expression is either

* a :class:`Scalar` — one element, possibly depending on named indices (``x[m, n] * w[n]``
  depends on ``m`` and ``n``), lowered to a SemanticIR scalar expression; or
* a :class:`Tensor` — a whole tensor written without indices (``silu(g) * u``), whose
  element at any subscripts can be produced on demand; or
* :data:`POISON` — an expression that already had an error (it silences follow-on errors).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from arke.ir import semantic as ir
from arke.ir.dtypes import DType, promote
from arke.ir.shapes import Dim, floordiv, mod


@dataclass(frozen=True)
class Scalar:
    """An element-level term. ``free``: the indices it depends on. ``weak``: an untyped literal
    (it takes the other operand's type, like ``2`` in ``x * 2``). ``dim``: set when the term is
    a pure integer expression of dims and literals (so ``let R = H / G`` defines a dim)."""

    sx: ir.SExpr
    dtype: DType
    free: frozenset[str] = frozenset()
    weak: bool = False
    dim: Dim | None = None


@dataclass(frozen=True)
class Tensor:
    """A whole tensor: ``shape``, ``dtype``, and ``at(subscripts)`` giving its element expression.

    ``value`` is set when the tensor is exactly an SSA value (nothing to compute).
    """

    shape: tuple[Dim, ...]
    dtype: DType
    at: Callable[[tuple[ir.SExpr, ...]], ir.SExpr] = field(compare=False)
    value: str | None = None

    @property
    def rank(self) -> int:
        return len(self.shape)


class _Poison:
    """The term of an expression that had an error."""

    def __repr__(self) -> str:
        return "POISON"


POISON = _Poison()

Term = Scalar | Tensor | _Poison


def cast(s: ir.SExpr, to: DType) -> ir.SExpr:
    """``s`` converted to ``to`` (constants are converted in place; no-op when already ``to``)."""
    if s.dtype == to:
        return s
    if isinstance(s, ir.Const):
        value = s.value
        if to.is_float:
            return ir.Const(float(value), to)
        if to.is_bool:
            return ir.Const(bool(value), to)
        if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
            return ir.Cast(s, to)
        return ir.Const(int(value), to)
    return ir.Cast(s, to)


def common_dtype(a: Scalar, b: Scalar) -> tuple[DType, bool]:
    """The dtype two operands meet at, and whether the result is still a weak literal.

    A weak int literal takes the other side's type; a weak float literal takes the other
    side's float type, or ``f32`` against an integer.
    """
    if a.weak and b.weak:
        if a.dtype.is_float or b.dtype.is_float:
            return DType.F32, True
        return DType.I64, True
    if a.weak or b.weak:
        weak, strong = (a, b) if a.weak else (b, a)
        if weak.dtype.is_float and not strong.dtype.is_float:
            return DType.F32, False
        if strong.dtype.is_bool:
            return weak.dtype, False
        return strong.dtype, False
    return promote(a.dtype, b.dtype), False


def scalar_const(value: float | int | bool, dtype: DType, weak: bool = True) -> Scalar:
    from arke.ir.shapes import const

    dim = const(int(value)) if isinstance(value, int) and not isinstance(value, bool) else None
    return Scalar(ir.Const(value, dtype), dtype, frozenset(), weak, dim)


def broadcast_scalar(sx: ir.SExpr, dtype: DType, shape: tuple[Dim, ...] = ()) -> Tensor:
    """A whole tensor of ``shape`` whose every element is ``sx`` (which uses no indices)."""

    def at(subs: tuple[ir.SExpr, ...]) -> ir.SExpr:
        return sx

    return Tensor(shape, dtype, at)


def dim_op(name: str, a: Dim, b: Dim) -> Dim | None:
    """The dim an integer operation of two dims gives (None: not a dim, or a division by zero)."""
    if name == "add":
        return a + b
    if name == "sub":
        return a - b
    if name == "mul":
        return a * b
    if name in ("div", "floordiv"):
        return floordiv(a, b) if b != 0 else None
    if name == "mod":
        return mod(a, b) if b != 0 else None
    return None
