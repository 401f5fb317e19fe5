"""The Target protocol and the registry of targets.

A target is one folder under ``arke/targets/`` whose ``__init__.py`` defines ``TARGET``, an
instance of a :class:`Target` subclass, and one entry in :data:`REGISTRY`. Everything a caller
needs from a target goes through it: whether it can run here (and what to install when not),
rendering a plan to text, compiling and loading a kernel (with its cache key), the resources of
a compiled kernel, the strategy decisions it honours with their legal values for a dispatch and
its dims (the space a tuner searches, and the table behind the checker's AK4xxx warnings), and
its ``akc build`` command. Nothing outside ``arke/targets/`` compares target names.

A target's ``__init__`` stays light (the checker and the language server read the facts here
without importing torch, llvmlite or a target's compiler): heavy modules are imported inside
the methods that need them.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from arke.ir import strategy as sir
from arke.targets import space
from arke.targets.space import FUSED as FUSED  # re-exported: callers ask the registry's module
from arke.targets.space import SINGLE as SINGLE
from arke.targets.space import Takes, dispatch_family, family_words, roles_words, rounded_up

if TYPE_CHECKING:
    from collections.abc import Sequence

    from arke.ir import semantic as ir
    from arke.plan.dispatch import Dispatch, KernelPlan
    from arke.targets.artifact import Artifact, Renderer

#: target name -> the package that defines its ``TARGET`` (adding a target: one folder, one line here)
REGISTRY: dict[str, str] = {
    "llvm": "arke.targets.llvm",
    "triton": "arke.targets.triton",
    "cuda": "arke.targets.cuda",
    "mlir": "arke.targets.mlir",
}

# FUSED (the families a plan may fuse ops into) and SINGLE (the row of the tables for a dispatch of
# one op) are defined in arke.targets.space, with the tables' roles, and re-exported here.


class UsageError(Exception):
    """A problem with how a build was asked for (``akc`` exits 2); the message says what to do."""


class TargetUnavailableError(ValueError):
    """A target cannot run kernels here; the message says what to install or do."""


@dataclass(frozen=True)
class Resource:
    """What one compiled entry uses on its machine (None where the target has no such notion)."""

    entry: str
    registers: int | None = None
    spills: int | None = None
    shared_bytes: int | None = None
    notes: str = ""


class Target:
    """One code-generation target: its facts (class attributes) and its operations (methods).

    Subclasses set the facts and override the operations they support; the defaults here
    describe a target that renders nothing (each raises with what is missing)."""

    #: the name strategies and ``arke.build`` use (``@strategy(k, target = llvm)``)
    name: ClassVar[str] = ""
    #: one line for hover, completion and ``akc build --help``
    description: ClassVar[str] = ""
    #: the decisions this target honours somewhere (others are AK4009 at a strategy for it); derived
    #: from :attr:`takes` when a subclass sets that
    honours: ClassVar[frozenset[str]] = frozenset()
    #: decision -> the values this target can lower, where fewer than the decision's own choices
    choices: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    #: dispatch family (or :data:`SINGLE`) -> the decisions a dispatch of that family takes (the keys of
    #: :attr:`takes`, derived from it)
    uses: ClassVar[Mapping[str, frozenset[str]]] = {}
    #: dispatch family (or :data:`SINGLE`) -> decision -> on which roles of the dispatch it is taken
    #: (:class:`arke.targets.space.Takes`); what the target's renderers for that family read
    takes: ClassVar[Mapping[str, Mapping[str, Takes]]] = {}
    #: dispatch family (or :data:`SINGLE`) -> decision -> why a dispatch of that family ignores it
    drops: ClassVar[Mapping[str, Mapping[str, str]]] = {}
    #: the fused families plans for this target group (its renderer's ``families``; :meth:`fused_families`)
    families: ClassVar[frozenset[str]] = FUSED
    #: whether its build command itself reports the decisions it cannot express (mlir's AK4013), so
    #: ``akc build`` adds no AK4014 of its own for them
    reports_unexpressed: ClassVar[bool] = False
    #: what ``akc build --emit`` takes for this target (``source`` first: the default)
    emits: ClassVar[tuple[str, ...]] = ("source",)
    #: whether whole decoder layers (``arke.models``) can run their plans on this target
    runs_layers: ClassVar[bool] = False
    #: whether ``arke.build(..., arch=...)`` picks a GPU architecture for this target
    takes_arch: ClassVar[bool] = False
    #: whether ``arke.build(..., device=...)`` takes another device than the CPU
    takes_device: ClassVar[bool] = False
    #: the packages whose versions stand for this target's toolchain (a tuning record is used only with them)
    toolchain: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A target states what it takes once (:attr:`takes`); ``honours`` and ``uses`` follow from it."""
        super().__init_subclass__(**kwargs)
        if "takes" in cls.__dict__:
            cls.uses = space.uses_of(cls.takes)
            cls.honours = space.honours_of(cls.takes)

    # ------------------------------------------------------------ running here

    def unavailable(self, device: str = "cpu", arch: str | None = None) -> str | None:
        """None when kernels for ``device``/``arch`` can run on this machine now; otherwise why not
        and what to install or do (shown as is to the user)."""
        return f"the {self.name} target cannot run kernels"

    def require(self, device: str = "cpu", arch: str | None = None) -> None:
        """Raise (a ValueError: :class:`TargetUnavailableError` or the target's own kind) saying what to do
        unless kernels for ``device``/``arch`` can run here."""
        why = self.unavailable(device, arch)
        if why is not None:
            raise TargetUnavailableError(why)

    def check_options(self, device: str, arch: str | None) -> str | None:
        """Validate ``arke.build``'s ``device`` and ``arch`` for this target (a ValueError saying which
        values it takes) and return the architecture in its canonical spelling."""
        if device != "cpu":
            takers = [t.name for t in all_targets() if t.name != self.name and t.takes_device]
            raise ValueError(f"device={device!r} is for the {' and '.join(takers)} target; the {self.name} target "
                             f"takes only device='cpu'")
        if arch is not None:
            takers = [t.name for t in all_targets() if t.takes_arch]
            raise ValueError(f"arch={arch!r} is for the {' and '.join(takers)} targets, not {self.name}")
        return None

    def on_host(self, device: str, arch: str | None) -> bool:
        """Whether kernels built with these options run on this CPU (their arguments are moved there)."""
        return False

    def toolchain_versions(self) -> dict[str, str]:
        """The installed version of each :attr:`toolchain` package ("absent" where it is not installed)."""
        import importlib.metadata

        out = {}
        for package in self.toolchain:
            try:
                out[package] = importlib.metadata.version(package)
            except importlib.metadata.PackageNotFoundError:
                out[package] = "absent"
        return out

    # ------------------------------------------------------------ decoder layers (arke.models)

    #: whether a layer's kernels lend their temporaries to the layer's memory plan (CPU kernels do)
    lends_temporaries: ClassVar[bool] = False

    def layer_device(self) -> Any:
        """The torch device a decoder layer's weights, arena and KV cache live on for this target."""
        import torch

        return torch.device("cpu")

    #: whether its kernels can be launched inside a torch.compile graph (torch.library.triton_op)
    torch_traceable: ClassVar[bool] = False

    def torch_dispatch(self, on_host: bool) -> tuple[str, bool]:
        """How :func:`arke.torch.register` defines this target's kernels: the dispatch key their
        implementation runs under, and whether they can be traced into torch.compile's graph
        (``torch.library.triton_op``; the others are opaque operators)."""
        return ("CPU" if on_host else "CUDA"), False

    def panel_width(self, weights_dtype: str) -> int:
        """The panel width contraction weights of ``weights_dtype`` are packed into once (0: not packed)."""
        return 0

    def pack_weight(self, w: Any) -> Any:
        """``w`` (a ``[N, K]`` torch tensor read as ``B`` of a contraction ``sum(x[m, k] * w[n, k] for k)``
        whose other side has w's dtype) packed once into the layout this target's kernels read in
        place, registered as such; None where it reads weights as stored."""
        return None

    # ------------------------------------------------------------ rendering and compiling

    #: whether this target's loops stop at a reduction's length (spec/language.md §8.11); if not,
    #: its plans run bounded reductions as masked ones over the whole extent
    bounded_reductions: ClassVar[bool] = False
    #: whether its attention family reads k/v rows through a block table in place and skips the keys
    #: past a length (spec/language.md §8.11: paged attention is attention); implied by bounded loops
    paged_attention: ClassVar[bool] = False

    def renderer(self, arch: str | None = None) -> Renderer:
        """The renderer that turns plans into this target's text (for ``arch`` where it matters)."""
        raise NotImplementedError(f"the {self.name} target has no renderer")

    def render(self, plan: KernelPlan, arch: str | None = None) -> Artifact:
        """The target's text for one kernel plan (pure: no compiler runs)."""
        return self.renderer(arch).render(plan)

    def plan(self, module: ir.Module, ir_name: str, strategy: sir.Strategy | None,
             arch: str | None = None) -> KernelPlan:
        """The plan of one kernel grouped into the families this target's renderer (for ``arch``) renders."""
        from arke.plan.dispatch import make_plan

        bounded = self.bounded_reductions and arch is None
        return make_plan(module, ir_name, strategy, self.fused_families(arch), bounded,
                         bounded or self.paged_attention)

    def cache_key(self, artifact: Artifact, arch: str | None = None) -> str:
        """The on-disk cache key of the compiled form of ``artifact`` (everything that could change it)."""
        from arke.runtime.cache import cache_key

        return cache_key(kind="artifact", target=self.name, source=artifact.source, arch=arch or "")

    def build_kernel(self, module: ir.Module, ir_name: str, strategy: sir.Strategy | None, *, threads: int,
                     device: str = "cpu", arch: str | None = None) -> Any:
        """Plan, render, compile (through the cache) and load one strategy variant of a kernel: an object
        with ``run_prepared(args, dims, numpy_out, threads, out)`` and ``artifact``. ``threads``: the
        workers of a host kernel's launches; 0 when none was asked for: follow ``torch.get_num_threads()``."""
        raise NotImplementedError(f"the {self.name} target cannot build kernels")

    def resources(self, kernel: Any) -> list[Resource]:
        """Registers, spills and shared memory of a built kernel's entries, where the target has them."""
        return []

    # ------------------------------------------------------------ the strategy space

    def fused_families(self, arch: str | None = None) -> frozenset[str]:
        """The fused families plans for this target (for ``arch``) group, without importing its renderer."""
        return self.families

    def takes_for(self, arch: str | None = None) -> Mapping[str, Mapping[str, Takes]]:
        """The :attr:`takes` table of this target's code for ``arch`` (a flavour may take fewer)."""
        return self.takes

    def drop_reason(self, decision: str, family: str, arch: str | None = None) -> str:
        """Why a dispatch of ``family`` ignores ``decision`` (one it does not take at all)."""
        why = self.drops.get(family, {}).get(decision)
        return why or f"{family_words(family)} on `{self.name}` takes no `{decision}`"

    def dispatch_notes(self, dispatch: Dispatch, arch: str | None = None) -> list[str]:
        """What this target does with ``dispatch`` beyond its decisions (``akc build --explain`` prints
        them): e.g. the rows of a routed contraction it skips. None by default."""
        return []

    def subject_roles(self, dispatch: Dispatch) -> dict[str, frozenset[str]]:
        """Role -> the indices or operands playing it in ``dispatch`` (:func:`arke.targets.space.subject_roles`;
        a target may add roles of its own)."""
        return space.subject_roles(dispatch)

    def decisions_for(self, dispatch: Dispatch, arch: str | None = None) -> frozenset[str]:
        """The decisions a dispatch of this target takes (on some subject)."""
        return frozenset(self.takes_for(arch).get(dispatch_family(dispatch), {}))

    def honoured(self, decision: sir.Decision, dispatch: Dispatch, others: Sequence[sir.Decision] = (),
                 arch: str | None = None) -> str | None:
        """None when ``dispatch`` lowers ``decision`` as asked; else why it is dropped there. ``others``:
        the rest of the strategy (a decision may be moot under another: ``split j`` under ``algorithm =
        flash``). Structural: forms the dims choose at run time (a matrix-vector product for few rows)
        count as taking what their dispatch takes."""
        family = dispatch_family(dispatch)
        entry = self.takes_for(arch).get(family, {}).get(decision.kind)
        if entry is None:
            return self.drop_reason(decision.kind, family, arch)
        spec = sir.DECISIONS[decision.kind]
        if spec.subject != "none" and decision.subject is not None:
            roles = self.subject_roles(dispatch)
            every = "index" if spec.subject == "index" else "operand"
            if decision.subject not in roles.get(every, ()):
                what = "an index" if every == "index" else "a tensor it reads"
                return f"`{decision.subject}` is not {what} of this dispatch"
            if entry.roles is not None and not any(decision.subject in roles.get(r, ()) for r in entry.roles):
                return entry.why or (f"{family_words(family)} on `{self.name}` takes `{decision.kind}` on "
                                     f"{roles_words(entry.roles)} only")
            for role, most, what in entry.limits:
                if isinstance(decision.value, int) and decision.value > most and \
                        decision.subject in roles.get(role, ()):
                    return (f"{what}: at most {most} (`{decision.kind} {decision.subject} = {decision.value}` "
                            f"{space.RUNS_AS} {most} or less)")
            least, what = entry.powers
            if least and isinstance(decision.value, int) and \
                    (run := rounded_up(decision.value, least)) != decision.value:
                return f"{what} (`{decision.kind} {decision.subject} = {decision.value}` {space.RUNS_AS} {run})"
        if entry.values is not None and decision.value not in entry.values:
            return entry.why or (f"{family_words(family)} on `{self.name}` lowers `{decision.kind}` = "
                                 + " or ".join(entry.values) + " only")
        for kind, values in entry.unless:
            other = next((d for d in others if d.kind == kind and d.subject is None), None)
            if other is not None and other.value in values:
                return f"`{kind} = {other.value}` does not use it"
        return None

    def legal_values(self, decision: str, dispatch: Dispatch, dims: Mapping[str, int],
                     subject: str | None = None, arch: str | None = None) -> tuple[int | str, ...]:
        """The values of ``decision`` (on ``subject``, an index or operand) that this dispatch honours at
        these dims; empty when the dispatch drops the decision (:meth:`honoured`). Values are sampled where
        the range is large (tiles: powers of two and the extent itself), so the tuple is a search space,
        not a proof."""
        entry = self.takes_for(arch).get(dispatch_family(dispatch), {}).get(decision)
        if entry is None:
            return ()
        spec = sir.DECISIONS[decision]
        if spec.subject != "none":
            if subject is None or self.honoured(sir.Decision(decision, subject, None), dispatch, arch=arch):
                return ()
            if spec.subject == "operand":
                return ("",)
            extents = dispatch_extents(dispatch, dims)
            found = _values_for(spec, extents[subject], None) if subject in extents else ()
            if entry.powers[0]:  # blocks run as powers of two: the ones the sampled values run as
                found = tuple(dict.fromkeys(rounded_up(v, entry.powers[0]) if isinstance(v, int) else v
                                            for v in found))
            return tuple(v for v in found if self.honoured(sir.Decision(decision, subject, v), dispatch,
                                                           arch=arch) is None)
        values = _values_for(spec, None, self.choices.get(decision))
        return values if entry.values is None else tuple(v for v in values if v in entry.values)

    def tune_values(self, decision: str, dispatch: Dispatch, dims: Mapping[str, int], subject: str | None = None,
                    arch: str | None = None) -> tuple[int | str, ...]:
        """The values of ``decision`` on ``subject`` a tuner tries for ``dispatch`` at ``dims``: the legal ones
        (:meth:`legal_values`) that make different code here. By default the legal values with ``threads``
        capped at the cores this process may use; a target narrows a decision to the values its code
        distinguishes (a register block has at most so many rows)."""
        spec = sir.DECISIONS[decision]
        if (spec.subject == "none") != (subject is None):
            return ()
        values = self.legal_values(decision, dispatch, dims, subject, arch)
        if decision == "threads":
            from arke.runtime.host import cores

            values = tuple(v for v in values if isinstance(v, int) and v <= cores()) or (1,)
        return values

    # ------------------------------------------------------------ akc build

    def add_build_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Nothing by default: ``akc build``'s common arguments cover most targets."""

    def build_command(self, args: argparse.Namespace) -> int:
        """``akc build --target <this>``: ``args`` as ``akc build`` parsed them (path, kernel, emit, arch,
        device, output); returns the exit status, raises :class:`UsageError` for a bad combination."""
        raise UsageError(f"the {self.name} target has no build command")

    def build_bundle(self, module: Any, out: Any, kernels: list[str] | None = None) -> dict[str, Any]:
        """An ahead-of-time bundle of ``module``'s kernels (all when None) in folder ``out``; its manifest."""
        raise ValueError(f"bundles hold kernels of the llvm target; the {self.name} target builds none")

    def bundle_command(self, args: argparse.Namespace, kernels: list[str]) -> int:
        """``akc build --target <this> --bundle DIR``: an ahead-of-time bundle of ``kernels`` (all when empty)."""
        raise UsageError(f"bundles are built for the llvm target; the {self.name} target builds none")


