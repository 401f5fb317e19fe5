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
* **Reductions** (``sum``, ``mean``, ``amax``, ``amin``, ``_softmax``, ``_log_softmax``) are index
  definitions of their own (``r[i, j] = mean(x[i, j, k] ** 2 for k)``), as std.nn writes them.

Only f32 tensors are translated; anything else is :class:`Untranslatable`, with the reason the
backend reports.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import fx

aten = torch.ops.aten
prims = torch.ops.prims

#: the dtypes a region's parameters may have (anything but f32 only through a conversion to f32; f64, which
#: ``.ak`` does not have, is converted to f32 as it is passed)
AK_DTYPES = {torch.float32: "f32", torch.float64: "f32", torch.bfloat16: "bf16", torch.float16: "f16",
             torch.int64: "i64", torch.int32: "i32"}
#: an element's ``.ak`` text from its index expressions
At = Callable[[Sequence[str]], str]


class Untranslatable(Exception):
    """A node that has no ``.ak`` form here (the message is the reason)."""


@dataclass(frozen=True)
class Value:
    """A tensor inside a region: its shape (``.ak`` dim expressions) and the text of each element."""

    shape: tuple[str, ...]
    at: At


class Context(Protocol):
    """What an operator's definition needs from the region it is translated into."""

    def value(self, arg: Any) -> Value: ...
    def define(self, shape: tuple[str, ...], body: Callable[[Sequence[str]], str]) -> Value: ...
    def fresh(self, prefix: str) -> str: ...


# ---------------------------------------------------------------- sizes and literals


def dim_text(size: Any) -> str:
    """A tensor size as a ``.ak`` dim expression: an integer, or its symbol (``s81`` is ``S81``)."""
    if isinstance(size, torch.SymInt):
        expr = size.node.expr
        if expr.is_Integer:
            return dim_text(int(expr))
        return _sym_text(expr)
    if isinstance(size, int):
        if size < 1:
            raise Untranslatable("an empty axis")
        return str(size)
    raise Untranslatable(f"a size {size!r}")


def _sym_text(expr: Any) -> str:
    if expr.is_Symbol:
        return expr.name.upper()
    if expr.is_Integer and int(expr) >= 1:
        return str(int(expr))
    if expr.is_Add:  # a constant taken away comes last: dim expressions have no unary minus
        plus = [_sym_text(a) for a in expr.args if not (a.is_Integer and int(a) < 0)]
        minus = [str(-int(a)) for a in expr.args if a.is_Integer and int(a) < 0]
        if not plus:
            raise Untranslatable(f"a size `{expr}`")
        return "(" + " + ".join(plus) + "".join(f" - {m}" for m in minus) + ")"
    if expr.is_Mul:
        return "(" + " * ".join(_sym_text(a) for a in expr.args) + ")"
    kind = type(expr).__name__
    if kind in ("FloorDiv", "PythonMod", "Mod") and len(expr.args) == 2:  # torch's symbolic sizes (a view's -1)
        a, b = (_sym_text(x) for x in expr.args)
        return f"({a} {'/' if kind == 'FloorDiv' else '%'} {b})"
    raise Untranslatable(f"a size `{expr}`")


