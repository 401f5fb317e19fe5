"""Kernel signatures: parameter and output types, dims, and `where` clauses.

A signature is checked before any kernel body, so kernels may call each other in any
order and across modules. `where` clauses become :class:`arke.ir.semantic.Cond` over the
kernel's dims; those SymPy proves are dropped, those it refutes are errors, the rest are
runtime guards.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DTYPES, FLOAT_MAX, DType, fits, float_fits
from arke.ir.shapes import Dim, const, decide, decide_in, dim_str, floordiv, mod, sym, text_form
from arke.lang import ast
from arke.lang import generics as gen
from arke.lang.diagnostics import Diagnostic, Related, did_you_mean, make
from arke.lang.exprs import REDUCTIONS
from arke.lang.hints import NOT_YET_DTYPES
from arke.lang.satisfy import linear_verdict, may_hold
from arke.lang.source import Source, Span

if TYPE_CHECKING:
    from arke.lang.generics import Generic

ErrorFn = Callable[..., None]

#: Names that are literals: they can never be defined.
RESERVED = frozenset({"inf", "true", "false"})


@dataclass
class Signature:
    """What callers and the body checker need to know about a kernel."""

    name: str
    ir_name: str
    node: ast.Kernel
    source: Source
    params: tuple[ir.Param, ...] = ()
    outputs: tuple[ir.TensorType, ...] = ()
    output_names: tuple[str | None, ...] = ()
    bindings: tuple[ir.DimBinding, ...] = ()
    dims: dict[str, Dim] = field(default_factory=dict)
    conds: tuple[tuple[ir.Cond, str], ...] = ()  # every where clause, as written
    guards: tuple[ir.Guard, ...] = ()  # the clauses left for run time
    subst: dict[sympy.Symbol, Dim] = field(default_factory=dict)  # dims the where clauses equate
    dim_params: frozenset[str] = frozenset()  # the parameters `G: dim` (spec §5.5)
    ok: bool = True
    #: a generic kernel (§5.6): its dtype variables and one signature per combination of dtypes
    generic: Generic | None = None
    #: a specialisation of a generic kernel: the kernel as written, and each variable's dtype here
    template: ast.Kernel | None = None
    specialisation: tuple[tuple[str, DType], ...] = ()

    def param(self, name: str) -> ir.Param | None:
        return next((p for p in self.params if p.name == name), None)


def dim_expr(e: ast.Expr, dims: dict[str, Dim], error: ErrorFn, what: str = "dimension") -> Dim | None:
    """An AST expression over dim names and integers, as a SymPy dim (None after an error)."""
    if isinstance(e, ast.Num):
        if e.is_int:
            if not fits(int(e.value), DType.I64):
                error("AK1005", f"integer literal {ast.shown(e.text)} does not fit in i64", e.span,
                      hint=f"a {what} is an i64; i64 holds values up to {2**63 - 1}")
                return None
            return const(int(e.value))
        error("AK3015", f"a {what} must be an integer, not `{e.value}`", e.span)
        return None
    if isinstance(e, ast.Name):
        if e.id in dims:
            return dims[e.id]
        guess = did_you_mean(e.id, dims)
        error("AK2001", f"unknown dim `{e.id}`", e.span,
              hint=f"did you mean `{guess}`?" if guess else "dims are named in the parameters' types, as in "
              "`x: f32[M, N]`", replacement=guess)
        return None
    if isinstance(e, ast.Unary) and e.op == "-":
        inner = dim_expr(e.operand, dims, error, what)
        return None if inner is None else -inner
    if isinstance(e, ast.Binary) and e.op in ("+", "-", "*", "/", "//", "%"):
        a, b = dim_expr(e.left, dims, error, what), dim_expr(e.right, dims, error, what)
        if a is None or b is None:
            return None
        if e.op in ("/", "//", "%") and b == 0:
            error("AK3015", "division by zero in a dimension", e.span)
            return None
        return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: floordiv(a, b),
                "//": lambda: floordiv(a, b), "%": lambda: mod(a, b)}[e.op]()
    error("AK3015", f"a {what} may only use dim names, integers and `+ - * / // %`", e.span)
    return None


def cond_expr(e: ast.Expr, dims: dict[str, Dim], error: ErrorFn) -> ir.Cond | None:
    """A `where`/`when` condition over dims as an IR condition."""
    if isinstance(e, ast.Binary) and e.op in ("and", "or"):
        a, b = cond_expr(e.left, dims, error), cond_expr(e.right, dims, error)
        return None if a is None or b is None else ir.BoolOp(e.op, (a, b))
    if isinstance(e, ast.Unary) and e.op == "not":
        a = cond_expr(e.operand, dims, error)
        return None if a is None else ir.BoolOp("not", (a,))
    if isinstance(e, ast.Binary) and e.op in ("==", "!=", "<", "<=", ">", ">="):
        a, b = dim_expr(e.left, dims, error), dim_expr(e.right, dims, error)
        return None if a is None or b is None else ir.Rel(e.op, a, b)
    if isinstance(e, ast.InSet):
        x = dim_expr(e.operand, dims, error)
        values = [dim_expr(v, dims, error) for v in e.values]
        if x is None or any(v is None for v in values):
            return None
        return ir.InSet(x, tuple(v for v in values if v is not None))
    error("AK3017", "a condition here must compare dims, as in `N % 16 == 0` or `S in {1, 2}`", e.span)
    return None


_REL = {"==": sympy.Eq, "!=": sympy.Ne, "<": sympy.Lt, "<=": sympy.Le, ">": sympy.Gt, ">=": sympy.Ge}


def cond_sympy(c: ir.Cond, subst: dict[sympy.Symbol, Dim] | None = None) -> sympy.Basic:
    """The SymPy boolean of a condition, with equal dims substituted."""
    s = subst or {}
    if isinstance(c, ir.Rel):
        return _REL[c.op](_subs(c.lhs, s), _subs(c.rhs, s))
    if isinstance(c, ir.InSet):
        return sympy.Or(*[sympy.Eq(_subs(c.x, s), _subs(v, s)) for v in c.values])
    parts = [cond_sympy(p, s) for p in c.parts]
    return {"and": sympy.And, "or": sympy.Or}[c.op](*parts) if c.op != "not" else sympy.Not(parts[0])


def decide_cond(c: ir.Cond, subst: dict[sympy.Symbol, Dim] | None = None) -> bool | None:
    """:func:`decide` of :func:`cond_sympy`, with a set membership decided by :func:`decide_in`
    (linear in the set) instead of SymPy's ``Or`` of one ``Eq`` a value."""
    s = subst or {}
    if isinstance(c, ir.Rel) and (fast := linear_verdict(c.op, _subs(c.lhs, s), _subs(c.rhs, s))) is not None:
        return fast[0]
    if not _has_set(c):
        return decide(cond_sympy(c, s))
    if isinstance(c, ir.InSet):
        return decide_in(_subs(c.x, s), [_subs(v, s) for v in c.values])
    assert isinstance(c, ir.BoolOp)
    verdicts = [decide_cond(p, s) for p in c.parts]
    if c.op == "not":
        return None if verdicts[0] is None else not verdicts[0]
    if c.op == "and":
        return False if False in verdicts else (True if all(v is True for v in verdicts) else None)
    return True if True in verdicts else (False if all(v is False for v in verdicts) else None)


