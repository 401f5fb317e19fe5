"""Float math for the NVPTX flavour of the LLVM target, written out in LLVM IR.

LLVM's NVPTX backend has no libm and we do not link libdevice, so ``llvm.log``, ``llvm.log2``,
``llvm.sin``, ``llvm.cos``, ``llvm.pow`` (and libm's ``tanhf``/``erff``) cannot be lowered:
codegen stops with "no libcall available". These functions compute them from operations the
backend lowers exactly (integer bit operations, ``fmuladd``, IEEE ``div``/``sqrt``), after
Cephes' single-precision routines. Accuracy (against the correctly rounded result):

* ``log``, ``log2``: about 1 ulp (Cephes ``logf``), subnormals, zeros, infinities, NaN exact;
* ``sin``, ``cos``: about 1 ulp for ``|x| < 8192`` (three-part Cody-Waite reduction by pi/4);
  beyond that, where the reduction would lose bits (as Cephes' does), ``|x|`` is first taken to
  [0, 2π) exactly in f64 (:mod:`arke.targets.turns`): within a few units of 2**-24 for every f32;
* ``tanh``: about 2 ulp (polynomial below 0.625, ``1 - 2/(exp(2|x|)+1)`` above);
* ``erf``: Taylor series below 1 (about 1 ulp), Abramowitz-Stegun 7.1.26 above (within 1.5e-7);
* ``pow``: ``exp(b log|a|)`` with the sign and special cases torch gives; its relative error
  grows with ``|b log a|`` (about ``|b log a|`` ulp).

``exp`` is :func:`arke.targets.llvm.lib.expf`'s portable form (no ``ldexp``).
"""

from __future__ import annotations

import math
import struct

from arke.targets.llvm.lib import expf, float_const
from arke.targets.turns import CHUNKS

_FMA = "declare float @llvm.fmuladd.f32(float, float, float)"
_FABS = "declare float @llvm.fabs.f32(float)"
_COPYSIGN = "declare float @llvm.copysign.f32(float, float)"


def _c(v: float) -> str:
    return float_const(v)


def _horner(var: str, coeffs: list[float], prefix: str) -> tuple[list[str], str]:
    """Lines computing ``coeffs[0] * var^(n-1) + ... + coeffs[-1]`` in fused steps; its value's name."""
    lines, acc = [], _c(coeffs[0])
    for k, c in enumerate(coeffs[1:]):
        name = f"%{prefix}{k}"
        lines.append(f"  {name} = call float @llvm.fmuladd.f32(float {acc}, float {var}, float {_c(c)})")
        acc = name
    return lines, acc


# log(m) for the mantissa m in [sqrt(1/2), sqrt(2)), and the exponent e: x = m 2^e
_LOG_CORE = f"""  %sub = fcmp olt float %x, {_c(2.0 ** -126)}
  %xs0 = fmul float %x, {_c(2.0 ** 23)}
  %xs = select i1 %sub, float %xs0, float %x
  %eadj = select i1 %sub, i32 -23, i32 0
  %bits = bitcast float %xs to i32
  %eb = lshr i32 %bits, 23
  %eb8 = and i32 %eb, 255
  %e0 = sub i32 %eb8, 126
  %mb0 = and i32 %bits, 8388607
  %mb = or i32 %mb0, 1056964608
  %m = bitcast i32 %mb to float
  %small = fcmp olt float %m, {_c(math.sqrt(0.5))}
  %e1 = add i32 %e0, %eadj
  %e2 = sub i32 %e1, 1
  %e = select i1 %small, i32 %e2, i32 %e1
  %m2 = fadd float %m, %m
  %ma = select i1 %small, float %m2, float %m
  %f = fsub float %ma, 1.0
  %z = fmul float %f, %f
"""
_LOG_POLY = [7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
             -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1]
