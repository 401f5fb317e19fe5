"""Scalar expressions of the CUDA-C target: SemanticIR as C statements, with the interpreter's semantics.

:class:`CExpr` emits one ``const T tN = ...;`` per sub-expression into the current block and
returns the variable's name; values are held in their compute type (``float`` for 16-bit
floats, ``bool`` for bools, the integer type otherwise) and converted only where
:mod:`arke.runtime.interp` converts, as :class:`arke.targets.mlir.body.Body` does:

* 16-bit floats are stored as ``unsigned short`` bits and converted by :data:`CONVERT`'s
  integer code (NVRTC has no ``cuda_fp16.h`` here); rounding is to nearest even, as torch's;
* integer arithmetic wraps (done in the unsigned type: signed overflow is undefined in C),
  ``div``/``mod`` are Python's floor forms, and a zero divisor or a negative integer exponent
  sets the error flag instead of trapping;
* ``max``/``min`` propagate NaN; float math comes from CUDA's libdevice (``expf``, ``erff`` ...),
  which NVRTC links by itself.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

from arke.ir import semantic as ir
from arke.ir.dtypes import DType, promote
from arke.targets.artifact import UnsupportedError
from arke.targets.literals import float_literal
from arke.targets.turns import CHUNKS

#: The C type a value is computed in.
COMPUTE = {DType.F32: "float", DType.F16: "float", DType.BF16: "float", DType.I64: "long long", DType.I32: "int",
           DType.I8: "signed char", DType.BOOL: "bool", DType.U8: "unsigned char", DType.U16: "unsigned short",
           DType.U32: "unsigned int"}
#: The C type a tensor's elements are stored in (16-bit floats as bits, bools as bytes): the ABI.
STORAGE = {DType.F32: "float", DType.F16: "unsigned short", DType.BF16: "unsigned short", DType.I64: "long long",
           DType.I32: "int", DType.I8: "signed char", DType.BOOL: "unsigned char", DType.U8: "unsigned char",
           DType.U16: "unsigned short", DType.U32: "unsigned int"}
#: The unsigned type integer arithmetic wraps in (at least ``unsigned int`` for 16-bit types: an
#: ``unsigned short`` would promote to ``int``, and 65535 * 65535 overflows it).
UNSIGNED = {DType.I64: "unsigned long long", DType.I32: "unsigned int", DType.I8: "unsigned char",
            DType.U8: "unsigned int", DType.U16: "unsigned int", DType.U32: "unsigned int"}
_BITS = {DType.I64: 64, DType.I32: 32, DType.I8: 8, DType.U8: 8, DType.U16: 16, DType.U32: 32}
_BITWISE = {"bitand": "&", "bitor": "|", "bitxor": "^"}
_HALF = {DType.F16: "f16", DType.BF16: "bf16"}
_MATH = {"exp": "expf", "log": "logf", "sqrt": "sqrtf", "tanh": "tanhf", "erf": "erff", "floor": "floorf",
         "ceil": "ceilf", "exp2": "exp2f", "log2": "log2f", "abs": "fabsf"}
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}

#: Plain C shared by host and device (NVRTC compiles it with ``-default-device``; the tests compile
#: it with gcc and compare it with torch bit for bit): float bits, and 16-bit float conversions.
CONVERT = r"""
static inline unsigned int ak_bits(float f) { union { float f; unsigned int u; } v; v.f = f; return v.u; }
static inline float ak_float(unsigned int u) { union { float f; unsigned int u; } v; v.u = u; return v.f; }
static inline float ak_bf16_to_f32(unsigned short h) { return ak_float((unsigned int)h << 16); }
static inline unsigned short ak_f32_to_bf16(float f) {
  unsigned int x = ak_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (unsigned short)0x7FC0u; /* NaN, as torch makes it */
  return (unsigned short)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16); /* ties to even */
}
static inline float ak_f16_to_f32(unsigned short h) {
  unsigned int sign = ((unsigned int)h & 0x8000u) << 16, e = ((unsigned int)h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1Fu) return ak_float(sign | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0u)); /* NaN made quiet */
  if (e != 0u) return ak_float(sign | ((e + 112u) << 23) | (m << 13));
  /* zero or a subnormal: m × 2**-24, exact in f32 (no normalising loop: it costs registers) */
  const float v = (float)m * 5.9604644775390625e-8f;
  return sign ? -v : v;
}
static inline unsigned short ak_f32_to_f16(float f) {
  unsigned int x = ak_bits(f), sign = (x >> 16) & 0x8000u, mag = x & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return (unsigned short)(sign | 0x7E00u | ((mag >> 13) & 0x3FFu));
  if (mag >= 0x47800000u) return (unsigned short)(sign | 0x7C00u); /* 2**16 and over: inf */
  if (mag < 0x38800000u) { /* under 2**-14: a subnormal, in units of 2**-24, ties to even */
    if (mag <= 0x33000000u) return (unsigned short)sign;
    unsigned int m = (mag & 0x7FFFFFu) | 0x800000u, shift = 126u - (mag >> 23);
    unsigned int r = m >> shift, rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (r & 1u))) r += 1u;
    return (unsigned short)(sign | r);
  }
  unsigned int r = mag - 0x38000000u; /* rebias the exponent; a carry out of 65504 gives inf */
  return (unsigned short)(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
}
"""

#: Device helpers (C++ templates): Python's integer division, checked subscripts, NaN-aware max/min.
HELPERS = r"""
template <typename T> static inline T ak_floordiv(T a, T b, bool* err) {
  if (b == 0) { *err = true; b = 1; }
  if (b == -1) return (T)(0ull - (unsigned long long)a); /* MIN / -1 wraps */
  T q = a / b, r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? (T)(q - 1) : q;
}
template <typename T> static inline T ak_mod(T a, T b, bool* err) {
  if (b == 0) { *err = true; b = 1; }
  if (b == -1) return 0;
  T r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r;
}
template <typename T> static inline T ak_udiv(T a, T b, bool* err) {
  if (b == 0) { *err = true; b = 1; }
  return (T)(a / b); /* unsigned: floor division is division */
}
template <typename T> static inline T ak_umod(T a, T b, bool* err) {
  if (b == 0) { *err = true; b = 1; }
  return (T)(a % b);
}
static inline int ak_shift_count(long long c, int bits, bool* err) {
  if (c < 0 || c >= bits) { *err = true; return 0; } /* checked, never masked */
  return (int)c;
}
template <typename T> static inline T ak_ipow(T a, T b, bool* err) {
  if (b < 0) { *err = true; return 0; }
  unsigned long long r = 1ull, base = (unsigned long long)(long long)a, e = (unsigned long long)(long long)b;
  while (e) { if (e & 1ull) r *= base; base *= base; e >>= 1; }
  return (T)r; /* wraps as the type does: the low bits of the 64-bit product */
}
static inline long long ak_check(long long v, long long n, bool* err) {
  if (v < 0 || v >= n) { *err = true; return 0; } /* clamped: never a wild read */
  return v;
}
static inline long long ak_fdiv_dim(long long a, long long b) { long long q = a / b; return (a % b < 0) ? q - 1 : q; }
static inline long long ak_mod_dim(long long a, long long b) { long long r = a % b; return r < 0 ? r + b : r; }
static inline float ak_fmax(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }
static inline float ak_fmin(float a, float b) { return (a != a || b != b) ? a + b : fminf(a, b); }
static inline float ak_fmod(float a, float b) {
  float r = fmodf(a, b); /* exact; then moved into the divisor's sign, as Python's % (a zero takes b's sign) */
  return r == 0.0f ? copysignf(0.0f, b) : ((r < 0.0f) != (b < 0.0f)) ? r + b : r;
}
"""


#: ``ak_sin``/``ak_cos``: the turn ``|x| / 2π`` modulo 1 summed from exact f64 products with 1/(2π)'s 24-bit
#: chunks (:mod:`arke.targets.turns`), centred on [-1/2, 1/2]; sinpi/cospi of twice it, in f64.
TRIG = "static inline double ak_turn(float x) {\n  double a = fabs((double)x), t = 0.0, p;\n" + "".join(
    f"  p = a * {c.hex()}; t += p - floor(p);\n" for c in reversed(CHUNKS)) + r"""  t -= floor(t);
  return t > 0.5 ? t - 1.0 : t;
}
static inline float ak_sin(float x) { return (float)sinpi(2.0 * ak_turn(x) * copysign(1.0, (double)x)); }
static inline float ak_cos(float x) { return (float)cospi(2.0 * ak_turn(x)); }
"""


def c_float(value: float, dtype: DType = DType.F32) -> str:
    """An exact C ``float`` literal of ``value`` as a constant of ``dtype`` holds it (16-bit: rounded)."""
    bits = int(float_literal(value, dtype), 16)
    f = struct.unpack("<f", struct.pack("<I", bits))[0]
    return f"{f.hex()}f" if math.isfinite(f) else f"ak_float({bits:#010x}u)"


def c_int(value: int, dtype: DType) -> str:
    """A C literal of integer ``value`` in ``dtype`` (the most negative one written so C parses it)."""
    ty = COMPUTE[dtype]
    if dtype is DType.BOOL:
        return "true" if value else "false"
    if value == -(2 ** (_BITS[dtype] - 1)):
        return f"(({ty})({value + 1}LL - 1))"
    return f"(({ty}){value}LL)"


def identity(kind: str, dtype: DType) -> str:
    """The C value of an empty reduction of ``kind`` in ``dtype`` (the interpreter's identities)."""
    if dtype.is_bool:
        return "false" if kind in ("sum", "max") else "true"
    if dtype.is_float:
        return c_float({"sum": 0.0, "prod": 1.0, "max": -math.inf, "min": math.inf}[kind])
    bits = _BITS[dtype]
    if dtype.is_unsigned:
        return c_int({"sum": 0, "prod": 1, "max": 0, "min": 2 ** bits - 1}[kind], dtype)
    return c_int({"sum": 0, "prod": 1, "max": -(2 ** (bits - 1)), "min": 2 ** (bits - 1) - 1}[kind], dtype)


class CExpr:
    """Emits C statements for scalar expressions. ``index(name)``: the C variable of an axis;
    ``dim(d)``: a ``long long`` C expression of a dim; ``load(e)``: the raw stored element of a
    load (its subscripts checked); ``emit(line)``: adds a statement to the current block."""

    def __init__(self, emit: Callable[[str], None], index: Callable[[str], str],
                 dim: Callable[[ir.DimRef], str], load: Callable[[ir.Load], str]):
        self.emit, self.index, self.dim, self.raw_load = emit, index, dim, load
        self.n = 0
        self.scopes: list[dict[ir.SExpr, str]] = [{}]

    def let(self, ty: str, rhs: str) -> str:
        """``const ty tN = rhs;``; returns ``tN``."""
        self.n += 1
        name = f"t{self.n}"
        self.emit(f"const {ty} {name} = {rhs};")
        return name

    def push(self) -> None:
        """Enter a block: values computed in it are not reused after it ends."""
        self.scopes.append({})

    def pop(self) -> None:
        self.scopes.pop()

    # -- conversions
    def widen(self, raw: str, dtype: DType) -> str:
        """A stored element in its compute type."""
        if dtype in _HALF:
            return self.let("float", f"ak_{_HALF[dtype]}_to_f32({raw})")
        if dtype is DType.BOOL:
            return self.let("bool", f"{raw} != 0")
        return raw

    def narrow(self, v: str, dtype: DType) -> str:
        """A compute-type value in its storage type (16-bit floats rounded to nearest even)."""
        if dtype in _HALF:
            return f"ak_f32_to_{_HALF[dtype]}({v})"
        if dtype is DType.BOOL:
            return f"(unsigned char){v}"
        return v

    def round_to(self, v: str, dtype: DType) -> str:
        """``v`` (float) rounded to ``dtype`` when it is a 16-bit float, still a float."""
        if dtype not in _HALF:
            return v
        h = _HALF[dtype]
        return self.let("float", f"ak_{h}_to_f32(ak_f32_to_{h}({v}))")

    def convert(self, v: str, src: DType, dst: DType) -> str:
        """``v`` (compute type of ``src``) as ``dst``'s compute type, as the interpreter's ``.to`` does."""
        if src == dst:
            return v
        if dst.is_bool:
            return self.let("bool", f"{v} != 0")
        if src.is_float and dst.is_float:
            return self.round_to(v, dst)
        if src.is_float:  # through long long, saturating (NaN is 0), then wrapped, as the interpreter (C: no UB)
            wide = self.let("long long", f"({v} != {v} ? 0LL : {v} >= 9223372036854775808.0f ? 9223372036854775807LL"
                                         f" : {v} < -9223372036854775808.0f ? -9223372036854775807LL - 1"
                                         f" : (long long){v})")
            return wide if COMPUTE[dst] == "long long" else self.let(COMPUTE[dst], f"({COMPUTE[dst]}){wide}")
        return self.round_to(self.let(COMPUTE[dst], f"({COMPUTE[dst]}){v}"), dst)

    def value(self, e: ir.SExpr, as_type: DType | None = None) -> str:
        """``e`` in the compute type of ``as_type`` (default: its own dtype)."""
        for scope in reversed(self.scopes):
            if e in scope:
                v = scope[e]
                break
        else:
            v = getattr(self, f"_x_{type(e).__name__}")(e)
            self.scopes[-1][e] = v
        return self.convert(v, e.dtype, as_type) if as_type is not None else v

    # -- leaves
    def _x_Const(self, e: ir.Const) -> str:
        if e.dtype.is_float:
            return c_float(float(e.value), e.dtype)
        return c_int(int(e.value), e.dtype)

    def _x_Idx(self, e: ir.Idx) -> str:
        return self.convert(self.index(e.name), DType.I64, e.dtype)

    def _x_DimRef(self, e: ir.DimRef) -> str:
        return self.convert(self.dim(e), DType.I64, e.dtype)

    def _x_Load(self, e: ir.Load) -> str:
        return self.widen(self.raw_load(e), e.dtype)

    def _x_Cast(self, e: ir.Cast) -> str:
        x = self.value(e.x)
        if e.dtype in _HALF:  # an explicit cast to a 16-bit float rounds at once
            return self.round_to(self.convert(x, e.x.dtype, DType.F32), e.dtype)
        return self.convert(x, e.x.dtype, e.dtype)

    def _x_Select(self, e: ir.Select) -> str:
        c = self.value(e.cond, DType.BOOL)
        a, b = self.value(e.a, e.dtype), self.value(e.b, e.dtype)
        return self.let(COMPUTE[e.dtype], f"{c} ? {a} : {b}")

    # -- operators
    def _x_Unary(self, e: ir.Unary) -> str:
        x = self.value(e.x, e.dtype)
        ty, op = COMPUTE[e.dtype], e.op
        if op == "not":
            return self.let("bool", f"!{x}")
        if op == "bitnot":
            return self.let(ty, f"({ty})(~({UNSIGNED[e.dtype]}){x})")
        if e.dtype.is_unsigned and op in ("abs", "relu"):
            return x  # never negative
        if not e.dtype.is_float:
            u = UNSIGNED.get(e.dtype)
            if op == "neg" and u:
                return self.let(ty, f"({ty})(({u})0 - ({u}){x})")
            if op == "abs" and u:
                return self.let(ty, f"{x} < 0 ? ({ty})(({u})0 - ({u}){x}) : {x}")
            if op == "relu":
                return self.let(ty, f"{x} > 0 ? {x} : ({ty})0")
            if op in ("floor", "ceil"):
                return x
            raise UnsupportedError(f"cuda: unary `{op}` on {e.dtype.value}")
        if op == "neg":
            return self.let(ty, f"-({x})")
        if op in _MATH:
            return self.let(ty, f"{_MATH[op]}({x})")
        if op in ("sin", "cos"):
            # sinf/cosf keep a Payne-Hanek reduction in local memory (a 32-byte stack: "spills"): the
            # turn of x reduced exactly in f64 instead (TRIG below), then sinpi/cospi of twice it
            return self.let(ty, f"ak_{op}({x})")
        if op == "rsqrt":  # 1 / sqrt, correctly rounded twice (rsqrtf is 2 ulp off)
            return self.let(ty, f"1.0f / sqrtf({x})")
        if op == "relu":
            return self.let(ty, f"ak_fmax({x}, 0.0f)")
        if op == "sigmoid":
            return self.let(ty, f"1.0f / (1.0f + expf(-({x})))")
        if op == "silu":
            return self.let(ty, f"{x} / (1.0f + expf(-({x})))")
        if op == "gelu":  # x / 2 * (1 + erf(x / sqrt(2))): the exact form
            return self.let(ty, f"({x} * 0.5f) * (1.0f + erff({x} * {c_float(math.sqrt(0.5))}))")
        raise UnsupportedError(f"cuda: unary `{op}` on floats")

    def _x_Binary(self, e: ir.Binary) -> str:
        op = e.op
        if op in _COMPARE:
            ct = promote(e.a.dtype, e.b.dtype).compute
            a, b = self.value(e.a, ct), self.value(e.b, ct)
            return self.let("bool", f"{a} {_COMPARE[op]} {b}")
        if op in ir.SHIFTS:
            return self.shift(op, self.value(e.a, e.dtype), self.value(e.b, DType.I64), e.dtype)
        a, b = self.value(e.a, e.dtype), self.value(e.b, e.dtype)
        ty = COMPUTE[e.dtype]
        if e.dtype.is_bool:
            table = {"and": "&&", "or": "||", "max": "||", "min": "&&", "add": "||", "mul": "&&", "ne": "!="}
            if op not in table:
                raise UnsupportedError(f"cuda: binary `{op}` on bools")
            return self.let(ty, f"{a} {table[op]} {b}")
        if e.dtype.is_float:
            return self.let(ty, self.float_binary(op, a, b))
        return self.let(ty, self.int_binary(op, a, b, e.dtype))

    def float_binary(self, op: str, a: str, b: str) -> str:
        """The C expression of float ``a op b``."""
        simple = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
        if op in simple:
            return f"{a} {simple[op]} {b}"
        calls = {"max": "ak_fmax", "min": "ak_fmin", "pow": "powf", "mod": "ak_fmod"}
        if op in calls:
            return f"{calls[op]}({a}, {b})"
        if op == "floordiv":
            return f"floorf({a} / {b})"
        raise UnsupportedError(f"cuda: binary `{op}` on floats")

    def shift(self, op: str, a: str, count: str, dtype: DType) -> str:
        """``a << count`` (in the unsigned type: no UB) or ``a >> count`` (C's ``>>``: arithmetic on the
        signed types with nvcc and gcc, logical on unsigned ones); a count out of range flags."""
        ty, u = COMPUTE[dtype], UNSIGNED[dtype]
        n = self.let("int", f"ak_shift_count({count}, {_BITS[dtype]}, &ak_err)")
        if op == "shl":
            return self.let(ty, f"({ty})(({u}){a} << {n})")
        return self.let(ty, f"({ty})({a} >> {n})")

    def int_binary(self, op: str, a: str, b: str, dtype: DType) -> str:
        """The C expression of integer ``a op b``, wrapping at ``dtype``'s width."""
        ty, u = COMPUTE[dtype], UNSIGNED[dtype]
        simple = {"add": "+", "sub": "-", "mul": "*", **_BITWISE}
        if op in simple:
            return f"({ty})(({u}){a} {simple[op]} ({u}){b})"
        if dtype.is_unsigned and op in ("div", "floordiv", "mod"):
            return f"ak_{'umod' if op == 'mod' else 'udiv'}<{ty}>({a}, {b}, &ak_err)"
        if op in ("max", "min"):
            return f"{a} {'>' if op == 'max' else '<'} {b} ? {a} : {b}"
        if op in ("div", "floordiv"):
            return f"ak_floordiv<{ty}>({a}, {b}, &ak_err)"
        if op == "mod":
            return f"ak_mod<{ty}>({a}, {b}, &ak_err)"
        if op == "pow":
            return f"ak_ipow<{ty}>({a}, {b}, &ak_err)"
        raise UnsupportedError(f"cuda: binary `{op}` on {dtype.value}")

    def combine(self, kind: str, dtype: DType, acc: str, term: str) -> str:
        """The C expression of ``acc`` combined with ``term`` by reduction ``kind``."""
        if dtype.is_bool:
            return f"{acc} {'||' if kind in ('sum', 'max') else '&&'} {term}"
        if dtype.is_float:
            if kind in ("sum", "prod"):
                return f"{acc} {'+' if kind == 'sum' else '*'} {term}"
            return f"ak_f{kind}({acc}, {term})"
        return self.int_binary({"sum": "add", "prod": "mul"}.get(kind, kind), acc, term, dtype)
