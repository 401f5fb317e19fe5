"""``arke.models.tune``: whole-layer plans, measured on complete layer calls (SchedForge's plan optimiser).

For each call shape asked for (prefill of T tokens; decode of one token at the given contexts, which
share one plan: their kernels' dims are the same), the tuner

1. lists the layer's kernel calls at that shape and their dims (:func:`arke.models.plans.dispatches`);
2. proposes candidates per call: the layer's own choice (its defaults, the attention algorithm it
   picks per phase) and the best few points of a short kernel-level search of that call in
   isolation (:func:`arke.tune.tune`, ``dispatch_budget`` measurements each, checked and recorded
   like any kernel's);
3. searches the layer-level space — a candidate per call, the attention algorithm, one thread count
   for the whole shape — with Optuna's TPE sampler (every point where the space fits the budget),
   each point pruned before compiling if a call's strategy would not be honoured as written, and
   measured as a plan on complete layer calls by the verified worker (:mod:`arke.tune.layer_worker`:
   poisoned arena, the reference interpreter's layer as the oracle, equal warm-up);
4. confirms the finalists against the layer's defaults in interleaved rounds
   (:func:`arke.tune.search.confirm`), replacing them only by a win beyond the noise, and stores the
   choice — blocks for every call, empty ones where the defaults stay — as the shape's ``chosen``
   plan record, keyed by the layer's sizes and kinds, the machine, the versions and the protocol.

A layer built afterwards on this machine runs the chosen plans of every tuned shape
(:class:`~arke.models.layer.CompiledLayer`, ``tuning="on"``); :meth:`LayerTuneResult.plan` is the
same plan as ``.ak`` source, for ``plan=`` or for review.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from arke.ir import strategy as sir
from arke.models.plans import HEADER, Dispatch, block, dispatches, identity, spec, strategies
from arke.runtime.host import cores
from arke.tune import db as tdb
from arke.tune.search import Trial, TuneResult, check_time, confirm, flops_of
from arke.tune.source import expressible
from arke.tune.space import UNSET, knobs, prune
from arke.tune.worker import Worker

#: Candidates per call beside the layer's own choice, from its kernel-level search.
PER_DISPATCH = 2


@dataclass
class Phase:
    """One call shape's tuning: its calls ((tokens, context) pairs), its kernel calls, and the outcome."""

    name: str
    tokens: int
    calls: list[tuple[int, int]]
    dispatches: list[Dispatch] = field(default_factory=list)
    candidates: dict[str, list[tuple[sir.Decision, ...]]] = field(default_factory=dict)
    result: TuneResult | None = None
    baseline: str = ""  # the layer's defaults at this shape, pinned as blocks

    @property
    def plan(self) -> str:
        """The chosen plan's blocks (the defaults pinned where they stayed)."""
        chosen = self.result.chosen if self.result is not None else None
        return (chosen.plan if chosen is not None and chosen.plan else self.baseline)


@dataclass
class LayerTuneResult:
    """What :func:`tune` found, per call shape (``akc tune-model`` prints it; ``--format json``: :meth:`as_json`)."""

    layer: str
    target: str
    phases: list[Phase]
    db_url: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def plan(self) -> str:
        """Every shape's chosen plan as one ``.ak`` file (``CompiledLayer(..., plan=...)`` takes it)."""
        parts = [f"# {p.name}\n{p.plan}" for p in self.phases if p.result is not None]
        return HEADER + "\n" + "\n".join(parts)

    def as_json(self) -> dict[str, Any]:
        rows = []
        for p in self.phases:
            if p.result is None:
                continue
            j = p.result.as_json()
            rows.append({"phase": p.name, "calls": p.calls, "default_s": j["default_s"], "tuned_s": j["tuned_s"],
                         "speedup": j["speedup"], "noise": j["noise"], "outcomes": j["outcomes"],
                         "percent_of_fma_peak": j["percent_of_fma_peak"], "notes": j["notes"], "plan": p.plan})
        return {"layer": self.layer, "target": self.target, "phases": rows, "plan": self.plan(),
                "database": self.db_url, "notes": self.notes, "seconds": self.seconds}


