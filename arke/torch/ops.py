"""Arke kernels as torch operators: ``torch.ops.<namespace>.<kernel>`` with exact fake implementations.

:func:`register` defines one operator per kernel of a built library through ``torch.library``:

* the schema follows the signature: tensor parameters are ``Tensor``, dim parameters ``SymInt``,
  scalars ``float``/``int``/``bool`` with the kernel's defaults, results one ``Tensor`` each;
* an ``out`` overload (``torch.ops.arke.rmsnorm.out(x, w, out=y)``) writes the results in place and
  declares it (``Tensor(a!) out``, returning nothing), so functionalization and ``torch.compile`` know what
  it mutates (an overload returning its aliased ``out`` cannot be compiled);
* the fake (meta) implementation computes each result's shape from the symbolic dims of the
  signature, with the inputs' sizes (``SymInt`` under dynamic shapes) bound to them, and the
  contiguous strides the kernels write; it checks ranks and dtypes as a real call would;
* the implementation is registered for the device the library's target runs on (CPU, or CUDA for
  the GPU targets) and calls the kernel itself, so a wrong shape is the same ``GuardError``.
* the Triton target's kernels on a GPU are ``torch.library.triton_op``s instead (``traceable``): under
  ``torch.compile`` their Triton kernels are launched through ``wrap_triton``, so Inductor sees them
  (:mod:`arke.torch.triton_ops`).

The operators are defined with ``Library.define``/``Library.impl``/``register_fake`` rather than the
``custom_op`` decorator: the decorator adds an autograd wrapper in Python to every call (about 10 µs),
while an operator without autograd costs one dispatcher hop (the call overhead is measured in
``benchmarks/torch_interop.py``). ``torch.library.opcheck`` passes for every stdlib kernel.
"""

from __future__ import annotations

import math
import threading
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import value as dim_value
from arke.runtime.errors import GuardError
from arke.runtime.guards import TORCH_DTYPES, dim_params, dtype_of

if TYPE_CHECKING:
    from arke.library import GenericKernel, Kernel, Library

_LOCK = threading.Lock()
#: namespaces that belong to torch or to the arke backend's own operators
_RESERVED = frozenset({"aten", "prim", "prims", "quantized", "inductor", "_inductor", "higher_order", "arke_fx",
                       "torch", "c10d", "profiler", "debugprims", "rngprims"})
_LIBS: dict[str, torch.library.Library] = {}  # namespace -> its torch.library fragment (kept alive)
_DEFINED: dict[tuple[str, str], _Op] = {}  # (namespace, op name) -> the operator's current kernel


