"""The torch and NumPy dtypes of the language's dtypes, and back: shared by the call checks and the bundle
runtime (which imports neither SymPy nor the compiler, spec/bundles.md §5)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from arke.ir.dtypes import DTYPES, DType

#: The torch dtype that stores each DType.
TORCH_DTYPES: dict[DType, torch.dtype] = {
    DType.BOOL: torch.bool, DType.I8: torch.int8, DType.I32: torch.int32, DType.I64: torch.int64,
    DType.U8: torch.uint8, DType.U16: torch.uint16, DType.U32: torch.uint32,
    DType.F16: torch.float16, DType.BF16: torch.bfloat16, DType.F32: torch.float32,
}
#: The NumPy dtype of each DType (NumPy has no bf16).
NUMPY_DTYPES: dict[DType, np.dtype[Any]] = {
    DType.BOOL: np.dtype(np.bool_), DType.I8: np.dtype(np.int8), DType.I32: np.dtype(np.int32),
    DType.I64: np.dtype(np.int64), DType.U8: np.dtype(np.uint8), DType.U16: np.dtype(np.uint16),
    DType.U32: np.dtype(np.uint32), DType.F16: np.dtype(np.float16), DType.F32: np.dtype(np.float32),
}
_FROM_TORCH = {v: k for k, v in TORCH_DTYPES.items()}
_FROM_NUMPY = {v: k for k, v in NUMPY_DTYPES.items()}


def dtype_of(value: Any) -> DType | None:
    """The DType of a torch/NumPy dtype, tensor or array (``None`` when the language has none)."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str) and value in DTYPES:
        return DTYPES[value]
    if isinstance(value, torch.Tensor):
        value = value.dtype
    if isinstance(value, torch.dtype):
        return _FROM_TORCH.get(value)
    if isinstance(value, np.ndarray | np.generic):
        value = value.dtype
    try:
        return _FROM_NUMPY.get(np.dtype(value))
    except TypeError:
        return None
