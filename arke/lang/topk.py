"""Top-k selections (``topk argtopk bottomk argbottomk``, spec/language.md §8.3): checking and lowering.

A mixin of :class:`arke.lang.kernels.KernelChecker`, called from
:meth:`arke.lang.indices.IndexBinding.reduction`. ``topk(expr for n, j)`` reduces ``n`` (bound
inside, its extent from ``expr``) into the rank ``j``, an index bound around the expression whose
extent ``K`` is the number of values kept. It becomes one ``reduce.<kind>`` op whose last axis is
the rank (spec/ir.md §2.5). ``K <= N`` is AK3023 when both are literals and a guard otherwise.
"""

# mypy: disable-error-code="misc"
# (a mixin of KernelChecker: see arke.lang.exprs)
from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import dim_str
from arke.lang import ast
from arke.lang.signatures import decide_cond
from arke.lang.terms import POISON, Scalar, Term
from arke.lang.walk import children

if TYPE_CHECKING:
    from arke.lang.kernels import KernelChecker


def _uses(e: ast.Expr, name: str) -> ast.Expr | None:
    """The first use of ``name`` as a name in ``e`` (outside reductions that rebind it), or None."""
    if isinstance(e, ast.Name):
        return e if e.id == name else None
    if isinstance(e, ast.Reduce) and name in e.indices[:1 if e.op in ir.TOPK_KINDS else None]:
        return None
    for c in children(e):
        found = _uses(c, name)
        if found is not None:
            return found
    return None


class TopKLowering:
    """The top-k half of the reduction checker (a mixin: it uses :class:`KernelChecker`'s state)."""

    def topk_reduction(self: KernelChecker, e: ast.Reduce) -> Term:
        """``topk(body for n, j)``: one ``reduce.topk`` op over the kept indices and the rank ``j``."""
        form = f"`{e.op}(... for n, j)`"
        if e.bounds:  # a length (§8.11) would leave fewer than K values to select
            b = e.bounds[0]
            self.error("AK2114", f"`{e.op}` takes no length: `{self.source_text(b.span)}`", b.span,
                       hint=f"select from the whole row; mask what lies past the length: "
                            f"`{e.op}((x if {b.name} < n else -inf) for {b.name}, j)`")
            return POISON
        if e.options:
            opt = e.options[0]
            hint = ("for the smallest values write `bottomk` (`argbottomk` for their positions)"
                    if opt.name in ("largest", "smallest") else f"{form} takes no options; results are always sorted")
            self.error("AK2112", f"`{e.op}` takes no option `{opt.name}`", opt.name_span, hint=hint)
            return POISON
        if len(e.indices) != 2:
            self.error("AK2112", f"`{e.op}` lists the reduced index and the rank index ({form}), not "
                       f"{len(e.indices)} {'index' if len(e.indices) == 1 else 'indices'}", e.op_span,
                       hint="the rank `j` is the index of the output being defined: "
                            f"`v[t, j] = {e.op}(x[t, n] for n, j)`")
            return POISON
        (n, j), (n_span, j_span) = e.indices, e.index_spans
        if n == j:
            self.error("AK2101", f"index `{n}` is listed twice", j_span)
            return POISON
        if self.lookup_index(n) is not None:
            self.error("AK2102", f"reduction index `{n}` is already bound outside this `{e.op}`", n_span,
                       hint="pick another name for the reduced index")
            return POISON
        if (clash := self.index_clash(n)) is not None:
            self.error("AK2003", f"reduction index `{n}` has the name of {clash}", n_span,
                       hint="pick another name for the reduced index")
            return POISON
        extent_k = self.lookup_index(j)
        if extent_k is None:
            self.error("AK2112", f"the rank index `{j}` of `{e.op}` is not bound around it", j_span,
                       hint=f"define a named output with it, as in `v[..., {j}] = {e.op}(... for {n}, {j})` with "
                            "`v`'s last axis the number of values kept")
            return POISON
        used = _uses(e.body, j)
        if used is not None:
            self.error("AK2112", f"the value that `{e.op}` selects from uses its rank index `{j}`", used.span,
                       hint=f"`{j}` numbers the selected values; the value must not depend on it")
            return POISON
        frame, ok = self.extents(e.body, [n], [n_span], role="reduction")
        if not ok:
            self.under(frame, e.body, "a value to select")
            return POISON
        self.note_index(n, frame[n], n_span, reduced=True)
        body = self.under(frame, e.body, "a value to select")
        if not isinstance(body, Scalar):
            return POISON
        extent_n = frame[n]
        if not self.topk_fits(e, extent_k, extent_n):
            return POISON
        order = [name for f in self.frames for name in f]
        keep = [name for name in order if name in body.free and name != j]
        axes = tuple(ir.Axis(name, self.lookup_index(name) or sympy.Integer(1)) for name in keep)
        axes += (ir.Axis(j, extent_k),)
        dtype = DType.I64 if e.op.startswith("arg") else body.dtype
        ssa = self.fresh()
        self.emit(ir.ReduceOp(ssa, dtype, e.op, axes, (ir.Axis(n, extent_n),), body.sx))
        free = (*keep, j)
        return Scalar(ir.Load(ssa, tuple(ir.Idx(name) for name in free), dtype), dtype, frozenset(free))

    def topk_fits(self: KernelChecker, e: ast.Reduce, k: sympy.Expr, n: sympy.Expr) -> bool:
        """``K <= N``: AK3023 when it is false, a guard when it cannot be decided here."""
        cond = ir.Rel("<=", k, n)
        verdict = decide_cond(cond, self.sig.subst)
        if verdict is False:
            self.error("AK3023", f"`{e.op}` keeps {dim_str(k)} values from rows of {dim_str(n)}", e.op_span,
                       hint=f"the rank index `{e.indices[1]}` runs over {dim_str(k)} positions; keep at most "
                            f"{dim_str(n)}")
            return False
        if verdict is None:
            text = f"{dim_str(k)} <= {dim_str(n)} (`{e.op}` keeps {dim_str(k)} values from rows of {dim_str(n)})"
            if all(g.cond != cond for g in self.guards):  # once, however many selections share it
                self.guards.append(ir.Guard(cond, text))
        return True
