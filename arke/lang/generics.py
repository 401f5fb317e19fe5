"""Dtype generics (language spec §5.6): `where W in {f32, bf16, f16}` and its specialisations.

A generic kernel is checked by **specialising** it: for each combination of its dtype
variables the kernel's AST is rewritten with the dtypes written in (``w: W[N, K]`` becomes
``w: bf16[N, K]``, ``W(e)`` becomes ``bf16(e)``, the dtype clauses dropped) and that kernel
is checked like any other, under its own IR name (``linear__W_bf16``). So every later stage
— passes, plans, the interpreter, every target, the caches — sees ordinary kernels; what is
generic is only how a call picks one (:func:`pick`, and ``arke.runtime.generics`` at run
time).

The diagnostics of the members are merged (:func:`merge`): what every member reports is
reported once, what only some do says for which (``(when W = i8)``).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from arke.ir.dtypes import DTYPES, DType
from arke.lang import ast
from arke.lang.diagnostics import Diagnostic, Related, did_you_mean, make
from arke.lang.source import Span

if TYPE_CHECKING:
    from arke.ir.strategy import Strategy

#: The most combinations (the product of the sets' sizes) a generic kernel may have: each is checked.
MAX_SPECIALISATIONS = 64


@dataclass(frozen=True)
class DtypeVar:
    """One dtype variable: its set, and the tensor parameter that binds it (by name and position)."""

    name: str
    members: tuple[DType, ...]
    span: Span  # the `W in {...}` clause
    param: str
    index: int


@dataclass
class Generic:
    """What a generic kernel's signature adds: its variables and one signature per combination."""

    vars: tuple[DtypeVar, ...]
    members: dict[tuple[DType, ...], Any]  # combination -> its Signature (arke.lang.signatures)

    def combos(self) -> list[tuple[DType, ...]]:
        return list(self.members)


def is_dtype_clause(e: ast.Expr, dims: set[str]) -> bool:
    """Whether a `where` clause declares a dtype variable: `NAME in {NAME, ...}` over no dim, or whose
    members are names (a dim's set holds integers)."""
    return (isinstance(e, ast.InSet) and isinstance(e.operand, ast.Name) and bool(e.values)
            and all(isinstance(v, ast.Name) for v in e.values)
            and (e.operand.id not in dims or any(v.id in DTYPES for v in e.values if isinstance(v, ast.Name))))


def mangle(ir_name: str, names: tuple[str, ...], combo: tuple[DType, ...]) -> str:
    """The IR name of one specialisation: ``linear__W_bf16`` (``__A_f32__B_i8`` for two variables)."""
    return ir_name + "".join(f"__{n}_{d}" for n, d in zip(names, combo))


def _param_dims(node: ast.Kernel) -> set[str]:
    out: set[str] = set()
    for p in node.params:
        for d in p.type.dims or ():
            if isinstance(d, ast.Name):
                out.add(d.id)
    return out


