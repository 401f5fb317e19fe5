"""The llvm target's inline float math (arke.targets.llvm.mathlib): ``tanh``, ``erf``, ``gelu`` and
``x ** c`` for small integral ``c`` are computed without libm calls, so a map of them vectorises,
and they agree with the interpreter by the one tolerance rule on wide ranges, special values
and ragged rows, on the vector path and on the scalar path (a strided read stays scalar)."""

from __future__ import annotations

import math
import platform

import numpy as np
import pytest
import torch
from codegen_support import assert_conforms, build, seeded, std_module, text_module

from arke.targets import base as targets
from arke.targets.llvm.mathlib import SMALL_POWERS, power_by_multiplying, small_power

SOURCE = """
kernel act(x: f32[M, N]) -> (a: f32[M, N], b: f32[M, N], c: f32[M, N], d: f32[M, N]) {
  a[m, n] = tanh(x[m, n])
  b[m, n] = erf(x[m, n])
  c[m, n] = gelu(x[m, n])
  d[m, n] = 0.5 * x[m, n] * (1.0 + tanh(0.7978845608028654 * (x[m, n] + 0.044715 * x[m, n] ** 3)))
}
kernel powers(x: f32[M, N]) -> (a: f32[M, N], b: f32[M, N], c: f32[M, N], d: f32[M, N], e: f32[M, N]) {
  a[m, n] = x[m, n] ** 2
  b[m, n] = x[m, n] ** 0 + x[m, n] ** 1
  c[m, n] = x[m, n] ** -1
  d[m, n] = x[m, n] ** -2 + x[m, n] ** 7
  e[m, n] = x[m, n] ** 8
}
kernel columns(x: f32[M, N]) -> f32[N, M] {
  return tanh(x[m, n]) + erf(x[m, n]) + x[m, n] ** 3
}
kernel row_sums(x: f32[M, N]) -> f32[M] {
  return sum(tanh(x[m, n]) * erf(x[m, n]) + gelu(x[m, n]) for n)
}
"""

# +inf and 3.4e38 are left out: torch's gelu gives NaN at +inf and overflows x·(1 + erf) near the
# float maximum, where gelu is x (the inline forms give inf and x).
SPECIAL = [math.nan, -math.inf, 0.0, -0.0, 1e-30, -1e-30, 1e-7, 0.625, -0.625, 0.62499997,
           3.9999998, 4.0, 4.0000005, -4.0, 9.0, -9.0, 44.0, 89.0, 1e30, -1e30]


def _inputs(m: int, n: int, scale: float) -> np.ndarray:
    x = (seeded("mathlib", m, n, scale).standard_normal((m, n)) * scale).astype(np.float32)
    flat = x.reshape(-1)
    flat[: min(len(SPECIAL), flat.size)] = np.float32(SPECIAL[: flat.size])
    return x


@pytest.mark.parametrize("kernel", ["act", "powers", "columns", "row_sums"])
@pytest.mark.parametrize(("m", "n", "scale"), [(3, 4097, 3.0), (5, 16, 12.0), (1, 1, 1.0), (17, 33, 0.3)])
def test_inline_math_conforms(kernel: str, m: int, n: int, scale: float) -> None:
    module = text_module(SOURCE)
    x = _inputs(m, n, scale)
    if kernel == "powers":
        x = np.where(np.abs(x) > 1e4, np.float32(1.5), x).astype(np.float32)  # x ** 8 of 1e30 is inf anyway
    got = getattr(build(module, "llvm"), kernel)(x)
    assert_conforms(got, module.kernels[kernel], x, what=f"{kernel} {m}x{n}")


def test_no_libm_calls_in_maps() -> None:
    """The activations are inline code: LLVM's loop vectorizer stops at a libm call."""
    module = text_module(SOURCE)
    llvm = targets.get("llvm")
    for kernel in ("act", "powers"):
        text = llvm.render(llvm.plan(module.semantic, module.kernel_map[kernel], None)).source
        for libm in ("@tanhf", "@erff", "@llvm.pow.f32"):
            assert libm not in text, f"{kernel} calls {libm}"


