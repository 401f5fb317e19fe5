# mypy: disable-error-code="arg-type,dict-item,return-value"
# (moved from tests/support: a bound is None only where the caller has already returned, which mypy cannot see)
"""A kernel's rounding-error bound, computed by the reference interpreter itself.

:func:`error_kernel` turns a kernel's SemanticIR into a kernel that returns, besides the
kernel's own results (bit for bit the interpreter's), one more f32 tensor per float result:
``D``, in units of f32's unit roundoff ``u = 2**-24``, a bound on how far the value of any
conforming implementation (another order of the sums, another libm, fused multiply-adds,
tensor cores) may lie from the interpreter's. It is a first-order forward error analysis
(Wilkinson's running error bound) written as more ops of the same kernel, so the
interpreter evaluates it on the case's own inputs, element by element:

* inputs are exact (``D = 0``); so are integer and boolean values, comparisons, selections'
  conditions, and products whose factors' significant bits fit in f32's 24 (a 16-bit value
  times another, or times a short constant);
* ``a ± b``: ``D(a) + D(b) + 2·|a ± b|`` (each implementation rounds once);
  ``a · b``: ``|b|·D(a) + |a|·D(b) + 2·|a · b|``; ``a / b``, ``pow`` and the math functions
  (``exp``, ``log``, ``tanh``, ``erf``, ``rsqrt`` ...): ``|f'|·D(x)`` plus ``2·LIBM_ULPS``
  ulps of the result (libm, libdevice, torch and the targets' own formulas); ``gelu`` counts
  those ulps on ``|y| + |x|`` (``1 + erf(x / √2)`` cancels for negative ``x``), ``tanh`` on
  ``|y| + 1`` (``exp(2x) - 1`` cancels near 0), ``pow`` on ``|y|·(1 + |b·log a|)`` (as
  ``exp(b·log a)``), ``sin``/``cos`` on 1;
* a scan (spec/language.md §8.9): at position ``n`` a ``cumsum`` is a sum of ``n + 1`` terms
  (the bound of a sum, with scans for the ``Σ``), ``cummax``/``cummin`` the largest ``D`` so far,
  ``cumprod`` relative ``D`` s adding up, and the recurrence ``h = a·h + b`` a sum of ``n + 1``
  products of up to ``n + 1`` factors: ``2·LAMBDA·√(2(n + 1))·H`` with ``H`` the same recurrence
  on ``|a|``, ``|b|`` and ``|init|``, plus the operands' bounds carried along by ``|a|``;
* a ``sum`` or contraction of ``n`` terms ``t``: ``Σ D(t) + 2·LAMBDA·√n·Σ|t|``: Higham and
  Mary's probabilistic bound on a sum in any order (SIAM J. Sci. Comput. 41(5), 2019: within
  ``λ·√n·u·Σ|t|`` of the exact sum with probability at least ``1 - 2·exp(-λ²/2)``), for each
  of the two implementations; ``max``/``min``: the largest ``D``; ``prod``: relative ``D``s add;
* a value rounded to bf16 or f16 (a stored 16-bit op result or an explicit cast): both
  implementations round to the same value when the interpreter's f32 value is farther than
  ``D`` from the nearest rounding boundary (then ``D = 0`` after it), else they may land one
  16-bit ulp apart (``D`` grows by that ulp);
* in a kernel whose float inputs are all 16-bit, tensor cores round the f32 factor of a
  16-bit product in a sum to 16 bits (``p`` before ``p·v``: spec/codegen.md §7): those terms
  add half a 16-bit ulp of themselves.

Discontinuities are not modelled: a comparison, ``floor`` or selection that a rounding could
flip (near-ties in a computed value) is taken as it falls in the interpreter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

import sympy

from arke.ir import semantic as S
from arke.ir.dtypes import DType

F32, BOOL = DType.F32, DType.BOOL
U32 = 2.0 ** -24
#: ulps each implementation's math functions (and divisions) may be off by: the targets compute
#: ``tanh``, ``sigmoid``, ``silu`` from ``exp`` in formulas of their own (measured: ~5 ulps from torch)
LIBM_ULPS = 16
#: λ of the probabilistic bound on a sum's rounding error (see the module doc)
LAMBDA = 2.0
#: mantissa bits (with the implicit one) of the 16-bit floats, and their smallest spacing
MANTISSA = {DType.BF16: 8, DType.F16: 11}
TINY = {DType.BF16: 2.0 ** -133, DType.F16: 2.0 ** -24}
#: the suffix of a value's error bound (``%3`` -> ``%3~``), of a 16-bit value's f32 twin, of an error kernel
ERR, PRE, KERNEL = "~", "^", "~err"


# ---------------------------------------------------------------- expression builders (f32 unless said)

def c(v: float) -> S.Const:
    return S.Const(float(v), F32)


def f32(e: S.SExpr) -> S.SExpr:
    return e if e.dtype is F32 else S.Cast(e, F32)


def add(*parts: S.SExpr | None) -> S.SExpr | None:
    """The sum of the parts that are not ``None`` (``None``: exactly 0)."""
    out: S.SExpr | None = None
    for p in parts:
        if p is not None:
            out = p if out is None else S.Binary("add", out, p, F32)
    return out


def mul(a: S.SExpr, b: S.SExpr) -> S.SExpr:
    return S.Binary("mul", f32(a), f32(b), F32)


def div(a: S.SExpr, b: S.SExpr) -> S.SExpr:
    return S.Binary("div", f32(a), f32(b), F32)


def un(op: str, x: S.SExpr) -> S.SExpr:
    return S.Unary(op, f32(x), F32)


def absolute(e: S.SExpr) -> S.SExpr:
    return un("abs", e)


def finite(e: S.SExpr) -> S.SExpr:
    """``|e|``, or 0 where it is infinite or NaN (those elements are compared exactly)."""
    return S.Select(S.Binary("lt", absolute(e), c(float("inf")), BOOL), absolute(e), c(0.0), F32)


def scaled(factor: S.SExpr, d: S.SExpr | None) -> S.SExpr | None:
    """``factor · d``, and 0 where ``d`` is 0 (an exact operand stays exact whatever its factor)."""
    if d is None:
        return None
    return S.Select(S.Binary("eq", d, c(0.0), BOOL), c(0.0), mul(absolute(factor), d), F32)


def ulps(n: float, y: S.SExpr) -> S.SExpr:
    return mul(c(n), finite(y))


def significant_bits(e: S.SExpr) -> int | None:
    """How many significant bits ``e`` has at most, where the IR shows it: a 16-bit or int8 value as
    read (or its cast), a bool, a constant; ``None`` where it may have all of f32's."""
    if isinstance(e, S.Cast):
        return 1 if e.x.dtype is BOOL else significant_bits(e.x) if e.x.dtype in (*MANTISSA, DType.I8) else None
    if isinstance(e, S.Load):
        return MANTISSA.get(e.dtype, 8 if e.dtype is DType.I8 else None)
    if isinstance(e, S.Const) and isinstance(e.value, float) and abs(e.value) < float("inf"):
        odd = abs(Fraction(e.value).numerator)
        while odd and odd % 2 == 0:
            odd //= 2
        return max(1, odd.bit_length())
    return None


