"""The reference interpreter's elementwise operations: tables of torch functions, and the few the language
defines where torch's own (vectorised from 16 elements on) would change an answer with a tensor's length."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from arke.ir.dtypes import DType
from arke.runtime.guards import TORCH_DTYPES


def gelu(x: torch.Tensor) -> torch.Tensor:
    """The exact erf form; ``x`` itself past 40, where erf(x / √2) is 1 in every float dtype (torch's
    vectorised gelu, used from 16 elements on, makes ``+inf`` NaN and overflows near the dtype's maximum)."""
    return torch.where(x > 40, x, F.gelu(x))


UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "neg": torch.neg, "not": torch.logical_not, "abs": torch.abs, "exp": torch.exp, "log": torch.log,
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "tanh": torch.tanh, "erf": torch.erf, "sigmoid": torch.sigmoid,
    "silu": F.silu, "gelu": gelu, "relu": torch.relu, "sin": torch.sin, "cos": torch.cos,
    "floor": torch.floor, "ceil": torch.ceil, "exp2": torch.exp2, "log2": torch.log2,
}


def float_to_i64(x: torch.Tensor) -> torch.Tensor:
    """Truncated toward zero into i64, saturating at its range, NaN as 0 (language.md §8.4; narrower integer
    types then wrap). torch's own conversion is the CPU's, which gives i64's minimum for all of those."""
    x = torch.trunc(x.to(torch.float64))
    top, low = x >= 2.0 ** 63, x < -(2.0 ** 63)
    out = torch.where(top | low | x.isnan(), 0.0, x).to(torch.int64)
    return torch.where(top, 2 ** 63 - 1, torch.where(low, -(2 ** 63), out))


def float_mod(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Python's float ``%``: C's ``fmod`` (exact), moved by ``b`` where the signs differ, a zero with ``b``'s
    sign. Not ``torch.remainder``: its vectorised form (16 elements and more) is NaN where ``a / b``
    overflows, where the remainder itself is exact."""
    dtype = a.dtype
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    x = a.to(wide).contiguous().numpy()
    y = b.to(wide).contiguous().numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.fmod(x, y)
        r = np.where((r != 0) & ((r < 0) != (y < 0)), r + y, r)
        r = np.where(r == 0, np.copysign(np.zeros_like(r), y), r)
    return torch.from_numpy(np.array(r, dtype=x.dtype)).to(dtype)  # (ascontiguousarray makes a 0-d result 1-d)


COMPARE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
}
PLAIN: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "max": torch.maximum, "min": torch.minimum,
    "and": torch.logical_and, "or": torch.logical_or,
}


def compute(dt: DType) -> torch.dtype:
    """The torch dtype a value of type ``dt`` is held in while an op's body runs (unsigned: int64)."""
    return torch.int64 if dt.is_unsigned else TORCH_DTYPES[dt.compute]


def wrap(x: torch.Tensor, dt: DType) -> torch.Tensor:
    """An unsigned result (held in int64) reduced to its type's width; other types wrap by themselves."""
    return torch.bitwise_and(x, (1 << dt.bits) - 1) if dt.is_unsigned else x


BITWISE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "bitand": torch.bitwise_and, "bitor": torch.bitwise_or, "bitxor": torch.bitwise_xor,
    "shl": torch.bitwise_left_shift, "shr": torch.bitwise_right_shift,
}
