"""What the GPU runtimes share: a kernel that runs its launches on a device, behind the Library API.

A :class:`DeviceKernel` takes checked arguments (:func:`~arke.runtime.guards.prepare_args`, run
before anything launches), puts them where its kernels run, allocates results and temporaries
there, lets the target launch every dispatch (:meth:`DeviceKernel.launch_all`, which returns the
error words it raised), looks at all error words once after the last launch (one sync, not one
per launch), and hands results back on the arguments' device (NumPy for NumPy inputs). When an
error word is set the reference interpreter runs the call and says exactly what was wrong.
"""

from __future__ import annotations

from typing import Any

import torch

from arke.ir import semantic as ir
from arke.ir.shapes import evaluate
from arke.ir.shapes import value as dim_value
from arke.plan.dispatch import KernelPlan
from arke.runtime.guards import TORCH_DTYPES, GuardError, prepare_args
from arke.runtime.limits import check_threads, refuse_huge_broadcast
from arke.targets.artifact import Artifact


class DeviceKernel:
    """A kernel of a GPU target; subclasses give :meth:`device` and :meth:`launch_all`."""

    target = ""

    def __init__(self, plan: KernelPlan, artifact: Artifact, module: ir.Module, threads: int = 1):
        self.plan, self.artifact, self.module, self.threads = plan, artifact, module, threads
        self.name = plan.name
        self._result_at = [plan.buffer_index(r) for r in plan.function.results]

    def __repr__(self) -> str:
        return f"<arke kernel {self.name} on {self.target}, {len(self.artifact.launches)} dispatches>"

    def device(self) -> torch.device:
        """Where CPU arguments run (copied there, results copied back)."""
        raise NotImplementedError

    def launch_all(self, buffers: list[torch.Tensor], dims: dict[str, Any], dev: torch.device,
                   traced: bool = False) -> list[torch.Tensor]:
        """Queue every dispatch on ``dev``; the error words they may set (looked at after the last).
        ``traced``: the buffers are being traced (torch.compile), so each launch must be one a graph can
        hold (the Triton target wraps its kernels with ``torch.library.wrap_triton``)."""
        raise NotImplementedError

    def launch_traced(self, args: dict[str, torch.Tensor], dims: dict[str, Any]) -> list[torch.Tensor]:
        """Run on tensors being traced (fake or functional tensors, sizes maybe symbolic): results and
        temporaries allocated like :meth:`run_prepared`'s, every dispatch launched through ``launch_all``
        with ``traced``. The error words cannot be read back while tracing (that is a sync the graph
        cannot hold): the graph asserts on the device that none is set (``torch._assert_async``)."""
        fn = self.plan.function
        dev = next((v.device for v in args.values() if v.dim()), self.device())
        buffers: list[torch.Tensor] = []
        for b in self.plan.buffers:
            if b.role == "param":
                buffers.append(args[b.name].contiguous())
            else:
                shape: Any = tuple(dim_value(d, dims) for d in b.shape)  # symbolic sizes stay symbolic
                buffers.append(torch.empty(shape, dtype=TORCH_DTYPES[b.dtype], device=dev))
        words = self.launch_all(buffers, dims, dev, traced=True)
        if words:
            torch._assert_async(~torch.cat(words).any(), f"{self.name}: an index or an integer division was out "
                                                         "of range (run the call eagerly for the exact error)")
        outs: list[torch.Tensor] = []
        for r, at in zip(fn.results, self._result_at):
            t = buffers[at]
            outs.append(t.clone() if r in args or any(t is o for o in outs) else t)
        return outs

    def __call__(self, *arrays: Any, threads: int | None = None, out: Any = None, **scalars: Any) -> Any:
        args, dims, any_torch = prepare_args(self.plan.function, arrays, scalars, keep_device=True)
        return self.run_prepared(args, dims, not any_torch, threads, out)

    def run_prepared(self, args: dict[str, torch.Tensor], dims: dict[str, int], as_numpy: bool,
                     threads: int | None = None, out: Any = None) -> Any:
        """Run on checked arguments; results on the arguments' device (NumPy when ``as_numpy``).

        CUDA tensors stay where they are; CPU tensors (and NumPy arrays) are copied to
        :meth:`device` and their results copied back.
        """
        fn = self.plan.function
        check_threads(self.name, threads)
        for name, v in args.items():
            refuse_huge_broadcast(self.name, name, v)  # launches take dense buffers: a view is copied
        home = next((v.device for v in args.values() if v.dim()), torch.device("cpu"))
        dev = home if home.type != "cpu" else self.device()  # a GPU tensor stays on its GPU
        given = None
        if out is not None:
            from arke.runtime.outputs import check_out

            given = check_out(fn, out, dims, args, home)
        buffers: list[torch.Tensor] = []
        for b in self.plan.buffers:
            if b.role == "param":
                buffers.append(args[b.name].to(dev).contiguous())
            else:
                shape = tuple(evaluate(d, dims) for d in b.shape)
                buffers.append(torch.empty(shape, dtype=TORCH_DTYPES[b.dtype], device=dev))
        words = self.launch_all(buffers, dims, dev)
        if words and bool(torch.cat(words).any()):
            self._explain(buffers)
        outs: list[torch.Tensor] = []
        for r, at in zip(fn.results, self._result_at):
            t = buffers[at]
            outs.append(t.clone() if r in args or any(t is o for o in outs) else t)
        if home.type != dev.type:
            outs = [o.to(home) for o in outs]
        if given is not None:
            users = tuple(out) if isinstance(out, tuple | list) else (out,)
            for r, o in zip(fn.results, outs):
                given[r][0].copy_(o)
            return users[0] if len(users) == 1 else users
        results = [o.cpu().numpy() if as_numpy and o.dtype != torch.bfloat16 else o for o in outs]
        return results[0] if len(results) == 1 else tuple(results)

    def _explain(self, buffers: list[torch.Tensor]) -> None:
        """A dispatch raised its error word: the reference interpreter says exactly what was wrong."""
        from arke.runtime.interp import run_function

        fn = self.plan.function
        inputs = {p.name: buffers[self.plan.buffer_index(p.name)].cpu() for p in fn.params}
        run_function(fn, ir.Module((fn,)), inputs)
        raise GuardError(fn.name, "an index or an integer division was out of range", rule="index")