def _has_set(c: ir.Cond) -> bool:
    return isinstance(c, ir.InSet) or (isinstance(c, ir.BoolOp) and any(_has_set(p) for p in c.parts))


def cond_str(c: ir.Cond) -> str:
    """A condition as text, in the language's own spelling."""
    if isinstance(c, ir.Rel):
        return f"{dim_str(c.lhs)} {c.op} {dim_str(c.rhs)}"
    if isinstance(c, ir.InSet):
        return f"{dim_str(c.x)} in {{{', '.join(dim_str(v) for v in c.values)}}}"
    if c.op == "not":
        return f"not ({cond_str(c.parts[0])})"
    return f" {c.op} ".join(f"({cond_str(p)})" if isinstance(p, ir.BoolOp) else cond_str(p) for p in c.parts)


def _subs(d: Dim, s: dict[sympy.Symbol, Dim]) -> Dim:
    """Replace every symbol of ``s`` at once (a callee's ``M, N`` may become the caller's ``N, M``)."""
    if not s or isinstance(d, sympy.Integer):  # a literal (most values of a large `in` set) has none
        return d
    return text_form(sympy.sympify(d).xreplace(s))


def subs_dims(d: Dim, s: dict[sympy.Symbol, Dim]) -> Dim:
    return _subs(d, s)


def cond_subs(c: ir.Cond, mapping: dict[sympy.Symbol, Dim]) -> ir.Cond:
    """Rename the dims of a condition (callee dims to the caller's at a call)."""
    if isinstance(c, ir.Rel):
        return ir.Rel(c.op, _subs(c.lhs, mapping), _subs(c.rhs, mapping))
    if isinstance(c, ir.InSet):
        return ir.InSet(_subs(c.x, mapping), tuple(_subs(v, mapping) for v in c.values))
    return ir.BoolOp(c.op, tuple(cond_subs(p, mapping) for p in c.parts))


