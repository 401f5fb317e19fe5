"""Kernels and inputs of the arg-reduction tests (``argmax``/``argmin``, spec/language.md §8.3),
shared by the interpreter's tests against torch and the targets' tests against the interpreter.

Inputs come in kinds chosen to hit every rule of the semantics: random rows; tie-heavy rows
(integer-valued floats from a small range, so most rows tie at the top); rows whose elements
are all equal; rows with NaNs (first, last, several, all NaN); rows with ``±inf`` (all ``-inf``,
all ``+inf``); rows of ``-0.0`` and ``+0.0`` only (equal: the first wins). Integer dtypes take
the random, tie, equal and extreme (the type's smallest and largest values) kinds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from codegen_support import as_dtype

from arke.ir.dtypes import DType

#: The input dtypes: every float storage type and two integer widths.
DTYPES = ("f32", "bf16", "f16", "i32", "i64")
FLOAT_KINDS = ("random", "ties", "equal", "nan", "inf", "zeros")
INT_KINDS = ("random", "ties", "equal", "extreme")

#: Along the last axis (rows), along the first (columns), and both kinds of reduction.
ROWS = """
kernel amax_{t}(x: {t}[M, N]) -> i64[M] {{
  return argmax(x[m, n] for n)
}}

kernel amin_{t}(x: {t}[M, N]) -> i64[M] {{
  return argmin(x[m, n] for n)
}}

kernel cmax_{t}(x: {t}[M, N]) -> i64[N] {{
  return argmax(x[m, n] for m)
}}

kernel cmin_{t}(x: {t}[M, N]) -> i64[N] {{
  return argmin(x[m, n] for m)
}}
"""

#: Arg-reductions inside larger expressions: a gather of the value, a count, a computed body, a
#: boolean body, the value and the position side by side, and an axis that may be empty.
COMPOSED = """
kernel greedy_step(logits: f32[B, V], label: i64[B]) -> (ids: i64[B], best: f32[B], hits: i64) {
  ids[b] = argmax(logits[b, v] for v)
  best[b] = logits[b, ids[b]]
  hits = sum(argmax(logits[b, v] for v) == label[b] for b)
}

kernel nearest(x: f16[M, N], t: f16[M]) -> (near: i64[M], first: i64[M]) {
  near[m] = argmin(abs(x[m, n] - t[m]) for n)
  first[m] = argmax(x[m, n] > 0.0 for n)
}

kernel value_and_position(x: bf16[M, N]) -> (v: bf16[M], i: i64[M], j: i64[M]) {
  v[m] = max(x[m, n] for n)
  i[m] = argmax(x[m, n] for n)
  j[m] = argmin(x[m, n] * 2.0 for n) + 1
}

kernel tail(x: f32[M, N], y: f32[M, N - 1]) -> (i: i64[M], j: i64[M]) {
  i[m] = argmax(y[m, k] for k)
  j[m] = argmin(x[m, n] for n)
}
"""


def rows_source(dtype: str) -> str:
    return ROWS.format(t=dtype)


def kinds(dtype: str) -> tuple[str, ...]:
    return FLOAT_KINDS if dtype.startswith(("f", "bf")) else INT_KINDS


def values(kind: str, dtype: str, shape: tuple[int, int], rng: np.random.Generator) -> Any:
    """A tensor of ``dtype`` and ``shape`` of the given kind (see the module doc): NumPy, or torch for bf16."""
    dt = DType(dtype)
    m, n = shape
    if dt.is_int:
        info = np.iinfo(np.int32 if dt is DType.I32 else np.int64)
        w: np.ndarray
        if kind == "random":
            w = rng.integers(-1000, 1000, shape)
        elif kind == "ties":
            w = rng.integers(-2, 3, shape)
        elif kind == "equal":
            w = np.repeat(rng.integers(-5, 5, (m, 1)), n, axis=1)
        else:
            w = rng.choice(np.array([info.min, info.max, 0, info.min + 1, info.max - 1]), shape)
        return w.astype(np.int32 if dt is DType.I32 else np.int64)
    v: np.ndarray
    if kind == "random":
        v = rng.standard_normal(shape)
    elif kind == "ties":
        v = rng.integers(-3, 4, shape).astype(np.float64)
    elif kind == "equal":
        v = np.repeat(rng.standard_normal((m, 1)), n, axis=1)
    elif kind == "zeros":
        v = np.where(rng.random(shape) < 0.5, -0.0, 0.0) - (rng.random(shape) < 0.2) * 1.0
    else:
        v = rng.standard_normal(shape)
        special = np.nan if kind == "nan" else np.inf
        v[rng.random(shape) < 0.05] = special
        if kind == "inf":
            v[rng.random(shape) < 0.05] = -np.inf
        for row, cols in ((0, [0]), (1, [n - 1]), (2, [n // 3, n // 2, n - 1])):
            if row < m:
                v[row] = rng.standard_normal(n)
                v[row, cols] = special
        if m > 3:
            v[3] = special if kind == "nan" else -np.inf  # all NaN, or all -inf
        if m > 4 and kind == "inf":
            v[4] = np.inf
    return as_dtype(v, dt)


def torch_of(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x))
