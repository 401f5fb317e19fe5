"""SemanticIR: the checks of one function (signature, dim bindings, ops, loads, results).

:class:`_FunctionCheck` walks a function's parameters, bindings, guards and ops in order,
tracking the type of each value defined so far, so a use before its definition, a
redefinition, a load with the wrong rank or dtype and a call whose types do not match the
callee's are all found; each problem is reported with the op it is in.
"""

from __future__ import annotations

import sympy

from arke.ir import semantic as S
from arke.ir import shapes
from arke.ir.dtypes import DType, can_store
from arke.ir.text import quote, sexpr_text, type_text, value_text
from arke.ir.verify_nodes import _binary_problems, _cond_problems, _dim_problems, _literal_problem, _unary_problems


def _same_dim(a: shapes.Dim, b: shapes.Dim) -> bool:
    return bool(a == b) or shapes.equal(a, b) is True


def _same_type(a: S.TensorType, b: S.TensorType) -> bool:
    return a.dtype == b.dtype and a.rank == b.rank and all(_same_dim(x, y) for x, y in zip(a.shape, b.shape))


def _substitute(t: S.TensorType, dims: dict[sympy.Symbol, shapes.Dim]) -> S.TensorType:
    return S.TensorType(t.dtype, tuple(shapes.text_form(sympy.sympify(d).subs(dims, simultaneous=True))
                                       for d in t.shape))


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


