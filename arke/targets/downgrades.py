"""Visible downgrades: which decisions of a strategy each dispatch of a kernel's plan applies on a target,
which it drops, and why.

A decision that no dispatch of the kernel honours on the target is the warning AK4014 ("an
unhonoured request is visible, never a silent downgrade"), at the decision:

* ``akc check`` reports it when the plan alone shows it (:func:`check_time`): for a strategy with
  a target, on that target's default flavour; for a strategy without one, when no target takes it;
* ``arke.build`` warns (:class:`StrategyDowngradeWarning`, a Python warning carrying the code) when it
  compiles a strategy variant, once per (kernel, strategy, decision), and ``akc build`` prints what
  the check could not know (the target of a strategy for every target, the GPU flavour of ``llvm``);
* ``akc build --explain`` prints every dispatch with what it applies and drops (:func:`explain`).

Plans are pure (``arke.plan``, ``arke.passes``: Python and sympy) and the tables are the targets'
(``Target.takes``, :mod:`arke.targets.space`), so nothing here imports torch or a compiler. The
answer is structural: a form the dims choose at run time (a matrix-vector product for a few rows)
counts as taking what its dispatch takes, so what is reported holds for every dims.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from arke.ir import strategy as sir
from arke.plan.variants import strategy_variants
from arke.targets import base as targets
from arke.targets.space import RUNS_AS, SINGLE, dispatch_family, roles_words

if TYPE_CHECKING:
    from arke.ir import semantic as ir
    from arke.plan.dispatch import Dispatch, KernelPlan, PlanOp

#: the diagnostic code of a decision no dispatch honours
CODE = "AK4014"
_NO_CORE = "the kernel has no attention core (scores, a row softmax and the value contraction) for it to lower"


class StrategyDowngradeWarning(UserWarning):
    """``arke.build``'s AK4014: a strategy decision that no dispatch of its kernel honours on the target.

    ``code`` is ``"AK4014"``; ``downgrade`` says which kernel, decision and target, and why."""

    code = CODE

    def __init__(self, downgrade: Downgrade | str):
        # a str: the warning rebuilt from its message (pickling, pytest-xdist's workers), or a target's own note
        # (the MLIR schedule's AK4013): no downgrade; the code is the message's first word
        text = downgrade if isinstance(downgrade, str) else f"{CODE}: {downgrade.message()} (hint: {downgrade.hint})"
        super().__init__(text)
        self.downgrade = downgrade if not isinstance(downgrade, str) else None
        if isinstance(downgrade, str) and downgrade.startswith("AK") and ":" in downgrade:
            self.code = downgrade.split(":", 1)[0]


@dataclass(frozen=True)
class DispatchReport:
    """One dispatch of a plan: its index, family (:func:`~arke.targets.space.dispatch_family`), the
    strategy's decisions it applies, and those it drops with the reason."""

    index: int
    dispatch: Dispatch
    family: str
    applied: tuple[sir.Decision, ...]
    dropped: tuple[tuple[sir.Decision, str], ...]


@dataclass(frozen=True)
class Downgrade:
    """A decision of ``kernel``'s strategy that no dispatch honours on ``target`` (None: on any target)."""

    kernel: str
    decision: sir.Decision
    target: str | None
    reason: str
    hint: str

    def message(self) -> str:
        where = f"target `{self.target}`" if self.target is not None else "any target"
        if RUNS_AS in self.reason:  # taken, but not as written (a register block's limit, a GPU block)
            return f"`{words(self.decision)}` does not run as written for kernel `{self.kernel}` on {where}: " \
                   f"{self.reason}"
        return f"`{words(self.decision)}` has no effect on kernel `{self.kernel}` on {where}: {self.reason}"


def words(d: sir.Decision) -> str:
    """``tile m = 4``, ``pack w``, ``algorithm = flash``, ``parallel m``."""
    text = d.kind + ("" if d.subject is None else f" {d.subject}")
    return text + ("" if d.value is None else f" = {d.value}")


def op_label(op: PlanOp) -> str:
    """An op as ``--explain`` names it: its tensor's name, else its IR value (``%3``)."""
    return op.name or f"%{op.result}"


