"""Kernel calls: a call's arguments checked against the callee's signature, lowered to a call op.

:class:`KernelCalls` is the part of :class:`arke.lang.kernels.KernelChecker` that checks a
call of another kernel: the number of arguments (defaults fill the rest), each argument's
rank and dtype, the callee's dims bound from the arguments' shapes and checked where they
repeat, and the callee's ``where`` clauses (decided now, or kept as a guard).
"""

# mypy: disable-error-code="misc"
# (KernelCalls is a mixin of KernelChecker: its methods annotate `self` with the class
# that provides the state, which mypy flags as "erased self type" without this.)
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, dim_str, sym
from arke.lang import ast
from arke.lang.diagnostics import Related
from arke.lang.generics import arg_binds
from arke.lang.signatures import Signature, cond_str, cond_subs, decide_cond, dim_expr, subs_dims
from arke.lang.source import Span
from arke.lang.terms import POISON, Scalar, Tensor, broadcast_scalar

if TYPE_CHECKING:
    from arke.lang.kernels import KernelChecker


class KernelCalls:
    """Call half of :class:`arke.lang.kernels.KernelChecker` (a mixin: it uses its state)."""

    # ------------------------------------------------------------ kernel calls

    def call_kernel(self: KernelChecker, e: ast.Call, count: int = 1) -> Any:
        """Check a call against the callee's signature and emit a call op."""
        callee = self.callables[e.func]
        self.calls.append((callee.ir_name, e.func_span))
        if callee.name == self.sig.name and callee.node in (self.sig.node, self.sig.template):
            self.error("AK2006", f"kernel `{e.func}` calls itself", e.func_span, hint="kernels cannot recurse")
            return POISON
        if not callee.ok:  # its header has errors, reported there: its parameters are not known
            for a in e.args:
                self.expr(a)  # for the arguments' own errors
            return POISON
        given: dict[int, Any] = {}  # the arguments a generic callee's dtypes were read from, checked once
        if callee.generic is not None:
            picked = self.pick_member(e, callee, given)
            if picked is None:
                return POISON
            callee = picked
        params = callee.params
        required = sum(1 for p in params if p.default is None)
        if not required <= len(e.args) <= len(params):
            want = f"{required}" if required == len(params) else f"{required} to {len(params)}"
            self.error("AK3008", f"`{e.func}` takes {want} arguments, but {len(e.args)} are given", e.span,
                       related=[Related(callee.node.name_span, f"`{e.func}` is defined here")])
            return POISON
        bind: dict[sympy.Symbol, Dim] = {}
        args: list[str] = []
        deferred: list[tuple[ast.Call, ir.Param, int, Dim, Dim, Span]] = []
        for k, p in enumerate(params):
            if k >= len(e.args):
                assert p.default is not None
                if p.name in callee.dim_params:  # the callee's default binds its dim
                    bind[sym(p.name)] = sympy.Integer(int(p.default))
                args.append(self.materialize(broadcast_scalar(ir.Const(p.default, p.type.dtype), p.type.dtype)))
                continue
            if p.name in callee.dim_params:
                ssa = self.dim_arg(e, e.args[k], p, bind, deferred)
            else:
                ssa = self.call_arg(e, e.args[k], p, bind, deferred, given.get(k))
            if ssa is None:
                return POISON
            args.append(ssa)
        for call, p, axis, want, got, span in deferred:
            expected = subs_dims(want, bind)
            if not self.same(expected, got):
                self.error("AK3009", f"axis {axis} of `{p.name}` must be {dim_str(expected)} for this call "
                           f"(`{call.func}` declares {dim_str(want)}), but the argument's is {dim_str(got)}", span,
                           related=[Related(call.func_span, f"`{call.func}` called here")])
                return POISON
        for cond, text in callee.conds:
            c = cond_subs(cond, bind)
            verdict = decide_cond(c, self.sig.subst)
            if verdict is False:
                self.error("AK3011", f"this call breaks `{text}`, a where clause of `{e.func}`", e.span,
                           related=[Related(callee.node.name_span, f"`{e.func}` is defined here")])
                return POISON
            if verdict is None:
                self.guards.append(ir.Guard(c, f"{cond_str(c)} (`{text}` of the call of `{e.func}`)"))
        types = tuple(ir.TensorType(t.dtype, tuple(subs_dims(d, bind) for d in t.shape)) for t in callee.outputs)
        if len(types) != count:
            self.error("AK3008", f"`{e.func}` returns {len(types)} outputs, but {count} "
                       f"{'is' if count == 1 else 'are'} used here", e.span,
                       hint="take them apart with `a, b = " + e.func + "(...)`" if count == 1 else None)
            return POISON
        results = tuple(self.fresh() for _ in types)
        dims = tuple(sorted((str(k), v) for k, v in bind.items()))
        self.emit(ir.CallOp(results, types, callee.ir_name, tuple(args), dims))
        if count == 1:
            return self.value_tensor(results[0], types[0].shape, types[0].dtype)
        return list(zip(results, types))

    def dim_arg(self: KernelChecker, e: ast.Call, arg: ast.Expr, p: ir.Param, bind: dict[sympy.Symbol, Dim],
                deferred: list[tuple[ast.Call, ir.Param, int, Dim, Dim, Span]]) -> str | None:
        """The argument of a dim parameter: a dim expression of the caller, bound to the callee's dim (§5.5)."""
        problems: list[str] = []
        value = dim_expr(arg, self.dims, lambda *a, **kw: problems.append(a[1]))
        if value is None or (value.is_number and int(value) < 1):
            why = problems[0] if problems else f"{dim_str(value)} is below 1" if value is not None else "not a dim"
            self.error("AK3021", f"`{p.name}` of `{e.func}` is a dim parameter, so its argument must be a positive "
                       f"dim expression ({why})", arg.span,
                       hint="pass a dim of this kernel, a dim `let`, an integer literal, or `+ - * / // %` of them",
                       related=[Related(e.func_span, f"`{e.func}` called here")])
            return None
        want = sym(p.name)
        key = next((k for k in bind if str(k) == p.name), None)
        if key is None:
            bind[want] = value
        else:  # already bound by an axis: the two must agree
            deferred.append((e, p, -1, key, value, arg.span))
        return self.materialize(broadcast_scalar(ir.DimRef(value), DType.I64))

    def pick_member(self: KernelChecker, e: ast.Call, callee: Signature, given: dict[int, Any]) -> Signature | None:
        """The specialisation of a generic callee (§5.6) that the arguments bind; each binding argument
        is checked here, once (``given``), and an argument outside its variable's set is AK3027."""
        assert callee.generic is not None
        combo = []
        for var in callee.generic.vars:
            if var.index >= len(e.args):  # too few arguments: the first member reports the count
                return next(iter(callee.generic.members.values()))
            t = self.expr(e.args[var.index])
            given[var.index] = t
            if t is POISON:
                return None
            dtype = getattr(t, "dtype", None)
            if dtype is None:
                return next(iter(callee.generic.members.values()))
            wrong = arg_binds(e.func, var, dtype, e.args[var.index].span, callee.node.name_span)
            if wrong is not None:
                self.error(wrong.code, wrong.message, wrong.span, wrong.hint, wrong.related)
                return None
            combo.append(dtype)
        member: Signature = callee.generic.members[tuple(combo)]
        return member

    def call_arg(self: KernelChecker, e: ast.Call, arg: ast.Expr, p: ir.Param, bind: dict[sympy.Symbol, Dim],
                 deferred: list[tuple[ast.Call, ir.Param, int, Dim, Dim, Span]], t: Any = None) -> str | None:
        t = self.expr(arg) if t is None else t
        if t is POISON:
            return None
        if p.type.rank == 0:
            if isinstance(t, Scalar) and t.free:
                self.error("AK3009", f"`{p.name}` of `{e.func}` is a scalar, but the argument depends on indices "
                           f"{', '.join(sorted(t.free))}", arg.span)
                return None
            if isinstance(t, Tensor) and t.rank:
                self.error("AK3009", f"`{p.name}` of `{e.func}` is a scalar, but the argument has rank {t.rank}",
                           arg.span)
                return None
            assert isinstance(t, Scalar | Tensor)
            dtype = self.store_dtype(t, p.type.dtype, arg.span, f"parameter `{p.name}`")
            if dtype is None:
                return None
            tensor = t if isinstance(t, Tensor) else broadcast_scalar(t.sx, t.dtype)
            return self.materialize(tensor, dtype)
        if not isinstance(t, Tensor):
            self.error("AK3009", f"`{p.name}` of `{e.func}` is a tensor of rank {p.type.rank}, but the argument "
                       "is an element", arg.span, hint="pass the whole tensor, without indices")
            return None
        if t.rank != p.type.rank:
            self.error("AK3009", f"`{p.name}` of `{e.func}` has rank {p.type.rank}, but the argument has rank "
                       f"{t.rank}", arg.span)
            return None
        if t.dtype != p.type.dtype:
            self.error("AK3010", f"`{p.name}` of `{e.func}` is {p.type.dtype}, but the argument is {t.dtype}",
                       arg.span, hint=f"convert it: `{p.type.dtype}({self.source_text(arg.span)})`")
            return None
        for axis, (want, got) in enumerate(zip(p.type.shape, t.shape)):
            if isinstance(want, sympy.Symbol) and want not in bind:
                bind[want] = got
            else:  # a literal, a repeated or a compound dim: checked once every symbol is bound
                deferred.append((e, p, axis, want, got, arg.span))
        return self.materialize(t)
