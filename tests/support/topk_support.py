"""Kernels and references of the top-k tests (``topk argtopk bottomk argbottomk``, spec/language.md
§8.3), shared by the interpreter's tests against torch and the targets' tests against the interpreter.

Inputs are the arg-reduction tests' kinds (``argreduce_support.values``: random rows, ties, equal
rows, NaNs, infinities, signed zeros, integer extremes). The kernels cover a literal ``K`` (rounds),
a ``K`` given by another parameter's axis (ranks), ``K = 1``, ``K = N``, a selection along the first
axis, and selections inside larger expressions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

#: Per dtype ``{t}``: the four largest and smallest (values and positions).
ROWS = """
kernel top4_{t}(x: {t}[M, N]) -> (v: {t}[M, 4], i: i64[M, 4]) {{
  v[m, j] = topk(x[m, n] for n, j)
  i[m, j] = argtopk(x[m, n] for n, j)
}}

kernel bot4_{t}(x: {t}[M, N]) -> (v: {t}[M, 4], i: i64[M, 4]) {{
  v[m, j] = bottomk(x[m, n] for n, j)
  i[m, j] = argbottomk(x[m, n] for n, j)
}}

"""

#: The other forms, on f32 and i32 only (each kernel is one more for a target to compile).
MORE = """
kernel topk_{t}(x: {t}[M, N], slots: i64[K]) -> (v: {t}[M, K], i: i64[M, K]) {{
  v[m, j] = topk(x[m, n] for n, j)
  i[m, j] = argtopk(x[m, n] for n, j)
}}

kernel bottomk_{t}(x: {t}[M, N], slots: i64[K]) -> i: i64[M, K] {{
  i[m, j] = argbottomk(x[m, n] for n, j)
}}

kernel top1_{t}(x: {t}[M, N]) -> i: i64[M, 1] {{
  i[m, j] = argtopk(x[m, n] for n, j)
}}

kernel ctop2_{t}(x: {t}[M, N]) -> i: i64[2, N] {{
  i[j, n] = argtopk(x[m, n] for m, j)
}}
"""

#: Selections inside larger expressions: MoE routing (softmax over the two best), a value in
#: arithmetic, a gather of the positions, a computed body, K = N (a sort) and a selection along a
#: tensor's only axis.
#: Top-k sampling's candidates: K = 50 rounds in one kernel (kept out of std.nn: on the GPU targets
#: the 50 rounds' state spills, so it is no stdlib kernel until top-k has a native lowering).
TOPK50 = """
# Top-k sampling's candidates: each row's 50 largest logits, from the largest down, and their
# token ids (torch.topk(logits, 50); equal logits by lower id, a NaN first). Rows need V >= 50.
kernel topk50(logits: f32[M, V]) -> (v: f32[M, 50], ids: i64[M, 50]) {
  v[m, j] = topk(logits[m, n] for n, j)
  ids[m, j] = argtopk(logits[m, n] for n, j)
}
"""

COMPOSED = """
kernel route_top2(logits: f32[T, E]) -> (v: f32[T, 2], w: f32[T, 2], expert: i64[T, 2]) {
  v[t, j] = topk(logits[t, e] for e, j)
  expert[t, j] = argtopk(logits[t, e] for e, j)
  w[t, j] = exp(v[t, j] - v[t, 0]) / sum(exp(v[t, r] - v[t, 0]) for r)
}

kernel shifted(x: f32[M, N]) -> y: f32[M, 4] {
  y[m, j] = exp(topk(x[m, n] for n, j) - max(x[m, f] for f))
}

kernel picked(x: f32[M, N], table: f32[N, D]) -> y: f32[M, 3, D] {
  y[m, j, d] = table[argtopk(x[m, n] * x[m, n] for n, j), d]
}

kernel sort5(x: bf16[M, 5]) -> (v: bf16[M, 5], i: i64[M, 5]) {
  v[m, j] = bottomk(x[m, n] for n, j)
  i[m, j] = argbottomk(x[m, n] for n, j)
}

kernel vec3(x: f16[N]) -> i: i64[3] {
  i[j] = argtopk(abs(x[n]) for n, j)
}
"""


#: The dtypes that get :data:`MORE`.
MORE_DTYPES = ("f32", "i32")


def rows_source(dtype: str, more: bool | None = None) -> str:
    """The kernels for ``dtype``; :data:`MORE` too with ``more`` (by default, on :data:`MORE_DTYPES`)."""
    return ROWS.format(t=dtype) + (MORE.format(t=dtype) if (dtype in MORE_DTYPES if more is None else more) else "")


def torch_of(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x))


def stable_topk(x: torch.Tensor, k: int, largest: bool, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """The specified order from torch: a stable sort (descending for the largest), the first ``k``."""
    values, positions = torch.sort(x, dim=dim, descending=largest, stable=True)
    return values.narrow(dim, 0, k), positions.narrow(dim, 0, k)