def build_signature(node: ast.Kernel, source: Source, ir_name: str, diags: list[Diagnostic]) -> Signature:
    """Check a kernel's header and return its signature (``ok`` False when it had errors).

    A generic kernel (§5.6) gets one signature per combination of its dtype variables, each built
    from the kernel with the dtypes written in (:mod:`arke.lang.generics`); the one returned stands
    for them all (its ``generic`` holds them) and otherwise reads as the first.
    """
    declared = gen.declare(node, diags)
    if declared is None:
        return _build_signature(node, source, ir_name, diags)
    dvars, ok = declared
    if not ok or not dvars:  # the header as if each variable were its first dtype, for its other errors
        firsts = {v.name: str(v.members[0]) for v in dvars}
        sig = _build_signature(gen.specialise(node, firsts), source, ir_name, diags)
        return replace(sig, node=node, ok=False)
    members: dict[tuple[DType, ...], Signature] = {}
    found: dict[tuple[DType, ...], list[Diagnostic]] = {}
    for combo in gen.combinations(dvars):
        names = tuple(v.name for v in dvars)
        found[combo] = []
        spec = gen.specialise(node, {n: str(d) for n, d in zip(names, combo)})
        member = _build_signature(spec, source, gen.mangle(ir_name, names, combo), found[combo])
        member.template, member.specialisation = node, tuple(zip(names, combo))
        members[combo] = member
    diags.extend(gen.merge(dvars, found))
    first = next(iter(members.values()))
    return replace(first, ir_name=ir_name, node=node, ok=all(m.ok for m in members.values()),
                   generic=gen.Generic(dvars, members), template=None, specialisation=())


def _build_signature(node: ast.Kernel, source: Source, ir_name: str, diags: list[Diagnostic]) -> Signature:
    sig = Signature(node.name, ir_name, node, source)

    def error(code: str, message: str, span: Span, **kw: object) -> None:
        sig.ok = False
        diags.append(make(code, message, span, **kw))  # type: ignore[arg-type]

    seen: dict[str, Span] = {}
    bindings: list[ir.DimBinding] = []
    params: list[ir.Param] = []
    # First pass: bind every dim given as a dim parameter (an axis of that name is then checked
    # against it), then every dim written alone as a parameter axis.
    for p in node.params:
        if is_dim_param(p) and p.name not in sig.dims and p.name not in RESERVED:
            sig.dims[p.name] = sym(p.name)
            bindings.append(ir.DimBinding(p.name, p.name, -1))
            sig.dim_params |= {p.name}
    for p in node.params:
        for axis, d in enumerate(p.type.dims or ()):
            if isinstance(d, ast.Name) and d.id not in sig.dims:
                sig.dims[d.id] = sym(d.id)
                bindings.append(ir.DimBinding(d.id, p.name, axis))
    # A dim that only appears inside compound dims (`f32[N / 2]`) cannot be read from the
    # arguments: one AK3015 per name, and the name is taken as a dim so nothing else cascades.
    for p in node.params:
        for d in p.type.dims or ():
            for name in _names(d):
                if name not in sig.dims:
                    error("AK3015", f"dim `{name}` is never given by itself in a parameter's type, so its value "
                          "cannot be read from the arguments", d.span,
                          hint=f"add a parameter axis that is exactly `{name}`")
                    sig.dims[name] = sym(name)
    for p in node.params:
        if is_dim_param(p) and p.name in sig.dim_params and p.name not in seen:
            seen[p.name] = p.span
            params.append(_dim_param(p, error))
            continue
        if p.name in sig.dims:
            error("AK2003", f"parameter `{p.name}` has the name of a dim", p.span,
                  hint="dims and parameters share one namespace: rename one of them")
            continue
        if p.name in RESERVED:
            error("AK2003", f"`{p.name}` is a literal and cannot name a parameter", p.span)
            continue
        if p.name in seen:
            error("AK2003", f"parameter `{p.name}` is declared twice", p.span,
                  related=[Related(seen[p.name], "first declared here")])
            continue
        seen[p.name] = p.span
        ttype = _type(p.type, sig.dims, error, "parameter")
        if ttype is None:
            continue
        default = None
        if p.default is not None:
            default = _default(p, ttype, error)
        params.append(ir.Param(p.name, ttype, default))
    sig.params = tuple(params)
    sig.bindings = tuple(bindings)
    outputs, names = [], []
    for o in node.outputs:
        t = _type(o.type, sig.dims, error, "output")
        if t is None:
            continue
        if o.name is not None and o.name in seen:
            error("AK2003", f"output `{o.name}` has the name of a parameter", _name_span(sig.source, o),
                  related=[Related(seen[o.name], "the parameter")])
        elif o.name is not None and o.name in names:
            first = node.outputs[[x.name for x in node.outputs].index(o.name)]
            error("AK2003", f"output `{o.name}` is declared twice", _name_span(sig.source, o),
                  related=[Related(_name_span(sig.source, first), "first declared here")],
                  hint="give each output its own name")
        elif o.name is not None and (clash := _output_clash(o.name, sig)) is not None:
            error("AK2003", f"output `{o.name}` has the name of {clash}", _name_span(sig.source, o),
                  hint="give the output another name")
        outputs.append(t)
        names.append(o.name)
    if not node.outputs:
        error("AK2202", f"kernel `{node.name}` does not declare what it returns", node.name_span,
              hint="add the output type after the parameters, as in `-> f32[M, N]`")
    sig.outputs, sig.output_names = tuple(outputs), tuple(names)
    _where(sig, node, error)
    return sig