@dataclass
class _Op:
    """One registered operator: its schema and the kernel its implementations call (re-pointable)."""

    schema: str
    kernel: Kernel | GenericKernel
    tensors: list[int]  # the positions of the tensor and dim parameters (the rest are scalars)
    defaults: dict[int, Any]  # scalar position -> its default (None: it has none)

    def bound(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The tensor and dim arguments of a call."""
        return tuple(args[i] for i in self.tensors)

    def call(self, args: tuple[Any, ...], out: Any = None) -> Any:
        lead = len(self.tensors)
        if any(i < len(args) and args[i] is None for i in self.defaults):  # a `float?` scalar left out: its
            # default is ±inf or NaN, which a schema cannot spell (only scalars are looked at: never a tensor's ==)
            args = tuple(self.defaults.get(i) if a is None and i in self.defaults else a for i, a in enumerate(args))
        if self.tensors[-1:] == [lead - 1] and all(args[i] == d for i, d in self.defaults.items() if i < len(args)):
            # the kernel's fast path: tensors only
            return self.kernel(*args[:lead]) if out is None else self.kernel(*args[:lead], out=out)
        return self.kernel(*args, out=out)  # positional arguments fill the parameters in declaration order


def _scalar_type(p: ir.Param) -> str:
    dtype = p.type.dtype
    if dtype == DType.BOOL:
        return "bool"
    return "float" if dtype.is_float else "int"


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)


def _finite(value: Any) -> bool:
    """Whether a schema can spell default ``value`` (it has no literal for ±inf or NaN)."""
    return not isinstance(value, float) or math.isfinite(value)


def _signature(fn: ir.Function, varying: frozenset[str] = frozenset()) -> tuple[str, list[int], dict[int, Any]]:
    """The schema's argument list, the positions of tensor and dim parameters, the scalars' defaults
    (``varying``: scalars whose dtype a generic kernel's dtype variable sets: ``Scalar`` in the schema)."""
    dims = dim_params(fn)
    parts, tensors, defaults = [], [], {}
    for i, p in enumerate(fn.params):
        if p.name in dims:
            parts.append(f"SymInt {p.name}" + (f"={p.default}" if p.default is not None else ""))
            tensors.append(i)
        elif p.type.rank:
            parts.append(f"Tensor {p.name}")
            tensors.append(i)
        else:
            kind = "Scalar" if p.name in varying else _scalar_type(p)
            if _finite(p.default):
                default = "" if p.default is None else f"={_literal(p.default)}"
                parts.append(f"{kind} {p.name}{default}")
            else:  # `lo: f32 = -inf`: optional, None standing for the kernel's default (_Op.call)
                parts.append(f"{kind}? {p.name}=None")
            defaults[i] = p.default
    return ", ".join(parts), tensors, defaults


def _function(kernel: Kernel | GenericKernel, args: tuple[Any, ...]) -> ir.Function:
    """The function a call runs: the kernel's own, or the specialisation a generic kernel's dtypes pick."""
    from arke.library import GenericKernel

    if isinstance(kernel, GenericKernel):
        from arke.runtime.generics import pick

        return kernel.member(pick(kernel.generic, args, {})).function
    return kernel.function


def bind_dims(fn: ir.Function, args: tuple[Any, ...]) -> dict[str, Any]:
    """The dims of a call with ``args`` (tensors, or fake tensors, and dim values in signature order), sizes
    maybe symbolic; ranks and dtypes are checked as the kernel checks them."""
    env: dict[str, Any] = {}
    positional = [p for p in fn.params if p.type.rank or p.name in dim_params(fn)]
    by_name = {p.name: a for p, a in zip(positional, args)}
    params = {p.name: p for p in fn.params}
    for b in fn.bindings:
        value = by_name.get(b.param, params[b.param].default)
        if b.axis < 0:
            env.setdefault(b.dim, value)
            continue
        p, t = params[b.param], by_name[b.param]
        if t.dim() != p.type.rank:
            raise GuardError(fn.name, f"`{p.name}` has rank {p.type.rank} ({p.type}), but was given "
                             f"{t.dim()} axes {tuple(t.shape)}", rule="rank", param=p.name)
        env.setdefault(b.dim, t.shape[b.axis])
    for p in positional:
        t = by_name[p.name]
        if p.type.rank and dtype_of(t.dtype) != p.type.dtype:
            raise GuardError(fn.name, f"`{p.name}` is {p.type.dtype}, but was given "
                             f"{str(t.dtype).removeprefix('torch.')}", rule="dtype", param=p.name)
    return env


def result_meta(fn: ir.Function, args: tuple[Any, ...]) -> list[tuple[tuple[Any, ...], torch.dtype]]:
    """Each result's shape and dtype for a call with ``args`` (tensors, or fake tensors, and dim values in
    signature order): ranks and dtypes are checked as the kernel checks them, sizes may be symbolic."""
    env = bind_dims(fn, args)
    types = fn.value_types()
    return [(tuple(dim_value(d, env) for d in types[r].shape), TORCH_DTYPES[types[r].dtype]) for r in fn.results]


def _device_of(args: tuple[Any, ...]) -> torch.device:
    return next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))


