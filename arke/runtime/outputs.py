"""``out=``: the tensors a call writes its results into, checked before any kernel runs.

Every target's kernels take ``out=`` the same way: one tensor (or writable NumPy array) per
result, of the result's dtype and shape, contiguous, dense, on the device the kernel runs on,
and not overlapping an argument or another output (a failed check leaves every tensor
untouched). A NumPy ``out`` must be in native byte order with positive strides (it is written
in place, never through a copy).

A call that fails while it runs (a gather index out of range, an integer division by zero)
leaves ``out`` untouched too: a target writes ``out`` in place only when :func:`can_fail` says
the kernel cannot fail once it runs, and otherwise copies the results there after success.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sympy
import torch

from arke.ir import semantic as ir
from arke.ir.ranges import facts, in_range
from arke.ir.shapes import Dim, evaluate
from arke.runtime.guards import TORCH_DTYPES, GuardError
from arke.runtime.limits import check_tensor_kind, numpy_out

#: Integer operations a kernel checks as it runs (a zero divisor, a negative power, a shift count).
_CHECKED = frozenset({"div", "floordiv", "mod", "pow", "shl", "shr"})


def can_fail(fn: ir.Function, module: ir.Module | None = None) -> bool:
    """Whether ``fn`` may raise once it runs (conservatively): some load has a subscript that is not a
    plain index over the whole axis (nor a literal 0) nor proved in range (:func:`arke.ir.ranges.in_range`),
    or some integer division, modulo or power, here or in a kernel it calls. The targets check at most
    such subscripts and operations."""
    shapes: dict[str, Sequence[Dim]] = {p.name: p.type.shape for p in fn.params}
    known = facts(fn)
    for op in fn.ops:
        if isinstance(op, ir.CallOp):
            try:
                callee = module.get(op.callee) if module is not None else None
            except KeyError:
                callee = None
            if callee is None or can_fail(callee, module):
                return True
            shapes.update(zip(op.results, (t.shape for t in op.types), strict=True))
            continue
        reduce_axes = op.reduce_axes if isinstance(op, ir.ReduceOp | ir.ContractOp) else ()
        extents = {a.name: a.extent for a in (*op.axes, *reduce_axes)}
        body = ((op.lhs, op.rhs) if isinstance(op, ir.ContractOp) else op.exprs if isinstance(op, ir.ScanOp)
                else (op.body,))
        for e in (x for b in body for x in ir.walk(b)):
            if isinstance(e, ir.Load) and not _plain(e, extents, shapes.get(e.src), known):
                return True
            if isinstance(e, ir.Binary) and e.op in _CHECKED and not e.dtype.is_float and not _safe_shift(e):
                return True
        shapes[op.result] = tuple(a.extent for a in op.axes)
    return False


def _safe_shift(e: ir.Binary) -> bool:
    """A shift by a literal count in range (the checker's rule for literals): it cannot fail."""
    return e.op in ir.SHIFTS and isinstance(e.b, ir.Const) and 0 <= int(e.b.value) < e.dtype.bits


def _plain(load: ir.Load, extents: Mapping[str, Dim], shape: Sequence[Dim] | None,
           known: Mapping[sympy.Symbol, sympy.Expr]) -> bool:
    if shape is None or len(shape) != len(load.indices):
        return False
    for sub, d in zip(load.indices, shape, strict=True):
        if isinstance(sub, ir.Const) and not sub.dtype.is_float and sub.value == 0:
            continue
        if not (isinstance(sub, ir.Idx) and sub.name in extents
                and sympy.sympify(extents[sub.name]) == sympy.sympify(d)) and not in_range(sub, d, extents, known):
            return False
    return True


def check_out(fn: ir.Function, out: Any, dims: dict[str, int], args: dict[str, torch.Tensor],
              device: torch.device | None = None) -> dict[str, list[torch.Tensor]]:
    """The ``out=`` tensors by result name, after checking kind, shape, dtype, device, layout and overlap.

    ``device`` is where the kernel runs (the CPU unless a GPU runtime says otherwise).
    """
    where = device if device is not None else torch.device("cpu")
    import numpy as np

    outs = tuple(out) if isinstance(out, tuple | list) else (out,)
    if len(outs) != len(fn.results):
        raise GuardError(fn.name, f"out= needs {len(fn.results)} tensor{'s' if len(fn.results) > 1 else ''}, "
                         f"one per result, but {len(outs)} were given", rule="arity", param="out")
    given: dict[str, list[torch.Tensor]] = {}
    for k, (name, rtype, o) in enumerate(zip(fn.results, fn.result_types, outs)):
        what = f"out[{k}]" if len(outs) > 1 else "out"
        if isinstance(o, np.ndarray):
            o = numpy_out(fn.name, what, o, str(rtype.dtype))
        if not isinstance(o, torch.Tensor):
            raise GuardError(fn.name, f"{what} must be a tensor or NumPy array, not {type(o).__name__}",
                             rule="type", param="out")
        want = TORCH_DTYPES[rtype.dtype]
        if o.dtype != want:
            raise GuardError(fn.name, f"{what} is {str(o.dtype).removeprefix('torch.')}, but the result is "
                             f"{rtype.dtype}", rule="dtype", param="out")
        shape = tuple(evaluate(d, dims) for d in rtype.shape)
        if tuple(o.shape) != shape:
            raise GuardError(fn.name, f"{what} has shape {list(o.shape)}, but the result has {list(shape)}",
                             rule="dim", param="out")
        if o.device != where:
            raise GuardError(fn.name, f"{what} is on {o.device}, but the kernel runs on {where}", rule="device",
                             param="out")
        check_tensor_kind(fn.name, what, "out", o)
        if not o.is_contiguous():
            raise GuardError(fn.name, f"{what} must be a contiguous tensor (write into a fresh one, then copy)",
                             rule="dim", param="out")
        for other in [*args.values(), *(t for ts in given.values() for t in ts)]:
            if _overlap(o, other):
                raise GuardError(fn.name, f"{what} overlaps an argument or another output", rule="dim",
                                 param="out")
        given.setdefault(name, []).append(o)
    return given


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    a1, b1 = a0 + a.numel() * a.element_size(), b0 + b.numel() * b.element_size()
    return a0 < b1 and b0 < a1
