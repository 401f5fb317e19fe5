"""Weights repacked once into the CPU contraction kernels' panels (``pack w``), and the registry of
tensors that already are (so a call passes them straight to the packed micro-kernel).

It lives in the runtime, not in the llvm target: bundles (:mod:`arke.runtime.bundle`) pass panels to
their kernels, and model bundles restore packed weights, without the compiler. The llvm target's
kernels (:mod:`arke.targets.llvm.kernel`) read the same registry.

Two layouts, each named by a *key* that a dispatch able to read it records in its artifact
(``meta["panels.<launch>"] = "<B's buffer index>,<key>"``):

* ``"<nr>"`` (``"32"`` with AVX-512): f32 panels ``[ceil(N / nr)][K][nr]`` for the f32 micro-kernels;
* ``"vnni"``: bf16 or int8 VNNI panels ``[ceil(N / 32)][Kp / per][32][per]`` for the matrix units
  (:mod:`arke.targets.llvm.gemm_bf16`; ``per`` = 2 bf16 or 4 int8 consecutive k of one column in a
  32-bit word, ``Kp`` = K rounded up to 32 bf16 or 64 int8, zero past N and past K).
"""

from __future__ import annotations

import weakref

import torch

from arke.runtime import hugepages

#: The key of VNNI panels (see the module docstring).
VNNI_KEY = "vnni"
#: Columns of a VNNI panel, and the depth granule of its k (bf16; int8 holds twice as many).
VNNI_COLUMNS, VNNI_DEPTH = 32, 32

#: Weights packed into panels (see :func:`register_panels`): data pointer -> (the tensor, layout key).
_PANELS: dict[int, tuple[weakref.ref[torch.Tensor], str]] = {}
_GENERATION = [0]  # bumped when a view is registered or dies: what a replayed launch assumed may have changed


def generation() -> int:
    """A number that changes whenever a tensor becomes, or stops being, a registered panel view."""
    return _GENERATION[0]


def _changed(_: object = None) -> None:
    _GENERATION[0] += 1


def register_panels(view: torch.Tensor, nr: int | str) -> None:
    """Declare ``view`` (an ``[N, K]`` tensor whose storage holds panels of layout ``nr``: an f32
    panel width, or :data:`VNNI_KEY`) as a prepacked contraction operand: a dispatch that can read
    that layout (a contraction whose ``B`` is the parameter ``w[n, k]``, see ``llvm_gemm``) reads
    them in place; any other dispatch given it is refused, since its elements are not in ``[N, K]`` order."""
    _PANELS[view.data_ptr()] = (weakref.ref(view, _changed), str(nr))
    _changed()


def pack_panels(w: torch.Tensor, nr: int) -> torch.Tensor:
    """``w [N, K]`` as prepacked f32 panels (zero past N), registered: the ``[N, K]`` view to pass for ``w``."""
    n, k = w.shape
    p = -(-n // nr)
    full = torch.zeros(p * nr, k, dtype=torch.float32)
    full[:n] = w.detach().to(torch.float32)
    panels = hugepages.weight((p, k, nr), torch.float32)  # streamed by decode: on huge pages where it can be
    panels.copy_(full.view(p, nr, k).transpose(1, 2))
    view = panels.view(-1)[: n * k].view(n, k)
    register_panels(view, nr)
    return view


def pack_vnni_panels(w: torch.Tensor) -> torch.Tensor:
    """``w [N, K]`` (bf16 or int8) as prepacked VNNI panels for the matrix units, registered: the
    ``[N, K]`` view (of ``w``'s dtype) to pass for ``w``."""
    if w.dtype not in (torch.bfloat16, torch.int8) or w.dim() != 2:
        raise ValueError(f"VNNI panels hold a bf16 or int8 matrix [N, K], not {w.dtype} of {list(w.shape)}")
    n, k = w.shape
    per = 2 if w.dtype == torch.bfloat16 else 4
    depth = VNNI_DEPTH * per // 2
    p, kp = -(-n // VNNI_COLUMNS), -(-k // depth) * depth
    full = torch.zeros(p * VNNI_COLUMNS, kp, dtype=w.dtype)
    full[:n, :k] = w.detach().cpu()
    panels = hugepages.weight((p, kp // per, VNNI_COLUMNS, per), w.dtype)
    panels.copy_(full.view(p, VNNI_COLUMNS, kp // per, per).permute(0, 2, 1, 3))
    view = panels.view(-1)[: n * k].view(n, k)
    register_panels(view, VNNI_KEY)
    return view


def panels_of(t: torch.Tensor) -> str | None:
    """The layout key if ``t`` is a registered panel view (still alive), else None."""
    entry = _PANELS.get(t.data_ptr())
    if entry is None:
        return None
    owner = entry[0]()
    if owner is None or owner.data_ptr() != t.data_ptr():
        _PANELS.pop(t.data_ptr(), None)
        return None
    if owner.shape != t.shape or owner.stride() != t.stride():
        # another view of the same storage (a tied embedding reading the panels as [P, K, nr]): its
        # elements are where its own strides say, so it is read as stored
        return None
    return entry[1]


#: The registry's old name (the llvm target's runtime reads it).
_panels_of = panels_of
