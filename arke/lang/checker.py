"""The checker: names, indices, extents, dtypes, where clauses, calls and strategies.

(Under construction: for now it only parses.)
"""

from __future__ import annotations

from dataclasses import dataclass

from arke.ir import semantic
from arke.ir.strategy import StrategySet
from arke.lang.diagnostics import Diagnostic
from arke.lang.parser import parse


@dataclass(frozen=True)
class CheckResult:
    """What checking a file produced: its diagnostics and, when lowered and clean, its IR."""

    diagnostics: tuple[Diagnostic, ...]
    semantic: semantic.Module | None = None
    strategies: StrategySet | None = None
    kernel_names: tuple[str, ...] = ()


def check_text(text: str, path: str, lower: bool = False) -> CheckResult:
    """Check one file's text (and what it imports). With ``lower``, also build its SemanticIR."""
    module, diags = parse(text, path)
    return CheckResult(tuple(diags), None, None, tuple(k.name for k in module.kernels))
