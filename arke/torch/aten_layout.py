"""The ATen layout operators as ``.ak`` index maps: views, permutes, ``expand``, ``slice``, ``cat``,
``unsqueeze`` and ``squeeze`` move no data of their own; each maps an element's indices to its operand's.
The gathers (``embedding``, ``index_select``, ``gather``) are index maps too, with indices read from a
tensor (a gather in ``.ak``: ``table[ids[t], d]``).
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
    _sym,
    aten,
    dim_text,
    f32_meta,
    meta,
    shape_of,
)


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
    shape = shape_of(node)
    whole = step == 1 and start == 0 and shape[d] == v.shape[d]

    def at(idx: Sequence[str]) -> str:
        j = list(idx)
        pos = idx[d] if step == 1 else f"{idx[d]} * {step}"
        # a bare index would say the axes have one extent (AK3003): part of an axis is read at `i + start`
        j[d] = pos if whole else f"({pos} + {start})"
        return v.at(j)

    return Value(shape, at)


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


# ---------------------------------------------------------------- gathers (indices read from a tensor)


def _indices(cx: Context, node: Any) -> Value:
    t = meta(node)
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int64, torch.int32):
        raise Untranslatable(f"indices `{getattr(node, 'name', node)}` that are not an integer tensor")
    return cx.value(node)


def _embedding(cx: Context, node: fx.Node) -> Value:
    """``embedding(table, ids)``: ``table[ids[i..], d]`` (a row read per index; out of range is the kernel's
    error, as torch's)."""
    table, ids = cx.value(_a(node)[0]), _indices(cx, _a(node)[1])
    f32_meta(_a(node)[0])
    return Value(shape_of(node), lambda idx: table.at([ids.at(idx[:-1]), idx[-1]]))


def _index_select(cx: Context, node: fx.Node) -> Value:
    """``index_select(x, d, index)``: axis ``d`` read at ``index[i_d]``."""
    return _take(cx, node, lambda index, idx, d: index.at([idx[d]]) if index.shape else index.at(["0"]))


def _gather(cx: Context, node: fx.Node) -> Value:
    """``gather(x, d, index)``: axis ``d`` read at ``index[i..]`` (the index has the output's shape)."""
    if _arg(node, 3, "sparse_grad", False):
        raise Untranslatable("a sparse gather")
    src, index = (tuple(dim_text(s) for s in meta(_a(node)[k]).shape) for k in (0, 2))  # (not translated twice)
    d = _norm_dim(_a(node)[1], len(src))
    for a, (have, want) in enumerate(zip(src, index, strict=False)):
        if a != d and have != want:  # torch reads the input's first rows there: a slice the region does not make
            raise Untranslatable(f"a gather whose index is {want} long on axis {a}, where the input is {have}")
    return _take(cx, node, lambda index, idx, d: index.at(idx))


def _take(cx: Context, node: fx.Node, where: Callable[[Value, Sequence[str], int], str]) -> Value:
    """``op(x, d, index, ...)``: ``x`` with axis ``d`` read where ``where`` says (from the index tensor)."""
    src = cx.value(_a(node)[0])
    f32_meta(_a(node)[0])
    d = _norm_dim(_a(node)[1], len(src.shape))
    index = _indices(cx, _a(node)[2])

    def at(idx: Sequence[str]) -> str:
        j = list(idx)
        j[d] = where(index, idx, d)
        return src.at(j)

    return Value(shape_of(node), at)