def exact_product(a: S.SExpr, b: S.SExpr) -> bool:
    ba, bb = significant_bits(a), significant_bits(b)
    return ba is not None and bb is not None and ba + bb <= 24


def widened_16_bit(e: S.SExpr) -> DType | None:
    """The 16-bit type of a value as read (a load of one, or its f32 cast), else ``None``."""
    if isinstance(e, S.Cast):
        e = e.x
    return e.dtype if isinstance(e, S.Load) and e.dtype in MANTISSA else None


def rounded_16(d: S.SExpr | None, pre: S.SExpr, dt: DType) -> S.SExpr | None:
    """The bound after ``pre`` (the interpreter's f32 value, bound ``d``) is rounded to 16-bit ``dt``."""
    if d is None:
        return None
    y = absolute(S.Cast(S.Cast(f32(pre), dt), F32))
    x = absolute(pre)
    p2 = un("exp2", un("floor", un("log2", y)))
    ulp = S.Binary("max", mul(p2, c(2.0 ** (1 - MANTISSA[dt]))), c(TINY[dt]), F32)
    below = S.Select(S.Binary("eq", y, p2, BOOL), mul(ulp, c(0.5)), ulp, F32)  # the spacing halves below 2^k
    up = S.Binary("sub", S.Binary("add", y, mul(ulp, c(0.5)), F32), x, F32)
    down = S.Binary("sub", x, S.Binary("sub", y, mul(below, c(0.5)), F32), F32)
    dist = S.Binary("min", up, down, F32)
    flips = S.Binary("ge", mul(d, c(U32)), dist, BOOL)
    return S.Select(flips, add(d, div(ulp, c(U32))), c(0.0), F32)


