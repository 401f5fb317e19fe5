"""The invariants of SemanticIR and StrategyIR, checked.

:func:`verify` raises :class:`IRVerifyError` listing every problem found (``problems``
returns the list without raising). Each pass may assume these on its input and must keep
them on its output; ``spec/ir.md`` states them in prose. In brief:

* **SSA.** Parameter names are identifiers; op results are decimal strings (``"0"``,
  ``"1"`` …); every value is defined once and used only after its definition.
* **Dims.** Every dim is an integer expression whose symbols are bound by the function's
  ``dims`` (each binding names a parameter axis whose extent is exactly that symbol).
* **Domains.** Axis names are unique within an op; an ``Idx`` names an axis of its op
  (``axes``, plus ``reduce_axes`` for reduce and contract); a load has one subscript per
  axis of its source.
* **Dtypes.** A load has its source's dtype; subscripts, ``Idx`` and ``DimRef`` are integers;
  arithmetic (``add`` … ``min``) and ``select`` branches have exactly the node's dtype (no
  implicit promotion: conversions are explicit ``Cast`` nodes); comparisons take two
  operands of one dtype and give bool; ``and or not`` and ``select``'s condition are bool;
  math functions (``exp`` … ``log2``) take and give floats; ``neg abs relu`` take numbers.
  An op's body may differ from the op's dtype only as :func:`~arke.ir.dtypes.can_store`
  allows (floats round to the op's dtype when stored).
* **Calls.** The callee exists, calls form no cycle, and argument and result types match
  the callee's after substituting the call's dim bindings.
"""

from __future__ import annotations

from collections.abc import Iterable

import sympy

from arke.ir import semantic as S
from arke.ir import shapes
from arke.ir.dtypes import can_store
from arke.ir.strategy import DECISIONS, Decision, DecisionSpec, StrategySet
from arke.ir.text import quote, sexpr_text, type_text, value_text

#: Unary ops on floats only; ``neg abs relu`` take any number and ``not`` a bool.
FLOAT_UNARY = frozenset(S.UNARY_OPS) - {"neg", "abs", "relu", "not"}
NUMERIC_UNARY = frozenset({"neg", "abs", "relu"})
LOGICAL = frozenset({"and", "or"})
#: Binary ops whose operands and result share one numeric dtype.
ARITHMETIC = frozenset(S.BINARY_OPS) - S.COMPARISONS - LOGICAL


class IRVerifyError(ValueError):
    """IR that breaks an invariant; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__(f"invalid IR ({len(problems)} problem{'s' * (len(problems) != 1)}):\n"
                         + "\n".join(f"  {p}" for p in problems))


def verify(m: S.Module) -> None:
    """Raise :class:`IRVerifyError` unless ``m`` keeps every SemanticIR invariant."""
    found = problems(m)
    if found:
        raise IRVerifyError(found)


def problems(m: S.Module) -> list[str]:
    """Every SemanticIR invariant ``m`` breaks, one message each (empty when valid)."""
    out: list[str] = []
    if m.version != S.FORMAT_VERSION:
        out.append(f"module: version {m.version}, expected {S.FORMAT_VERSION}")
    funcs: dict[str, S.Function] = {}
    for f in m.functions:
        if f.name in funcs:
            out.append(f"@{f.name}: defined twice in the module")
        funcs.setdefault(f.name, f)
    for f in m.functions:
        _FunctionCheck(f, funcs, out).run()
    out.extend(_call_cycles(m.functions))
    return out


def _call_cycles(functions: Iterable[S.Function]) -> list[str]:
    calls = {f.name: [op.callee for op in f.ops if isinstance(op, S.CallOp)] for f in functions}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    out: list[str] = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for callee in calls.get(name, []):
            if state.get(callee) == 1:
                cycle = [*path[path.index(callee):], callee]
                out.append("calls form a cycle: " + " -> ".join(f"@{n}" for n in cycle))
            elif callee in calls and callee not in state:
                visit(callee, [*path, callee])
        state[name] = 2

    for name in calls:
        if name not in state:
            visit(name, [name])
    return out


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
        else:
            domain = op.axes + (() if isinstance(op, S.MapOp) else op.reduce_axes)
            self.domain(domain)
            axes = {a.name for a in domain}
            if isinstance(op, S.ContractOp):
                self.contract(op, axes)
            else:
                self.expr(op.body, axes)
                if not can_store(op.body.dtype, op.dtype):
                    self.problem(f"the body is {op.body.dtype}, which is not stored into {op.dtype} without a cast")
            if isinstance(op, S.ReduceOp):
                if op.kind not in S.REDUCE_KINDS:
                    self.problem(f"unknown reduction {op.kind!r}: expected one of {', '.join(S.REDUCE_KINDS)}")
                elif op.body.dtype.is_bool and op.kind in ("sum", "prod"):
                    self.problem(f"reduce.{op.kind} of a bool body: cast it to a number first")
        for r, t in S.op_results(op):
            if r in self.types:
                self.problem(f"{value_text(r)} is defined twice")
            elif not r.isdigit():
                self.problem(f"op result {value_text(r)} is not a decimal name like %0")
            self.types[r] = t

    def domain(self, axes: tuple[S.Axis, ...]) -> None:
        seen: set[str] = set()
        for a in axes:
            if a.name in seen:
                self.problem(f"axis `{a.name}` appears twice in the op's domain")
            seen.add(a.name)
            self.dim(a.extent, f"extent of axis `{a.name}`")

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


def _dim_problems(d: shapes.Dim, bound: set[str] | None) -> list[str]:
    """A dim must be an integer expression; with ``bound``, its symbols must be among them."""
    expr = sympy.sympify(d)
    out = []
    unbound = sorted(shapes.free_dims(expr) - bound) if bound is not None else []
    if unbound:
        out.append(f"dim {shapes.dim_str(expr)} uses {', '.join(unbound)}, not bound by `dims`")
    if expr.is_integer is not True:
        out.append(f"dim {shapes.dim_str(expr)} is not an integer expression")
    return out


def _cond_problems(c: S.Cond, bound: set[str] | None) -> list[str]:
    if isinstance(c, S.Rel):
        out = [] if c.op in ("==", "!=", "<", "<=", ">", ">=") else [f"unknown relation {c.op!r}"]
        return out + _dim_problems(c.lhs, bound) + _dim_problems(c.rhs, bound)
    if isinstance(c, S.InSet):
        return [m for d in (c.x, *c.values) for m in _dim_problems(d, bound)]
    if isinstance(c, S.BoolOp):
        out = []
        if c.op not in ("and", "or", "not") or (c.op == "not" and len(c.parts) != 1):
            out.append(f"a condition combines parts with 'and' or 'or', or negates one with 'not' "
                       f"(found {c.op!r} of {len(c.parts)})")
        return out + [m for part in c.parts for m in _cond_problems(part, bound)]
    return [f"not a condition: {c!r}"]


def _literal_problem(value: object, dtype: S.DType) -> str | None:
    """bool values for bool; ints for integer dtypes; ints or floats for float dtypes."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = (isinstance(value, bool) if dtype.is_bool
          else number and isinstance(value, int) if dtype.is_int else number)
    return None if ok else f"{value!r} is not a value of dtype {dtype}"


