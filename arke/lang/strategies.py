"""Strategy blocks: checked against their kernel and the decision vocabulary, lowered to StrategyIR."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from arke.ir import semantic
from arke.ir import strategy as sir
from arke.ir.dtypes import DType, fits
from arke.ir.shapes import Dim
from arke.lang import ast
from arke.lang.diagnostics import Diagnostic, Related, did_you_mean, make
from arke.lang.indices import IndexInfo
from arke.lang.satisfy import may_hold
from arke.lang.signatures import Signature, cond_expr
from arke.lang.source import Span


def check_strategies(
    strategies: tuple[ast.Strategy, ...],
    sigs: Mapping[str, Signature],
    indices: Mapping[str, Mapping[str, IndexInfo]],
    diags: list[Diagnostic],
    functions: Sequence[semantic.Function] = (),
) -> sir.StrategySet:
    """Check every ``@strategy`` block; the StrategyIR of those without errors. ``functions``: the
    lowered kernels in scope (the file's and its imports'), for the AK4014 warnings of decisions no
    dispatch of their kernel's plan honours (:func:`unhonoured_decisions`)."""
    out: list[sir.Strategy] = []
    pairs: list[tuple[ast.Strategy, sir.Strategy]] = []
    seen: dict[tuple[str, str | None, str], Span] = {}
    for s in strategies:
        checked = _check(s, sigs, indices, diags)
        if checked is None:
            continue
        key = (checked.kernel, checked.target, repr(checked.when))
        if key in seen:
            diags.append(make("AK4010", f"a second strategy for `{s.kernel}` with the same target and condition",
                              s.span, related=[Related(seen[key], "the first one")],
                              hint="merge the two blocks, or give them different `when` conditions"))
            continue
        seen[key] = s.span
        out.append(checked)
        pairs.append((s, checked))
    diags.extend(never_applied(pairs, sigs))
    if functions:
        diags.extend(unhonoured_decisions(pairs, functions))
    return sir.StrategySet(tuple(out))


def never_applied(pairs: Sequence[tuple[ast.Strategy, sir.Strategy]],
                  sigs: Mapping[str, Signature]) -> list[Diagnostic]:
    """AK4016 for each strategy no call can use: an earlier one of the file, with no `when`, always applies to
    every target it would; or its `when` provably never holds for dims its kernel accepts (:mod:`satisfy`)."""
    out = []
    always: dict[str, dict[str | None, Span]] = {}  # kernel -> target (None: every) -> an unconditional block
    for s, checked in pairs:
        firsts = always.setdefault(s.kernel, {})
        first = firsts.get(None) or (firsts.get(checked.target) if checked.target is not None else None)
        sig = sigs.get(s.kernel)
        if first is not None:
            out.append(make("AK4016", f"this strategy for `{s.kernel}` never applies: an earlier one without `when` "
                                      "always does", s.kernel_span, related=[Related(first, "the earlier strategy")],
                            hint="strategies are tried in source order: move this one first, or give the earlier "
                                 "one a `when` condition"))
        elif checked.when is not None and sig is not None and s.when is not None and not may_hold(
                [*(c for c, _ in sig.conds), checked.when]):
            out.append(make("AK4016", f"this strategy for `{s.kernel}` never applies: its `when` holds for no dims "
                                      "the kernel accepts", sig.source.balanced(s.when.span),
                            hint="every dim is a positive integer, and the kernel's `where` clauses hold at every "
                                 "call; correct the condition"))
        if checked.when is None:
            firsts.setdefault(checked.target, s.kernel_span)
    return out


def unhonoured_decisions(pairs: Sequence[tuple[ast.Strategy, sir.Strategy]],
                         functions: Sequence[semantic.Function]) -> list[Diagnostic]:
    """AK4014 for each decision that no dispatch of its kernel's plan honours, where the plan alone shows
    it (:func:`arke.targets.downgrades.check_time`): on the strategy's target, or on every target for a
    strategy without one. A kernel that did not lower (or calls one that did not) is left alone."""
    from arke.targets import downgrades  # pure: plans and the targets' tables, no compiler

    lowered = {f.name: f for f in functions}
    module = semantic.Module(tuple(lowered.values()))
    out = []
    for s, checked in pairs:
        if checked.kernel not in lowered or not checked.decisions:
            continue
        try:
            found = downgrades.check_time(module, checked.kernel, checked, s.kernel)
        except (KeyError, ValueError, NotImplementedError):  # a callee missing after its own errors
            continue
        out += [make(downgrades.CODE, g.message(), decision_span(s, g.decision), hint=g.hint) for g in found]
    return out


