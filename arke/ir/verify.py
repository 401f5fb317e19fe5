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

:func:`verify_strategies` (``strategy_problems``) does the same for a StrategySet. The
checks themselves live next to this module: ``verify_function`` (one function),
``verify_nodes`` (one dim, condition, literal or scalar node) and ``verify_decisions``
(one strategy decision).
"""

from __future__ import annotations

from collections.abc import Iterable

from arke.ir import semantic as S
from arke.ir.strategy import StrategySet
from arke.ir.verify_decisions import _decision_problems
from arke.ir.verify_function import _FunctionCheck
from arke.ir.verify_nodes import _cond_problems


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