def _unary_problems(e: S.Unary) -> list[str]:
    if e.op not in S.UNARY_OPS:
        return [f"unknown unary op {e.op!r}"]
    if e.op == "not":
        ok = e.x.dtype.is_bool and e.dtype.is_bool
        return [] if ok else [f"not of {e.x.dtype} typed {e.dtype}: not takes and gives bool"]
    if e.x.dtype != e.dtype:
        return [f"{e.op} of {e.x.dtype} typed {e.dtype}: a unary op keeps its operand's dtype (cast first)"]
    if e.op in FLOAT_UNARY and not e.dtype.is_float:
        return [f"{e.op} of {e.x.dtype}: it takes a float (cast first)"]
    if e.op in NUMERIC_UNARY and e.dtype.is_bool:
        return [f"{e.op} of bool: it takes a number"]
    return []


def _binary_problems(e: S.Binary) -> list[str]:
    if e.op not in S.BINARY_OPS:
        return [f"unknown binary op {e.op!r}"]
    a, b = e.a.dtype, e.b.dtype
    if e.op in S.COMPARISONS:
        out = [] if a == b else [f"{e.op} of {a} and {b}: both operands need one dtype (cast one)"]
        return out + ([] if e.dtype.is_bool else [f"{e.op} typed {e.dtype}: comparisons give bool"])
    if e.op in LOGICAL:
        ok = a.is_bool and b.is_bool and e.dtype.is_bool
        return [] if ok else [f"{e.op} of {a} and {b} typed {e.dtype}: it takes and gives bool"]
    if not a == b == e.dtype:
        return [f"{e.op} of {a} and {b} typed {e.dtype}: operands need the node's dtype (insert a cast)"]
    return [f"{e.op} of bool: arithmetic takes numbers"] if e.dtype.is_bool else []


# ---------------------------------------------------------------- strategies


def verify_strategies(s: StrategySet, module: S.Module | None = None) -> None:
    """Raise :class:`IRVerifyError` unless every decision is legal (and fits ``module``'s kernels, if given)."""
    found = strategy_problems(s, module)
    if found:
        raise IRVerifyError(found)


