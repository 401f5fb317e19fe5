"""The interpreter's guards: every bad call is a GuardError naming the kernel, parameter and rule."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
import torch
from interp_builders import (
    BF16,
    F32,
    I32,
    attention_fn,
    axes,
    bi,
    c,
    call,
    func,
    ld,
    mapop,
    mod,
    param,
    randn,
)

from arke.ir import semantic as S
from arke.ir.dtypes import DType
from arke.ir.shapes import const, sym
from arke.runtime.interp import GuardError, run, run_function

# ---------------------------------------------------------------- guards


def two_input_fn() -> S.Function:
    body = bi("mul", ld("x", "m", "n"), ld("w", "n"))
    return func("scale", [param("x", F32, "M", "N"), param("w", F32, "N"), param("k", I32, default=None)],
                [mapop("0", F32, axes(m="M", n="N"), bi("mul", body, S.Cast(ld("k", dt=I32), F32)))], ["0"])


def test_guard_failures_name_kernel_parameter_and_rule() -> None:
    fn = two_input_fn()
    x, w = randn(3, 4), randn(4)
    np.testing.assert_allclose(call(fn, x, w, 2), x * w * 2)
    np.testing.assert_allclose(call(fn, x, w, k=np.int32(2)), x * w * 2)
    np.testing.assert_allclose(call(fn, x, w, torch.tensor(3)), torch.from_numpy(x * w * 3))
    cases: list[tuple[tuple[Any, ...], dict[str, Any], str, str]] = [
        ((x, w), {}, "missing", r"kernel `scale`: missing argument `k`"),
        ((x, w, 1, 2), {}, "arity", r"takes 3 arguments \(x, w, k\), but 4 were given"),
        ((x, w), {"kk": 1}, "arity", r"no parameter `kk`; did you mean `k`\?"),
        ((x, w, 1), {"k": 1}, "arity", "parameter `k` given twice"),
        ((randn(3), w, 1), {}, "rank",
         r"parameter `x` is f32\[M, N\] \(rank 2\), but was given shape \[3\] \(rank 1\)"),
        ((x, 1.0, 1), {}, "rank", r"parameter `w` is f32\[N\] \(rank 1\), but was given a scalar"),
        ((x, [1.0] * 4, 1), {}, "type", r"parameter `w` needs a tensor"),
        ((x.astype(np.float64), w, 1), {}, "dtype",
         r"parameter `x` needs f32, but was given float64; convert it with `\.astype\(np\.float32\)`"),
        ((torch.from_numpy(x).double(), torch.from_numpy(w), 1), {}, "dtype",
         r"needs f32, but was given float64; convert it with `\.to\(torch\.float32\)`"),
        ((x, randn(5), 1), {}, "dim", r"N = 4 from `x` axis 1, but `w` axis 0 has 5"),
        ((x, w, 1.5), {}, "scalar", r"parameter `k` needs an integer \(i32\), but was given 1\.5"),
        ((x, w, 2**40), {}, "scalar", r"`k` is i32, which cannot hold"),
        ((randn(0, 4), w, 1), {}, "dim", r"M = 0 from `x` axis 0: dims must be at least 1"),
    ]
    for args, kw, rule, pattern in cases:
        with pytest.raises(GuardError, match=pattern) as err:
            call(fn, *args, **kw)
        assert err.value.rule == rule and isinstance(err.value, ValueError), pattern
        assert str(err.value).startswith("kernel `scale`"), str(err.value)


def test_bf16_param_given_numpy_suggests_torch() -> None:
    fn = func("b", [param("x", BF16, "N")], [mapop("0", BF16, axes(i="N"), ld("x", "i", dt=BF16))], ["0"])
    with pytest.raises(GuardError, match=r"needs bf16, but was given float32; NumPy has no bf16.*torch\.bfloat16"):
        call(fn, randn(3))


def test_literal_and_compound_dims_and_where_clauses() -> None:
    fn = func("lit", [param("x", F32, 4, "N"), param("y", F32, 2 * sym("N"))],
              [mapop("0", F32, axes(i=4, j="N"), ld("x", "i", "j"))], ["0"],
              (S.Guard(S.BoolOp("or", (S.Rel("<", sym("N"), const(8)), S.Rel("==", sym("N"), const(16)))),
                       "N < 8 or N == 16"),))
    np.testing.assert_array_equal(call(fn, np.ones((4, 3), np.float32), randn(6)), np.ones((4, 3)))
    with pytest.raises(GuardError, match=r"`x` axis 0 must be 4, but has 5"):
        call(fn, np.ones((5, 3), np.float32), randn(6))
    with pytest.raises(GuardError, match=r"`y` axis 0 must be 2\*N = 6 \(N = 3 from `x` axis 1\), but has 7") as e:
        call(fn, np.ones((4, 3), np.float32), randn(7))
    assert e.value.param == "y"
    with pytest.raises(GuardError, match=r"where clause `N < 8 or N == 16` does not hold: N = 9") as e:
        call(fn, np.ones((4, 9), np.float32), randn(18))
    assert e.value.rule == "where"


def test_attention_guard_quotes_text_and_values() -> None:
    q, k = torch.randn(1, 3, 4, 8), torch.randn(1, 2, 4, 8)
    with pytest.raises(GuardError, match=r"kernel `attention`: where clause `H % G == 0` does not hold: G = 2, H = 3"):
        call(attention_fn(), q, k, k)
    with pytest.raises(GuardError, match=r"`T >= S` does not hold: S = 4, T = 2"):
        call(attention_fn(), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8))


def test_check_call_and_bind_dims_take_shapes_only() -> None:
    from arke.runtime.interp import bind_dims, check_call

    fn = two_input_fn()
    assert bind_dims(fn, {"x": (3, 4), "w": (4,)}) == {"M": 3, "N": 4}
    assert check_call(fn, [(3, 4), (4,), ()], [F32, torch.float32, np.int32]) == {"M": 3, "N": 4}
    assert check_call(fn, {"x": (3, 4), "w": (4,)}, {"x": np.float32, "w": "f32"}) == {"M": 3, "N": 4}
    with pytest.raises(GuardError, match="needs f32, but was given f16; convert it to f32"):
        check_call(fn, {"x": (3, 4), "w": (4,)}, {"x": DType.F16})
    with pytest.raises(GuardError, match="missing argument `w`"):
        check_call(fn, {"x": (3, 4)})
    with pytest.raises(GuardError, match=r"takes 3 arguments"):
        check_call(fn, [(3, 4), (4,)])


def test_negative_extent_is_reported() -> None:
    fn = func("neg", [param("x", F32, "S"), param("y", F32, "T")],
              [mapop("0", F32, axes(j=sym("T") - sym("S")), c(1.0))], ["0"])
    np.testing.assert_array_equal(call(fn, randn(2), randn(5)), np.ones(3))
    with pytest.raises(GuardError, match=r"kernel `neg`: axis `j` has extent -S \+ T = -3, below zero \(in `t0`\)"):
        call(fn, randn(5), randn(2))


def test_run_function_checks_strictly() -> None:
    fn = two_input_fn()
    x, w = torch.randn(3, 4), torch.randn(4)
    out = run_function(fn, mod(fn), {"x": x, "w": w, "k": torch.tensor(2, dtype=torch.int32)})
    torch.testing.assert_close(out[0], x * w * 2)
    torch.testing.assert_close(run_function(fn, mod(fn), {"x": x, "w": w, "k": 3})[0], x * w * 3)
    with pytest.raises(GuardError, match="missing argument `k`"):
        run_function(fn, mod(fn), {"x": x, "w": w})
    with pytest.raises(GuardError, match="needs i32, but was given int64"):
        run_function(fn, mod(fn), {"x": x, "w": w, "k": torch.tensor(2)})
    with pytest.raises(GuardError, match="N = 5 at the call, but the arguments give N = 4"):
        run_function(fn, mod(fn), {"x": x, "w": w, "k": 1}, dims={"N": 5})
    with pytest.raises(GuardError, match="no parameter `z`"):
        run_function(fn, mod(fn), {"x": x, "w": w, "k": 1, "z": x})
    with pytest.raises(GuardError, match=r"kernel `nope`: no such kernel in this module \(kernels: scale\)"):
        run(mod(fn), "nope", (), {})


def test_guard_error_pickles() -> None:
    err = GuardError("k", "bad", rule="dim", param="x")
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.rule, back.param, back.kernel) == (str(err), "dim", "x", "k")


def test_guard_errors_are_shape_or_dtype_errors_by_rule() -> None:
    """`arke.ShapeError` and `arke.DTypeError` are the GuardErrors of shape and dtype rules."""
    import pickle

    import arke

    shape = arke.GuardError("k", "bad dim", rule="dim", param="x")
    dtype = arke.GuardError("k", "bad dtype", rule="dtype", param="x")
    other = arke.GuardError("k", "missing", rule="missing", param="x")
    assert type(shape) is arke.ShapeError and type(dtype) is arke.DTypeError and type(other) is arke.GuardError
    assert all(isinstance(e, ValueError) for e in (shape, dtype, other))
    again = pickle.loads(pickle.dumps(dtype))
    assert type(again) is arke.DTypeError and again.param == "x" and str(again) == str(dtype)