def decision_span(s: ast.Strategy, decision: sir.Decision) -> Span:
    """Where ``decision`` is written in block ``s``: the decision's line, or its item among several
    (``j = 64`` of ``tile i = 128, j = 64``); the block's kernel name if it is not there."""
    for d in s.decisions:
        if d.name != decision.kind:
            continue
        if decision.subject is None:
            return d.span
        item = next((i for i in d.items if i.name == decision.subject), None)
        if item is not None:
            return d.span if len(d.items) == 1 else item.span
    return s.kernel_span


def _check(s: ast.Strategy, sigs: Mapping[str, Signature], indices: Mapping[str, Mapping[str, IndexInfo]],
           diags: list[Diagnostic]) -> sir.Strategy | None:
    n_before = len(diags)

    def error(code: str, message: str, span: Span, **kw: object) -> None:
        diags.append(make(code, message, span, **kw))  # type: ignore[arg-type]

    sig = sigs.get(s.kernel)
    if sig is None:
        guess = did_you_mean(s.kernel, sigs)
        error("AK4001", f"strategy for `{s.kernel}`, but no kernel of that name is in scope", s.kernel_span,
              hint=f"did you mean `{guess}`?" if guess else None, replacement=guess)
        return None
    from arke.targets import base as targets  # the registry: each target's facts, nothing heavy

    if s.target is not None and s.target not in targets.names():
        guess = did_you_mean(s.target, targets.names())
        error("AK4006", f"unknown target `{s.target}`", s.target_span or s.span,
              hint=f"did you mean `{guess}`?" if guess else "targets are " + ", ".join(targets.names()),
              replacement=guess)
        return None
    when = None
    if s.when is not None:
        def when_error(code: str, message: str, span: Span, **kw: object) -> None:
            error("AK4008" if code == "AK2001" else code, message, span, **kw)

        when = cond_expr(s.when, dict(sig.dims), when_error)
    if sig.node.body_broken or not sig.ok:  # its indices are unknown: the body's syntax error (or the signature's
        return None  # error, which keeps the body from being checked) is what to fix first
    kernel_indices = indices.get(sig.ir_name, {})
    operands = {p.name for p in sig.params if p.type.rank > 0}
    decisions: list[sir.Decision] = []
    given: dict[tuple[str, str | None], Span] = {}
    for d in s.decisions:
        decs = _decision(d, s.target, kernel_indices, operands, s.kernel, error)
        # `tile m = 4, m = 8`: each item's own span, so the second `m` is the one marked
        spans = [i.span for i in d.items] if 1 < len(d.items) == len(decs) else [d.span] * len(decs)
        for dec, span in zip(decs, spans):
            key = (dec.kind, dec.subject)
            if key in given:
                error("AK4007", f"`{d.name}` is given twice" + (f" for `{dec.subject}`" if dec.subject else ""),
                      span, related=[Related(given[key], "first given here")])
                continue
            given[key] = span
            decisions.append(dec)
    if any(x.is_error for x in diags[n_before:]):
        return None
    return sir.Strategy(sig.ir_name, s.target, when, tuple(decisions))


