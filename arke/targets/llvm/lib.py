"""Support for the LLVM renderer: exact float literals, and small functions written in LLVM IR
(a vectorisable ``exp``, integer powers) that the rendered kernels call and LLVM inlines."""

from __future__ import annotations

import math
import struct

from arke.ir.dtypes import DType

INT_BITS = {DType.I64: 64, DType.I32: 32, DType.I8: 8, DType.U32: 32, DType.U16: 16, DType.U8: 8}


def int_const(value: int, dtype: DType) -> str:
    """An LLVM integer literal of ``value`` in ``dtype`` (unsigned values above the signed range as their
    two's complement: LLVM's integers are signless)."""
    bits = INT_BITS[dtype]
    value &= (1 << bits) - 1
    return str(value - (1 << bits) if value >= 1 << (bits - 1) else value)


def float_const(value: float, dtype: DType = DType.F32) -> str:
    """An LLVM float literal: the value rounded to ``dtype``, written as the hex of its double."""
    if math.isnan(value):
        return "0x7FF8000000000000"
    value = _round(float(value), dtype)
    return "0x" + struct.pack(">d", value).hex().upper()


def _round(value: float, dtype: DType) -> float:
    """``value`` rounded to f32, f16 or bf16 (round to nearest even), as a Python float."""
    if math.isinf(value):
        return value
    as_f32 = struct.unpack(">f", struct.pack(">f", value))[0] if abs(value) < 3.5e38 else math.copysign(
        math.inf, value)
    if dtype is DType.F16:
        return float(struct.unpack(">e", struct.pack(">e", as_f32))[0]) if abs(as_f32) < 65520 else \
            math.copysign(math.inf, as_f32)
    if dtype is DType.BF16:
        bits = struct.unpack(">I", struct.pack(">f", as_f32))[0]
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return float(struct.unpack(">f", struct.pack(">I", bits & 0xFFFFFFFF))[0])
    return float(as_f32)


# exp(x) for float, written out so the loop vectorizer can use it (libm's expf is a scalar call):
# x = n ln2 + r with |r| <= ln2/2 (n = x log2(e) rounded to even, r in two fused steps), exp(r)
# by Cephes' degree-6 polynomial (Horner's rule in fused multiply-adds: about 1 ulp), times 2^n.
# x above 89 is clamped to 89 by compare-and-select, which keeps NaN (exp(89) overflows to +inf);
# x below -104 (exp rounds to 0; -inf from a mask among them) gives 0 by a select at the end and
# is computed as exp(0) meanwhile: scaling down to an underflowing result costs a microcode assist
# per instruction on x86 (over a hundred cycles; causal attention's masked lanes paid it on every
# tile). Values down to the smallest subnormal come out right (the scaling rounds once). NaN stays NaN.
# ``llvm.fmuladd`` fuses where the target has FMA; either way one compiled kernel always
# computes the same bits, whatever the thread count.
_C = {name: float_const(v) for name, v in {
    "lo": -104.0, "hi": 89.0, "log2e": 1.44269504088896341, "mln2hi": -0.693359375,
    "mln2lo": 2.12194440e-4, "p0": 1.9875691500e-4, "p1": 1.3981999507e-3, "p2": 8.3334519073e-3,
    "p3": 4.1665795894e-2, "p4": 1.6666665459e-1, "p5": 5.0000001201e-1}.items()}
