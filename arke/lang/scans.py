"""Scans: ``cumsum cumprod cummax cummin (e for n)`` and the recurrence ``scan(e for n, h = init)``.

:class:`ScanLowering` is the part of :class:`arke.lang.kernels.KernelChecker` that checks a
scan (spec/language.md §8.9) and lowers it to a :class:`~arke.ir.semantic.ScanOp`. Unlike a
reduction a scan binds nothing: its index is bound around it and its value keeps it.

The body of ``scan`` must be affine in its carry ``h``; :func:`affine` splits the AST into the
coefficient ``a`` and the addend ``b`` of ``a * h + b`` before anything is typed, so ``h`` never
reaches the expression lowering (it is no value of the kernel).
"""

# mypy: disable-error-code="misc"
# (a mixin of KernelChecker, like arke.lang.indices: `self` is annotated with the class that holds the state)
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.lang import ast
from arke.lang.terms import POISON, Scalar, Term, cast, common_dtype
from arke.lang.walk import children

if TYPE_CHECKING:
    from arke.lang.kernels import KernelChecker

#: The source name of a scan -> the IR's kind.
SCAN_KINDS = {"cumsum": "sum", "cumprod": "prod", "cummax": "max", "cummin": "min", "scan": "linear"}


class NotAffine(Exception):
    """The carry is used in a way that is not ``a * h + b``; ``node`` is the offending sub-expression."""

    def __init__(self, node: ast.Expr, why: str):
        super().__init__(why)
        self.node = node
        self.why = why


def uses(e: ast.Expr, name: str) -> bool:
    """Whether the name ``name`` occurs anywhere in ``e``."""
    return (isinstance(e, ast.Name) and e.id == name) or any(uses(c, name) for c in children(e))


def affine(e: ast.Expr, h: str) -> tuple[ast.Expr | None, ast.Expr | None]:
    """``(a, b)`` with ``e == a * h + b`` and neither using ``h``; ``None`` stands for zero.

    Products distribute over sums, so ``(h + x) * c`` is ``(c, x * c)``; a factor ``1`` is left out.
    Raises :class:`NotAffine` where ``h`` is used otherwise.
    """
    if not uses(e, h):
        return None, e
    if isinstance(e, ast.Name):
        return ast.Num(e.span, 1, True, "1"), None
    if isinstance(e, ast.Unary) and e.op in ("+", "-"):
        a, b = affine(e.operand, h)
        return (a, b) if e.op == "+" else (_neg(a), _neg(b))
    if isinstance(e, ast.Binary) and e.op in ("+", "-"):
        (a1, b1), (a2, b2) = affine(e.left, h), affine(e.right, h)
        if e.op == "-":
            a2, b2 = _neg(a2), _neg(b2)
        return _add(e, a1, a2), _add(e, b1, b2)
    if isinstance(e, ast.Binary) and e.op == "*":
        if uses(e.left, h) and uses(e.right, h):
            raise NotAffine(e, "the carry is multiplied by itself")
        inner, factor = (e.left, e.right) if uses(e.left, h) else (e.right, e.left)
        a, b = affine(inner, h)
        return _mul(e, a, factor), _mul(e, b, factor)
    if isinstance(e, ast.Binary) and e.op == "/":
        raise NotAffine(e, "the carry is divided")
    raise NotAffine(e, "the carry is used inside an operation other than `+`, `-` and `*` by a factor")


def _neg(x: ast.Expr | None) -> ast.Expr | None:
    return None if x is None else ast.Unary(x.span, "-", x)


def _add(e: ast.Expr, x: ast.Expr | None, y: ast.Expr | None) -> ast.Expr | None:
    if x is None or y is None:
        return x if y is None else y
    return ast.Binary(e.span, "+", x, y)


def _mul(e: ast.Expr, x: ast.Expr | None, factor: ast.Expr) -> ast.Expr | None:
    if x is None:
        return None
    if isinstance(x, ast.Num) and x.value == 1 and x.is_int:
        return factor
    return ast.Binary(e.span, "*", x, factor)


