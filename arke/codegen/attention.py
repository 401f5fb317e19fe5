"""Family matcher: attention (being built)."""

from __future__ import annotations

from arke.codegen.plan import Dispatch, PlanOp
from arke.ir import semantic as ir
from arke.ir import strategy as sir


def match_attention(fn: ir.Function, ops: list[PlanOp], start: int, strategy: sir.Strategy | None) -> Dispatch | None:
    """Not recognised yet: every op stays with the generic loop nest."""
    return None
