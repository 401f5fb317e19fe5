"""Triton kernels as operators Inductor can see into: ``torch.library.triton_op`` and ``wrap_triton``.

A kernel built for the ``triton`` target on a GPU is registered (by :func:`arke.torch.register`) as a
``triton_op``. Called eagerly it is the kernel itself: the same checks, launches and error words as
calling it directly. Under ``torch.compile`` AOTAutograd traces its body instead; the body allocates the
results with the signature's (symbolic) sizes and launches each dispatch through ``wrap_triton``, so the
compiled graph holds the Triton kernels themselves, which Inductor schedules, and can fuse or reorder
around, like its own. The ``.out`` overload stays an opaque operator (it mutates what it declares).

Under Triton's interpreter (``TRITON_INTERPRET=1``, kernels run on the CPU) there is nothing Inductor
could compile, so the kernels are opaque operators there (:func:`arke.torch.ops.register`'s default); the
traced body is still what :func:`traced` runs, and the tests trace it with ``make_fx``.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import torch

from arke.ir import semantic as ir
from arke.runtime.device import DeviceKernel
from arke.runtime.guards import dim_params, eval_cond

if TYPE_CHECKING:
    from arke.library import GenericKernel, Kernel
    from arke.torch.ops import _Op


def tracing(tensors: tuple[Any, ...]) -> bool:
    """Whether a call's tensors are being traced (fake or functional tensors) rather than run."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return any(isinstance(t, FakeTensor | FunctionalTensor) or (isinstance(t, torch.Tensor) and
                                                                torch._is_functional_tensor(t)) for t in tensors)


def _member(kernel: Kernel | GenericKernel, bound: tuple[Any, ...]) -> Kernel:
    from arke.library import GenericKernel

    if isinstance(kernel, GenericKernel):
        from arke.runtime.generics import pick

        return kernel.member(pick(kernel.generic, bound, {}))
    return kernel


def _hint(v: Any) -> int:
    """A size's value in the example being traced (no guard is added: only a tuned variant's bucket reads it)."""
    if isinstance(v, torch.SymInt):
        return int(v.node.hint) if v.node.hint is not None else int(v.node.shape_env.size_hint(v.node.expr))
    return int(v)


def traced(kernel: Kernel | GenericKernel, args: tuple[Any, ...]) -> list[torch.Tensor]:
    """The results of a call on tensors being traced, each dispatch launched through ``wrap_triton``.

    ``args`` are the operator's arguments in signature order (tensors, dims and scalars). Ranks and dtypes
    are checked as a real call checks them; a ``when`` clause is decided on the symbolic sizes (so the
    graph is guarded on it), a tuned variant on the traced example's sizes."""
    from arke.torch.ops import bind_dims

    member = _member(kernel, tuple(a for a in args if isinstance(a, torch.Tensor)))
    fn = member.function
    dims = bind_dims(fn, tuple(a for a, p in zip(args, fn.params) if p.type.rank or p.name in dim_params(fn)))
    index = next((k for k, s in enumerate(member.strategies()) if s.when is None or eval_cond(s.when, dims)), None)
    if index is None:
        index = member.choose({k: _hint(v) for k, v in dims.items()})
    variant = member.variant(index)
    if not isinstance(variant, DeviceKernel):
        raise TypeError(f"{member.name} is built for {member.library.target}; only a GPU target's kernel is traced")
    dev = next(a.device for a in args if isinstance(a, torch.Tensor) and a.dim())
    named: dict[str, torch.Tensor] = {}
    for p, a in zip(fn.params, args):
        if p.type.rank:
            named[p.name] = a
        else:  # dims and scalars are 0-d buffers of the kernel, as a real call passes them
            from arke.runtime.guards import TORCH_DTYPES

            named[p.name] = torch.full((), a, dtype=TORCH_DTYPES[p.type.dtype], device=dev)
    return list(variant.launch_traced(named, dims))


def _annotation(fn: ir.Function, p: ir.Param) -> Any:
    if p.type.rank:
        return torch.Tensor
    if p.name in dim_params(fn):
        return int  # infer_schema: SymInt
    from arke.ir.dtypes import DType

    if p.type.dtype == DType.BOOL:
        return bool
    return float if p.type.dtype.is_float else int


def define(namespace: str, name: str, op: _Op, fn: ir.Function) -> None:
    """Define ``torch.ops.<namespace>.<name>`` as a ``triton_op`` calling ``op``'s kernel."""
    from torch.library import triton_op

    def body(*given: Any, **named: Any) -> Any:
        call = signature.bind(*given, **named)
        call.apply_defaults()  # scalars left out take the kernel's defaults
        args = tuple(call.arguments[p.name] for p in fn.params)
        if not tracing(args):
            return op.call(args)  # eager: the kernel's own checks, launches and error words
        outs = traced(op.kernel, args)
        return outs[0] if len(outs) == 1 else tuple(outs)

    params = [inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=_annotation(fn, p),
                                **({"default": p.default} if p.default is not None and not p.type.rank else {}))
              for p in fn.params]
    results = len(fn.results)
    ret = torch.Tensor if results == 1 else tuple[tuple(torch.Tensor for _ in range(results))]  # type: ignore[misc]
    signature = inspect.Signature(params, return_annotation=ret)
    body.__signature__ = signature  # type: ignore[attr-defined]
    body.__name__ = name
    triton_op(f"{namespace}::{name}", body, mutates_args=())
