"""Expressions: type, shape-check and lower one `.ak` expression to SemanticIR terms.

:class:`ExprLowering` is the half of the kernel checker that handles expressions; the
other half (``arke.lang.kernels``) handles statements, scopes and index extents. Every
method reports problems through ``self.error`` and returns :data:`POISON` so one mistake
gives one diagnostic, not a cascade.
"""

# mypy: disable-error-code="misc"
# (ExprLowering is a mixin of KernelChecker: its methods annotate `self` with the class
# that provides the state, which mypy flags as "erased self type" without this.)
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DTYPES, FLOAT_MAX, DType, fits, float_fits
from arke.ir.shapes import Dim, dim_str
from arke.lang import ast
from arke.lang.bits import BIT_OPS
from arke.lang.diagnostics import Related, did_you_mean
from arke.lang.hints import NOT_YET
from arke.lang.terms import POISON, Scalar, Tensor, Term, cast, common_dtype, dim_op, scalar_const
from arke.lang.whole import whole_among_indexed

if TYPE_CHECKING:
    from arke.lang.kernels import KernelChecker

# Math functions: name -> (IR op, whether the result is always a float)
MATH_UNARY: dict[str, tuple[str, bool]] = {
    "exp": ("exp", True), "log": ("log", True), "sqrt": ("sqrt", True), "rsqrt": ("rsqrt", True),
    "tanh": ("tanh", True), "erf": ("erf", True), "sigmoid": ("sigmoid", True), "silu": ("silu", True),
    "gelu": ("gelu", True), "sin": ("sin", True), "cos": ("cos", True), "floor": ("floor", True),
    "ceil": ("ceil", True), "exp2": ("exp2", True), "log2": ("log2", True),
    "abs": ("abs", False), "relu": ("relu", False),
}
MATH_BINARY = {"max": "max", "min": "min", "pow": "pow"}
BUILTINS = frozenset(MATH_UNARY) | frozenset(MATH_BINARY) | frozenset(DTYPES) | {"transpose"}
REDUCTIONS = ("sum", "max", "min", "mean", "prod", "argmax", "argmin", "topk", "argtopk", "bottomk", "argbottomk")