# zeros give -inf, negative numbers NaN, +inf and NaN themselves
_LOG_SPECIAL = """  %iszero = fcmp oeq float %x, 0.0
  %isneg = fcmp olt float %x, 0.0
  %isinf = fcmp oeq float %x, 0x7FF0000000000000
  %isnan = fcmp uno float %x, 0.0
  %keep = or i1 %isinf, %isnan
  %s1 = select i1 %keep, float %x, float %r
  %s2 = select i1 %isneg, float 0x7FF8000000000000, float %s1
  %v = select i1 %iszero, float 0xFFF0000000000000, float %s2
  ret float %v
}"""


def _log(name: str, base2: bool) -> str:
    poly, p = _horner("%f", _LOG_POLY, "lp")
    mant = [f"  %y0 = fmul float {p}, %f", "  %y1 = fmul float %y0, %z", "  %ef = sitofp i32 %e to float"]
    if base2:  # log2 x = e + log(m) log2(e): the exponent exactly
        tail = ["  %y3 = call float @llvm.fmuladd.f32(float %z, float -0.5, float %y1)",
                "  %lm = fadd float %f, %y3",
                f"  %r = call float @llvm.fmuladd.f32(float %lm, float {_c(1 / math.log(2))}, float %ef)"]
    else:
        tail = [f"  %y2 = call float @llvm.fmuladd.f32(float %ef, float {_c(-2.12194440e-4)}, float %y1)",
                "  %y3 = call float @llvm.fmuladd.f32(float %z, float -0.5, float %y2)",
                "  %r0 = fadd float %f, %y3",
                f"  %r = call float @llvm.fmuladd.f32(float %ef, float {_c(0.693359375)}, float %r0)"]
    return "\n".join([f"define internal float @{name}(float %x) alwaysinline {{", "entry:", _LOG_CORE.rstrip("\n"),
                      *poly, *mant, *tail, _LOG_SPECIAL])


_SIN_POLY = [-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1]
_COS_POLY = [2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2]


#: From this |x| on, sin and cos first take |x| to [0, 2π) exactly (the Cody-Waite steps lose bits past it).
TURN_FROM = 8192.0


def _f64(v: float) -> str:
    return f"0x{struct.unpack('<Q', struct.pack('<d', v))[0]:016X}"


def _turn(ax: str, out: str, negative: str) -> list[str]:
    """``out = |2π·t|`` and ``negative = t < 0`` for ``t = ax / 2π`` mod 1 centred on [-1/2, 1/2], the turn summed
    in f64 from exact products of ``ax`` with 1/2π's 24-bit chunks (:mod:`arke.targets.turns`): right for every
    f32; inf and NaN give NaN."""
    lines = [f"  %tw = fpext float {ax} to double"]
    acc = "0.0"
    for i, c in enumerate(reversed(CHUNKS)):
        lines += [f"  %tp{i} = fmul double %tw, {_f64(c)}", f"  %tfl{i} = call double @llvm.floor.f64(double %tp{i})",
                  f"  %tf{i} = fsub double %tp{i}, %tfl{i}", f"  %ts{i} = fadd double {acc}, %tf{i}"]
        acc = f"%ts{i}"
    return [*lines, f"  %tfl = call double @llvm.floor.f64(double {acc})", f"  %tt0 = fsub double {acc}, %tfl",
                    "  %thi = fcmp ogt double %tt0, 0.5", "  %tt1 = fsub double %tt0, 1.0",
                    "  %tt = select i1 %thi, double %tt1, double %tt0", f"  {negative} = fcmp olt double %tt, 0.0",
                    f"  %tr = fmul double %tt, {_f64(2 * math.pi)}", "  %trf = fptrunc double %tr to float",
                    f"  {out} = call float @llvm.fabs.f32(float %trf)"]