def _define(namespace: str, name: str, kernel: Kernel | GenericKernel, device_key: str, traceable: bool) -> None:
    from arke.library import GenericKernel

    # a generic kernel's specialisations share one signature but for the dtypes: `Tensor` whatever they are, and
    # a scalar whose dtype a variable sets (`c: W`) is a `Scalar` (an int for i32, a float for f32)
    fn = kernel.member(kernel.generic.members[0][1]).function if isinstance(kernel, GenericKernel) else kernel.function
    params, tensors, defaults = _signature(fn, _varying_scalars(kernel) if isinstance(kernel, GenericKernel)
                                           else frozenset())
    results = len(fn.results)
    rets = "Tensor" if results == 1 else f"({', '.join(['Tensor'] * results)})"
    outs = ", ".join(f"Tensor(a{k}!) out{k if results > 1 else ''}" for k in range(results))
    out_rets = "()"  # a mutating operator returns nothing: one returning its aliased out= cannot be compiled
    schema = f"({params}) -> {rets}"
    out_names = [f"out{k if results > 1 else ''}" for k in range(results)]
    if clash := sorted({p.name for p in fn.params} & set(out_names)):
        raise ValueError(f"kernel `{name}` has a parameter named `{clash[0]}`, the name its `.out` overload gives "
                         f"{'an' if results > 1 else 'its'} output: rename the parameter to register the kernel")
    found = _DEFINED.get((namespace, name))
    if found is not None:
        if found.schema != schema:
            raise ValueError(f"torch.ops.{namespace}.{name} is already registered as {name}{found.schema}; "
                             f"this kernel's signature is {name}{schema}: register it under another namespace")
        # a newer library's kernel of the same signature takes over, with its own defaults (±inf and NaN are
        # `None` in both schemas: a -inf default and an inf one look alike there)
        found.kernel, found.defaults = kernel, defaults
        return
    op = _Op(schema, kernel, tensors, defaults)
    lib = _LIBS.get(namespace)
    if lib is None:
        lib = _LIBS[namespace] = torch.library.Library(namespace, "FRAGMENT")
    try:
        if traceable:  # a triton_op: torch.compile sees its Triton kernels (triton_ops.py)
            from arke.torch.triton_ops import define

            define(namespace, name, op, fn)
        else:
            lib.define(f"{name}{schema}")
        lib.define(f"{name}.out({params}{', ' if params else ''}*, {outs}) -> {out_rets}")
    except RuntimeError as err:
        if _exists(namespace, name):  # an operator of that name defined elsewhere (not by register)
            raise ValueError(f"torch.ops.{namespace}.{name} already exists and was not defined by "
                             f"arke.torch.register: register this library under another namespace "
                             f"({str(err).splitlines()[0]})") from None
        raise ValueError(f"kernel `{name}` cannot be a torch operator: its signature {name}{schema} is not a valid "
                         f"torch schema ({str(err).splitlines()[0]}); rename the parameter torch reads as a keyword "
                         "of its schemas (None, True, False, Tensor, ...), or register the other kernels with "
                         "kernels=[...]") from None

    def real(*args: Any) -> Any:
        if torch.is_grad_enabled():
            no_gradients(namespace, name, args)
        if not op.defaults:  # tensors and dims only: straight to the kernel (a call's overhead is the point)
            return op.kernel(*args)
        return op.call(args)

    def real_out(*args: Any, **outputs: Any) -> None:
        if torch.is_grad_enabled():
            no_gradients(namespace, name, args)
        given = [outputs[k] for k in out_names]
        op.call(args, given[0] if len(given) == 1 else tuple(given))

    def fake(*args: Any) -> Any:
        if torch.is_grad_enabled():  # torch.compile traces a graph that needs gradients through the fakes
            no_gradients(namespace, name, args)
        bound = op.bound(args)
        metas = result_meta(_function(op.kernel, bound), bound)
        device = _device_of(args)
        made = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in metas]
        return made[0] if len(made) == 1 else tuple(made)

    def fake_out(*args: Any, **outputs: Any) -> Any:
        if torch.is_grad_enabled():
            no_gradients(namespace, name, args)
        given = [outputs[k] for k in out_names]
        bound = op.bound(args)
        metas = result_meta(_function(op.kernel, bound), bound)
        device = _device_of(args)
        for t, (shape, dtype) in zip(given, metas):
            if t.device != device:
                raise GuardError(name, f"out= is on {t.device}, but the arguments are on {device}", rule="out",
                                 param="out")
            if t.dtype != dtype or len(t.shape) != len(shape):
                raise GuardError(name, f"out= needs {str(dtype).removeprefix('torch.')} with {len(shape)} axes, "
                                 f"but was given {str(t.dtype).removeprefix('torch.')} {tuple(t.shape)}",
                                 rule="out", param="out")

    if not traceable:
        lib.impl(name, real, device_key)
        torch.library.register_fake(f"{namespace}::{name}", fake, lib=lib)
    lib.impl(f"{name}.out", real_out, device_key)
    torch.library.register_fake(f"{namespace}::{name}.out", fake_out, lib=lib)
    _DEFINED[(namespace, name)] = op


def _exists(namespace: str, name: str) -> bool:
    """Whether torch has an operator ``namespace::name`` (its default overload)."""
    try:
        torch._C._get_schema(f"{namespace}::{name}", "")
    except RuntimeError:
        return False
    return True


def _varying_scalars(kernel: GenericKernel) -> frozenset[str]:
    """The scalar parameters whose dtype differs between a generic kernel's specialisations."""
    semantic = kernel.library.module.semantic
    seen: dict[str, set[DType]] = {}
    for _, ir_name in kernel.generic.members:
        for p in semantic.get(ir_name).params:
            if not p.type.rank:
                seen.setdefault(p.name, set()).add(p.type.dtype)
    return frozenset(name for name, dtypes in seen.items() if len(dtypes) > 1)


