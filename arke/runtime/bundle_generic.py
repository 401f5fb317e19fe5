"""A generic kernel of a loaded bundle called by its own name (``lib.scaled(w, 2.0)``), as ``arke.build``'s
kernels are: the bundle holds its specialisations (``scaled__W_f32``, ``scaled__W_f16``), and the call runs
the one whose tensor parameters have the arguments' dtypes (spec/bundles.md §3, spec/language.md §5.6)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from arke.ir.dtypes import DTYPES
from arke.runtime.dtypes import dtype_of
from arke.runtime.errors import GuardError

#: One specialisation suffix (``__W_f32``), as arke.lang.generics.mangle writes it.
_SUFFIX = re.compile(rf"__([A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)*?)_({'|'.join(DTYPES)})$")  # (no `__` inside)


def generic_base(name: str) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """``("scaled", (("W", "f32"),))`` for a specialisation's name ``scaled__W_f32``; None for another name."""
    parts: list[tuple[str, str]] = []
    while (m := _SUFFIX.search(name)) is not None:
        parts.insert(0, (m.group(1), m.group(2)))
        name = name[:m.start()]
    return (name, tuple(parts)) if parts and name else None


def _dtype_name(value: Any) -> str | None:
    """The Arke dtype name of a tensor or array argument (None for anything else)."""
    found = dtype_of(value) if isinstance(value, torch.Tensor | np.ndarray) else None
    return None if found is None else str(found)


def _shown(value: Any) -> str:
    """An argument as the refusal names it: a tensor's or array's dtype (Arke's name where it has one)."""
    if isinstance(value, torch.Tensor | np.ndarray):
        return _dtype_name(value) or str(value.dtype).removeprefix("torch.")
    return type(value).__name__


class GenericBundleKernel:
    """The specialisations of one generic kernel in a bundle, called by the generic's name."""

    def __init__(self, name: str, members: Mapping[tuple[tuple[str, str], ...], Any]):
        self.name, self.members = name, dict(members)

    def __repr__(self) -> str:
        kinds = "; ".join(", ".join(f"{v} = {d}" for v, d in combo) for combo in self.members)
        return f"<arke bundled generic kernel {self.name} ({kinds})>"

    def _fits(self, member: Any, arrays: tuple[Any, ...], scalars: Mapping[str, Any]) -> bool:
        given = {**dict(zip(member._names, arrays)), **scalars}
        return all(_dtype_name(given[p["name"]]) == p["dtype"] for p in member.params
                   if p["shape"] and p["name"] in given)

    def __call__(self, *arrays: Any, **scalars: Any) -> Any:
        """Run the specialisation whose tensor parameters have the arguments' dtypes."""
        plain = {k: v for k, v in scalars.items() if k not in ("threads", "out")}
        first = next(iter(self.members.values()))
        given = {*first._names[:len(arrays)], *plain}
        for p in first.params:  # a tensor that binds the dtypes must be there (as arke.build's kernels say)
            if p["shape"] and p["name"] not in given:
                raise GuardError(self.name, f"missing tensor `{p['name']}` (the specialisation is chosen by the "
                                 "dtypes of the tensors)", rule="missing", param=p["name"])
        for member in self.members.values():
            if self._fits(member, arrays, plain):
                return member(*arrays, **scalars)
        kinds = "; ".join(", ".join(f"{v} = {d}" for v, d in combo) for combo in self.members)
        got = ", ".join(_shown(a) for a in arrays)
        raise GuardError(self.name, f"no specialisation in this bundle takes arguments of dtypes ({got}); it has "
                         f"{kinds}", rule="dtype")


def generics_of(kernels: Mapping[str, Any]) -> dict[str, GenericBundleKernel]:
    """The bundle's generic kernels by name: every base name of specialisations not itself a kernel's name."""
    found: dict[str, dict[tuple[tuple[str, str], ...], Any]] = {}
    for name, kernel in kernels.items():
        parsed = generic_base(name)
        if parsed is not None and parsed[0] not in kernels:
            found.setdefault(parsed[0], {})[parsed[1]] = kernel
    return {base: GenericBundleKernel(base, members) for base, members in found.items()}
