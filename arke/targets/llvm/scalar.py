"""Scalar expressions and memory in LLVM IR: loads, stores, subscripts, casts and the scalar ops.

The type tables (how each dtype is stored and computed in) and :class:`ScalarEmitter`, the part
of a function's emitter that turns one SemanticIR expression into instructions: a load's
address (every subscript that is not a plain in-range index checked, a bad one clamped and
flagged), 16-bit floats widened and narrowed in integer code (:mod:`arke.targets.llvm.convert`),
conversions that round as the interpreter does, float and integer arithmetic (Python's floor
division and modulo; a zero divisor raises the error word, never traps) and the float functions
(LLVM intrinsics, libm, or :mod:`arke.targets.llvm.lib`'s exact ``expf``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.ranges import facts, in_range
from arke.ir.shapes import Dim
from arke.plan.dispatch import Buffer
from arke.targets.artifact import UnsupportedError
from arke.targets.llvm.convert import FLOAT16, narrow, widen
from arke.targets.llvm.emitter import Emitter
from arke.targets.llvm.lib import INT_BITS, expf, float_const, int_const, ipow
from arke.targets.llvm.mathlib import erff, power_by_multiplying, small_power, tanhf

# ---------------------------------------------------------------- type tables

# 16-bit floats are stored as their raw bits (i16) and converted by arke.targets.llvm.convert
# LLVM integers are signless: unsigned types share the signed types' storage, and the operations
# that differ (compare, divide, extend, convert, shift right) pick their unsigned forms.
STORAGE = {DType.F32: "float", DType.F16: "i16", DType.BF16: "i16", DType.I64: "i64", DType.I32: "i32",
           DType.I8: "i8", DType.BOOL: "i8", DType.U8: "i8", DType.U16: "i16", DType.U32: "i32"}
COMPUTE = {DType.F32: "float", DType.F16: "float", DType.BF16: "float", DType.I64: "i64", DType.I32: "i32",
           DType.I8: "i8", DType.BOOL: "i1", DType.U8: "i8", DType.U16: "i16", DType.U32: "i32"}

FLOAT_BINARY = {"add": "fadd", "sub": "fsub", "mul": "fmul", "div": "fdiv"}
INT_BINARY = {"add": "add", "sub": "sub", "mul": "mul"}
FLOAT_COMPARE = {"eq": "oeq", "ne": "une", "lt": "olt", "le": "ole", "gt": "ogt", "ge": "oge"}
INT_COMPARE = {"eq": "eq", "ne": "ne", "lt": "slt", "le": "sle", "gt": "sgt", "ge": "sge"}
UINT_COMPARE = {"eq": "eq", "ne": "ne", "lt": "ult", "le": "ule", "gt": "ugt", "ge": "uge"}
BITWISE = {"bitand": "and", "bitor": "or", "bitxor": "xor"}


def int_compare(op: str, dtype: DType) -> str:
    """The ``icmp`` predicate of comparison ``op`` on integers of ``dtype``."""
    return (UINT_COMPARE if dtype.is_unsigned else INT_COMPARE)[op]


def int_convert(src: DType, dst: DType) -> str:
    """The instruction that converts integer ``src`` to integer ``dst`` (two's complement: wrap or extend)."""
    a, b = INT_BITS[src], INT_BITS[dst]
    if a == b:
        return "bitcast"
    return ("zext" if src.is_unsigned else "sext") if b > a else "trunc"
# Float math with an LLVM intrinsic (NaN-propagating maximum/minimum, as torch does).
FLOAT_INTRINSIC = {"log": "llvm.log", "sqrt": "llvm.sqrt", "sin": "llvm.sin",
                   "cos": "llvm.cos", "floor": "llvm.floor", "ceil": "llvm.ceil", "exp2": "llvm.exp2",
                   "log2": "llvm.log2", "abs": "llvm.fabs"}


class ScalarEmitter(Emitter):
    """Emits a function's memory accesses and scalar expressions (see :class:`Emitter` for its state)."""

    _known: dict[sympy.Symbol, sympy.Expr] | None = None  # known_dims(), computed once

    # -- memory
    def address(self, buf: Buffer, subs: Sequence[ir.SExpr]) -> str:
        offset = "0"
        for k, (s, d) in enumerate(zip(subs, buf.shape)):
            v = self.subscript(s, d, buf, k)
            if k == 0:
                offset = v
            else:
                m = self.let(f"mul i64 {offset}, {self.dim(d)}")
                offset = self.let(f"add i64 {m}, {v}")
        p = self.let(f"getelementptr inbounds {STORAGE[buf.dtype]}, ptr {self.ptr[buf.name]}, i64 {offset}")
        return p

    def subscript(self, s: ir.SExpr, extent: Dim, buf: Buffer, k: int) -> str:
        """The subscript's value, checked against the axis when it is not a plain in-range index."""
        v = self.expr(ir.Cast(s, DType.I64) if s.dtype != DType.I64 else s)
        if isinstance(s, ir.Idx) and s.name in self.extent and sympy.sympify(self.extent[s.name]) == \
                sympy.sympify(extent):
            return v
        if isinstance(s, ir.Const) and int(s.value) == 0:  # a broadcast axis: every dim is at least 1
            return v
        if in_range(s, extent, self.extent, self.known_dims()):
            return v
        n = self.dim(extent)
        ge = self.let(f"icmp sge i64 {v}, 0")
        lt = self.let(f"icmp slt i64 {v}, {n}")
        ok = self.let(f"and i1 {ge}, {lt}")
        self.flag_unless(ok)
        safe = self.let(f"select i1 {ok}, i64 {v}, i64 0")
        return safe

    def row_offset(self, buf: Buffer, subs: Sequence[ir.SExpr]) -> str:
        """The offset of element 0 of a row of ``buf`` (its last axis) at the leading subscripts ``subs``."""
        offset = "0"
        for k, sub in enumerate(subs):
            v = self.subscript(sub, buf.shape[k], buf, k)
            offset = self.let(f"add i64 {self.let(f'mul i64 {offset}, {self.dim(buf.shape[k])}')}, {v}")
        return self.let(f"mul i64 {offset}, {self.dim(buf.shape[-1])}")

    def known_dims(self) -> dict[sympy.Symbol, sympy.Expr]:
        """The dims the kernel's checked `where` equalities define (:func:`~arke.ir.ranges.facts`)."""
        if self._known is None:
            self._known = facts(self.plan.function)
        return self._known

    def load(self, e: ir.Load) -> str:
        buf = self.buffer(e.src)
        p = self.address(buf, e.indices)
        raw = self.let(f"load {STORAGE[buf.dtype]}, ptr {p}")
        return self.widen(raw, buf.dtype)

    def widen(self, raw: str, dtype: DType) -> str:
        """A stored value in its compute type (16-bit floats to float, bool bytes to i1)."""
        if dtype in (DType.F16, DType.BF16):
            return self.widen_16(raw, dtype)
        if dtype is DType.BOOL:
            t = self.let(f"icmp ne i8 {raw}, 0")
            return t
        return raw

    # 16-bit floats convert in plain integer code (llvm_convert): fpext/fptrunc would become
    # compiler-rt calls a JIT cannot resolve on CPUs without F16C or AVX512-BF16
    def widen_16(self, raw: str, dtype: DType) -> str:
        name, definition = widen(FLOAT16[dtype])
        self.declare(definition)
        return self.let(f"call float {name}(i16 {raw})")

    def narrow_16(self, value: str, dtype: DType) -> str:
        name, definition = narrow(FLOAT16[dtype])
        self.declare(definition)
        return self.let(f"call i16 {name}(float {value})")

    def store(self, buf: Buffer, subs: Sequence[ir.SExpr], value: str, dtype: DType) -> None:
        p = self.address(buf, subs)
        stored = value
        if dtype in (DType.F16, DType.BF16):
            stored = self.narrow_16(value, dtype)
        elif dtype is DType.BOOL:
            stored = self.let(f"zext i1 {value} to i8")
        self.emit(f"store {STORAGE[dtype]} {stored}, ptr {p}")

    # -- scalar expressions
    def expr(self, e: ir.SExpr) -> str:
        method: Callable[[ir.SExpr], str] = getattr(self, "_x_" + type(e).__name__)
        return method(e)

    def _x_Const(self, e: ir.Const) -> str:
        if e.dtype.is_float:
            return float_const(float(e.value), e.dtype)
        if e.dtype.is_bool:
            return "true" if e.value else "false"
        return int_const(int(e.value), e.dtype)

    def _x_Idx(self, e: ir.Idx) -> str:
        return self.current[e.name]

    def _x_DimRef(self, e: ir.DimRef) -> str:
        return self.dim(e.dim)

    def _x_Load(self, e: ir.Load) -> str:
        return self.load(e)

    def _x_Cast(self, e: ir.Cast) -> str:
        if e.dtype in (DType.F16, DType.BF16) and e.x.dtype == e.dtype:  # a computed 16-bit value, held in f32:
            return self._round_to(self.expr(e.x), e.dtype)  # the cast is its store's rounding (passes/fuse.py)
        return self.convert(self.expr(e.x), e.x.dtype, e.dtype)

    def convert(self, v: str, src: DType, dst: DType) -> str:
        """``v`` (in ``src``'s compute type) as ``dst`` (in its compute type, rounded to ``dst``)."""
        if src == dst:
            return v
        t = self.tmp()
        if dst.is_bool:
            self.emit(f"{t} = fcmp une float {v}, 0.0" if src.is_float else f"{t} = icmp ne {COMPUTE[src]} {v}, 0")
            return t
        if src.is_bool:
            self.emit(f"{t} = {'uitofp' if dst.is_float else 'zext'} i1 {v} to {COMPUTE[dst]}")
            return self._round_to(t, dst)
        if src.is_float and dst.is_float:
            return self._round_to(v, dst)
        if src.is_float:  # through i64, saturating (NaN is 0), then wrapped: the interpreter's (language.md §8.4)
            # written out, not llvm.fptosi.sat: the loop vectoriser widens these, and x86 scalarises the intrinsic
            top = self.let(f"fcmp oge float {v}, 0x43E0000000000000")
            low = self.let(f"fcmp olt float {v}, 0xC3E0000000000000")
            out = self.let(f"or i1 {self.let(f'or i1 {top}, {low}')}, {self.let(f'fcmp uno float {v}, {v}')}")
            wide = self.let(f"fptosi float {self.let(f'select i1 {out}, float 0.0, float {v}')} to i64")
            wide = self.let(f"select i1 {top}, i64 {2 ** 63 - 1}, i64 {wide}")
            wide = self.let(f"select i1 {low}, i64 {-2 ** 63}, i64 {wide}")
            if COMPUTE[dst] == "i64":
                return wide
            self.emit(f"{t} = trunc i64 {wide} to {COMPUTE[dst]}")
            return t
        if dst.is_float:
            self.emit(f"{t} = {'uitofp' if src.is_unsigned else 'sitofp'} {COMPUTE[src]} {v} to float")
            return self._round_to(t, dst)
        if INT_BITS[src] == INT_BITS[dst]:
            return v
        self.emit(f"{t} = {int_convert(src, dst)} {COMPUTE[src]} {v} to {COMPUTE[dst]}")
        return t

    def _round_to(self, v: str, dst: DType) -> str:
        if dst not in (DType.F16, DType.BF16):
            return v
        n = self.narrow_16(v, dst)
        w = self.widen_16(n, dst)
        return w

    def _x_Select(self, e: ir.Select) -> str:
        c, a, b = self.expr(e.cond), self.expr(e.a), self.expr(e.b)
        t = self.let(f"select i1 {c}, {COMPUTE[e.dtype]} {a}, {COMPUTE[e.dtype]} {b}")
        return t

    def _x_Unary(self, e: ir.Unary) -> str:
        x = self.expr(e.x)
        ct = COMPUTE[e.dtype]
        t = self.tmp()
        op = e.op
        if op == "not":
            self.emit(f"{t} = xor i1 {x}, true")
            return t
        if op == "bitnot":
            self.emit(f"{t} = xor {ct} {x}, -1")
            return t
        if e.dtype.is_unsigned and op in ("abs", "relu"):
            return x  # never negative
        if not e.dtype.is_float:
            if op == "neg":
                self.emit(f"{t} = sub {ct} 0, {x}")
            elif op == "abs":
                self.declare(f"declare {ct} @llvm.abs.{ct}({ct}, i1)")
                self.emit(f"{t} = call {ct} @llvm.abs.{ct}({ct} {x}, i1 false)")
            elif op == "relu":
                c = self.let(f"icmp sgt {ct} {x}, 0")
                self.emit(f"{t} = select i1 {c}, {ct} {x}, {ct} 0")
            else:
                raise UnsupportedError(f"unimplemented integer `{op}` in LLVM lowering")
            return t
        if op == "neg":
            self.emit(f"{t} = fneg float {x}")
        elif op == "exp":
            return self.expr_f("exp", x)
        elif op == "tanh":
            fn, needs = tanhf(scalef=self.vector_bits >= 512)
            for d in needs:
                self.declare(d)
            self.emit(f"{t} = call float @{fn}(float {x})")
        elif op in FLOAT_INTRINSIC:
            fn = FLOAT_INTRINSIC[op] + ".f32"
            self.declare(f"declare float @{fn}(float)")
            self.emit(f"{t} = call float @{fn}(float {x})")
        elif op == "erf":
            return self.erf(x)
        elif op == "rsqrt":
            s = self.expr_f("sqrt", x)
            self.emit(f"{t} = fdiv float 1.0, {s}")
        elif op == "relu":
            self.declare("declare float @llvm.maximum.f32(float, float)")
            self.emit(f"{t} = call float @llvm.maximum.f32(float {x}, float 0.0)")
        elif op in ("sigmoid", "silu"):
            n = self.let(f"fneg float {x}")
            ex = self.expr_f("exp", n)
            d = self.let(f"fadd float 1.0, {ex}")
            if op == "sigmoid":
                self.emit(f"{t} = fdiv float 1.0, {d}")
            else:
                self.emit(f"{t} = fdiv float {x}, {d}")
        elif op == "gelu":
            s = self.let(f"fmul float {x}, {float_const(math.sqrt(0.5))}")
            er = self.erf(s)
            one = self.let(f"fadd float 1.0, {er}")
            h = self.let(f"fmul float {x}, 0x3FE0000000000000")
            self.emit(f"{t} = fmul float {h}, {one}")
        else:
            raise UnsupportedError(f"unimplemented primitive in llvm lowering: {op}")
        return t

    def erf(self, x: str) -> str:
        """erf inline (arke.targets.llvm.mathlib), not libm's erff: a call would stop vectorisation."""
        fn, needs = erff()
        for d in needs:
            self.declare(d)
        return self.let(f"call float @{fn}(float {x})")

    def expr_f(self, op: str, x: str) -> str:
        t = self.tmp()
        if op == "exp":
            fn, needs = expf(scalef=self.vector_bits >= 512)
            for d in needs:
                self.declare(d)
            self.emit(f"{t} = call float @{fn}(float {x})")
            return t
        fn = FLOAT_INTRINSIC[op] + ".f32"
        self.declare(f"declare float @{fn}(float)")
        self.emit(f"{t} = call float @{fn}(float {x})")
        return t

    def _x_Binary(self, e: ir.Binary) -> str:
        if e.op == "pow" and e.dtype.is_float and isinstance(e.b, ir.Const) and small_power(e.b.value) is not None:
            n = small_power(e.b.value)
            assert n is not None
            return power_by_multiplying(self.expr(e.a), n, lambda p, q: self.let(f"fmul float {p}, {q}"),
                                        lambda p: self.let(f"fdiv float 1.0, {p}"), "1.0")
        a, b = self.expr(e.a), self.expr(e.b)
        op = e.op
        if op in ("and", "or"):
            t = self.let(f"{op} i1 {a}, {b}")
            return t
        operand = e.a.dtype
        if op in FLOAT_COMPARE:
            t = self.tmp()
            if operand.is_float:
                self.emit(f"{t} = fcmp {FLOAT_COMPARE[op]} float {a}, {b}")
            else:
                self.emit(f"{t} = icmp {int_compare(op, operand)} {COMPUTE[operand]} {a}, {b}")
            return t
        if e.dtype.is_float:  # f16/bf16 arithmetic runs in f32: rounded only when stored or cast
            return self.float_binary(op, a, b)
        if op in ir.SHIFTS:
            return self.shift(op, a, b, e.dtype)
        return self.int_binary(op, a, b, COMPUTE[e.dtype], e.dtype.is_unsigned)

    def float_binary(self, op: str, a: str, b: str) -> str:
        t = self.tmp()
        if op in FLOAT_BINARY:
            self.emit(f"{t} = {FLOAT_BINARY[op]} float {a}, {b}")
        elif op in ("max", "min", "pow"):
            fn = {"max": "llvm.maximum.f32", "min": "llvm.minimum.f32", "pow": "llvm.pow.f32"}[op]
            self.declare(f"declare float @{fn}(float, float)")
            self.emit(f"{t} = call float @{fn}(float {a}, float {b})")
        elif op == "floordiv":
            q = self.let(f"fdiv float {a}, {b}")
            return self.expr_f("floor", q)
        elif op == "mod":  # Python's sign rule: the result takes the divisor's sign
            r = self.let(f"frem float {a}, {b}")
            nz = self.let(f"fcmp une float {r}, 0.0")
            rn, bn = self.tmp(), self.tmp()
            self.emit(f"{rn} = fcmp olt float {r}, 0.0")
            self.emit(f"{bn} = fcmp olt float {b}, 0.0")
            diff, fix, plus = self.tmp(), self.tmp(), self.tmp()
            self.emit(f"{diff} = xor i1 {rn}, {bn}")
            self.emit(f"{fix} = and i1 {nz}, {diff}")
            self.emit(f"{plus} = fadd float {r}, {b}")
            moved = self.let(f"select i1 {fix}, float {plus}, float {r}")
            self.declare("declare float @llvm.copysign.f32(float, float)")
            signed = self.let(f"call float @llvm.copysign.f32(float 0.0, float {b})")
            self.emit(f"{t} = select i1 {nz}, float {moved}, float {signed}")  # a zero takes the divisor's sign
        else:
            raise UnsupportedError(f"unimplemented primitive in llvm lowering: {op}")
        return t

    def shift(self, op: str, a: str, count: str, dtype: DType) -> str:
        """``a << count`` or ``a >> count`` (arithmetic on signed, logical on unsigned types); the i64
        count must be in ``0 <= count < width``, else the error word is raised and 0 used instead."""
        ct, bits = COMPUTE[dtype], INT_BITS[dtype]
        ok = self.let(f"icmp ult i64 {count}, {bits}")  # unsigned: a negative count is huge
        self.flag_unless(ok)
        safe = self.let(f"select i1 {ok}, i64 {count}, i64 0")
        if bits != 64:
            safe = self.let(f"trunc i64 {safe} to {ct}")
        kind = "shl" if op == "shl" else "lshr" if dtype.is_unsigned else "ashr"
        return self.let(f"{kind} {ct} {a}, {safe}")

    def int_binary(self, op: str, a: str, b: str, ct: str, unsigned: bool = False) -> str:
        t = self.tmp()
        if op in INT_BINARY or op in BITWISE:
            self.emit(f"{t} = {INT_BINARY.get(op) or BITWISE[op]} {ct} {a}, {b}")
            return t
        if op in ("max", "min"):
            pred = ("u" if unsigned else "s") + ("gt" if op == "max" else "lt")
            c = self.let(f"icmp {pred} {ct} {a}, {b}")
            self.emit(f"{t} = select i1 {c}, {ct} {a}, {ct} {b}")
            return t
        if op in ("div", "floordiv", "mod"):
            return self.unsigned_divide(op, a, b, ct) if unsigned else self.int_divide(op, a, b, ct)
        if op == "pow":
            fn = f"arke.ipow.u.{ct}" if unsigned else f"arke.ipow.{ct}"
            self.declare(ipow(ct, unsigned))
            self.emit(f"{t} = call {ct} @\"{fn}\"({ct} {a}, {ct} {b}, ptr %errflag)")
            return t
        raise UnsupportedError(f"unimplemented integer `{op}` in llvm lowering")

    def unsigned_divide(self, op: str, a: str, b: str, ct: str) -> str:
        """Unsigned division and remainder (floor and Python's modulo agree with them); a zero
        divisor raises the error word, never traps."""
        zero = self.let(f"icmp eq {ct} {b}, 0")
        self.flag_unless(self.let(f"xor i1 {zero}, true"))
        safe = self.let(f"select i1 {zero}, {ct} 1, {ct} {b}")
        return self.let(f"{'urem' if op == 'mod' else 'udiv'} {ct} {a}, {safe}")

    def int_divide(self, op: str, a: str, b: str, ct: str) -> str:
        """Python's floor division and modulo; a zero divisor raises the error word, never traps."""
        zero = self.let(f"icmp eq {ct} {b}, 0")
        ok = self.let(f"xor i1 {zero}, true")
        self.flag_unless(ok)
        b1, m1, b2 = self.tmp(), self.tmp(), self.tmp()
        self.emit(f"{b1} = select i1 {zero}, {ct} 1, {ct} {b}")
        self.emit(f"{m1} = icmp eq {ct} {b1}, -1")  # MIN / -1 traps on x86: use negation instead
        self.emit(f"{b2} = select i1 {m1}, {ct} 1, {ct} {b1}")
        q0, r0 = self.tmp(), self.tmp()
        self.emit(f"{q0} = sdiv {ct} {a}, {b2}")
        self.emit(f"{r0} = srem {ct} {a}, {b2}")
        neg = self.let(f"sub {ct} 0, {a}")
        q, r = self.tmp(), self.tmp()
        self.emit(f"{q} = select i1 {m1}, {ct} {neg}, {ct} {q0}")
        self.emit(f"{r} = select i1 {m1}, {ct} 0, {ct} {r0}")
        nz, rn, bn, diff, fix = (self.tmp() for _ in range(5))
        self.emit(f"{nz} = icmp ne {ct} {r}, 0")
        self.emit(f"{rn} = icmp slt {ct} {r}, 0")
        self.emit(f"{bn} = icmp slt {ct} {b1}, 0")
        self.emit(f"{diff} = xor i1 {rn}, {bn}")
        self.emit(f"{fix} = and i1 {nz}, {diff}")
        out = self.tmp()
        if op == "mod":
            plus = self.let(f"add {ct} {r}, {b1}")
            self.emit(f"{out} = select i1 {fix}, {ct} {plus}, {ct} {r}")
        else:
            less = self.let(f"sub {ct} {q}, 1")
            self.emit(f"{out} = select i1 {fix}, {ct} {less}, {ct} {q}")
        return out