def _name_span(source: Source, o: ast.Output) -> Span:
    """Where an output's name is written (its node spans the name and the type, after `->` when alone)."""
    at = source.text.rfind(o.name or "", o.span.start, o.type.span.start)
    return source.span(at, at + len(o.name or "")) if o.name and at >= 0 else o.span


def _output_clash(name: str, sig: Signature) -> str | None:
    """What an output's name already names (spec §6: a new name is not a dim, a literal, a reduction or a
    scan; like a parameter it may share a function's name), or None."""
    if name in sig.dims:
        return "a dim"
    if name in RESERVED:
        return "a literal"
    return "a reduction" if name in REDUCTIONS else "a scan" if name in ast.SCANS else None


def is_dim_param(p: ast.Param) -> bool:
    """Whether ``p`` is a dim parameter, ``G: dim`` (spec §5.5)."""
    return p.type.dtype == "dim"


def _dim_param(p: ast.Param, error: ErrorFn) -> ir.Param:
    """The IR parameter of ``G: dim``: an ``i64`` scalar whose value binds the dim (a ``DimBinding`` of axis -1)."""
    if p.type.dims is not None:
        error("AK3021", f"dim parameter `{p.name}` takes no dims of its own", p.type.span,
              hint=f"write `{p.name}: dim`; a tensor of integers is `i64[...]`")
    default: int | None = None
    d = p.default
    if d is not None:
        if isinstance(d, ast.Num) and d.is_int and 1 <= int(d.value) < 2**63:
            default = int(d.value)
        else:
            shown = ast.shown(d.text) if isinstance(d, ast.Num) else "this"
            error("AK3021", f"the default of dim parameter `{p.name}` must be an integer of at least 1, not {shown}",
                  d.span, hint=f"write a positive integer, as in `{p.name}: dim = 32`")
    return ir.Param(p.name, ir.TensorType(DType.I64), default)


def clause_text(source: str) -> str:
    """A clause as written, without its comments and line breaks (it is shown in errors and kept in the IR, whose
    hash keys caches and tuning records: a comment must change neither)."""
    return " ".join(re.sub(r"#[^\n\r]*", " ", source).split())