class _FunctionCheck:
    """The checks of one function; problems go to ``out`` prefixed with where they are."""

    def __init__(self, f: S.Function, funcs: dict[str, S.Function], out: list[str]):
        self.f = f
        self.funcs = funcs
        self.out = out
        self.where = f"@{f.name}"
        self.bound = {b.dim for b in f.bindings}
        self.types: dict[str, S.TensorType] = {}  # the values defined so far
        self.all_values = {p.name for p in f.params} | {r for op in f.ops for r, _ in S.op_results(op)}

    def problem(self, message: str) -> None:
        self.out.append(f"{self.where}: {message}")

    def run(self) -> None:
        for p in self.f.params:
            self.param(p)
        self.bindings()
        for g in self.f.guards:
            self.cond(g.cond, f"guard `{g.text}`")
        for op in self.f.ops:
            self.op(op)
        self.where = f"@{self.f.name}"
        self.results()

    # -- signature
    def param(self, p: S.Param) -> None:
        if p.name in self.types:
            self.problem(f"parameter %{p.name} is declared twice")
        if not p.name.isidentifier():
            self.problem(f"parameter name {p.name!r} is not an identifier (decimal names are for op results)")
        self.types[p.name] = p.type
        self.type(p.type, f"the type of %{p.name}")
        if p.default is not None:
            if p.type.rank:
                self.problem(f"%{p.name} has a default but is a tensor of rank {p.type.rank}; only scalars have one")
            self.literal(p.default, p.type.dtype, f"the default of %{p.name}")

    def bindings(self) -> None:
        seen: set[str] = set()
        for b in self.f.bindings:
            if b.dim in seen:
                self.problem(f"dim {b.dim} is bound twice")
            seen.add(b.dim)
            param = next((p for p in self.f.params if p.name == b.param), None)
            if param is None:
                self.problem(f"dim {b.dim} is bound to %{b.param}, which is not a parameter")
            elif b.axis < 0:  # a dim parameter: the value of an i64 scalar of the dim's own name
                if b.axis != -1 or param.type != S.TensorType(DType.I64) or b.param != b.dim:
                    self.problem(f"dim {b.dim} is bound to the value of %{b.param}, which must be an i64 scalar "
                                 f"named {b.dim} (axis -1)")
            elif not 0 <= b.axis < param.type.rank:
                self.problem(f"dim {b.dim} is bound to axis {b.axis} of %{b.param}, which has rank {param.type.rank}")
            elif param.type.shape[b.axis] != shapes.sym(b.dim):
                self.problem(f"dim {b.dim} is bound to %{b.param}.{b.axis}, whose extent is "
                             f"{shapes.dim_str(param.type.shape[b.axis])}, not {b.dim}")

    def results(self) -> None:
        f = self.f
        if len(f.results) != len(f.result_types):
            self.problem(f"returns {len(f.results)} values but declares {len(f.result_types)} result types")
        if f.output_names and len(f.output_names) != len(f.results):
            self.problem(f"has {len(f.output_names)} output names for {len(f.results)} results (give one "
                         "per result, None for an anonymous one, or none at all)")
        for r, t in zip(f.results, f.result_types):
            self.type(t, f"result type of {value_text(r)}")
            if r not in self.types:
                self.problem(f"returns {value_text(r)}, which is not defined")
            elif not _same_type(self.types[r], t):
                self.problem(f"returns {value_text(r)} of type {type_text(self.types[r])} as {type_text(t)}")

    # -- dims and conditions
    def dim(self, d: shapes.Dim, what: str) -> None:
        for message in _dim_problems(d, self.bound):
            self.problem(f"{what}: {message}")

    def type(self, t: S.TensorType, what: str) -> None:
        for d in t.shape:
            self.dim(d, what)

    def cond(self, c: S.Cond, what: str) -> None:
        for message in _cond_problems(c, self.bound):
            self.problem(f"{what}: {message}")

    def literal(self, value: object, dtype: S.DType, what: str) -> None:
        message = _literal_problem(value, dtype)
        if message:
            self.problem(f"{what}: {message}")

    # -- ops
    def op(self, op: S.Op) -> None:
        kind = "call" if isinstance(op, S.CallOp) else op.__class__.__name__[:-2].lower()
        names = op.results if isinstance(op, S.CallOp) else (op.result,)
        label = ", ".join(value_text(r) for r in names) or "call"
        self.where = f"@{self.f.name} {label} ({kind}{' ' + quote(op.name) if op.name else ''})"
        if isinstance(op, S.CallOp):
            self.call(op)
        elif isinstance(op, S.ScanOp):
            self.scan(op)
        else:
            domain = op.axes + (() if isinstance(op, S.MapOp) else op.reduce_axes)
            self.domain(domain)
            axes = {a.name for a in domain}
            if isinstance(op, S.ContractOp):
                self.contract(op, axes)
            else:
                topk = isinstance(op, S.ReduceOp) and op.kind in S.TOPK_KINDS
                self.expr(op.body, axes - {op.axes[-1].name} if topk and op.axes else axes)
                if isinstance(op, S.ReduceOp) and op.kind in S.TOPK_KINDS:
                    self.topk(op)
                elif isinstance(op, S.ReduceOp) and op.kind in S.ARG_KINDS:
                    if op.dtype is not S.DType.I64 or len(op.reduce_axes) != 1:
                        self.problem(f"reduce.{op.kind} gives i64 over exactly one reduce axis, not "
                                     f"{op.dtype} over {len(op.reduce_axes)}")
                elif not can_store(op.body.dtype, op.dtype):
                    self.problem(f"the body is {op.body.dtype}, which is not stored into {op.dtype} without a cast")
            if isinstance(op, S.ReduceOp):
                if op.kind not in S.ALL_REDUCE_KINDS:
                    self.problem(f"unknown reduction {op.kind!r}: expected one of {', '.join(S.ALL_REDUCE_KINDS)}")
                elif op.body.dtype.is_bool and op.kind in ("sum", "prod"):
                    self.problem(f"reduce.{op.kind} of a bool body: cast it to a number first")
                self.limits(op)
        for r, t in S.op_results(op):
            if r in self.types:
                self.problem(f"{value_text(r)} is defined twice")
            elif not r.isdigit():
                self.problem(f"op result {value_text(r)} is not a decimal name like %0")
            self.types[r] = t

    def topk(self, op: S.ReduceOp) -> None:
        """A top-k: one reduce axis, a last (rank) axis the body does not use, i64 positions or the body's values."""
        if len(op.reduce_axes) != 1 or not op.axes:
            self.problem(f"reduce.{op.kind} selects along exactly one reduce axis into a last (rank) axis, not "
                         f"{len(op.reduce_axes)} reduce axes and {len(op.axes)} axes")
        elif op.kind.startswith("arg") and op.dtype is not S.DType.I64:
            self.problem(f"reduce.{op.kind} gives i64 positions, not {op.dtype}")
        elif not op.kind.startswith("arg") and not can_store(op.body.dtype, op.dtype):
            self.problem(f"the body is {op.body.dtype}, which is not stored into {op.dtype} without a cast")

    def limits(self, op: S.ReduceOp) -> None:
        """Each length bounds one reduce axis, once, with an integer over the op's (kept) axes."""
        reduced = [a.name for a in op.reduce_axes]
        seen: set[str] = set()
        for name, e in op.limits:
            if name not in reduced or name in seen:
                self.problem(f"a length bounds `{name}`, which is not a reduce axis (or is bounded twice)")
            seen.add(name)
            self.expr(e, {a.name for a in op.axes})
            if e.dtype.is_float or e.dtype.is_bool:
                self.problem(f"the length of `{name}` is {e.dtype}, not an integer")

    def domain(self, axes: tuple[S.Axis, ...]) -> None:
        seen: set[str] = set()
        for a in axes:
            if a.name in seen:
                self.problem(f"axis `{a.name}` appears twice in the op's domain")
            seen.add(a.name)
            self.dim(a.extent, f"extent of axis `{a.name}`")

    def scan(self, op: S.ScanOp) -> None:
        self.domain(op.axes)
        axes = {a.name for a in op.axes}
        if op.kind not in S.SCAN_KINDS:
            self.problem(f"unknown scan {op.kind!r}: expected one of {', '.join(S.SCAN_KINDS)}")
        if op.axis not in axes:
            self.problem(f"the scanned axis `{op.axis}` is not an axis of the op")
        if (op.kind == "linear") != (op.coeff is not None and op.init is not None):
            self.problem("scan.linear (and only it) has a coefficient and an initial value")
        for e in op.exprs:
            self.expr(e, axes)
            if not can_store(e.dtype, op.dtype):
                self.problem(f"an expression is {e.dtype}, which is not stored into {op.dtype} without a cast")
        if op.init is not None and any(isinstance(x, S.Idx) and x.name == op.axis for x in S.walk(op.init)):
            self.problem(f"the initial value depends on the scanned axis `{op.axis}`")
        if op.body.dtype.is_bool and op.kind in ("sum", "prod", "linear"):
            self.problem(f"scan.{op.kind} of a bool body: cast it to a number first")

    def contract(self, op: S.ContractOp, axes: set[str]) -> None:
        for side, load in (("lhs", op.lhs), ("rhs", op.rhs)):
            if not isinstance(load, S.Load):
                self.problem(f"the contract's {side} is not a load: {_short(sexpr_text(load))}")
                return
            self.expr(load, axes)
        if op.lhs.dtype != op.rhs.dtype:
            self.problem(f"contract of {op.lhs.dtype} with {op.rhs.dtype}: both operands need one dtype")
        elif op.lhs.dtype.is_bool:
            self.problem("contract of bool operands: cast them to a number first")
        elif not can_store(op.lhs.dtype, op.dtype):
            self.problem(f"contract of {op.lhs.dtype} operands cannot give {op.dtype} without a cast")

    def call(self, op: S.CallOp) -> None:
        for a in op.args:
            self.use(a)
        callee = self.funcs.get(op.callee)
        if callee is None:
            self.problem(f"calls @{op.callee}, which is not in the module")
            return
        keys = [k for k, _ in op.dims]
        for k, d in op.dims:
            self.dim(d, f"binding of the callee's dim {k}")
        if len(set(keys)) != len(keys):
            self.problem("binds a callee dim twice")
        needed = {b.dim for b in callee.bindings}
        if set(keys) != needed:
            self.problem(f"binds the callee's dims {sorted(set(keys))}; @{callee.name} has dims {sorted(needed)}")
        if len(op.args) != len(callee.params):
            self.problem(f"passes {len(op.args)} arguments; @{callee.name} takes {len(callee.params)}")
        if not len(op.results) == len(op.types) == len(callee.results):
            self.problem(f"defines {len(op.results)} values with {len(op.types)} types; "
                         f"@{callee.name} returns {len(callee.results)}")
        subs = {shapes.sym(k): d for k, d in op.dims}
        for a, p in zip(op.args, callee.params):
            want = _substitute(p.type, subs)
            if a in self.types and not _same_type(self.types[a], want):
                self.problem(f"argument %{p.name} of @{callee.name} is {type_text(want)}, "
                             f"but {value_text(a)} is {type_text(self.types[a])}")
        for r, t, ct in zip(op.results, op.types, callee.result_types):
            self.type(t, f"the type of {value_text(r)}")
            if not _same_type(t, _substitute(ct, subs)):
                self.problem(f"{value_text(r)} is typed {type_text(t)}, but @{callee.name} returns "
                             f"{type_text(_substitute(ct, subs))}")

    def use(self, name: str) -> S.TensorType | None:
        if name in self.types:
            return self.types[name]
        later = "is used before it is defined" if name in self.all_values else "is not defined"
        self.problem(f"{value_text(name)} {later}")
        return None

    # -- scalar expressions
    def expr(self, e: S.SExpr, axes: set[str]) -> None:
        if not isinstance(e, (S.Const, S.Idx, S.DimRef, S.Load, S.Unary, S.Binary, S.Select, S.Cast)):
            self.problem(f"not a scalar expression: {e!r}")
            return
        for child in S.children(e):
            self.expr(child, axes)
        found = self.node(e, axes)
        if found:
            text = _short(sexpr_text(e, {k: t.dtype for k, t in self.types.items()}))
            for message in found:
                self.problem(f"{message}: {text}")

    def node(self, e: S.SExpr, axes: set[str]) -> list[str]:
        """What is wrong with one node, its children already checked."""
        if isinstance(e, S.Const):
            message = _literal_problem(e.value, e.dtype)
            return [f"constant {message}"] if message else []
        if isinstance(e, S.Idx):
            out = [] if e.name in axes else [f"index `{e.name}` is not an axis of this op "
                                             f"(axes: {', '.join(sorted(axes)) or 'none'})"]
            return out + ([] if e.dtype.is_int else [f"index `{e.name}` has dtype {e.dtype}; indices are integers"])
        if isinstance(e, S.DimRef):
            out = [f"dim(…): {m}" for m in _dim_problems(e.dim, self.bound)]
            return out + ([] if e.dtype.is_int else [f"dim(…) has dtype {e.dtype}; dims are integers"])
        if isinstance(e, S.Load):
            return self.load(e)
        if isinstance(e, S.Unary):
            return _unary_problems(e)
        if isinstance(e, S.Binary):
            return _binary_problems(e)
        if isinstance(e, S.Select):
            out = [] if e.cond.dtype.is_bool else [f"select's condition is {e.cond.dtype}, not bool"]
            if not e.a.dtype == e.b.dtype == e.dtype:
                out.append(f"select of {e.a.dtype} and {e.b.dtype} typed {e.dtype}: both branches need its dtype")
            return out
        return []  # Cast: any dtype to any

    def load(self, e: S.Load) -> list[str]:
        out = [f"subscript {i} is {x.dtype}; subscripts are integers"
               for i, x in enumerate(e.indices) if not x.dtype.is_int]
        src = self.use(e.src)
        if src is None:
            return out
        if len(e.indices) != src.rank:
            out.append(f"load of {value_text(e.src)} has {len(e.indices)} subscripts, "
                       f"{value_text(e.src)} has rank {src.rank}")
        if e.dtype != src.dtype:
            out.append(f"load of {value_text(e.src)} is typed {e.dtype}, but {value_text(e.src)} is {src.dtype}")
        return out
