"""Kernel plans: a checked kernel, optimised and cut into dispatches, ready for any renderer.

``make_plan`` inlines calls and fuses elementwise producers (``arke.passes``), then cuts the
kernel's ops into dispatches. Each family's matcher may claim a run of consecutive ops as
one dispatch, tried in this order:

* ``attention`` (:mod:`arke.plan.attention`): scores, row max, exponentials, sums and the
  value contraction, recognised from plain math, become one dispatch whose scores and
  probabilities never reach memory;
* ``contraction`` (:mod:`arke.plan.contraction`): a matmul-like op, with the elementwise
  op that reads its result folded in as an epilogue;
* ``topk`` (:mod:`arke.plan.topk`): a top-k selection the target selects itself (where its
  families list ``topk``), its values and positions together;
* ``rows`` (:mod:`arke.plan.rows`): ops over the same leading rows (a norm's statistics
  and the map that uses them) run row by row in one pass over memory;

(before matching, an attention core's computed ``k`` factor is hoisted into a map of its own,
:mod:`arke.plan.prologue`, so it is evaluated once per key, not once per task and key tile)

and any op left is a dispatch of its own: a loop nest over the op's axes (and reduce axes); a
scan is a dispatch of its own (family ``scan``): its rows (the other axes) run in parallel, each
in sequence along the scanned axis.
The plan names every buffer and dim symbol in the order the runtime passes them, so
renderers and runtimes agree without re-deriving anything. Values that live only inside
one dispatch (a dispatch's ``internal`` values) get no buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from arke.ir import semantic as ir
from arke.ir import strategy as sir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim
from arke.passes.rewrite import op_exprs
from arke.plan.families import TOPK, family

#: An op a dispatch computes (calls are inlined before plans are made).
PlanOp = ir.MapOp | ir.ReduceOp | ir.ContractOp | ir.ScanOp


@dataclass(frozen=True)
class Buffer:
    """A tensor the kernel touches. ``role``: ``param``, ``temp`` or ``result``."""

    name: str
    dtype: DType
    shape: tuple[Dim, ...]
    role: str


@dataclass(frozen=True)
class Dispatch:
    """One launch: the ops it computes, its family, and the axis split across workers (None: not split).

    ``op`` is the op whose domain the dispatch covers (the last of ``ops``); ``ops`` every op it
    computes, in order (empty means just ``op``); ``pattern`` the family matcher's description
    (a :class:`~arke.plan.contraction.Contraction`, an attention match ...); ``internal``
    the values computed inside the dispatch that never reach a buffer.
    """

    op: PlanOp
    family: str
    parallel: str | None
    ops: tuple[PlanOp, ...] = ()
    pattern: object | None = None
    internal: tuple[str, ...] = ()

    @property
    def members(self) -> tuple[PlanOp, ...]:
        """Every op of the dispatch, in order."""
        return self.ops or (self.op,)


@dataclass(frozen=True)
class KernelPlan:
    """Everything a renderer needs for one kernel on one target."""

    name: str
    function: ir.Function
    dims: tuple[str, ...]
    buffers: tuple[Buffer, ...]
    dispatches: tuple[Dispatch, ...]
    decisions: tuple[sir.Decision, ...] = ()
    #: the strategy's ``when`` condition (None: always); a target may specialise dims it fixes
    when: ir.Cond | None = None
    #: launch options a GPU target's fit step chose where the strategy left them free, as
    #: ``(entry, option, value)`` (the Triton target's ``BLOCK_N``, ``num_warps`` ...: spec/codegen.md §9.5)
    fitted: tuple[tuple[str, str, int], ...] = ()

    def buffer_index(self, name: str) -> int:
        for k, b in enumerate(self.buffers):
            if b.name == name:
                return k
        raise KeyError(name)

    def fitted_option(self, entry: str, option: str) -> int | None:
        """The value the fit step chose for launch option ``option`` of ``entry``, if it chose one."""
        return next((v for e, o, v in self.fitted if e == entry and o == option), None)

    def decision(self, kind: str, subject: str | None = None) -> sir.Decision | None:
        """The strategy's decision of ``kind`` (on ``subject``), if it made one."""
        for d in self.decisions:
            if d.kind == kind and d.subject == subject:
                return d
        return None


#: A family matcher: (kernel, its ops, where to start, strategy) -> a dispatch made of
#: ``ops[start:start + len(members)]``, or None when the family does not apply there.
Matcher = Callable[[ir.Function, list[PlanOp], int, "sir.Strategy | None"], "Dispatch | None"]


def matchers(families: frozenset[str] | None = None, paged: bool = False) -> tuple[Matcher, ...]:
    """The family matchers (see :func:`named_matchers`), in the order they are tried."""
    return tuple(m for _, m in named_matchers(families, paged))


