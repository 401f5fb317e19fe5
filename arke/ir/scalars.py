"""Scalar values in JSON: numbers as they are, the non-finite floats as ``"inf"``, ``"-inf"`` and ``"nan"``.

A module of its own, with no dependencies: bundles read their parameters' defaults with it, and loading a
bundle imports neither SymPy nor the compiler (spec/bundles.md §5)."""

from __future__ import annotations

import math
from typing import Any

_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def encode_scalar(v: float | int | bool) -> Any:
    """``v`` as JSON: a bool or int as it is, a float as a number or one of the three names."""
    if isinstance(v, (bool, int)):
        return v
    v = float(v)
    return v if math.isfinite(v) else "nan" if math.isnan(v) else "inf" if v > 0 else "-inf"


def decode_scalar(x: Any) -> float | int | bool:
    """The value :func:`encode_scalar` wrote (``ValueError`` for anything else)."""
    if isinstance(x, str):
        if x not in _NON_FINITE:
            raise ValueError(f"expected a number, true/false, or 'inf', '-inf', 'nan'; got {x!r}")
        return _NON_FINITE[x]
    if not isinstance(x, (bool, int, float)):
        raise ValueError(f"expected a number, got {x!r}")
    return x
