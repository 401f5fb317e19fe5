"""StrategyIR: how to run a kernel, as a closed vocabulary of decisions.

A :class:`Strategy` attaches decisions to (kernel, target, optional ``when`` condition on
the kernel's dims). Decisions never change what a program computes: every target must
give the reference interpreter's answer under any legal strategy.

The vocabulary is :data:`DECISIONS`: each entry says whether the decision names indices
(``tile i = 128, j = 64``) or operands (``pack w``) or takes one value (``warps = 8``),
and which values are legal; the targets say which decisions they honour.
"""

from __future__ import annotations

from dataclasses import dataclass

from arke.ir.semantic import Cond

ALGORITHMS = ("materialized", "flash", "split_kv")


@dataclass(frozen=True)
class DecisionSpec:
    """The rules of one decision kind.

    ``subject``: ``"index"`` (items name kernel indices), ``"operand"`` (items name tensor
    parameters) or ``"none"`` (a single value). ``values``: ``"none"`` (no value allowed),
    ``"pos"`` (integer >= 1), ``"pow2"`` (a power of two), ``"split"`` (integer >= 2) or
    ``"enum"`` (one of ``choices``). Where it has an effect is each target's to say
    (:attr:`arke.targets.base.Target.honours`).
    """

    name: str
    subject: str
    values: str
    meaning: str
    choices: tuple[str, ...] = ()
    maximum: int | None = None
    value_required: bool = True


DECISIONS: dict[str, DecisionSpec] = {
    d.name: d
    for d in (
        DecisionSpec("tile", "index", "pos", "block the loop over the index into tiles of this size"),
        DecisionSpec("vectorize", "index", "pow2", "vector width (lanes) along the index", maximum=64),
        DecisionSpec("unroll", "index", "pos", "unroll the loop over the index by this factor", maximum=64),
        DecisionSpec("parallel", "index", "pos",
                     "run the index's iterations on several workers (optional value: number of chunks)",
                     value_required=False),
        DecisionSpec("split", "index", "split",
                     "split a reduced index into this many chunks combined in a fixed order"),
        DecisionSpec("threads", "none", "pos", "number of CPU worker threads", maximum=1024),
        DecisionSpec("warps", "none", "pow2", "warps per GPU program", maximum=32),
        DecisionSpec("stages", "none", "pos", "software-pipelining stages of GPU loads", maximum=8),
        DecisionSpec("algorithm", "none", "enum", "lowering algorithm of the kernel's attention core",
                     choices=ALGORITHMS),
        DecisionSpec("pack", "operand", "none", "repack the operand into panels once, before the loops",
                     value_required=False),
    )
}


@dataclass(frozen=True)
class Decision:
    """One decision: ``kind`` from :data:`DECISIONS`; ``subject`` an index or operand name
    (None for whole-kernel decisions such as ``warps``); ``value`` its argument, if any."""

    kind: str
    subject: str | None
    value: int | str | None


@dataclass(frozen=True)
class Strategy:
    """Decisions for ``kernel`` on ``target`` (None: every target), when ``when`` holds (None: always)."""

    kernel: str
    target: str | None
    when: Cond | None
    decisions: tuple[Decision, ...]

    def get(self, kind: str, subject: str | None = None) -> Decision | None:
        for d in self.decisions:
            if d.kind == kind and d.subject == subject:
                return d
        return None


@dataclass(frozen=True)
class StrategySet:
    """All the strategies of a module, in source order (the first whose ``when`` holds wins)."""

    strategies: tuple[Strategy, ...] = ()

    def for_kernel(self, kernel: str, target: str) -> tuple[Strategy, ...]:
        return tuple(s for s in self.strategies if s.kernel == kernel and s.target in (None, target))
