"""What the ATen-to-``.ak`` translation works with: values as index expressions (:class:`Value`), the
region they are translated into (:class:`Context`), sizes as ``.ak`` dims and numbers as literals.

See :mod:`arke.torch.aten_ak` for the operators themselves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import fx

aten = torch.ops.aten
prims = torch.ops.prims

#: an element's ``.ak`` text from its index expressions
At = Callable[[Sequence[str]], str]

AK_DTYPES = {torch.float32: "f32", torch.float64: "f32", torch.bfloat16: "bf16", torch.float16: "f16",
             torch.int64: "i64", torch.int32: "i32", torch.bool: "bool"}


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
    def define(self, shape: tuple[str, ...], body: Callable[[Sequence[str]], str], dtype: str = "f32") -> Value: ...
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


def value_dtype(node: fx.Node) -> str:
    """The ``.ak`` dtype of a value a region computes: f32, or bool (a comparison's)."""
    t = meta(node)
    return "bool" if isinstance(t, torch.Tensor) and t.dtype == torch.bool else "f32"


def mask_shape_of(node: fx.Node) -> tuple[str, ...]:
    """The shape of a node whose value is a bool tensor (a comparison)."""
    t = meta(node)
    if not isinstance(t, torch.Tensor) or t.dtype != torch.bool or t.device.type != "cpu":
        raise Untranslatable(f"`{node.name}` is not a CPU bool tensor")
    return tuple(dim_text(s) for s in t.shape)


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


def _sym(size: Any) -> Any:
    import sympy

    return size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(int(size))