def strategy_problems(s: StrategySet, module: S.Module | None = None) -> list[str]:
    """Every problem of ``s``: unknown decision kinds, subjects or values out of range,
    targets a decision has no effect on, and with ``module``: unknown kernels, indices and
    operands, ``parallel`` over an index that is only ever reduced, ``when`` dims not bound."""
    out: list[str] = []
    funcs = {f.name: f for f in module.functions} if module else {}
    for n, st in enumerate(s.strategies):
        where = f"strategy {n} (@{st.kernel}{'' if st.target is None else ' target ' + st.target})"
        from arke.targets.base import names as target_names

        if st.target is not None and st.target not in target_names():
            out.append(f"{where}: unknown target {st.target!r}: expected one of {', '.join(target_names())}")
        kernel = funcs.get(st.kernel)
        if module is not None and kernel is None:
            out.append(f"{where}: no kernel @{st.kernel} in the module")
        if st.when is not None:
            bound = None if kernel is None else {b.dim for b in kernel.bindings}
            out += [f"{where}: `when`: {m}" for m in _cond_problems(st.when, bound)]
        seen: set[tuple[str, str | None]] = set()
        for d in st.decisions:
            if (d.kind, d.subject) in seen:
                out.append(f"{where}: `{d.kind}{' ' + d.subject if d.subject else ''}` is decided twice")
            seen.add((d.kind, d.subject))
            out += [f"{where}: {p}" for p in _decision_problems(d, st.target, kernel)]
    return out


def _decision_problems(d: Decision, target: str | None, kernel: S.Function | None) -> list[str]:
    spec = DECISIONS.get(d.kind)
    if spec is None:
        return [f"unknown decision `{d.kind}`: expected one of {', '.join(DECISIONS)}"]
    from arke.targets import base as targets  # the registry: each target's facts, nothing heavy

    out = []
    honouring = targets.honouring(d.kind)
    if target in targets.names() and target not in honouring:
        out.append(f"`{d.kind}` has no effect on target {target} (it applies to {', '.join(sorted(honouring))})")
    allowed = targets.narrowed_choices(d.kind, target)
    if allowed is not None and d.value not in allowed:
        out.append(f"target {target} cannot lower `{d.kind} = {d.value}` (only {', '.join(allowed)})")
    if spec.subject == "none" and d.subject is not None:
        out.append(f"`{d.kind}` applies to the whole kernel: write `{d.kind} = …` without `{d.subject}`")
    elif spec.subject != "none" and d.subject is None:
        out.append(f"`{d.kind}` needs {'an index' if spec.subject == 'index' else 'an operand'}: "
                   f"`{d.kind} {'i' if spec.subject == 'index' else 'w'}{' = …' if spec.values != 'none' else ''}`")
    out += _value_problems(d, spec)
    if kernel is not None and d.subject is not None:
        out += _subject_problems(d, spec, kernel)
    return out


def _value_problems(d: Decision, spec: DecisionSpec) -> list[str]:
    v = d.value
    if spec.values == "none":
        return [] if v is None else [f"`{d.kind}` takes no value (found {v!r})"]
    if v is None:
        return [f"`{d.kind}` needs a value"] if spec.value_required else []
    if spec.values == "enum":
        return [] if v in spec.choices else [f"`{d.kind}` is one of {', '.join(spec.choices)} (found {v!r})"]
    if not isinstance(v, int) or isinstance(v, bool):
        return [f"`{d.kind}` takes an integer (found {v!r})"]
    low = 2 if spec.values == "split" else 1
    if v < low or (spec.values == "pow2" and v & (v - 1)):
        rule = {"pos": "at least 1", "split": "at least 2", "pow2": "a power of two"}[spec.values]
        return [f"`{d.kind}` must be {rule} (found {v})"]
    if spec.maximum is not None and v > spec.maximum:
        return [f"`{d.kind}` is at most {spec.maximum} (found {v})"]
    return []


def _subject_problems(d: Decision, spec: DecisionSpec, kernel: S.Function) -> list[str]:
    assert d.subject is not None
    if spec.subject == "operand":
        param = next((p for p in kernel.params if p.name == d.subject), None)
        if param is None or not param.type.rank:
            return [f"`{d.kind} {d.subject}`: @{kernel.name} has no tensor parameter %{d.subject}"]
        return []
    free = {a.name for op in kernel.ops if not isinstance(op, S.CallOp) for a in op.axes}
    reduced = {a.name for op in kernel.ops if isinstance(op, (S.ReduceOp, S.ContractOp)) for a in op.reduce_axes}
    if d.subject not in free | reduced:
        known = ", ".join(sorted(free | reduced)) or "none"
        return [f"`{d.kind} {d.subject}`: @{kernel.name} has no index `{d.subject}` (indices: {known})"]
    if d.kind == "parallel" and d.subject not in free:
        return [f"`parallel {d.subject}`: `{d.subject}` is only ever reduced, and running a reduction in "
                f"parallel would change its order; use `split {d.subject} = n`"]
    if d.kind == "split" and d.subject not in reduced:
        return [f"`split {d.subject}`: `{d.subject}` is never reduced; split applies to a reduced index"]
    return []
