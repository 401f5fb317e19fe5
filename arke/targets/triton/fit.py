"""The Triton target's fit step: a launch that spills at its rendered options gets other free ones.

ptxas puts what does not fit in a thread's registers in local memory (spills, read from the
cubin's stack frame). Whether a block spills depends on the architecture and the code around
the blocks, so it is measured, never guessed: :func:`fit_plan` renders a plan, compiles every
launch for each asked architecture (no GPU: :mod:`arke.targets.triton.aot`) and, for each launch
that spills on any of them (or needs more registers or shared memory than one has), searches the
options the strategy left free (spec/codegen.md §9.5):

* the moves from a configuration, in order: twice the warps (up to :data:`MAX_WARPS`: the same
  blocks over more threads), each free block halved (the largest first, down to
  :data:`MIN_BLOCK`), one pipeline stage fewer;
* each round compiles every move of the current configuration at once and keeps the first that
  compiles without spills on every architecture; else it goes on from the move with the fewest
  spills, for at most :data:`ROUNDS` rounds, while the spills go down.

An option a strategy decision set (``LaunchSpec.fixed``: a ``tile``, ``warps`` or ``stages``, or a
block sized at each launch to cover a head dim) is never changed. A launch that still spills is
an :class:`Unfit` (the warning AK4015, spec/diagnostics.md), compiled at its configuration with
the fewest spills. The choices go into the plan (``KernelPlan.fitted``) and the artifact is
rendered from it, so the runtime launches what was measured.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from arke.plan.dispatch import KernelPlan
from arke.targets.artifact import Artifact, LaunchSpec, Renderer
from arke.targets.nvidia.cubin import CompiledEntry, arch_of
from arke.targets.triton.aot import (
    MIN_BLOCK,
    ResourceError,
    check_resources,
    compile_requests,
    interpreted,
    refuse_early,
)

#: Rounds of moves tried from a spilling launch's configuration.
ROUNDS = 4
#: The most warps a move makes.
MAX_WARPS = 16
#: The diagnostic code of a launch that spills whatever the fit tries.
CODE = "AK4015"
#: A configuration that cannot launch at all (too many registers, too much shared memory) costs this.
_CANNOT = 1 << 40

Options = dict[str, int]


@dataclass(frozen=True)
class Unfit:
    """A launch that spills on ``arch`` (``spills`` 4-byte words per thread) at every configuration the fit
    tried: ``options`` the one it compiles with, ``fixed`` the options the strategy set."""

    kernel: str
    entry: str
    arch: str
    spills: int
    options: tuple[tuple[str, int], ...]
    fixed: tuple[str, ...]

    def message(self) -> str:
        opts = ", ".join(f"{k} = {v}" for k, v in self.options)
        return (f"`{self.kernel}` (entry `{self.entry}`) spills {self.spills} words per thread to local memory on "
                f"{self.arch} at every launch configuration the strategy leaves free ({opts})")

    def hint(self) -> str:
        if self.fixed:
            return (f"the strategy fixes {', '.join(self.fixed)}: smaller tiles or more warps fit; a strategy "
                    "with a `when` condition can keep these for the shapes and GPUs they suit")
        return "no configuration of this form fits: the kernel runs, with slower local-memory traffic"


class SpillWarning(UserWarning):
    """``arke.build``'s AK4015 on a GPU: a launch that spills whatever the fit tries (:class:`Unfit`)."""

    code = CODE

    def __init__(self, unfit: Unfit | str):
        # a str: the warning rebuilt from its message (pickling, pytest-xdist's workers)
        text = unfit if isinstance(unfit, str) else f"{CODE}: {unfit.message()} (hint: {unfit.hint()})"
        super().__init__(text)
        self.unfit = unfit if not isinstance(unfit, str) else None


