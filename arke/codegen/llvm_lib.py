"""Support for the LLVM renderer: exact float literals, and small functions written in LLVM IR
(a vectorisable ``exp``, integer powers) that the rendered kernels call and LLVM inlines."""

from __future__ import annotations

import math
import struct

from arke.ir.dtypes import DType

INT_BITS = {DType.I64: 64, DType.I32: 32, DType.I8: 8}


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
# x = n ln2 + r with |r| <= ln2/2, exp(r) by Cephes' degree-6 polynomial (about 1 ulp), times 2^n
# (as 2^(n/2) twice, so n = 128 near the top of the range does not overflow the scale).
# Results down to the smallest subnormal come out right (the second scaling rounds once); below
# -103.97 the result is 0, above 88.72 it is +inf; NaN stays NaN.
_C = {name: float_const(v) for name, v in {
    "lo": -103.97208, "hi": 88.72283, "log2e": 1.44269504088896341, "ln2hi": 0.693359375,
    "ln2lo": -2.12194440e-4, "p0": 1.9875691500e-4, "p1": 1.3981999507e-3, "p2": 8.3334519073e-3,
    "p3": 4.1665795894e-2, "p4": 1.6666665459e-1, "p5": 5.0000001201e-1}.items()}
EXPF_DECLARES = ("declare float @llvm.maxnum.f32(float, float)", "declare float @llvm.minnum.f32(float, float)",
                 "declare float @llvm.floor.f32(float)")
EXPF = f"""define internal float @arke.expf(float %x) alwaysinline {{
entry:
  %lo = fcmp olt float %x, {_C["lo"]}
  %hi = fcmp ogt float %x, {_C["hi"]}
  %c1 = call float @llvm.maxnum.f32(float %x, float {_C["lo"]})
  %xc = call float @llvm.minnum.f32(float %c1, float {_C["hi"]})
  %t = fmul float %xc, {_C["log2e"]}
  %t2 = fadd float %t, 0.5
  %nf = call float @llvm.floor.f32(float %t2)
  %a = fmul float %nf, {_C["ln2hi"]}
  %r1 = fsub float %xc, %a
  %b = fmul float %nf, {_C["ln2lo"]}
  %r = fsub float %r1, %b
  %z = fmul float %r, %r
  %p0 = fmul float %r, {_C["p0"]}
  %p1 = fadd float %p0, {_C["p1"]}
  %p2 = fmul float %p1, %r
  %p3 = fadd float %p2, {_C["p2"]}
  %p4 = fmul float %p3, %r
  %p5 = fadd float %p4, {_C["p3"]}
  %p6 = fmul float %p5, %r
  %p7 = fadd float %p6, {_C["p4"]}
  %p8 = fmul float %p7, %r
  %p9 = fadd float %p8, {_C["p5"]}
  %pa = fmul float %p9, %z
  %pb = fadd float %pa, %r
  %y = fadd float %pb, 1.0
  %n = fptosi float %nf to i32
  %n1 = ashr i32 %n, 1
  %n2 = sub i32 %n, %n1
  %e1 = add i32 %n1, 127
  %e2 = add i32 %n2, 127
  %bits1 = shl i32 %e1, 23
  %bits2 = shl i32 %e2, 23
  %s1 = bitcast i32 %bits1 to float
  %s2 = bitcast i32 %bits2 to float
  %v0 = fmul float %y, %s1
  %v = fmul float %v0, %s2
  %v1 = select i1 %lo, float 0.0, float %v
  %v2 = select i1 %hi, float 0x7FF0000000000000, float %v1
  %nan = fcmp uno float %x, 0.0
  %v3 = select i1 %nan, float %x, float %v2
  ret float %v3
}}"""


def ipow(ct: str) -> str:
    """An integer power by squaring; a negative exponent raises the error flag (as the interpreter does)."""
    return f"""define internal {ct} @"arke.ipow.{ct}"({ct} %a, {ct} %n, ptr %flag) {{
entry:
  %neg = icmp slt {ct} %n, 0
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
  %e2 = ashr {ct} %e, 1
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
    return {"sum": "0", "prod": "1", "max": str(-(2 ** (bits - 1))), "min": str(2 ** (bits - 1) - 1)}[kind]
