"""The tolerance rule's bound (arke/runtime/error_bound.py) on cases a conforming target may compute
differently from the interpreter: here, how a divisor's libm error moves a float `%`."""

from __future__ import annotations

import numpy as np

import arke
from arke.runtime.tolerance import tolerance


def test_a_remainders_bound_follows_its_divisors_error() -> None:
    """`a % b` moves by floor(a / b) times b's error: `x % sqrt(y)` at x = 1e7 moves by ~0.8 when sqrt is one
    ulp off, which any libm may be. The rule allowed only the divisor's own error, so it rejected a conforming
    result; it is also capped by |b|, the width of the range every remainder lies in."""
    module = arke.loads("kernel k(x: f32[N], y: f32[N]) -> f32[N] { return x[n] % sqrt(y[n]) }")
    x, y = np.array([1e7, 3.0, -1e30], np.float32), np.array([2.0, 2.0, 2.0], np.float32)
    [bound] = tolerance(module.kernels["k"], [x, y])
    s = np.sqrt(y)
    moved = np.abs(np.fmod(x, s) - np.fmod(x, np.nextafter(s, np.float32(np.inf))))
    assert moved[0] > 0.1 and bound[0] >= moved[0], (moved, bound)
    assert bound[1] < 1e-5  # 3 % 1.414: the slope is 2
    assert bound[2] <= 2 * s[2]  # capped at |b| (plus b's own error)