def test_power_by_multiplying_matches_numpy() -> None:
    """The multiplication chains give x ** n within a few ulp for every exponent they take."""
    x = np.float32([0.3, -1.7, 2.5, 1e-3, -7.0, 1.0])

    def mul(a: object, b: object) -> object:
        return np.float32(a) * np.float32(b)

    for n in sorted(SMALL_POWERS):
        got = np.array([power_by_multiplying(v, n, mul, lambda a: np.float32(1) / np.float32(a),  # type: ignore[arg-type]
                                             np.float32(1)) for v in x], dtype=np.float32)
        want = np.power(x.astype(np.float64), n)
        assert np.allclose(got, want, rtol=8 * 2.0 ** -23, atol=0), n
    assert small_power(3.0) == 3 and small_power(2.5) is None and small_power(True) is None
    assert small_power(9) is None and small_power(-3) is None


def test_gelu_tanh_matches_torch() -> None:
    """GPT-2's GELU as std.nn writes it, compiled, against torch's approximate='tanh'."""
    lib = build(std_module("std.nn"), "llvm")
    x = torch.from_numpy(seeded("gelu_tanh").standard_normal((7, 1031)).astype(np.float32)) * 4
    got = lib.gelu_tanh(x)
    assert torch.allclose(got, torch.nn.functional.gelu(x, approximate="tanh"), rtol=1e-5, atol=1e-6)


# exp at the edges of its range: -inf and everything below -104 is 0 (computed without an underflowing
# scale: a microcode assist per instruction on x86), subnormal results down to the smallest, overflow
# to inf, NaN kept; every form the target emits (the vector forms per width, the two scalar forms)
EXP_EDGES = [-math.inf, -1e30, -200.0, -104.5, -104.0, -103.98, -103.9, -100.0, -90.0, -87.5, -87.33, -87.0,
             -10.0, -1e-7, -0.0, 0.0, 1e-7, 1.0, 10.0, 88.0, 88.72, 88.73, 89.0, 100.0, math.inf, math.nan]


def _exp_forms() -> list[tuple[str, int]]:
    from arke.targets.llvm.jit import host_vector_bits

    widest = host_vector_bits() // 32
    return [("scalar", 1), ("ldexp", 1), *((f"v{w}", w) for w in (4, 8, 16) if w <= widest)]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the scalef form is x86-64's")
@pytest.mark.parametrize(("form", "lanes"), _exp_forms())
def test_exp_edges(form: str, lanes: int) -> None:
    import ctypes

    from arke.targets.llvm.jit import Loaded, compile_object
    from arke.targets.llvm.lib import expf
    from arke.targets.llvm.vec import vector_expf

    if form == "scalar" or form == "ldexp":
        name, lines = expf(form == "ldexp")
        ty, call = "float", f"@{name}"
    else:
        lines, ty, call = vector_expf(lanes), f"<{lanes} x float>", f"@arke.expf.{form}"
    source = "\n".join([*lines, f"""
define void @run(ptr %x, ptr %y, i64 %n) {{
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %loop]
  %at = getelementptr inbounds {ty}, ptr %x, i64 %i
  %v = load {ty}, ptr %at, align 4
  %e = call {ty} {call}({ty} %v)
  %to = getelementptr inbounds {ty}, ptr %y, i64 %i
  store {ty} %e, ptr %to, align 4
  %next = add i64 %i, 1
  %more = icmp slt i64 %next, %n
  br i1 %more, label %loop, label %done
done:
  ret void
}}"""])
    loaded = Loaded(compile_object(source))
    run = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
        loaded.engine.get_function_address("run"))
    x = np.array(EXP_EDGES * lanes, dtype=np.float32)[: len(EXP_EDGES) * lanes]
    x = np.concatenate([x, np.zeros((-len(x)) % lanes, np.float32)])
    y = np.empty_like(x)
    run(x.ctypes.data, y.ctypes.data, len(x) // lanes)
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64)).astype(np.float32)  # correctly rounded, subnormals included
    for got, ref, at in zip(y, want, x):
        if math.isnan(ref):
            assert math.isnan(got), f"exp({at}) = {got}, not NaN"
        elif ref == 0 or math.isinf(ref):
            assert got == ref, f"exp({at}) = {got!r}, want {ref!r}"
        else:
            ulps = abs(int(np.float32(got).view(np.int32)) - int(np.float32(ref).view(np.int32)))
            assert ulps <= 2, f"exp({at}) = {got!r}, want {ref!r} ({ulps} ulps)"
