"""StrategyIR: what is wrong with one decision (its kind, value, subject, and the target it is for).

The decision vocabulary (``arke.ir.strategy.DECISIONS``) says what each kind takes; the
targets' registry says which targets honour it and which values they can lower; with the
kernel at hand, a subject must name one of its tensor parameters or indices.
"""

from __future__ import annotations

from arke.ir import semantic as S
from arke.ir.strategy import DECISIONS, Decision, DecisionSpec


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
    reduced |= {op.axis for op in kernel.ops if isinstance(op, S.ScanOp)}  # a scan reduces each prefix
    if d.subject not in free | reduced:
        known = ", ".join(sorted(free | reduced)) or "none"
        return [f"`{d.kind} {d.subject}`: @{kernel.name} has no index `{d.subject}` (indices: {known})"]
    if d.kind == "parallel" and d.subject not in free:
        return [f"`parallel {d.subject}`: `{d.subject}` is only ever reduced, and running a reduction in "
                f"parallel would change its order; use `split {d.subject} = n`"]
    if d.kind == "split" and d.subject not in reduced:
        return [f"`split {d.subject}`: `{d.subject}` is never reduced; split applies to a reduced index"]
    return []
