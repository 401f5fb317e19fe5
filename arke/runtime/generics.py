"""Calls of generic kernels (language spec §5.6): the arguments' dtypes pick the specialisation.

Each dtype variable is bound by its binding parameter's argument (positional, or by name);
a dtype outside the variable's set is a :class:`~arke.runtime.errors.GuardError` (rule
``dtype``) naming the set, raised before anything runs. Every other check is the
specialisation's own (``prepare_args``), so a call of a generic kernel reports exactly what a
call of the kernel with the dtypes written in would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from arke.ir.dtypes import DType
from arke.lang.generics import Dispatch
from arke.runtime.errors import GuardError
from arke.runtime.guards import dtype_of


def bound_dtypes(g: Dispatch, arrays: Sequence[Any], scalars: Mapping[str, Any]) -> tuple[DType, ...]:
    """Each variable's dtype as the call's arguments bind it (GuardError outside its set)."""
    combo = []
    for var, param, index, members in g.vars:
        if index < len(arrays):
            value = arrays[index]
        elif param in scalars:
            value = scalars[param]
        else:
            raise GuardError(g.name, f"missing tensor `{param}` (it binds the dtype variable `{var}`)",
                             rule="missing", param=param)
        dtype = getattr(value, "dtype", None)
        found = dtype_of(dtype) if dtype is not None else None
        if found is None or found not in members:
            shown = str(dtype).removeprefix("torch.") if dtype is not None else type(value).__name__
            raise GuardError(g.name, f"parameter `{param}` binds `{var}`, which is one of "
                             f"{{{', '.join(map(str, members))}}}, but was given {shown}; convert it to one of "
                             "those", rule="dtype", param=param)
        combo.append(found)
    return tuple(combo)


def pick(g: Dispatch, arrays: Sequence[Any], scalars: Mapping[str, Any]) -> str:
    """The IR name of the specialisation this call binds."""
    found = g.member(bound_dtypes(g, arrays, scalars))
    assert found is not None  # every combination of the sets is a member
    return found
