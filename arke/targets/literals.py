"""Numeric literals several renderers share: a float constant written exactly, as its f32 bits.

:func:`float_literal` is the MLIR renderer's float constant and the base of the CUDA-C one
(:func:`arke.targets.cuda.expr.c_float`): the hex bits of the f32 a constant of a dtype holds
(a 16-bit float's constant rounded to that dtype first, as the interpreter rounds it).
"""

from __future__ import annotations

import math
import struct

import torch

from arke.ir.dtypes import DType

_TORCH_HALF = {DType.F16: "float16", DType.BF16: "bfloat16"}


def float_literal(value: float, dtype: DType = DType.F32) -> str:
    """An exact ``f32`` literal (hex bits) of ``value`` as a constant of ``dtype`` holds it (16-bit: rounded)."""
    if dtype in _TORCH_HALF:
        value = float(torch.tensor(value, dtype=torch.float32).to(getattr(torch, _TORCH_HALF[dtype])).float())
    bits = struct.unpack("<I", struct.pack("<f", value))[0] if math.isfinite(value) or math.isinf(value) \
        else 0x7FC00000
    return f"0x{bits:08X}"
