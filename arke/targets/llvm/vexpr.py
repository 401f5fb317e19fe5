"""Scalar-IR expressions evaluated on ``W`` lanes at once, for the LLVM target's vector code.

:class:`VectorExprMixin` is mixed into a function emitter whose loop runs along one index in
vectors (a partitioned map's pieces, attention's tiles, a contraction's epilogue): what depends on
that index becomes ``<W x ...>`` code, the rest stays the emitter's scalar code, and what has no
vector form runs lane by lane through the scalar emitter, so every lane computes exactly what the
scalar code computes (16-bit roundings, ``exp`` and ``silu`` take the same steps).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import equal
from arke.targets.llvm.lib import INT_BITS, float_const
from arke.targets.llvm.mathlib import power_by_multiplying, small_power
from arke.targets.llvm.scalar import (
    BITWISE,
    COMPUTE,
    FLOAT_BINARY,
    FLOAT_COMPARE,
    INT_BINARY,
    STORAGE,
    int_compare,
    int_convert,
)
from arke.targets.llvm.vec import Vec

if TYPE_CHECKING:
    from arke.targets.llvm.function import LLVMFunction as _Host
else:
    _Host = object

# Float math with a vector intrinsic (libm calls per lane where the target has no instruction).
FLOAT_VECTOR = {"abs": "fabs", "sqrt": "sqrt", "floor": "floor", "ceil": "ceil", "log": "log", "sin": "sin",
                "cos": "cos", "exp2": "exp2", "log2": "log2"}


class VectorExprMixin(_Host):
    """Evaluates a scalar-IR expression for ``w`` consecutive values of one index at once.

    Mixed into the LLVM target's function emitter: ``lane_index`` (``Idx``) is the vector
    ``jvec`` and ``leaf()`` (a load) is the vector ``svec``; anything that depends on neither
    is the emitter's ordinary scalar code (splat where it meets a vector). Operations with
    no vector form (integer division, ``tanh``, loads at the index ...) run lane by lane
    through the scalar emitter, so every expression the generic path compiles works here.
    """

    vec: Vec
    bound: dict[ir.SExpr, str]
    jvec: str
    svec: str
    lane_index: str
    lane_start: str | None = None  # the first lane's index when lanes are consecutive (else None) ...
    lane_mask: str | None = None  # ... and the lanes that exist (a load reads only those)

    def leaf(self) -> ir.Load:
        raise NotImplementedError

    def expr(self, e: ir.SExpr) -> str:
        if self.bound:
            hit = self.bound.get(e)
            if hit is not None:
                return hit
        return super().expr(e)

    def varying(self, e: ir.SExpr) -> bool:
        leaf = self.leaf()
        return any((isinstance(x, ir.Idx) and x.name == self.lane_index) or x == leaf for x in ir.walk(e))

    def vtype(self, dtype: DType) -> str:
        return self.vec.ty(COMPUTE[dtype])

    def vector(self, e: ir.SExpr) -> str:
        """``e`` as a vector (a lane-independent value is splat)."""
        value, is_vector = self.vexpr(e)
        return value if is_vector else self.vec.splat(value, COMPUTE[e.dtype])

    def vexpr(self, e: ir.SExpr) -> tuple[str, bool]:
        """``e``'s value and whether it is a vector (else the scalar every lane shares)."""
        if not self.varying(e):
            return self.expr(e), False
        if e == self.leaf():
            return self.svec, True
        if isinstance(e, ir.Idx):
            return self.jvec, True
        rule = getattr(self, "_v_" + type(e).__name__, None)
        value = rule(e) if rule is not None else None
        return (value if value is not None else self.scalarize(e)), True

    def scalarize(self, e: ir.SExpr) -> str:
        """``e`` lane by lane: its lane-dependent operands extracted, the scalar emitter on each lane."""
        kids = [c for c in ir.children(e) if self.varying(c)]
        values = [self.vector(c) for c in kids]
        elem = COMPUTE[e.dtype]
        out, saved = "poison", self.bound
        for lane in range(self.vec.w):
            self.bound = dict(saved)
            for c, v in zip(kids, values):
                self.bound[c] = self.let(f"extractelement {self.vtype(c.dtype)} {v}, i64 {lane}")
            one = super().expr(e)
            out = self.let(f"insertelement {self.vec.ty(elem)} {out}, {elem} {one}, i64 {lane}")
        self.bound = saved
        return out

    def _v_Load(self, e: ir.Load) -> str | None:
        """A load whose last subscript is the lane index, in range, and the others the same for
        every lane: one masked vector load (anything else runs lane by lane, each subscript checked)."""
        subs = e.indices
        if self.lane_start is None or self.lane_mask is None or not subs or subs[-1] != ir.Idx(self.lane_index):
            return None
        buf = self.buffer(e.src)
        if buf.dtype not in (DType.F32, DType.BF16, DType.F16) or any(self.varying(s) for s in subs[:-1]):
            return None
        if equal(buf.shape[-1], self.extent[self.lane_index]) is not True:
            return None
        offset = self.let(f"add i64 {self.row_offset(buf, subs[:-1])}, {self.lane_start}")
        at = self.let(f"getelementptr inbounds {STORAGE[buf.dtype]}, ptr {self.ptr[buf.name]}, i64 {offset}")
        return self.vec.load_as_float(at, buf.dtype, self.lane_mask)

    def _v_Binary(self, e: ir.Binary) -> str | None:
        op, src, dst = e.op, e.a.dtype, e.dtype
        if op == "pow" and dst.is_float and isinstance(e.b, ir.Const) and small_power(e.b.value) is not None:
            n, t = small_power(e.b.value), self.vtype(dst)
            assert n is not None
            return power_by_multiplying(self.vector(e.a), n, lambda p, q: self.let(f"fmul {t} {p}, {q}"),
                                        lambda p: self.let(f"fdiv {t} splat (float 1.0), {p}"),
                                        "splat (float 1.0)")
        if op in ("and", "or"):
            return self.let(f"{op} {self.vec.ty('i1')} {self.vector(e.a)}, {self.vector(e.b)}")
        if op in FLOAT_COMPARE:
            a, b = self.vector(e.a), self.vector(e.b)
            if src.is_float:
                return self.let(f"fcmp {FLOAT_COMPARE[op]} {self.vtype(src)} {a}, {b}")
            return self.let(f"icmp {int_compare(op, src)} {self.vtype(src)} {a}, {b}")
        if dst.is_float:
            if op in FLOAT_BINARY:
                return self.let(f"{FLOAT_BINARY[op]} {self.vtype(dst)} {self.vector(e.a)}, {self.vector(e.b)}")
            if op in ("max", "min", "pow"):
                name = {"max": "maximum", "min": "minimum", "pow": "pow"}[op]
                return self.vec.intrinsic(name, self.vector(e.a), self.vector(e.b))
            return None
        t = self.vtype(dst)
        if op in INT_BINARY or op in BITWISE:
            return self.let(f"{INT_BINARY.get(op) or BITWISE[op]} {t} {self.vector(e.a)}, {self.vector(e.b)}")
        if op in ("max", "min"):
            a, b = self.vector(e.a), self.vector(e.b)
            pred = ("u" if dst.is_unsigned else "s") + ("gt" if op == "max" else "lt")
            c = self.let(f"icmp {pred} {t} {a}, {b}")
            return self.let(f"select {self.vec.ty('i1')} {c}, {t} {a}, {t} {b}")
        return None

    def _v_Unary(self, e: ir.Unary) -> str | None:
        op, t = e.op, self.vtype(e.dtype)
        if op == "not":
            return self.let(f"xor {t} {self.vector(e.x)}, splat (i1 true)")
        if op == "bitnot":
            return self.let(f"xor {t} {self.vector(e.x)}, splat ({COMPUTE[e.dtype]} -1)")
        if not e.dtype.is_float:
            return self.let(f"sub {t} zeroinitializer, {self.vector(e.x)}") if op == "neg" else None
        if op == "neg":
            return self.let(f"fneg {t} {self.vector(e.x)}")
        if op == "exp":
            return self.vec.exp(self.vector(e.x))
        if op in ("sigmoid", "silu"):  # the scalar form's steps on every lane
            x = self.vector(e.x)
            d = self.let(f"fadd {t} splat (float 1.0), {self.vec.exp(self.let(f'fneg {t} {x}'))}")
            return self.let(f"fdiv {t} {'splat (float 1.0)' if op == 'sigmoid' else x}, {d}")
        if op in FLOAT_VECTOR:
            return self.vec.intrinsic(FLOAT_VECTOR[op], self.vector(e.x))
        if op == "rsqrt":
            return self.let(f"fdiv {t} splat (float 1.0), {self.vec.intrinsic('sqrt', self.vector(e.x))}")
        if op == "relu":
            return self.vec.intrinsic("maximum", self.vector(e.x), "zeroinitializer")
        if op == "tanh":
            return self.vec.tanh(self.vector(e.x))
        if op == "erf":
            return self.vec.erf(self.vector(e.x))
        if op == "gelu":  # x/2 (1 + erf(x / sqrt(2))), as the scalar form computes it
            x = self.vector(e.x)
            s = self.let(f"fmul {t} {x}, {self.vec.const(float_const(math.sqrt(0.5)))}")
            one = self.let(f"fadd {t} splat (float 1.0), {self.vec.erf(s)}")
            h = self.let(f"fmul {t} {x}, splat (float 0x3FE0000000000000)")
            return self.let(f"fmul {t} {h}, {one}")
        return None

    def _v_Select(self, e: ir.Select) -> str:
        cond, is_vector = self.vexpr(e.cond)
        t = self.vtype(e.dtype)
        return self.let(f"select {self.vec.ty('i1') if is_vector else 'i1'} {cond}, {t} {self.vector(e.a)}, "
                        f"{t} {self.vector(e.b)}")

    def _v_Cast(self, e: ir.Cast) -> str | None:
        src, dst = e.x.dtype, e.dtype
        if dst in (DType.F16, DType.BF16):  # rounded to 16 bits and back, whole (the scalar steps per lane)
            return self.vec.rounded(self.vector(e.x), dst) if src.is_float else None  # from an integer: per lane
        x = self.vector(e.x)
        if src == dst or (src.is_float and dst.is_float):
            return x
        st, t = self.vtype(src), self.vtype(dst)
        if dst.is_bool:
            return self.let(f"fcmp une {st} {x}, zeroinitializer" if src.is_float else
                            f"icmp ne {st} {x}, zeroinitializer")
        if src.is_bool:
            return self.let(f"{'uitofp' if dst.is_float else 'zext'} {st} {x} to {t}")
        if src.is_float:  # through i64, saturating, then wrapped, as the scalar emitter (and the interpreter);
            # written out: x86 scalarises llvm.fptosi.sat on vectors, while fptosi of in-range lanes is one
            # vcvttps2qq per 8
            wide, bits = self.vec.ty("i64"), self.vec.ty("i1")
            top = self.let(f"fcmp oge {st} {x}, {self.vec.splat('0x43E0000000000000', 'float')}")
            low = self.let(f"fcmp olt {st} {x}, {self.vec.splat('0xC3E0000000000000', 'float')}")
            nan = self.let(f"fcmp uno {st} {x}, {x}")
            out = self.let(f"or {bits} {self.let(f'or {bits} {top}, {low}')}, {nan}")
            safe = self.let(f"select {bits} {out}, {st} zeroinitializer, {st} {x}")
            got = self.let(f"fptosi {st} {safe} to {wide}")
            got = self.let(f"select {bits} {top}, {wide} {self.vec.splat(str(2 ** 63 - 1), 'i64')}, {wide} {got}")
            got = self.let(f"select {bits} {low}, {wide} {self.vec.splat(str(-2 ** 63), 'i64')}, {wide} {got}")
            return got if t == wide else self.let(f"trunc {wide} {got} to {t}")
        if dst.is_float:
            return self.let(f"{'uitofp' if src.is_unsigned else 'sitofp'} {st} {x} to {t}")
        if INT_BITS[dst] == INT_BITS[src]:
            return x
        return self.let(f"{int_convert(src, dst)} {st} {x} to {t}")
