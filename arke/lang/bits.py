"""Bitwise operators and shifts (``& | ^ ~ << >>``, spec §8.9): typing and lowering to SemanticIR.

A mixin of :class:`arke.lang.kernels.KernelChecker`, next to :class:`arke.lang.exprs.ExprLowering`
(which sends these operators here). Operands must be integers, signed or unsigned; a float or
boolean operand is AK3019, and so is a literal shift count outside ``0 <= c < width``. A computed
count is checked at run time (``arith``), never masked.
"""

# mypy: disable-error-code="misc"
# (a mixin of KernelChecker: see arke.lang.exprs)
from __future__ import annotations

from typing import TYPE_CHECKING

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.lang import ast
from arke.lang.terms import Scalar, cast, common_dtype

if TYPE_CHECKING:
    from arke.lang.kernels import KernelChecker

#: `.ak` operator -> IR op (spec/ir.md).
BIT_OPS = {"&": "bitand", "|": "bitor", "^": "bitxor", "<<": "shl", ">>": "shr"}


class BitOps:
    """Bitwise half of the expression checker (a mixin: it uses :class:`KernelChecker`'s state)."""

    def bit_operand(self: KernelChecker, s: Scalar, op: str, side: ast.Expr) -> bool:
        """Whether ``s`` may be an operand of bit operator ``op``; reports AK3019 if not."""
        if s.dtype.is_int:
            return True
        text = self.source_text(side.span)
        if s.dtype.is_bool:
            hint = {"&": "on booleans write `and`", "|": "on booleans write `or`", "^": "on booleans write `!=`",
                    "~": "on booleans write `not`"}.get(op, f"convert it first, as in `i32({text})`")
        elif op == "^":  # the usual slip: `^` for a power
            hint = "`^` is bitwise xor; a power is written `**`"
        else:
            hint = (f"bit operations work on integers; convert first, as in `i32({text})` (a float's bits are "
                    f"not reinterpreted)")
        self.error("AK3019", f"`{op}` needs integers, but `{text}` is {s.dtype}", side.span, hint=hint)
        return False

    def bitwise(self: KernelChecker, op: str, a: Scalar, b: Scalar, e: ast.Expr) -> Scalar | None:
        """Type ``a op b`` for a bitwise operator or a shift; None after reporting an error."""
        left = e.left if isinstance(e, ast.Binary) else e
        right = e.right if isinstance(e, ast.Binary) else e
        if not (self.bit_operand(a, op, left) and self.bit_operand(b, op, right)):
            return None
        free = a.free | b.free
        name = BIT_OPS[op]
        if name in ("bitand", "bitor", "bitxor"):
            dtype, weak = common_dtype(a, b)
            if not (self.literal_fits(a, dtype, e) and self.literal_fits(b, dtype, e)):
                return None
            return Scalar(ir.Binary(name, cast(a.sx, dtype), cast(b.sx, dtype), dtype), dtype, free, weak)
        # A shift has its left operand's type; a weak literal there takes the count's type.
        weak = a.weak and b.weak
        dtype = DType.I64 if weak else (b.dtype if a.weak else a.dtype)
        if not self.literal_fits(a, dtype, e, hint=f"the shifted value takes the count's type, {dtype}"):
            return None
        if isinstance(b.sx, ir.Const) and not 0 <= int(b.sx.value) < dtype.bits:
            self.error("AK3019", f"shift count {int(b.sx.value)} is out of range for {dtype}", right.span,
                       hint=f"a {dtype} shifts by 0 to {dtype.bits - 1}; widen it first, as in `i64(...)`, "
                            "for a longer shift")
            return None
        return Scalar(ir.Binary(name, cast(a.sx, dtype), cast(b.sx, DType.I64), dtype), dtype, free, weak)

    def invert(self: KernelChecker, s: Scalar, e: ast.Expr) -> Scalar | None:
        """Type ``~s``: the bits of an integer flipped, in its own type."""
        operand = e.operand if isinstance(e, ast.Unary) else e
        if not self.bit_operand(s, "~", operand):
            return None
        return Scalar(ir.Unary("bitnot", s.sx, s.dtype), s.dtype, s.free, s.weak)