def plan_of(target: targets.Target, module: ir.Module, ir_name: str, strategy: sir.Strategy | None,
            arch: str | None = None) -> KernelPlan:
    """The kernel's plan as ``target`` (for ``arch``) groups it (the families its renderer renders)."""
    return target.plan(module, ir_name, strategy, arch)


def _has_core(module: ir.Module, ir_name: str, strategy: sir.Strategy | None, plan: KernelPlan) -> bool:
    if any(d.family == "attention" and d.pattern is not None for d in plan.dispatches):
        return True
    return any(d.family == "attention" for d in plan_of_families(module, ir_name, strategy, {"attention"}).dispatches)


def plan_of_families(module: ir.Module, ir_name: str, strategy: sir.Strategy | None,
                     families: Iterable[str]) -> KernelPlan:
    """The kernel's plan grouped into ``families`` (whatever a target renders)."""
    from arke.plan.dispatch import make_plan

    return make_plan(module, ir_name, strategy, frozenset(families))


def dispatch_reports(target: targets.Target, module: ir.Module, ir_name: str, strategy: sir.Strategy | None,
                     arch: str | None = None,
                     plan: KernelPlan | None = None) -> tuple[KernelPlan, list[DispatchReport]]:
    """The kernel's plan on ``target`` (``plan``, when it was made already) and, per dispatch, the
    strategy's decisions applied and dropped."""
    plan = plan or plan_of(target, module, ir_name, strategy, arch)
    decisions = strategy.decisions if strategy is not None else ()
    # `algorithm` lowers an attention core: without one it means nothing, whatever a target's
    # dispatches are (the mlir target groups no families, so ask the attention matcher itself)
    no_core = any(d.kind == "algorithm" for d in decisions) and not _has_core(module, ir_name, strategy, plan)
    reports = []
    for k, dispatch in enumerate(plan.dispatches):
        applied, dropped = [], []
        for dec in decisions:
            why = _NO_CORE if dec.kind == "algorithm" and no_core else target.honoured(dec, dispatch, decisions, arch)
            if why is None:
                applied.append(dec)
            else:
                dropped.append((dec, why))
        reports.append(DispatchReport(k, dispatch, dispatch_family(dispatch), tuple(applied), tuple(dropped)))
    return plan, reports


def _relevant(dec: sir.Decision, report: DispatchReport, target: targets.Target) -> bool:
    """Whether the dispatch has the decision's subject (an index decision on `i` is about the dispatches with `i`)."""
    spec = sir.DECISIONS[dec.kind]
    if spec.subject == "none" or dec.subject is None:
        return True
    roles = target.subject_roles(report.dispatch)
    return dec.subject in roles.get("index" if spec.subject == "index" else "operand", ())


def _reason(dec: sir.Decision, reports: Sequence[DispatchReport], target: targets.Target,
            arch: str | None = None) -> str:
    """Why no dispatch applies ``dec``, in one sentence."""
    relevant = [(r, why) for r in reports for d, why in r.dropped if d == dec and _relevant(dec, r, target)]
    if not relevant and not reports:
        return "its plan has no dispatch: no loop runs"
    if not relevant and dec.subject is None:
        return "no dispatch of its plan takes it"
    if not relevant:
        what = "index" if sir.DECISIONS[dec.kind].subject == "index" else "tensor"
        verb = "loops over" if what == "index" else "reads"
        return f"no dispatch of its plan {verb} the {what} `{dec.subject}`"
    reasons = list(dict.fromkeys(why for _, why in relevant))
    if len(reasons) == 1:
        return reasons[0]
    if all(dec.kind not in target.decisions_for(r.dispatch, arch) for r, _ in relevant):
        families = ", ".join(dict.fromkeys(r.family for r, _ in relevant))
        return f"none of its dispatches ({families}) takes `{dec.kind}` on `{target.name}`"
    return "; ".join(f"dispatch {r.index} ({r.family}): {why}" for r, why in relevant)