def dispatch_extents(dispatch: Dispatch, dims: Mapping[str, int]) -> dict[str, int]:
    """Index name -> its extent at these dims, over every op of a dispatch (axes and reduced indices)."""
    from arke.ir.shapes import evaluate

    out: dict[str, int] = {}
    for op in dispatch.members:
        for axis in (*op.axes, *getattr(op, "reduce_axes", ())):
            try:
                out.setdefault(axis.name, int(evaluate(axis.extent, dict(dims))))
            except (ValueError, TypeError, KeyError):
                continue
    return out


def dispatch_operands(dispatch: Dispatch) -> set[str]:
    """The tensors a dispatch loads."""
    from arke.ir import semantic as ir
    from arke.passes.rewrite import op_exprs

    return {x.src for op in dispatch.members for e in op_exprs(op) for x in ir.walk(e) if isinstance(x, ir.Load)}


def _values_for(spec: sir.DecisionSpec, extent: int | None, narrowed: tuple[str, ...] | None) -> tuple[int | str, ...]:
    if spec.values == "enum":
        return tuple(narrowed if narrowed is not None else spec.choices)
    if spec.values == "none":
        return ("",)
    top = spec.maximum or (os.cpu_count() or 1 if spec.name == "threads" else 1024)
    if extent is not None:
        top = min(top, max(1, extent))
    if spec.values == "pow2":
        return tuple(1 << k for k in range(int(math.log2(top)) + 1))
    low = 2 if spec.values == "split" else 1
    values = {v for v in (1 << k for k in range(int(math.log2(max(top, 1))) + 1)) if low <= v <= top}
    if top >= low:
        values.add(top)
    return tuple(sorted(values))


