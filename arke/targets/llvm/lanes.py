"""Float reductions in a fixed order with vector accumulators, for the LLVM target.

A reduction's result may not depend on how LLVM vectorised it, nor on the thread count
(README: "bit-identical for any number of threads"). Rather than let the loop vectorizer
reassociate a scalar accumulator (``reassoc``: an order chosen by LLVM, which may differ
between two loops of the same kernel), the order is written out in the IR: ``L`` lanes of
accumulators, one ``<L x float>`` value that lives in vector registers, each lane adding its
own terms in sequence, folded pairwise at the end. LLVM only vectorises the loop that computes
a block's ``L`` terms, which reorders nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from arke.ir.dtypes import DType
from arke.targets.llvm.lib import identity

if TYPE_CHECKING:
    from arke.targets.llvm.function import LLVMFunction


@dataclass(frozen=True)
class LaneSum:
    """One float reduction for :func:`lane_loops`: ``term`` emits one term (the loops' axes are
    set), ``name`` tells its accumulators apart."""

    name: str
    kind: str
    dtype: DType
    term: Callable[[], str]


def lane_loops(fn: LLVMFunction, names: Sequence[str], sums: Sequence[LaneSum]) -> list[str]:
    """Float reductions over ``names`` in a fixed order with vector accumulators; their values.

    Term ``j`` of the innermost axis goes to accumulator ``j % L`` (L = ``fn.lanes``), each
    accumulator adding its terms in order (outer axes first, as in the loop nest); then the
    accumulators are folded pairwise (halves of the vector combined, down to one lane). The
    accumulators are one ``<L x float>`` value, so they stay in vector registers; a block's
    terms are computed by a plain loop over its L lanes (which LLVM vectorises, or not: the
    order of every combine is fixed by this IR alone), so a result depends neither on how
    LLVM compiled it nor on the thread count. Several reductions may share the loops: each
    still sees its terms in the same order.
    """
    width = fn.lanes
    vec = f"<{width} x float>"
    tag = sums[0].name if sums else f"{fn.n}"
    lane, block, last = f"%lane.{tag}", f"%block.{tag}", names[-1]  # loop names no IR axis can have
    accs, terms = [f"%lanes.{s.name}" for s in sums], [f"%terms.{s.name}" for s in sums]
    for acc, row in zip(accs, terms):
        fn.prologue.append(f"  {acc} = alloca {vec}, align 64")  # only ever whole: a register
        fn.prologue.append(f"  {row} = alloca [{width} x float], align 64")

    def step(base: Callable[[], str], top: str | None = None) -> None:
        at = fn.let(f"add i64 {base()}, {fn.current[lane]}")
        if top is not None:  # the last block's spare lanes repeat the last term (their sums are dropped)
            inside = fn.let(f"icmp slt i64 {at}, {top}")
            at = fn.let(f"select i1 {inside}, i64 {at}, i64 {top}")
        fn.current[last] = at
        for s, row in zip(sums, terms):
            v = s.term()
            p = fn.let(f"getelementptr inbounds float, ptr {row}, i64 {fn.current[lane]}")
            fn.emit(f"store float {v}, ptr {p}")

    def add_block(left: str | None) -> None:
        """acc = combine(acc, terms), in the first ``left`` lanes only when given."""
        mask = ""
        if left is not None:
            count = fn.let(f"trunc i64 {left} to i32")
            one = fn.let(f"insertelement <{width} x i32> poison, i32 {count}, i64 0")
            splat = fn.let(f"shufflevector <{width} x i32> {one}, <{width} x i32> poison, "
                             f"<{width} x i32> zeroinitializer")
            mask = fn.let(f"icmp ult <{width} x i32> {_iota(width)}, {splat}")
        for s, acc, row in zip(sums, accs, terms):
            a = fn.let(f"load {vec}, ptr {acc}")
            t = fn.let(f"load {vec}, ptr {row}")
            c = fn.combine(s.kind, s.dtype, a, t, vec)
            if mask:
                c = fn.let(f"select <{width} x i1> {mask}, {vec} {c}, {vec} {a}")
            fn.emit(f"store {vec} {c}, ptr {acc}")

    def innermost() -> None:
        n = fn.dim(fn.extent[last])
        blocks = fn.let(f"udiv i64 {n}, {width}")

        def full() -> None:
            base = fn.let(f"mul i64 {fn.current[block]}, {width}")
            fn.loop(lane, "0", str(width), lambda: step(lambda: base))
            add_block(None)

        fn.loop(block, "0", blocks, full)
        tail = fn.let(f"mul i64 {blocks}, {width}")
        left = fn.let(f"sub i64 {n}, {tail}")

        def partial() -> None:
            # A whole block again, its indices clamped to the last term: a loop of `left` steps
            # would end in scalar code, or (for a plain copy) in a call of memcpy.
            top = fn.let(f"sub i64 {n}, 1")
            fn.loop(lane, "0", str(width), lambda: step(lambda: tail, top))
            add_block(left)

        _when(fn, fn.let(f"icmp sgt i64 {left}, 0"), partial)

    for s, acc in zip(sums, accs):
        fn.emit(f"store {vec} splat (float {identity(s.kind, s.dtype)}), ptr {acc}")
    fn.nest(list(names[:-1]), innermost)
    values = []
    for s, acc in zip(sums, accs):
        v, size = fn.let(f"load {vec}, ptr {acc}"), width
        while size > 1:
            half, ty = size // 2, f"<{size} x float>"
            lo = fn.let(f"shufflevector {ty} {v}, {ty} poison, <{half} x i32> {_iota(half)}")
            hi = fn.let(f"shufflevector {ty} {v}, {ty} poison, <{half} x i32> {_iota(half, half)}")
            v, size = fn.combine(s.kind, s.dtype, lo, hi, f"<{half} x float>"), half
        values.append(fn.let(f"extractelement <1 x float> {v}, i64 0"))
    return values


def _when(fn: LLVMFunction, cond: str, then: Callable[[], None]) -> None:
    """``then``'s code, run only where ``cond`` holds."""
    fn.loops_made += 1
    yes, done = f"if.{fn.loops_made}", f"fi.{fn.loops_made}"
    fn.emit(f"br i1 {cond}, label %{yes}, label %{done}")
    fn.label(yes)
    then()
    fn.emit(f"br label %{done}")
    fn.label(done)


def _iota(n: int, start: int = 0) -> str:
    """The constant vector ``<start, start + 1, ..., start + n - 1>`` of i32."""
    return "<" + ", ".join(f"i32 {start + k}" for k in range(n)) + ">"
