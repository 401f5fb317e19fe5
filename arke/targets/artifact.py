"""What every target's renderer shares: the artifact it produces and the renderer's base class.

A renderer is pure: it turns a :class:`~arke.plan.dispatch.KernelPlan` into text (an
:class:`Artifact`) and never runs a compiler; compiling, caching and launching sit beside it in
its target's folder, behind :class:`arke.targets.base.Target` (where the registry is too).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from arke.lang.recursion import deep_recursion

if TYPE_CHECKING:
    from arke.plan.dispatch import KernelPlan


@dataclass(frozen=True)
class LaunchSpec:
    """How the runtime runs one dispatch: its entry symbol and the axis split over workers.

    ``parallel_extent`` is the dim expression (text, over the kernel's dim symbols) of the
    range ``[0, n)`` that the entry's ``lo``/``hi`` arguments cut into static chunks, or
    None when the dispatch runs whole on one worker. The entry's arguments are the
    ``buffers``, the dims array, ``lo``, ``hi``, an error word and a scratch pointer.
    """

    entry: str
    parallel_extent: str | None
    buffers: tuple[int, ...] = ()  # the plan's buffers the entry takes, in order
    scratch: str | None = None  # 8-byte elements of scratch memory each worker needs (a dim expression)
    #: GPU targets: the launch grid, one dim expression (over the plan's dims) per grid axis
    grid: tuple[str, ...] = ()
    #: GPU targets: compile-time constants and launch options (``BLOCK_N``, ``num_warps``, ``num_stages``)
    options: tuple[tuple[str, int], ...] = ()
    #: GPU targets: constants set at each launch to the power of two (at least 16) that covers a dim
    #: expression (a head dim), so one block spans it; ``options`` holds the value ahead-of-time
    #: compiles use. The JIT compiles once per value.
    covers: tuple[tuple[str, str], ...] = ()
    #: GPU targets: the ``options`` a strategy decision set (or ``covers`` sets at launch), which a fit
    #: step never changes (spec/codegen.md §9.5)
    fixed: tuple[str, ...] = ()


@dataclass(frozen=True)
class Artifact:
    """A rendered kernel: the source text and one launch per dispatch, in order."""

    target: str
    source: str
    launches: tuple[LaunchSpec, ...]
    meta: dict[str, str] = field(default_factory=dict)


class UnsupportedError(NotImplementedError):
    """A plan uses something a renderer cannot express (named like JAX's lowering errors).

    ``code`` is the diagnostic a strategy decision behind it gets (spec/diagnostics.md): ``AK4004``
    for a value the target cannot lower, ``AK4012`` for tiles, warps or stages that need more
    registers or shared memory than the GPU has; None where no decision is to blame (an op the
    target has no form for). The message then starts with the code; ``detail`` is the rest."""

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code
        self.detail = message

    def __reduce__(self) -> tuple[Any, ...]:  # the code survives pickling (worker processes)
        return (_unsupported, (self.detail, self.code))


def _unsupported(message: str, code: str | None) -> UnsupportedError:
    return UnsupportedError(message, code=code)


#: The recursion limit while a renderer runs: emitters recurse along expression trees as deep as the checker
#: takes (``arke.lang.checker.MAX_EXPR_DEPTH``, 256 levels), up to four Python frames a level (the LLVM rows
#: emitter), beside the plan's own frames; Python's default of 1000 gave a RecursionError on such a kernel.
RENDER_RECURSION = 4000


def _deep(render: Callable[[Any, KernelPlan], Artifact]) -> Callable[[Any, KernelPlan], Artifact]:
    @functools.wraps(render)
    def run(self: Any, plan: KernelPlan) -> Artifact:
        with deep_recursion(RENDER_RECURSION):
            return render(self, plan)

    return run


class Renderer:
    """Base of every target's renderer: a name, capabilities, and ``render(plan)`` (each subclass's ``render``
    runs under :func:`~arke.lang.recursion.deep_recursion`)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "render" in cls.__dict__:
            cls.render = _deep(cls.__dict__["render"])  # type: ignore[method-assign,assignment]

    name: str = ""
    #: what the target can do natively (e.g. {"bf16", "fma"}), for plans and tests
    capabilities: frozenset[str] = frozenset()
    #: the fused families (``attention``, ``contraction``, ``rows``) whose dispatches this target
    #: renders; plans for it group ops only into these (the others stay one dispatch per op)
    families: frozenset[str] = frozenset({"attention", "contraction", "rows"})

    def render(self, plan: KernelPlan) -> Artifact:
        raise NotImplementedError
