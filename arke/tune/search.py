"""``arke.tune``: a measured search of a kernel's strategy space on one target at given dims.

The defaults are measured first; then points the sampler proposes (Optuna's TPE sampler, or every
point where the space is no larger than the budget), each pruned before compiling if the checker or
the target would not honour it as written, compiled in parallel ahead of their turn, then checked and
timed one at a time by the measuring worker (:mod:`arke.tune.worker`; with ``ray=``, one at a time on
each matching node of a Ray cluster, :mod:`arke.tune.lanes`). Every result is a record in
the tuning database. The best few are confirmed against the defaults in interleaved rounds, and the
defaults are replaced only by a win larger than the measured noise (the rounds' interquartile
spread); the confirmed choice is stored as the key's ``chosen`` record, which ``arke.build`` uses. A
time faster than the machine's measured FMA peak allows (f32 kernels) is flagged, not recorded as ok.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from arke.ir import semantic as S
from arke.ir import strategy as sir
from arke.runtime.host import cores
from arke.tune import db as tdb
from arke.tune.lanes import local as local_lanes
from arke.tune.lanes import ray_lanes
from arke.tune.space import Knob, knobs, prune, space_size, strategy_of

#: Finalists re-measured against the defaults, and the interleaved rounds they get.
FINALISTS, ROUNDS = 3, 3
#: The smallest win that replaces the defaults, whatever the noise (2 %).
MIN_WIN = 0.02


@dataclass
class Trial:
    """One measured (or pruned) point."""

    strategy: sir.Strategy | None
    outcome: str
    samples: tuple[float, ...] = ()
    note: str = ""
    plan: str = ""  # a whole-layer plan's source (arke.tune.layer); "" for a kernel's strategy

    @property
    def label(self) -> str:
        """What tells this point from the others: its plan's source, else its strategy's text ("": the defaults)."""
        return self.plan or _text(self.strategy)

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.outcome == "ok" and self.samples else math.inf

    @property
    def spread(self) -> float:
        if len(self.samples) < 4:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.samples, n=4)
        return (q3 - q1) / self.median


def check_time(time_s: float | None) -> None:
    """A tuning run's ``time_s``: None, or seconds above 0 (nothing could be measured in no time)."""
    if time_s is not None and not time_s > 0:
        raise ValueError(f"the time is a number of seconds above 0, not {time_s}")