def _baseline(module: Any, d: Dispatch, target: str) -> tuple[sir.Decision, ...]:
    """The decisions the layer's own strategies give ``d`` (its attention algorithm per phase), else none."""
    from arke.runtime.guards import eval_cond

    for s in module.strategies.for_kernel(d.ir_name, target):
        if s.when is None or eval_cond(s.when, d.dims):
            return s.decisions
    return ()


def _with(decisions: tuple[sir.Decision, ...], kind: str, value: int | str) -> tuple[sir.Decision, ...]:
    """``decisions`` with its ``kind`` decision (one without a subject) set to ``value``."""
    return (*(d for d in decisions if d.kind != kind), sir.Decision(kind, None, value))


def _phases(layer: Any, prefill: Sequence[int], decode_context: Sequence[int], batch: int) -> list[Phase]:
    """The shapes to tune, checked against the layer (a ValueError naming the first that cannot run)."""
    from arke.tune.db import bucket

    for name, values in (("prefill", prefill), ("decode_context", decode_context)):
        for v in values:
            if not isinstance(v, int) or isinstance(v, bool) or v < (1 if name == "prefill" else 0):
                raise ValueError(f"{name} takes token counts (positive integers), not {v!r}")
    out: dict[int, Phase] = {}
    for t in sorted(set(prefill)):
        if t > layer.max_seq:
            raise ValueError(f"prefill {t} does not fit the layer's max_seq ({layer.max_seq})")
        top = bucket({"T": t})["T"]
        if top in out:  # the same dims bucket: one plan serves both, measured on both
            out[top].calls.append((t, 0))
            out[top].name += f", {t}"
        else:
            out[top] = Phase(f"prefill {t}", t, [(t, 0)])
    if decode_context:
        for c in decode_context:
            if c + 1 > layer.max_seq:
                raise ValueError(f"decode at context {c} does not fit the layer's max_seq ({layer.max_seq})")
        contexts = sorted(set(decode_context))
        out[0] = Phase("decode at " + ", ".join(map(str, contexts)), 1, [(1, c) for c in contexts])
    if not out:
        raise ValueError("give at least one shape to tune: prefill=[tokens, ...] or decode_context=[context, ...]")
    phases = sorted(out.values(), key=lambda p: (p.tokens == 1, p.tokens))
    for p in phases:
        p.dispatches = dispatches(layer, batch, p.tokens)
    return phases


def tune(layer: Any, prefill: Sequence[int] = (), decode_context: Sequence[int] = (), *, batch: int = 1,
         budget: int = 24, dispatch_budget: int = 10, time_s: float | None = None, db: str | None = None,
         seed: int = 0, timeout_s: float = 600.0, progress: Callable[[str], None] | None = None) -> LayerTuneResult:
    """Tune the plan of ``layer`` (a :class:`~arke.models.layer.CompiledLayer`) for prefill of each of
    ``prefill`` tokens and for decode at each of ``decode_context`` (one plan for decode), ``batch``
    sequences per call: at most ``budget`` layer measurements per shape (the defaults' included) after
    ``dispatch_budget`` kernel measurements per call (1: no kernel-level search; the layer-level space is
    then the attention algorithm and the thread count), within ``time_s`` seconds in all. The chosen
    plans go to the tuning database at ``db``, where layers built here find them."""
    import arke
    from arke.models.layer import LAYER_SOURCE

    started = time.perf_counter()
    if getattr(layer, "backend", None) is None:
        raise ValueError("arke.models.tune takes a layer compiled for a target (not the reference interpreter)")
    if budget < 1 or dispatch_budget < 1:
        raise ValueError(f"budgets are numbers of measurements, at least 1, not {min(budget, dispatch_budget)}")
    check_time(time_s)
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, not {batch!r}")
    say = progress or (lambda _: None)
    phases = _phases(layer, list(prefill), list(decode_context), batch)
    database = tdb.Database(db)
    database.count()  # a database that cannot be used is said now, before anything is measured
    module = arke.loads(LAYER_SOURCE, "<decoder layer>")
    out = LayerTuneResult(layer.name, layer.target, phases, database.shown())
    fma = 0.0
    if layer.kind == "f32":
        from arke.runtime.peaks import fma_peak

        fma = fma_peak(cores(), 0.2)
    worker = Worker()
    try:
        for phase in phases:
            left = None if time_s is None else time_s - (time.perf_counter() - started)
            if left is not None and left <= 0:
                out.notes.append(f"{phase.name}: not tuned (the time ran out)")
                continue
            _tune_phase(layer, module, phase, batch, budget, dispatch_budget, left, database, seed, timeout_s,
                        worker, fma, say)
    finally:
        worker.stop()
        out.notes += database.notes
        database.close()
        out.seconds = time.perf_counter() - started
    return out