class ScanLowering:
    """Scan half of :class:`arke.lang.kernels.KernelChecker` (a mixin: it uses its state)."""

    def _e_Scan(self: KernelChecker, e: ast.Scan) -> Term:
        kind = SCAN_KINDS[e.op]
        if len(e.indices) != 1:
            span = e.index_spans[1] if len(e.indices) > 1 else e.op_span
            self.error("AK2110", f"`{e.op}` scans along exactly one index, not {len(e.indices)}", span,
                       hint=f"write `{e.op}(... for n)`; scan several indices one after another")
            return POISON
        n, n_span = e.indices[0], e.index_spans[0]
        if self.lengths(e) is None:  # a scan takes no length (AK2114)
            return POISON
        options = self.scan_options(e)
        if options is None:
            return POISON
        exclusive, carry = options
        extent = self.lookup_index(n)
        if extent is None:
            self.error("AK2104", f"the scanned index `{n}` is not bound around the `{e.op}`", n_span,
                       hint=f"a scan keeps its index: bind it on the left, as in `y[..., {n}] = {e.op}(... for {n})`")
            return POISON
        self.note_index(n, extent, n_span, reduced=True)
        if carry is None:
            x = self.scalar(e.body, "a value to scan")
            if not isinstance(x, Scalar):
                return POISON
            dtype = DType.I64 if x.dtype.is_bool and kind in ("sum", "prod") else x.dtype
            if x.weak and dtype == DType.I64 and x.dtype.is_float:
                dtype = DType.F32
            return self.scan_op(ScanParts(kind, n, cast(x.sx, dtype), None, None, exclusive), dtype, x.free)
        return self.recurrence(e, n, carry, exclusive)

    def scan_options(self: KernelChecker, e: ast.Scan) -> tuple[bool, ast.Option | None] | None:
        """``(exclusive, carry)`` from a scan's ``name = value`` items, or None after an error."""
        exclusive, carry = False, None
        for k, opt in enumerate(e.options):
            if opt.name == "exclusive" and any(o.name == "exclusive" for o in e.options[:k]):
                self.error("AK2110", "`exclusive` is given twice", opt.name_span, hint="give it once")
                return None
            if opt.name == "exclusive":
                if not (isinstance(opt.value, ast.Name) and opt.value.id in ("true", "false")):
                    self.error("AK2110", "`exclusive` takes `true` or `false`", opt.value.span,
                               hint="write `exclusive = true`")
                    return None
                exclusive = opt.value.id == "true"
            elif e.op == "scan" and carry is None:
                carry = opt
            else:
                known = "`exclusive`" + (" and one carry (`h = 0.0`)" if e.op == "scan" else "")
                self.error("AK2110", f"`{e.op}` takes no option `{opt.name}`", opt.name_span,
                           hint=f"a scan takes {known}")
                return None
        if e.op == "scan" and carry is None:
            self.error("AK2110", "`scan` needs its carried value and where it starts", e.op_span,
                       hint="name it after the index, as in `scan(a[t] * h + b[t] for t, h = 0.0)`")
            return None
        if carry is not None and (self.index_clash(carry.name) is not None
                                  or self.lookup_index(carry.name) is not None):
            self.error("AK2003", f"the carry `{carry.name}` has the name of a tensor, index, dim or `let`",
                       carry.name_span, hint="pick another name for the carried value")
            return None
        return exclusive, carry

    def recurrence(self: KernelChecker, e: ast.Scan, n: str, carry: ast.Option, exclusive: bool) -> Term:
        """``scan(a * h + b for n, h = init)``: the coefficient, addend and start, typed to one dtype."""
        try:
            a_ast, b_ast = affine(e.body, carry.name)
        except NotAffine as bad:
            self.error("AK3020", f"the body of `scan` is not affine in its carry `{carry.name}`: {bad.why}",
                       bad.node.span, hint=f"write it as `a * {carry.name} + b`, where `a` and `b` do not use "
                                           f"`{carry.name}`")
            return POISON
        if uses(carry.value, carry.name):
            self.error("AK2001", f"the carry `{carry.name}` is used in its own initial value", carry.value.span)
            return POISON
        zero = ast.Num(e.span, 0, True, "0")
        parts = [self.scalar(x or zero, "a value to scan") for x in (a_ast, b_ast, carry.value)]
        if any(not isinstance(p, Scalar) for p in parts):
            return POISON
        a, b, init = (p for p in parts if isinstance(p, Scalar))
        if n in init.free:
            self.error("AK2110", f"the initial value of `{carry.name}` depends on the scanned index `{n}`",
                       carry.value.span, hint=f"start from a value that is the same all along `{n}`, "
                                              f"as in `{carry.name} = x[m, 0]`")
            return POISON
        dtype, weak = common_dtype(a, b)
        dtype, weak = common_dtype(Scalar(a.sx, dtype, weak=weak), init)
        if weak:
            dtype = DType.F32 if dtype.is_float else DType.I64
        if dtype.is_bool:
            self.error("AK3005", "a recurrence on booleans", e.span, hint="convert them first, as in `i32(flag)`")
            return POISON
        for s, x in zip((a, b, init), (a_ast or e.body, b_ast or e.body, carry.value)):
            if not self.literal_fits(s, dtype, x):
                return POISON
        return self.scan_op(ScanParts("linear", n, cast(b.sx, dtype), cast(a.sx, dtype), cast(init.sx, dtype),
                                      exclusive), dtype, a.free | b.free | init.free)

    def scan_op(self: KernelChecker, p: ScanParts, dtype: DType, free: frozenset[str]) -> Term:
        """Emit the scan over the indices it depends on (its own index always) and read it back."""
        order = [m for f in self.frames for m in f]
        keep = [m for m in order if m in free or m == p.axis]
        axes = tuple(ir.Axis(m, self.lookup_index(m) or sympy.Integer(1)) for m in keep)
        ssa = self.fresh()
        self.emit(ir.ScanOp(ssa, dtype, p.kind, axes, p.axis, p.body, p.coeff, p.init, p.exclusive))
        return Scalar(ir.Load(ssa, tuple(ir.Idx(m) for m in keep), dtype), dtype, frozenset(keep))


@dataclass(frozen=True)
class ScanParts:
    """What a scan op is made of, before its axes are known."""

    kind: str
    axis: str
    body: ir.SExpr
    coeff: ir.SExpr | None
    init: ir.SExpr | None
    exclusive: bool


__all__ = ["SCAN_KINDS", "ScanLowering", "affine"]
