"""What a call may hand a kernel beyond its signature: ``threads=``, and tensors of kinds a kernel cannot read.

* :func:`check_threads`: ``threads=`` is None or a whole number from 1 to :data:`MAX_THREADS`
  (a request: a target starts no more workers than :func:`arke.runtime.host.worker_limit`
  and than a launch has chunks; results do not depend on it).
* :func:`check_tensor_kind`: tensors are dense (strided) and hold data (not on the meta device, not a
  ZeroTensor, every element inside the tensor's storage).
* :func:`refuse_huge_broadcast`: a target whose kernels read dense memory copies a non-contiguous
  input first; a broadcast (stride-0) view that would grow beyond :data:`BROADCAST_COPY_LIMIT`
  bytes is refused instead of silently materialised.
* :func:`count_writes`: ``out=`` tensors a kernel wrote in place have their writes counted, as torch's own
  out= ops count theirs.

Each problem is a :class:`~arke.runtime.errors.GuardError` naming the kernel, the parameter and
what to do.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from arke.runtime.errors import GuardError

#: The most workers a call may ask for with ``threads=`` (the range of a strategy's ``threads``).
MAX_THREADS = 1024
#: The most bytes a target expands a broadcast (stride-0) input into when its kernels need it dense.
BROADCAST_COPY_LIMIT = 1 << 30


def check_threads(kernel: str, threads: Any) -> int | None:
    """A call's ``threads=``: None (the kernel's default) or a whole number from 1 to :data:`MAX_THREADS`.

    Anything else is a :class:`GuardError` (``threads``). A valid count is a request: a target
    starts no more workers than a launch has chunks or than a few per core (results do not depend
    on it), see :func:`arke.runtime.host.worker_limit`.
    """
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral):
        raise GuardError(kernel, f"threads= must be a whole number from 1 to {MAX_THREADS}, or None for the "
                         f"default, but was given {threads!r} ({type(threads).__name__})", rule="threads",
                         param="threads")
    value = int(threads)
    if not 1 <= value <= MAX_THREADS:
        raise GuardError(kernel, f"threads={value} is outside 1 .. {MAX_THREADS}; give a worker count in that "
                         "range (more than the machine's cores buys nothing), or None for the default",
                         rule="threads", param="threads")
    return value


def check_tensor_kind(kernel: str, what: str, param: str, t: torch.Tensor) -> None:
    """A tensor a kernel reads or writes must be dense (strided) and hold data (not on the meta device); one it
    writes (``param`` ``"out"``) must not be a view with torch's negative bit (its memory holds the values'
    negations: an argument with it is resolved by :func:`resolved`)."""
    if t.is_nested:
        raise GuardError(kernel, f"{what} is a nested tensor, but kernels take dense (strided) tensors; pass "
                         "`.to_padded_tensor(0.0)` or its components one by one", rule="type", param=param)
    if param == "out" and t.requires_grad and torch.is_grad_enabled():
        raise GuardError(kernel, f"{what} requires grad, and a kernel writes it outside autograd (as torch refuses an "
                         "in-place write to such a tensor); pass one that does not, or call under `torch.no_grad()`",
                         rule="type", param=param)
    if param == "out" and t.is_neg():
        raise GuardError(kernel, f"{what} is a view with torch's negative bit set (as `.conj().imag` makes): its "
                         "memory holds the negated values; write into a fresh tensor, then copy", rule="type",
                         param=param)
    if t.layout != torch.strided:
        layout = str(t.layout).removeprefix("torch.")
        raise GuardError(kernel, f"{what} is a {layout} tensor, but kernels take dense (strided) tensors; "
                         "convert it with `.to_dense()`", rule="type", param=param)
    if t.device.type == "meta":
        raise GuardError(kernel, f"{what} is on the meta device, which holds no values; pass a tensor with data "
                         "(on the CPU, or on the device the kernel runs on)", rule="device", param=param)
    _check_memory(kernel, what, param, t)


def in_memory(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements lie inside memory it holds: a kernel reads and writes raw memory, and a storage
    torch shrank (``untyped_storage().resize_(0)``) or never allocated (a ZeroTensor) would be read out of
    bounds. Cheap for a contiguous tensor (the calls' fast path checks every argument with it)."""
    if t._is_zerotensor():  # its storage claims its bytes at address 0
        return not t.numel()
    held = t.untyped_storage().nbytes()
    if held >= t.nbytes and not t.storage_offset() and t.is_contiguous():
        return True
    return not t.numel() or held >= _end(t) * t.element_size()


def _end(t: torch.Tensor) -> int:
    """One past the last element ``t`` reaches in its storage (in elements)."""
    return int(t.storage_offset()) + 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True) if n > 1)


