"""The strategy variants of a kernel: the plans its calls may use on a target.

A module may give a kernel several strategies for a target (each perhaps with a ``when``
condition on the dims); a call uses the first whose condition holds, else the defaults.
:func:`variants` lists them all, so ``akc build`` compiles (and checks) every plan a call
could run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from arke.api import Module
    from arke.ir import strategy as sir


def variants(module: Module, ir_name: str, target: str) -> list[tuple[str, sir.Strategy | None]]:
    """(label, strategy) of each variant a call of kernel ``ir_name`` may use on ``target``."""
    return strategy_variants(module.strategies.for_kernel(ir_name, target))


def strategy_variants(strategies: Sequence[sir.Strategy]) -> list[tuple[str, sir.Strategy | None]]:
    """(label, strategy) of each variant: every strategy, then the defaults unless a strategy without
    ``when`` always applies."""
    out: list[tuple[str, sir.Strategy | None]] = [(f"strategy {k + 1}" if len(strategies) > 1 else "strategy", s)
                                                  for k, s in enumerate(strategies)]
    if not any(s.when is None for s in strategies):
        out.append(("defaults", None))
    return out