# ---------------------------------------------------------------- the bound of one expression


@dataclass
class _Body:
    """Builds ``D`` of the expressions of one function (``bounded``: the values that have one)."""

    bounded: set[str]
    tensor_cores: bool

    def d(self, e: S.SExpr) -> S.SExpr | None:
        if isinstance(e, S.Load):
            return S.Load(e.src + ERR, e.indices, F32) if e.src in self.bounded and e.dtype.is_float else None
        if isinstance(e, S.Const | S.Idx | S.DimRef):
            return None
        if isinstance(e, S.Cast):
            if not (e.dtype.is_float and e.x.dtype.is_float):
                return None  # from an integer or bool: exact (or a step: not modelled); to one: a step
            inner = self.d(e.x)
            return rounded_16(inner, e.x, e.dtype) if e.dtype in MANTISSA else inner
        if isinstance(e, S.Select):
            a, b = self.d(e.a), self.d(e.b)
            if a is None and b is None:
                return None
            return S.Select(e.cond, a or c(0.0), b or c(0.0), F32)
        if not e.dtype.is_float:
            return None
        if isinstance(e, S.Unary):
            return self.unary(e)
        return self.binary(e)

    def unary(self, e: S.Unary) -> S.SExpr | None:
        x, dx, y, op = f32(e.x), self.d(e.x), e, e.op
        if op in ("neg", "abs", "relu"):
            return dx
        if op in ("floor", "ceil"):
            return None
        libm = LIBM_ULPS * 2.0
        sig = un("sigmoid", x)
        slopes: dict[str, Callable[[], S.SExpr]] = {
            "exp": lambda: y,
            "exp2": lambda: mul(c(0.6931471805599453), y),
            "log": lambda: div(c(1.0), x),
            "log2": lambda: div(c(1.4426950408889634), x),
            "sqrt": lambda: div(c(0.5), y),
            "rsqrt": lambda: div(mul(c(0.5), y), x),
            "tanh": lambda: S.Binary("sub", c(1.0), mul(y, y), F32),
            "erf": lambda: mul(c(1.1283791670955126), un("exp", un("neg", mul(x, x)))),
            "sigmoid": lambda: mul(y, S.Binary("sub", c(1.0), y, F32)),
            "silu": lambda: add(sig, mul(x, mul(sig, S.Binary("sub", c(1.0), sig, F32)))),
            "gelu": lambda: add(mul(c(0.5), add(c(1.0), un("erf", mul(x, c(0.7071067811865476))))),
                                mul(x, mul(c(0.3989422804014327), un("exp", mul(c(-0.5), mul(x, x)))))),
            "sin": lambda: un("cos", x),
            "cos": lambda: un("sin", x),
        }
        if op not in slopes:
            raise NotImplementedError(f"no error bound for unary `{op}`")
        # the ulps are of the result, except where a target's formula cancels: 1 + erf(x / √2) in gelu
        # (ulps of x), exp(2x) - 1 in tanh near 0 (ulps of 1); sin and cos are within ulps of 1
        rounding = {"gelu": ulps(libm, add(absolute(y), absolute(x))), "tanh": ulps(libm, add(absolute(y), c(1.0))),
                    "sin": c(libm), "cos": c(libm)}.get(op, ulps(libm, y))
        return add(scaled(slopes[op](), dx), rounding)

    def binary(self, e: S.Binary) -> S.SExpr | None:
        a, b, da, db, op = e.a, e.b, self.d(e.a), self.d(e.b), e.op
        if op in ("max", "min"):
            return da if db is None else db if da is None else S.Binary("max", da, db, F32)
        if op in ("add", "sub"):
            return add(da, db, ulps(2.0, e))
        if op == "mul":
            return add(scaled(b, da), scaled(a, db), None if exact_product(a, b) else ulps(2.0, e))
        libm = ulps(LIBM_ULPS * 2.0, e)
        if op == "div":
            return add(scaled(div(c(1.0), b), da), scaled(div(e, b), db), libm)
        if op == "pow":  # targets compute it as exp(b · log a): ulps of b · log a, too
            slope = mul(b, S.Binary("pow", absolute(a), S.Binary("sub", f32(b), c(1.0), F32), F32))
            logged = mul(b, un("log", absolute(a)))
            return add(scaled(slope, da), scaled(mul(e, un("log", absolute(a))), db),
                       ulps(LIBM_ULPS * 2.0, mul(e, add(c(1.0), absolute(logged)))))
        if op == "mod":  # a - b·floor(a / b), exact: slope 1 in a, -floor(a / b) = (e - a) / b in b ...
            bound = add(da, scaled(div(S.Binary("sub", f32(a), f32(e), F32), b), db))
            if bound is None:
                return None
            # ... and never more than the width of the range both sides lie in, |b| and b's own error
            return S.Binary("min", bound, add(div(absolute(b), c(U32)), db), F32)
        if op == "floordiv":
            return None  # a step
        raise NotImplementedError(f"no error bound for binary `{op}`")

    def summed(self, body: S.SExpr, extent: sympy.Expr) -> tuple[S.SExpr | None, S.SExpr, S.SExpr | None]:
        """``(Σ D(t) body, Σ|t| body, √n)`` of a sum of ``body``: the caller reduces the first two."""
        terms = self.d(body)
        if self.tensor_cores and isinstance(body, S.Binary) and body.op == "mul":
            sixteen = [widened_16_bit(body.a), widened_16_bit(body.b)]
            if (sixteen[0] is None) != (sixteen[1] is None):
                dt = sixteen[0] or sixteen[1]
                assert dt is not None
                terms = add(terms, ulps(2.0 ** -MANTISSA[dt] / U32, body))  # half a 16-bit ulp of the term
        return terms, absolute(body), un("sqrt", S.Cast(S.DimRef(extent), F32))


