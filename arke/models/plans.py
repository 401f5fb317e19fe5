"""Whole-layer plans: the ``@strategy`` blocks a decoder layer's kernels run by, per call shape.

A plan is ordinary ``.ak`` source over ``std.decoder``: for one call shape (a batch and a token
count), one block per kernel the layer calls, conditioned on that call's dims bucket
(``when N > 64 and N <= 128 and …``, :func:`arke.tune.source.when_of`), so plans for several
shapes sit side by side and a call outside every bucket runs the defaults. A block with no
decision pins a kernel to its defaults at that shape (a plan that kept the defaults says so,
rather than letting anything else decide there). :func:`arke.models.tune` measures plans on
complete layer calls (:mod:`arke.tune.layer`); a layer built on this machine uses the confirmed
plan from the tuning database unless it is given one (``plan=``) or ``tuning="off"``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arke.ir import strategy as sir

#: What a plan's source starts with: its blocks name std.decoder's kernels.
HEADER = "import std.decoder\n"


@dataclass(frozen=True)
class Dispatch:
    """One kernel call of a layer call shape: what a plan's block for it names and is conditioned on."""

    tag: str  # the layer's step (attn_in, attn, attn_out, mlp, moe_route, moe_combine, ...)
    kernel: str  # the kernel's name in std.decoder (a generic kernel's own name: blocks name it)
    name: str  # the kernel the step calls (a specialisation: ``mlp__W_f32``)
    ir_name: str
    dims: dict[str, int]


def dispatches(layer: Any, batch: int, tokens: int) -> list[Dispatch]:
    """The tunable kernel calls of a ``layer`` call with ``batch`` sequences of ``tokens`` tokens (the
    experts of a mixture are left out: their row counts change with every call's routing). Calls of one
    kernel in one dims bucket (a half layer's two norms) are one: a block serves them both."""
    from arke.models.calls import KernelCall
    from arke.tune.source import when_of

    names = {ir: n for n, ir in layer.module.kernel_map.items()}
    out, seen = [], set()
    for tag, call, tensors, scalars in layer._steps(batch, tokens):
        if not isinstance(call, KernelCall) or tag == "experts":
            continue
        kernel, dims = call.kernel, call.dims(tensors, scalars)
        if (kernel.name, when_of(dims)) in seen:
            continue
        seen.add((kernel.name, when_of(dims)))
        out.append(Dispatch(tag, kernel.name, names[kernel.ir_name], kernel.ir_name, dims))
    return out


def block(dispatch: Dispatch, target: str, decisions: Sequence[sir.Decision]) -> str:
    """The plan's block for one dispatch: its decisions, at its dims bucket, on ``target``."""
    from arke.tune.source import decision_source, when_of

    body = "".join(f"  {decision_source(d)}\n" for d in decisions)
    return f"@strategy({dispatch.kernel}, target = {target}, when {when_of(dispatch.dims)}) {{\n{body}}}\n"


def strategies(source: str, path: str = "<layer plan>") -> tuple[sir.Strategy, ...]:
    """The strategies of plan source (its blocks, with or without :data:`HEADER`): a ValueError with the
    checker's diagnostics where it has errors, or where it holds anything but strategy blocks."""
    import arke

    text = source if source.lstrip().startswith("import") else HEADER + source
    try:
        module = arke.loads(text, path=path)
    except Exception as err:
        raise ValueError(f"the layer plan {path} has errors:\n{err}") from None
    own = [n for n in module.kernel_map if not module.kernel_map[n].startswith("std.")]
    if own:
        raise ValueError(f"the layer plan {path} defines kernels ({', '.join(own)}); a plan holds @strategy "
                         "blocks for std.decoder's kernels only")
    return module.strategies.strategies


def resolve(plan: str | Path | Sequence[sir.Strategy] | None) -> tuple[sir.Strategy, ...]:
    """A ``plan=`` argument as strategies: source text, a ``.ak`` file of blocks, or strategies as they are."""
    if plan is None:
        return ()
    if isinstance(plan, Path) or (isinstance(plan, str) and plan.strip().endswith(".ak") and "\n" not in plan.strip()):
        file = Path(plan)
        if not file.is_file():
            raise ValueError(f"{plan}: no such plan file")
        return strategies(file.read_text(encoding="utf-8"), str(file))
    if isinstance(plan, str):
        return strategies(plan)
    return tuple(plan)


def identity(config: Any, kind: str, act: str) -> str:
    """The tuning database's key for a layer's plans: its sizes, weight kind and activation dtype (the
    kernels' own IR and arke's source are in the key's versions)."""
    from arke.tune.db import LAYER_PREFIX
    from arke.tune.machine import digest

    return LAYER_PREFIX + digest({"config": dataclasses.asdict(config), "weights": kind, "act": act})[:26]


def spec(layer: Any) -> dict[str, Any]:
    """What the measuring worker needs to build a layer like ``layer`` (with random weights of its shapes)."""
    return {"config": dataclasses.asdict(layer.config), "weights": layer.kind, "act": str(layer.act_dtype),
            "target": layer.target, "max_seq": layer.max_seq, "threads": layer.threads}


def tuned(config: Any, kind: str, act: str, target: str, device: str = "cpu") -> tuple[sir.Strategy, ...]:
    """The confirmed plans of every call shape tuned for such a layer on this machine, one after another
    (their dims buckets are disjoint); () where none was, or the database cannot be read."""
    from arke.tune.lookup import tuned_plan

    return tuned_plan(identity(config, kind, act), target, device)


def describe(plan: Sequence[sir.Strategy]) -> str:
    """A plan's strategies in the IR's text form (one per line)."""
    from arke.ir.text import print_strategy

    return "\n".join(print_strategy(s) for s in plan)