def literal(v: Any) -> str:
    """A Python number as an f32 ``.ak`` literal."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise Untranslatable(f"a scalar {v!r}")
    f = float(v)
    if math.isnan(f):
        raise Untranslatable("a NaN constant")
    if math.isinf(f):
        return "inf" if f > 0 else "(-inf)"
    text = repr(f)
    return text if f >= 0 else f"({text})"


def meta(node: Any) -> Any:
    """A node's example value (ATen graphs: ``val``; Dynamo's: ``example_value``)."""
    if not isinstance(node, fx.Node):
        return node
    return node.meta.get("val", node.meta.get("example_value"))


def f32_meta(node: Any) -> torch.Tensor:
    t = meta(node)
    if not isinstance(t, torch.Tensor):
        raise Untranslatable(f"`{getattr(node, 'name', node)}` is not a tensor")
    if t.dtype != torch.float32:
        raise Untranslatable(f"`{node.name}` is {str(t.dtype).removeprefix('torch.')} (regions take f32)")
    if t.device.type != "cpu":
        raise Untranslatable(f"`{node.name}` is on {t.device.type}")
    return t


def shape_of(node: fx.Node) -> tuple[str, ...]:
    return tuple(dim_text(s) for s in f32_meta(node).shape)


def _a(node: fx.Node) -> Any:
    """A node's positional arguments, untyped (FX's argument type is a union of everything)."""
    return node.args


def _arg(node: fx.Node, i: int, name: str, default: Any = None) -> Any:
    return _a(node)[i] if len(_a(node)) > i else node.kwargs.get(name, default)


def _norm_dim(d: int, rank: int) -> int:
    if not -max(rank, 1) <= d < max(rank, 1):
        raise Untranslatable(f"dim {d} of a rank-{rank} tensor")
    return d % max(rank, 1)


# ---------------------------------------------------------------- elementwise


def _operands(cx: Context, node: fx.Node, args: Sequence[Any]) -> list[At]:
    """Each operand's element at the output's indices (broadcast as torch does; numbers as literals)."""
    out = shape_of(node)
    ats: list[At] = []
    for a in args:
        if not isinstance(a, fx.Node):
            ats.append(_constant(literal(a)))
            continue
        f32_meta(a)
        v = cx.value(a)
        off = len(out) - len(v.shape)
        if off < 0:
            raise Untranslatable(f"`{a.name}` has more axes than `{node.name}`")

        def at(idx: Sequence[str], v: Value = v, off: int = off) -> str:
            return v.at([("0" if d == "1" and out[off + k] != "1" else idx[off + k]) for k, d in enumerate(v.shape)])

        ats.append(at)
    return ats


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


# ---------------------------------------------------------------- layout


def _unsqueeze(cx: Context, node: fx.Node) -> Value:
    v = cx.value(_a(node)[0])
    d = _norm_dim(_a(node)[1], len(v.shape) + 1)
    return Value(shape_of(node), lambda idx: v.at([*idx[:d], *idx[d + 1:]]))


def _squeeze(cx: Context, node: fx.Node) -> Value:
    v = cx.value(_a(node)[0])
    rank = len(v.shape)
    dims = _a(node)[1] if len(_a(node)) > 1 else list(range(rank))
    dims = [dims] if isinstance(dims, int) else list(dims)
    gone = {_norm_dim(d, rank) for d in dims if v.shape[_norm_dim(d, rank)] == "1"}

    def at(idx: Sequence[str]) -> str:
        it = iter(idx)
        return v.at(["0" if k in gone else next(it) for k in range(rank)])

    return Value(shape_of(node), at)


def _permute(cx: Context, node: fx.Node) -> Value:
    v = cx.value(_a(node)[0])
    rank = len(v.shape)
    if node.target in (aten.t.default,):
        perm = [1, 0] if rank == 2 else [0]
    elif node.target == aten.transpose.int:
        a, b = _norm_dim(_a(node)[1], rank), _norm_dim(_a(node)[2], rank)
        perm = list(range(rank))
        perm[a], perm[b] = perm[b], perm[a]
    else:
        perm = [_norm_dim(d, rank) for d in _a(node)[1]]

    def at(idx: Sequence[str]) -> str:
        src = [""] * rank
        for k, p in enumerate(perm):
            src[p] = idx[k]
        return v.at(src)

    return Value(shape_of(node), at)


def _expand(cx: Context, node: fx.Node) -> Value:
    v = cx.value(_a(node)[0])
    out = shape_of(node)
    off = len(out) - len(v.shape)
    return Value(out, lambda idx: v.at([("0" if d == "1" and out[off + k] != "1" else idx[off + k])
                                        for k, d in enumerate(v.shape)]))


def _product(dims: Sequence[str]) -> str:
    return " * ".join(dims) if dims else "1"


def _view(cx: Context, node: fx.Node) -> Value:
    """A view: axes of size 1 dropped on both sides, the others grouped where the products of the two
    shapes agree; within a group the output's indices make one offset, which the input's axes split
    with ``//`` and ``%``."""
    src = _a(node)[0]
    v = cx.value(src)
    ins, outs = [_sym(s) for s in f32_meta(src).shape], [_sym(s) for s in f32_meta(node).shape]
    a = [k for k, s in enumerate(ins) if s != 1]
    b = [k for k, s in enumerate(outs) if s != 1]
    groups: list[tuple[list[int], list[int]]] = []
    i = o = 0
    while i < len(a) and o < len(b):
        gi, go = [a[i]], [b[o]]
        i, o = i + 1, o + 1
        while True:
            num, den = _ratio(_prod(outs, go), _prod(ins, gi))
            if num == 1 and den == 1:
                break
            if den == 1 and i < len(a):  # the input's axes so far divide the output's: take another input axis
                gi.append(a[i])
                i += 1
            elif num == 1 and o < len(b):
                go.append(b[o])
                o += 1
            else:
                raise Untranslatable(f"a view from {tuple(ins)} to {tuple(outs)} whose axes do not group")
        groups.append((gi, go))
    if i < len(a) or o < len(b):
        raise Untranslatable(f"a view from {tuple(ins)} to {tuple(outs)} whose axes do not group")
    in_dims = [dim_text(s) for s in f32_meta(src).shape]
    out_dims = shape_of(node)

    def at(idx: Sequence[str]) -> str:
        src_idx = ["0"] * len(ins)
        for gi, go in groups:
            if len(gi) == 1 and len(go) == 1:
                src_idx[gi[0]] = idx[go[0]]
                continue
            terms = [idx[k] if k == go[-1] else f"{idx[k]} * ({_product([out_dims[q] for q in go if q > k])})"
                     for k in go]
            flat = "(" + " + ".join(terms) + ")"
            for n, k in enumerate(gi):
                inner = _product([in_dims[q] for q in gi if q > k])
                part = flat if k == gi[-1] else f"({flat} // ({inner}))"
                src_idx[k] = part if n == 0 else f"({part} % ({in_dims[k]}))"
        return v.at(src_idx)

    return Value(out_dims, at)


