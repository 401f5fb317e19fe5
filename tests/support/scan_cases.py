"""Scan kernels (spec/language.md §8.9) that the per-target scan tests share: every form sampled over
the dtypes, inclusive and exclusive, along the first and the last axis, with inputs for each.

``CASES`` names each kernel with the dims it runs at; :func:`inputs` makes reproducible inputs
(values near 1 for products, small integers where sums or products must stay meaningful, NaNs in
the max/min rows so their propagation is exercised).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from codegen_support import as_dtype, seeded, text_module

import arke
from arke.ir.dtypes import DType

SOURCE = """
kernel floats(x: f32[M, N], w: f32[M, N], p: bf16[M, N], g: f16[M, N], a: f32[M, N])
    -> (s: f32[M, N], s_rows: f32[M, N], pb: bf16[M, N], mx: f16[M, N], mn: f32[M, N], e: f32[M, N],
        r_rows: f32[M, N]) {
  s[m, n] = cumsum(x[m, n] for n)
  s_rows[m, n] = cumsum(x[m, n] for m, exclusive = true)
  pb[m, n] = cumprod(p[m, n] for n)
  mx[m, n] = cummax(g[m, n] for n, exclusive = true)
  mn[m, n] = cummin(w[m, n] for n)
  e[m, n] = scan(0.75 * h + 0.25 * x[m, n] for n, h = x[m, 0])
  r_rows[m, n] = scan(a[m, n] * h - x[m, n] for m, h = x[0, n])
}
kernel ints(k: i32[M, N], q: i64[M, N], u: u8[M, N], c: i8[M, N], p: bool[M, N], z: bool[M, N])
    -> (si: i32[M, N], pq: i64[M, N], mu: u8[M, N], mc: i8[M, N], cnt: i64[M, N], seen: bool[M, N]) {
  si[m, n] = cumsum(k[m, n] for n, exclusive = true)
  pq[m, n] = cumprod(q[m, n] for n)
  mu[m, n] = cummax(u[m, n] for n)
  mc[m, n] = cummin(c[m, n] for n, exclusive = true)
  cnt[m, n] = cumsum(p[m, n] for n)
  seen[m, n] = cummax(z[m, n] for n)
}
kernel recur(a: bf16[M, N], b: bf16[M, N], h0: f32[M], ai: i64[M, N], bi: i64[M, N], h0i: i64[M],
             aj: i32[M, N], bj: i32[M, N]) -> (rb: bf16[M, N], ri: i64[M, N], rj: i32[M, N]) {
  rb[m, n] = scan(a[m, n] * h + b[m, n] for n, h = h0[m], exclusive = true)
  ri[m, n] = scan(ai[m, n] * h + bi[m, n] for n, h = h0i[m], exclusive = true)
  rj[m, n] = scan(aj[m, n] * h + bj[m, n] for n, h = 7)
}
kernel sum_1d(x: f32[N]) -> y: f32[N] { y[n] = cumsum(x[n] * 2.0 for n) }
kernel selective_scan(x: f32[B, D, T], dt: f32[B, D, T], A: f32[D, S], Bm: f32[B, S, T],
                      C: f32[B, S, T]) -> y: f32[B, D, T] {
  h[b, d, s, t] = scan(exp(dt[b, d, t] * A[d, s]) * h + dt[b, d, t] * Bm[b, s, t] * x[b, d, t] for t, h = 0.0)
  y[b, d, t] = sum(C[b, s, t] * h[b, d, s, t] for s)
}
"""

#: the row kernels' shapes: one element, a short row, and ragged (a long scanned axis, 3 rows)
ROWS = ({"M": 1, "N": 1}, {"M": 3, "N": 17}, {"M": 3, "N": 4097})
#: the selective scan's shapes: one element, and a long sequence
MAMBA = ({"B": 1, "D": 1, "S": 1, "T": 1}, {"B": 1, "D": 2, "S": 3, "T": 4097})
#: every (kernel, dims) case
CASES = tuple((k, d) for k in ("floats", "ints", "recur", "sum_1d") for d in ROWS) + \
    tuple(("selective_scan", d) for d in MAMBA)
#: the positions of the results every target must give bit for bit (max/min: mx, mn; every integer scan)
EXACT = {"floats": (3, 4), "ints": (0, 1, 2, 3, 4, 5), "recur": (1, 2)}


def module() -> arke.Module:
    return text_module(SOURCE)



def inputs(name: str, dims: dict[str, int]) -> tuple[Any, ...]:
    """Reproducible inputs of kernel ``name`` at ``dims``."""
    rng = seeded("scan_cases", name, dims)
    f = np.float32
    if name == "selective_scan":
        b, d, s, t = dims["B"], dims["D"], dims["S"], dims["T"]
        return (rng.standard_normal((b, d, t)).astype(f), (0.1 * rng.random((b, d, t))).astype(f),
                (-rng.random((d, s))).astype(f), rng.standard_normal((b, s, t)).astype(f),
                rng.standard_normal((b, s, t)).astype(f))
    if name == "sum_1d":
        return (rng.standard_normal(dims["N"]).astype(f),)
    m, n = dims["M"], dims["N"]
    x = rng.standard_normal((m, n)).astype(f)
    near_one = (1.0 + 0.01 * rng.standard_normal((m, n))).astype(f)
    decay = (0.9 * rng.random((m, n))).astype(f)
    small = rng.integers(-3, 4, (m, n))
    if name == "floats":
        w, g = rng.standard_normal((m, n)).astype(f), rng.standard_normal((m, n)).astype(f)
        if n > 4:  # from here on the row's max/min is NaN
            w[m - 1, min(100, n // 2)] = g[m - 1, min(100, n // 2)] = np.nan
        return x, w, as_dtype(near_one, DType.BF16), as_dtype(g, DType.F16), decay
    if name == "ints":
        return (rng.integers(-50, 50, (m, n)).astype(np.int32), rng.choice([-1, 1, 1, 1, 2], (m, n)).astype(np.int64),
                rng.integers(0, 256, (m, n)).astype(np.uint8), rng.integers(-128, 128, (m, n)).astype(np.int8),
                rng.random((m, n)) < 0.5, rng.random((m, n)) < 0.001)
    assert name == "recur"
    return (as_dtype(decay, DType.BF16), as_dtype(x, DType.BF16), rng.standard_normal(m).astype(f),
            rng.choice([-1, 1, 2], (m, n)).astype(np.int64), small.astype(np.int64),
            rng.integers(-9, 9, m).astype(np.int64), rng.choice([-1, 1, 3], (m, n)).astype(np.int32),
            small.astype(np.int32))


def assert_exact(got: Any, want: Any, what: str) -> None:
    """``got`` is ``want`` value for value (NaN where it is NaN, whatever its payload)."""
    g, w = torch.as_tensor(np.asarray(got) if not isinstance(got, torch.Tensor) else got), torch.as_tensor(want)
    torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True, check_dtype=True, msg=lambda m: f"{what}: {m}")
