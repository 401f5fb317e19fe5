"""The ATen reductions as ``.ak`` index definitions: ``sum``, ``mean``, ``amax``, ``amin``, softmax and
log-softmax, variance (``var``, ``var_mean``'s items), each its own stored statement, as std.nn writes them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from arke.torch.aten_values import (
    Context,
    Untranslatable,
    Value,
    _a,
    _arg,
    _norm_dim,
    aten,
    literal,
    shape_of,
)


def _axes(dims: Any, rank: int) -> list[int]:
    """The reduced axes of a ``dim`` argument (an int, a list, or none: every axis), sorted."""
    dims = [dims] if isinstance(dims, int) else dims
    return sorted({_norm_dim(d, rank) for d in dims}) if dims else list(range(rank))


def _reduced(cx: Context, node: fx.Node, src: fx.Node, dims: Any, keep: bool, op: str) -> Value:
    """``op`` over ``dims`` of ``src``, at the node's indices (``keep``: the reduced axes kept, of size 1)."""
    v = cx.value(src)
    red = _axes(dims, len(v.shape))
    total = _reduce_at(cx, v, red, op)
    return Value(shape_of(node), lambda idx: total.at(list(idx) if keep else _spread(idx, red, len(v.shape))))


def _direct(cx: Context, v: Value, axes: Sequence[int]) -> Value:
    """``v``, stored first if its text does not subscript the reduced ``axes`` by their bare indices (a
    reduction index takes its extent from a direct use)."""
    probe = [f"q{k}_" for k in range(len(v.shape))]
    text = v.at(probe)
    if all(f"[{probe[k]}," in text or f", {probe[k]}," in text or f", {probe[k]}]" in text
           or f"[{probe[k]}]" in text for k in axes):
        return v
    return cx.define(v.shape, v.at)


def _reduction(op: str) -> Callable[[Context, fx.Node], Value]:
    def build(cx: Context, node: fx.Node) -> Value:
        if node.kwargs.get("dtype") not in (None, torch.float32):
            raise Untranslatable("a reduction to another dtype")
        return _reduced(cx, node, _a(node)[0], _arg(node, 1, "dim", None), bool(_arg(node, 2, "keepdim", False)), op)

    return build


def _softmax(log: bool) -> Callable[[Context, fx.Node], Value]:
    def build(cx: Context, node: fx.Node) -> Value:
        if _arg(node, 2, "half_to_float", False):
            raise Untranslatable("a half-to-float softmax")
        v = cx.value(_a(node)[0])
        red = _axes(_a(node)[1], len(v.shape))
        v = _direct(cx, v, red)
        top = _reduce_at(cx, v, red, "max")
        shifted = Value(v.shape, lambda idx: f"({v.at(idx)} - {top.at(idx)})")
        total = _reduce_at(cx, Value(v.shape, lambda idx: f"exp({shifted.at(idx)})"), red, "sum")
        if log:
            return Value(shape_of(node), lambda idx: f"({shifted.at(idx)} - log({total.at(idx)}))")
        return Value(shape_of(node), lambda idx: f"(exp({shifted.at(idx)}) / {total.at(idx)})")

    return build


def _var_mean_item(cx: Context, node: fx.Node) -> Value:
    """``getitem(var_mean(x, dims, correction=c, keepdim=k), i)``: the mean (i = 1), or the variance (i = 0)
    as ``sum((x - mean) ** 2) / (count - c)`` (LayerNorm after Inductor's decompositions)."""
    vm, item = _a(node)[0], _a(node)[1]
    if not isinstance(vm, fx.Node) or vm.target is not aten.var_mean.correction:
        raise Untranslatable("an item of something other than var_mean")
    src = _a(vm)[0]
    if vm.kwargs.get("dtype") is not None:
        raise Untranslatable("a var_mean to another dtype")
    dims = _arg(vm, 1, "dim", None)
    keep = bool(vm.kwargs.get("keepdim", False))
    if item == 1:
        return _reduced(cx, node, src, dims, keep, "mean")
    return _variance(cx, node, src, dims, vm.kwargs.get("correction", 1), keep)


def _var(cx: Context, node: fx.Node) -> Value:
    """``var(x, dims, correction=c, keepdim=k)``."""
    return _variance(cx, node, _a(node)[0], _arg(node, 1, "dim", None), node.kwargs.get("correction", 1),
                     bool(node.kwargs.get("keepdim", False)))


def _variance(cx: Context, node: fx.Node, src: Any, dims: Any, correction: Any, keep: bool) -> Value:
    v = cx.value(src)
    rank = len(v.shape)
    red = _axes(dims, rank)
    v = _direct(cx, v, red)
    mean = _reduce_at(cx, v, red, "mean")
    centered = cx.define(v.shape, lambda idx: f"({v.at(idx)} - {mean.at(idx)})")
    correction = 1 if correction is None else correction
    count = " * ".join(v.shape[k] for k in red) or "1"
    if not isinstance(correction, int | float):
        raise Untranslatable("a symbolic correction")
    denominator = f"f32({count})" if not correction else f"(f32({count}) - {literal(correction)})"
    total = _reduce_at(cx, Value(v.shape, lambda idx: f"({centered.at(idx)} * {centered.at(idx)})"), red, "sum")
    out = shape_of(node)

    def at(idx: Sequence[str]) -> str:
        full = list(idx) if keep else _spread(idx, red, rank)
        return f"({total.at(full)} / {denominator})"

    return Value(out, at)


def _spread(idx: Sequence[str], red: Sequence[int], rank: int) -> list[str]:
    """Indices of a reduction's result (the reduced axes dropped) at its operand's rank (0 on those axes)."""
    it = iter(idx)
    return ["0" if k in red else next(it) for k in range(rank)]


def _reduce_at(cx: Context, v: Value, red: Sequence[int], op: str) -> Value:
    """The reduction of ``v`` over the axes ``red``, stored, read back at ``v``'s indices (those axes dropped)."""
    rank = len(v.shape)
    v = _direct(cx, v, red)
    names = {k: cx.fresh("j") for k in red}
    shape = tuple(s for k, s in enumerate(v.shape) if k not in red)

    def body(idx: Sequence[str]) -> str:
        it = iter(idx)
        full = [names[k] if k in red else next(it) for k in range(rank)]
        return f"{op}({v.at(full)} for {', '.join(names.values())})"

    stored = cx.define(shape, body) if shape else cx.define(("1",), lambda idx: body([]))
    return Value(v.shape, lambda idx: stored.at([i for k, i in enumerate(idx) if k not in red] if shape else ["0"]))