def _sym(size: Any) -> Any:
    import sympy

    return size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(int(size))


def _prod(sizes: Sequence[Any], axes: Sequence[int]) -> Any:
    out: Any = 1
    for k in axes:
        out = out * sizes[k]
    return out


def _ratio(p: Any, q: Any) -> tuple[Any, Any]:
    """``p / q`` as (numerator, denominator), cancelled."""
    import sympy

    return sympy.fraction(sympy.cancel(sympy.sympify(p) / sympy.sympify(q)))


def _slice(cx: Context, node: fx.Node) -> Value:
    src = _a(node)[0]
    v = cx.value(src)
    t = f32_meta(src)
    d = _norm_dim(_arg(node, 1, "dim", 0), t.dim())
    start, end, step = _arg(node, 2, "start", None), _arg(node, 3, "end", None), _arg(node, 4, "step", 1)
    size = t.shape[d]
    start = 0 if start is None else start
    if not isinstance(start, int) or not isinstance(step, int) or step < 1:
        raise Untranslatable("a slice with a symbolic start or step")
    if start < 0:
        if not isinstance(size, int):
            raise Untranslatable("a slice from the end of a symbolic axis")
        start = max(0, start + size)
    del end  # the output's own size says where it stops

    def at(idx: Sequence[str]) -> str:
        j = list(idx)
        pos = idx[d] if step == 1 else f"{idx[d]} * {step}"
        j[d] = f"({pos} + {start})" if start else pos
        return v.at(j)

    return Value(shape_of(node), at)


def _cat(cx: Context, node: fx.Node) -> Value:
    pieces = [p for p in _a(node)[0] if f32_meta(p).numel() != 0]
    if not pieces:
        raise Untranslatable("a concatenation of empty tensors")
    rank = f32_meta(pieces[0]).dim()
    d = _norm_dim(_arg(node, 1, "dim", 0), rank)
    values = [cx.value(p) for p in pieces]
    sizes = [v.shape[d] for v in values]
    offsets = [" + ".join(sizes[:k]) or "0" for k in range(len(sizes))]

    def at(idx: Sequence[str]) -> str:
        text = ""
        for k in reversed(range(len(values))):
            j = list(idx)
            shifted = idx[d] if k == 0 else f"({idx[d]} - ({offsets[k]}))"
            j[d] = f"({shifted} % ({sizes[k]}))"  # in range in both branches (both are evaluated)
            here = values[k].at(j)
            text = here if not text else f"({here} if {idx[d]} < ({offsets[k + 1]}) else {text})"
        return text

    return Value(shape_of(node), at)


# ---------------------------------------------------------------- reductions


