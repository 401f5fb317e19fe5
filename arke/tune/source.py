"""Tuned strategies written as ``.ak`` source (``akc tune --write FILE``): ordinary ``@strategy``
blocks a person can read, review and commit, so a deployment is reproducible without the database
and its numerics do not change with the tuner's luck (vllm#42425)."""

from __future__ import annotations

from collections.abc import Mapping

from arke.ir import strategy as sir
from arke.tune.db import bucket


def when_of(dims: Mapping[str, int]) -> str:
    """The ``when`` clause of a dims bucket: each dim in ``(b / 2, b]`` of its power-of-two bucket ``b``."""
    parts = []
    for name, top in bucket(dims).items():
        parts.append(f"{name} == 1" if top == 1 else f"{name} > {top // 2} and {name} <= {top}")
    return " and ".join(parts)


def expressible(subject: str | None) -> bool:
    """Whether a decision on ``subject`` can be written in source (an index or operand name; not an unnamed
    intermediate's position, nor an index of a kernel written without named ones, as ``a @ b``)."""
    return subject is None or (subject.isidentifier() and not subject.startswith("_"))


def decision_source(d: sir.Decision) -> str:
    """One decision as the language writes it (``tile m = 8``, ``pack b``, ``threads = 2``)."""
    if d.subject is None:
        return f"{d.kind} = {d.value}"
    return f"{d.kind} {d.subject}" if d.value is None else f"{d.kind} {d.subject} = {d.value}"


def strategy_block(kernel: str, target: str, strategy: sir.Strategy, dims: Mapping[str, int],
                   comment: str = "") -> str:
    """``@strategy(kernel, target = T, when <bucket>) { ... }`` for a tuned strategy."""
    lines = [f"# {comment}"] if comment else []
    lines.append(f"@strategy({kernel}, target = {target}, when {when_of(dims)}) {{")
    lines += [f"  {decision_source(d)}" for d in strategy.decisions]
    lines.append("}")
    return "\n".join(lines) + "\n"
