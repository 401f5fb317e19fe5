"""THE tolerance rule: how far a compiled kernel's result may lie from the reference interpreter's,
per element, on every target and machine (tests hold every target to it; the tuner checks every
candidate with it before timing one). See :func:`tolerance`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from arke.ir import semantic as S
from arke.runtime import error_bound, interp


def results(value: Any) -> tuple[Any, ...]:
    """A kernel's results as a tuple (one result is not wrapped by a call)."""
    return value if isinstance(value, tuple) else (value,)


#: the smallest normal f32: the ``mlir`` target (IREE) flushes subnormal results to zero
FLUSHED = 2.0 ** -126

_ERROR_KERNELS: dict[tuple[int, str], tuple[Any, S.Module, str]] = {}


def _error_kernel(kernel: Any) -> tuple[S.Module, str]:
    """The kernel's error kernel (:func:`error_bound.error_kernel`), built once per process."""
    semantic = kernel.module.semantic
    key = (id(semantic), kernel.name)
    if key not in _ERROR_KERNELS:
        fn = kernel.function
        inputs = {p.type.dtype for p in fn.params if p.type.rank and p.type.dtype.is_float}
        tensor_cores = bool(inputs) and all(d in error_bound.MANTISSA for d in inputs)
        _ERROR_KERNELS[key] = (semantic, *error_bound.error_kernel(semantic, kernel.name, tensor_cores))
    return _ERROR_KERNELS[key][1:]


def tolerance(kernel: Any, args: Sequence[Any], scalars: Mapping[str, Any] | None = None
              ) -> tuple[torch.Tensor | None, ...]:
    """THE tolerance of every comparison of a compiled result with the interpreter's, on every
    target and machine: a bound per element of each float result (``None`` for integer and
    boolean results, which must be equal).

    It is derived from the case, never from a machine: ``kernel`` on ``args`` (and ``scalars``)
    is run by the interpreter as its *error kernel* (:mod:`error_bound`), which computes beside
    each value ``v`` a bound ``D(v)`` (in units of f32's roundoff ``u = 2**-24``) on how far any
    conforming implementation's ``v`` may lie from the interpreter's, through the kernel's own
    expressions and dtype chain:

    * a sum of ``n`` terms ``t`` adds ``2·LAMBDA·√n·Σ|t|`` (``LAMBDA = 2``): the magnitude of
      the values summed, not of the sum (Higham and Mary's probabilistic bound on a sum in any
      order, for each side), so large terms that cancel keep only their own precision;
    * an f32 operation adds 2 ulps of its result (a math function or a division
      ``2·LIBM_ULPS = 32``), and what its operands carry scaled by its derivative: ``exp``
      turns an argument's absolute error into a relative one, a small divisor amplifies;
    * a rounding to bf16 or f16 (a 16-bit value stored, a cast, a 16-bit result) gives the same
      value on both sides unless the f32 value lies within ``D`` of a rounding boundary, where
      it may land one 16-bit ulp away; tensor cores may round the f32 factor of a 16-bit
      product (spec/codegen.md §7) in a kernel whose float inputs are all 16-bit;

    and the bound of an element is ``u·D + FLUSHED`` (NaN where no bound could be had: then the
    element must be equal). It allows any order of the sums (vector lanes, threads, tiles,
    IREE's reassociation, MKL's blocking on one CPU or another), another libm and fused
    multiply-adds, so a case passes or fails alike on Intel and AMD and on every target; yet it
    is ~1e-6 relative for a short kernel, and a 16-bit result must be bit-equal wherever its
    f32 value is not near a rounding boundary: a wrong sign, a dropped term, a wrong scale, or a
    rounding missing or made another way is far outside it.
    """
    scalars = dict(scalars or {})
    module, name = _error_kernel(kernel)
    outs = results(interp.run(module, name, tuple(args), scalars))
    fn = kernel.function
    floats = [k for k, t in enumerate(fn.result_types) if t.dtype.is_float]
    values, errors = outs[:len(fn.results)], outs[len(fn.results):]
    assert len(errors) == len(floats), "the error kernel gives one bound per float result"
    assert same_bits(values, results(kernel(*args, **scalars))), f"{kernel.name}: the error kernel is not the kernel"
    bounds: list[torch.Tensor | None] = [None] * len(fn.results)
    for k, d in zip(floats, errors, strict=True):
        d = torch.as_tensor(d).double()
        bounds[k] = d * error_bound.U32 + FLUSHED  # NaN where no bound could be had: the element must be equal
    return tuple(bounds)


def within(g: torch.Tensor, w: torch.Tensor, bound: torch.Tensor | None, label: str) -> None:
    """Every element of ``g`` within ``bound`` of ``w``'s; NaN matches NaN, infinities match exactly."""
    assert bound is not None and bound.shape == w.shape, f"{label}: no bound of this result's shape"
    diff = (g - w).abs()
    ok = (g == w) | (g.isnan() & w.isnan()) | (torch.isfinite(w) & (diff <= bound))
    if bool(ok.all()):
        return
    bad = torch.nonzero(~ok)
    ratio = torch.where(ok, torch.zeros_like(diff), torch.nan_to_num(diff / bound, nan=math.inf, posinf=math.inf))
    worst = tuple(int(i) for i in torch.nonzero(ratio == ratio.max())[0])
    raise AssertionError(
        f"{label}: {len(bad)} of {w.numel()} elements outside the tolerance (arke.runtime.tolerance); "
        f"the worst at {list(worst)}: got {float(g[worst])!r}, the interpreter gives {float(w[worst])!r}, "
        f"|difference| {float(diff[worst]):.3g} against a bound of {float(bound[worst]):.3g}; "
        f"first elements outside: {bad[:5].tolist()}")




def same_bits(a: Any, b: Any) -> bool:
    """Whether two results are bit-identical (NaNs compared as bits too)."""
    for x, y in zip(results(a), results(b), strict=True):
        tx, ty = torch.as_tensor(x), torch.as_tensor(y)
        if tx.dtype != ty.dtype or tx.shape != ty.shape:
            return False
        if tx.is_floating_point():
            width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[tx.element_size()]
            tx, ty = tx.contiguous().view(width), ty.contiguous().view(width)
        if not torch.equal(tx, ty):
            return False
    return True


def check_results(got: Any, want: Any, bounds: Sequence[torch.Tensor | None]) -> None:
    """Raise AssertionError unless every result of ``got`` is the interpreter's ``want``: integers and booleans
    equal, floats within ``bounds`` (:func:`tolerance`; what the tuner checks each candidate with)."""
    for g, w, b in zip(results(got), results(want), bounds):
        gt, wt = torch.as_tensor(g), torch.as_tensor(w)
        if b is None or not gt.is_floating_point():
            if not torch.equal(gt, wt):
                raise AssertionError("an integer or boolean result differs from the interpreter's")
        else:
            within(gt.double(), wt.double(), b, "result")
