"""``exp2`` over its whole range, and ``pow`` and ``**``, on every runnable target against the interpreter
(C's ``pow``, as torch computes it) at the special values: negative bases to integer and fractional powers,
±0 to odd and even negative powers, ±1 to ±inf and NaN, ±inf, NaN, and an exponent that is a scalar
parameter rather than a literal. IREE expands ``math.powf`` as ``exp(y log x)`` and Triton's helper did the
same: both got these wrong."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from codegen_support import RUNNABLE, assert_conforms, build, text_module

SOURCE = """
kernel pw(x: f32[N], y: f32[N]) -> f32[N] { return pow(x, y) }
kernel powered(x: f32[N], p: f32 = 2.0) -> f32[N] { return x[n] ** p }
kernel two_to(x: f32[N]) -> f32[N] { return exp2(x) }
kernel rem(x: f32[N], y: f32[N]) -> f32[N] { return x[n] % y[n] }
kernel inv_rem(x: f32[N], y: f32[N]) -> f32[N] { return 1.0 / (x[n] % y[n]) }
"""

# normal values only: subnormals are flushed to zero on the mlir target (spec/codegen.md §7)
VALUES = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0, 2.5, -2.5, float("inf"), float("-inf"),
          float("nan"), 7.0, 1e30, -1e30, 0.1]


@pytest.mark.parametrize("target", RUNNABLE)
def test_pow_at_the_special_values(target: str) -> None:
    xs, ys = zip(*itertools.product(VALUES, VALUES))
    x, y = np.array(xs, np.float32), np.array(ys, np.float32)
    module = text_module(SOURCE)
    lib = build(module, target)
    assert_conforms(lib.pw(x, y), module.kernels["pw"], x, y, what=f"{target} pow")


@pytest.mark.parametrize("target", RUNNABLE)
@pytest.mark.parametrize("p", [2.0, 3.0, -1.0, 0.0, 0.5])
def test_a_parameter_exponent_of_negative_bases(target: str, p: float) -> None:
    x = np.array([-2.0, -0.5, -0.0, 0.0, 3.0, -3.0, -1.0], np.float32)
    module = text_module(SOURCE)
    got = build(module, target).powered(x, p=p)
    assert_conforms(got, module.kernels["powered"], x, p=p, what=f"{target} x ** {p}")


@pytest.mark.parametrize("target", RUNNABLE)
def test_exp2_over_its_whole_range(target: str) -> None:
    """IREE's f32 ``exp2`` is ``exp(x ln 2)``: twice the tolerance off past |x| = 20, so the mlir target widens it."""
    x = np.concatenate([np.random.default_rng(2).uniform(-126, 127, 4097),
                        [float("inf"), float("-inf"), float("nan"), 128.0, -150.0, 0.0, -0.0]]).astype(np.float32)
    module = text_module(SOURCE)
    assert_conforms(build(module, target).two_to(x), module.kernels["two_to"], x, what=f"{target} exp2")


@pytest.mark.parametrize("target", RUNNABLE)
def test_a_zero_remainder_takes_the_divisors_sign(target: str) -> None:
    """Python's float `%` (spec/language.md §8.2): `5.0 % -1.0` is -0.0. Every target gave +0.0 (fmod's zero
    keeps the dividend's sign), which shows after a division: `1 / (5 % -1)` was +inf, not -inf. Over the
    special values and 4097 elements, so the vector lanes and the scalar tail both run it."""
    xs, ys = zip(*itertools.product(VALUES, VALUES))
    x = np.resize(np.array(xs, np.float32), 4097)
    y = np.resize(np.array(ys, np.float32), 4097)
    module = text_module(SOURCE)
    lib = build(module, target)
    want = module.kernels["rem"](x, y)
    got = np.asarray(lib.rem(x, y))
    assert_conforms(got, module.kernels["rem"], x, y, what=f"{target} %")
    zero = np.asarray(want) == 0
    assert np.array_equal(np.signbit(got[zero]), np.signbit(np.asarray(want)[zero])), f"{target}: the sign of a zero"
    assert_conforms(lib.inv_rem(x, y), module.kernels["inv_rem"], x, y, what=f"{target} 1 / %")
