"""The reference interpreter's reductions bounded by lengths (spec/language.md §8.11), and the
positions of arg-reductions (bounded or not).

The terms at ``j < min(max(n, 0), extent)`` only: the body is evaluated under the mask of those
points (the frame's ``valid``: nothing past them is checked, no load, division or shift count
there raises), the others hold the reduction's identity; for an arg-reduction they are never a
candidate (0 for an empty range).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from arke.ir import semantic as S

if TYPE_CHECKING:
    from arke.runtime.interp import _Domain, _Frame


def bounded(frame: _Frame, op: S.ReduceOp, dom: _Domain, keep: int, identity: float | int | bool) -> torch.Tensor:
    """The value of the bounded reduction ``op`` over ``dom`` (its first ``keep`` axes kept)."""
    valid = torch.ones(dom.ones, dtype=torch.bool)
    for name, length in op.limits:
        n = frame.expr(length, dom).to(torch.int64)
        valid = valid & (torch.arange(dom.sizes[dom.pos[name]]).view(dom.axis_shape(name)) < n)
    valid = valid.expand(dom.sizes)
    if 0 in dom.sizes:
        if op.kind in S.ARG_KINDS:
            return torch.zeros(dom.sizes[:keep], dtype=torch.int64)
        return torch.tensor(identity)
    frame.valid = valid
    try:
        body = frame.expr(op.body, dom).expand(dom.sizes)
    finally:
        frame.valid = None
    if op.kind in S.ARG_KINDS:
        return positions(body, op.kind, valid)
    acc = torch.float32 if op.dtype.is_float else torch.int64
    body = torch.where(valid, body.to(acc), torch.tensor(identity, dtype=acc))
    return fold(body, dom.sizes, keep, op.kind, acc)


def fold(body: torch.Tensor, sizes: tuple[int, ...], keep: int, kind: str, acc: torch.dtype) -> torch.Tensor:
    """``sum``/``prod``/``max``/``min`` of ``body`` (broadcast to ``sizes``) over its axes after the first ``keep``."""
    if keep == len(sizes):
        return body
    flat = body.reshape((*sizes[:keep], -1))
    if kind == "sum":
        return flat.sum(dim=-1, dtype=acc)
    if kind == "prod":
        return flat.prod(dim=-1, dtype=acc)
    return flat.amax(dim=-1) if kind == "max" else flat.amin(dim=-1)


def checked(frame: _Frame, bad: torch.Tensor) -> torch.Tensor:
    """``bad`` where the body is evaluated: everywhere but past a bounded reduction's lengths."""
    return bad if frame.valid is None else bad & frame.valid


def positions(body: torch.Tensor, kind: str, valid: torch.Tensor | None) -> torch.Tensor:
    """An arg-reduction along the last axis of ``body``: the first position of the largest (``argmax``)
    or smallest value among the ``valid`` ones (all when None); a NaN beats every number, so a row with
    NaN gives its first NaN; 0 for a row with no valid position."""
    if body.dtype == torch.bool:
        body = body.to(torch.int64)
    larger = kind == "argmax"
    if valid is not None:  # the other positions hold a value no valid one loses to
        if body.is_floating_point():
            worst: float | int = -math.inf if larger else math.inf
        else:
            worst = torch.iinfo(body.dtype).min if larger else torch.iinfo(body.dtype).max
        body = torch.where(valid, body, torch.tensor(worst, dtype=body.dtype))
    best = body.amax(dim=-1, keepdim=True) if larger else body.amin(dim=-1, keepdim=True)
    # amax/amin propagate NaN: where the best is NaN the positions wanted are the NaNs
    hits = (body == best) | (body != body)
    if valid is not None:
        hits = hits & valid
    # the first True of each row: argmax of a 0/1 row is its first 1 (0 when there is none)
    return hits.to(torch.int8).argmax(dim=-1)
