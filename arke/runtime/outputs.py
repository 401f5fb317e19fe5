"""``out=``: the tensors a call writes its results into, checked before any kernel runs.

Every target's kernels take ``out=`` the same way: one tensor (or writable NumPy array) per
result, of the result's dtype and shape, contiguous, on the device the kernel runs on, and not
overlapping an argument or another output (a failed check leaves every tensor untouched).
"""

from __future__ import annotations

from typing import Any

import torch

from arke.ir import semantic as ir
from arke.ir.shapes import evaluate
from arke.runtime.guards import TORCH_DTYPES, GuardError


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
            if not o.flags.writeable:
                raise GuardError(fn.name, f"{what} is a read-only array", rule="type", param="out")
            o = torch.from_numpy(o) if o.dtype.kind in "biuf" else o
        if not isinstance(o, torch.Tensor):
            raise GuardError(fn.name, f"{what} must be a tensor or NumPy array, not {type(o).__name__}",
                             rule="type", param="out")
        want = TORCH_DTYPES[rtype.dtype]
        if o.dtype != want:
            raise GuardError(fn.name, f"{what} is {o.dtype}, but the result is {rtype.dtype}", rule="dtype",
                             param="out")
        shape = tuple(evaluate(d, dims) for d in rtype.shape)
        if tuple(o.shape) != shape:
            raise GuardError(fn.name, f"{what} has shape {list(o.shape)}, but the result has {list(shape)}",
                             rule="dim", param="out")
        if o.device != where:
            raise GuardError(fn.name, f"{what} is on {o.device}, but the kernel runs on {where}", rule="device",
                             param="out")
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
