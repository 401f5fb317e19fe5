"""``arke.build``: compile a checked module for a target into a :class:`Library` of callable kernels.

Kernels compile on first use (a module that imports ``std.nn`` does not compile all of it).
A kernel's strategy is chosen per call: the first of its strategies for the target whose
``when`` holds for the call's dims; each choice compiles once. Object code goes through the
on-disk cache, keyed by everything that could change it. Compiling a strategy variant warns
(:class:`~arke.targets.downgrades.StrategyDowngradeWarning`, code AK4014) for each of its decisions
that no dispatch of the kernel honours on the library's target, once per (kernel, strategy, decision).
"""

from __future__ import annotations

import threading
import warnings
from typing import TYPE_CHECKING, Any

import torch

from arke import knobs
from arke.ir import strategy as sir
from arke.runtime.guards import cond_holds, dim_params, prepare_args
from arke.runtime.limits import count_writes, in_memory
from arke.runtime.pool import evict_oldest
from arke.targets import base as targets

if TYPE_CHECKING:
    from arke.api import Module
    from arke.targets.llvm.kernel import CPUKernel


def runnable_targets() -> tuple[str, ...]:
    """The targets that can run on this machine now (each target says: ``llvm`` always; ``triton``
    with the triton package and a CUDA GPU, or ``TRITON_INTERPRET=1``; ``mlir`` with IREE installed;
    ``cuda`` with a CUDA GPU and the driver bindings)."""
    return targets.runnable()


#: The runnable targets, as found when this module was imported (see :func:`runnable_targets`).
TARGETS_RUNNABLE = runnable_targets()


