"""Dead-code elimination: drop the ops whose values nothing reads, then number the rest densely.

Every op is pure (maps, reductions, contractions, and calls of kernels made of them), so an
op none of whose results is read by a later op or returned computes nothing observable.
Removing it can make the ops it read dead in turn; one backward sweep finds them all.
After removal, op results are renamed ``"0"``, ``"1"``, … in order (parameters keep their
names), which keeps the printed IR stable whatever earlier passes removed.

One effect that is not kept: a removed op's run-time checks (an out-of-range gather, an
integer division by zero) no longer raise.
"""

from __future__ import annotations

from dataclasses import replace

from arke.ir import semantic as S
from arke.passes.rewrite import op_uses, renumber, result_names


def dead_code(fn: S.Function) -> S.Function:
    """``fn`` without the ops whose results are never used, its op results renumbered densely."""
    live = set(fn.results)
    kept: list[S.Op] = []
    for op in reversed(fn.ops):
        if any(r in live for r in result_names(op)):
            kept.append(op)
            live.update(op_uses(op))
    return renumber(replace(fn, ops=tuple(reversed(kept))))
