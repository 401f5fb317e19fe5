"""The canonical text form of SemanticIR and StrategyIR: print it here, read it back with
:func:`read_module` / :func:`read_strategies` (``arke/ir/text_read.py``).

``read_module(print_module(m)) == m`` holds for every module (and likewise for strategy
sets): dims print with :func:`arke.ir.shapes.dim_str` and read back with ``parse_dim``,
floats print with ``repr`` so they come back bit for bit, and every SExpr's dtype is either
implied by its form (:func:`implied_dtype`) or written after it (``1.0 : f16``).

A module looks like this (``spec/ir.md`` is the full specification)::

    arke.semantic 1

    kernel @rmsnorm(%x: f32[M, N], %w: f32[N], %eps: f32 = 1e-06) -> (f32[M, N] as "y")
      dims M = %x.0, N = %x.1
    {
      %0 = reduce.sum f32 [m < M] over [n < N] { mul(%x[m, n], %x[m, n]) } name "ss"
      %1 = map f32 [m < M, n < N] { mul(mul(%x[m, n], rsqrt(add(div(%0[m], f32(dim(N))), %eps[]))), %w[n]) }
      return %1
    }
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping

from arke.ir import semantic as S
from arke.ir.dtypes import DType
from arke.ir.shapes import dim_str
from arke.ir.strategy import Decision, Strategy, StrategySet

SEMANTIC_FORMAT = "arke.semantic"
STRATEGY_FORMAT = "arke.strategy"
#: Version of the StrategyIR text and JSON forms (SemanticIR's is ``semantic.FORMAT_VERSION``).
STRATEGY_VERSION = 1

#: Words that a bare name may not be (in some position they read as a literal or keyword);
#: such names, and names that are not identifiers, print as JSON strings: ``"inf"``.
RESERVED = frozenset({"true", "false", "inf", "nan", "dim", "not", "and", "or", "in", "as", "call", "contract",
                      "dims", "kernel", "map", "name", "over", "reduce", "return", "strategy", "target", "when",
                      "scan", "along", "exclusive", "specialise", "limits",
                      "where", "_"})  # every word of arke/grammar/ir.lark

_IDENT = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_TOKEN = re.compile(r"[A-Za-z_0-9]+")


# ---------------------------------------------------------------- names and literals


def quote(text: str) -> str:
    """A JSON string literal (what the reader's STRING token accepts)."""
    return json.dumps(text, ensure_ascii=False)


def name_text(name: str) -> str:
    """A bare identifier, or a JSON string when the name is not one or is reserved."""
    return name if _IDENT.fullmatch(name) and name not in RESERVED else quote(name)


def value_text(name: str) -> str:
    """``%x`` / ``%0``; a name with other characters is ``%"…"``."""
    return "%" + (name if _TOKEN.fullmatch(name) else quote(name))


def func_text(name: str) -> str:
    """``@rmsnorm``; a name with other characters is ``@"…"``."""
    return "@" + (name if _TOKEN.fullmatch(name) else quote(name))


def literal_text(value: float | int | bool) -> str:
    """``true``, ``3``, ``1e-06``, ``inf``, ``-inf``, ``nan``: the Python type shows in the spelling."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "nan"
    return repr(value)  # 'inf', '-inf', '1.0', '1e-06': exact, and distinct from ints


# ---------------------------------------------------------------- types, dims, conditions


def type_text(t: S.TensorType) -> str:
    """``f32[M, N]``; a scalar (rank 0) is just ``f32``."""
    if not t.shape:
        return str(t.dtype)
    return f"{t.dtype}[{', '.join(dim_str(d) for d in t.shape)}]"


def axes_text(axes: Iterable[S.Axis]) -> str:
    """``[m < M, n < N]``."""
    return "[" + ", ".join(f"{name_text(a.name)} < {dim_str(a.extent)}" for a in axes) + "]"


def cond_text(c: S.Cond) -> str:
    """``H % G == 0``, ``D in {64, 128}``, ``a and (b or c)``, ``not a``; odd arities as ``and(a)``."""
    if isinstance(c, S.Rel):
        return f"{dim_str(c.lhs)} {c.op} {dim_str(c.rhs)}"
    if isinstance(c, S.InSet):
        return f"{dim_str(c.x)} in {{{', '.join(dim_str(v) for v in c.values)}}}"
    if c.op == "not" and len(c.parts) == 1:
        return f"not {_cond_part(c.parts[0])}"
    if c.op in ("and", "or") and len(c.parts) >= 2:
        return f" {c.op} ".join(_cond_part(p) for p in c.parts)
    if c.op in ("and", "or"):
        return f"{c.op}({', '.join(cond_text(p) for p in c.parts)})"
    raise ValueError(f"cannot print condition {c!r}: a BoolOp is 'and', 'or', or 'not' of one part")


def _cond_part(c: S.Cond) -> str:
    # A nested infix and/or keeps its own node: parentheses mark where it starts and ends.
    text = cond_text(c)
    return f"({text})" if isinstance(c, S.BoolOp) and c.op in ("and", "or") and len(c.parts) >= 2 else text


# ---------------------------------------------------------------- scalar expressions


def implied_dtype(e: S.SExpr, known: Mapping[str, DType]) -> DType | None:
    """The dtype an SExpr's text implies, so that it need not be written.

    Literals: ``true``/``false`` bool, integers i64, floats f32. ``Idx`` and ``DimRef``: i64.
    A load: its source's dtype when ``known`` (the values defined before the op) has it.
    Unary ops: the operand's dtype. Comparisons, ``and``, ``or``: bool. Other binary ops:
    the first operand's. ``select``: the first branch's. A cast names its dtype. ``None``
    means nothing is implied and the dtype is always written.
    """
    if isinstance(e, S.Const):
        return DType.BOOL if isinstance(e.value, bool) else DType.I64 if isinstance(e.value, int) else DType.F32
    if isinstance(e, (S.Idx, S.DimRef)):
        return DType.I64
    if isinstance(e, S.Load):
        return known.get(e.src)
    if isinstance(e, S.Unary):
        return e.x.dtype
    if isinstance(e, S.Binary):
        return DType.BOOL if e.op in S.COMPARISONS or e.op in ("and", "or") else e.a.dtype
    if isinstance(e, S.Select):
        return e.a.dtype
    return e.dtype  # Cast


def sexpr_text(e: S.SExpr, known: Mapping[str, DType] | None = None) -> str:
    """One scalar expression: ``mul(%x[m, n], 2.0)``, ``f32(dim(N))``, ``%ids[t] : i32``."""
    known = known or {}
    if isinstance(e, S.Const):
        core = literal_text(e.value)
    elif isinstance(e, S.Idx):
        core = name_text(e.name)
    elif isinstance(e, S.DimRef):
        core = f"dim({dim_str(e.dim)})"
    elif isinstance(e, S.Load):
        core = f"{value_text(e.src)}[{', '.join(sexpr_text(i, known) for i in e.indices)}]"
    elif isinstance(e, S.Unary):
        core = f"{e.op}({sexpr_text(e.x, known)})"
    elif isinstance(e, S.Binary):
        core = f"{e.op}({sexpr_text(e.a, known)}, {sexpr_text(e.b, known)})"
    elif isinstance(e, S.Select):
        core = f"select({sexpr_text(e.cond, known)}, {sexpr_text(e.a, known)}, {sexpr_text(e.b, known)})"
    elif isinstance(e, S.Cast):
        return f"{e.dtype}({sexpr_text(e.x, known)})"
    else:
        raise TypeError(f"not an SExpr: {e!r}")
    return core if implied_dtype(e, known) == e.dtype else f"{core} : {e.dtype}"


# ---------------------------------------------------------------- ops and functions


def limits_text(op: S.ReduceOp, known: Mapping[str, DType]) -> str:
    """`` limits {j = %lens[b]}`` for a reduction bounded by lengths (empty without)."""
    if not op.limits:
        return ""
    return " limits {" + ", ".join(f"{name_text(k)} = {sexpr_text(e, known)}" for k, e in op.limits) + "}"


def op_text(op: S.Op, known: Mapping[str, DType] | None = None) -> str:
    """One op on one line, e.g. ``%0 = reduce.sum f32 [m < M] over [n < N] { … } name "ss"``."""
    known = known or {}
    if isinstance(op, S.MapOp):
        text = f"{value_text(op.result)} = map {op.dtype} {axes_text(op.axes)} {{ {sexpr_text(op.body, known)} }}"
    elif isinstance(op, S.ReduceOp):
        text = (f"{value_text(op.result)} = reduce.{name_text(op.kind)} {op.dtype} {axes_text(op.axes)}"
                f" over {axes_text(op.reduce_axes)}{limits_text(op, known)} {{ {sexpr_text(op.body, known)} }}")
    elif isinstance(op, S.ContractOp):
        text = (f"{value_text(op.result)} = contract {op.dtype} {axes_text(op.axes)} over {axes_text(op.reduce_axes)}"
                f" {{ {sexpr_text(op.lhs, known)}, {sexpr_text(op.rhs, known)} }}")
    elif isinstance(op, S.ScanOp):
        exprs = ", ".join(sexpr_text(e, known) for e in op.exprs)
        text = (f"{value_text(op.result)} = scan.{name_text(op.kind)} {op.dtype} {axes_text(op.axes)}"
                f" along {name_text(op.axis)}{' exclusive' if op.exclusive else ''} {{ {exprs} }}")
    elif isinstance(op, S.CallOp):
        results = ", ".join(value_text(r) for r in op.results)
        args = ", ".join(value_text(a) for a in op.args)
        types = ", ".join(type_text(t) for t in op.types)
        dims = ", ".join(f"{name_text(k)} = {dim_str(v)}" for k, v in op.dims)
        text = f"{results + ' = ' if results else ''}call {func_text(op.callee)}({args}) : ({types})"
        text += f" dims {{{dims}}}" if op.dims else ""
    else:
        raise TypeError(f"not an op: {op!r}")
    return text + (f" name {quote(op.name)}" if op.name is not None else "")


def print_function(f: S.Function) -> str:
    """One kernel: header (params, outputs, dim bindings, guards), then its ops and ``return``."""
    params = ", ".join(_param_text(p) for p in f.params)
    lines = [f"kernel {func_text(f.name)}({params}) -> ({_outputs_text(f)})"]
    if f.bindings:
        lines.append("  dims " + ", ".join(f"{name_text(b.dim)} = {value_text(b.param)}"
                                           + (f".{b.axis}" if b.axis >= 0 else "") for b in f.bindings))
    if f.specialisation:
        lines.append("  specialise " + ", ".join(f"{name_text(v)} = {d}" for v, d in f.specialisation))
    for g in f.guards:
        cond = cond_text(g.cond)
        lines.append(f"  where {cond}" + ("" if g.text == cond else f" as {quote(g.text)}"))
    lines.append("{")
    known: dict[str, DType] = {p.name: p.type.dtype for p in f.params}
    for op in f.ops:
        lines.append("  " + op_text(op, known))
        known.update((name, t.dtype) for name, t in S.op_results(op))
    lines.append("  return" + ("" if not f.results else " " + ", ".join(value_text(r) for r in f.results)))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _param_text(p: S.Param) -> str:
    default = "" if p.default is None else f" = {literal_text(p.default)}"
    return f"{value_text(p.name)}: {type_text(p.type)}{default}"


def _outputs_text(f: S.Function) -> str:
    # Output names: none at all when ``output_names == ()``; otherwise one per result type,
    # ``as "y"`` for a name and ``as _`` for an anonymous output.
    if f.output_names and len(f.output_names) != len(f.result_types):
        raise ValueError(f"cannot print @{f.name}: {len(f.output_names)} output names "
                         f"for {len(f.result_types)} results")
    names = f.output_names or (None,) * len(f.result_types)
    labels = ["" if not f.output_names else " as _" if n is None else f" as {quote(n)}" for n in names]
    return ", ".join(type_text(t) + label for t, label in zip(f.result_types, labels))


def print_module(m: S.Module) -> str:
    """The whole module: the ``arke.semantic <version>`` header, then each kernel."""
    return "\n".join([f"{SEMANTIC_FORMAT} {m.version}\n", *(print_function(f) for f in m.functions)])


# ---------------------------------------------------------------- strategies


def decision_text(d: Decision) -> str:
    """``tile i = 128;``, ``warps = 8;``, ``pack w;``, ``algorithm = flash;``."""
    text = name_text(d.kind) + ("" if d.subject is None else f" {name_text(d.subject)}")
    if d.value is not None:
        text += f" = {d.value if isinstance(d.value, int) else name_text(d.value)}"
    return text + ";"


def print_strategy(s: Strategy) -> str:
    """``strategy @k target triton when S == 1 { … }``, one decision a line."""
    head = f"strategy {func_text(s.kernel)}"
    head += "" if s.target is None else f" target {name_text(s.target)}"
    head += "" if s.when is None else f" when {cond_text(s.when)}"
    body = "".join(f"  {decision_text(d)}\n" for d in s.decisions)
    return f"{head} {{\n{body}}}\n"


def print_strategies(s: StrategySet) -> str:
    """All strategies, after the ``arke.strategy <version>`` header."""
    return "\n".join([f"{STRATEGY_FORMAT} {STRATEGY_VERSION}\n", *(print_strategy(x) for x in s.strategies)])


# ---------------------------------------------------------------- reading (text_read.py)


def read_module(text: str) -> S.Module:
    """Read the text :func:`print_module` prints; raises :class:`~arke.ir.text_read.IRSyntaxError`."""
    from arke.ir.text_read import read_module as read  # the Lark parser loads on first use, not on import

    return read(text)


def read_strategies(text: str) -> StrategySet:
    """Read the text :func:`print_strategies` prints; raises :class:`~arke.ir.text_read.IRSyntaxError`."""
    from arke.ir.text_read import read_strategies as read

    return read(text)
