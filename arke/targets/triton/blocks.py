"""How large a Triton block may be: a tensor of a program holds at most 2**20 elements (Triton's
``TRITON_MAX_TENSOR_NUMEL``), and a program's tensors are at most two blocks wide (a tile of rows by a tile
of columns, of queries by keys, of a feature by its depth). So a `tile` or `vectorize` decision runs as at
most :data:`MAX_BLOCK` along each index, 1024 × 1024 elements at most: ``tile j = 65536`` was Triton's
"numel exceeds triton maximum tensor numel" at the launch; it is AK4014's "would run as 1024 or less" now,
on every target table row that takes the decision (``arke/targets/triton/__init__.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

#: The largest block along one index (two such blocks make Triton's largest tensor, 2**20 elements).
MAX_BLOCK = 1024
#: Why a larger one runs as MAX_BLOCK (AK4014's reason).
WHY = "Triton's tensors hold at most 2**20 elements, two blocks wide"


def capped(value: int | None) -> int | None:
    """A decided block as it runs: at most :data:`MAX_BLOCK` (None stays None)."""
    return None if value is None else min(value, MAX_BLOCK)


def limits(roles: str) -> Mapping[str, tuple[int, str]]:
    """The ``limits`` of a ``takes`` entry for blocks along ``roles`` (space-separated)."""
    return {role: (MAX_BLOCK, WHY) for role in roles.split()}


__all__ = ["MAX_BLOCK", "WHY", "capped", "limits"]