def named_matchers(families: frozenset[str] | None = None, paged: bool = False) -> tuple[tuple[str, Matcher], ...]:
    """The family matchers (of ``families``, default all; the contraction's takes several reduce axes
    where ``families`` holds :data:`~arke.plan.contraction.BATCH_REDUCE`), in the order tried; ``paged``:
    attention may read k/v through a block table and be bounded by a length (:mod:`arke.plan.paged`)."""
    from functools import partial

    from arke.plan.attention import match_attention
    from arke.plan.contraction import BATCH_REDUCE, INT8_CONTRACTION, match_contraction
    from arke.plan.rows import match_rows
    from arke.plan.topk import match_topk

    attention: Matcher = partial(match_attention, paged=True) if paged else match_attention
    # a sum over several reduce axes is a contraction only where the renderer loops over the extra ones
    # ... and an int8 × int8 → i32 sum only where the renderer names the form (its CPU has the unit)
    contraction: Matcher = partial(match_contraction, batch_reduce=families is None or BATCH_REDUCE in families,
                                   integer=families is not None and INT8_CONTRACTION in families)
    # a kept top-k comes before rows: a rows group must never take one (it has no generic form)
    found = (("attention", attention), ("contraction", contraction), (TOPK, match_topk), ("rows", match_rows))
    return tuple((f, m) for f, m in found if families is None or f in families)


def make_plan(module: ir.Module, name: str, strategy: sir.Strategy | None = None,
              families: frozenset[str] | None = None, bounded: bool = False,
              paged: bool | None = None) -> KernelPlan:
    """The plan of kernel ``name`` (calls inlined, elementwise producers fused, ops grouped into
    the fused ``families`` a target renders: by default all of them). ``bounded``: the target's
    loops stop at a reduction's length (spec/language.md §8.11); otherwise bounded reductions are
    planned as masked ones (:mod:`arke.passes.limits`). ``paged`` (default: ``bounded``): its
    attention family reads k/v through a block table and bounds the keys by a length
    (:mod:`arke.plan.paged`); without ``bounded`` the attention cores keep their lengths (the
    renderer honours them) and every other bounded reduction is masked."""
    from arke.passes import run_passes
    from arke.passes.limits import mask_limits, masked

    paged = bounded if paged is None else paged
    native = None
    if families is not None and TOPK in families:  # the target selects these top-k's itself
        from arke.plan.topk import native_form

        native = native_form
    fn = run_passes(module, name, keep_topk=native)
    if not bounded and not paged:
        fn = mask_limits(fn)
    ops: list[PlanOp] = []
    for op in fn.ops:
        if isinstance(op, ir.CallOp):  # run_passes inlines every call
            raise ValueError(f"{name}: a call of `{op.callee}` survived inlining")
        ops.append(op)
    if families is None or "attention" in families:
        from arke.plan.prologue import hoist_key_prologues

        fn, ops = hoist_key_prologues(fn, ops, strategy)
    # the ops the other families see: lengths masked unless the target's loops stop at them (one
    # for one, so a position names the same op in both lists)
    bounded_ops = any(isinstance(op, ir.ReduceOp) and op.limits for op in ops)
    plain = ops if bounded or not bounded_ops else [masked(op) if isinstance(op, ir.ReduceOp) and op.limits else op
                                                    for op in ops]
    plain_fn = fn if plain is ops else replace(fn, ops=tuple(plain))
    dispatches: list[Dispatch] = []
    k = 0
    found = named_matchers(families, paged=paged)
    while k < len(ops):
        d = None
        if not isinstance(ops[k], ir.ScanOp):  # a scan is always a dispatch of its own
            for f, match in found:
                # attention first with its lengths (a paged renderer honours them), then as masked
                if f == "attention" and plain is not ops:
                    d = match(fn, ops, k, strategy)
                d = d or match(plain_fn, plain, k, strategy)
                if d is not None:
                    break
        if d is None:
            d = Dispatch(plain[k], family(plain[k]), parallel_axis(plain[k], strategy))
        dispatches.append(d)
        k += len(d.members)
    if plain is not ops:  # the plan's function holds the ops its dispatches run
        fn = replace(fn, ops=tuple(op for d in dispatches for op in d.members))
    results = set(fn.results)
    internal = {v for d in dispatches for v in d.internal} - results
    buffers = [Buffer(p.name, p.type.dtype, p.type.shape, "param") for p in fn.params]
    buffers += [Buffer(op.result, op.dtype, op.type.shape, "result" if op.result in results else "temp")
                for op in ops if op.result not in internal]
    dims = tuple(dict.fromkeys(b.dim for b in fn.bindings))
    return KernelPlan(name, fn, dims, tuple(buffers), tuple(dispatches),
                      strategy.decisions if strategy else (), strategy.when if strategy else None)


def parallel_axis(op: PlanOp, strategy: sir.Strategy | None) -> str | None:
    """The axis split across workers: the strategy's `parallel` index if this op has it, else its
    outermost axis. Reduce axes (and a scan's axis) are never split, so results do not depend on the thread count."""
    names = [a.name for a in op.axes if not (isinstance(op, ir.ScanOp) and a.name == op.axis)]
    if strategy is not None:
        for d in strategy.decisions:
            if d.kind == "parallel" and d.subject in names:
                return d.subject
    return names[0] if names else None


def readers(ops: list[PlanOp], value: str) -> list[PlanOp]:
    """The ops that load ``value``."""
    return [op for op in ops if any(isinstance(x, ir.Load) and x.src == value for e in op_exprs(op)
                                    for x in ir.walk(e))]
