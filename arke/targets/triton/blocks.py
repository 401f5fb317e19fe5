"""How large a Triton block may be: a tensor of a program holds at most 2**20 elements (Triton's
``TRITON_MAX_TENSOR_NUMEL``). A contraction's or an attention's program holds tensors two blocks wide (a tile
of rows by a tile of columns, of queries by keys), so a `tile` there runs as at most :data:`MAX_BLOCK` along
each index, 1024 × 1024 elements at most; a rows or element-wise program's block runs as at most
:data:`MAX_LINE`, the whole limit along one index. ``tile j = 65536`` on attention was Triton's "numel
exceeds triton maximum tensor numel" at the launch; it is AK4014's "would run as 1024 or less" now, from the
target's table (``arke/targets/triton/__init__.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

#: The largest block along one index of a two-block-wide program (contraction, attention).
MAX_BLOCK = 1024
#: The largest block of a program along one index alone (Triton's largest tensor).
MAX_LINE = 1 << 20
#: Why a larger one runs as the limit (AK4014's reason).
WHY = "Triton's tensors hold at most 2**20 elements"


def capped(value: int | None, most: int = MAX_BLOCK) -> int | None:
    """A decided block as it runs: at most ``most`` (None stays None)."""
    return None if value is None else min(value, most)


def limits(roles: str, most: int = MAX_BLOCK) -> Mapping[str, tuple[int, str]]:
    """The ``limits`` of a ``takes`` entry for blocks along ``roles`` (space-separated)."""
    why = WHY + (", two blocks wide" if most == MAX_BLOCK else "")
    return {role: (most, why) for role in roles.split()}


__all__ = ["MAX_BLOCK", "MAX_LINE", "WHY", "capped", "limits"]