_EXP_BODY = f"""entry:
  %below = fcmp olt float %x, {_C["lo"]}
  %x1 = select i1 %below, float 0.0, float %x
  %above = fcmp ogt float %x1, {_C["hi"]}
  %xc = select i1 %above, float {_C["hi"]}, float %x1
  %t = fmul float %xc, {_C["log2e"]}
  %nf = call float @llvm.roundeven.f32(float %t)
  %r1 = call float @llvm.fmuladd.f32(float %nf, float {_C["mln2hi"]}, float %xc)
  %r = call float @llvm.fmuladd.f32(float %nf, float {_C["mln2lo"]}, float %r1)
  %p1 = call float @llvm.fmuladd.f32(float %r, float {_C["p0"]}, float {_C["p1"]})
  %p2 = call float @llvm.fmuladd.f32(float %p1, float %r, float {_C["p2"]})
  %p3 = call float @llvm.fmuladd.f32(float %p2, float %r, float {_C["p3"]})
  %p4 = call float @llvm.fmuladd.f32(float %p3, float %r, float {_C["p4"]})
  %p5 = call float @llvm.fmuladd.f32(float %p4, float %r, float {_C["p5"]})
  %z = fmul float %r, %r
  %y0 = call float @llvm.fmuladd.f32(float %p5, float %z, float %r)
  %y = fadd float %y0, 1.0
  %n0 = fptosi float %nf to i32
  %n = freeze i32 %n0 ; poison only for a NaN x, whose result is NaN whatever the scale
"""
_EXP_DECLARES = ("declare float @llvm.roundeven.f32(float)", "declare float @llvm.fmuladd.f32(float, float, float)")
#: Portable: 2^n as two exact powers of two (n can be 128, one more than a float's exponent holds).
EXPF_DECLARES = _EXP_DECLARES
EXPF = f"""define internal float @arke.expf(float %x) alwaysinline {{
{_EXP_BODY}  %n1 = ashr i32 %n, 1
  %n2 = sub i32 %n, %n1
  %e1 = add i32 %n1, 127
  %e2 = add i32 %n2, 127
  %bits1 = shl i32 %e1, 23
  %bits2 = shl i32 %e2, 23
  %s1 = bitcast i32 %bits1 to float
  %s2 = bitcast i32 %bits2 to float
  %v0 = fmul float %y, %s1
  %v1 = fmul float %v0, %s2
  %v = select i1 %below, float 0.0, float %v1
  ret float %v
}}"""
#: With AVX-512: 2^n by ``llvm.ldexp`` (one vscalefps); elsewhere it would be a libm call per element.
EXPF_LDEXP_DECLARES = (*_EXP_DECLARES, "declare float @llvm.ldexp.f32.i32(float, i32)")
EXPF_LDEXP = f"""define internal float @arke.expf.ldexp(float %x) alwaysinline {{
{_EXP_BODY}  %v1 = call float @llvm.ldexp.f32.i32(float %y, i32 %n)
  %v = select i1 %below, float 0.0, float %v1
  ret float %v
}}"""


def expf(scalef: bool) -> tuple[str, tuple[str, ...]]:
    """The name of the vectorisable ``exp`` to call and the declarations and definition it needs;
    ``scalef``: the target scales by a power of two in one instruction (AVX-512)."""
    if scalef:
        return "arke.expf.ldexp", (*EXPF_LDEXP_DECLARES, EXPF_LDEXP)
    return "arke.expf", (*EXPF_DECLARES, EXPF)


def ipow(ct: str, unsigned: bool = False) -> str:
    """An integer power by squaring; a negative exponent raises the error flag (as the interpreter does).
    Unsigned (``arke.ipow.u.{ct}``): no exponent is negative, and it halves by a logical shift."""
    name = f"arke.ipow.u.{ct}" if unsigned else f"arke.ipow.{ct}"
    return f"""define internal {ct} @"{name}"({ct} %a, {ct} %n, ptr %flag) {{
entry:
  %neg = icmp {'ult' if unsigned else 'slt'} {ct} %n, 0
  br i1 %neg, label %bad, label %loop
bad:
  store i1 true, ptr %flag
  ret {ct} 0
loop:
  %r = phi {ct} [1, %entry], [%r2, %next]
  %b = phi {ct} [%a, %entry], [%b2, %next]
  %e = phi {ct} [%n, %entry], [%e2, %next]
  %done = icmp eq {ct} %e, 0
  br i1 %done, label %out, label %step
step:
  %odd = and {ct} %e, 1
  %isodd = icmp ne {ct} %odd, 0
  %rm = mul {ct} %r, %b
  %r2 = select i1 %isodd, {ct} %rm, {ct} %r
  %b2 = mul {ct} %b, %b
  %e2 = {'lshr' if unsigned else 'ashr'} {ct} %e, 1
  br label %next
next:
  br label %loop
out:
  ret {ct} %r
}}"""


def identity(kind: str, dtype: DType) -> str:
    if dtype.is_bool:
        return "false" if kind in ("sum", "max") else "true"
    if dtype.is_float:
        return {"sum": "0.0", "prod": "1.0", "max": "0xFFF0000000000000", "min": "0x7FF0000000000000"}[kind]
    bits = INT_BITS[dtype]
    if dtype.is_unsigned:
        return {"sum": "0", "prod": "1", "max": "0", "min": "-1"}[kind]  # -1: every bit set, the largest
    return {"sum": "0", "prod": "1", "max": str(-(2 ** (bits - 1))), "min": str(2 ** (bits - 1) - 1)}[kind]
