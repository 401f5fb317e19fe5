"""Weights repacked once into the contraction kernels' panels (``pack w``), and the registry of
tensors that already are (so a call passes them straight to the packed micro-kernel)."""

from __future__ import annotations

import weakref

import torch

#: Weights packed into panels (see :func:`register_panels`): data pointer -> (the tensor, nr).
_PANELS: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}


def register_panels(view: torch.Tensor, nr: int) -> None:
    """Declare ``view`` (an f32 ``[N, K]`` tensor whose storage holds ``ceil(N / nr)`` panels of
    ``[K][nr]``) as a prepacked contraction operand: a dispatch that can read panels (a
    contraction whose ``B`` is the parameter ``w[n, k]``, see ``llvm_gemm``) reads them in place;
    any other dispatch given it is refused, since its elements are not in ``[N, K]`` order."""
    _PANELS[view.data_ptr()] = (weakref.ref(view), nr)


def pack_panels(w: torch.Tensor, nr: int) -> torch.Tensor:
    """``w [N, K]`` as prepacked panels (zero past N), registered: the ``[N, K]`` view to pass for ``w``."""
    n, k = w.shape
    p = -(-n // nr)
    full = torch.zeros(p * nr, k, dtype=torch.float32)
    full[:n] = w.detach().to(torch.float32)
    panels = full.view(p, nr, k).transpose(1, 2).contiguous()
    view = panels.view(-1)[: n * k].view(n, k)
    register_panels(view, nr)
    return view


def _panels_of(t: torch.Tensor) -> int | None:
    """``nr`` if ``t`` is a registered panel view (still alive), else None."""
    entry = _PANELS.get(t.data_ptr())
    if entry is None:
        return None
    owner = entry[0]()
    if owner is None or owner.data_ptr() != t.data_ptr():
        _PANELS.pop(t.data_ptr(), None)
        return None
    return entry[1]


