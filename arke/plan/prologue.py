"""Attention's key prologue, computed once per call: the fused ``k`` expression becomes a map of its own.

After fusion, an attention core's ``k`` factor may be any expression (QK-norm's
``k * rsqrt(..) * kw``, a rotary embedding, a scale): the fusion pass folded the producer into
the scores' sum, where it is evaluated for every (query, key) pair it multiplies. A renderer
computes such key rows as it packs each key tile, but every task (a block of query rows of
one head) packs every key tile again: the prologue runs ``S / rows × R`` times per key (GQA's
``R`` heads share a key), with its ``sin``/``cos`` or divisions each time.

:func:`hoist_key_prologues` undoes that fold where an attention core matches: a new map

    %kp[a.., g, j, d] = k(a.., h := g, j, d)

over the batch axes ``k`` reads (GQA's head axis ``h``, read only as ``h / R``, becomes the group
axis ``g < extent(h) / R``; an axis ``k`` never reads is dropped), the key axis and the feature
axis (innermost), is computed before the core, and the scores read ``%kp[a.., h / R, j, d]`` — a
plain load the renderers read in place. The core is matched again on the rewritten ops; if it
no longer matches (or still is not direct) nothing changes.

**Meaning.** ``%kp``'s element is exactly what the scores evaluated at the same key (the same
expression at the same indices; ``h / R`` at ``h = g·R + r`` is ``g``), so the scores, and every
bit of the result, are unchanged on every target. ``k`` is now evaluated at every key, also at
keys a mask hides from every query (whose tiles a renderer may skip); the interpreter evaluates
it there too, so no error can appear that the interpreter would not report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from arke.ir import semantic as ir
from arke.ir import strategy as sir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, floordiv
from arke.passes.rewrite import map_expr
from arke.plan.dispatch import PlanOp

#: The name prefix of a hoisted key prologue's value (``%kp_<scores>``; a clash with a source name
#: leaves the core as it is).
PREFIX = "kp_"


def hoist_key_prologues(fn: ir.Function, ops: list[PlanOp], strategy: sir.Strategy | None
                        ) -> tuple[ir.Function, list[PlanOp]]:
    """``fn`` and its ``ops`` with each matched attention core's computed ``k`` hoisted into a map
    of its own, placed right before the core's scores (see the module doc)."""
    from arke.plan.attention import Attention, match_attention

    k = 0
    while k < len(ops):
        d = match_attention(fn, ops, k, strategy)
        if d is None or not isinstance(d.pattern, Attention):
            k += 1
            continue
        pat = d.pattern
        hoisted = None if pat.k_direct or pat.k_half is not None else _hoist(fn, ops, k, pat.key_index)
        if hoisted is not None:
            new_fn, new_ops = hoisted
            again = match_attention(new_fn, new_ops, k + 1, strategy)
            if again is not None and isinstance(again.pattern, Attention) and again.pattern.k_direct:
                fn, ops = new_fn, new_ops
                k += 1  # the hoisted map
        k += len(d.members)
    return fn, ops


def _hoist(fn: ir.Function, ops: list[PlanOp], at: int, key: str) -> tuple[ir.Function, list[PlanOp]] | None:
    """The rewrite at ``ops[at]`` (the scores), or None where its ``k`` factor cannot be hoisted."""
    scores = ops[at]
    if isinstance(scores, ir.ContractOp | ir.MapOp) or not isinstance(scores.body, ir.Binary):
        return None  # a contraction's operands are loads already
    a, b = scores.body.a, scores.body.b
    uses_key = [_uses(x, key) for x in (a, b)]
    if uses_key.count(True) != 1:
        return None
    kexpr = a if uses_key[0] else b
    feature = scores.reduce_axes[0]
    axes: list[ir.Axis] = []
    subs: list[ir.SExpr] = []
    body = kexpr
    for axis in scores.axes:
        if axis.name == key or not _uses(kexpr, axis.name):
            continue
        divisors = {x.b for x in ir.walk(kexpr) if isinstance(x, ir.Binary) and x.op == "div"
                    and x.a == ir.Idx(axis.name)}
        direct = sum(1 for x in ir.walk(kexpr) if x == ir.Idx(axis.name))
        group = _as_dim(divisors.pop()) if len(divisors) == 1 else None
        per_div = sum(1 for x in ir.walk(kexpr) if isinstance(x, ir.Binary) and x.op == "div"
                      and x.a == ir.Idx(axis.name))
        if group is not None and per_div == direct:  # read only as `h / R`: one row per group
            node = next(x for x in ir.walk(kexpr) if isinstance(x, ir.Binary) and x.op == "div"
                        and x.a == ir.Idx(axis.name))
            name = f"{axis.name}_g"
            if name in {x.name for x in (*scores.axes, *scores.reduce_axes)} or not _positive(fn, group):
                return None
            body = map_expr(body, _replacing(node, ir.Idx(name)))
            axes.append(ir.Axis(name, floordiv(axis.extent, group)))
            subs.append(node)
        else:
            axes.append(axis)
            subs.append(ir.Idx(axis.name))
    key_axis = next(x for x in scores.axes if x.name == key)
    axes += [key_axis, feature]
    subs += [ir.Idx(key), ir.Idx(feature.name)]
    names = {x.name for x in axes}
    if any(isinstance(x, ir.Idx) and x.name not in names for x in ir.walk(body)) or body.dtype is not DType.F32:
        return None
    result = PREFIX + scores.result
    if result in fn.value_types():
        return None
    hoisted = ir.MapOp(result, DType.F32, tuple(axes), body, None)
    load = ir.Load(result, tuple(subs), DType.F32)
    product = ir.Binary("mul", load, b, scores.body.dtype) if uses_key[0] else ir.Binary("mul", a, load,
                                                                                            scores.body.dtype)
    new_scores = replace(scores, body=product)
    new_ops = [*ops[:at], hoisted, new_scores, *ops[at + 1:]]
    where = fn.ops.index(scores) if scores in fn.ops else None
    if where is None:
        return None
    fn_ops = (*fn.ops[:where], hoisted, new_scores, *fn.ops[where + 1:])
    return replace(fn, ops=fn_ops), new_ops


def _replacing(old: ir.SExpr, new: ir.SExpr) -> Callable[[ir.SExpr], ir.SExpr]:
    """A rewrite for :func:`map_expr` that puts ``new`` wherever ``old`` is (every ``h / R`` is one value)."""
    def swap(x: ir.SExpr) -> ir.SExpr:
        return new if x == old else x

    return swap


def _uses(e: ir.SExpr, name: str) -> bool:
    return any(isinstance(x, ir.Idx) and x.name == name for x in ir.walk(e))


def _as_dim(e: ir.SExpr) -> Dim | None:
    """A divisor written with dims and literals (``R`` of ``h / R``), as a dim."""
    from arke.plan.attention import _as_dim as as_dim

    return as_dim(e)


def _positive(fn: ir.Function, d: Dim) -> bool:
    """Whether ``d`` is at least 1 for every call (a product of dims, or ``H / G`` under ``H % G == 0``)."""
    from arke.plan.attention import _positive as positive

    return positive(fn, d)


__all__ = ["PREFIX", "hoist_key_prologues"]
