"""IR expressions written back as the `.ak` source they came from, for run-time messages.

A run-time error (a gather subscript out of range, an integer division by zero) names what the
user wrote: ``table[ids[t] + 1, d]``, not an SSA value. The IR keeps each tensor's source name
(parameters, and the ops of named tensors); values without one (a kernel's result, the pieces
of an expression) are described in words (:func:`op_description`).
"""

from __future__ import annotations

from collections.abc import Mapping

from arke.ir import semantic as S
from arke.ir.shapes import dim_str

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%", "pow": "**",
          "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "and": "and", "or": "or"}
_PREFIX = {"neg": "-", "not": "not "}


def source_form(e: S.SExpr, names: Mapping[str, str]) -> str:
    """``e`` as `.ak` text; ``names`` maps SSA values to their source names (a value without one
    shows as ``…``)."""
    if isinstance(e, S.Idx):
        return e.name
    if isinstance(e, S.Const):
        return str(e.value).lower() if isinstance(e.value, bool) else repr(e.value)
    if isinstance(e, S.DimRef):
        return dim_str(e.dim)
    if isinstance(e, S.Load):
        head = names.get(e.src, "…")
        return head + ("[" + ", ".join(source_form(i, names) for i in e.indices) + "]" if e.indices else "")
    if isinstance(e, S.Cast):
        return f"{e.dtype}({source_form(e.x, names)})"
    if isinstance(e, S.Unary):
        inner = _operand(e.x, names)
        return _PREFIX[e.op] + inner if e.op in _PREFIX else f"{e.op}({source_form(e.x, names)})"
    if isinstance(e, S.Binary):
        if e.op in _INFIX:
            return f"{_operand(e.a, names)} {_INFIX[e.op]} {_operand(e.b, names)}"
        return f"{e.op}({source_form(e.a, names)}, {source_form(e.b, names)})"
    if isinstance(e, S.Select):
        return f"{_operand(e.a, names)} if {_operand(e.cond, names)} else {_operand(e.b, names)}"
    return "…"


def _operand(e: S.SExpr, names: Mapping[str, str]) -> str:
    text = source_form(e, names)
    return f"({text})" if isinstance(e, S.Binary | S.Select) else text


def op_description(op: S.Op, fn: S.Function) -> str:
    """What an op computes, in the user's terms: `` `e` `` (a named tensor), ``the result of `f` ``
    (a kernel's return value), else ``an intermediate value of `f` ``."""
    results = op.results if isinstance(op, S.CallOp) else (op.result,)
    if op.name:
        return f"`{op.name}`"
    if any(r in fn.results for r in results):
        if len(fn.results) == 1:
            return f"the result of `{fn.name}`"
        k = next(fn.results.index(r) for r in results if r in fn.results)
        return f"result {k} of `{fn.name}`"
    return f"an intermediate value of `{fn.name}`"