def _decision(d: ast.Decision, target: str | None, indices: Mapping[str, IndexInfo], operands: set[str],
              kernel: str, error: object) -> list[sir.Decision]:
    err = error  # typed loosely: a callable(code, message, span, **kw)
    spec = sir.DECISIONS.get(d.name)
    if spec is None:
        guess = did_you_mean(d.name, sir.DECISIONS)
        err("AK4002", f"unknown decision `{d.name}`", d.name_span,  # type: ignore[operator]
            hint=f"did you mean `{guess}`?" if guess else "decisions are " + ", ".join(sir.DECISIONS),
            replacement=guess)
        return []
    from arke.targets import base as targets

    honouring = targets.honouring(d.name)
    if target is not None and target not in honouring:
        err("AK4009", f"`{d.name}` has no effect on target `{target}`", d.name_span,  # type: ignore[operator]
            hint="it applies to " + ", ".join(sorted(honouring)))
        # warned, and left out of the StrategyIR (it would mean nothing there); still checked as a decision for
        # any target: a misspelt index or a value out of range is an error whichever target the block names
        _decision(d, None, indices, operands, kernel, error)
        return []
    if spec.subject == "none":
        if d.items or d.value is None:
            err("AK4004", f"`{d.name}` takes one value, as in `{d.name} = {_example(spec)}`",  # type: ignore[operator]
                d.span)
            return []
        value = _value(spec, d.value, d.span, err)
        if value is _BAD:
            return []
        allowed = targets.narrowed_choices(d.name, target)
        if allowed is not None and value not in allowed:
            others = sorted(t for t in honouring if targets.narrowed_choices(d.name, t) is None)
            err("AK4004", f"target `{target}` cannot lower `{d.name} = {value}`", d.span,  # type: ignore[operator]
                hint=f"on `{target}` write " + " or ".join(f"`{d.name} = {c}`" for c in allowed)
                + f", or move it to a block for {', '.join(others)}",
                replacement=f"{d.name} = {allowed[0]}")
            return []
        return [sir.Decision(d.name, None, value)]  # type: ignore[arg-type]
    if not d.items:
        what = "indices" if spec.subject == "index" else "operands"
        err("AK4004", f"`{d.name}` names {what}, as in `{d.name} {_item_example(spec)}`", d.span)  # type: ignore[operator]
        return []
    out = []
    for item in d.items:
        if spec.subject == "index" and item.name not in indices:
            guess = did_you_mean(item.name, indices)
            known = ", ".join(indices) or "none (it is written without named indices)"
            err("AK4003", f"kernel `{kernel}` has no index `{item.name}`", item.span,  # type: ignore[operator]
                hint=f"did you mean `{guess}`?" if guess else f"its indices are: {known}", replacement=guess)
            continue
        if spec.subject == "operand" and item.name not in operands:
            guess = did_you_mean(item.name, operands)
            err("AK4003", f"kernel `{kernel}` has no tensor parameter `{item.name}`", item.span,  # type: ignore[operator]
                hint=f"did you mean `{guess}`?" if guess else None, replacement=guess)
            continue
        info = indices.get(item.name)
        if d.name == "parallel" and info is not None and info.reduced:
            err("AK4005", f"`parallel {item.name}`: `{item.name}` is reduced, and splitting a reduction over "  # type: ignore[operator]
                "workers would change the order of its sum", item.span,
                hint=f"use `split {item.name} = N` for a reduction split with a fixed-order combine")
            continue
        if d.name == "split" and info is not None and not info.reduced:
            err("AK4011", f"`split {item.name}`: `{item.name}` is not reduced", item.span,  # type: ignore[operator]
                hint=f"to run `{item.name}` on several workers write `parallel {item.name}`")
            continue
        if item.value is None:
            if spec.value_required:
                err("AK4004", f"`{d.name} {item.name}` needs a value, as in `{d.name} {item.name} = "  # type: ignore[operator]
                    f"{_example(spec)}`", item.span)
                continue
            out.append(sir.Decision(d.name, item.name, None))
            continue
        if spec.values == "none":
            err("AK4004", f"`{d.name}` takes no value", item.span)  # type: ignore[operator]
            continue
        value = _value(spec, item.value, item.span, err, extent=info.extent if info else None)
        if value is not _BAD:
            out.append(sir.Decision(d.name, item.name, value))  # type: ignore[arg-type]
    return out


_BAD = object()


def _value(spec: sir.DecisionSpec, value: object, span: Span, err: object, extent: Dim | None = None) -> object:
    e = err
    if spec.values == "enum":
        if value not in spec.choices:
            guess = did_you_mean(str(value), spec.choices)
            e("AK4004", f"`{spec.name}` cannot be `{value}`", span,  # type: ignore[operator]
              hint=f"did you mean `{guess}`?" if guess else "choose one of " + ", ".join(spec.choices),
              replacement=guess)
            return _BAD
        return value
    if not isinstance(value, int):
        what = "a list" if isinstance(value, tuple) else f"`{value}`"  # (a list's items may be stand-ins: ast.Num)
        e("AK4004", f"`{spec.name}` takes an integer, not {what}", span)  # type: ignore[operator]
        return _BAD
    if not fits(value, DType.I64):  # a literal of any length parses; its value is only a stand-in (ast.Num)
        e("AK1005", f"the value of `{spec.name}` does not fit in i64", span,  # type: ignore[operator]
          hint=f"write a value such as {_example(spec)}")
        return _BAD
    low = 2 if spec.values == "split" else 1
    if value < low:
        e("AK4004", f"`{spec.name}` must be at least {low}, not {value}", span)  # type: ignore[operator]
        return _BAD
    if spec.values == "pow2" and value & (value - 1):
        e("AK4004", f"`{spec.name}` must be a power of two, not {value}", span,  # type: ignore[operator]
          hint=f"try {1 << (value.bit_length() - 1)} or {1 << value.bit_length()}")
        return _BAD
    if spec.maximum is not None and value > spec.maximum:
        e("AK4004", f"`{spec.name}` can be at most {spec.maximum}, not {value}", span)  # type: ignore[operator]
        return _BAD
    if extent is not None and extent.is_number and spec.name in ("tile", "split", "unroll") and value > int(extent):
        e("AK4004", f"`{spec.name}` of {value} is larger than the index's extent {int(extent)}", span)  # type: ignore[operator]
        return _BAD
    return value


def _example(spec: sir.DecisionSpec) -> str:
    return spec.choices[0] if spec.values == "enum" else "4" if spec.values != "split" else "8"


def _item_example(spec: sir.DecisionSpec) -> str:
    return "w" if spec.subject == "operand" else "i = 64" if spec.value_required else "i"