def _where(sig: Signature, node: ast.Kernel, error: ErrorFn) -> None:
    conds = []
    for clause in node.where:
        c = cond_expr(clause, sig.dims, error)
        if c is not None:
            span = sig.source.balanced(clause.span)
            conds.append((c, clause_text(sig.source.text[span.start:span.end]), span))
    for c, _, _ in conds:  # equalities let the checker treat two names as one dim
        if isinstance(c, ir.Rel) and c.op == "==":
            if isinstance(c.rhs, sympy.Symbol) and c.rhs not in sympy.sympify(c.lhs).free_symbols:
                sig.subst[c.rhs] = c.lhs
            elif isinstance(c.lhs, sympy.Symbol) and c.lhs not in sympy.sympify(c.rhs).free_symbols:
                sig.subst[c.lhs] = c.rhs
    for _ in range(len(sig.subst)):  # close chains (K -> N, N -> M) so one replacement suffices
        closed = {k: sympy.sympify(v).xreplace(sig.subst) for k, v in sig.subst.items()}
        if closed == sig.subst:
            break
        sig.subst = {k: v for k, v in closed.items() if k not in sympy.sympify(v).free_symbols}
    guards = []
    refuted = False
    for c, text, span in conds:
        verdict = decide_cond(c)
        if verdict is False:
            refuted = True
            error("AK3007", f"where clause `{text}` can never hold", span,
                  hint="every dim is a positive integer; check the clause")
        elif verdict is None:
            guards.append(ir.Guard(c, text))
    together = refuted or may_hold(c for c, _, _ in conds)  # each holds alone: can they hold together?
    for k in range(len(conds) if not together else 0):  # the first clause that no longer can, marked
        if not may_hold(c for c, _, _ in conds[:k + 1]):
            with_others = k > 0 and may_hold([conds[k][0]])  # it could hold alone: the ones before rule it out
            if with_others:
                error("AK3007", f"where clause `{conds[k][1]}` can never hold together with the clauses before it",
                      conds[k][2], hint="no positive dims satisfy all of them; check the clauses")
            else:
                error("AK3007", f"where clause `{conds[k][1]}` can never hold", conds[k][2],
                      hint="every dim is a positive integer; check the clause")
            break
    sig.conds = tuple((c, text) for c, text, _ in conds)
    sig.guards = tuple(guards)


def _names(e: ast.Expr) -> list[str]:
    if isinstance(e, ast.Name):
        return [e.id]
    if isinstance(e, ast.Binary):
        return _names(e.left) + _names(e.right)
    if isinstance(e, ast.Unary):
        return _names(e.operand)
    return []


def _type(t: ast.TypeExpr, dims: dict[str, Dim], error: ErrorFn, what: str) -> ir.TensorType | None:
    dtype = DTYPES.get(t.dtype)
    if dtype is None:
        instead = NOT_YET_DTYPES.get(t.dtype)
        guess = None if instead is not None else did_you_mean(t.dtype, DTYPES)
        hint = instead or (f"did you mean `{guess}`?" if guess else "dtypes are " + ", ".join(DTYPES)
                           + f"; for a kernel that serves several, declare `{t.dtype}` a dtype variable: "
                           f"`where {t.dtype} in {{f32, bf16, f16}}`")
        error("AK3001", f"unknown dtype `{t.dtype}`", t.dtype_span, hint=hint, replacement=guess)
        return None
    shape: list[Dim] = []
    for d in t.dims or ():
        value = dim_expr(d, dims, error)
        if value is None:
            return None
        if value.is_number and int(value) < 1:
            article = "an" if what[0] in "aeiou" else "a"
            error("AK3015", f"{article} {what} dim must be at least 1, not {dim_str(value)}", d.span)
            return None
        shape.append(value)
    return ir.TensorType(dtype, tuple(shape))


def declared_shape(t: ast.TypeExpr, dims: dict[str, Dim], error: ErrorFn) -> ir.TensorType | None:
    """The type of a declared intermediate (spec §7.3), checked like a parameter's type."""
    return _type(t, dims, error, "declared")


def _default(p: ast.Param, t: ir.TensorType, error: ErrorFn) -> float | int | bool | None:
    if t.rank:
        error("AK3018", f"only scalar parameters take defaults, and `{p.name}` is a tensor", p.default.span
              if p.default else p.span)
        return None
    d = p.default
    if isinstance(d, ast.Name) and d.id in ("true", "false"):
        value: float | int | bool = d.id == "true"
        given = DType.BOOL
    elif isinstance(d, ast.Num):
        value = d.value
        given = DType.I64 if d.is_int else DType.F32
    else:
        error("AK3018", f"the default of `{p.name}` must be a literal number", d.span if d else p.span)
        return None
    ok = (given.is_bool == t.dtype.is_bool) and not (given.is_float and t.dtype.is_int)
    if ok and t.dtype.is_int and not fits(int(value), t.dtype):
        ok = False
    infinite = isinstance(d, ast.Num) and d.text.lstrip("+-") == "inf"
    if ok and t.dtype.is_float and not infinite and not float_fits(float(value), t.dtype):
        ok = False
    if not ok:
        hint = ("write `true` or `false`" if t.dtype.is_bool else "write an integer that fits" if t.dtype.is_int
                else f"write a number up to ±{FLOAT_MAX[t.dtype]:.7g}" if given != DType.BOOL else "write a number")
        error("AK3018", f"default `{d.id if isinstance(d, ast.Name) else ast.shown(d.text)}` does not fit "
              f"`{p.name}: {t.dtype}`", d.span, hint=hint)
        return None
    return float(value) if t.dtype.is_float else value