class Kernel:
    """A kernel of a built library: call it like the function it is."""

    def __init__(self, library: Library, name: str, ir_name: str):
        self.library, self.name, self.ir_name = library, name, ir_name
        # Looked up once: calls are the hot path.
        self.function = library.module.semantic.get(ir_name)
        self._strategies = library.module.strategies.for_kernel(ir_name, library.target)
        self._tuned: list[sir.Strategy] = []  # strategies from the tuning database (variants after the source's)
        self._tuned_at: dict[str, int] = {}  # dims bucket -> variant (-1: the defaults)
        self._variants: dict[int, CPUKernel] = {}
        self._lock = threading.Lock()
        params = self.function.params
        as_dims = dim_params(self.function)
        # the fast path applies when the tensor (and dim) parameters come first (positional calls fill them)
        lead = [p.name for p in params if p.type.rank or p.name in as_dims]
        leading = [p.name for p in params[:len(lead)]]
        self._tensor_params = lead if leading == lead else []
        self._dim_slots = frozenset(k for k, n in enumerate(self._tensor_params) if n in as_dims)
        self._scalar_params = [p.name for p in params if not p.type.rank]
        self._calls: dict[tuple[Any, ...], tuple[dict[str, int], CPUKernel, dict[str, Any]]] = {}

    def __repr__(self) -> str:
        return f"<arke kernel {self.name} ({self.library.target})>"

    def strategies(self) -> tuple[sir.Strategy, ...]:
        return self._strategies

    def variant(self, index: int) -> CPUKernel:
        """The compiled form for strategy ``index`` (-1: no strategy, the defaults)."""
        with self._lock:
            if index not in self._variants:
                every = (*self.strategies(), *self._tuned)
                strategy = every[index] if index >= 0 else None
                try:
                    reported = warn_unhonoured(self.library, self.name, self.ir_name, strategy) \
                        if strategy is not None else set()
                    self._variants[index] = _compile(self.library, self.ir_name, strategy)
                    if strategy is not None:
                        warn_schedule_notes(self.name, self._variants[index], reported)
                except Exception as err:
                    if index < len(self.strategies()):  # the source's own strategy (or the defaults): its error
                        raise
                    # a record of the tuning database this build cannot compile: the defaults run, said once
                    warnings.warn(f"kernel `{self.name}`: the tuning database's strategy for it does not build here "
                                  f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); it runs "
                                  "its defaults (rerun `akc tune`, or build with tuning='off')", RuntimeWarning,
                                  stacklevel=3)
                    self._variants[index] = _compile(self.library, self.ir_name, None)
            return self._variants[index]

    def choose(self, dims: dict[str, int]) -> int:
        """The strategy in force for a call with these dims (-1: none, the defaults)."""
        for k, s in enumerate(self.strategies()):
            if s.when is None or cond_holds(self.name, "a strategy's `when` clause", s.when, dims):
                return k
        if self._strategies or self.library.tuning == "off":
            return -1
        return self._tuned_variant(dims)

    def _tuned_variant(self, dims: dict[str, int]) -> int:
        """The variant of the strategy ``akc tune`` confirmed for these dims' bucket here, else -1."""
        from arke.tune.db import bucket
        from arke.tune.lookup import tuned_strategy

        key = repr(sorted(bucket(dims).items()))
        if key not in self._tuned_at:
            lib = self.library
            found = tuned_strategy(lib.module.semantic, self.ir_name, lib.target, dims, lib.arch, lib.device)
            with self._lock:
                if found is not None:
                    self._tuned.append(found)
                self._tuned_at[key] = len(self._strategies) + len(self._tuned) - 1 if found is not None else -1
        return self._tuned_at[key]

    def __call__(self, *arrays: Any, threads: int | None = None, out: Any = None, **scalars: Any) -> Any:
        """Check the call (shapes, dtypes, `where` clauses, ``out=``) before anything runs, then run it.

        Decode calls the same kernel on the same shapes again and again, so a call whose
        arguments are CPU torch tensors (scalars left at their defaults) is keyed by the
        tensors' shapes and dtypes (and the values of dim parameters, given as Python ints): a
        signature that passed every check before maps straight to its dims, strategy variant and
        scalars (the checks depend on nothing else).
        """
        key = self._signature(arrays) if not scalars else None
        if key is not None:
            hit = self._calls.get(key)
            if hit is not None:
                dims, variant, defaults = hit
                args = {n: a for k, (n, a) in enumerate(zip(self._tensor_params, arrays)) if k not in self._dim_slots}
                args.update(defaults)
                result = variant.run_prepared(args, dims, False, threads, out)
                return result if out is None else _written(result)
        args, dims, any_torch = prepare_args(self.function, arrays, scalars, keep_device=not self.library.on_host)
        variant = self.variant(self.choose(dims))
        if key is not None:
            if len(self._calls) >= 64:  # a bounded memo: shapes that keep changing fall back to full checks
                evict_oldest(self._calls)
            self._calls[key] = (dims, variant, {n: args[n] for n in self._scalar_params})
        result = variant.run_prepared(args, dims, not any_torch, threads, out)
        return result if out is None else _written(result)

    def _signature(self, arrays: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The shapes, dtypes and device of a call that fills exactly the tensor parameters with plain (dense)
        tensors with data on one device (the CPU for a target that runs on the host)."""
        if len(arrays) != len(self._tensor_params):
            return None
        key: list[Any] = []
        where = None
        for k, a in enumerate(arrays):
            if k in self._dim_slots:  # a dim parameter: a different value is a different signature
                if type(a) is not int or a < 1:
                    return None
                key.append(a)
                continue
            if (type(a) is not torch.Tensor or a.requires_grad or a.is_nested or a.layout != torch.strided
                    or a.is_neg() or not in_memory(a)):
                return None  # (a lazily negated view is resolved by the full checks, which refuse the others)
            if where is None:
                where = a.device
                if where.type != "cpu" and (self.library.on_host or where.type == "meta"):
                    return None
            elif a.device != where:
                return None
            key.append((a.shape, a.dtype))
        return (where, *key)

    def source(self) -> str:
        """The target source of the variant a call runs when no ``when`` clause decides (``akc build --emit
        source``): the first strategy without one, else the defaults."""
        return self.variant(next((k for k, s in enumerate(self.strategies()) if s.when is None), -1)).artifact.source


class GenericKernel:
    """A generic kernel of a built library (language spec §5.6): each call's dtypes pick a specialisation,
    a :class:`Kernel` of its own (compiled, cached and memoised per specialisation)."""

    def __init__(self, library: Library, name: str, ir_name: str):
        self.library, self.name, self.ir_name = library, name, ir_name
        self.generic = library.module.generics[ir_name]
        self._members: dict[str, Kernel] = {}
        self._by_dtypes: dict[tuple[Any, ...], Kernel] = {}  # torch dtypes of the binding arguments -> member
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<arke generic kernel {self.name} where {self.generic.constraint()} ({self.library.target})>"

    def member(self, ir_name: str) -> Kernel:
        """The specialisation with this IR name, built once."""
        with self._lock:
            found = self._members.get(ir_name)
            if found is None:
                found = self._members[ir_name] = Kernel(self.library, self.name, ir_name)
            return found

    def specialise(self, **dtypes: str) -> Kernel:
        """The specialisation for these dtypes (``W="bf16"``); a ValueError names the sets."""
        from arke.lang.generics import by_names

        return self.member(by_names(self.library.module.generics, self.ir_name, dtypes))

    def __call__(self, *arrays: Any, threads: int | None = None, out: Any = None, **scalars: Any) -> Any:
        """Bind the dtype variables from the arguments (a GuardError naming the set for a dtype outside it,
        before anything runs), then call that specialisation."""
        key = None
        if len(arrays) > max(i for _, _, i, _ in self.generic.vars):
            key = tuple(getattr(arrays[i], "dtype", None) for _, _, i, _ in self.generic.vars)
            hit = self._by_dtypes.get(key)
            if hit is not None:
                return hit(*arrays, threads=threads, out=out, **scalars)
        from arke.runtime.generics import pick

        kernel = self.member(pick(self.generic, arrays, scalars))
        if key is not None and all(isinstance(k, torch.dtype) for k in key):
            self._by_dtypes[key] = kernel
        return kernel(*arrays, threads=threads, out=out, **scalars)


class Library:
    """The kernels of a module built for one target: ``lib.rmsnorm(x, w)`` or ``lib.kernels["rmsnorm"]``.

    ``device``: where the mlir target runs its kernels, ``"cpu"`` (default) or ``"cuda"`` (an
    NVIDIA GPU); every other target takes only ``"cpu"`` (triton and cuda pick their device
    themselves). ``arch``: the GPU architecture of the ``cuda`` target (default: the device's), or
    ``"sm_80"``/``"sm_90"`` to run the ``llvm`` target's GPU flavour on an NVIDIA GPU.
    """

    def __init__(self, module: Module, target: str, threads: int | None, device: str = "cpu",
                 arch: str | None = None, tuning: str = "on"):
        from arke.runtime.host import run_threads
        from arke.runtime.limits import MAX_THREADS

        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                    or not 1 <= threads <= MAX_THREADS):
            raise ValueError(f"threads must be a whole number from 1 to {MAX_THREADS}, or None for every core, "
                             f"not {threads!r}")
        if tuning not in ("on", "off"):
            raise ValueError(f"tuning is 'on' (use akc tune's records) or 'off', not {tuning!r}")
        self.tuning = tuning
        found = targets.get(target)  # an unknown name: a ValueError naming the targets
        arch = found.check_options(device, arch)  # a ValueError saying which values it takes
        found.require(device, arch)  # a ValueError saying what to install or do
        self.module, self.target, self.threads, self.device = module, target, run_threads(threads), device
        #: no thread count given (nor ARKE_THREADS): host kernels follow torch.get_num_threads() at each call
        self.follows_torch = threads is None and knobs.threads() is None
        self.arch, self.backend = arch, found
        #: whether kernels run on this CPU (arguments are moved there; no device is kept)
        self.on_host = found.on_host(device, arch)
        self.kernels: dict[str, Kernel | GenericKernel] = {
            name: GenericKernel(self, name, ir_name) if ir_name in module.generics else Kernel(self, name, ir_name)
            for name, ir_name in module.kernel_map.items()}

    def __getattr__(self, name: str) -> Kernel | GenericKernel:
        kernels = self.__dict__.get("kernels", {})
        if name in kernels:
            return kernels[name]
        raise AttributeError(f"no kernel `{name}` in this library; it has: {', '.join(kernels)}")

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *self.kernels]


def warn_unhonoured(library: Library, name: str, ir_name: str, strategy: sir.Strategy) -> set[tuple[str, str | None]]:
    """Warn (AK4014) for each decision of ``strategy`` that no dispatch of the kernel honours on the
    library's target and architecture (the checker reports the ones it can know as diagnostics too);
    the (kind, subject) of each decision warned about."""
    from arke.targets.downgrades import StrategyDowngradeWarning, unhonoured

    reported = set()
    for found in unhonoured(library.backend, library.module.semantic, ir_name, strategy, library.arch, name):
        warnings.warn(StrategyDowngradeWarning(found), stacklevel=4)
        reported.add((found.decision.kind, found.decision.subject))
    return reported


def _written(result: Any) -> Any:
    """``out=`` (``result``) after a kernel wrote it, its writes counted (:func:`~arke.runtime.limits.count_writes`)."""
    count_writes(result if isinstance(result, tuple) else (result,))
    return result


def warn_schedule_notes(name: str, compiled: Any, reported: set[tuple[str, str | None]]) -> None:
    """Warn (AK4013, as ``akc build`` prints it) for each decision the target's schedule could not express and
    no AK4014 named already: a safety net for what only the rendered ops show (the MLIR transform script's notes,
    in the artifact), so no decision is dropped silently where the target's ``honoured`` did not foresee it."""
    import json

    from arke.targets.downgrades import StrategyDowngradeWarning

    artifact = getattr(compiled, "artifact", None)
    for note in json.loads(artifact.meta.get("notes", "[]")) if artifact is not None else []:
        if (note["decision"], note.get("subject")) not in reported:
            warnings.warn(StrategyDowngradeWarning(f"AK4013: kernel `{name}`: {note['message']}"), stacklevel=4)


def _compile(library: Library, ir_name: str, strategy: sir.Strategy | None) -> CPUKernel:
    """Compile one variant through the library's target (which plans, renders, compiles and caches)."""
    # threads=0: no count was given, so a host kernel follows torch.get_num_threads() at each call
    threads = 0 if library.follows_torch else library.threads
    compiled: CPUKernel = library.backend.build_kernel(library.module.semantic, ir_name, strategy, threads=threads,
                                                       device=library.device, arch=library.arch)
    return compiled