# ---------------------------------------------------------------- whole functions


@dataclass
class _Kernel:
    """The error kernel of ``fn``: its ops, each float value's ``D`` beside it, and the ``D`` results."""

    module: S.Module
    fn: S.Function
    tensor_cores: bool
    inputs_bounded: bool  # a callee's float arguments come with their bounds (parameters ``p~``)
    made: dict[str, S.Function] = field(default_factory=dict)
    ops: list[S.Op] = field(default_factory=list)
    counter: int = 0

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}{self.counter}{ERR}"

    def build(self) -> S.Function:
        fn = self.fn
        params = list(fn.params)
        bounded: set[str] = set()
        if self.inputs_bounded:
            for p in fn.params:
                if p.type.dtype.is_float:
                    params.append(S.Param(p.name + ERR, S.TensorType(F32, p.type.shape)))
                    bounded.add(p.name)
        body = _Body(bounded, self.tensor_cores)
        types = fn.value_types()
        for op in fn.ops:
            if isinstance(op, S.CallOp):
                self.call(op, body, types)
                continue
            self.ops.append(op)
            if op.dtype.is_float:
                self.value(op, body)
        results = list(fn.results)
        result_types = list(fn.result_types)
        for r, t in zip(fn.results, fn.result_types, strict=True):
            if t.dtype.is_float:
                results.append(r + ERR if r in body.bounded else self.zeros(t))
                result_types.append(S.TensorType(F32, t.shape))
        return S.Function(fn.name + KERNEL, tuple(params), fn.bindings, fn.guards, tuple(self.ops),
                          tuple(results), tuple(result_types))

    def zeros(self, t: S.TensorType, value: float | int | bool = 0.0, dtype: DType = F32) -> str:
        """A new value of shape ``t.shape`` holding ``value`` (0: the bound of an exact value)."""
        name = self.fresh("const")
        axes = tuple(S.Axis(f"_z{k}", d) for k, d in enumerate(t.shape))
        self.ops.append(S.MapOp(name, dtype, axes, S.Const(value, dtype)))
        return name

    def value(self, op: S.MapOp | S.ReduceOp | S.ContractOp | S.ScanOp, body: _Body) -> None:
        here = tuple(S.Idx(a.name) for a in op.axes)
        if isinstance(op, S.MapOp):
            d = body.d(op.body)
        elif isinstance(op, S.ScanOp):
            d = self.scanned(op, body)
        else:
            inner = op.body if isinstance(op, S.ReduceOp) else S.Binary("mul", f32(op.lhs), f32(op.rhs), F32)
            kind = "sum" if isinstance(op, S.ContractOp) else op.kind
            d = self.reduced(op, kind, inner, body)
        if op.dtype in MANTISSA and d is not None:
            pre = op.result + PRE
            self.ops.append(_retyped(op, pre))
            d = rounded_16(d, S.Load(pre, here, F32), op.dtype)
        if d is not None:
            self.ops.append(S.MapOp(op.result + ERR, F32, op.axes, d))
            body.bounded.add(op.result)

    def reduced(self, op: S.ReduceOp | S.ContractOp, kind: str, inner: S.SExpr, body: _Body) -> S.SExpr | None:
        here = tuple(S.Idx(a.name) for a in op.axes)

        def reduce(what: str, e: S.SExpr, how: str = "sum") -> S.SExpr:
            name = self.fresh(f"{op.result}{what}")
            limits = op.limits if isinstance(op, S.ReduceOp) else ()  # the same terms (spec §8.11)
            self.ops.append(S.ReduceOp(name, F32, how, op.axes, op.reduce_axes, e, limits=limits))
            return S.Load(name, here, F32)

        extent = sympy.Mul(*(a.extent for a in op.reduce_axes))
        if kind in ("max", "min"):
            d = body.d(inner)
            return None if d is None else reduce("m", d, "max")
        terms, size, root = body.summed(inner, extent)
        if kind == "sum":
            spread = mul(mul(c(2.0 * LAMBDA), root), reduce("a", size))
            return add(None if terms is None else reduce("d", terms), spread)
        # prod: relative bounds add up (and each product rounds)
        value = S.Load(op.result, here, F32)
        relative = None if terms is None else reduce("r", S.Select(S.Binary("eq", terms, c(0.0), BOOL), c(0.0),
                                                                   div(terms, absolute(inner)), F32))
        return mul(finite(value), add(relative, mul(c(2.0 * LAMBDA), root)))

    def scanned(self, op: S.ScanOp, body: _Body) -> S.SExpr | None:
        """The bound of a scan: each prefix is a sum (or product, or linear combination) of up to
        ``n + 1`` terms, in any order (a target may reassociate, spec/language.md §8.9)."""
        here = tuple(S.Idx(a.name) for a in op.axes)

        def scan(what: str, kind: str, e: S.SExpr, coeff: S.SExpr | None = None, init: S.SExpr | None = None,
                 exclusive: bool = op.exclusive) -> S.SExpr:
            name = self.fresh(f"{op.result}{what}")
            self.ops.append(S.ScanOp(name, F32, kind, op.axes, op.axis, f32(e), None if coeff is None else f32(coeff),
                                     None if init is None else f32(init), exclusive))
            return S.Load(name, here, F32)

        terms = un("sqrt", S.Cast(S.Binary("add", S.Idx(op.axis), S.Const(1, DType.I64), DType.I64), F32))
        if op.kind in ("max", "min"):
            d = body.d(op.body)
            return None if d is None else S.Binary("max", scan("m", "max", d), c(0.0), F32)
        if op.kind == "sum":
            d = body.d(op.body)
            spread = mul(mul(c(2.0 * LAMBDA), terms), scan("a", "sum", absolute(op.body)))
            return add(None if d is None else scan("d", "sum", d), spread)
        if op.kind == "prod":  # relative bounds add up, and each product rounds
            d = body.d(op.body)
            rel = None if d is None else scan("r", "sum", S.Select(S.Binary("eq", d, c(0.0), BOOL), c(0.0),
                                                                  div(d, absolute(op.body)), F32))
            return mul(finite(S.Load(op.result, here, F32)), add(rel, mul(c(2.0 * LAMBDA), terms)))
        # linear: h = a·h + b expands to a sum of n + 1 products of up to n + 1 factors; H scans the
        # magnitudes (|a|, |b|, |init|), and the operands' own bounds are carried along by |a|.
        assert op.coeff is not None and op.init is not None
        a, b, init = op.coeff, op.body, op.init
        size = scan("h", "linear", absolute(b), absolute(a), absolute(init))
        da, db, dinit = body.d(a), body.d(b), body.d(init)
        carried = None
        if da is not None or db is not None or dinit is not None:
            before = scan("x", "linear", absolute(b), absolute(a), absolute(init), exclusive=True)
            step = add(db, None if da is None else mul(before, da)) or c(0.0)
            carried = scan("d", "linear", step, absolute(a), dinit or c(0.0))
        return add(carried, mul(mul(c(2.0 * LAMBDA * 2.0 ** 0.5), terms), size))

    def call(self, op: S.CallOp, body: _Body, types: dict[str, S.TensorType]) -> None:
        callee = self.module.get(op.callee)
        name = callee.name + KERNEL
        if name not in self.made:
            self.made[name] = _Kernel(self.module, callee, self.tensor_cores, True, self.made).build()
        args = list(op.args)
        for p in callee.params[len(args):]:  # defaults left out: given, so the bounds follow in order
            assert p.default is not None, f"{callee.name}: `{p.name}` has no default"
            args.append(self.zeros(p.type, p.default, p.type.dtype))
            types[args[-1]] = p.type
        for p, a in zip(callee.params, list(args), strict=True):
            if p.type.dtype.is_float:
                args.append(a + ERR if a in body.bounded else self.zeros(types[a]))
        floats = [(r, t) for r, t in zip(op.results, op.types, strict=True) if t.dtype.is_float]
        self.ops.append(S.CallOp(op.results + tuple(r + ERR for r, _ in floats),
                                op.types + tuple(S.TensorType(F32, t.shape) for _, t in floats),
                                name, tuple(args), op.dims, op.name))
        body.bounded |= {r for r, _ in floats}


def _retyped(op: S.MapOp | S.ReduceOp | S.ContractOp | S.ScanOp, result: str) -> S.Op:
    """``op`` storing its value in f32 as ``result``: the value before its 16-bit rounding."""
    return dataclasses.replace(op, result=result, dtype=F32, name=None)


def error_kernel(module: S.Module, name: str, tensor_cores: bool) -> tuple[S.Module, str]:
    """``(module, kernel)``: the SemanticIR module holding the error kernel of ``name`` (see the
    module doc) and its callees' error kernels; ``tensor_cores``: the kernel's float inputs are
    all 16-bit (its 16-bit products' f32 factors may be rounded)."""
    made: dict[str, S.Function] = {}
    top = _Kernel(module, module.get(name), tensor_cores, False, made).build()
    return S.Module((*module.functions, *made.values(), top)), top.name
