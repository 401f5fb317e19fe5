"""Explicit vector code for the LLVM target: ``<W x float>`` helpers the tiled renderers share.

:class:`Vec` writes vector instructions through the emitting function's ``let``: splats,
(masked) loads and stores, FMAs, horizontal reductions in a fixed order, an in-register
``W x W`` transpose (to pack a tile of keys so that lanes run along keys), and ``exp`` on
whole vectors (:func:`vector_expf`, the same steps as :data:`~arke.targets.llvm.lib.EXPF`,
so a lane gives exactly what the scalar function gives).
"""

from __future__ import annotations

from collections.abc import Callable

from arke.ir.dtypes import DType
from arke.targets.llvm.convert import FLOAT16, narrow, widen
from arke.targets.llvm.declarations import masked_load, masked_load_call, masked_store, vector_fma
from arke.targets.llvm.lib import float_const
from arke.targets.llvm.mathlib import erf_steps

NEG_INF = "0xFFF0000000000000"


class Vec:
    """Vector instructions of ``w`` lanes, written through ``let`` (``%t = rhs``) and ``declare``."""

    def __init__(self, w: int, let: Callable[[str], str], declare: Callable[[str], None]):
        self.w, self.let, self.declare = w, let, declare
        self.f = f"<{w} x float>"

    def ty(self, elem: str = "float") -> str:
        return f"<{self.w} x {elem}>"

    def const(self, value: str, elem: str = "float") -> str:
        """A constant vector with every lane ``value`` (an LLVM literal)."""
        return f"splat ({elem} {value})"

    def iota(self, elem: str = "i64") -> str:
        """The constant vector ``<0, 1, ..., w - 1>``."""
        return "<" + ", ".join(f"{elem} {k}" for k in range(self.w)) + ">"

    def splat(self, scalar: str, elem: str = "float") -> str:
        one = self.let(f"insertelement <1 x {elem}> poison, {elem} {scalar}, i64 0")
        return self.let(f"shufflevector <1 x {elem}> {one}, <1 x {elem}> poison, <{self.w} x i32> zeroinitializer")

    def load(self, ptr: str) -> str:
        return self.let(f"load {self.f}, ptr {ptr}, align 4")

    def store(self, value: str, ptr: str) -> str:
        return f"store {self.f} {value}, ptr {ptr}, align 4"

    def masked_load(self, ptr: str, mask: str) -> str:
        """Lanes where ``mask`` is false read nothing (no fault past an array's end) and give 0."""
        self.declare(masked_load(self.w, "float")[1])
        return self.let(masked_load_call(self.w, "float", ptr, mask, 4))

    def masked_store(self, value: str, ptr: str, mask: str) -> str:
        name, declaration = masked_store(self.w, "float")
        self.declare(declaration)
        return f"call void {name}({self.f} {value}, ptr align 4 {ptr}, {self.ty('i1')} {mask})"

    def load_as_float(self, ptr: str, dtype: DType, mask: str | None = None) -> str:
        """``w`` stored values of ``dtype`` (f32, or bf16/f16 bits widened exactly) as a float vector;
        with ``mask``, lanes where it is false read nothing and give 0."""
        if dtype is DType.F32:
            return self.masked_load(ptr, mask) if mask is not None else self.load(ptr)
        t = self.ty("i16")
        if mask is None:
            raw = self.let(f"load {t}, ptr {ptr}, align 2")
        else:
            self.declare(masked_load(self.w, "i16")[1])
            raw = self.let(masked_load_call(self.w, "i16", ptr, mask, 2))
        name, definition = widen(FLOAT16[dtype], self.w)
        self.declare(definition)
        return self.let(f"call {self.f} {name}({t} {raw})")

    def masked_store_as(self, value: str, ptr: str, mask: str, dtype: DType) -> str:
        """Store a float vector as ``dtype`` (bf16/f16 rounded to nearest even) where ``mask`` holds."""
        if dtype is DType.F32:
            return self.masked_store(value, ptr, mask)
        t = self.ty("i16")
        name, definition = narrow(FLOAT16[dtype], self.w)
        self.declare(definition)
        bits = self.let(f"call {t} {name}({self.f} {value})")
        store, declaration = masked_store(self.w, "i16")
        self.declare(declaration)
        return f"call void {store}({t} {bits}, ptr align 2 {ptr}, {self.ty('i1')} {mask})"

    def rounded(self, value: str, dtype: DType) -> str:
        """A float vector rounded to ``dtype`` (bf16/f16, to nearest even) and widened back; f32 as it is."""
        if dtype is DType.F32:
            return value
        t = self.ty("i16")
        down, down_def = narrow(FLOAT16[dtype], self.w)
        up, up_def = widen(FLOAT16[dtype], self.w)
        self.declare(down_def)
        self.declare(up_def)
        return self.let(f"call {self.f} {up}({t} {self.let(f'call {t} {down}({self.f} {value})')})")

    def lanes_below(self, start: str, limit: str) -> str:
        """The mask of lanes ``k`` with ``start + k < limit`` (i64 scalars; compared in i32 lanes)."""
        room = self.let(f"sub i64 {limit}, {start}")
        low = self.let(f"icmp slt i64 {room}, 0")
        high = self.let(f"icmp sgt i64 {room}, {self.w}")
        room = self.let(f"select i1 {low}, i64 0, i64 {room}")
        room = self.let(f"select i1 {high}, i64 {self.w}, i64 {room}")
        n = self.splat(self.let(f"trunc i64 {room} to i32"), "i32")
        return self.let(f"icmp slt {self.ty('i32')} {self.iota('i32')}, {n}")

    def max(self, a: str, b: str) -> str:
        """``a > b ? a : b`` lane by lane (one vmaxps). A NaN may be dropped here: callers only use
        the max to shift exponents, and a NaN term still makes its own exp, so the sum, NaN."""
        c = self.let(f"fcmp ogt {self.f} {a}, {b}")
        return self.let(f"select {self.ty('i1')} {c}, {self.f} {a}, {self.f} {b}")

    def hmax_fast(self, v: str) -> str:
        """The largest lane by a halving tree of :meth:`max` (same NaN caveat)."""
        width = self.w
        while width > 1:
            half = width // 2
            t = f"<{width} x float>"
            a = self.let(f"shufflevector {t} {v}, {t} poison, {_mask(list(range(half)))}")
            b = self.let(f"shufflevector {t} {v}, {t} poison, {_mask(list(range(half, width)))}")
            c = self.let(f"fcmp ogt <{half} x float> {a}, {b}")
            v = self.let(f"select <{half} x i1> {c}, <{half} x float> {a}, <{half} x float> {b}")
            width = half
        return self.let(f"extractelement <1 x float> {v}, i64 0")

    def fma(self, a: str, b: str, c: str) -> str:
        name, declaration = vector_fma(self.w)
        self.declare(declaration)
        return self.let(f"call {self.f} {name}({self.f} {a}, {self.f} {b}, {self.f} {c})")

    def intrinsic(self, name: str, *args: str) -> str:
        """``llvm.<name>.v<w>f32`` on float vectors (``maximum`` propagates NaN, as torch does)."""
        full = f"llvm.{name}.v{self.w}f32"
        self.declare(f"declare {self.f} @{full}({', '.join([self.f] * len(args))})")
        return self.let(f"call {self.f} @{full}({', '.join(f'{self.f} {a}' for a in args)})")

    def hsum(self, v: str) -> str:
        """The sum of the lanes, as a fixed tree (halves added lane by lane): one order on every run."""
        width = self.w
        while width > 1:
            half = width // 2
            lo = "<" + ", ".join(f"i32 {k}" for k in range(half)) + ">"
            hi = "<" + ", ".join(f"i32 {k + half}" for k in range(half)) + ">"
            src = f"<{width} x float>"
            a = self.let(f"shufflevector {src} {v}, {src} poison, <{half} x i32> {lo}")
            b = self.let(f"shufflevector {src} {v}, {src} poison, <{half} x i32> {hi}")
            v = self.let(f"fadd <{half} x float> {a}, {b}")
            width = half
        return self.let(f"extractelement <1 x float> {v}, i64 0")

    def transpose(self, rows: list[str]) -> list[str]:
        """The ``w x w`` transpose of ``rows`` (row ``k``'s lane ``l`` becomes row ``l``'s lane ``k``).

        x86's cheap shuffles, as compilers write it: interleave pairs of floats, then pairs of
        pairs, then whole 128-bit blocks (one ``vshuff32x4``-like step per stage). The lanes
        are followed symbolically as the shuffles are written, and the result is checked to
        be the transpose."""
        w = self.w
        assert len(rows) == w and w >= 4 and w & (w - 1) == 0
        vecs = [(r, [(k, c) for c in range(w)]) for k, r in enumerate(rows)]

        def shuffle(a: tuple[str, list[tuple[int, int]]], b: tuple[str, list[tuple[int, int]]],
                    lanes: list[int]) -> tuple[str, list[tuple[int, int]]]:
            both = a[1] + b[1]
            value = self.let(f"shufflevector {self.f} {a[0]}, {self.f} {b[0]}, {_mask(lanes)}")
            return value, [both[k] for k in lanes]

        def within(hi: bool, wide: bool) -> list[int]:  # unpck{l,h}{ps,pd}: inside each 128-bit block
            out = []
            for block in range(w // 4):
                at = 4 * block + (2 if hi else 0)
                out += [at, at + 1, w + at, w + at + 1] if wide else [at, w + at, at + 1, w + at + 1]
            return out

        pairs = [shuffle(vecs[2 * k], vecs[2 * k + 1], within(hi, False))
                 for k in range(w // 2) for hi in (False, True)]
        quads: list[tuple[str, list[tuple[int, int]]]] = []
        for g in range(w // 4):
            a0, a1, a2, a3 = pairs[4 * g:4 * g + 4]
            quads += [shuffle(a0, a2, within(False, True)), shuffle(a0, a2, within(True, True)),
                      shuffle(a1, a3, within(False, True)), shuffle(a1, a3, within(True, True))]
        blocks = w // 4
        step = 1
        while step < blocks:  # even blocks of a then b, odd blocks of a then b
            evens = [4 * k + e for k in range(0, blocks, 2) for e in range(4)]
            odds = [4 * k + e for k in range(1, blocks, 2) for e in range(4)]
            even = evens + [w + x for x in evens]
            odd = odds + [w + x for x in odds]
            nxt = list(quads)
            for c in range(4):
                group = [4 * g + c for g in range(blocks)]
                for n, k in enumerate(group):
                    if n & step:
                        continue
                    partner = group[n + step]
                    nxt[k] = shuffle(quads[k], quads[partner], even)
                    nxt[partner] = shuffle(quads[k], quads[partner], odd)
            quads = nxt
            step *= 2
        by_column: dict[int, str] = {}
        for value, lanes in quads:
            column = lanes[0][1]
            assert lanes == [(k, column) for k in range(w)], "transpose network is wrong"
            by_column[column] = value
        return [by_column[c] for c in range(w)]

    def sum_rows(self, rows: list[str]) -> str:
        """One vector whose lane ``k`` is the sum of ``rows[k]``'s lanes (``w`` rows): pairs of vectors
        halve their partial sums per row by two shuffles and an add, a fixed tree of log2(w) levels."""
        w, g = self.w, self.w  # g: partial sums per row in each vector
        assert len(rows) == w and w & (w - 1) == 0
        while len(rows) > 1:
            half, per = g // 2, w // g  # per: rows held by each vector
            lo = [r * g + t for r in range(per) for t in range(half)]
            lo += [w + x for x in lo]
            hi = [x + half for x in lo]
            rows = [self.let(f"fadd {self.f} {self.let(f'shufflevector {self.f} {a}, {self.f} {b}, {_mask(lo)}')}, "
                             f"{self.let(f'shufflevector {self.f} {a}, {self.f} {b}, {_mask(hi)}')}")
                    for a, b in zip(rows[::2], rows[1::2])]
            g = half
        return rows[0]

    def tanh(self, x: str) -> str:
        """tanh as Cephes' tanhf: an odd polynomial below |x| = 0.625, else 1 - 2 / (exp(2|x|) + 1)
        with x's sign (a few ulp; +-1 past |x| = 44, NaN stays NaN)."""
        f = self.f
        ax = self.intrinsic("fabs", x)
        z = self.let(f"fmul {f} {x}, {x}")
        p = self.const(float_const(-5.70498872745e-3))
        for c in (2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1):
            p = self.intrinsic("fmuladd", p, z, self.const(float_const(c)))
        small = self.intrinsic("fmuladd", self.let(f"fmul {f} {p}, {z}"), x, x)
        e = self.exp(self.let(f"fadd {f} {ax}, {ax}"))
        plus = self.let(f"fadd {f} {e}, splat (float 1.0)")
        big = self.let(f"fsub {f} splat (float 1.0), {self.let(f'fdiv {f} splat (float 2.0), {plus}')}")
        big = self.intrinsic("copysign", big, x)
        near = self.let(f"fcmp olt {f} {ax}, {self.const(float_const(0.625))}")
        return self.let(f"select {self.ty('i1')} {near}, {f} {small}, {f} {big}")

    def erf(self, x: str) -> str:
        """erf on every lane: the steps of the scalar form (:func:`arke.targets.llvm.mathlib.erf_steps`)."""
        return erf_steps(x, self.f, self.ty("i1"), lambda v: self.const(float_const(v)), self.let,
                         lambda a, b, c: self.intrinsic("fmuladd", a, b, c))

    def exp(self, v: str) -> str:
        for d in vector_expf(self.w):
            self.declare(d)
        return self.let(f"call {self.f} @arke.expf.v{self.w}({self.f} {v})")


def _mask(lanes: list[int]) -> str:
    return f"<{len(lanes)} x i32> <" + ", ".join(f"i32 {k}" for k in lanes) + ">"


# The steps of llvm_lib's scalar exp (Cephes' expf): clamp to [-104, 89] by compare-and-select
# (NaN stays NaN), n = x log2(e) rounded to even, r = x - n ln2 in two fused steps, exp(r) by a
# degree-6 polynomial in fused multiply-adds, then times 2^n. A lane below -104 is 0 (exp rounds
# to 0 there; -inf from a mask among them) without scaling down to an underflow: on x86 each
# instruction whose result underflows costs a microcode assist of over a hundred cycles (causal
# attention's masked lanes paid it on every tile). With 512-bit vectors the scaling is one
# ``vscalefps`` by the float n, masked to zero on those lanes (a masked lane raises nothing);
# elsewhere two exact powers of two (n can be 128), those lanes computed as exp(0) and selected 0.
_EXP = {name: float_const(v) for name, v in {
    "lo": -104.0, "hi": 89.0, "log2e": 1.44269504088896341, "mln2hi": -0.693359375,
    "mln2lo": 2.12194440e-4, "p0": 1.9875691500e-4, "p1": 1.3981999507e-3, "p2": 8.3334519073e-3,
    "p3": 4.1665795894e-2, "p4": 1.6666665459e-1, "p5": 5.0000001201e-1}.items()}


def vector_expf(w: int) -> tuple[str, ...]:
    """Declarations and the definition of ``@arke.expf.v<w>``: exp on ``w`` lanes at once."""
    f, i, b = f"<{w} x float>", f"<{w} x i32>", f"<{w} x i1>"

    def c(name: str) -> str:
        return f"splat (float {_EXP[name]})"

    def fma(x: str, y: str, z: str) -> str:
        return f"call {f} @llvm.fmuladd.v{w}f32({f} %{x}, {f} {y}, {f} {z})"

    decls: tuple[str, ...] = (f"declare {f} @llvm.roundeven.v{w}f32({f})",
                              f"declare {f} @llvm.fmuladd.v{w}f32({f}, {f}, {f})")
    if w == 16:  # AVX-512: x * 2^floor(n) in one instruction, zero where masked off
        decls += (f"declare {f} @llvm.x86.avx512.mask.scalef.ps.512({f}, {f}, {f}, i16, i32)",)
        low = f"  %x1 = select {b} %below, {f} {c('lo')}, {f} %x"
        scale = "\n".join([
            f"  %keep = xor {b} %below, splat (i1 true)", f"  %bits = bitcast {b} %keep to i16",
            f"  %v = call {f} @llvm.x86.avx512.mask.scalef.ps.512({f} %y, {f} %nf, {f} zeroinitializer, "
            "i16 %bits, i32 4)"])
    else:
        low = f"  %x1 = select {b} %below, {f} zeroinitializer, {f} %x"
        scale = "\n".join([
            f"  %n0 = fptosi {f} %nf to {i}", f"  %n = freeze {i} %n0",
            f"  %n1 = ashr {i} %n, splat (i32 1)", f"  %n2 = sub {i} %n, %n1",
            f"  %e1 = add {i} %n1, splat (i32 127)", f"  %e2 = add {i} %n2, splat (i32 127)",
            f"  %bits1 = shl {i} %e1, splat (i32 23)", f"  %bits2 = shl {i} %e2, splat (i32 23)",
            f"  %s1 = bitcast {i} %bits1 to {f}", f"  %s2 = bitcast {i} %bits2 to {f}",
            f"  %v0 = fmul {f} %y, %s1", f"  %v1 = fmul {f} %v0, %s2",
            f"  %v = select {b} %below, {f} zeroinitializer, {f} %v1"])
    body = f"""define internal {f} @arke.expf.v{w}({f} %x) alwaysinline {{
entry:
  %below = fcmp olt {f} %x, {c("lo")}
{low}
  %above = fcmp ogt {f} %x1, {c("hi")}
  %xc = select {b} %above, {f} {c("hi")}, {f} %x1
  %t = fmul {f} %xc, {c("log2e")}
  %nf = call {f} @llvm.roundeven.v{w}f32({f} %t)
  %r1 = {fma("nf", c("mln2hi"), "%xc")}
  %r = {fma("nf", c("mln2lo"), "%r1")}
  %p1 = {fma("r", c("p0"), c("p1"))}
  %p2 = {fma("p1", "%r", c("p2"))}
  %p3 = {fma("p2", "%r", c("p3"))}
  %p4 = {fma("p3", "%r", c("p4"))}
  %p5 = {fma("p4", "%r", c("p5"))}
  %z = fmul {f} %r, %r
  %y0 = {fma("p5", "%z", "%r")}
  %y = fadd {f} %y0, splat (float 1.0)
{scale}
  ret {f} %v
}}"""
    return (*decls, body)
