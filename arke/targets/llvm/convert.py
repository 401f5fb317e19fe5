"""16-bit float conversions written in LLVM IR integer arithmetic, for every x86/ARM CPU.

LLVM lowers ``fptrunc float to bfloat`` (and, without F16C, every ``half`` conversion) to
compiler-rt calls (``__truncsfbf2``, ``__truncsfhf2``, ``__extendhfsf2``) that a JIT'd module
cannot resolve: on a CPU without AVX512-BF16 the kernel would crash. These functions do the
same conversions exactly (round to nearest even, subnormals, infinities, NaN stays NaN) in
plain integer and float operations, are inlined, and vectorise like the rest of the loop.

* ``f32 -> bf16``: torch's rounding (NaN stays a quiet NaN with its sign);
* ``bf16 -> f32``: exact, a 16-bit shift;
* ``f32 -> f16``: F. Giesen's round-to-nearest-even ``float_to_half_fast3_rtne``;
* ``f16 -> f32``: exact, subnormals renormalised.

:func:`widen` and :func:`narrow` give a function's name and definition for scalars
(``lanes=1``) or ``<lanes x ...>`` vectors (the micro-kernels convert whole vectors). The
16-bit side is the raw bits as ``i16``: kernels store 16-bit floats as ``i16`` and never use
LLVM's ``half``/``bfloat`` types, whose legalisation on CPUs without native support inserts
the same unresolvable calls.
"""

from __future__ import annotations

from arke.ir.dtypes import DType

#: The 16-bit float dtypes, by the names :func:`widen` and :func:`narrow` take.
FLOAT16 = {DType.F16: "half", DType.BF16: "bfloat"}

_BODIES = {
    ("narrow", "bfloat"): """
  %b = bitcast {F} %x to {I32}
  %nan = fcmp uno {F} %x, %x
  %top = lshr {I32} %b, {k16}
  %lsb = and {I32} %top, {k1}
  %r0 = add {I32} %b, {k32767}
  %r = add {I32} %r0, %lsb
  %h0 = lshr {I32} %r, {k16}
  %q = or {I32} %top, {k64}
  %h = select {B} %nan, {I32} %q, {I32} %h0
  %y = trunc {I32} %h to {I16}""",
    ("widen", "bfloat"): """
  %w = zext {I16} %x to {I32}
  %s = shl {I32} %w, {k16}
  %y = bitcast {I32} %s to {F}""",
    ("narrow", "half"): """
  %b = bitcast {F} %x to {I32}
  %sign = and {I32} %b, {k2147483648}
  %a = xor {I32} %b, %sign
  %big = icmp uge {I32} %a, {k1199570944}
  %isnan = icmp ugt {I32} %a, {k2139095040}
  %special = select {B} %isnan, {I32} {k32256}, {I32} {k31744}
  %small = icmp ult {I32} %a, {k947912704}
  %af = bitcast {I32} %a to {F}
  %dn = fadd {F} %af, {half}
  %dnb = bitcast {F} %dn to {I32}
  %sub = sub {I32} %dnb, {k1056964608}
  %odd0 = lshr {I32} %a, {k13}
  %odd = and {I32} %odd0, {k1}
  %n0 = add {I32} %a, {k-939520001}
  %n1 = add {I32} %n0, %odd
  %norm = lshr {I32} %n1, {k13}
  %fin = select {B} %small, {I32} %sub, {I32} %norm
  %o = select {B} %big, {I32} %special, {I32} %fin
  %sg = lshr {I32} %sign, {k16}
  %r = or {I32} %o, %sg
  %y = trunc {I32} %r to {I16}""",
    ("widen", "half"): """
  %h = zext {I16} %x to {I32}
  %em = and {I32} %h, {k32767}
  %o0 = shl {I32} %em, {k13}
  %exp = and {I32} %o0, {k260046848}
  %o1 = add {I32} %o0, {k939524096}
  %inf = icmp eq {I32} %exp, {k260046848}
  %zero = icmp eq {I32} %exp, {k0}
  %o2 = add {I32} %o1, {k939524096}
  %o3 = add {I32} %o1, {k8388608}
  %o3f = bitcast {I32} %o3 to {F}
  %o3n = fsub {F} %o3f, {magic}
  %o3b = bitcast {F} %o3n to {I32}
  %o4 = select {B} %zero, {I32} %o3b, {I32} %o1
  %o5 = select {B} %inf, {I32} %o2, {I32} %o4
  %sg0 = and {I32} %h, {k32768}
  %sg = shl {I32} %sg0, {k16}
  %r = or {I32} %o5, %sg
  %y = bitcast {I32} %r to {F}""",
}

_INTS = (0, 1, 13, 16, 64, 32767, 32768, 31744, 32256, 8388608, 260046848, 939524096, 947912704, 1056964608,
         1199570944, 2139095040, 2147483648, -939520001)


def _function(direction: str, kind: str, lanes: int) -> tuple[str, str]:
    def ty(t: str) -> str:
        return t if lanes == 1 else f"<{lanes} x {t}>"

    def const(t: str, v: str) -> str:
        return v if lanes == 1 else f"splat ({t} {v})"

    names = {"F": ty("float"), "I32": ty("i32"), "I16": ty("i16"), "B": ty("i1"),
             "half": const("float", "5.000000e-01"), "magic": const("float", "0x3F10000000000000")}
    names.update({f"k{v}": const("i32", str(v)) for v in _INTS})
    short = {"bfloat": "bf16", "half": "f16"}[kind]
    suffix = "" if lanes == 1 else f".v{lanes}"
    name = f"@arke.{short}_to_f32{suffix}" if direction == "widen" else f"@arke.f32_to_{short}{suffix}"
    src, dst = (names["I16"], names["F"]) if direction == "widen" else (names["F"], names["I16"])
    text = _BODIES[(direction, kind)].format(**names)
    return name, f"define internal {dst} {name}({src} %x) alwaysinline {{\nentry:{text}\n  ret {dst} %y\n}}"


def widen(kind: str, lanes: int = 1) -> tuple[str, str]:
    """``(name, definition)`` of the exact ``kind`` (``"bfloat"``/``"half"``) bits (``i16``) to float conversion."""
    return _function("widen", kind, lanes)


def narrow(kind: str, lanes: int = 1) -> tuple[str, str]:
    """``(name, definition)`` of the round-to-nearest-even float to ``kind`` bits (``i16``) conversion."""
    return _function("narrow", kind, lanes)
