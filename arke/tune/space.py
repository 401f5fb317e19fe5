"""The search space of ``akc tune``: every decision a target honours for each dispatch of a kernel at
given dims (the Target protocol's ``decisions_for`` and ``tune_values``), as knobs; a point of the
space is a :class:`~arke.ir.strategy.Strategy`, checked before anything is compiled.

A knob is one decision on one subject (``tile m``, ``parallel n``, ``pack b``, ``threads``,
``algorithm``): its values come from the target, narrowed to what its code distinguishes, plus
"unset" (the target's default). Decisions that several dispatches of a kernel take are one knob
(a strategy names indices, not dispatches). :func:`prune` refuses a point the checker or the
target would not honour as written (an error, a dropped decision: AK4014's reasons), so the search
never measures a strategy that means something else than it says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from arke.ir import strategy as sir

#: The value of a knob left to the target's default.
UNSET = "default"
#: The value of a knob whose decision takes no value (``pack b``) when it is set.
ON = "on"


@dataclass(frozen=True)
class Knob:
    """One decision on one subject and the values the search tries (``UNSET`` among them)."""

    decision: str
    subject: str | None
    values: tuple[int | str, ...]

    @property
    def key(self) -> str:
        """``"tile m"``, ``"threads"``: the knob's name in reports and in the search's parameters."""
        return self.decision if self.subject is None else f"{self.decision} {self.subject}"


def knobs(module: Any, ir_name: str, target: str, dims: Mapping[str, int], arch: str | None = None) -> list[Knob]:
    """The knobs of ``ir_name`` (a kernel of ``module``, a checked :class:`arke.api.Module`) on ``target``
    at ``dims``: one per (decision, subject) some dispatch of its default plan takes, in a fixed order."""
    from arke.targets import base as targets

    t = targets.get(target)
    plan = t.plan(module.semantic, ir_name, None, arch)
    found: dict[tuple[str, str | None], set[int | str]] = {}
    for d in plan.dispatches:
        roles = t.subject_roles(d)
        for decision in sorted(t.decisions_for(d, arch)):
            spec = sir.DECISIONS[decision]
            if spec.subject == "none":
                subjects: Sequence[str | None] = [None]
            else:
                subjects = sorted(roles.get("index" if spec.subject == "index" else "operand", ()))
            for subject in subjects:
                taken = t.tune_values(decision, d, dims, subject, arch)
                if spec.values == "none" and taken:  # a decision without a value: on (or left unset)
                    taken = (ON,)
                if taken:
                    found.setdefault((decision, subject), set()).update(taken)
    out = []
    for (decision, subject), seen in sorted(found.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        ordered = sorted(seen, key=lambda v: (isinstance(v, str), str(v).zfill(12)))
        out.append(Knob(decision, subject, (UNSET, *ordered)))
    return out


def strategy_of(kernel: str, target: str, point: Mapping[str, int | str], space: Sequence[Knob]) -> sir.Strategy:
    """The strategy a point (knob key -> value) stands for: every knob not left ``UNSET``."""
    decisions = []
    for knob in space:
        value = point.get(knob.key, UNSET)
        if value == UNSET:
            continue
        spec = sir.DECISIONS[knob.decision]
        decisions.append(sir.Decision(knob.decision, knob.subject, None if spec.values == "none" else value))
    return sir.Strategy(kernel, target, None, tuple(decisions))


def prune(module: Any, ir_name: str, strategy: sir.Strategy, dims: Mapping[str, int],
          arch: str | None = None) -> str | None:
    """None when every decision of ``strategy`` is honoured as written by some dispatch of the kernel's plan
    under it (the checker's and the target's rules, AK4014's reasons); else why the point is pruned."""
    from arke.targets import base as targets
    from arke.targets.downgrades import unhonoured, words

    if not strategy.decisions:
        return None
    t = targets.get(strategy.target or "llvm")
    try:
        plan = t.plan(module.semantic, ir_name, strategy, arch)
        dropped = unhonoured(t, module.semantic, ir_name, strategy, arch, plan=plan)
    except Exception as err:  # a plan the strategy makes impossible: pruned, with the planner's words
        return f"{type(err).__name__}: {err}"
    return "; ".join(f"`{words(d.decision)}`: {d.reason}" for d in dropped) if dropped else None


def space_size(space: Sequence[Knob]) -> int:
    """The number of points (the product of the knobs' value counts)."""
    size = 1
    for knob in space:
        size *= len(knob.values)
    return size


def legal_decision(d: sir.Decision, module: Any, kernel: str) -> str | None:
    """Why ``d`` could not have been written in a strategy for ``kernel`` (of the semantic ``module``): an unknown
    kind, a subject the kind does not take or the kernel does not have, a value outside the kind's rule; None
    when it could. For records read back from a tuning database, which may be damaged or foreign."""
    spec = sir.DECISIONS.get(d.kind)
    if spec is None:
        return f"unknown decision `{d.kind}`"
    if (spec.subject == "none") != (d.subject is None):
        return f"`{d.kind}` {'takes no' if spec.subject == 'none' else 'needs a'} subject"
    if spec.subject == "index" and d.subject is not None:
        fn = module.get(kernel) if hasattr(module, "get") else None
        indices = {a.name for op in getattr(fn, "ops", ()) for a in (*getattr(op, "axes", ()),
                                                                     *getattr(op, "reduce_axes", ()))}
        if indices and d.subject not in indices:
            return f"`{d.kind} {d.subject}`: the kernel has no index `{d.subject}`"
    v = d.value
    if v is None:
        return None if spec.values == "none" or not spec.value_required else f"`{d.kind}` needs a value"
    if spec.values == "none":
        return f"`{d.kind}` takes no value"
    if spec.values == "enum":
        return None if v in spec.choices else f"`{d.kind} = {v!r}` is not one of {', '.join(spec.choices)}"
    if isinstance(v, bool) or not isinstance(v, int):
        return f"`{d.kind}` takes a whole number, not {v!r}"
    low = 2 if spec.values == "split" else 1
    if v < low or v >= 2**63 or (spec.maximum is not None and v > spec.maximum) or (spec.values == "pow2"
                                                                                   and v & (v - 1)):
        return f"`{d.kind} = {v}` is out of its range"
    return None