_ARITH = {"+": "add", "-": "sub", "*": "mul", "/": "div", "//": "floordiv", "%": "mod", "**": "pow"}
_COMPARE = {"==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}


class ExprLowering:
    """Expression half of :class:`arke.lang.kernels.KernelChecker` (a mixin: it uses its state)."""

    # ------------------------------------------------------------ entry points

    def scalar(self: KernelChecker, e: ast.Expr, what: str = "a value") -> Term:
        """Lower ``e`` where one element is needed (a rank-0 tensor counts as one)."""
        t = self.expr(e)
        if isinstance(t, Tensor):
            if t.rank == 0:
                return Scalar(t.at(()), t.dtype)
            self.error("AK2107", f"`{_text(self, e)}` is a whole tensor of rank {t.rank}, but {what} is needed here",
                       e.span, hint="index it, as in `x[i, j]`, so its elements line up with the other terms")
            return POISON
        return t

    def expr(self: KernelChecker, e: ast.Expr) -> Term:
        method = getattr(self, "_e_" + type(e).__name__)
        result: Term = method(e)
        return result

    # ------------------------------------------------------------ leaves

    def _e_Num(self: KernelChecker, e: ast.Num) -> Term:
        if e.is_int:
            if not fits(int(e.value), DType.I64):
                hint = ("write it as a float (with a `.0`) if an approximate value will do" if len(e.text) < 39
                        else f"i64 holds integers up to {2**63 - 1}")
                self.error("AK1005", f"integer literal {ast.shown(e.text)} does not fit in i64", e.span, hint=hint)
                return POISON
            return scalar_const(int(e.value), DType.I64)
        # No float type is wider than f32, so a literal beyond f32 fits no type (`inf` is allowed).
        if e.text.lstrip("+-") != "inf" and not float_fits(float(e.value), DType.F32):
            self.error("AK1005", f"float literal {ast.shown(e.text)} does not fit in f32", e.span,
                       hint=f"f32 holds finite values up to ±{FLOAT_MAX[DType.F32]:.7g}; write `inf` for infinity")
            return POISON
        return scalar_const(float(e.value), DType.F32)

    def _e_Name(self: KernelChecker, e: ast.Name) -> Term:
        name = e.id
        if name in self.poisoned:
            return POISON
        extent = self.lookup_index(name)
        if extent is not None:
            return Scalar(ir.Idx(name), DType.I64, frozenset({name}))
        if name in self.lets:
            self.used.add(name)
            return self.lets[name]
        if name in self.values:
            return self.value_term(name)
        if name in self.dims:
            d = self.dims[name]
            return Scalar(ir.DimRef(d), DType.I64, dim=d)
        if name in ("true", "false"):
            return scalar_const(name == "true", DType.BOOL, weak=False)
        if name in BUILTINS or name in self.callables:
            self.error("AK2001", f"`{name}` is a function; call it with arguments", e.span,
                       hint=f"write `{name}(...)`")
            return POISON
        self.unknown_name(name, e.span)
        return POISON

    def _e_Index(self: KernelChecker, e: ast.Index) -> Term:
        if e.name in self.poisoned:
            return POISON
        if e.name not in self.values:
            if e.name in self.dims or e.name in self.lets or self.lookup_index(e.name) is not None:
                self.error("AK3002", f"`{e.name}` is not a tensor, so it cannot be indexed", e.name_span)
            else:
                self.unknown_name(e.name, e.name_span)
            return POISON
        value = self.values[e.name]
        value.used = True
        rank = len(value.type.shape)
        if len(e.indices) != rank:
            shape = ", ".join(dim_str(d) for d in value.type.shape)
            self.error("AK3002", f"`{e.name}` has rank {rank} ({value.type.dtype}[{shape}]) but is indexed with "
                       f"{len(e.indices)} subscript{'s' if len(e.indices) != 1 else ''}", e.span,
                       related=[Related(value.span, f"`{e.name}` is defined here")])
            return POISON
        subs: list[ir.SExpr] = []
        free: frozenset[str] = frozenset()
        ok = True
        for k, sub in enumerate(e.indices):
            t = self.subscript(sub, value.type.shape[k])
            if not isinstance(t, Scalar):
                ok = False
                continue
            subs.append(cast(t.sx, DType.I64))
            free |= t.free
        if not ok:
            return POISON
        dtype = value.type.dtype
        return Scalar(ir.Load(value.ssa, tuple(subs), dtype), dtype, free)

    def subscript(self: KernelChecker, e: ast.Expr, extent: Dim | None = None) -> Term:
        """One subscript (of an axis of size ``extent``): an integer expression of indices, dims and gathers."""
        if isinstance(e, ast.Name) and self.is_unbound(e.id):
            self.unbound_index(e.id, e.span, extent)
            return POISON
        t = self.scalar(e, "an integer subscript")
        if isinstance(t, Scalar) and not (t.dtype.is_int or (t.weak and not t.dtype.is_float)):
            self.error("AK3006", f"subscript `{_text(self, e)}` is {t.dtype}, but subscripts must be integers",
                       e.span, hint=f"convert it with `i64({_text(self, e)})`" if t.dtype.is_float else None)
            return POISON
        return t

    # ------------------------------------------------------------ operators

    def _e_Unary(self: KernelChecker, e: ast.Unary) -> Term:
        t = self.expr(e.operand)
        if e.op == "+":
            return t
        if e.op == "not":
            return self.lift([t], lambda s: self._not(s[0], e), e)
        if e.op == "~":
            return self.lift([t], lambda s: self.invert(s[0], e), e)
        return self.lift([t], lambda s: self._neg(s[0], e), e)

    def _neg(self: KernelChecker, s: Scalar, e: ast.Expr) -> Scalar | None:
        if s.dtype.is_bool:
            self.error("AK3005", "cannot negate a boolean", e.span, hint="use `not`")
            return None
        dim = -s.dim if s.dim is not None else None
        return Scalar(ir.Unary("neg", s.sx, s.dtype), s.dtype, s.free, s.weak, dim)

    def _not(self: KernelChecker, s: Scalar, e: ast.Expr) -> Scalar | None:
        if not s.dtype.is_bool:
            self.error("AK3017", f"`not` needs a boolean, not {s.dtype}", e.span)
            return None
        return Scalar(ir.Unary("not", s.sx, DType.BOOL), DType.BOOL, s.free)

    def _e_Binary(self: KernelChecker, e: ast.Binary) -> Term:
        if e.op == "@":
            return self.matmul(e)
        a, b = self.expr(e.left), self.expr(e.right)
        return self.lift([a, b], lambda s: self.binary(e.op, s[0], s[1], e), e)

    def binary(self: KernelChecker, op: str, a: Scalar, b: Scalar, e: ast.Expr) -> Scalar | None:
        """Type one binary operation on elements; None after reporting an error."""
        free = a.free | b.free
        if op in ("and", "or"):
            for s, side in ((a, e.left if isinstance(e, ast.Binary) else e), (b, getattr(e, "right", e))):
                if not s.dtype.is_bool:
                    self.error("AK3017", f"`{op}` needs booleans, but `{_text(self, side)}` is {s.dtype}", side.span)
                    return None
            return Scalar(ir.Binary(op, a.sx, b.sx, DType.BOOL), DType.BOOL, free)
        if op in BIT_OPS:
            return self.bitwise(op, a, b, e)
        dtype, weak = common_dtype(a, b)
        if not (self.literal_fits(a, dtype, e) and self.literal_fits(b, dtype, e)):
            return None
        if op in _COMPARE:
            if a.dtype.is_bool != b.dtype.is_bool and op not in ("==", "!="):
                self.error("AK3005", f"cannot order a boolean and a number with `{op}`", e.span)
                return None
            return Scalar(ir.Binary(_COMPARE[op], cast(a.sx, dtype), cast(b.sx, dtype), DType.BOOL), DType.BOOL, free)
        if dtype.is_bool or a.dtype.is_bool or b.dtype.is_bool:
            self.error("AK3005", f"arithmetic `{op}` on a boolean", e.span,
                       hint="convert it first, as in `i32(flag)`, or use `x if flag else y`")
            return None
        name = _ARITH.get(op) or MATH_BINARY[op]
        dim = None
        if name in ("div", "floordiv", "mod") and not dtype.is_float and b.dim is not None and b.dim == 0:
            self.error("AK3015", "integer division by zero", e.right.span if isinstance(e, ast.Binary) else e.span,
                       hint="the divisor is always 0 here: every call would fail (an integer division by zero is "
                            "an error at run time)")
            return None
        if a.dim is not None and b.dim is not None and not dtype.is_float:
            dim = dim_op(name, a.dim, b.dim)
        return Scalar(ir.Binary(name, cast(a.sx, dtype), cast(b.sx, dtype), dtype), dtype, free, weak, dim)

    def literal_fits(self: KernelChecker, s: Scalar, dtype: DType, e: ast.Expr,
                     hint: str = "widen the other operand first, as in `i64(...)`") -> bool:
        """A weak literal must be representable in the type it takes: an integer in an integer
        type, a finite number in a float type (rounding to infinity does not fit)."""
        if not (s.weak and isinstance(s.sx, ir.Const)) or isinstance(s.sx.value, bool):
            return True
        value = s.sx.value
        if dtype.is_int and not (math.isfinite(value) and fits(int(value), dtype)):
            self.error("AK1005", f"the literal {value} does not fit in {dtype}", e.span, hint=hint)
            return False
        if dtype.is_float and math.isfinite(value) and not float_fits(float(value), dtype):
            self.error("AK1005", f"the literal {value} does not fit in {dtype}", e.span,
                       hint=f"{dtype} holds finite values up to ±{FLOAT_MAX[dtype]:.7g}; widen first, as in `f32(...)`")
            return False
        return True

    def _e_Ternary(self: KernelChecker, e: ast.Ternary) -> Term:
        c, a, b = self.expr(e.cond), self.expr(e.then), self.expr(e.other)

        def select(s: list[Scalar]) -> Scalar | None:
            cond, x, y = s
            if not cond.dtype.is_bool:
                self.error("AK3017", f"the condition `{_text(self, e.cond)}` is {cond.dtype}, not a boolean",
                           e.cond.span, hint="compare it, as in `x > 0`")
                return None
            dtype, weak = common_dtype(x, y)
            if not (self.literal_fits(x, dtype, e.then) and self.literal_fits(y, dtype, e.other)):
                return None
            return Scalar(ir.Select(cond.sx, cast(x.sx, dtype), cast(y.sx, dtype), dtype), dtype,
                          cond.free | x.free | y.free, weak)

        return self.lift([c, a, b], select, e)

    def _e_InSet(self: KernelChecker, e: ast.InSet) -> Term:
        x = self.scalar(e.operand)
        if not isinstance(x, Scalar):
            return POISON
        eqs: list[Scalar] = []
        for v in e.values:
            t = self.scalar(v)
            eq = self.binary("==", x, t, e) if isinstance(t, Scalar) else None
            if eq is None:
                return POISON
            eqs.append(eq)
        while len(eqs) > 1:  # a balanced `or`: a set of thousands stays a shallow expression
            odd = eqs[-1:] if len(eqs) % 2 else []
            eqs = [Scalar(ir.Binary("or", a.sx, b.sx, DType.BOOL), DType.BOOL, a.free | b.free)
                   for a, b in zip(eqs[::2], eqs[1::2])] + odd
        return eqs[0] if eqs else scalar_const(False, DType.BOOL, weak=False)

    # ------------------------------------------------------------ lifting over whole tensors

    def lift(self: KernelChecker, terms: Sequence[Term], fn: Callable[[list[Scalar]], Scalar | None],
             e: ast.Expr) -> Term:
        """Apply an element function to terms: on elements directly, or over broadcast whole tensors."""
        if any(t is POISON for t in terms):
            return POISON
        tensors = [t for t in terms if isinstance(t, Tensor) and t.rank > 0]
        if not tensors:
            scalars = [Scalar(t.at(()), t.dtype) if isinstance(t, Tensor) else t for t in terms]
            result = fn([s for s in scalars if isinstance(s, Scalar)])
            return POISON if result is None else result
        indexed = [t for t in terms if isinstance(t, Scalar) and t.free]
        if indexed:
            whole_among_indexed(self, e)
            return POISON
        shape = self.broadcast([t.shape for t in tensors], e)
        if shape is None:
            return POISON

        def views(subs: tuple[ir.SExpr, ...]) -> list[Scalar]:
            out = []
            for t in terms:
                if isinstance(t, Tensor):
                    out.append(Scalar(t.at(self.align(t.shape, shape, subs)), t.dtype))
                else:
                    assert isinstance(t, Scalar)
                    out.append(t)
            return out

        probe = fn(views(tuple(ir.Idx(f"_{k}") for k in range(len(shape)))))
        if probe is None:
            return POISON
        dtype = probe.dtype

        def at(subs: tuple[ir.SExpr, ...]) -> ir.SExpr:
            s = fn(views(subs))
            assert s is not None
            return s.sx

        return Tensor(shape, dtype, at)

    def broadcast(self: KernelChecker, shapes: list[tuple[Dim, ...]], e: ast.Expr) -> tuple[Dim, ...] | None:
        """NumPy broadcasting of symbolic shapes: equal dims match, a literal 1 stretches."""
        rank = max(len(s) for s in shapes)
        out: list[Dim] = []
        for k in range(rank):
            dims = [s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0]
            chosen: Dim = sympy.Integer(1)
            for d in dims:
                if d == 1:
                    continue
                if chosen == 1:
                    chosen = d
                elif not self.same(chosen, d):
                    desc = " and ".join("[" + ", ".join(dim_str(x) for x in s) + "]" for s in shapes)
                    self.error("AK3004", f"shapes {desc} do not broadcast: axis {k} is {dim_str(chosen)} "
                               f"in one and {dim_str(d)} in the other", e.span,
                               hint="dims must be equal or 1; if they are equal at run time, say so with "
                                    f"`where {dim_str(chosen)} == {dim_str(d)}`")
                    return None
            out.append(chosen)
        return tuple(out)

    @staticmethod
    def align(shape: tuple[Dim, ...], full: tuple[Dim, ...], subs: tuple[ir.SExpr, ...]) -> tuple[ir.SExpr, ...]:
        """Subscripts of a broadcast operand: its trailing axes, 0 where it stretches a 1."""
        tail = subs[len(full) - len(shape):]
        return tuple(ir.Const(0, DType.I64) if d == 1 and f != 1 else s for d, f, s in zip(shape, full[len(full) -
                     len(shape):], tail))

    # ------------------------------------------------------------ calls

    def _e_Call(self: KernelChecker, e: ast.Call) -> Term:
        name = e.func
        if name in DTYPES:
            return self.convert(e, DTYPES[name])
        if name == "transpose":
            return self.transpose(e)
        if name in self.callables and name not in MATH_UNARY and name not in MATH_BINARY:
            return self.call_kernel(e)
        if name in MATH_UNARY:
            if len(e.args) != 1:
                self.error("AK3008", f"`{name}` takes 1 argument, not {len(e.args)}", e.span)
                return POISON
            op, floating = MATH_UNARY[name]

            def unary(s: list[Scalar]) -> Scalar | None:
                x = s[0]
                if x.dtype.is_bool:
                    self.error("AK3005", f"`{name}` of a boolean", e.span)
                    return None
                dtype = DType.F32 if floating and not x.dtype.is_float else x.dtype
                return Scalar(ir.Unary(op, cast(x.sx, dtype), dtype), dtype, x.free, x.weak and not floating)

            return self.lift([self.expr(e.args[0])], unary, e)
        if name in MATH_BINARY:
            if len(e.args) != 2:
                hint = f"to reduce, write `{name}(x[i] for i)`" if name in ("max", "min") and len(e.args) == 1 else None
                self.error("AK3008", f"`{name}` takes 2 arguments, not {len(e.args)}", e.span, hint=hint)
                return POISON
            a, b = self.expr(e.args[0]), self.expr(e.args[1])
            return self.lift([a, b], lambda s: self.binary(name, s[0], s[1], e), e)
        if name in self.callables:
            return self.call_kernel(e)
        if self.import_failed:  # it may well come from the module that failed to import
            return POISON
        if name in NOT_YET:
            self.error("AK2002", f"`{name}` is not a function of Arke", e.func_span, hint=NOT_YET[name].hint)
            return POISON
        pool = list(BUILTINS) + [c for c in self.callables if c != self.sig.name] + list(REDUCTIONS)
        guess = did_you_mean(name, pool)
        self.error("AK2002", f"unknown function or kernel `{name}`", e.func_span,
                   hint=f"did you mean `{guess}`?" if guess else "import the module that defines it, "
                   "as in `import std.nn`", replacement=guess)
        return POISON

    def convert(self: KernelChecker, e: ast.Call, to: DType) -> Term:
        if len(e.args) != 1:
            self.error("AK3008", f"the cast `{e.func}` takes 1 argument, not {len(e.args)}", e.span)
            return POISON
        def conv(s: list[Scalar]) -> Scalar | None:
            hint = f"{to} holds values from {_range(to)}" if to.is_int else ""
            if not self.literal_fits(s[0], to, e, hint=hint):
                return None
            dim = s[0].dim if to.is_int and not to.is_unsigned else None  # a wrapped dim is no dim
            return Scalar(cast(s[0].sx, to), to, s[0].free, False, dim)

        return self.lift([self.expr(e.args[0])], conv, e)

    def transpose(self: KernelChecker, e: ast.Call) -> Term:
        if len(e.args) not in (1, 3):
            self.error("AK3008", "`transpose` takes a tensor, optionally with the two axes to swap", e.span,
                       hint="`transpose(x)` swaps the last two axes; `transpose(x, 0, 2)` swaps axes 0 and 2")
            return POISON
        t = self.expr(e.args[0])
        if t is POISON:
            return POISON
        if not isinstance(t, Tensor) or t.rank < 2:
            self.error("AK3002", "`transpose` needs a whole tensor of rank 2 or more", e.args[0].span)
            return POISON
        a, b = t.rank - 2, t.rank - 1
        if len(e.args) == 3:
            axes = []
            for arg in e.args[1:]:
                if not (isinstance(arg, ast.Num) and arg.is_int and 0 <= int(arg.value) < t.rank):
                    self.error("AK3015", f"axis must be an integer from 0 to {t.rank - 1}", arg.span)
                    return POISON
                axes.append(int(arg.value))
            a, b = axes
        perm = list(range(t.rank))
        perm[a], perm[b] = perm[b], perm[a]
        shape = tuple(t.shape[p] for p in perm)
        src = t

        def at(subs: tuple[ir.SExpr, ...]) -> ir.SExpr:
            inv = [subs[perm.index(k)] for k in range(len(subs))]
            return src.at(tuple(inv))

        return Tensor(shape, t.dtype, at)

    def matmul(self: KernelChecker, e: ast.Binary) -> Term:
        a, b = self.expr(e.left), self.expr(e.right)
        if a is POISON or b is POISON:
            return POISON
        for t, side in ((a, e.left), (b, e.right)):
            if not isinstance(t, Tensor) or t.rank == 0:
                self.error("AK3014", f"`@` needs whole tensors, but `{_text(self, side)}` is an element", side.span,
                           hint="in index notation write the sum: `sum(a[i, k] * b[k, j] for k)`")
                return POISON
        assert isinstance(a, Tensor) and isinstance(b, Tensor)
        if a.dtype != b.dtype:
            self.error("AK3014", f"`@` operands have different dtypes ({a.dtype} and {b.dtype})", e.span,
                       hint=f"cast one, as in `{a.dtype}(...)`")
            return POISON
        a_shape = a.shape if a.rank > 1 else (sympy.Integer(1), *a.shape)
        b_shape = b.shape if b.rank > 1 else (*b.shape, sympy.Integer(1))
        k_a, k_b = a_shape[-1], b_shape[-2]
        if not self.same(k_a, k_b):
            self.error("AK3014", f"`@` contracts axis of size {dim_str(k_a)} with one of size {dim_str(k_b)}", e.span,
                       hint="the last axis of the left operand must match the second-to-last of the right")
            return POISON
        batch = self.broadcast([a_shape[:-2], b_shape[:-2]], e)
        if batch is None:
            return POISON
        nb = len(batch)
        bax = [ir.Idx(f"_b{k}") for k in range(nb)]
        m_ax, n_ax, k_ax = ir.Idx("_m"), ir.Idx("_n"), ir.Idx("_k")
        lhs_subs = list(self.align(a.shape[:-2] if a.rank > 2 else (), batch, tuple(bax)))
        lhs_subs += [m_ax, k_ax] if a.rank > 1 else [k_ax]
        rhs_subs = list(self.align(b.shape[:-2] if b.rank > 2 else (), batch, tuple(bax)))
        rhs_subs += [k_ax, n_ax] if b.rank > 1 else [k_ax]
        axes = [ir.Axis(f"_b{k}", d) for k, d in enumerate(batch)]
        if a.rank > 1:
            axes.append(ir.Axis("_m", a_shape[-2]))
        if b.rank > 1:
            axes.append(ir.Axis("_n", b_shape[-1]))
        result = self.fresh()
        lhs, rhs = self.operand(a, tuple(lhs_subs)), self.operand(b, tuple(rhs_subs))
        self.emit(ir.ContractOp(result, a.dtype, tuple(axes), (ir.Axis("_k", k_a),), lhs, rhs))
        return self.value_tensor(result, tuple(ax.extent for ax in axes), a.dtype)

    def operand(self: KernelChecker, t: Tensor, subs: tuple[ir.SExpr, ...]) -> ir.Load:
        """A contraction operand: a view of a value read directly (transposes fold in), else a new value."""
        load = t.at(subs)
        if isinstance(load, ir.Load):
            return load
        return ir.Load(self.materialize(t), subs, t.dtype)

    # ------------------------------------------------------------ reductions

    def _e_Reduce(self: KernelChecker, e: ast.Reduce) -> Term:
        if e.op not in REDUCTIONS:
            instead = NOT_YET.get(e.op)
            guess = None if instead is not None else did_you_mean(e.op, REDUCTIONS)
            hint = (instead.hint if instead is not None else f"did you mean `{guess}`?" if guess
                    else "the reductions are " + ", ".join(REDUCTIONS))
            self.error("AK2002", f"`{e.op}` is not a reduction", e.op_span, hint=hint, replacement=guess)
            return POISON
        if e.options and e.op not in ir.TOPK_KINDS:  # a top-k's options: AK2112
            self.error("AK2110", f"a reduction takes no option `{e.options[0].name}`", e.options[0].name_span,
                       hint="only scans (`cumsum`, `scan` ...) take options after their index")
            return POISON
        return self.reduction(e)


def _range(dtype: DType) -> str:
    from arke.ir.dtypes import INT_RANGE

    low, high = INT_RANGE[dtype]
    return f"{low} to {high}"


def _text(checker: KernelChecker, e: ast.Expr) -> str:
    return checker.source_text(e.span)


__all__ = ["BUILTINS", "MATH_BINARY", "MATH_UNARY", "REDUCTIONS", "ExprLowering"]