def where_taken(target: targets.Target, kind: str, arch: str | None = None) -> str:
    """Which dispatches of ``target`` take decisions of ``kind`` (and on what), for a hint."""
    if kind == "algorithm":
        found = [t for t in target.takes_for(arch).values() if kind in t]
        values = found[0][kind].values if found and found[0][kind].values else None
        taken = " (" + " or ".join(f"`{kind} = {v}`" for v in values) + ")" if values else ""
        return f"`algorithm` chooses how an attention core is lowered{taken}" if found else \
            f"`{target.name}` takes no `algorithm` here"
    parts = []
    for family, table in target.takes_for(arch).items():
        entry = table.get(kind)
        if entry is None:
            continue
        plural = "single-op dispatches" if family == SINGLE else f"{family} dispatches"
        on = "" if sir.DECISIONS[kind].subject == "none" else f" on {roles_words(entry.roles)}"
        parts.append(plural + on)
    if not parts:
        return f"`{target.name}`{' for ' + arch if arch else ''} takes `{kind}` nowhere"
    return f"on `{target.name}`, `{kind}` is taken by " + "; ".join(parts)


def plan_words(reports: Sequence[DispatchReport]) -> str:
    """``contraction [%0], rows [inv, %2]``: the plan's dispatches, for a hint."""
    return ", ".join(f"{r.family} [{', '.join(op_label(op) for op in r.dispatch.members)}]" for r in reports)


def unhonoured(target: targets.Target, module: ir.Module, ir_name: str, strategy: sir.Strategy,
               arch: str | None = None, name: str | None = None, plan: KernelPlan | None = None) -> list[Downgrade]:
    """The decisions of ``strategy`` that no dispatch of the kernel honours on ``target`` (for ``arch``).
    ``name``: the kernel's name in messages (default: its IR name); ``plan``: its plan, if made already."""
    _, reports = dispatch_reports(target, module, ir_name, strategy, arch, plan)
    out = []
    for dec in strategy.decisions:
        if any(dec in r.applied for r in reports):
            continue
        reason = _reason(dec, reports, target, arch)
        hint = "write the value that runs, or one that runs as written" if RUNS_AS in reason else \
            f"{where_taken(target, dec.kind, arch)}; the plan has {plan_words(reports) or 'no dispatch'}"
        out.append(Downgrade(name or ir_name, dec, target.name, reason, hint))
    return out


def check_time(module: ir.Module, ir_name: str, strategy: sir.Strategy, name: str | None = None) -> list[Downgrade]:
    """What ``akc check`` reports: the decisions dropped on the strategy's target (its default flavour),
    or, for a strategy for every target, on every target."""
    names = (strategy.target,) if strategy.target is not None else targets.names()
    plans: dict[frozenset[str], KernelPlan] = {}  # targets grouping the same families share a plan
    found = {}
    for n in names:
        target = targets.get(n)
        families = target.fused_families()
        if families not in plans:
            plans[families] = plan_of(target, module, ir_name, strategy)
        found[n] = {g.decision: g for g in unhonoured(target, module, ir_name, strategy, name=name,
                                                     plan=plans[families])}
    out = []
    for dec in strategy.decisions:
        per = [found[n].get(dec) for n in names]
        if any(g is None for g in per):
            continue
        gone = [g for g in per if g is not None]
        if strategy.target is not None:
            out.append(gone[0])
            continue
        by_reason: dict[str, list[str]] = {}
        for n, g in zip(names, gone):
            by_reason.setdefault(g.reason, []).append(n)
        reason = gone[0].reason if len(by_reason) == 1 else "; ".join(
            f"on {', '.join(ns)}: {why}" for why, ns in by_reason.items())
        out.append(Downgrade(name or ir_name, dec, None, reason, "no target takes it for this kernel: "
                             + gone[0].hint))
    return out


def build_time(target: targets.Target, module: ir.Module, ir_name: str, strategy: sir.Strategy,
               arch: str | None = None, name: str | None = None) -> list[Downgrade]:
    """What building for ``target`` adds to :func:`check_time`: the decisions dropped here that the
    check could not know were dropped (a strategy for every target, a flavour other than the default)."""
    known = {g.decision for g in check_time(module, ir_name, strategy, name)}
    return [g for g in unhonoured(target, module, ir_name, strategy, arch, name) if g.decision not in known]