# ---------------------------------------------------------------- the registry


def names() -> tuple[str, ...]:
    """Every registered target's name, in registry order."""
    return tuple(REGISTRY)


def get(name: str) -> Target:
    """The target called ``name`` (an unknown name is a ValueError naming the known ones)."""
    if name not in REGISTRY:
        raise ValueError(f"unknown target {name!r}; the targets are: {', '.join(REGISTRY)}")
    found: Target = importlib.import_module(REGISTRY[name]).TARGET
    return found


def all_targets() -> list[Target]:
    """Every registered target."""
    return [get(n) for n in REGISTRY]


def runnable(device: str = "cpu") -> tuple[str, ...]:
    """The targets whose kernels can run on this machine now (asked each time: IREE or Triton may
    have been installed since)."""
    return tuple(t.name for t in all_targets() if t.unavailable(device) is None)


def honouring(decision: str) -> tuple[str, ...]:
    """The targets on which a decision has an effect."""
    return tuple(t.name for t in all_targets() if decision in t.honours)


def narrowed_choices(decision: str, target: str | None) -> tuple[str, ...] | None:
    """The values of an enum decision ``target`` can lower, where fewer than the decision's own."""
    if target is None or target not in REGISTRY:
        return None
    return get(target).choices.get(decision)


def for_emit(emit: str) -> tuple[str, ...]:
    """The targets whose ``akc build`` writes ``--emit emit``."""
    return tuple(t.name for t in all_targets() if emit in t.emits)