def _indented(say: Callable[[str], None], tag: str) -> Callable[[str], None]:
    return lambda line: say(f"  {tag}: {line}")


def _writable_knobs(module: Any, d: Dispatch, target: str) -> list[str]:
    """The knobs of a call that a plan can write as source for its kernel: a named subject (not an unnamed
    intermediate's ``pack``) that the checker accepts on the source kernel (an index the kernel has, not
    one that some of its dispatches reduce)."""
    out = []
    for k in knobs(module, d.ir_name, target, d.dims):
        value = next((v for v in k.values if v != UNSET), None)
        if value is None or not expressible(k.subject):
            continue
        spec = sir.DECISIONS[k.decision]
        decision = sir.Decision(k.decision, k.subject, None if spec.values == "none" else value)
        try:
            strategies(block(d, target, (decision,)))
        except ValueError:
            continue
        out.append(k.key)
    return out


def _candidates(module: Any, phase: Phase, target: str, dispatch_budget: int, deadline: float | None,
                db: str, seed: int, timeout_s: float, panels: dict[str, set[Any]],
                say: Callable[[str], None]) -> None:
    """Per call: the layer's own decisions, then the best of a short kernel-level search of it that can run
    on the layer's packed weights."""
    from arke.models.layer import LAYER_SOURCE
    from arke.tune.search import tune as tune_kernel

    for d in phase.dispatches:
        found = [_baseline(module, d, target)]
        if dispatch_budget > 1 and (deadline is None or time.perf_counter() < deadline):
            left = None if deadline is None else max(1.0, deadline - time.perf_counter())
            named = _writable_knobs(module, d, target)
            r = tune_kernel(LAYER_SOURCE, d.name, d.dims, target=target, budget=dispatch_budget, time_s=left,
                            db=db, seed=seed, timeout_s=timeout_s, decisions=named,
                            progress=_indented(say, d.tag))
            ranked = sorted((t for t in r.trials if t.outcome == "ok" and t.strategy is not None),
                            key=lambda t: t.median)
            for t in ranked:
                if len(found) > PER_DISPATCH:
                    break
                assert t.strategy is not None
                if t.strategy.decisions in found:
                    continue
                if panels.get(d.tag):
                    try:
                        variants = _variants(module, target, block(d, target, t.strategy.decisions), [d])
                    except Exception:
                        continue
                    if _unreadable_panels(variants, panels) is not None:
                        continue
                found.append(t.strategy.decisions)
        phase.candidates[d.tag] = found


