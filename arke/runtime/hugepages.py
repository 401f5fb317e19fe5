"""Large CPU tensors on transparent huge pages: the storage of the weights and KV caches decode streams.

Decode reads every weight once per token, at the memory's speed; on 4 KB pages that stream takes
a TLB miss every 4 KB and the hardware prefetchers stop at every page boundary. Linux maps memory
that asks for it (``madvise(MADV_HUGEPAGE)``, honoured in the kernel's default ``madvise`` mode
of ``/sys/kernel/mm/transparent_hugepage/enabled``) with 2 MB pages. On a 2-core Xeon VM a plain
read of 1 GiB ran at 18.8 GB/s on 4 KB pages and 23.4 GB/s on huge ones; GPT-2's decode step,
weights on huge pages, took 40.7 ms against 44.5 ms (the same process, steps interleaved).

* :func:`weight` — for tensors that live as long as a model: carved from shared 2 MB-aligned
  chunks (64-byte aligned, a chunk unmapped when the last tensor in it is freed), so a matrix of
  2.4 MB does not hold a second, mostly empty, huge page of its own.
* :func:`buffer` — for tensors made and dropped over and over (KV caches): a mapping of its own
  when large enough that rounding up to whole huge pages wastes little; else torch's memory.

Both fall back to ``torch.empty`` for small tensors, on systems without ``MADV_HUGEPAGE`` (or
where the kernel refuses it), and under ``ARKE_NO_HUGEPAGES=1``; results are the same either way.
Only pages that are touched take memory.
"""

from __future__ import annotations

import mmap
import threading

import torch

_HUGE = 2 << 20
#: Weights at least this large go to the shared chunks (smaller ones: torch's allocator).
WEIGHT_MIN = 256 << 10
#: Size of a shared chunk; a weight over half of it gets a mapping of its own.
CHUNK = 64 << 20
#: A buffer gets its own mapping when rounding it up to huge pages adds at most this fraction.
WASTE = 1 / 16

_lock = threading.Lock()
_chunk: tuple[mmap.mmap, int, int] | None = None  # the open chunk: mapping, first aligned offset, bytes used


def enabled() -> bool:
    """Whether huge pages are asked for here (Linux's ``MADV_HUGEPAGE``, not turned off)."""
    from arke import knobs

    return hasattr(mmap, "MADV_HUGEPAGE") and not knobs.no_hugepages()


def _nbytes(shape: tuple[int, ...] | list[int] | torch.Size, dtype: torch.dtype) -> int:
    count = 1
    for s in shape:
        count *= int(s)
    return count * dtype.itemsize


def _mapping(nbytes: int) -> tuple[mmap.mmap, int] | None:
    """An anonymous mapping of ``nbytes`` rounded up to huge pages, advised huge, and the offset of its
    first 2 MB boundary; None where the system will not give one."""
    size = -(-nbytes // _HUGE) * _HUGE
    try:
        area = mmap.mmap(-1, size + _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        area.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError):
        return None
    start = torch.frombuffer(area, dtype=torch.uint8, count=1).data_ptr()
    return area, (-start) % _HUGE


def _view(area: mmap.mmap, offset: int, shape: tuple[int, ...] | list[int] | torch.Size,
          dtype: torch.dtype, nbytes: int) -> torch.Tensor:
    # the tensor holds the mapping (through the buffer it was made from) for as long as it lives
    flat = torch.frombuffer(area, dtype=torch.uint8, count=nbytes, offset=offset)
    return flat.view(dtype).view(tuple(shape))


def weight(shape: tuple[int, ...] | list[int] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor for a long-lived weight (see the module docstring)."""
    global _chunk
    nbytes = _nbytes(shape, dtype)
    if nbytes < WEIGHT_MIN or not enabled():
        return torch.empty(tuple(shape), dtype=dtype)
    if nbytes > CHUNK // 2:
        return buffer(shape, dtype, waste=1.0)
    with _lock:
        if _chunk is None or _chunk[2] + nbytes > CHUNK:
            made = _mapping(CHUNK)
            if made is None:
                return torch.empty(tuple(shape), dtype=dtype)
            _chunk = (made[0], made[1], 0)
        area, first, used = _chunk
        _chunk = (area, first, used + -(-nbytes // 64) * 64)
    return _view(area, first + used, shape, dtype, nbytes)


def buffer(shape: tuple[int, ...] | list[int] | torch.Size, dtype: torch.dtype,
           waste: float = WASTE) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor on a mapping of its own when rounding it up to huge pages
    adds at most ``waste`` of its size (and it is at least one huge page); else torch's memory."""
    nbytes = _nbytes(shape, dtype)
    rounded = -(-nbytes // _HUGE) * _HUGE
    if nbytes < _HUGE or rounded - nbytes > waste * nbytes or not enabled():
        return torch.empty(tuple(shape), dtype=dtype)
    made = _mapping(nbytes)
    if made is None:
        return torch.empty(tuple(shape), dtype=dtype)
    return _view(made[0], made[1], shape, dtype, nbytes)


def weight_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU copy of ``t`` made by :func:`weight`."""
    out = weight(t.shape, t.dtype)
    out.copy_(t)
    return out


def zeros(shape: tuple[int, ...] | list[int] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """:func:`buffer`, zeroed."""
    out = buffer(shape, dtype)
    out.zero_()
    return out
