"""The kernels of a decoder layer's plan as it calls them: compiled (:class:`KernelCall`, each call
shape checked once, outputs and temporaries planned) or on the reference interpreter (:class:`ReferenceCall`)."""

from __future__ import annotations

from typing import Any

import torch

from arke.runtime.pool import evict_oldest
from arke.runtime.record import Recording, counted, recording


class KernelCall:
    """One kernel, called with planned outputs and temporaries; each call shape is checked once."""

    def __init__(self, kernel: Any, keep_device: bool):
        from arke.runtime.guards import prepare_args, scalar_tensor

        self.kernel, self.keep_device = kernel, keep_device
        self.fn = kernel.function
        self._prepare, self._scalar = prepare_args, scalar_tensor
        self._tensors = [p.name for p in self.fn.params if p.type.rank]
        self._scalars = {p.name: p for p in self.fn.params if not p.type.rank}
        self._memo: dict[tuple[Any, ...], tuple[dict[str, int], Any]] = {}
        self._scalar_memo: dict[tuple[str, Any], torch.Tensor] = {}
        self._cpu = not keep_device

    def scalar(self, name: str, value: Any) -> torch.Tensor:
        """The 0-d tensor of a scalar argument (the same values recur: eps, a window, the step's n)."""
        key = (name, value)
        found = self._scalar_memo.get(key)
        if found is None:
            if len(self._scalar_memo) >= 64:
                evict_oldest(self._scalar_memo)
            found = self._scalar(self.fn, self._scalars[name], value)
            self._scalar_memo[key] = found
        return found

    def dims(self, tensors: list[torch.Tensor], scalars: dict[str, Any]) -> dict[str, int]:
        """The dims of a call with these tensors (checked, nothing compiled)."""
        return dict(self._prepare(self.fn, tensors, scalars, keep_device=self.keep_device)[1])

    def resolve(self, tensors: list[torch.Tensor], scalars: dict[str, Any]) -> tuple[dict[str, int], Any]:
        """The dims and compiled variant for a call with these tensors (fully checked the first time)."""
        key = tuple((t.shape, t.dtype, t.device) for t in tensors)
        hit = self._memo.get(key)
        if hit is None:
            _, dims, _ = self._prepare(self.fn, tensors, scalars, keep_device=self.keep_device)
            hit = (dims, self.kernel.variant(self.kernel.choose(dims)))
            if len(self._memo) >= 32:
                evict_oldest(self._memo)
            self._memo[key] = hit
        return hit

    def __call__(self, tensors: list[torch.Tensor], scalars: dict[str, Any], out: Any,
                 temps: dict[int, torch.Tensor] | None = None) -> Any:
        dims, variant = self.resolve(tensors, scalars)
        args = dict(zip(self._tensors, tensors))
        rec = recording()
        varying = rec.take_varying() if rec is not None else {}
        if rec is not None and (unknown := varying.keys() - self._scalars.keys()):
            rec.fail(f"kernel `{self.fn.name}` has no scalar {sorted(unknown)}")
        for name, p in self._scalars.items():
            if name in varying:  # a decode step being recorded: its own tensor, rewritten as each step starts
                args[name] = self._varying(rec, name, scalars[name], varying[name])  # type: ignore[arg-type]
            else:
                args[name] = self.scalar(name, scalars.get(name, p.default))
        if self._cpu:  # the outputs are the memory plan's: no overlap or shape checks per call
            return counted(rec, self.fn.name, lambda: variant.run_prepared(args, dims, False, None, out, temps=temps,
                                                                           planned=True))
        if rec is not None:
            rec.fail(f"kernel `{self.fn.name}` runs on a device")
        return variant.run_prepared(args, dims, False, None, out)

    def _varying(self, rec: Recording, name: str, value: Any, offset: int) -> torch.Tensor:
        """A fresh 0-d tensor for scalar ``name`` whose value the recording sets to each step's start + ``offset``."""
        found = self._scalar(self.fn, self._scalars[name], value)
        view = found.numpy()

        def write(start: int) -> None:
            view[()] = start + offset
        rec.action(write, found)
        return found


class ReferenceCall:
    """One kernel run on the reference interpreter (the oracle), its results copied into the planned outputs."""

    def __init__(self, kernel: Any):
        self.kernel = kernel
        self._tensors = [p.name for p in kernel.function.params if p.type.rank]

    def resolve(self, tensors: list[torch.Tensor], scalars: dict[str, Any]) -> tuple[dict[str, int], Any]:
        raise NotImplementedError("the reference interpreter has no compiled variants")

    def __call__(self, tensors: list[torch.Tensor], scalars: dict[str, Any], out: Any,
                 temps: dict[int, torch.Tensor] | None = None) -> Any:
        if (rec := recording()) is not None:
            rec.fail(f"kernel `{self.kernel.function.name}` runs on the reference interpreter")
        got = self.kernel(*tensors, **scalars)
        for o, g in zip(out if isinstance(out, tuple) else (out,), got if isinstance(got, tuple) else (got,)):
            o.copy_(g)
        return out
