"""Reuse of a kernel's buffers across calls: results nobody holds any more, temporaries, scratch.

On this kind of machine the first write to each fresh page of a new tensor is a page fault:
filling a new 64 MiB output costs ~15 ms, three times what softmax itself takes. Decode and
benchmark loops call the same kernel on the same shapes again and again, so a kernel keeps
the buffers it allocated and hands one out again once it is provably unshared:

* its Python object is referenced only by the pool (``sys.getrefcount``),
* no other tensor object shares its ``TensorImpl`` (``Tensor._use_count``: DLPack exports,
  C++ holders), and
* no other tensor, view or NumPy array shares its storage (the storage's use count), and nobody
  holds the storage's Python object (``y.untyped_storage()``, ``y.storage()``).

A result the caller still holds (directly, as a view, or as the NumPy array it was returned
as) is therefore never overwritten. ``ARKE_NO_REUSE=1`` turns reuse off.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
from typing import Any

import torch

from arke import knobs
from arke.runtime.errors import GuardError

#: Tensors kept per (shape, dtype): enough for a result, a temporary and a call in flight.
KEEP = 4
#: (shape, dtype) keys kept: shapes that keep changing (prefill at many lengths) must not pin
#: memory for as long as the kernel lives; the least recently offered shapes go first.
SHAPES = 16


def _unshared(t: torch.Tensor) -> bool:
    # references: the pool's list, this frame's argument, getrefcount's own argument
    if sys.getrefcount(t) > 3 or t._use_count() != 1:  # type: ignore[attr-defined]
        return False
    storage = t.untyped_storage()
    # torch keeps one Python object per storage, referenced from the storage itself: a caller holding
    # `y.untyped_storage()` (or `y.storage()`) holds that object, which the storage's use count does not show
    # (references when nobody does: the storage's, `storage`, getrefcount's argument)
    if sys.getrefcount(storage) > 3:
        return False
    return int(torch._C._storage_Use_Count(storage._cdata)) <= 2  # the tensor and that Python object


def evict_oldest(memo: dict[Any, Any]) -> None:
    """Drop a memo's oldest entry; calls from several threads may race here, harmlessly."""
    with contextlib.suppress(RuntimeError, StopIteration):  # resized under us, or emptied by another thread
        memo.pop(next(iter(memo)), None)


def _calibrated() -> bool:
    """Whether :func:`_unshared` tells a held tensor from a free one on this Python and torch.

    The reference counts it reads are CPython and torch details (a Python that borrows
    references could report fewer); if they do not behave as expected, reuse is off.
    """
    try:
        held = torch.empty(1)
        pool = [held]
        if _unshared(pool[0]):  # `held` still refers to it: must read as shared
            return False
        stored = [torch.empty(1)]
        storage = stored[0].untyped_storage()
        if _unshared(stored[0]):  # its storage's Python object is held: must read as shared
            return False
        del storage
        free = [torch.empty(1)]
        return _unshared(free[0])  # only the list refers to it: must read as unshared
    except (AttributeError, RuntimeError):  # a torch without these introspection hooks
        return False


class BufferPool:
    """Free tensors by (shape, dtype); ``take`` one (or a new one), ``give`` it back after use."""

    def __init__(self, kernel: str = "") -> None:
        self.kernel = kernel  # whose buffers (an allocation that fails names it)
        self._free: dict[tuple[tuple[int, ...], torch.dtype], list[torch.Tensor]] = {}
        self._lock = threading.Lock()
        self.enabled = not knobs.no_reuse() and _calibrated()  # read when the kernel is built

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An unshared tensor of this shape and dtype (contents undefined)."""
        if self.enabled:
            with self._lock:
                free = self._free.get((shape, dtype), [])
                for k in range(len(free)):
                    if _unshared(free[k]):
                        return free.pop(k)
        try:
            return torch.empty(shape, dtype=dtype)
        except RuntimeError as err:  # torch's allocator: "can't allocate memory"
            nbytes = math.prod(shape) * dtype.itemsize
            raise GuardError(self.kernel, f"a result or buffer of shape {list(shape)} needs {nbytes / 2**30:.1f} GiB, "
                             f"more than this machine could allocate ({str(err).splitlines()[0]}); call it on "
                             "smaller inputs", rule="size") from None

    def give(self, t: torch.Tensor) -> None:
        """Offer ``t`` for reuse once nothing else holds it (the oldest offers are dropped first)."""
        if not self.enabled:
            return
        key = (tuple(t.shape), t.dtype)
        with self._lock:
            free = self._free.pop(key, [])  # re-inserted last: the dict is in least-recent order
            self._free[key] = free
            if not any(x is t for x in free):
                free.append(t)
                del free[:-KEEP]
            while len(self._free) > SHAPES:
                del self._free[next(iter(self._free))]
