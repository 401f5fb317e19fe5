"""IR-to-IR passes on SemanticIR, run before a kernel is partitioned into dispatches.

Each pass is a pure function that never changes meaning: the reference interpreter gives
the same answer before and after (see each module for the exact guarantee). The pipeline
is a straight list of named steps, run in order by :func:`run_passes`:

=========  ===================================================================
inline     every kernel call replaced by the callee's body (:mod:`.inline`)
unroll     reductions over a few literal-extent terms written out as maps (:mod:`.unroll`)
fuse       elementwise producers folded into their readers (:mod:`.fuse`)
argreduce  ``argmax``/``argmin`` lowered to a ``max``/``min`` and a ``min`` of positions (:mod:`.argreduce`)
topk       top-k selections lowered to rounds of a ``max``/``min`` and a ``min`` of positions (:mod:`.topk`),
           except those the target selects natively (``keep_topk``)
dce        unread ops removed, values renumbered ``%0, %1, …`` (:mod:`.dce`)
=========  ===================================================================

``run_passes(module, name, verify_each=True)`` checks the IR after every step with
:func:`arke.ir.verify.verify`; ``trace=`` (or ``ARKE_DEBUG_PASSES=1`` in the environment)
prints the IR after every step, each headed by the step's name.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from arke import knobs
from arke.ir import semantic as S
from arke.ir.text import print_function
from arke.ir.verify import IRVerifyError, verify
from arke.passes.argreduce import lower_arg_reductions
from arke.passes.dce import dead_code
from arke.passes.fuse import fuse_elementwise
from arke.passes.inline import inline_all, inline_calls
from arke.passes.topk import lower_topk
from arke.passes.unroll import unroll_small_reductions

#: A step of the pipeline: the kernel so far and the module it came from (for its callees) -> the new kernel.
Pass = Callable[[S.Function, S.Module], S.Function]
#: Called after each step with the step's name and the kernel it produced.
Trace = Callable[[str, S.Function], None]

#: The environment switch that prints the IR after each step (like ``trace=print_trace``).
DEBUG_ENV = "ARKE_DEBUG_PASSES"


def _inline(fn: S.Function, module: S.Module) -> S.Function:
    return inline_calls(module, fn.name)


def _unroll(fn: S.Function, module: S.Module) -> S.Function:
    return unroll_small_reductions(fn)


def _fuse(fn: S.Function, module: S.Module) -> S.Function:
    return fuse_elementwise(fn)


def _argreduce(fn: S.Function, module: S.Module) -> S.Function:
    return lower_arg_reductions(fn)


def _topk(fn: S.Function, module: S.Module) -> S.Function:
    return lower_topk(fn)


def _dce(fn: S.Function, module: S.Module) -> S.Function:
    return dead_code(fn)


PIPELINE: tuple[tuple[str, Pass], ...] = (
    ("inline", _inline),
    ("unroll", _unroll),
    ("fuse", _fuse),
    ("argreduce", _argreduce),
    ("topk", _topk),
    ("dce", _dce),
)


def print_trace(step: str, fn: S.Function) -> None:
    """The default trace: the kernel's IR text after ``step``, on stderr."""
    print(f"# ---- after {step}\n{print_function(fn)}", file=sys.stderr)


def debug_passes() -> bool:
    """Whether ``ARKE_DEBUG_PASSES`` asks for the IR after each step (see ``arke.knobs``)."""
    return knobs.debug_passes()


def run_passes(module: S.Module, name: str, *, verify_each: bool = False, trace: Trace | None = None,
               keep_topk: Callable[[S.ReduceOp], bool] | None = None) -> S.Function:
    """Kernel ``name`` of ``module`` after every step of :data:`PIPELINE`, in order.

    The result calls nothing, so it stands alone: ``Module((fn,))`` is a valid module.
    With ``verify_each`` the IR is verified after each step (as a module of that one
    kernel, or of it and its callees while it still calls them); a broken invariant raises
    :class:`~arke.ir.verify.IRVerifyError` naming the step. ``trace`` is called after each
    step; without one, ``ARKE_DEBUG_PASSES=1`` selects :func:`print_trace`. ``keep_topk``: the top-k
    selections the target selects natively (``arke.plan.topk.native_form``), left unlowered.
    """
    if trace is None and debug_passes():
        trace = print_trace
    fn = module.get(name)
    for step, run in PIPELINE:
        fn = lower_topk(fn, keep_topk) if step == "topk" and keep_topk is not None else run(fn, module)
        if verify_each:
            _verify_step(step, fn, module)
        if trace is not None:
            trace(step, fn)
    return fn


def _verify_step(step: str, fn: S.Function, module: S.Module) -> None:
    calls = any(isinstance(op, S.CallOp) for op in fn.ops)
    context = S.Module(tuple(f if f.name != fn.name else fn for f in module.functions)) if calls else S.Module((fn,))
    try:
        verify(context)
    except IRVerifyError as err:
        raise IRVerifyError([f"after pass `{step}`: {p}" for p in err.problems]) from err


__all__ = ["DEBUG_ENV", "PIPELINE", "Pass", "Trace", "dead_code", "fuse_elementwise", "inline_all", "inline_calls",
           "lower_arg_reductions", "lower_topk", "print_trace", "run_passes", "unroll_small_reductions"]
