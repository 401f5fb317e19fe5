"""The ATen operators the ``arke`` backend translates to ``.ak``, each by its ``.ak`` definition.

A translated operator does not run on its own: it becomes part of a kernel that
:mod:`arke.torch.regions` writes for a whole region of the graph, so Arke's passes and plans fuse
it with its neighbours (a norm's reduction and the scaling after it are one rows dispatch, a
rotary embedding's slices, negation and concatenation one elementwise pass). Each value is an
*index expression*: given the ``.ak`` index expressions of an element, the ``.ak`` text of that
element (:class:`Value`).

* **Elementwise** operators are their ``.ak`` expressions (``aten.rsqrt(x)`` is ``rsqrt(x[..])``,
  ``aten.add(x, y, alpha=a)`` is ``x[..] + a * y[..]``), broadcasting as torch does: an operand's axis
  of size 1 against a longer one is read at 0.
* **Layout** operators (views, permutes, ``expand``, ``slice``, ``cat``, ``unsqueeze``) cost nothing:
  they map an element's indices to their operand's (a view splits or merges axes with ``//`` and
  ``%``; ``cat`` selects its piece with ``if``/``else``, every piece read at an index kept in range,
  since both branches are evaluated).
* **Reductions** (``sum``, ``mean``, ``amax``, ``amin``, ``_softmax``, ``_log_softmax``, ``var``,
  ``var_mean``) are index definitions of their own (``r[i, j] = mean(x[i, j, k] ** 2 for k)``), as
  std.nn writes them.
* **Comparisons and logic** (``gt`` ... ``ne``, ``logical_*``, ``bitwise_*`` on bool tensors) are bool
  values, read by ``where``; **gathers** (``embedding``, ``index_select``, ``gather``) read their
  indices from an integer tensor.

Values are f32 (bool for comparisons); parameters may also be integer index tensors, and f64 scalars
are converted as they are passed. Anything else is :class:`Untranslatable`, with the reason the
backend reports.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from arke.torch.aten_layout import (
    _cat,
    _embedding,
    _expand,
    _gather,
    _index_select,
    _permute,
    _slice,
    _squeeze,
    _unsqueeze,
    _view,
)
from arke.torch.aten_reduce import _reduction, _softmax, _var, _var_mean_item
from arke.torch.aten_values import AK_DTYPES as AK_DTYPES
from arke.torch.aten_values import At as At
from arke.torch.aten_values import Context as Context
from arke.torch.aten_values import Untranslatable as Untranslatable
from arke.torch.aten_values import Value as Value
from arke.torch.aten_values import _a as _a
from arke.torch.aten_values import _arg, aten, literal, mask_shape_of, prims, shape_of
from arke.torch.aten_values import _sym as _sym
from arke.torch.aten_values import dim_text as dim_text
from arke.torch.aten_values import f32_meta as f32_meta
from arke.torch.aten_values import meta as meta
from arke.torch.aten_values import value_dtype as value_dtype

# ---------------------------------------------------------------- elementwise


def _operands(cx: Context, node: fx.Node, args: Sequence[Any], mask: bool = False,
              bools: bool = False) -> list[At]:
    """Each operand's element at the output's indices (broadcast as torch does; numbers as literals). With
    ``mask`` the first operand is a bool tensor (``where``'s condition), the others f32; with ``bools`` the
    node's value is a bool tensor (a comparison of f32 operands, or logic on bool ones)."""
    out = mask_shape_of(node) if bools else shape_of(node)
    ats: list[At] = []
    for n, a in enumerate(args):
        if not isinstance(a, fx.Node):
            ats.append(_constant(literal(a)))
            continue
        t = meta(a)
        if (mask and n == 0) or (bools and isinstance(t, torch.Tensor) and t.dtype == torch.bool):
            mask_shape_of(a)
        else:
            f32_meta(a)
        v = cx.value(a)
        off = len(out) - len(v.shape)
        if off < 0:
            raise Untranslatable(f"`{a.name}` has more axes than `{node.name}`")

        def at(idx: Sequence[str], v: Value = v, off: int = off) -> str:
            return v.at([("0" if d == "1" and out[off + k] != "1" else idx[off + k]) for k, d in enumerate(v.shape)])

        ats.append(at)
    return ats


def _where(cx: Context, node: fx.Node) -> Value:
    c, a, b = _operands(cx, node, _a(node)[:3], mask=True)
    return Value(shape_of(node), lambda idx: f"({a(idx)} if {c(idx)} else {b(idx)})")


def _compare(op: str) -> Callable[[Context, fx.Node], Value]:
    """A comparison (``gt``, ``eq``, ...; NaN compares as IEEE says) or logic on bool tensors: a bool value."""

    def build(cx: Context, node: fx.Node) -> Value:
        args = _a(node)[:1] if op == "not" else _a(node)[:2]
        if any(isinstance(a, bool) for a in args):
            raise Untranslatable("a comparison with a bool constant")
        if op in ("and", "or", "not", "xor"):  # logic on bool tensors only (torch's also takes numbers)
            for a in args:
                mask_shape_of(a)
        sign = "!=" if op == "xor" else op
        ats = _operands(cx, node, args, bools=True)
        if op == "not":
            return Value(mask_shape_of(node), lambda idx: f"(not {ats[0](idx)})")
        return Value(mask_shape_of(node), lambda idx: f"({ats[0](idx)} {sign} {ats[1](idx)})")

    return build


def _constant(text: str) -> At:
    return lambda idx: text


def _pointwise(template: str, arity: int = 1) -> Callable[[Context, fx.Node], Value]:
    """An elementwise operator whose ``.ak`` form is ``template`` over its first ``arity`` arguments."""

    def build(cx: Context, node: fx.Node) -> Value:
        ats = _operands(cx, node, _a(node)[:arity])
        return Value(shape_of(node), lambda idx: template.format(*(f(idx) for f in ats)))

    return build


def _add_sub(sign: str) -> Callable[[Context, fx.Node], Value]:
    def build(cx: Context, node: fx.Node) -> Value:
        alpha = node.kwargs.get("alpha", 1)
        a, b = _operands(cx, node, _a(node)[:2])
        scale = "" if alpha == 1 else f"{literal(alpha)} * "
        return Value(shape_of(node), lambda idx: f"({a(idx)} {sign} {scale}{b(idx)})")

    return build


def _div(cx: Context, node: fx.Node) -> Value:
    if node.kwargs.get("rounding_mode") is not None:
        raise Untranslatable("a division with a rounding mode")
    a, b = _operands(cx, node, _a(node)[:2])
    return Value(shape_of(node), lambda idx: f"({a(idx)} / {b(idx)})")


def _pow(cx: Context, node: fx.Node) -> Value:
    (a,) = _operands(cx, node, _a(node)[:1])
    p = _a(node)[1]
    if p == 2:
        return Value(shape_of(node), lambda idx: f"({a(idx)} * {a(idx)})")
    if p == 0.5:
        return Value(shape_of(node), lambda idx: f"sqrt({a(idx)})")
    if p == -0.5:
        return Value(shape_of(node), lambda idx: f"rsqrt({a(idx)})")
    if isinstance(p, int | float) and float(p).is_integer() and abs(p) <= 64:  # exact for negative bases too
        return Value(shape_of(node), lambda idx: f"({a(idx)} ** {int(p)})")
    return Value(shape_of(node), lambda idx: f"pow({a(idx)}, {literal(p)})")


def _gelu(cx: Context, node: fx.Node) -> Value:
    (a,) = _operands(cx, node, _a(node)[:1])
    if _arg(node, 1, "approximate", "none") == "tanh":
        return Value(shape_of(node), lambda idx: (
            f"(0.5 * {a(idx)} * (1.0 + tanh(0.7978845608028654 * ({a(idx)} + 0.044715 * {a(idx)} ** 3))))"))
    return Value(shape_of(node), lambda idx: f"gelu({a(idx)})")


def _same(cx: Context, node: fx.Node) -> Value:
    """A copy (the operand itself) or a conversion to f32."""
    shape_of(node)
    src = meta(_a(node)[0])
    if not isinstance(src, torch.Tensor) or src.dtype not in AK_DTYPES:
        raise Untranslatable(f"a conversion from {getattr(src, 'dtype', src)}")
    v = cx.value(_a(node)[0])
    if src.dtype == torch.float32:
        return v
    return Value(v.shape, lambda idx: f"f32({v.at(idx)})")


def _clamp(cx: Context, node: fx.Node) -> Value:
    (a,) = _operands(cx, node, _a(node)[:1])
    lo, hi = _arg(node, 1, "min"), _arg(node, 2, "max")
    lo_t = None if lo is None else literal(lo)
    hi_t = None if hi is None else literal(hi)

    def at(idx: Sequence[str]) -> str:
        text = a(idx)
        if lo_t is not None:
            text = f"max({text}, {lo_t})"
        if hi_t is not None:
            text = f"min({text}, {hi_t})"
        return text

    return Value(shape_of(node), at)


# ---------------------------------------------------------------- the table


def _unary(fn: str) -> Callable[[Context, fx.Node], Value]:
    return _pointwise(fn + "({})")


_COMPARISONS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "eq": "==", "ne": "!="}