@dataclass(frozen=True)
class Fitted:
    """A fitted plan, its artifact and compiled launches (arch-major, as :func:`compile_artifact_archs`
    orders them); ``changes`` are ``(entry, option, rendered value, fitted value)``."""

    plan: KernelPlan
    artifact: Artifact
    entries: list[CompiledEntry]
    changes: tuple[tuple[str, str, int, int], ...]
    unfit: tuple[Unfit, ...]


def free_options(launch: LaunchSpec) -> list[str]:
    """The options of ``launch`` the fit may change: its blocks and ``num_warps``/``num_stages``, less
    those a decision set or a launch covers."""
    fixed = set(launch.fixed) | {name for name, _ in launch.covers}
    return [k for k, _ in launch.options
            if k not in fixed and (k.startswith("BLOCK") or k in ("num_warps", "num_stages"))]


def moves(options: Options, free: Sequence[str]) -> list[Options]:
    """The single changes tried from ``options``, in order (see the module doc)."""
    out: list[Options] = []
    if "num_warps" in free and options["num_warps"] < MAX_WARPS:
        out.append(options | {"num_warps": options["num_warps"] * 2})
    blocks = [k for k in free if k.startswith("BLOCK") and options[k] > MIN_BLOCK]
    order = {k: n for n, k in enumerate(options)}
    for k in sorted(blocks, key=lambda k: (-options[k], -order[k])):  # the largest first, the later on ties
        out.append(options | {k: options[k] // 2})
    if "num_stages" in free and options["num_stages"] > 1:
        out.append(options | {"num_stages": options["num_stages"] - 1})
    return out


def _cost(entries: Sequence[CompiledEntry] | None, plan: KernelPlan) -> int:
    """Spill words over the archs; :data:`_CANNOT` when a compile failed, and :data:`_CANNOT` plus the
    bytes of shared memory over the limits when an entry cannot launch (so a search over such
    configurations still goes on from the one nearest to launching: a 16-bit attention block may
    need several halvings to fit)."""
    if entries is None:
        return 2 * _CANNOT
    try:
        for e in entries:
            check_resources(e, plan)
    except ResourceError:
        return _CANNOT + sum(max(0, e.shared - arch_of(e.arch)[1]) for e in entries)
    return sum(e.spills for e in entries)


class _Search:
    """The fit of one plan's launches: renders each candidate configuration and compiles the launch with it."""

    def __init__(self, plan: KernelPlan, renderer: Renderer, archs: Sequence[str], aligned: bool):
        self.plan, self.renderer, self.archs, self.aligned = plan, renderer, list(archs), aligned

    def with_options(self, entry: str, options: Options, rendered: Options) -> KernelPlan:
        """The plan with ``entry``'s options that differ from ``rendered`` as fit choices."""
        keep = tuple(f for f in self.plan.fitted if f[0] != entry)
        return dataclasses.replace(self.plan, fitted=keep + tuple(
            (entry, k, v) for k, v in options.items() if rendered.get(k) != v))

    def compile(self, entry: str, candidates: Sequence[Options], rendered: Options, seen: set[str]
                ) -> list[tuple[Options, KernelPlan, list[CompiledEntry] | None]]:
        """Each candidate's options as rendered (those not in ``seen``, which grows), its plan, and ``entry``
        compiled for every arch (None: a compile failed)."""
        made = []
        for options in candidates:
            plan = self.with_options(entry, options, rendered)
            artifact = self.renderer.render(plan)
            launch = next(launch for launch in artifact.launches if launch.entry == entry)
            key = repr(sorted(launch.options))
            if key not in seen:  # a move the renderer rounds to a configuration already tried
                seen.add(key)
                made.append((dict(launch.options), plan, artifact))
        results = compile_requests([(a, p, self.archs, [entry]) for _, p, a in made], self.aligned, tolerant=True)
        out = []
        for (options, plan, _), got in zip(made, results):
            ok = [e for e in got if isinstance(e, CompiledEntry)]
            out.append((options, plan, ok if len(ok) == len(got) else None))
        return out

    def launch(self, launch: LaunchSpec, base: list[CompiledEntry]) -> tuple[Options, list[CompiledEntry], bool]:
        """The options ``launch`` keeps, its entries compiled with them, and whether they fit."""
        rendered = dict(launch.options)
        free = free_options(launch)
        current, entries, cost = rendered, base, _cost(base, self.plan)
        seen = {repr(sorted(rendered.items()))}
        for _ in range(ROUNDS):
            candidates = moves(current, free)
            # one compile per candidate in this process (stopping at the first fit); one worker for them all
            # under the interpreter, where each worker is a fresh Python process
            batches = [candidates] if interpreted() else [[c] for c in candidates]
            costs: list[tuple[int, Options, list[CompiledEntry] | None]] = []
            for batch in batches:
                tried = self.compile(launch.entry, batch, rendered, seen)
                costs += [(_cost(es, plan), options, es) for options, plan, es in tried]
                fits = [(options, es) for c, options, es in costs if c == 0 and es is not None]
                if fits:
                    return fits[0][0], fits[0][1], True
            if not costs:
                break
            best = min(costs, key=lambda t: t[0])  # the first of the cheapest, in the moves' order
            if best[0] >= cost or best[2] is None:
                break
            cost, current, entries = best[0], best[1], best[2]
        return current, entries, cost == 0


def fit_plan(plan: KernelPlan, archs: Sequence[str], renderer: Renderer | None = None, check: bool = True,
             aligned: bool = True, warn: bool = False) -> Fitted:
    """Render ``plan`` for Triton with every launch fitted for each of ``archs`` (see the module doc).

    With ``check`` a launch that still needs more registers or shared memory than an arch has raises
    :class:`~arke.targets.triton.aot.ResourceError` (AK4012); with ``warn`` each :class:`Unfit` is also
    a :class:`SpillWarning`.
    """
    if renderer is None:
        from arke.targets.triton.render import RENDERER

        renderer = RENDERER
    archs = list(archs)
    artifact = renderer.render(plan)
    if check:  # tiles the fit cannot shrink that no architecture holds: AK4012 now, not after minutes
        refuse_early(artifact, plan, archs, free_options)
    base = [e for e in compile_requests([(artifact, plan, archs, None)], aligned)[0] if isinstance(e, CompiledEntry)]
    per_entry: dict[str, list[CompiledEntry]] = {}
    for e in base:
        per_entry.setdefault(e.entry, []).append(e)
    search = _Search(plan, renderer, archs, aligned)
    chosen: dict[str, list[CompiledEntry]] = {}
    fitted: list[tuple[str, str, int]] = list(plan.fitted)
    changes: list[tuple[str, str, int, int]] = []
    unfit: list[Unfit] = []
    for launch in artifact.launches:
        got = per_entry[launch.entry]
        if _cost(got, plan) == 0:
            continue
        options, entries, fits = search.launch(launch, got)
        rendered = dict(launch.options)
        for k, v in options.items():
            if rendered[k] != v:
                fitted.append((launch.entry, k, v))
                changes.append((launch.entry, k, rendered[k], v))
        chosen[launch.entry] = entries
        if not fits:
            unfit += [Unfit(plan.name, e.entry, e.arch, e.spills, e.options, tuple(launch.fixed))
                      for e in entries if e.spills]
    final_plan = dataclasses.replace(plan, fitted=tuple(fitted))
    final = renderer.render(final_plan) if changes else artifact
    entries = [next(e for e in chosen.get(launch.entry, per_entry[launch.entry]) if e.arch == arch)
               for arch in (f"sm_{arch_of(a)[0]}" for a in archs)
               for launch in final.launches]
    if check:
        for e in entries:
            check_resources(e, final_plan)
    if warn:
        for u in unfit:
            warnings.warn(SpillWarning(u), stacklevel=2)
    return Fitted(final_plan, final, entries, tuple(changes), tuple(unfit))


__all__ = ["CODE", "MAX_WARPS", "MIN_BLOCK", "ROUNDS", "Fitted", "SpillWarning", "Unfit", "fit_plan", "free_options",
           "moves"]