def declare(node: ast.Kernel, diags: list[Diagnostic]) -> tuple[tuple[DtypeVar, ...], bool] | None:
    """The kernel's dtype variables and whether they are well declared (AK2113, AK3025, AK3026 otherwise);
    None when the kernel is not generic."""
    dims = _param_dims(node)
    clauses = [c for c in node.where if is_dtype_clause(c, dims)]
    if not clauses:
        return None
    ok = True
    params = {p.name for p in node.params}
    found: list[DtypeVar] = []
    seen: dict[str, Span] = {}
    for c in clauses:
        assert isinstance(c, ast.InSet) and isinstance(c.operand, ast.Name)
        name, span = c.operand.id, c.operand.span
        clash = ("a dtype" if name in DTYPES else "a dim" if name in dims else "a parameter" if name in params
                 else None)
        if clash is not None:
            diags.append(make("AK2113", f"dtype variable `{name}` has the name of {clash}", span,
                              hint="name a dtype variable with a name of its own, as `W`"))
            ok = False
            continue
        if name in seen:
            diags.append(make("AK2113", f"dtype variable `{name}` is declared twice", span,
                              related=[Related(seen[name], "first declared here")],
                              hint="list every dtype in one set: `W in {f32, bf16}`"))
            ok = False
            continue
        seen[name] = span
        members: list[DType] = []
        for v in c.values:
            assert isinstance(v, ast.Name)
            dtype = DTYPES.get(v.id)
            if dtype is None or dtype in members:
                guess = did_you_mean(v.id, DTYPES) if dtype is None else None
                diags.append(make("AK3025", f"`{v.id}` is not a dtype" if dtype is None else
                                  f"`{v.id}` is listed twice in the set of `{name}`", v.span,
                                  hint=(f"did you mean `{guess}`?" if guess else "dtypes are " + ", ".join(DTYPES))
                                  if dtype is None else "list each dtype once", replacement=guess))
                ok = False
                continue
            members.append(dtype)
        binder = next(((k, p) for k, p in enumerate(node.params) if p.type.dims is not None and p.type.dtype == name),
                      None)
        if binder is None:
            diags.append(make("AK3026", f"no tensor parameter has dtype `{name}`, so a call cannot bind it", span,
                              hint=f"give a tensor parameter the type `{name}[...]`, or drop the variable"))
            ok = False
        if members:  # kept after an error too: the header is then checked with the first member written in
            found.append(DtypeVar(name, tuple(members), c.span, *((binder[1].name, binder[0]) if binder else ("", -1))))
    count = 1
    for var in found:
        count *= len(var.members)
    if count > MAX_SPECIALISATIONS:
        diags.append(make("AK3025", f"kernel `{node.name}` has {count} dtype combinations, more than "
                          f"{MAX_SPECIALISATIONS}", node.name_span,
                          hint="each combination is checked and compiled: use fewer or smaller sets"))
        ok = False
    return tuple(found), ok


def specialise(node: ast.Kernel, mapping: dict[str, str]) -> ast.Kernel:
    """The kernel with each variable's dtype written in and its dtype clauses dropped."""
    dims = _param_dims(node)
    where = tuple(c for c in node.where if not is_dtype_clause(c, dims))
    return dataclasses.replace(_subst(node, mapping), where=tuple(_subst(c, mapping) for c in where))


def _subst(x: Any, mapping: dict[str, str]) -> Any:
    """Rewrite dtype names in types and conversions (``W[N]`` → ``bf16[N]``, ``W(e)`` → ``bf16(e)``)."""
    if isinstance(x, tuple):
        items = tuple(_subst(v, mapping) for v in x)
        return x if all(a is b for a, b in zip(items, x)) else items
    if not dataclasses.is_dataclass(x) or isinstance(x, Span | type):
        return x
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(x):
        if f.name == "where" and isinstance(x, ast.Kernel):
            continue
        v = getattr(x, f.name)
        renamed = (f.name == "dtype" and isinstance(x, ast.TypeExpr)) or (f.name == "func" and isinstance(x, ast.Call))
        if renamed and v in mapping:
            changes[f.name] = mapping[v]
        elif isinstance(v, tuple) or dataclasses.is_dataclass(v):
            new = _subst(v, mapping)
            if new is not v:
                changes[f.name] = new
    return dataclasses.replace(x, **changes) if changes else x


def combinations(vars: tuple[DtypeVar, ...]) -> list[tuple[DType, ...]]:
    return list(itertools.product(*(v.members for v in vars)))


def when(vars: tuple[DtypeVar, ...], combo: tuple[DType, ...]) -> str:
    return ", ".join(f"{v.name} = {d}" for v, d in zip(vars, combo))