#: ATen overload -> its ``.ak`` definition. Layout operators are in :data:`LAYOUT` as well.
TABLE: dict[Any, Callable[[Context, fx.Node], Value]] = {
    aten.add.Tensor: _add_sub("+"), aten.add.Scalar: _add_sub("+"),
    aten.sub.Tensor: _add_sub("-"), aten.sub.Scalar: _add_sub("-"),
    aten.mul.Tensor: _pointwise("({} * {})", 2), aten.mul.Scalar: _pointwise("({} * {})", 2),
    aten.div.Tensor: _div, aten.div.Scalar: _div,
    aten.neg.default: _pointwise("(-{})"), aten.reciprocal.default: _pointwise("(1.0 / {})"),
    aten.maximum.default: _pointwise("max({}, {})", 2), aten.minimum.default: _pointwise("min({}, {})", 2),
    aten.pow.Tensor_Scalar: _pow, aten.gelu.default: _gelu,
    aten.clamp.default: _clamp, aten.clamp_min.default: _pointwise("max({}, {})", 2),
    aten.clamp_max.default: _pointwise("min({}, {})", 2),
    **{getattr(aten, f).default: _unary(f) for f in ("exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "erf",
                                                       "sigmoid", "abs", "relu", "floor", "ceil", "exp2", "log2")},
    aten.silu.default: _unary("silu"),
    prims.convert_element_type.default: _same, aten._to_copy.default: _same, aten.clone.default: _same,
    aten.alias.default: _same,
    aten.sum.dim_IntList: _reduction("sum"), aten.mean.dim: _reduction("mean"),
    aten.amax.default: _reduction("max"), aten.amin.default: _reduction("min"),
    aten._softmax.default: _softmax(False), aten._log_softmax.default: _softmax(True),
    aten.unsqueeze.default: _unsqueeze, aten.squeeze.dim: _squeeze, aten.squeeze.dims: _squeeze,
    aten.squeeze.default: _squeeze,
    aten.permute.default: _permute, aten.t.default: _permute, aten.transpose.int: _permute,
    aten.expand.default: _expand, aten.view.default: _view, aten._unsafe_view.default: _view,
    aten.reshape.default: _view, aten.slice.Tensor: _slice, aten.cat.default: _cat,
    operator.getitem: _var_mean_item, aten.var.correction: _var,
    aten.where.self: _where, aten.embedding.default: _embedding, aten.index_select.default: _index_select,
    aten.gather.default: _gather,
    **{getattr(aten, name).Tensor: _compare(op) for name, op in _COMPARISONS.items()},
    **{getattr(aten, name).Scalar: _compare(op) for name, op in _COMPARISONS.items()},
    aten.logical_and.default: _compare("and"), aten.logical_or.default: _compare("or"),
    aten.logical_not.default: _compare("not"), aten.logical_xor.default: _compare("xor"),
    aten.bitwise_and.Tensor: _compare("and"), aten.bitwise_or.Tensor: _compare("or"),
    aten.bitwise_not.default: _compare("not"), aten.bitwise_xor.Tensor: _compare("xor"),
}

#: Operators that only move elements (no arithmetic): inlined into the region of the node reading them,
#: never a region of their own, and left in the graph for any other reader.
LAYOUT = frozenset({aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
                    aten.permute.default, aten.t.default, aten.transpose.int, aten.expand.default,
                    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.slice.Tensor,
                    aten.cat.default, aten.alias.default, aten.clone.default, prims.convert_element_type.default,
                    aten._to_copy.default})


def is_layout(node: fx.Node) -> bool:
    """Whether ``node`` is a translatable layout operator (inlined into the region that reads it)."""
    return node.op == "call_function" and node.target in LAYOUT and translatable(node)


def translatable(node: fx.Node) -> bool:
    """Whether ``node`` is an operator with a ``.ak`` definition (its operands may still rule it out)."""
    if node.op != "call_function" or node.target not in TABLE:
        return False
    if node.target is operator.getitem:
        src = _a(node)[0]
        return isinstance(src, fx.Node) and src.target is aten.var_mean.correction
    if node.target is aten._to_copy.default and set(node.kwargs) - {"dtype", "layout", "device"}:
        return False
    return isinstance(meta(node), torch.Tensor)
