"""Data-dependent extents (spec/language.md §8.11): reduction lengths and block-table extents.

:class:`LengthChecks` is the part of :class:`arke.lang.kernels.KernelChecker` that checks the
``j < n`` items of a reduction (a length: an integer element of the indices around the
reduction, AK2114 / AK3028 / AK3029 otherwise) and lowers them to the ``limits`` of a
:class:`~arke.ir.semantic.ReduceOp`. :func:`blocked_extents` gives an index with no direct
use the extent ``A * P`` of a subscript ``x[.., j / P, ..]`` on an axis of extent ``A``.
"""

# mypy: disable-error-code="misc"
# (a mixin of KernelChecker: its methods annotate `self` with the class that provides the state)
from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim
from arke.lang import ast
from arke.lang.source import Span
from arke.lang.terms import Scalar, cast
from arke.lang.walk import children

if TYPE_CHECKING:
    from arke.lang.kernels import KernelChecker

#: A checked length: the reduce index it bounds and its i64 expression (with its free indices).
Length = tuple[str, Scalar]


class LengthChecks:
    """Length half of :class:`arke.lang.kernels.KernelChecker` (a mixin: it uses its state)."""

    def lengths(self: KernelChecker, e: ast.Reduce | ast.Scan) -> list[Length] | None:
        """The checked lengths of ``e``'s ``j < n`` items (None after an error, which is reported)."""
        if isinstance(e, ast.Scan):
            if e.bounds:
                b = e.bounds[0]
                self.error("AK2114", f"a scan takes no length: `{self.source_text(b.span)}`", b.span,
                           hint=f"a scan runs over the whole index; bound a reduction instead, or select "
                                f"past the length: `{e.op}(... if {b.name} < {self.source_text(b.value.span)} else 0 "
                                f"for {b.name})`")
                return None
            return []
        out: list[Length] = []
        reduced = set(e.indices)
        for b in e.bounds:
            if b.op != "<":
                fix = f"`{b.name} < {self.source_text(b.value.span)} + 1`" if b.op == "<=" else \
                    f"`{b.name} < LENGTH`, the number of terms"
                self.error("AK2114", f"a length is written `{b.name} < LENGTH`, not with `{b.op}`", b.span,
                           hint=f"the index runs from 0 up to the length: write {fix}")
                return None
            if len([x for x in e.bounds if x.name == b.name]) > 1:
                self.error("AK2114", f"index `{b.name}` has two lengths", b.span, hint="give each index one length")
                return None
            inner = _names(b.value) & reduced
            if inner:
                name = sorted(inner)[0]
                self.error("AK3029", f"the length of `{b.name}` uses `{name}`, an index this `{e.op}` reduces",
                           b.value.span, hint="a length is fixed before the first term: it may use the indices "
                                              "bound around the reduction (`lens[b]`), dims and scalars only")
                return None
            n = self.scalar(b.value, "a length")
            if not isinstance(n, Scalar):
                return None
            if n.dtype.is_float or n.dtype.is_bool:
                self.error("AK3028", f"the length of `{b.name}` is {n.dtype}, not an integer", b.value.span,
                           hint=f"a length counts positions: use an integer (`{b.name} < "
                                f"i64({self.source_text(b.value.span)})` converts)")
                return None
            out.append((b.name, Scalar(cast(n.sx, DType.I64), DType.I64, n.free)))
        return out

    def length_count(self: KernelChecker, raxes: tuple[ir.Axis, ...], limits: list[Length]) -> ir.SExpr:
        """How many terms a bounded ``mean`` divides by: each bounded axis counts ``min(max(n, 0), extent)``."""
        total: ir.SExpr | None = None
        bound = dict(limits)
        for ax in raxes:
            term: ir.SExpr = ir.DimRef(ax.extent)
            if ax.name in bound:
                n = bound[ax.name].sx
                term = ir.Binary("min", ir.Binary("max", n, ir.Const(0, DType.I64), DType.I64), term, DType.I64)
            total = term if total is None else ir.Binary("mul", total, term, DType.I64)
        assert total is not None
        return total


def _names(e: ast.Expr) -> set[str]:
    if isinstance(e, ast.Name):
        return {e.id}
    return set().union(*(_names(c) for c in children(e))) if not isinstance(e, ast.Num) else set()


def blocked_extents(checker: KernelChecker, e: ast.Expr, name: str, hidden: frozenset[str] = frozenset()
                    ) -> list[tuple[Dim, Span, str]]:
    """The extents ``A * P`` that subscripts ``x[.., name / P, ..]`` (``P`` a dim or a positive literal,
    on an axis of extent ``A``) give ``name`` in ``e``, each with its place (spec §8.11)."""
    found: list[tuple[Dim, Span, str]] = []
    if isinstance(e, ast.Index):
        v = checker.values.get(e.name)
        for k, sub in enumerate(e.indices):
            block = _block(checker, sub, name)
            if (block is not None and isinstance(sub, ast.Binary) and name not in hidden and v is not None
                    and len(e.indices) == v.type.rank):
                found.append((v.type.shape[k] * block, sub.span, f"axis {k} of `{e.name}` (in blocks of "
                                                                 f"{checker.source_text(sub.right.span)})"))
            found += blocked_extents(checker, sub, name, hidden)
        return found
    if isinstance(e, ast.Reduce):
        return blocked_extents(checker, e.body, name, hidden | frozenset(e.indices))
    for c in children(e):
        found += blocked_extents(checker, c, name, hidden)
    return found


def _block(checker: KernelChecker, sub: ast.Expr, name: str) -> Dim | None:
    """``P`` when ``sub`` is ``name / P`` with ``P`` a dim or a positive integer literal."""
    if not (isinstance(sub, ast.Binary) and sub.op in ("/", "//") and isinstance(sub.left, ast.Name)
            and sub.left.id == name):
        return None
    right = sub.right
    if isinstance(right, ast.Num) and right.is_int and int(right.value) > 0:
        return sympy.Integer(int(right.value))
    if isinstance(right, ast.Name) and right.id in checker.dims and right.id not in checker.lets:
        return checker.dims[right.id]
    return None
