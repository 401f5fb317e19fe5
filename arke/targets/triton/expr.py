"""SemanticIR scalar expressions as Triton source over block tensors (shared by every Triton renderer).

The API other Triton renderers (contraction, attention) build on:

* :class:`Source` — the body of one ``@triton.jit`` function being written: ``fresh()`` gives a
  new mangled name (``x<n>``), ``line(text, depth)`` appends a statement, ``dim(d)`` gives an
  ``int64`` scalar expression of a dim (over the kernel parameters ``d<j>``, cached, emitted at
  the top of the function), ``pointer(buffer_name)`` the pointer parameter ``b<i>``, and
  ``err`` the name of the error-word pointer (``ws``) once ``needs_err()`` has been called;
  ``local`` maps values kept in the workspace to ``(pointer text, Buffer layout)``.
* :class:`Emitter` — ``Emitter(src, shape, index, mask, depth)`` emits expressions over one
  block: ``shape`` is the block's shape text (``"[BLOCK]"``, ``"[BO, BR]"``), ``index`` maps
  each axis name to a Triton expression of its int64 positions (broadcastable to ``shape``,
  scalars allowed), ``mask`` a bool tensor text of the valid lanes (or None: all valid).
  ``emitter.expr(e) -> str`` returns a variable holding ``e`` over the whole block in its
  *compute* type (f32 for f16/bf16, int1 for bool; see :data:`COMPUTE`), emitting the
  statements needed at ``depth``. ``load(e)`` is a masked load with checked subscripts;
  ``store(buffer, subs, value, dtype)`` stores a compute-typed value rounded to ``dtype``;
  ``registers`` maps an SSA value to a ``[1]`` tensor variable holding it (loads of it read that);
  ``convert(v, src, dst)`` converts between compute types; ``combine(kind, a, b, dtype)`` is
  one step of a reduction (NaN-propagating max/min); :func:`fold` folds an accumulator block.
  ``inline`` maps an SSA value name to a function that returns its expression for given
  subscripts (values that never reach memory).
* :data:`HELPERS` — the module-level ``@triton.jit`` helpers the emitted code calls (pow, tanh,
  a product fold); put it once in the module. ``sin``/``cos`` call ``_ak_sin``/``_ak_cos``, whose
  text is :data:`arke.targets.triton.trig.TRIG_HELPERS` (added where a module calls them). Floor
  division, Python's modulo and NaN-propagating max/min are inline expressions
  (:func:`floordiv_text`, :func:`mod_text`, :func:`max_text`): Triton's interpreter makes every
  call of a helper slow.

Semantics follow :mod:`arke.runtime.interp`: f16/bf16 compute in f32 and round when stored or
cast; integer ``div``/``mod`` floor; an integer division by zero or an out-of-range subscript
never faults: the lane uses a safe value and raises the error word, after which the runtime
asks the interpreter for the exact error. No identifier from a ``.ak`` file ever reaches the
text: only mangled names and numbers do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, dim_str
from arke.plan.dispatch import Buffer, KernelPlan
from arke.targets.artifact import UnsupportedError

#: Triton types values are computed in.
COMPUTE = {DType.F32: "tl.float32", DType.F16: "tl.float32", DType.BF16: "tl.float32", DType.I64: "tl.int64",
           DType.I32: "tl.int32", DType.I8: "tl.int8", DType.BOOL: "tl.int1", DType.U8: "tl.uint8",
           DType.U16: "tl.uint16", DType.U32: "tl.uint32"}
#: Triton types values are stored in.
STORAGE = {DType.F32: "tl.float32", DType.F16: "tl.float16", DType.BF16: "tl.bfloat16", DType.I64: "tl.int64",
           DType.I32: "tl.int32", DType.I8: "tl.int8", DType.BOOL: "tl.int1", DType.U8: "tl.uint8",
           DType.U16: "tl.uint16", DType.U32: "tl.uint32"}
#: Bitwise operators (Triton's are Python's; on unsigned types ``>>`` is logical, on signed arithmetic).
_BITWISE = {"bitand": "&", "bitor": "|", "bitxor": "^", "shl": "<<", "shr": ">>"}

HELPERS = '''
@triton.jit
def _ak_mul(a, b):
    return a * b


@triton.jit
def _ak_tanh(x):
    t = tl.exp(-2.0 * tl.abs(x))
    y = (1.0 - t) / (1.0 + t)
    return tl.where(x != x, x, tl.where(x < 0, -y, y))


@triton.jit
def _ak_pow(a, b):
    lg = tl.log2(tl.abs(a))
    m = tl.exp2(tl.where(lg == 0, 0.0, b * lg))  # (±1) ** inf and 1 ** nan are 1, not exp2(inf * 0)
    whole = tl.floor(b) == b
    odd = whole & (tl.abs(b - 2.0 * tl.floor(b * 0.5)) == 1.0)
    r = tl.where(odd & (a.to(tl.int32, bitcast=True) < 0), -m, m)  # the sign bit: -0 to an odd power too
    r = tl.where((a < 0) & (a > float("-inf")) & (~whole), float("nan"), r)
    return tl.where(b == 0, 1.0, r)
'''

_FLOAT_UNARY = {"exp": "tl.exp({})", "log": "tl.log({})", "sqrt": "tl.sqrt_rn({})", "rsqrt": "(1.0 / tl.sqrt_rn({}))",
                "abs": "tl.abs({})", "sin": "_ak_sin({})", "cos": "_ak_cos({})", "floor": "tl.floor({})",
                "ceil": "tl.ceil({})", "exp2": "tl.exp2({})", "log2": "tl.log2({})", "erf": "tl.erf({})",
                "tanh": "_ak_tanh({})", "neg": "(-{})", "sigmoid": "(1.0 / (1.0 + tl.exp(-{})))"}
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def floordiv_text(a: str, b: str) -> str:
    """Floor division of two integer names (Triton's ``//`` truncates, as C does) as one expression."""
    return f"({a} // {b} - (({a} % {b} != 0) & (({a} % {b} < 0) != ({b} < 0))).to({a}.dtype))"


def mod_text(a: str, b: str, floats: bool = False) -> str:
    """Python's modulo of two names (the divisor's sign; Triton's ``%`` is C's) as one expression; on
    ``floats`` a zero remainder takes the divisor's sign too (``5.0 % -1.0`` is -0.0)."""
    moved = f"tl.where(({a} % {b} != 0) & (({a} % {b} < 0) != ({b} < 0)), {a} % {b} + {b}, {a} % {b})"
    if not floats:
        return moved
    return f"tl.where({a} % {b} == 0, tl.where({b} < 0, -0.0, 0.0), {moved})"


def max_text(kind: str, a: str, b: str) -> str:
    """NaN-propagating float ``max``/``min`` of two names as one expression."""
    return f"tl.where({a} != {a}, {a}, tl.where({b} != {b}, {b}, tl.{kind}imum({a}, {b})))"


def float_literal(value: float) -> str:
    """A Python float literal Triton reads as f32 (infinities and NaN included)."""
    if math.isnan(value):
        return 'float("nan")'
    if math.isinf(value):
        return 'float("inf")' if value > 0 else 'float("-inf")'
    return repr(float(value))


def identity(kind: str, dtype: DType) -> str:
    """A reduction's identity as a literal of ``dtype``'s accumulator."""
    if kind == "sum":
        return "0.0" if dtype.is_float else "0"
    if kind == "prod":
        return "1.0" if dtype.is_float else "1"
    low = kind == "max"
    if dtype.is_float:
        return float_literal(-math.inf if low else math.inf)
    if dtype.is_bool:
        return "0" if low else "1"
    bits = dtype.bits
    if dtype.is_unsigned:  # accumulated in int64, where the type's whole range fits
        return "0" if low else str(2 ** bits - 1)
    return str(-(2 ** (bits - 1)) if low else 2 ** (bits - 1) - 1)


def accumulator(dtype: DType, kind: str = "sum") -> str:
    """The Triton type a reduction of ``dtype`` accumulates in (f32 for floats, i64 for integers; an
    unsigned ``max``/``min`` in its own type, which cannot overflow and keeps the registers small)."""
    if dtype.is_float:
        return "tl.float32"
    if dtype.is_unsigned and kind in ("max", "min"):
        return COMPUTE[dtype]
    return "tl.int32" if dtype.is_bool else "tl.int64"


class Source:
    """The body of one ``@triton.jit`` function: statements, mangled names and dims."""

    def __init__(self, plan: KernelPlan):
        self.plan = plan
        self.header: list[str] = []  # dims, computed once at the top of the function
        self.lines: list[str] = []
        self.n = 0
        self._dims: dict[str, str] = {}
        self.err: str | None = None
        #: values kept in the workspace (a rows dispatch's wide internal values): name -> (pointer, layout)
        self.local: dict[str, tuple[str, Buffer]] = {}

    def fresh(self) -> str:
        self.n += 1
        return f"x{self.n}"

    def line(self, text: str, depth: int) -> None:
        self.lines.append("    " * depth + text)

    def needs_err(self) -> str:
        """The error-word pointer (the dispatch's workspace, ``ws``): a lane raises it by storing 1."""
        self.err = "ws"
        return self.err

    def pointer(self, name: str) -> str:
        if name in self.local:
            return self.local[name][0]
        return f"b{self.plan.buffer_index(name)}"

    def buffer(self, name: str) -> Buffer:
        if name in self.local:
            return self.local[name][1]
        return self.plan.buffers[self.plan.buffer_index(name)]

    def dim(self, d: Dim) -> str:
        """An int64 scalar holding ``d`` (emitted once, at the top of the function)."""
        d = sympy.sympify(d)
        key = dim_str(d)
        if key not in self._dims:
            text = self._dim(d)
            name = self.fresh()
            self.header.append(f"    {name} = tl.cast({text}, tl.int64)")
            self._dims[key] = name
        return self._dims[key]

    def _dim(self, d: sympy.Expr) -> str:
        if d.is_Integer:
            return str(int(d))
        if d.is_Symbol:
            return f"tl.cast(d{self.plan.dims.index(str(d))}, tl.int64)"
        if isinstance(d, sympy.Add):
            return "(" + " + ".join(self.dim(a) for a in d.args) + ")"
        if isinstance(d, sympy.Mul):
            num, den = sympy.fraction(d)
            if den != 1:
                return floordiv_text(self.dim(num), self.dim(den))
            return "(" + " * ".join(self.dim(a) for a in d.args) + ")"
        if isinstance(d, sympy.floor):
            num, den = sympy.fraction(sympy.together(d.args[0]))
            return floordiv_text(self.dim(num), self.dim(den))
        if isinstance(d, sympy.Mod):
            return mod_text(self.dim(d.args[0]), self.dim(d.args[1]))
        if isinstance(d, sympy.Pow) and d.exp.is_Integer and int(d.exp) > 0:
            return "(" + " * ".join([self.dim(d.base)] * int(d.exp)) + ")"
        if isinstance(d, sympy.Max | sympy.Min):
            fn = "tl.maximum" if isinstance(d, sympy.Max) else "tl.minimum"
            out = self.dim(d.args[0])
            for a in d.args[1:]:
                out = f"{fn}({out}, {self.dim(a)})"
            return out
        raise UnsupportedError(f"dim {dim_str(d)} cannot be computed on the triton target")


class Emitter:
    """Emits scalar expressions over one block of lanes (see the module doc for the contract)."""

    def __init__(self, src: Source, shape: str, index: Mapping[str, str], mask: str | None, depth: int,
                 inline: Mapping[str, Callable[[Sequence[ir.SExpr]], ir.SExpr]] | None = None):
        self.src, self.shape, self.index, self.mask, self.depth = src, shape, dict(index), mask, depth
        self.inline = dict(inline or {})
        self.registers: dict[str, str] = {}  # value -> a ``[1]`` tensor holding it (per-row statistics)
        self.extent: dict[str, Dim] = {}  # axis -> extent, for subscripts known in range

    def let(self, rhs: str) -> str:
        name = self.src.fresh()
        self.src.line(f"{name} = {rhs}", self.depth)
        return name

    def full(self, value: str, ty: str) -> str:
        """``value`` (a scalar or a broadcastable tensor) as a whole block of type ``ty``."""
        return self.let(f"({value} + tl.full({self.shape}, 0, {ty})).to({ty})")

    def flag(self, bad: str) -> None:
        """Raise the error word in lanes where ``bad`` holds (masked-off lanes never do)."""
        err = self.src.needs_err()
        cond = f"({bad}) & ({self.mask})" if self.mask else bad
        self.src.line(f"tl.store({err} + tl.full({self.shape}, 0, tl.int32), tl.full({self.shape}, 1, tl.int64), "
                      f"mask={cond})", self.depth)

    # -- expressions
    def expr(self, e: ir.SExpr) -> str:
        method: Callable[[ir.SExpr], str] = getattr(self, "_x_" + type(e).__name__)
        return method(e)

    def _x_Const(self, e: ir.Const) -> str:
        if e.dtype.is_float:
            v = float(e.value)
            if e.dtype in (DType.F16, DType.BF16):
                return self.rounded(self.let(f"tl.full({self.shape}, {float_literal(v)}, tl.float32)"), e.dtype)
            return self.let(f"tl.full({self.shape}, {float_literal(v)}, tl.float32)")
        if e.dtype.is_bool:
            return self.let(f"tl.full({self.shape}, {1 if e.value else 0}, tl.int1)")
        return self.let(f"tl.full({self.shape}, {int(e.value)}, {COMPUTE[e.dtype]})")

    def _x_Idx(self, e: ir.Idx) -> str:
        if e.name not in self.index:
            raise UnsupportedError(f"index {e.name!r} is not an axis of this block")
        return self.full(self.index[e.name], COMPUTE[e.dtype])

    def _x_DimRef(self, e: ir.DimRef) -> str:
        return self.full(self.src.dim(e.dim), COMPUTE[e.dtype])

    def _x_Load(self, e: ir.Load) -> str:
        if e.src in self.registers:
            return self.full(self.registers[e.src], COMPUTE[e.dtype])
        if e.src in self.inline:
            return self.expr(self.inline[e.src](e.indices))
        return self.load(e)

    def _x_Cast(self, e: ir.Cast) -> str:
        if e.dtype in (DType.F16, DType.BF16) and e.x.dtype == e.dtype:  # a computed 16-bit value, held in f32:
            return self.rounded(self.expr(e.x), e.dtype)  # the cast is its store's rounding (passes/fuse.py)
        return self.convert(self.expr(e.x), e.x.dtype, e.dtype)

    def convert(self, v: str, src: DType, dst: DType) -> str:
        """``v`` (in ``src``'s compute type) in ``dst``'s compute type, rounded to ``dst``."""
        if src == dst:
            return v
        if dst.is_bool:
            return self.let(f"{v} != 0")
        if dst in (DType.F16, DType.BF16):
            return self.rounded(self.let(f"{v}.to(tl.float32)"), dst)
        if src.is_float and not dst.is_float:  # through int64, saturating (NaN is 0), then wrapped, as the interpreter
            top, low = self.let(f"{v} >= 9223372036854775808.0"), self.let(f"{v} < -9223372036854775808.0")
            safe = self.let(f"tl.where({top} | {low} | ({v} != {v}), 0.0, {v}).to(tl.int64)")
            wide = self.let(f"tl.where({top}, 9223372036854775807, tl.where({low}, -9223372036854775807 - 1, {safe}))")
            return wide if COMPUTE[dst] == "tl.int64" else self.let(f"{wide}.to({COMPUTE[dst]})")
        return self.let(f"{v}.to({COMPUTE[dst]})")

    def rounded(self, v: str, dtype: DType) -> str:
        """An f32 ``v`` rounded (to nearest even) to 16-bit float ``dtype``, still held in f32.

        bf16 rounds in integer code: a plain ``.to(tl.bfloat16)`` truncates in Triton's interpreter."""
        if dtype is DType.BF16:
            bits = self.let(f"{v}.to(tl.float32).to(tl.int32, bitcast=True)")
            up = self.let(f"(({bits} + 0x7FFF + (({bits} >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)")
            return self.let(f"tl.where({v} != {v}, {v}, {up})")
        if dtype is DType.F16:
            return self.let(f"{v}.to(tl.float32).to(tl.float16).to(tl.float32)")
        return v

    def _x_Select(self, e: ir.Select) -> str:
        c, a, b = self.expr(e.cond), self.expr(e.a), self.expr(e.b)
        return self.let(f"tl.where({c}, {a}, {b})")

    def _x_Unary(self, e: ir.Unary) -> str:
        x = self.expr(e.x)
        op = e.op
        if op == "not":
            return self.let(f"{x} == 0")
        if op == "bitnot":
            return self.let(f"~{x}")
        if e.dtype.is_unsigned and op in ("abs", "relu"):
            return x  # never negative
        if e.dtype.is_unsigned and op == "neg":
            return self.let(f"tl.zeros_like({x}) - {x}")  # wraps modulo 2**width
        if not e.dtype.is_float:
            if op == "neg":
                return self.let(f"-{x}")
            if op == "abs":
                return self.let(f"tl.where({x} < 0, -{x}, {x})")
            if op == "relu":
                return self.let(f"tl.where({x} > 0, {x}, 0).to({COMPUTE[e.dtype]})")
            if op in ("floor", "ceil"):
                return x
            raise UnsupportedError(f"unimplemented integer `{op}` in triton lowering")
        if op in _FLOAT_UNARY:
            return self.let(_FLOAT_UNARY[op].format(x))
        if op == "relu":
            zero = self.let(f"tl.full({self.shape}, 0, tl.float32)")
            return self.let(max_text("max", x, zero))
        if op == "silu":
            return self.let(f"{x} / (1.0 + tl.exp(-{x}))")
        if op == "gelu":
            return self.let(f"0.5 * {x} * (1.0 + tl.erf({x} * {float_literal(math.sqrt(0.5))}))")
        raise UnsupportedError(f"unimplemented primitive in triton lowering: {op}")

    def _x_Binary(self, e: ir.Binary) -> str:
        a, b = self.expr(e.a), self.expr(e.b)
        op = e.op
        if op in ("and", "or"):
            return self.let(f"{a} {'&' if op == 'and' else '|'} {b}")
        if op in _COMPARE:
            return self.let(f"{a} {_COMPARE[op]} {b}")
        ct = COMPUTE[e.dtype]
        if op in ir.SHIFTS:  # the i64 count is checked, never masked: a bad lane shifts by 0
            bad = self.let(f"({b} < 0) | ({b} >= {e.dtype.bits})")
            self.flag(bad)
            b = self.let(f"tl.where({bad}, 0, {b}).to({ct})")
        a, b = self.let(f"{a}.to({ct})"), self.let(f"{b}.to({ct})")
        if op in _BITWISE:
            return self.let(f"{a} {_BITWISE[op]} {b}")
        if op in ("add", "sub", "mul"):
            return self.let(f"{a} {dict(add='+', sub='-', mul='*')[op]} {b}")
        if e.dtype.is_float:
            if op == "div":
                return self.let(f"tl.div_rn({a}, {b})")
            if op == "floordiv":
                return self.let(f"tl.floor(tl.div_rn({a}, {b}))")
            if op == "mod":
                return self.let(mod_text(a, b, floats=True))
            if op in ("max", "min"):
                return self.let(max_text(op, a, b))
            if op == "pow":
                return self.let(f"_ak_pow({a}, {b})")
            raise UnsupportedError(f"unimplemented primitive in triton lowering: {op}")
        if op in ("max", "min"):
            return self.let(f"tl.{op}imum({a}, {b})")
        if op in ("div", "floordiv", "mod"):
            zero = self.let(f"{b} == 0")
            self.flag(zero)
            safe = self.let(f"tl.where({zero}, 1, {b}).to({ct})")
            return self.let(mod_text(a, safe) if op == "mod" else floordiv_text(a, safe))
        if op == "pow":
            return self.int_pow(a, b, ct, e.dtype.bits)
        raise UnsupportedError(f"unimplemented integer `{op}` in triton lowering")

    def int_pow(self, a: str, b: str, ct: str, bits: int) -> str:
        """``a ** b`` on integers by squaring (wrapping); a negative exponent raises the error word."""
        self.flag(f"{b} < 0")
        r, base, ex = self.let(f"tl.full({self.shape}, 1, {ct})"), self.let(f"{a} + 0"), self.let(f"{b} + 0")
        i = self.src.fresh()
        self.src.line(f"for {i} in range(0, {bits}):", self.depth)
        self.src.line(f"{r} = tl.where(({ex} & 1) != 0, {r} * {base}, {r})", self.depth + 1)
        self.src.line(f"{base} = {base} * {base}", self.depth + 1)
        self.src.line(f"{ex} = {ex} >> 1", self.depth + 1)
        return r

    # -- memory
    def offset(self, buf: Buffer, subs: Sequence[ir.SExpr]) -> str:
        """The row-major element offset of ``subs`` in ``buf`` (an int64 block), each subscript checked."""
        offset = "0"
        for k, (s, extent) in enumerate(zip(subs, buf.shape)):
            v = self.subscript(s, extent)
            offset = v if k == 0 else self.let(f"{offset} * {self.src.dim(extent)} + {v}")
        return self.full(offset, "tl.int64")

    def subscript(self, s: ir.SExpr, extent: Dim) -> str:
        """A subscript's value: a plain in-range index as it is, anything else checked and made safe."""
        v = self.expr(s if s.dtype == DType.I64 else ir.Cast(s, DType.I64))
        if isinstance(s, ir.Idx) and s.name in self.extent and \
                sympy.sympify(self.extent[s.name]) == sympy.sympify(extent):
            return v
        if isinstance(s, ir.Const) and int(s.value) == 0:
            return v
        n = self.src.dim(extent)
        ok = self.let(f"({v} >= 0) & ({v} < {n})")
        self.flag(f"~{ok}")
        return self.let(f"tl.where({ok}, {v}, 0)")

    def load(self, e: ir.Load) -> str:
        """A masked load of ``e`` in its compute type (no lane outside the mask touches memory)."""
        buf = self.src.buffer(e.src)
        off = self.offset(buf, e.indices)
        mask = f", mask={self.mask}, other=0" if self.mask else ""
        raw = self.let(f"tl.load({self.src.pointer(e.src)} + {off}{mask})")
        if buf.dtype is DType.BF16:  # widened on the bits: Triton's interpreter converts subnormals wrongly
            bits = self.let(f"{raw}.to(tl.uint16, bitcast=True).to(tl.uint32)")
            return self.let(f"({bits} << 16).to(tl.float32, bitcast=True)")
        if buf.dtype is DType.F16:
            return self.let(f"{raw}.to(tl.float32)")
        if buf.dtype is DType.BOOL:
            return self.let(f"{raw} != 0")
        return raw

    def store(self, buf: Buffer, subs: Sequence[ir.SExpr], value: str, dtype: DType) -> None:
        """Store a compute-typed ``value`` at ``subs`` of ``buf`` (rounded to its dtype), masked."""
        off = self.offset(buf, subs)
        mask = f", mask={self.mask}" if self.mask else ""
        v = self.let(f"tl.broadcast_to({value}, {self.shape})")
        if buf.dtype is DType.BF16:  # rounded, then narrowed on the bits (exact: the low half is zero)
            v = self.rounded(v, buf.dtype)
            top = self.let(f"({v}.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16)")
            v = self.let(f"{top}.to(tl.bfloat16, bitcast=True)")
        self.src.line(f"tl.store({self.src.pointer(buf.name)} + {off}, {v}.to({STORAGE[buf.dtype]}){mask})",
                      self.depth)

    def combine(self, kind: str, a: str, b: str, dtype: DType) -> str:
        """One step of reduction ``kind`` over accumulators of ``dtype`` (NaN wins max/min on floats)."""
        if kind == "sum":
            return self.let(f"{a} + {b}")
        if kind == "prod":
            return self.let(f"{a} * {b}")
        if dtype.is_float:
            return self.let(max_text(kind, a, b))
        return self.let(f"tl.{kind}imum({a}, {b})")


def fold(kind: str, dtype: DType, acc: str, axis: int) -> str:
    """An expression folding the lanes of accumulator block ``acc`` along ``axis`` by reduction
    ``kind`` (``tl.sum``/``tl.max``/``tl.min``, with NaN winning float max/min explicitly)."""
    if kind == "sum":
        return f"tl.sum({acc}, {axis})"
    if kind == "prod":
        return f"tl.reduce({acc}, {axis}, _ak_mul)"
    fn = f"tl.{kind}({acc}, {axis})"
    if not dtype.is_float:
        return fn
    return f"tl.where(tl.max(({acc} != {acc}).to(tl.int32), {axis}) > 0, float(\"nan\"), {fn})"