def _reduced(cx: Context, node: fx.Node, src: fx.Node, dims: Sequence[int] | None, keep: bool, op: str) -> Value:
    v = cx.value(src)
    rank = len(v.shape)
    red = sorted({_norm_dim(d, rank) for d in dims}) if dims else list(range(rank))
    v = _direct(cx, v, red)
    kept = [k for k in range(rank) if k not in red]
    shape = tuple(v.shape[k] for k in kept)
    names = {k: cx.fresh("j") for k in red}

    def body(idx: Sequence[str]) -> str:
        it = iter(idx)
        at = v.at([names[k] if k in red else next(it) for k in range(rank)])
        return f"{op}({at} for {', '.join(names.values())})"

    stored = cx.define(shape, body) if shape else cx.define(("1",), lambda idx: body([]))

    def at(idx: Sequence[str]) -> str:
        if not shape:
            return stored.at(["0"])
        return stored.at([i for k, i in enumerate(idx) if k not in red] if keep else list(idx))

    return Value(shape_of(node), at)


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
        dims = _arg(node, 1, "dim", None)
        dims = [dims] if isinstance(dims, int) else dims
        return _reduced(cx, node, _a(node)[0], dims, bool(_arg(node, 2, "keepdim", False)), op)

    return build


def _softmax(log: bool) -> Callable[[Context, fx.Node], Value]:
    def build(cx: Context, node: fx.Node) -> Value:
        if _arg(node, 2, "half_to_float", False):
            raise Untranslatable("a half-to-float softmax")
        src = _a(node)[0]
        v = cx.value(src)
        rank = len(v.shape)
        d = _norm_dim(_a(node)[1], rank)
        v = _direct(cx, v, [d])
        top = _keep_reduce(cx, v, d, "max")
        shifted = Value(v.shape, lambda idx: f"({v.at(idx)} - {top.at(idx)})")
        total = _keep_reduce(cx, Value(v.shape, lambda idx: f"exp({shifted.at(idx)})"), d, "sum")
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
    dims = [dims] if isinstance(dims, int) else dims
    keep = bool(vm.kwargs.get("keepdim", False))
    if item == 1:
        return _reduced(cx, node, src, dims, keep, "mean")
    return _variance(cx, node, src, dims, vm.kwargs.get("correction", 1), keep)


def _var(cx: Context, node: fx.Node) -> Value:
    """``var(x, dims, correction=c, keepdim=k)``."""
    dims = _arg(node, 1, "dim", None)
    dims = [dims] if isinstance(dims, int) else dims
    return _variance(cx, node, _a(node)[0], dims, node.kwargs.get("correction", 1),
                     bool(node.kwargs.get("keepdim", False)))


def _variance(cx: Context, node: fx.Node, src: Any, dims: Any, correction: Any, keep: bool) -> Value:
    v = cx.value(src)
    rank = len(v.shape)
    red = sorted({_norm_dim(d, rank) for d in dims}) if dims else list(range(rank))
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
    """The reduction of ``v`` over the axes ``red``, read back at ``v``'s indices (those axes dropped)."""
    rank = len(v.shape)
    names = {k: cx.fresh("j") for k in red}
    shape = tuple(s for k, s in enumerate(v.shape) if k not in red)

    def body(idx: Sequence[str]) -> str:
        it = iter(idx)
        full = [names[k] if k in red else next(it) for k in range(rank)]
        return f"{op}({v.at(full)} for {', '.join(names.values())})"

    stored = cx.define(shape, body) if shape else cx.define(("1",), lambda idx: body([]))
    return Value(v.shape, lambda idx: stored.at([i for k, i in enumerate(idx) if k not in red] if shape else ["0"]))


def _keep_reduce(cx: Context, v: Value, d: int, op: str) -> Value:
    """The reduction of ``v`` over axis ``d``, read back at ``v``'s indices (the axis dropped)."""
    rank = len(v.shape)
    j = cx.fresh("j")
    shape = tuple(s for k, s in enumerate(v.shape) if k != d)

    def body(idx: Sequence[str]) -> str:
        full = [*idx[:d], j, *idx[d:]]
        return f"{op}({v.at(full)} for {j})"

    stored = cx.define(shape, body) if shape else cx.define(("1",), lambda idx: body([]))
    return Value(v.shape, lambda idx: stored.at([i for k, i in enumerate(idx) if k != d] if rank > 1 else ["0"]))


# ---------------------------------------------------------------- the table


def _unary(fn: str) -> Callable[[Context, fx.Node], Value]:
    return _pointwise(fn + "({})")


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
}

#: Operators that only move elements (no arithmetic): inlined into the region of the node reading them,
#: never a region of their own, and left in the graph for any other reader.
LAYOUT = frozenset({aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
                    aten.permute.default, aten.t.default, aten.transpose.int, aten.expand.default,
                    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.slice.Tensor,
                    aten.cat.default, aten.alias.default, aten.clone.default, prims.convert_element_type.default,
                    aten._to_copy.default})


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