@dataclass
class TuneResult:
    """What a tuning run found (``akc tune`` prints it; ``--format json`` writes :meth:`as_json`)."""

    kernel: str
    target: str
    dims: dict[str, int]
    default: Trial
    chosen: Trial  # the confirmed choice: the defaults unless a finalist won by more than the noise
    trials: list[Trial] = field(default_factory=list)
    confirmed: dict[str, float] = field(default_factory=dict)  # strategy text -> confirmation median
    noise: float = 0.0
    flops: float = 0.0
    fma_peak: float = 0.0
    db_url: str = ""
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def speedup(self) -> float:
        d = self.confirmed.get("", self.default.median)
        c = self.confirmed.get(self.chosen.label, self.chosen.median)
        return d / c if c and not math.isinf(c) else 1.0

    def changed(self) -> list[str]:
        """The decisions the chosen strategy sets (every one differs from "the target's default")."""
        from arke.ir.text import decision_text

        return ([decision_text(d).rstrip(";") for d in self.chosen.strategy.decisions] if self.chosen.strategy
                else [])  # (a decision as text ends in `;` inside a block)

    def as_json(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for t in self.trials:
            counts[t.outcome] = counts.get(t.outcome, 0) + 1
        default = self.confirmed.get("", self.default.median)
        chosen = self.confirmed.get(self.chosen.label, self.chosen.median)
        return {"kernel": self.kernel, "target": self.target, "dims": self.dims, "default_s": default,
                "tuned_s": chosen, "speedup": self.speedup, "noise": self.noise, "changed": self.changed(),
                "strategy": _text(self.chosen.strategy), "outcomes": counts, "flops": self.flops,
                "fma_peak": self.fma_peak, "percent_of_fma_peak": (100 * self.flops / chosen / self.fma_peak
                                                                    if self.flops and self.fma_peak else None),
                "database": self.db_url, "notes": self.notes, "seconds": self.seconds}


def _text(strategy: sir.Strategy | None) -> str:
    from arke.ir.text import print_strategy

    return "" if strategy is None else print_strategy(strategy)


def flops_of(fn: S.Function, dims: Mapping[str, int]) -> float:
    """Floating-point operations of a kernel at ``dims`` where its float work is f32 sums of products
    (2 per term of each contraction or sum over a product); 0 where that says nothing (16-bit or
    int8 inputs run on other units, elementwise kernels are bound by memory)."""
    from arke.ir.shapes import evaluate

    if any(p.type.rank and p.type.dtype.is_float and p.type.dtype.name != "F32" for p in fn.params):
        return 0.0
    total = 0.0
    for op in fn.ops:
        if isinstance(op, S.ContractOp | S.ReduceOp) and op.dtype.name == "F32":
            if isinstance(op, S.ReduceOp) and not (op.kind == "sum" and isinstance(op.body, S.Binary)
                                                   and op.body.op == "mul"):
                continue
            n = 1.0
            for axis in (*op.axes, *op.reduce_axes):
                try:
                    n *= float(evaluate(axis.extent, dict(dims)))
                except (ValueError, TypeError, KeyError):
                    return 0.0
            total += 2.0 * n
    return total


def _source_of(source: str | Path | Any) -> tuple[str, str]:
    """(text, path) of a file path, source text, or a loaded module (read from its path)."""
    if not isinstance(source, str | Path):  # a loaded module
        return Path(str(source.path)).read_text(encoding="utf-8"), str(source.path)
    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source
                                    and ("{" not in source or Path(source).is_file())):
        file = Path(source)
        if not file.is_file():
            raise ValueError(f"{source}: no such file (akc tune takes a .ak file)")
        return file.read_text(encoding="utf-8"), str(source)
    return str(source), "<tune>"


def checked_dims(fn: S.Function, kernel: str, dims: Mapping[str, Any]) -> dict[str, int]:
    """``dims`` as a call of ``fn`` keys its lookups (spec/tuning.md): every dim of its tensors, and every dim
    parameter (``G: dim``; its default where it is not given), each a positive integer; nothing else."""
    from arke.runtime.guards import dim_params

    params = dim_params(fn)
    defaults = {p.name: p.default for p in fn.params if p.name in params and p.default is not None}
    given = {**defaults, **dims}
    bad = [f"{k}={v!r}" for k, v in given.items()
           if isinstance(v, bool) or not isinstance(v, int | np.integer) or not 1 <= int(v) < 2**63]
    if bad:
        raise ValueError(f"dims are positive whole numbers, not {', '.join(bad)}")
    own = {s.name for p in fn.params for d in p.type.shape for s in getattr(d, "free_symbols", ())} | set(params)
    missing = sorted(own - set(given))
    if missing:
        raise ValueError(f"give every dim of `{kernel}` (missing: {', '.join(missing)})")
    stray = sorted(set(given) - own)
    if stray:  # a record keyed by them would match no call
        raise ValueError(f"`{kernel}` has no dim {', '.join(stray)}; its dims are {', '.join(sorted(own))}")
    out = {k: int(v) for k, v in given.items()}
    from arke.runtime.guards import GuardError, check_guards

    try:  # dims no call may have: nothing to measure (the worker would only record a failure)
        check_guards(fn, out)
    except GuardError as err:
        raise ValueError(f"no call of `{kernel}` has these dims: {err}") from None
    return out


