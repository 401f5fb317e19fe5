"""The reference interpreter's top-k selections (``reduce.topk bottomk argtopk argbottomk``).

Spec/language.md §8.3 defines the order; this computes it directly, with NumPy's stable sort and
never with ``torch.topk`` (which the tests compare against): ``topk`` is a stable sort of each
row from the largest down, NaN first; ``bottomk`` a stable sort from the smallest up, NaN last;
equal values (NaNs among themselves) keep their positions' order, ``-0.0`` equal to ``+0.0``. The
op's last axis is the rank ``j < K``: the first ``K`` of each sorted row. ``K`` above the row's
length is a :class:`GuardError` (the checker makes it a guard first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from arke.ir import semantic as S

if TYPE_CHECKING:
    from arke.runtime.interp import _Frame


def select_topk(frame: _Frame, op: S.ReduceOp) -> torch.Tensor:
    """The values (``topk``/``bottomk``) or positions (``arg...``) of ``op``, shaped as its axes."""
    from arke.runtime.interp import InterpError, _Domain

    if len(op.reduce_axes) != 1 or not op.axes:
        raise InterpError(f"{frame.fn.name}: reduce.{op.kind} needs one reduce axis and a rank axis")
    keep, rank = op.axes[:-1], op.axes[-1]
    dom = frame.domain(keep + op.reduce_axes)
    k, n = frame.dim(rank.extent), dom.sizes[-1]
    if k > n:
        raise frame.error(f"`{op.kind}` keeps {k} values from rows of {n}", "where")
    body = frame.expr(op.body, _Domain(dom.names, dom.sizes)).expand(dom.sizes)
    row = body.numpy() if body.dtype != torch.bfloat16 else body.float().numpy()
    order = _stable_order(row, largest=op.kind in ("topk", "argtopk"))[..., :k]
    if op.kind.startswith("arg"):
        return torch.from_numpy(np.ascontiguousarray(order.astype(np.int64)))
    return torch.take_along_dim(body, torch.from_numpy(np.ascontiguousarray(order)), dim=-1)


def _stable_order(row: np.ndarray, largest: bool) -> np.ndarray:
    """Positions of each row's elements in the selection's order (stable: ties by position)."""
    if row.dtype == np.bool_:
        row = row.astype(np.int64)
    if not largest:  # NumPy sorts NaN last, ties stably: the ascending order as specified
        return np.argsort(row, axis=-1, kind="stable")
    if np.issubdtype(row.dtype, np.floating):  # NaNs first (the last key leads), then -x: exact and monotone
        nan = np.isnan(row)
        return np.lexsort((np.where(nan, 0, -row), ~nan), axis=-1)
    return np.argsort(~row.astype(np.int64), axis=-1, kind="stable")  # ~x = -x - 1: no overflow at the minimum