def _tensorless(kernel: Kernel | GenericKernel) -> bool:
    """Whether a kernel takes no tensor (only dims and scalars): torch dispatches an operator by its tensors."""
    from arke.library import GenericKernel

    if isinstance(kernel, GenericKernel):
        return False  # a dtype variable is bound by a tensor parameter
    return not any(p.type.rank for p in kernel.function.params)


def no_gradients(namespace: str, name: str, args: tuple[Any, ...]) -> None:
    """Refuse a call whose result torch would be asked to differentiate: the operators have no derivative,
    and torch's fallback for an operator without one would give the inputs no gradient from it, silently."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.requires_grad:
            raise GuardError(name, f"torch.ops.{namespace}.{name} has no derivative, and an argument requires grad "
                             "with gradients enabled: call it under `torch.no_grad()` (or `torch.inference_mode()`),"
                             " or pass `.detach()`ed tensors", rule="type")


def op_name(kernel_name: str) -> str:
    """The operator name of a kernel (``decoder.mlp`` -> ``decoder_mlp``: operator names have no dots)."""
    return kernel_name.replace(".", "_")


class Ops:
    """The operators :func:`register` defined: ``ops.rmsnorm`` is ``torch.ops.<namespace>.rmsnorm``."""

    def __init__(self, namespace: str, names: dict[str, str]):
        self.namespace, self.names = namespace, names

    def __getattr__(self, kernel: str) -> Any:
        names = self.__dict__.get("names", {})
        if kernel not in names:
            raise AttributeError(f"no operator for kernel `{kernel}`; registered: {', '.join(names)}")
        return getattr(getattr(torch.ops, self.namespace), names[kernel])

    def __iter__(self) -> Any:
        return iter(self.names)


def register(library: Library, namespace: str = "arke", kernels: list[str] | None = None,
             traceable: bool | None = None) -> Ops:
    """Define ``torch.ops.<namespace>.<kernel>`` (and its ``.out`` overload) for the library's kernels
    (all, or those named); registering a kernel again with the same signature re-points the operator
    to the new library's kernel, a different signature is a ValueError naming both.

    ``traceable``: define the Triton target's kernels as ``torch.library.triton_op`` (Inductor sees their
    Triton kernels under ``torch.compile``; :mod:`arke.torch.triton_ops`). The default is True for the
    Triton target on a GPU and False under Triton's interpreter, where there is nothing to compile."""
    if not namespace.isidentifier():
        raise ValueError(f"namespace must be a Python identifier, not {namespace!r}")
    if namespace in _RESERVED:
        raise ValueError(f"namespace {namespace!r} is torch's (or the arke backend's); choose another, such as 'arke'")
    chosen = list(library.kernels) if kernels is None else kernels
    unknown = [k for k in chosen if k not in library.kernels]
    if unknown:
        raise ValueError(f"no kernel {unknown[0]!r} in this library; it has: {', '.join(library.kernels)}")
    # torch picks an operator's implementation by the device of its tensors: one without any cannot be called
    tensorless = [k for k in chosen if _tensorless(library.kernels[k])]
    if tensorless and kernels is not None:
        raise ValueError(f"kernel `{tensorless[0]}` takes no tensor, and torch dispatches an operator by its tensors: "
                         "call it on the library itself (it cannot be a torch operator)")
    if tensorless:
        one = len(tensorless) == 1
        warnings.warn(f"arke.torch.register: {', '.join(f'`{k}`' for k in tensorless)} "
                      f"{'takes' if one else 'take'} no tensor and {'is' if one else 'are'} not registered (torch "
                      "dispatches an operator by its tensors); call it on the library itself", stacklevel=2)
        chosen = [k for k in chosen if k not in tensorless]
    from arke.targets import base as targets

    target = targets.get(library.target)
    device_key, can_trace = target.torch_dispatch(library.on_host)
    if traceable is None:
        traceable = can_trace
    elif traceable and not target.torch_traceable:
        raise ValueError(f"traceable=True is for the triton target's kernels; this library is {library.target}'s")
    names = {}
    with _LOCK:
        for k in chosen:
            names[k] = op_name(k)
            _define(namespace, names[k], library.kernels[k], device_key, traceable)
    return Ops(namespace, names)
