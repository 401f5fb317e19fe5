"""The CUDA-C target's numbers, checked without a GPU: every conformance case compiled as host C++.

:mod:`cuda_host` compiles each rendered translation unit with g++ (shims for the CUDA keywords,
``-ffp-contract=off`` as NVRTC's ``--fmad=false``) and runs every thread of every launch in turn;
the results must equal the reference interpreter's within the suite's rule
(``codegen_support.tolerance``), and a bad subscript must raise the error word. Each kernel
compiles once per process.
"""

from __future__ import annotations

import cuda_host
import numpy as np
import pytest
from codegen_support import random_inputs, seeded, std_module, text_module
from test_conformance import CASES, Case

pytestmark = pytest.mark.skipif(not cuda_host.available(), reason="no g++")

IDIV = "kernel idiv(x: i32[N], y: i32[N]) -> i32[N] {\n  return x[n] / y[n]\n}\n"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_host_cuda_matches_interpreter(case: Case) -> None:
    cuda_host.check_host_case(case)


@pytest.mark.parametrize("bad", [5, -1, 1 << 40])
def test_out_of_range_gather_raises_the_error_word(bad: int) -> None:
    module = std_module("std.nn")
    ids, table = random_inputs(module.kernels["embedding"], {"T": 3, "V": 5, "D": 4}, seeded("cuda-host-gather"),
                               ids={"ids": "V"})
    _, err = cuda_host.run(module, "embedding", ids, table)
    assert err == 0
    ids = np.array(ids, copy=True)
    ids[1] = bad
    got, err = cuda_host.run(module, "embedding", ids, table)
    assert err == 1
    assert np.isfinite(got).all()  # clamped: a bad id reads row 0, never outside the table
    np.testing.assert_array_equal(got[1], table[0])


def test_integer_division_by_zero_raises_the_error_word() -> None:
    """A kernel dividing by a zero integer sets the error word (and clamps the divisor to 1)."""
    module = text_module(IDIV)
    x = np.array([7, -7, 9], dtype=np.int32)
    y = np.array([2, 0, -2], dtype=np.int32)
    got, err = cuda_host.run(module, "idiv", x, y)
    assert err == 1
    np.testing.assert_array_equal(got, [3, -7, -5])  # Python's floor division; 0 divides as 1
    _, err = cuda_host.run(module, "idiv", x, np.array([2, 3, -2], dtype=np.int32))
    assert err == 0



def test_a_zero_float_remainder_takes_the_divisors_sign() -> None:
    """Python's float `%`: `5.0 % -1.0` is -0.0 (fmodf's zero kept the dividend's sign)."""
    module = text_module("kernel rem(x: f32[N], y: f32[N]) -> f32[N] { return 1.0 / (x[n] % y[n]) }")
    x, y = np.array([5.0, -3.0, 2.0, -0.0, 0.0], np.float32), np.array([-1.0, 1.0, 1.0, 3.0, -3.0], np.float32)
    got, err = cuda_host.run(module, "rem", x, y)
    assert err == 0
    assert np.array_equal(np.asarray(got), np.array([-np.inf, np.inf, np.inf, np.inf, -np.inf], np.float32)), got