def _tune_phase(layer: Any, module: Any, phase: Phase, batch: int, budget: int, dispatch_budget: int,
                time_s: float | None, database: tdb.Database, seed: int, timeout_s: float, worker: Worker,
                fma: float, say: Callable[[str], None]) -> None:
    started = time.perf_counter()
    deadline = None if time_s is None else started + time_s
    target = layer.target
    say(f"{layer.name}, {phase.name}: {len(phase.dispatches)} kernel calls")
    base = {d.tag: _baseline(module, d, target) for d in phase.dispatches}
    phase.baseline = "".join(block(d, target, base[d.tag]) for d in phase.dispatches)
    panels: dict[str, set[Any]] = {}
    if layer.packed_weights:  # weights packed once, at load, in the panels its defaults' contractions read
        panels = {tag: set(getattr(v, "panel_reads", set()))
                  for tag, v in _variants(module, target, phase.baseline, phase.dispatches).items()}
    _candidates(module, phase, target, dispatch_budget, deadline, database.url, seed, timeout_s, panels, say)
    key = tdb.Key.of(identity(layer.config, layer.kind, str(layer.act_dtype)), target, {"B": batch, "T": phase.tokens})
    dims = {"B": batch, "T": phase.tokens}
    result = TuneResult(layer.name, target, dims, Trial(None, "failed"), Trial(None, "failed"), db_url=database.shown())
    result.flops = sum(flops_of(module.semantic.get(d.ir_name), d.dims) for d in phase.dispatches) * len(phase.calls)
    result.fma_peak = fma
    phase.result = result
    request = {"op": "layer", "layer": spec(layer), "calls": phase.calls, "batch": batch, "weights_seed": seed,
               "min_sample_s": 0.05}
    measured = 0

    def run(plan: str, samples: int = 7) -> Trial:
        nonlocal measured
        measured += 1
        reply = worker.request({**request, "plan": plan, "seed": seed + 101 * measured, "samples": samples},
                               timeout_s)
        trial = Trial(None, reply.get("status", "failed"), tuple(reply.get("samples", ())),
                      str(reply.get("error", "")), plan)
        if trial.outcome == "ok" and fma and result.flops / trial.median > 1.05 * fma:
            trial.outcome, trial.note = "flagged", (f"{result.flops / trial.median / 1e9:.0f} GFLOP/s is beyond the "
                                                    f"measured FMA peak ({fma / 1e9:.0f} GFLOP/s)")
        return trial

    def record(trial: Trial, outcome: str | None = None) -> None:
        plan = trial.plan or (phase.baseline if outcome == tdb.CHOSEN else "")
        database.add(tdb.Record(key, dims, None, outcome or trial.outcome, trial.samples, trial.note,
                                f"{layer.name} {phase.name}", plan=strategies(plan) if plan else ()))

    result.default = run("")
    record(result.default)
    result.trials.append(result.default)
    if result.default.outcome != "ok":
        result.notes.append(f"the layer's defaults did not run: {result.default.outcome}: {result.default.note}")
        result.chosen = result.default
        return
    _search(layer, module, phase, result, budget, deadline, seed, panels, run, record, say)
    confirm(result, lambda t: run(t.plan, samples=5), record, say)


def _space(module: Any, phase: Phase, target: str) -> dict[str, list[Any]]:
    """The layer-level knobs at this shape: a candidate per call, the attention algorithm, the thread count."""
    space: dict[str, list[Any]] = {d.tag: list(range(len(phase.candidates[d.tag]))) for d in phase.dispatches
                                   if len(phase.candidates[d.tag]) > 1}
    for d in phase.dispatches:
        found = [k for k in knobs(module, d.ir_name, target, d.dims) if k.key == "algorithm"]
        if found:
            space[f"{d.tag} algorithm"] = list(found[0].values)
    if cores() > 1:
        space["threads"] = [UNSET, *range(1, cores() + 1)]
    return space


def _point_plan(module: Any, phase: Phase, target: str, point: dict[str, Any]) -> tuple[str, str | None]:
    """The plan source of a point of the space, and why it is pruned (None: every block honoured as written)."""
    blocks = []
    for d in phase.dispatches:
        decisions = phase.candidates[d.tag][int(point.get(d.tag, 0))]
        algorithm = point.get(f"{d.tag} algorithm", UNSET)
        if algorithm != UNSET:
            decisions = _with(decisions, "algorithm", algorithm)
        if point.get("threads", UNSET) != UNSET:
            decisions = _with(decisions, "threads", int(point["threads"]))
        why = prune(module, d.ir_name, sir.Strategy(d.ir_name, target, None, decisions), d.dims)
        if why is not None:
            return "", f"{d.tag}: {why}"
        blocks.append(block(d, target, decisions))
    plan = "".join(blocks)
    try:
        strategies(plan)  # a plan is source a person can commit: the checker's rules hold for it
    except ValueError as err:
        return "", str(err)
    return plan, None


def _variants(module: Any, target: str, plan: str, calls: Sequence[Dispatch]) -> dict[str, Any]:
    """The compiled variant of each of ``calls`` under ``plan`` (built into the on-disk kernel cache)."""
    import dataclasses

    import arke

    m = dataclasses.replace(module, strategies=sir.StrategySet((*strategies(plan), *module.strategies.strategies)))
    lib = arke.build(m, target=target, tuning="off")
    out = {}
    for d in calls:
        kernel = lib.kernels[d.name]
        out[d.tag] = kernel.variant(kernel.choose(dict(d.dims)))
    return out


