"""Index scopes: binding a kernel's indices, inferring their extents, and lowering reductions.

:class:`IndexBinding` is the part of :class:`arke.lang.kernels.KernelChecker` that knows
which indices are bound where. An index's extent comes from the places it is used directly
as a subscript (``x[i, k]`` says ``i`` runs over ``x``'s first axis); conflicting uses are
reported with both places. A reduction ``sum(body for i, j)`` binds its indices for its
body and becomes its own op.
"""

# mypy: disable-error-code="misc"
# (IndexBinding is a mixin of KernelChecker: its methods annotate `self` with the class
# that provides the state, which mypy flags as "erased self type" without this.)
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, dim_str
from arke.lang import ast
from arke.lang.diagnostics import Related, did_you_mean
from arke.lang.lengths import blocked_extents
from arke.lang.source import Span
from arke.lang.terms import POISON, Scalar, Term, cast
from arke.lang.walk import children, subscript_names

if TYPE_CHECKING:
    from arke.lang.kernels import KernelChecker


@dataclass(frozen=True)
class IndexInfo:
    """What a kernel's index is: its extent and whether some statement reduces over it."""

    name: str
    extent: Dim
    span: Span
    reduced: bool


class IndexBinding:
    """Index half of :class:`arke.lang.kernels.KernelChecker` (a mixin: it uses its state)."""

    # ------------------------------------------------------------ scopes

    def lookup_index(self: KernelChecker, name: str) -> Dim | None:
        for frame in reversed(self.frames):
            if name in frame:
                return frame[name]
        return None

    def is_unbound(self: KernelChecker, name: str) -> bool:
        return (self.lookup_index(name) is None and name not in self.lets and name not in self.values
                and name not in self.dims and name not in ("true", "false", "inf"))

    def unbound_index(self: KernelChecker, name: str, span: Span, extent: Dim | None = None) -> None:
        scope = {n: d for frame in self.frames for n, d in frame.items()}
        fits = [n for n, d in scope.items() if extent is not None and self.same(d, extent)]
        guess = fits[0] if len(fits) == 1 else did_you_mean(name, scope)
        self.error("AK2104", f"index `{name}` is not bound on the left of `=` or by a reduction", span,
                   hint=f"did you mean `{guess}`?" if guess else "add it to the left side (`y[..., "
                   f"{name}] = ...`) or reduce over it (`sum(... for {name})`)", replacement=guess)

    def note_index(self: KernelChecker, name: str, extent: Dim, span: Span, reduced: bool) -> None:
        old = self.indices.get(name)
        self.indices[name] = IndexInfo(name, extent, old.span if old else span, reduced or bool(old and old.reduced))

    def under(self: KernelChecker, frame: dict[str, Dim], e: ast.Expr, what: str | None) -> Term:
        """Lower ``e`` with the indices of ``frame`` bound: one element (``what`` it is for), or
        any term when ``what`` is None."""
        self.frames.append(frame)
        try:
            return self.expr(e) if what is None else self.scalar(e, what)
        finally:
            self.frames.pop()

    # ------------------------------------------------------------ extents

    def extents(self: KernelChecker, e: ast.Expr, names: list[str], spans: list[Span],
                declared: dict[str, Dim] | None = None, role: str = "intermediate",
                output: ir.TensorType | None = None) -> tuple[dict[str, Dim], bool]:
        """Infer each index's extent from its direct uses as a subscript in ``e``.

        ``role`` says what binds the indices (``"intermediate"``, ``"output"``, ``"return"`` or
        ``"reduction"``): the AK2105 hint differs. Returns the extents and whether they are all
        known; after an error the unknown ones are 1, good enough to look for the expression's
        own errors, not to define anything. ``output``: a `return`'s declared output, whose one axis
        left after the indices with direct uses took theirs goes to the one index without any (§7.2).
        """
        found: dict[str, list[tuple[Dim, Span, str]]] = {n: [] for n in names}
        label = "the declared output" if role == "output" else "the declared shape"
        for n, d in (declared or {}).items():
            found[n].append((d, spans[names.index(n)], label))
        self._collect(e, found, frozenset())
        bare = [n for n in names if not found[n]]
        if output is not None and len(bare) == 1 and len(names) == output.rank:
            left = list(output.shape)
            for n in names:
                hit = next((k for k, d in enumerate(left) if found[n] and self.same(found[n][0][0], d)), None)
                if hit is not None:
                    left.pop(hit)
            if len(left) == 1:
                found[bare[0]].append((left[0], spans[names.index(bare[0])], "the output's axis left"))
        out: dict[str, Dim] = {}
        ok = True
        for name, span in zip(names, spans):
            uses = found[name] or blocked_extents(self, e, name)  # `x[j / P]`: a block table (spec §8.11)
            if not uses:
                ok = False
                out[name] = sympy.Integer(1)
                if self.unreliable_use(e, name):
                    continue  # the access itself is wrong (unknown tensor, wrong arity): that is the error
                message, hint = self.no_extent(e, name, role)
                self.error("AK2105", message, span, hint=hint)
                continue
            first = uses[0]
            for other in uses[1:]:
                if not self.same(first[0], other[0]):
                    self.error("AK3003", f"index `{name}` runs over {dim_str(first[0])} ({first[2]}) but also over "
                               f"{dim_str(other[0])} ({other[2]})", other[1],
                               related=[Related(first[1], f"`{name}` runs over {dim_str(first[0])} here")],
                               hint=f"if they are always equal, add `where {dim_str(first[0])} == "
                                    f"{dim_str(other[0])}`; otherwise use two indices")
                    ok = False
                    break
            out[name] = first[0]
        return out, ok

    def no_extent(self: KernelChecker, e: ast.Expr, name: str, role: str) -> tuple[str, str]:
        """AK2105's message and hint for index ``name`` of ``e``: how it is used instead of alone as
        a subscript, and what gives an index bound by ``role`` an extent."""
        use = _first_use(e, name, frozenset(), None)
        example = f"`x[{name}]`"
        if use is None:
            why = "it is not used on the right of `=`"
        elif use[1] is not None:
            sub, access = use[0], use[1]
            why = (f"it appears only inside the subscript `{self.source_text(sub.span)}` of `{access.name}`, "
                   "never alone as a subscript")
            shown = [name if x is sub else self.source_text(x.span) for x in access.indices]
            example = f"`{access.name}[{', '.join(shown)}]`"
        elif isinstance(use[0], ast.Name):
            why = "it is used only as a value, never as a subscript"
        else:
            why = f"it is used only as a value, in `{self.source_text(use[0].span)}`, never as a subscript"
        hint = f"an index takes its extent from a subscript that is the index alone, as in {example}"
        if role == "intermediate":
            hint += (f", or from a declared shape: write `t[...]: f32[...] = ...` with one dim per index (a dim "
                     f"parameter `K: dim` gives a dim no tensor has); or compute the value inline where `{name}` "
                     "already has an extent")
        elif role == "return":
            hint += ("; a `return` gives the declared output's axis left only to one such index: name the output "
                     "(`-> y: f32[...]`) and define it with `y[...] = ...`, whose declared shape gives every index "
                     "its extent")
        return f"the extent of index `{name}` cannot be inferred: {why}", hint

    def unreliable_use(self: KernelChecker, e: ast.Expr, name: str) -> bool:
        """Whether ``name`` subscripts an access that is wrong itself (an unknown or failed tensor,
        or the wrong number of subscripts), which is reported instead of the missing extent."""
        if isinstance(e, ast.Index) and any(isinstance(i, ast.Name) and i.id == name for i in e.indices):
            v = self.values.get(e.name)
            if v is None or len(e.indices) != v.type.rank:
                return True
        if isinstance(e, ast.Reduce) and name in (e.indices[:1] if e.op in ir.TOPK_KINDS else e.indices):
            return True  # a reduction inside binds `name` again (a top-k's rank index is bound around it): AK2102
        return any(self.unreliable_use(c, name) for c in children(e))

    def _collect(self: KernelChecker, e: ast.Expr, found: dict[str, list[tuple[Dim, Span, str]]],
                 hidden: frozenset[str]) -> None:
        if isinstance(e, ast.Index):
            v = self.values.get(e.name)
            if v is not None and len(e.indices) != v.type.rank:
                v = None  # a wrong number of subscripts is its own error; it says nothing about extents
            for k, sub in enumerate(e.indices):
                if (isinstance(sub, ast.Name) and sub.id in found and sub.id not in hidden and v is not None
                        and k < v.type.rank):
                    found[sub.id].append((v.type.shape[k], sub.span, f"axis {k} of `{e.name}`"))
                self._collect(sub, found, hidden)
            return
        if isinstance(e, ast.Reduce):
            self._collect(e.body, found, hidden | frozenset(e.indices))
            return
        for c in children(e):
            self._collect(c, found, hidden)

    def implicit_indices(self: KernelChecker, e: ast.Expr) -> tuple[list[str], list[Span]]:
        """Names used as subscripts in a `return` that are nothing else: the result's free indices."""
        found = subscript_names(e, self.is_unbound)
        return [n for n, _ in found], [span for _, span in found]

    # ------------------------------------------------------------ reductions

    def reduction(self: KernelChecker, e: ast.Reduce) -> Term:
        """``sum(body for i, j)`` becomes its own op over the indices the body keeps."""
        if e.op in ir.TOPK_KINDS:
            return self.topk_reduction(e)
        names, spans = list(e.indices), list(e.index_spans)
        for n, s in zip(names, spans):
            if self.lookup_index(n) is not None:
                self.error("AK2102", f"reduction index `{n}` is already bound outside this `{e.op}`", s,
                           hint="pick another name for the reduced index")
                return POISON
            if names.count(n) > 1:
                self.error("AK2101", f"index `{n}` is listed twice", s)
                return POISON
            if (clash := self.index_clash(n)) is not None:
                self.error("AK2003", f"reduction index `{n}` has the name of {clash}", s,
                           hint="pick another name for the reduced index")
                return POISON
        if e.op in ir.ARG_KINDS and len(names) != 1:
            self.error("AK3008", f"`{e.op}` reduces over one index, not {len(names)}", e.index_spans[-1],
                       hint=f"a position along several axes has no single meaning: write `{e.op}(... for "
                            f"{names[-1]})` and reduce the other indices separately")
            return POISON
        limits = self.lengths(e)
        if limits is None:
            return POISON
        frame, ok = self.extents(e.body, names, spans, role="reduction")
        if not ok:
            self.under(frame, e.body, "a value to reduce")  # for its own errors only
            return POISON
        for n, s in zip(names, spans):
            self.note_index(n, frame[n], s, reduced=True)
        body = self.under(frame, e.body, "a value to reduce")
        if not isinstance(body, Scalar):
            return POISON
        order = [n for f in self.frames for n in f]
        keep = [n for n in order if n in body.free or any(n in length.free for _, length in limits)]
        axes = tuple(ir.Axis(n, self.lookup_index(n) or sympy.Integer(1)) for n in keep)
        raxes = tuple(ir.Axis(n, frame[n]) for n in names)
        kind, dtype = e.op, body.dtype
        sx = body.sx
        bounds = tuple((n, length.sx) for n, length in limits)
        if kind in ir.ARG_KINDS:  # a position: i64 whatever the body's dtype (spec §8.3)
            ssa = self.fresh()
            self.emit(ir.ReduceOp(ssa, DType.I64, kind, axes, raxes, sx, limits=bounds))
            return Scalar(ir.Load(ssa, tuple(ir.Idx(n) for n in keep), DType.I64), DType.I64, frozenset(keep))
        if kind == "mean" or (kind in ("sum", "prod") and dtype.is_bool):
            dtype = DType.F32 if kind == "mean" and not dtype.is_float else (DType.I64 if dtype.is_bool else dtype)
            sx = cast(sx, dtype)
        if body.weak and dtype == DType.I64 and kind == "mean":
            dtype = DType.F32
        ssa = self.fresh()
        op_kind = "sum" if kind == "mean" else kind
        if (op_kind == "sum" and not bounds and isinstance(sx, ir.Binary) and sx.op == "mul"
                and isinstance(sx.a, ir.Load) and isinstance(sx.b, ir.Load) and sx.a != sx.b
                and _plain(sx.a) and _plain(sx.b)
                and sx.a.dtype == sx.b.dtype == dtype):
            self.emit(ir.ContractOp(ssa, dtype, axes, raxes, sx.a, sx.b))
        else:
            self.emit(ir.ReduceOp(ssa, dtype, op_kind, axes, raxes, sx, limits=bounds))
        result = Scalar(ir.Load(ssa, tuple(ir.Idx(n) for n in keep), dtype), dtype, frozenset(keep))
        if kind == "mean" and bounds:  # divided by the terms there are (spec §8.11)
            terms = ir.Cast(self.length_count(raxes, limits), dtype)
            result = Scalar(ir.Binary("div", result.sx, terms, dtype), dtype, result.free)
        elif kind == "mean":
            count: Dim = sympy.Integer(1)
            for ax in raxes:
                count = count * ax.extent
            denom = ir.Cast(ir.DimRef(count), dtype) if not count.is_number else ir.Const(float(count), dtype)
            result = Scalar(ir.Binary("div", result.sx, denom, dtype), dtype, result.free)
        return result


def _first_use(e: ast.Expr, name: str, hidden: frozenset[str], parent: ast.Expr | None
               ) -> tuple[ast.Expr, ast.Index | None] | None:
    """The first use of index ``name`` in ``e`` (outside reductions that rebind it): ``(the
    subscript it is inside, the access)`` when it is part of a subscript, ``(the expression around
    it, None)`` when it is used as a value; None when it is not used."""
    if isinstance(e, ast.Name):
        return (parent or e, None) if e.id == name and name not in hidden else None
    if isinstance(e, ast.Index):
        for sub in e.indices:
            found = _first_use(sub, name, hidden, e)
            if found is not None:
                return (sub, e) if found[1] is None else found
        return None
    if isinstance(e, ast.Reduce):
        return _first_use(e.body, name, hidden | frozenset(e.indices), e)
    for c in children(e):
        found = _first_use(c, name, hidden, e)
        if found is not None:
            return found
    return None


def _plain(load: ir.Load) -> bool:
    return all(isinstance(i, ir.Idx) for i in load.indices)