# ---------------------------------------------------------------- akc build --explain


def _taken_text(target: targets.Target, dispatch: Dispatch, dims: Mapping[str, int] | None,
                arch: str | None) -> str:
    """``tile m|n|k, vectorize n, threads 1..16``: what the dispatch takes, with values where known."""
    roles = target.subject_roles(dispatch)
    parts = []
    for kind in sorted(target.decisions_for(dispatch, arch)):
        spec = sir.DECISIONS[kind]
        if spec.subject == "none":
            values = target.legal_values(kind, dispatch, dims or {}, None, arch)
            parts.append(f"{kind} {_values_text(values)}" if values else kind)
            continue
        pool = sorted(roles.get("index" if spec.subject == "index" else "operand", ()))
        subjects = [s for s in pool if target.honoured(sir.Decision(kind, s, None), dispatch, arch=arch) is None]
        if not subjects:
            continue
        if dims is None or spec.subject == "operand":
            parts.append(f"{kind} {'|'.join(subjects)}")
            continue
        for s in subjects:
            values = target.legal_values(kind, dispatch, dims, s, arch)
            parts.append(f"{kind} {s} {_values_text(values)}" if values else f"{kind} {s}")
    return ", ".join(parts) or "nothing"


def _values_text(values: Sequence[int | str]) -> str:
    """``{1, 2, 4, 8}``; a long run as ``{1, 2, 4, …, 1024}``."""
    if values == ("",):
        return ""
    shown = [str(v) for v in values]
    if len(shown) > 7:
        shown = [*shown[:3], "…", shown[-1]]
    return "{" + ", ".join(shown) + "}"


def explain(target: targets.Target, module: ir.Module, ir_name: str, strategies: Sequence[sir.Strategy],
            name: str, arch: str | None = None, dims: Mapping[str, int] | None = None) -> str:
    """``akc build --explain`` for one kernel: per strategy variant, each dispatch with its family, ops,
    the decisions applied and dropped (with why), and what it takes (values too when ``dims`` are given)."""
    from arke.ir.text import cond_text

    lines = []
    flavour = f" ({arch})" if arch else ""
    for label, strategy in strategy_variants(strategies):
        notes = []
        if strategy is not None and strategy.when is not None:
            notes.append(f"when {cond_text(strategy.when)}")
        if strategy is not None and strategy.target is None:
            notes.append("for every target")
        lines.append(f"{name} on {target.name}{flavour}, {label}" + (f" ({', '.join(notes)})" if notes else "") + ":")
        plan, reports = dispatch_reports(target, module, ir_name, strategy, arch)
        for r in reports:
            ops = ", ".join(op_label(op) + (" (result)" if op.result in plan.function.results else "")
                            for op in r.dispatch.members)
            lines.append(f"  dispatch {r.index}: {r.family}" + ("" if r.family == r.dispatch.family or
                                                               r.family != SINGLE else f" ({r.dispatch.family})")
                         + f" — ops: {ops}")
            if strategy is not None:
                lines.append("    applied: " + (", ".join(words(d) for d in r.applied) or "none"))
                for d, why in r.dropped:
                    if _relevant(d, r, target):
                        lines.append(f"    dropped: {words(d)} — {why}")
            lines.append(f"    takes: {_taken_text(target, r.dispatch, dims, arch)}")
            lines += [f"    {note}" for note in target.dispatch_notes(r.dispatch, arch)]
        if strategy is not None:
            for g in unhonoured(target, module, ir_name, strategy, arch, name):
                lines.append(f"  warning[{CODE}]: `{words(g.decision)}` reaches no dispatch: {g.reason}")
    return "\n".join(lines) + "\n"


__all__ = ["CODE", "DispatchReport", "Downgrade", "StrategyDowngradeWarning", "build_time", "check_time",
           "dispatch_reports", "explain", "plan_of", "unhonoured", "where_taken",
           "words"]