def _precompile(module: Any, target: str, plan: str, phase: Phase, panels: dict[str, set[Any]]) -> str | None:
    """Build a plan's variants while another plan is timed; why the layer cannot run it (its weights are
    packed once, in the panels its defaults read: a call that would read them otherwise), else None.
    A build that fails is the worker's to report."""
    try:
        variants = _variants(module, target, plan, phase.dispatches)
    except Exception:
        return None
    return _unreadable_panels(variants, panels)


def _unreadable_panels(variants: dict[str, Any], panels: dict[str, set[Any]]) -> str | None:
    """Why a call's variant cannot run on the layer's packed weights (it does not read their panels), or None."""
    for tag, variant in variants.items():
        lacking = panels.get(tag, set()) - getattr(variant, "panel_reads", set())
        if lacking:
            return (f"{tag}: the layer's weights are packed in panels (layout {sorted(lacking)[0][1]}) that this "
                    "strategy's contractions do not read")
    return None


def _search(layer: Any, module: Any, phase: Phase, result: TuneResult, budget: int, deadline: float | None,
            seed: int, panels: dict[str, set[Any]], run: Callable[[str], Trial], record: Callable[[Trial], None],
            say: Callable[[str], None]) -> None:
    """Propose, prune, precompile and measure plans until the budget or the time is spent."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    target = layer.target
    space = _space(module, phase, target)
    size = math.prod(len(v) for v in space.values())
    grid = itertools.product(*space.values()) if size <= budget - 1 else None
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=6, multivariate=True))
    seen: dict[str, Trial] = {"": result.default}
    say(f"  layer-level space: {', '.join(f'{k} ({len(v)})' for k, v in space.items())}: {size} points")
    pool = ThreadPoolExecutor(max_workers=1)
    pending: list[tuple[Any, str, Future[str | None]]] = []
    asked, measured = 0, 1

    def tell(trial: Any, found: Trial | None) -> None:
        if trial is None:
            return
        if found is not None and found.outcome == "ok":
            study.tell(trial, found.median)
        else:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED if found is None else optuna.trial.TrialState.FAIL)

    def propose() -> bool:
        nonlocal asked
        asked += 1
        trial: Any = None
        if grid is not None:
            values = next(grid, None)
            if values is None:
                return False
            point = dict(zip(space, values))
        else:
            trial = study.ask()
            point = {k: v[int(trial.suggest_categorical(k, [str(i) for i in range(len(v))]))]
                     for k, v in space.items()}
        plan, why = _point_plan(module, phase, target, point)
        if why is not None:
            pruned = Trial(None, "pruned", note=why, plan=plan)
            record(pruned)
            tell(trial, None)
            return True
        if plan in seen or any(p[1] == plan for p in pending):
            tell(trial, seen.get(plan))
            return True
        pending.append((trial, plan, pool.submit(_precompile, module, target, plan, phase, panels)))
        return True

    try:
        exhausted = False
        while (measured < budget and asked < 20 * max(budget, 10)
               and (deadline is None or time.perf_counter() < deadline)):
            while not exhausted and len(pending) < 2 and measured + len(pending) < budget:
                exhausted = not propose()
            if not pending:
                if exhausted:
                    break
                continue
            trial, plan, compiling = pending.pop(0)
            why = compiling.result()
            if why is not None:
                pruned = Trial(None, "pruned", note=why, plan=plan)
                seen[plan] = pruned
                record(pruned)
                tell(trial, None)
                continue
            found = run(plan)
            seen[plan] = found
            record(found)
            result.trials.append(found)
            measured += 1
            tell(trial, found)
            best = min(t.median for t in result.trials)
            say(f"  [{measured}/{budget}] {found.outcome:8s} {found.median * 1e3:9.3f} ms  best {best * 1e3:.3f} ms")
    finally:
        for trial, _, compiling in pending:
            compiling.cancel()
            tell(trial, None)
        pool.shutdown(wait=True)
