"""Scalar bodies in MLIR: SemanticIR expressions as ``arith``/``math`` ops inside a ``linalg.generic`` region.

:class:`Body` emits one region's instructions. Values are held in their compute type
(``f32`` for 16-bit floats, ``i1`` for bools, the integer type otherwise) and converted only
where the interpreter converts (see :mod:`arke.runtime.interp`): operands go to the result's
compute type, comparisons to the promoted type, explicit casts to 16-bit floats round at once.
Loads come from the region's block arguments (operands read through indexing maps) or, for
computed subscripts, from ``tensor.extract`` on a tensor captured from the function with
every subscript checked: a bad one is clamped (never a wild read) and its ``i1`` "ok" flag is
kept in :attr:`Body.flags`, as is every integer divisor's ``!= 0``, so a check op can report it.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass

from arke.ir import semantic as ir
from arke.ir.dtypes import DType, promote
from arke.targets.artifact import UnsupportedError
from arke.targets.literals import float_literal
from arke.targets.turns import CHUNKS

#: The MLIR type a value is computed in (16-bit floats compute in f32, bools are i1).
COMPUTE = {DType.BOOL: "i1", DType.I8: "i8", DType.I32: "i32", DType.I64: "i64", DType.U8: "i8", DType.U16: "i16",
           DType.U32: "i32", DType.F16: "f32", DType.BF16: "f32", DType.F32: "f32"}
#: The MLIR element type a tensor is stored in (16-bit floats as their bits, bools as bytes): the ABI.
# MLIR's integers are signless: unsigned types are the same integers, read by the unsigned ops
# (cmpi ult, divui, remui, extui, uitofp, shrui, maxui).
STORAGE = {DType.BOOL: "i8", DType.I8: "i8", DType.I32: "i32", DType.I64: "i64", DType.U8: "i8", DType.U16: "i16",
           DType.U32: "i32", DType.F16: "i16", DType.BF16: "i16", DType.F32: "f32"}
_BITWISE = {"bitand": "arith.andi", "bitor": "arith.ori", "bitxor": "arith.xori"}
_HALF = {DType.F16: "f16", DType.BF16: "bf16"}
_FCMP = {"eq": "oeq", "ne": "une", "lt": "olt", "le": "ole", "gt": "ogt", "ge": "oge"}
_ICMP = {"eq": "eq", "ne": "ne", "lt": "slt", "le": "sle", "gt": "sgt", "ge": "sge"}
_UCMP = {"eq": "eq", "ne": "ne", "lt": "ult", "le": "ule", "gt": "ugt", "ge": "uge"}
_MATH = {"exp": "math.exp", "log": "math.log", "sqrt": "math.sqrt", "rsqrt": "math.rsqrt", "tanh": "math.tanh",
         "erf": "math.erf", "exp2": "math.exp2", "log2": "math.log2", "floor": "math.floor", "ceil": "math.ceil",
         "abs": "math.absf"}


def safe_divisor(e: ir.Binary) -> bool:
    """Whether an integer ``div``/``mod``/``pow``/shift needs no check: a literal nonzero divisor, an
    exponent >= 0, or a shift count in ``0 <= c < width``."""
    if not isinstance(e.b, ir.Const) or isinstance(e.b.value, float):
        return False
    if e.op in ir.SHIFTS:
        return 0 <= int(e.b.value) < e.dtype.bits
    return int(e.b.value) >= 0 if e.op == "pow" else int(e.b.value) != 0


def hazardous(e: ir.SExpr) -> bool:
    """Whether ``e`` is an integer division, modulo, power or shift whose divisor, exponent or count is checked."""
    return (isinstance(e, ir.Binary) and e.op in ("div", "floordiv", "mod", "pow", "shl", "shr")
            and COMPUTE[e.dtype] not in ("f32", "i1") and not safe_divisor(e)
            and not (e.op == "pow" and e.dtype.is_unsigned))


@dataclass(frozen=True)
class Source:
    """Where a load reads from: a block argument (an operand through its indexing map), or a
    captured tensor read with ``tensor.extract`` at computed subscripts."""

    arg: str | None = None  # the block argument holding the element (storage type)
    tensor: str | None = None  # the function-level tensor to extract from
    tensor_type: str = ""
    extents: tuple[str, ...] = ()  # its dims, as i64 SSA values from above (for the range checks)
    checked: tuple[bool, ...] = ()  # which subscripts need a range check (not a loop of the same extent)


class Body:
    """The instructions of one region. ``index(name)``: the i64 value of a loop index (or a split
    axis's recombined value); ``dim(d)``: an i64 dim value from above; ``source(load)``: where a
    load reads; ``flags``: the ok-flags of checked subscripts and divisors, in order."""

    def __init__(self, index: Callable[[str], str], dim: Callable[[ir.DimRef], str],
                 source: Callable[[ir.Load], Source], prefix: str):
        self.index, self.dim, self.source = index, dim, source
        self.lines: list[str] = []
        self.flags: list[str] = []
        self.prefix = prefix
        self._n = 0
        self._memo: dict[tuple[object, str], str] = {}

    # ------------------------------------------------------------ plumbing

    def let(self, rhs: str) -> str:
        v = f"%{self.prefix}{self._n}"
        self._n += 1
        self.lines.append(f"{v} = {rhs}")
        return v

    def const(self, value: float | int | bool, ty: str) -> str:
        key = (("const", value, type(value)), ty)
        if key not in self._memo:
            if ty == "i1":
                text = "true" if value else "false"
                self._memo[key] = self.let(f"arith.constant {text}")
            elif ty == "f32":
                self._memo[key] = self.let(f"arith.constant {float_literal(float(value))} : f32")
            elif ty == "f64":  # an infinity or NaN as its bits (MLIR has no literal word for them)
                text = repr(float(value)) if math.isfinite(value) else \
                    f"0x{struct.unpack('<Q', struct.pack('<d', float(value)))[0]:016X}"
                self._memo[key] = self.let(f"arith.constant {text} : f64")
            else:
                self._memo[key] = self.let(f"arith.constant {int(value)} : {ty}")
        return self._memo[key]

    # ------------------------------------------------------------ conversions

    def load_value(self, raw: str, dtype: DType) -> str:
        """A stored element in its compute type (16-bit bits widened to f32, bool bytes to i1)."""
        if dtype in _HALF:
            h = self.let(f"arith.bitcast {raw} : i16 to {_HALF[dtype]}")
            return self.let(f"arith.extf {h} : {_HALF[dtype]} to f32")
        if dtype is DType.BOOL:
            return self.let(f"arith.cmpi ne, {raw}, {self.const(0, 'i8')} : i8")
        return raw

    def store_value(self, v: str, dtype: DType) -> str:
        """A compute-type value of ``dtype`` in its storage type (16-bit floats rounded to nearest even).

        Rounded on the bits first (:meth:`round_half`): where IREE fuses this store into the op that reads it
        back, the bitcasts cancel and ``extf(truncf(x))`` folds to ``x``; of a value already rounded that is
        still the rounded value."""
        if dtype in _HALF:
            h = self.let(f"arith.truncf {self.round_half(v, dtype)} : f32 to {_HALF[dtype]}")
            return self.let(f"arith.bitcast {h} : {_HALF[dtype]} to i16")
        if dtype is DType.BOOL:
            return self.let(f"arith.extui {v} : i1 to i8")
        return v

    def convert(self, v: str, src: DType, dst: DType) -> str:
        """``v`` (compute type of ``src``) as the compute type of ``dst``, as the interpreter's ``.to`` does."""
        a, b = COMPUTE[src], COMPUTE[dst]
        if dst is DType.BOOL and src is not DType.BOOL:
            if a == "f32":
                return self.let(f"arith.cmpf une, {v}, {self.const(0.0, 'f32')} : f32")
            return self.let(f"arith.cmpi ne, {v}, {self.const(0, a)} : {a}")
        if a == b:
            return v
        if src is DType.BOOL:
            return self.let(f"arith.uitofp {v} : i1 to f32") if b == "f32" else self.let(f"arith.extui {v} : i1 to {b}")
        if a == "f32":  # through i64, saturating (NaN is 0), then wrapped, as the interpreter converts
            big = self.const(2.0 ** 63, "f32")
            top = self.let(f"arith.cmpf oge, {v}, {big} : f32")
            low = self.let(f"arith.cmpf olt, {v}, {self.const(-2.0 ** 63, 'f32')} : f32")
            bad = self.let(f"arith.ori {top}, {low} : i1")
            bad = self.let(f"arith.ori {bad}, {self.let(f'arith.cmpf uno, {v}, {v} : f32')} : i1")
            safe = self.let(f"arith.select {bad}, {self.const(0.0, 'f32')}, {v} : f32")
            wide = self.let(f"arith.fptosi {safe} : f32 to i64")
            wide = self.let(f"arith.select {top}, {self.const(2 ** 63 - 1, 'i64')}, {wide} : i64")
            wide = self.let(f"arith.select {low}, {self.const(-2 ** 63, 'i64')}, {wide} : i64")
            return wide if b == "i64" else self.let(f"arith.trunci {wide} : i64 to {b}")
        if b == "f32":
            return self.let(f"arith.{'uitofp' if src.is_unsigned else 'sitofp'} {v} : {a} to f32")
        if int(b[1:]) > int(a[1:]):
            return self.let(f"arith.{'extui' if src.is_unsigned else 'extsi'} {v} : {a} to {b}")
        return self.let(f"arith.trunci {v} : {a} to {b}")

    def value(self, e: ir.SExpr, as_type: DType | None = None) -> str:
        """``e`` in the compute type of ``as_type`` (default: its own dtype)."""
        v = self._expr(e)
        return self.convert(v, e.dtype, as_type) if as_type is not None else v

    # ------------------------------------------------------------ expressions

    def _expr(self, e: ir.SExpr) -> str:
        key = (e, "expr")
        if key in self._memo:
            return self._memo[key]
        out = getattr(self, f"_x_{type(e).__name__}")(e)
        self._memo[key] = out
        return out

    def _x_Const(self, e: ir.Const) -> str:
        ty = COMPUTE[e.dtype]
        if ty == "f32":
            key = (("fconst", float(e.value), e.dtype), ty)
            if key not in self._memo:
                self._memo[key] = self.let(f"arith.constant {float_literal(float(e.value), e.dtype)} : f32")
            return self._memo[key]
        return self.const(bool(e.value) if ty == "i1" else int(e.value), ty)

    def _x_Idx(self, e: ir.Idx) -> str:
        return self.convert(self.index(e.name), DType.I64, e.dtype)

    def _x_DimRef(self, e: ir.DimRef) -> str:
        return self.convert(self.dim(e), DType.I64, e.dtype)

    def _x_Load(self, e: ir.Load) -> str:
        src = self.source(e)
        if src.arg is not None:
            return self.load_value(src.arg, e.dtype)
        subs = []
        for s, extent, checked in zip(e.indices, src.extents, src.checked):
            v = self.value(s, DType.I64)
            if checked:
                v = self.in_range(v, extent)
            subs.append(self.let(f"arith.index_cast {v} : i64 to index"))
        raw = self.let(f"tensor.extract {src.tensor}[{', '.join(subs)}] : {src.tensor_type}")
        return self.load_value(raw, e.dtype)

    def in_range(self, v: str, extent: str) -> str:
        """``v`` if ``0 <= v < extent``, else 0 with a false flag kept in :attr:`flags` (never a wild read)."""
        key = (("range", v, extent), "i64")
        if key not in self._memo:
            ge = self.let(f"arith.cmpi sge, {v}, {self.const(0, 'i64')} : i64")
            lt = self.let(f"arith.cmpi slt, {v}, {extent} : i64")
            ok = self.let(f"arith.andi {ge}, {lt} : i1")
            self.flags.append(ok)
            self._memo[key] = self.let(f"arith.select {ok}, {v}, {self.const(0, 'i64')} : i64")
        return self._memo[key]

    def _x_Cast(self, e: ir.Cast) -> str:
        x = self._expr(e.x)
        if e.dtype in _HALF:  # an explicit cast to a 16-bit float rounds now
            return self.round_half(self.convert(x, e.x.dtype, DType.F32), e.dtype)
        return self.convert(x, e.x.dtype, e.dtype)

    def round_half(self, v: str, dtype: DType) -> str:
        """``v`` (f32) rounded to the nearest ``dtype`` value (ties to even), still held in f32.

        Done on the bits: IREE's codegen folds ``extf(truncf(x))`` to ``x``, which would drop
        exactly the rounding the cast asks for."""
        i = lambda n: self.const(n, "i32")  # noqa: E731
        bits = self.let(f"arith.bitcast {v} : f32 to i32")
        mag = self.let(f"arith.andi {bits}, {i(0x7FFFFFFF)} : i32")
        sign = self.let(f"arith.andi {bits}, {i(-0x80000000)} : i32")
        special = self.let(f"arith.cmpi uge, {mag}, {i(0x7F800000)} : i32")  # inf and NaN stay as they are
        if dtype is DType.BF16:
            rounded = self._drop_bits(mag, i(16))
        else:
            # f16 keeps 10 fraction bits down to 2**-14, then a fixed quantum of 2**-24 (subnormals):
            # 13 bits dropped from a normal, 126 - exponent below; under 2**-24 it is 0 or 2**-24.
            exp = self.let(f"arith.shrui {mag}, {i(23)} : i32")
            below = self.let(f"arith.subi {i(126)}, {exp} : i32")
            shift = self.let(f"arith.maxsi {below}, {i(13)} : i32")
            shift = self.let(f"arith.minsi {shift}, {i(23)} : i32")
            kept = self._drop_bits(mag, shift)
            tiny = self.let(f"arith.cmpi ult, {mag}, {i(0x33800000)} : i32")  # under 2**-24
            over_half = self.let(f"arith.cmpi ugt, {mag}, {i(0x33000000)} : i32")  # over 2**-25
            least = self.let(f"arith.select {over_half}, {i(0x33800000)}, {i(0)} : i32")
            kept = self.let(f"arith.select {tiny}, {least}, {kept} : i32")
            huge = self.let(f"arith.cmpi ugt, {kept}, {i(0x477FE000)} : i32")  # past 65504: inf
            rounded = self.let(f"arith.select {huge}, {i(0x7F800000)}, {kept} : i32")
        signed = self.let(f"arith.ori {sign}, {rounded} : i32")
        out = self.let(f"arith.select {special}, {bits}, {signed} : i32")
        return self.let(f"arith.bitcast {out} : i32 to f32")

    def _drop_bits(self, mag: str, shift: str) -> str:
        """A non-negative float's bits with the low ``shift`` bits rounded off, ties to even."""
        one = self.const(1, "i32")
        lsb = self.let(f"arith.shrui {mag}, {shift} : i32")
        lsb = self.let(f"arith.andi {lsb}, {one} : i32")
        unit = self.let(f"arith.shli {one}, {shift} : i32")
        half = self.let(f"arith.shrui {unit}, {one} : i32")
        bias = self.let(f"arith.subi {half}, {one} : i32")
        up = self.let(f"arith.addi {mag}, {bias} : i32")
        up = self.let(f"arith.addi {up}, {lsb} : i32")
        mask = self.let(f"arith.subi {self.const(0, 'i32')}, {unit} : i32")
        return self.let(f"arith.andi {up}, {mask} : i32")

    def _x_Select(self, e: ir.Select) -> str:
        c = self.value(e.cond, DType.BOOL)
        a, b = self.value(e.a, e.dtype), self.value(e.b, e.dtype)
        return self.let(f"arith.select {c}, {a}, {b} : {COMPUTE[e.dtype]}")

    def _x_Unary(self, e: ir.Unary) -> str:
        x = self.value(e.x, e.dtype)
        ty = COMPUTE[e.dtype]
        op = e.op
        if ty != "f32":
            return self._int_unary(op, x, ty, e.dtype.is_unsigned)
        if op == "neg":
            return self.let(f"arith.negf {x} : f32")
        if op == "exp2":  # IREE's f32 exp2 is exp(x ln 2): 2x the tolerance off past |x| = 20; f64 is exact enough
            w = self.let(f"math.exp2 {self.let(f'arith.extf {x} : f32 to f64')} : f64")
            return self.let(f"arith.truncf {w} : f64 to f32")
        if op in _MATH:
            return self.let(f"{_MATH[op]} {x} : f32")
        if op in ("sin", "cos"):
            return self._periodic(op, x)
        if op == "relu":
            return self.let(f"arith.maximumf {x}, {self.const(0.0, 'f32')} : f32")
        if op in ("sigmoid", "silu"):
            n = self.let(f"arith.negf {x} : f32")
            ex = self.let(f"math.exp {n} : f32")
            d = self.let(f"arith.addf {self.const(1.0, 'f32')}, {ex} : f32")
            s = self.let(f"arith.divf {self.const(1.0, 'f32')}, {d} : f32")
            return s if op == "sigmoid" else self.let(f"arith.mulf {x}, {s} : f32")
        if op == "gelu":  # x * (1 + erf(x / sqrt(2))) / 2, the exact form
            t = self.let(f"arith.mulf {x}, {self.const(1 / math.sqrt(2), 'f32')} : f32")
            er = self.let(f"math.erf {t} : f32")
            one = self.let(f"arith.addf {er}, {self.const(1.0, 'f32')} : f32")
            h = self.let(f"arith.mulf {x}, {self.const(0.5, 'f32')} : f32")
            return self.let(f"arith.mulf {h}, {one} : f32")
        raise UnsupportedError(f"mlir: unary `{op}` on floats")

    def _periodic(self, op: str, x: str) -> str:
        """sin/cos with the argument first reduced exactly to [-π, π] in f64 (:mod:`arke.targets.turns`):
        the f32 approximations MLIR expands to are accurate there only (8e-6 off at 300 radians, as rotary
        embeddings reach), and a multiple of 2π taken off in f64 is wrong past |x| ≈ 1e11."""
        w = self.let(f"arith.extf {x} : f32 to f64")
        a = self.let(f"math.absf {w} : f64")
        turn = None
        for c in reversed(CHUNKS):  # smallest first: each product and its fraction exact
            p = self.let(f"arith.mulf {a}, {self.const(c, 'f64')} : f64")
            f = self.let(f"arith.subf {p}, {self.let(f'math.floor {p} : f64')} : f64")
            turn = f if turn is None else self.let(f"arith.addf {turn}, {f} : f64")
        assert turn is not None
        turn = self.let(f"arith.subf {turn}, {self.let(f'math.floor {turn} : f64')} : f64")
        half = self.let(f"arith.cmpf ogt, {turn}, {self.const(0.5, 'f64')} : f64")
        less = self.let(f"arith.subf {turn}, {self.const(1.0, 'f64')} : f64")
        turn = self.let(f"arith.select {half}, {less}, {turn} : f64")
        r = self.let(f"arith.mulf {turn}, {self.const(2 * math.pi, 'f64')} : f64")
        if op == "sin":  # odd: the turn of |x| signed like x (-0 included)
            sign = self.let(f"math.copysign {self.const(1.0, 'f64')}, {w} : f64")
            r = self.let(f"arith.mulf {r}, {sign} : f64")
        n = self.let(f"arith.truncf {r} : f64 to f32")
        value = self.let(f"math.{op} {n} : f32")
        if op == "cos":
            return value
        zero = self.let(f"arith.cmpf oeq, {x}, {self.const(0.0, 'f32')} : f32")
        return self.let(f"arith.select {zero}, {x}, {value} : f32")  # sin(±0) = ±0 (IREE's gives +0 for -0)

    def _int_unary(self, op: str, x: str, ty: str, unsigned: bool = False) -> str:
        if op == "not":
            return self.let(f"arith.xori {x}, {self.const(True, 'i1')} : i1")
        if op == "bitnot":
            return self.let(f"arith.xori {x}, {self.const(-1, ty)} : {ty}")
        if unsigned and op in ("abs", "relu"):
            return x  # never negative
        if op == "neg":
            return self.let(f"arith.subi {self.const(0, ty)}, {x} : {ty}")
        if op == "abs":
            return self.let(f"math.absi {x} : {ty}")
        if op == "relu":
            return self.let(f"arith.maxsi {x}, {self.const(0, ty)} : {ty}")
        if op in ("floor", "ceil"):
            return x
        raise UnsupportedError(f"mlir: unary `{op}` on {ty}")

    def _x_Binary(self, e: ir.Binary) -> str:
        if e.op in ir.COMPARISONS:
            ct = promote(e.a.dtype, e.b.dtype).compute
            a, b = self.value(e.a, ct), self.value(e.b, ct)
            ty = COMPUTE[ct]
            if ty == "f32":
                return self.let(f"arith.cmpf {_FCMP[e.op]}, {a}, {b} : f32")
            table = _UCMP if ty == "i1" or ct.is_unsigned else _ICMP
            return self.let(f"arith.cmpi {table[e.op]}, {a}, {b} : {ty}")
        if e.op in ir.SHIFTS:
            return self._shift(e)
        a, b = self.value(e.a, e.dtype), self.value(e.b, e.dtype)
        ty = COMPUTE[e.dtype]
        if ty == "f32":
            return self._float_binary(e.op, a, b)
        return self._int_binary(e.op, a, b, ty, safe_divisor(e), e.dtype.is_unsigned)

    def _shift(self, e: ir.Binary) -> str:
        """``shli``, or ``shrsi``/``shrui`` (arithmetic on signed, logical on unsigned types); the i64
        count is checked (its flag kept, a bad count replaced by 0), never masked."""
        a, count = self.value(e.a, e.dtype), self.value(e.b, DType.I64)
        ty = COMPUTE[e.dtype]
        if not safe_divisor(e):
            ok = self.let(f"arith.cmpi ult, {count}, {self.const(e.dtype.bits, 'i64')} : i64")
            self.flags.append(ok)
            count = self.let(f"arith.select {ok}, {count}, {self.const(0, 'i64')} : i64")
        if ty != "i64":
            count = self.let(f"arith.trunci {count} : i64 to {ty}")
        kind = "shli" if e.op == "shl" else "shrui" if e.dtype.is_unsigned else "shrsi"
        return self.let(f"arith.{kind} {a}, {count} : {ty}")

    def _float_binary(self, op: str, a: str, b: str) -> str:
        simple = {"add": "arith.addf", "sub": "arith.subf", "mul": "arith.mulf", "div": "arith.divf",
                  "max": "arith.maximumf", "min": "arith.minimumf"}
        if op in simple:
            return self.let(f"{simple[op]} {a}, {b} : f32")
        if op == "pow":
            return self._float_pow(a, b)
        if op == "floordiv":
            q = self.let(f"arith.divf {a}, {b} : f32")
            return self.let(f"math.floor {q} : f32")
        if op == "mod":  # Python's %: fmod, then moved into the divisor's sign (exact); a zero takes b's sign
            r = self._divisor_sign(self.let(f"arith.remf {a}, {b} : f32"), b, "f32")
            zero = self.let(f"arith.cmpf oeq, {r}, {self.const(0.0, 'f32')} : f32")
            signed = self.let(f"math.copysign {r}, {b} : f32")
            return self.let(f"arith.select {zero}, {signed}, {r} : f32")
        raise UnsupportedError(f"mlir: binary `{op}` on floats")

    def _float_pow(self, a: str, b: str) -> str:
        """C's ``pow``: ``|x| ** y`` in f64 (exp(y log x) in f32 is 7e-7 off for y log x near -9: rope frequencies),
        which is all IREE's expansion computes, then the sign of a negative base to an odd integer power, NaN for
        a finite negative base to a non-integer power, and 1 for ``y == 0``, ``x == 1`` and ``(±1) ** ±inf``."""
        x = self.let(f"arith.extf {a} : f32 to f64")
        y = self.let(f"arith.extf {b} : f32 to f64")
        one, zero = self.const(1.0, "f64"), self.const(0.0, "f64")
        ax = self.let(f"math.absf {x} : f64")
        m = self.let(f"math.powf {ax}, {y} : f64")
        whole = self.let(f"arith.cmpf oeq, {self.let(f'math.floor {y} : f64')}, {y} : f64")  # ±inf: even, whole
        half = self.let(f"arith.mulf {y}, {self.const(0.5, 'f64')} : f64")
        twice = self.let(f"arith.mulf {self.let(f'math.floor {half} : f64')}, {self.const(2.0, 'f64')} : f64")
        odd = self.let(f"arith.andi {whole}, {self.let(f'arith.cmpf one, {twice}, {y} : f64')} : i1")
        negative = self.let(f"arith.cmpf olt, {self.let(f'math.copysign {one}, {x} : f64')}, {zero} : f64")
        r = self.let(f"arith.select {self.let(f'arith.andi {odd}, {negative} : i1')}, "
                     f"{self.let(f'arith.negf {m} : f64')}, {m} : f64")
        finite = self.let(f"arith.cmpf olt, {ax}, {self.const(math.inf, 'f64')} : f64")
        bad = self.let(f"arith.andi {self.let(f'arith.cmpf olt, {x}, {zero} : f64')}, {finite} : i1")
        fraction = self.let(f"arith.xori {whole}, {self.const(True, 'i1')} : i1")
        bad = self.let(f"arith.andi {bad}, {fraction} : i1")
        r = self.let(f"arith.select {bad}, {self.const(math.nan, 'f64')}, {r} : f64")
        ay = self.let(f"math.absf {y} : f64")
        endless = self.let(f"arith.cmpf oeq, {ay}, {self.const(math.inf, 'f64')} : f64")
        unit = self.let(f"arith.andi {self.let(f'arith.cmpf oeq, {ax}, {one} : f64')}, {endless} : i1")
        ones = self.let(f"arith.ori {self.let(f'arith.cmpf oeq, {y}, {zero} : f64')}, "
                        f"{self.let(f'arith.cmpf oeq, {x}, {one} : f64')} : i1")
        r = self.let(f"arith.select {self.let(f'arith.ori {ones}, {unit} : i1')}, {one}, {r} : f64")
        return self.let(f"arith.truncf {r} : f64 to f32")

    def _int_binary(self, op: str, a: str, b: str, ty: str, safe: bool = False, unsigned: bool = False) -> str:
        simple = {"add": "arith.addi", "sub": "arith.subi", "mul": "arith.muli", "and": "arith.andi",
                  "or": "arith.ori", **_BITWISE}
        if op in simple:
            return self.let(f"{simple[op]} {a}, {b} : {ty}")
        if op in ("max", "min"):
            kind = ("maxui" if op == "max" else "minui") if ty == "i1" or unsigned else \
                ("maxsi" if op == "max" else "minsi")
            return self.let(f"arith.{kind} {a}, {b} : {ty}")
        if unsigned and op in ("div", "floordiv", "mod"):  # floor division and modulo are plain here
            if not safe:
                ok = self.let(f"arith.cmpi ne, {b}, {self.const(0, ty)} : {ty}")
                self.flags.append(ok)
                b = self.let(f"arith.select {ok}, {b}, {self.const(1, ty)} : {ty}")
            return self.let(f"arith.{'remui' if op == 'mod' else 'divui'} {a}, {b} : {ty}")
        if unsigned and op == "pow":  # no exponent is negative
            return self._int_pow(a, b, ty)
        if op in ("div", "floordiv", "mod"):
            if not safe:  # a zero divisor raises the flag and divides by 1 (x86 traps on zero)
                ok = self.let(f"arith.cmpi ne, {b}, {self.const(0, ty)} : {ty}")
                self.flags.append(ok)
                b = self.let(f"arith.select {ok}, {b}, {self.const(1, ty)} : {ty}")
            if op == "mod":
                return self._floor_mod(a, b, ty)
            return self.let(f"arith.floordivsi {a}, {b} : {ty}")
        if op == "pow":
            if not safe:
                ok = self.let(f"arith.cmpi sge, {b}, {self.const(0, ty)} : {ty}")
                self.flags.append(ok)
            return self._int_pow(a, b, ty)
        raise UnsupportedError(f"mlir: binary `{op}` on {ty}")

    def _int_pow(self, a: str, b: str, ty: str) -> str:
        """``a ** b`` wrapping at the type's width, by squaring over every bit of ``b`` (straight-line:
        IREE cannot lower a vectorised ``math.ipowi``). A negative ``b`` was flagged by the caller."""
        one = self.const(1, ty)
        result, base, e = one, a, b
        for _ in range(int(ty[1:])):
            bit = self.let(f"arith.andi {e}, {one} : {ty}")
            odd = self.let(f"arith.cmpi ne, {bit}, {self.const(0, ty)} : {ty}")
            times = self.let(f"arith.muli {result}, {base} : {ty}")
            result = self.let(f"arith.select {odd}, {times}, {result} : {ty}")
            base = self.let(f"arith.muli {base}, {base} : {ty}")
            e = self.let(f"arith.shrui {e}, {one} : {ty}")
        return result

    def _floor_mod(self, a: str, b: str, ty: str) -> str:
        """Python's ``a % b`` (the divisor's sign) on a nonzero ``b``."""
        return self._divisor_sign(self.let(f"arith.remsi {a}, {b} : {ty}"), b, ty)

    def _divisor_sign(self, r: str, b: str, ty: str) -> str:
        """A truncated remainder ``r`` of a division by ``b`` moved into ``b``'s sign (``r + b`` when
        ``r`` is nonzero and the signs differ), as Python's ``%`` has it, on floats or integers."""
        f = ty == "f32"
        cmp, ne, lt, add = (("arith.cmpf", "one", "olt", "arith.addf") if f
                            else ("arith.cmpi", "ne", "slt", "arith.addi"))
        zero = self.const(0.0 if f else 0, ty)
        nz = self.let(f"{cmp} {ne}, {r}, {zero} : {ty}")
        rn = self.let(f"{cmp} {lt}, {r}, {zero} : {ty}")
        bn = self.let(f"{cmp} {lt}, {b}, {zero} : {ty}")
        differ = self.let(f"arith.xori {rn}, {bn} : i1")
        fix = self.let(f"arith.andi {nz}, {differ} : i1")
        moved = self.let(f"{add} {r}, {b} : {ty}")
        return self.let(f"arith.select {fix}, {moved}, {r} : {ty}")

    # ------------------------------------------------------------ reductions

    def combine(self, kind: str, acc: str, term: str, ty: str) -> str:
        """``acc ⊕ term`` for a reduction of ``kind`` in type ``ty`` (bools reduce as bytes 0/1)."""
        if ty == "f32":
            op = {"sum": "arith.addf", "prod": "arith.mulf", "max": "arith.maximumf", "min": "arith.minimumf"}[kind]
        elif ty.endswith("u"):  # bools (as bytes) and unsigned integers
            op = {"max": "arith.maxui", "min": "arith.minui", "sum": "arith.addi", "prod": "arith.muli"}[kind]
            ty = ty[:-1]
        else:
            op = {"sum": "arith.addi", "prod": "arith.muli", "max": "arith.maxsi", "min": "arith.minsi"}[kind]
        return self.let(f"{op} {acc}, {term} : {ty}")

    def any_bad(self) -> str | None:
        """An ``i1`` that is true when some flag is false (None when nothing was checked)."""
        if not self.flags:
            return None
        ok = self.flags[0]
        for f in self.flags[1:]:
            ok = self.let(f"arith.andi {ok}, {f} : i1")
        return self.let(f"arith.xori {ok}, {self.const(True, 'i1')} : i1")