def merge(vars: tuple[DtypeVar, ...], per_member: dict[tuple[DType, ...], list[Diagnostic]]) -> list[Diagnostic]:
    """One list from each member's diagnostics: those every member reports once, the others each
    with the members that report it (``… (when W = i8)``)."""
    lists = list(per_member.values())
    if len(lists) == 1:
        return lists[0]
    common = set(lists[0]).intersection(*map(set, lists[1:]))
    out: list[Diagnostic] = [d for d in lists[0] if d in common]
    where: dict[Diagnostic, list[tuple[DType, ...]]] = {}
    for combo, found in per_member.items():
        for d in found:
            if d not in common:
                where.setdefault(d, []).append(combo)
    for d, combos in where.items():
        said = " or ".join(when(vars, c) for c in combos)
        out.append(dataclasses.replace(d, message=f"{d.message} (when {said})"))
    return out


def arg_binds(func: str, var: DtypeVar, dtype: DType, span: Span, callee_span: Span) -> Diagnostic | None:
    """AK3027 when an argument binds ``var`` to a dtype outside its set (None when it is in it)."""
    if dtype in var.members:
        return None
    members = ", ".join(str(m) for m in var.members)
    return make("AK3027", f"`{var.param}` of `{func}` binds `{var.name}` to {dtype}, which is not in "
                f"{{{members}}}", span, related=[Related(callee_span, f"`{func}` is defined here")],
                hint=f"convert the argument to one of {members}")


@dataclass(frozen=True)
class Dispatch:
    """How a call of a generic kernel picks its specialisation (what the runtime needs, no AST):
    each variable with its binding parameter and set, and the IR name of each combination."""

    name: str  # the kernel's IR name (its specialisations' names start with it)
    vars: tuple[tuple[str, str, int, tuple[DType, ...]], ...]  # (variable, parameter, its position, set)
    members: tuple[tuple[tuple[DType, ...], str], ...]  # combination -> IR function name

    def member(self, combo: tuple[DType, ...]) -> str | None:
        return next((n for c, n in self.members if c == combo), None)

    def constraint(self) -> str:
        """The `where` clauses as written: ``W in {f32, bf16, f16}``."""
        return ", ".join(f"{v} in {{{', '.join(str(d) for d in ds)}}}" for v, _, _, ds in self.vars)


def dispatch(generic: Generic, ir_name: str) -> Dispatch:
    return Dispatch(ir_name, tuple((v.name, v.param, v.index, v.members) for v in generic.vars),
                    tuple((c, m.ir_name) for c, m in generic.members.items()))


def by_names(generics: dict[str, Dispatch], name: str, dtypes: dict[str, Any]) -> str:
    """The IR name of the specialisation of generic kernel ``name`` for ``dtypes`` (variable -> a dtype's
    spelling or :class:`DType`); a ValueError says what is missing or outside a set."""
    g = generics.get(name)
    if g is None:
        raise ValueError(f"kernel `{name}` is not generic: it has no dtype variables")
    unknown = sorted(set(dtypes) - {v for v, _, _, _ in g.vars})
    if unknown:
        raise ValueError(f"kernel `{name}` has no dtype variable {', '.join(map(repr, unknown))}; it has "
                         + ", ".join(v for v, _, _, _ in g.vars))
    combo = []
    for v, _, _, members in g.vars:
        if v not in dtypes:
            raise ValueError(f"kernel `{name}` needs a dtype for `{v}` ({g.constraint()})")
        d = DTYPES.get(str(dtypes[v]))
        if d not in members:
            raise ValueError(f"`{v}` of kernel `{name}` is one of {{{', '.join(map(str, members))}}}, "
                             f"not {dtypes[v]!r}")
        combo.append(d)
    found = g.member(tuple(combo))
    assert found is not None
    return found


def per_specialisation(strategies: tuple[Strategy, ...], generics: dict[str, Dispatch]) -> tuple[Strategy, ...]:
    """A strategy of a generic kernel applies to each specialisation: one copy per member, in its place
    (an imported module's strategies are already expanded: they name no generic kernel)."""
    out: list[Strategy] = []
    for s in strategies:
        g = generics.get(s.kernel)
        out.extend([s] if g is None else (dataclasses.replace(s, kernel=name) for _, name in g.members))
    return tuple(out)
