"""Scalar float math that LLVM's loop vectorizer can vectorise: inline definitions, never libm calls.

A map's loop nest is vectorised by LLVM at O3 only when every call in it has a vector form. A call
of libm's ``tanhf`` has none, so a GELU-tanh map ran one element at a time through libm (GPT-2's
MLP was 1.35x torch eager, the activation taking longer than both matmuls). Here ``tanh`` is
written in plain arithmetic over the inline ``expf`` (the same steps as
:meth:`arke.targets.llvm.vec.Vec.tanh`, so the scalar and vector paths give the same bits), and
``x ** c`` for a small integral constant ``c`` is a few multiplications, as torch computes it.
"""

from __future__ import annotations

from collections.abc import Callable

from arke.targets.llvm.lib import expf, float_const

_TANH_POLY = (2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1)


def tanhf(scalef: bool) -> tuple[str, tuple[str, ...]]:
    """The name of an inline, vectorisable ``tanh`` and the declarations and definition it needs.

    Cephes' tanhf: an odd polynomial below ``|x| = 0.625``, else ``1 - 2 / (exp(2|x|) + 1)`` with
    x's sign (a few ulp; +-1 past ``|x| = 44``; NaN stays NaN). ``scalef``: as for :func:`expf`."""
    exp_name, exp_needs = expf(scalef)
    name = f"arke.tanhf{'.ldexp' if scalef else ''}"
    lines = [f"define internal float @{name}(float %x) alwaysinline {{", "entry:",
             "  %ax = call float @llvm.fabs.f32(float %x)",
             "  %z = fmul float %x, %x"]
    p = float_const(-5.70498872745e-3)
    for k, c in enumerate(_TANH_POLY):
        lines.append(f"  %p{k} = call float @llvm.fmuladd.f32(float {p}, float %z, float {float_const(c)})")
        p = f"%p{k}"
    lines += [f"  %pz = fmul float {p}, %z",
              "  %small = call float @llvm.fmuladd.f32(float %pz, float %x, float %x)",
              "  %a2 = fadd float %ax, %ax",
              f"  %e = call float @{exp_name}(float %a2)",
              "  %plus = fadd float %e, 1.0",
              "  %q = fdiv float 2.0, %plus",
              "  %big0 = fsub float 1.0, %q",
              "  %big = call float @llvm.copysign.f32(float %big0, float %x)",
              f"  %near = fcmp olt float %ax, {float_const(0.625)}",
              "  %r = select i1 %near, float %small, float %big",
              "  ret float %r", "}"]
    declares = ("declare float @llvm.fabs.f32(float)", "declare float @llvm.copysign.f32(float, float)",
                "declare float @llvm.fmuladd.f32(float, float, float)")
    return name, (*exp_needs, *declares, "\n".join(lines))


#: The integral exponents ``x ** c`` computes by multiplication (torch's CPU kernel special-cases
#: 2, 3, -1 and -2 the same way; the others here are within the same few ulp of a correctly
#: rounded power).
SMALL_POWERS = frozenset(range(-2, 9))


def small_power(exponent: float | int | bool) -> int | None:
    """``exponent`` as an int when ``x ** exponent`` is done by multiplying, else None."""
    if isinstance(exponent, bool):
        return None
    if float(exponent).is_integer() and int(exponent) in SMALL_POWERS:
        return int(exponent)
    return None


def power_by_multiplying(x: str, n: int, mul: Callable[[str, str], str], recip: Callable[[str], str],
                         one: str) -> str:
    """``x ** n`` for ``n`` in :data:`SMALL_POWERS` from the emitter's multiply and reciprocal."""
    if n == 0:
        return one  # pow(x, 0) is 1 for every x, NaN included (IEEE 754 and torch)
    m = abs(n)
    result: str | None = None
    base = x
    while m:
        if m & 1:
            result = base if result is None else mul(result, base)
        m >>= 1
        if m:
            base = mul(base, base)
    assert result is not None
    return recip(result) if n < 0 else result


# erf(x) for f32 as x·P(x²)/Q(x²) on x clamped to [-4, 4] (beyond it erf rounds to ±1): the
# rational form of Eigen's and XLA's f32 erf. Measured against torch.erf on 2·10⁶ points in
# [-5, 5] and tiny arguments: at most 7 ulp (the LIBM_ULPS the tolerance rule allows is 16).
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
          -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
          -1.42647390514189e-02)


def erf_steps(x: str, ty: str, bty: str, const: Callable[[float], str], let: Callable[[str], str],
              fmuladd: Callable[[str, str, str], str]) -> str:
    """Emit erf of ``x`` (of type ``ty``; ``bty`` its i1 type) through the emitter's ``let``: NaN stays
    NaN (every clamp is a compare and a select, false for NaN), the result is clamped to [-1, 1]."""
    def clamp(v: str, lo: float, hi: float) -> str:
        below = let(f"fcmp olt {ty} {v}, {const(lo)}")
        v = let(f"select {bty} {below}, {ty} {const(lo)}, {ty} {v}")
        above = let(f"fcmp ogt {ty} {v}, {const(hi)}")
        return let(f"select {bty} {above}, {ty} {const(hi)}, {ty} {v}")

    xc = clamp(x, -4.0, 4.0)
    z = let(f"fmul {ty} {xc}, {xc}")
    p = const(_ERF_P[0])
    for k in _ERF_P[1:]:
        p = fmuladd(p, z, const(k))
    q = const(_ERF_Q[0])
    for k in _ERF_Q[1:]:
        q = fmuladd(q, z, const(k))
    num = let(f"fmul {ty} {xc}, {p}")
    return clamp(let(f"fdiv {ty} {num}, {q}"), -1.0, 1.0)


def erff() -> tuple[str, tuple[str, ...]]:
    """The name of an inline, vectorisable scalar ``erf`` and the declarations and definition it needs."""
    lines = ["define internal float @arke.erff(float %x) alwaysinline {", "entry:"]
    count = iter(range(1_000_000))

    def let(rhs: str) -> str:
        name = f"%v{next(count)}"
        lines.append(f"  {name} = {rhs}")
        return name

    def fmuladd(a: str, b: str, c: str) -> str:
        return let(f"call float @llvm.fmuladd.f32(float {a}, float {b}, float {c})")

    r = erf_steps("%x", "float", "i1", float_const, let, fmuladd)
    lines += [f"  ret float {r}", "}"]
    return "arke.erff", ("declare float @llvm.fmuladd.f32(float, float, float)", "\n".join(lines))