def _check_memory(kernel: str, what: str, param: str, t: torch.Tensor) -> None:
    """:func:`in_memory`, or a :class:`GuardError` saying what to pass instead."""
    if in_memory(t):
        return
    if t._is_zerotensor():
        raise GuardError(kernel, f"{what} is one of torch's ZeroTensors, which hold no memory; pass "
                         "`torch.zeros_like(...)` (a tensor with memory) instead", rule="type", param=param)
    held, end = t.untyped_storage().nbytes(), _end(t) * t.element_size()
    raise GuardError(kernel, f"{what} has elements outside its storage ({held} bytes for elements up to byte "
                     f"{end}: the storage was resized after the tensor was made); pass a tensor whose "
                     "storage holds it (`.clone()` of one that does)", rule="size", param=param)


def resolved(t: torch.Tensor) -> torch.Tensor:
    """``t`` with torch's lazy negation applied (``.conj().imag`` of a complex tensor is a view whose memory holds
    the negated values: a kernel reading raw memory would see the wrong signs)."""
    return t.resolve_neg() if t.is_neg() else t


def refuse_huge_broadcast(kernel: str, name: str, t: torch.Tensor) -> None:
    """Raise :class:`GuardError` (``size``) before a target copies a broadcast view ``t`` into more than
    :data:`BROADCAST_COPY_LIMIT` bytes (an ``expand()`` of 2**31 elements would become gigabytes)."""
    nbytes = t.numel() * t.element_size()
    if nbytes <= BROADCAST_COPY_LIMIT or t.is_contiguous():
        return
    axes = [k for k, (n, st) in enumerate(zip(t.shape, t.stride(), strict=True)) if st == 0 and n > 1]
    if not axes:
        return
    raise GuardError(kernel, f"parameter `{name}` is a broadcast view (stride 0 on axis {axes[0]}) of shape "
                     f"{list(t.shape)}; the kernel reads dense memory, and the copy would take "
                     f"{nbytes / 2**30:.1f} GiB (arke expands broadcasts of at most "
                     f"{BROADCAST_COPY_LIMIT / 2**30:g} GiB by itself); pass `{name}.contiguous()` to make that "
                     "copy yourself, or a smaller tensor", rule="size", param=name)


def numpy_in(kernel: str, name: str, a: Any) -> torch.Tensor:
    """A NumPy argument as a CPU tensor, sharing its memory where torch can (a kernel only reads its
    arguments): a read-only array (``np.broadcast_to``'s) is not copied, so a broadcast goes through
    :func:`refuse_huge_broadcast` like torch's ``expand()``; negative strides and a foreign byte order
    are copied, a broadcast among them only below :data:`BROADCAST_COPY_LIMIT` bytes."""
    import warnings

    import numpy as np

    if any(st < 0 for st in a.strides) or not a.dtype.isnative:
        nbytes = a.size * a.itemsize
        if nbytes > BROADCAST_COPY_LIMIT and any(st == 0 and n > 1 for n, st in zip(a.shape, a.strides)):
            axis = next(k for k, (n, st) in enumerate(zip(a.shape, a.strides)) if st == 0 and n > 1)
            raise GuardError(kernel, f"parameter `{name}` is a broadcast view (stride 0 on axis {axis}) of shape "
                             f"{list(a.shape)}; the copy would take {nbytes / 2**30:.1f} GiB (arke expands "
                             f"broadcasts of at most {BROADCAST_COPY_LIMIT / 2**30:g} GiB by itself); pass "
                             f"`np.ascontiguousarray({name})` to make that copy yourself, or a smaller array",
                             rule="size", param=name)
        a = np.array(a, dtype=a.dtype.newbyteorder("="))
    if a.flags.writeable:
        return torch.from_numpy(a)
    with warnings.catch_warnings():  # torch warns that it cannot mark the tensor read-only: kernels never write it
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)


def numpy_out(kernel: str, what: str, o: Any, result: str) -> torch.Tensor:
    """A NumPy ``out`` as a tensor sharing its memory, or a GuardError saying why it cannot be written
    (``result``: the result's dtype, as the message names it)."""
    if not o.flags.writeable:
        raise GuardError(kernel, f"{what} is a read-only array", rule="type", param="out")
    if o.dtype.kind not in "biuf":
        raise GuardError(kernel, f"{what} is a NumPy array of {o.dtype}, but the result is {result}",
                         rule="dtype", param="out")
    if not o.dtype.isnative:
        raise GuardError(kernel, f"{what} is a NumPy array in non-native byte order ({o.dtype.str}); results are "
                         "written in place in the machine's order: pass `np.empty(shape, dtype)` (or "
                         "`a.astype(a.dtype.newbyteorder('='))`) and convert afterwards", rule="dtype", param="out")
    if any(st < 0 for st in o.strides):
        raise GuardError(kernel, f"{what} is a NumPy view with negative strides (strides {list(o.strides)}); pass a "
                         "contiguous array (write into a fresh one, then copy)", rule="dim", param="out")
    return torch.from_numpy(o)


def count_writes(tensors: Any) -> None:
    """``out=`` tensors a kernel wrote in place, behind torch's back: each one's version counter moves on, as
    after torch's own out= ops, so what keys on it (autograd's checks, a compiled graph's packed copy of a
    weight) sees the write. NumPy arrays and anything else are left alone."""
    for t in tensors:
        if isinstance(t, torch.Tensor):
            torch.autograd.graph.increment_version(t)