def _trig(name: str, cosine: bool) -> str:
    sp, s = _horner("%z", _SIN_POLY, "sp")
    cp, c = _horner("%z", _COS_POLY, "cp")
    # octant j of |x| (rounded up to even), j mod 8 in 0..3 plus a sign flip
    lines = [f"define internal float @{name}(float %x) alwaysinline {{", "entry:",
             "  %ax0 = call float @llvm.fabs.f32(float %x)",
             f"  %huge = fcmp oge float %ax0, {_c(TURN_FROM)}", "  br i1 %huge, label %turn, label %core",
             "turn:", *_turn("%ax0", "%axr", "%rneg"), "  br label %core",
             "core:", "  %ax = phi float [ %ax0, %entry ], [ %axr, %turn ]",
             "  %back = phi i1 [ false, %entry ], [ %rneg, %turn ]",  # the turn came out negative
             f"  %q = fmul float %ax, {_c(4 / math.pi)}",
             "  %j00 = fptosi float %q to i32", "  %j0 = freeze i32 %j00",  # poison only for huge/NaN x: NaN anyway
             "  %odd = and i32 %j0, 1", "  %j1 = add i32 %j0, %odd", "  %y = sitofp i32 %j1 to float",
             "  %j = and i32 %j1, 7", "  %hi = icmp sgt i32 %j, 3", "  %j4 = sub i32 %j, 4",
             "  %jj = select i1 %hi, i32 %j4, i32 %j",
             f"  %x1 = call float @llvm.fmuladd.f32(float %y, float {_c(-0.78515625)}, float %ax)",
             f"  %x2 = call float @llvm.fmuladd.f32(float %y, float {_c(-2.4187564849853515625e-4)}, float %x1)",
             f"  %r = call float @llvm.fmuladd.f32(float %y, float {_c(-3.77489497744594108e-8)}, float %x2)",
             "  %z = fmul float %r, %r", *sp, *cp,
             f"  %ps0 = fmul float {s}, %z", "  %ps = call float @llvm.fmuladd.f32(float %ps0, float %r, float %r)",
             f"  %pc0 = fmul float {c}, %z", "  %pc1 = fmul float %pc0, %z",
             "  %pc2 = call float @llvm.fmuladd.f32(float %z, float -0.5, float %pc1)",
             "  %pc = fadd float %pc2, 1.0",
             "  %j1or2a = icmp eq i32 %jj, 1", "  %j1or2b = icmp eq i32 %jj, 2",
             "  %mid = or i1 %j1or2a, %j1or2b"]
    if cosine:
        lines += ["  %v0 = select i1 %mid, float %ps, float %pc",
                  "  %big = icmp sgt i32 %jj, 1", "  %flip = xor i1 %hi, %big"]
    else:
        lines += ["  %v0 = select i1 %mid, float %pc, float %ps",
                  "  %xneg0 = fcmp olt float %x, 0.0", "  %xneg = xor i1 %xneg0, %back", "  %flip = xor i1 %hi, %xneg"]
    lines += ["  %nv = fneg float %v0", "  %v = select i1 %flip, float %nv, float %v0", "  ret float %v", "}"]
    return "\n".join(lines)


_TANH_POLY = [-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1]


def _tanh(name: str, exp_name: str) -> str:
    poly, p = _horner("%z", _TANH_POLY, "tp")
    return "\n".join([
        f"define internal float @{name}(float %x) alwaysinline {{", "entry:",
        "  %ax = call float @llvm.fabs.f32(float %x)", "  %z = fmul float %x, %x", *poly,
        f"  %p0 = fmul float {p}, %z", "  %small = call float @llvm.fmuladd.f32(float %p0, float %x, float %x)",
        "  %a2 = fadd float %ax, %ax", f"  %s = call float @{exp_name}(float %a2)",
        "  %s1 = fadd float %s, 1.0", "  %q = fdiv float 2.0, %s1", "  %big0 = fsub float 1.0, %q",
        "  %big = call float @llvm.copysign.f32(float %big0, float %x)",
        f"  %isbig = fcmp oge float %ax, {_c(0.625)}",
        "  %v = select i1 %isbig, float %big, float %small", "  ret float %v", "}"])


