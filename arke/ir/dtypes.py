"""Element types of the language and the promotion rules between them."""

from __future__ import annotations

from enum import Enum


class DType(str, Enum):
    """An element type. ``str`` values are the spellings in `.ak` files and IR text."""

    BOOL = "bool"
    I8 = "i8"
    I32 = "i32"
    I64 = "i64"
    U8 = "u8"
    U16 = "u16"
    U32 = "u32"
    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"

    def __str__(self) -> str:
        return self.value

    @property
    def is_float(self) -> bool:
        return self in (DType.F16, DType.BF16, DType.F32)

    @property
    def is_int(self) -> bool:
        """Any integer type, signed or unsigned (not ``bool``)."""
        return self in _INTS

    @property
    def is_unsigned(self) -> bool:
        return self in (DType.U8, DType.U16, DType.U32)

    @property
    def is_bool(self) -> bool:
        return self is DType.BOOL

    @property
    def bits(self) -> int:
        return _BITS[self]

    @property
    def compute(self) -> DType:
        """The type arithmetic runs in: 16-bit floats compute in f32 and round when stored."""
        return DType.F32 if self in (DType.F16, DType.BF16) else self


_INTS = frozenset({DType.I8, DType.I32, DType.I64, DType.U8, DType.U16, DType.U32})
_BITS = {DType.BOOL: 1, DType.I8: 8, DType.I32: 32, DType.I64: 64, DType.U8: 8, DType.U16: 16, DType.U32: 32,
         DType.F16: 16, DType.BF16: 16, DType.F32: 32}
# Unsigned types rank by width among themselves; against a signed type they meet in _MIXED.
_RANK = {DType.BOOL: 0, DType.I8: 1, DType.U8: 1, DType.U16: 1.5, DType.I32: 2, DType.U32: 2.5, DType.I64: 3,
         DType.F16: 4, DType.BF16: 4, DType.F32: 5}

DTYPES: dict[str, DType] = {d.value: d for d in DType}


def promote(a: DType, b: DType) -> DType:
    """The common type of two operands: bool < i8 < i32 < i64 < {f16, bf16} < f32 and u8 < u16 < u32;
    f16 with bf16 gives f32; an unsigned type with a signed one gives the smallest signed type that
    holds both (u8/u16 with i8 or i32: i32; u32 with any signed type: i64), so no value is lost."""
    if a == b:
        return a
    if {a, b} == {DType.F16, DType.BF16}:
        return DType.F32
    if a.is_int and b.is_int and a.is_unsigned != b.is_unsigned:
        unsigned, signed = (a, b) if a.is_unsigned else (b, a)
        if unsigned is DType.U32 or signed is DType.I64:
            return DType.I64
        return DType.I32
    return a if _RANK[a] > _RANK[b] else b


def can_store(value: DType, into: DType) -> bool:
    """Whether a result of type ``value`` may be written to an output of type ``into`` without a cast.

    Widening conversions and float to float (rounding to a narrower float, as every
    bf16 kernel does) are implicit. Anything that can lose an integer's value or a
    fraction (float -> int, i64 -> i8, int -> bool) needs an explicit cast.
    """
    if value == into or promote(value, into) == into:
        return True
    return value.is_float and into.is_float


INT_RANGE: dict[DType, tuple[int, int]] = {
    DType.I8: (-(2**7), 2**7 - 1),
    DType.I32: (-(2**31), 2**31 - 1),
    DType.I64: (-(2**63), 2**63 - 1),
    DType.U8: (0, 2**8 - 1),
    DType.U16: (0, 2**16 - 1),
    DType.U32: (0, 2**32 - 1),
}


def wrap(value: int, dtype: DType) -> int:
    """The integer ``value`` wrapped to integer type ``dtype`` (its low bits, two's complement)."""
    bits = _BITS[dtype]
    low = value & ((1 << bits) - 1)
    return low - (1 << bits) if not dtype.is_unsigned and low >= 1 << (bits - 1) else low


def fits(value: int, dtype: DType) -> bool:
    """Whether the integer ``value`` is representable in integer type ``dtype``."""
    low, high = INT_RANGE.get(dtype, (-(2**63), 2**63 - 1))
    return low <= value <= high


# The smallest magnitude that rounds to infinity (to nearest, ties to even) in each float type,
# and the largest finite value (for messages).
_FLOAT_OVERFLOW = {DType.F16: 65520.0, DType.BF16: 2.0**128 - 2.0**119, DType.F32: 2.0**128 - 2.0**103}
FLOAT_MAX: dict[DType, float] = {DType.F16: 65504.0, DType.BF16: 2.0**128 - 2.0**120, DType.F32: 2.0**128 - 2.0**104}


def float_fits(value: float, dtype: DType) -> bool:
    """Whether ``value`` rounds to a finite number of float type ``dtype`` (inf and NaN do not)."""
    return abs(value) < _FLOAT_OVERFLOW.get(dtype, _FLOAT_OVERFLOW[DType.F32])