def tune(source: str | Path | Any, kernel: str, dims: Mapping[str, int], *, target: str = "llvm",
         budget: int | None = 40, time_s: float | None = None, db: str | None = None, seed: int = 0,
         timeout_s: float = 120.0, progress: Callable[[str], None] | None = None,
         flag_roofline: bool = True, decisions: Sequence[str] | None = None, exhaustive: bool = False,
         ray: str | None = None) -> TuneResult:
    """Tune ``kernel`` of ``source`` (a path, source text, or an :func:`arke.load`-ed module) on ``target``
    at ``dims``: at most ``budget`` measurements (the defaults' included) and ``time_s`` seconds.
    ``decisions``: search only these knobs (``["tile m", "tile k"]``); ``exhaustive``: measure every point
    of the space (its size is the budget), not the sampler's proposals. ``ray``: the address of a Ray cluster
    whose nodes like this machine measure candidates side by side (:mod:`arke.tune.lanes`).
    Records go to the tuning database at ``db`` (default :func:`arke.tune.db.default_url`); the confirmed
    choice is what ``arke.build`` uses from then on for calls in the same dims bucket."""
    import arke

    started = time.perf_counter()
    text, path = _source_of(source)
    module = arke.loads(text, path=path)
    if kernel not in module.kernel_map:
        raise ValueError(f"`{path}` has no kernel `{kernel}`; it has: {', '.join(module.names)}")
    ir_name = module.kernel_map[kernel]
    if ir_name in module.generics:
        raise ValueError(f"`{kernel}` is generic (a kernel per dtype set, spec/language.md §5.6): akc tune takes "
                         "kernels with fixed dtypes for now; write the specialisation you run as a kernel of its own")
    fn = module.semantic.get(ir_name)
    dims = checked_dims(fn, kernel, dims)
    if budget is not None and budget < 1:
        raise ValueError(f"the budget is a number of measurements, at least 1 (the defaults'), not {budget}")
    check_time(time_s)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 < timeout_s <= 1e6:
        raise ValueError(f"the timeout is the seconds one candidate may take, above 0 and at most 1e6, not "
                         f"{timeout_s}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"the seed is a whole number from 0 to 2**32 - 1, not {seed}")
    say = progress or (lambda _: None)
    database = tdb.Database(db)
    database.count()  # a database that cannot be used is said now, before anything is measured
    key = tdb.Key.make(module.semantic, ir_name, target, dims)
    space = knobs(module, ir_name, target, dims)
    if decisions is not None:
        unknown = sorted(set(decisions) - {k.key for k in space})
        if unknown:
            raise ValueError(f"`{kernel}` on {target} takes no {', '.join(unknown)} here; it takes: "
                             f"{', '.join(k.key for k in space)}")
        space = [k for k in space if k.key in decisions]
    if exhaustive:
        budget, time_s = space_size(space) + 1, None  # every point, and the defaults measured first
    notes: list[str] = []
    lanes = ray_lanes(ray, target, notes) if ray else local_lanes()
    result = TuneResult(kernel, target, dims, Trial(None, "failed"), Trial(None, "failed"), db_url=database.shown())
    result.flops = flops_of(fn, dims)
    if flag_roofline and result.flops:
        from arke.runtime.peaks import fma_peak

        result.fma_peak = fma_peak(cores(), 0.2)
    seen: dict[str, Trial] = {}
    requests = itertools.count()
    result.notes += notes
    if ray:
        result.notes.append(f"measured on {lanes.width} Ray node{'s' if lanes.width > 1 else ''} "
                            f"({', '.join(lanes.names)}); confirmed on {lanes.names[0]}")

    def run(strategy: sir.Strategy | None, samples: int = 7, lane: Any = None) -> Trial:
        request = {"source": text, "path": path, "kernel": kernel, "target": target, "dims": dims,
                   "strategy": tdb.strategy_json(strategy), "seed": seed + next(requests) * 101, "samples": samples}
        reply = lanes.request(request, timeout_s, lane)
        trial = Trial(strategy, reply.get("status", "failed"), tuple(reply.get("samples", ())),
                      str(reply.get("error", "")))
        if trial.outcome == "ok" and result.fma_peak and result.flops / trial.median > 1.05 * result.fma_peak:
            trial.outcome, trial.note = "flagged", (f"{result.flops / trial.median / 1e9:.0f} GFLOP/s is beyond the "
                                                    f"measured FMA peak ({result.fma_peak / 1e9:.0f} GFLOP/s)")
        return trial

    def record(trial: Trial, outcome: str | None = None) -> None:
        database.add(tdb.Record(key, dims, trial.strategy, outcome or trial.outcome, trial.samples, trial.note,
                                kernel))

    try:
        say(f"{kernel} on {target} at {dims}: {len(space)} decisions, {space_size(space)} points; the defaults first")
        result.default = run(None, lane=lanes.all[0])
        record(result.default)
        result.trials.append(result.default)
        seen[""] = result.default
        if result.default.outcome != "ok":
            result.notes.append(f"the defaults did not run: {result.default.outcome}: {result.default.note}")
            result.chosen = result.default
            return result
        _search(result, space, module, ir_name, target, dims, budget, time_s, started, seed, run, record, seen, say,
                lanes.width)
        confirm(result, lambda t: run(t.strategy, samples=5, lane=lanes.all[0]), record, say)
    finally:
        lanes.stop()
        result.notes += database.notes
        database.close()
        result.seconds = time.perf_counter() - started
    return result


def _search(result: TuneResult, space: list[Knob], module: Any, ir_name: str, target: str, dims: dict[str, int],
            budget: int | None, time_s: float | None, started: float, seed: int,
            run: Callable[[sir.Strategy | None], Trial], record: Callable[[Trial], None],
            seen: dict[str, Trial], say: Callable[[str], None], width: int = 1) -> None:
    """Propose, prune, precompile and measure points until the budget or the time is spent (``width``
    at a time: one per lane)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    exhaustive = budget is not None and space_size(space) <= budget - 1
    choices = {k.key: [str(v) for v in k.values] for k in space}
    # every point in order where the space fits the budget, else the TPE sampler's proposals
    grid = itertools.product(*(k.values for k in space)) if exhaustive else None
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=8, multivariate=True))
    measured, asked = 1, 0
    limit = budget if budget is not None else 10 ** 9

    def out_of_time() -> bool:
        return time_s is not None and time.perf_counter() - started > time_s

    def tell(trial: Any, outcome: Trial | None) -> None:
        if trial is None:
            return
        if outcome is None:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        elif outcome.outcome == "ok":
            study.tell(trial, outcome.median)
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)

    pool = ThreadPoolExecutor(max_workers=max(1, cores() - 1))
    pending: list[tuple[Any, sir.Strategy, str, Future[None]]] = []  # compiling while the worker times

    def propose() -> bool:
        """Ask for the next point, prune or dedupe it, else start compiling it; False when none is left."""
        nonlocal asked
        asked += 1
        trial: Any = None
        point: dict[str, int | str] = {}
        if grid is not None:
            values = next(grid, None)
            if values is None:
                return False
            point = {k.key: v for k, v in zip(space, values)}
        else:
            trial = study.ask()
            for knob in space:
                picked = trial.suggest_categorical(knob.key, choices[knob.key])
                point[knob.key] = next(v for v in knob.values if str(v) == picked)
        strategy = strategy_of(ir_name, target, point, space)
        text = _text(strategy) if strategy.decisions else ""
        if text in seen or any(p[2] == text for p in pending):  # measured (or queued) already
            tell(trial, seen[text] if text in seen and seen[text].outcome != "pruned" else None)
            return True
        why = prune(module, ir_name, strategy, dims)
        if why is not None:
            pruned = Trial(strategy, "pruned", note=why)
            seen[text] = pruned
            record(pruned)
            tell(trial, None)
            return True
        pending.append((trial, strategy, text, pool.submit(precompile, module, ir_name, strategy, target, dims)))
        return True

    lanes = ThreadPoolExecutor(max_workers=width) if width > 1 else None
    try:
        exhausted = False
        while measured < limit and not out_of_time() and asked < 20 * max(limit, 10):
            while not exhausted and len(pending) < 2 * width and measured + len(pending) < limit:
                exhausted = not propose()
            if not pending:
                if exhausted or asked >= 20 * max(limit, 10):
                    break
                continue
            batch = [pending.pop(0) for _ in range(min(width, len(pending)))]
            for _, _, _, compiling in batch:
                compiling.result()  # a build that failed is the worker's to report, with its message
            strategies = [b[1] for b in batch]
            founds = list(lanes.map(run, strategies)) if lanes is not None else [run(strategies[0])]
            for (trial, _, text, _), found in zip(batch, founds):
                seen[text] = found
                record(found)
                result.trials.append(found)
                measured += 1
                tell(trial, found)
                best = min((t.median for t in result.trials), default=math.inf)
                say(f"[{measured}/{limit if budget is not None else '∞'}] {found.outcome:8s} "
                    f"{found.median * 1e3:9.3f} ms  best {best * 1e3:.3f} ms  {' '.join(text.split())}")
    finally:
        for trial, _, _, compiling in pending:  # points asked but not measured (the budget ran out)
            compiling.cancel()
            tell(trial, None)
        pool.shutdown(wait=True)
        if lanes is not None:
            lanes.shutdown(wait=True)


def precompile(module: Any, ir_name: str, strategy: sir.Strategy, target: str, dims: Mapping[str, int]) -> None:
    """Build a candidate into the on-disk kernel cache, where the worker's build finds it (candidates
    compile in parallel while one is timed); a failure is left for the worker to report."""
    import dataclasses

    import arke

    try:
        others = tuple(s for s in module.strategies.strategies if s.kernel != ir_name)
        mine = dataclasses.replace(module, strategies=sir.StrategySet((*others, strategy)))
        name = next(n for n, i in module.kernel_map.items() if i == ir_name)
        kernel = arke.build(mine, target=target, tuning="off").kernels[name]
        kernel.variant(kernel.choose(dict(dims)))
    except Exception:  # the worker measures it and says why it fails
        return


def confirm(result: TuneResult, again: Callable[[Trial], Trial], record: Callable[..., None],
            say: Callable[[str], None]) -> None:
    """Re-measure the finalists (``again``) against the defaults in interleaved rounds; keep the defaults
    unless the best finalist wins by more than the noise; store the choice as the key's ``chosen`` record.
    Candidates are told apart by their :attr:`Trial.label` (the defaults' is "")."""
    def name(t: Trial) -> str:
        return t.label
    ok = sorted((t for t in result.trials if t.outcome == "ok" and name(t)), key=lambda t: t.median)
    finalists = [t for t in ok if t.median < result.default.median][:FINALISTS]
    if not finalists:
        result.chosen = result.default
        record(result.default, tdb.CHOSEN)
        say("no point beat the defaults: they stay")
        return
    say(f"confirming {len(finalists)} finalists against the defaults in {ROUNDS} interleaved rounds")
    rounds: dict[str, list[float]] = {"": []}
    for t in finalists:
        rounds[name(t)] = []
    for _ in range(ROUNDS):
        for candidate in [result.default, *finalists]:
            remeasured = again(candidate)
            if remeasured.outcome == "ok":
                rounds[name(candidate) if candidate is not result.default else ""] += list(remeasured.samples)
    medians = {k: statistics.median(v) if v else math.inf for k, v in rounds.items()}
    spreads = []
    for v in rounds.values():
        if len(v) >= 4:
            q1, _, q3 = statistics.quantiles(v, n=4)
            spreads.append((q3 - q1) / statistics.median(v))
    result.noise = max([MIN_WIN, *spreads])
    result.confirmed = medians
    best = min(finalists, key=lambda t: medians[name(t)])
    if medians[name(best)] * (1 + result.noise) < medians[""]:  # a speedup beyond 1 + noise, as the agent asks
        result.chosen = dataclasses.replace(best, outcome="ok", samples=tuple(rounds[name(best)]))
    else:
        result.chosen = dataclasses.replace(result.default, outcome="ok", samples=tuple(rounds[""]))
        result.notes.append(f"the best finalist ({medians[name(best)] * 1e3:.3f} ms) did not beat the "
                            f"defaults ({medians[''] * 1e3:.3f} ms) by more than the noise ({result.noise:.1%})")
    record(result.chosen, tdb.CHOSEN)