def _erf(name: str, exp_name: str) -> str:
    # below 1: x * sum_n (-1)^n z^n / (n! (2n+1)) * 2/sqrt(pi), z = x^2 (terms past n = 10 are < 2^-30)
    taylor = [(-1) ** n / (math.factorial(n) * (2 * n + 1)) * 2 / math.sqrt(math.pi) for n in range(10, -1, -1)]
    tp, t = _horner("%z", taylor, "ep")
    ap, a = _horner("%t", [1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592], "ap")
    return "\n".join([
        f"define internal float @{name}(float %x) alwaysinline {{", "entry:",
        "  %ax = call float @llvm.fabs.f32(float %x)", "  %z = fmul float %x, %x", *tp,
        f"  %small = fmul float {t}, %x",
        f"  %d = call float @llvm.fmuladd.f32(float %ax, float {_c(0.3275911)}, float 1.0)",
        "  %t = fdiv float 1.0, %d", *ap, f"  %pt = fmul float {a}, %t",
        "  %nz = fneg float %z", f"  %e = call float @{exp_name}(float %nz)",
        "  %tail = fmul float %pt, %e", "  %big0 = fsub float 1.0, %tail",
        "  %big = call float @llvm.copysign.f32(float %big0, float %x)",
        "  %issmall = fcmp olt float %ax, 1.0",
        "  %v = select i1 %issmall, float %small, float %big", "  ret float %v", "}"])


def _pow(name: str, log_name: str, exp_name: str) -> str:
    return "\n".join([
        f"define internal float @{name}(float %a, float %b) alwaysinline {{", "entry:",
        "  %aa = call float @llvm.fabs.f32(float %a)", f"  %l = call float @{log_name}(float %aa)",
        "  %bl = fmul float %b, %l", f"  %r = call float @{exp_name}(float %bl)",
        "  %fb = call float @llvm.floor.f32(float %b)", "  %isint = fcmp oeq float %fb, %b",
        "  %half = frem float %b, 2.0", "  %odd0 = fcmp une float %half, 0.0", "  %odd = and i1 %isint, %odd0",
        "  %neg = fcmp olt float %a, 0.0", "  %flip = and i1 %neg, %odd", "  %nr = fneg float %r",
        "  %r1 = select i1 %flip, float %nr, float %r",
        "  %notint = xor i1 %isint, true", "  %nan = and i1 %neg, %notint",
        "  %r2 = select i1 %nan, float 0x7FF8000000000000, float %r1",
        "  %b0 = fcmp oeq float %b, 0.0", "  %a1 = fcmp oeq float %a, 1.0", "  %one = or i1 %b0, %a1",
        "  %v = select i1 %one, float 1.0, float %r2", "  ret float %v", "}"])


#: The functions this module provides, by the name of the op they compute.
FUNCTIONS = ("log", "log2", "sin", "cos", "tanh", "erf", "pow")


def nvptx_math(op: str) -> tuple[str, tuple[str, ...]]:
    """``(name, declarations and definitions)`` of the NVPTX-lowerable float function ``op``
    (one of :data:`FUNCTIONS`, or ``exp``): the rendered kernel calls ``@name``."""
    exp_name, exp_defs = expf(scalef=False)
    base = (_FMA, _FABS, _COPYSIGN, "declare float @llvm.floor.f32(float)")
    if op == "exp":
        return exp_name, exp_defs
    name = f"arke.nv.{op}f"
    if op in ("log", "log2"):
        return name, (*base, _log(name, op == "log2"))
    if op in ("sin", "cos"):
        return name, (*base, "declare double @llvm.floor.f64(double)", _trig(name, op == "cos"))
    if op == "tanh":
        return name, (*base, *exp_defs, _tanh(name, exp_name))
    if op == "erf":
        return name, (*base, *exp_defs, _erf(name, exp_name))
    if op == "pow":
        log_name, log_defs = nvptx_math("log")
        return name, (*base, *exp_defs, *log_defs, _pow(name, log_name, exp_name))
    raise KeyError(op)
