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


def two_wide(outer: int, inner: int, inner_fixed: bool) -> tuple[int, int]:
    """The blocks of a program whose tensors are ``outer`` × ``inner`` (a reduction's outputs by its reduce
    chunk), so that they hold at most :data:`MAX_LINE` elements: the reduce chunk gives way where no decision
    fixed it, else the outputs' block does (where a decision fixed that too, :func:`outer_runs_as` says so:
    AK4014)."""
    if outer * inner <= MAX_LINE:
        return outer, inner
    if not inner_fixed:
        return outer, _floor_pow2(MAX_LINE // outer)
    return _floor_pow2(MAX_LINE // inner), inner


def outer_runs_as(outer: int, inner: int) -> int | None:
    """What a decided outputs' block ``outer`` runs as beside a decided reduce chunk ``inner`` (both as capped
    to :data:`MAX_LINE`), or None when both fit in one tensor."""
    outer, inner = min(outer, MAX_LINE), min(inner, MAX_LINE)
    return None if outer * inner <= MAX_LINE else _floor_pow2(MAX_LINE // inner)


def _floor_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def limits(roles: str, most: int = MAX_BLOCK) -> Mapping[str, tuple[int, str]]:
    """The ``limits`` of a ``takes`` entry for blocks along ``roles`` (space-separated)."""
    why = WHY + (", two blocks wide" if most == MAX_BLOCK else "")
    return {role: (most, why) for role in roles.split()}


__all__ = ["MAX_BLOCK", "MAX_LINE", "WHY", "capped", "limits", "outer_runs_as", "two_wide"]
