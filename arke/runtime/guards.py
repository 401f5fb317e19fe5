"""Run-time guards: what every target checks before it runs a kernel.

The interpreter and every compiled target call :func:`check_call` with the arguments'
shapes and dtypes (never the data) before a launch. It checks, in this order, and stops
at the first problem with a :class:`GuardError` that names the kernel, the parameter and
the rule broken:

1. the argument count (``arity``) and that every parameter has a value (``missing``);
2. each tensor's rank (``rank``) and dtype, which must equal the parameter's exactly
   (``dtype``; no implicit conversion, the message says how to convert);
3. the dim symbols, bound from ``Function.bindings`` (:func:`bind_dims`); every dim must
   be at least 1, because the checker's proofs assume positive dims (``dim``);
4. every parameter axis against its declared dim, literal dims included (``dim``);
5. every :class:`~arke.ir.semantic.Guard` (``where``);
6. that every result and every op's domain fits the 64-bit sizes the targets compute with
   (``size``: a dim such as ``N * 2**62`` overflows on every target otherwise).

:func:`prepare_args` turns the user's arguments (NumPy arrays, torch tensors, Python
numbers) into CPU torch tensors after these checks; scalars are converted to their
parameter's dtype (see :func:`scalar_tensor` for what is accepted). Tensors must be dense
(strided) and hold data (not on the ``meta`` device); :mod:`arke.runtime.limits` has the
checks of ``threads=`` and of broadcast inputs.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import sympy
import torch

from arke.ir import semantic as S
from arke.ir.dtypes import DTYPES, INT_RANGE, DType
from arke.ir.shapes import Dim, dim_str, evaluate, free_dims
from arke.runtime.dtypes import TORCH_DTYPES, dtype_of
from arke.runtime.errors import GuardError
from arke.runtime.limits import check_tensor_kind, numpy_in, resolved

_NP_NAMES = {DType.BOOL: "np.bool_", DType.I8: "np.int8", DType.I32: "np.int32", DType.I64: "np.int64",
             DType.U8: "np.uint8", DType.U16: "np.uint16", DType.U32: "np.uint32",
             DType.F16: "np.float16", DType.F32: "np.float32"}

#: What a dtype argument of :func:`check_call` may be.
AnyDType = DType | torch.dtype | np.dtype | type | str
ShapeArgs = Mapping[str, Sequence[int]] | Sequence[Sequence[int]]
DTypeArgs = Mapping[str, AnyDType] | Sequence[AnyDType]


class InterpError(RuntimeError):
    """The IR itself cannot be run as given: a compiler bug, not bad input."""


# ---------------------------------------------------------------- dtypes


def _dtype_mismatch(fn: S.Function, p: S.Param, given: AnyDType) -> GuardError:
    need = p.type.dtype
    if isinstance(given, torch.dtype):
        shown = str(given).removeprefix("torch.")
        how = f"convert it with `.to({TORCH_DTYPES[need]})`"
    elif isinstance(given, str) and str(given) in DTYPES:
        shown, how = str(given), f"convert it to {need}"
    else:
        try:
            shown = str(np.dtype(given))
        except TypeError:
            shown = str(given)
        how = (f"convert it with `.astype({_NP_NAMES[need]})`" if need in _NP_NAMES else
               f"NumPy has no {need}: pass a torch tensor, e.g. `torch.from_numpy(a).to({TORCH_DTYPES[need]})`")
    return GuardError(fn.name, f"parameter `{p.name}` needs {need}, but was given {shown}; {how}",
                      rule="dtype", param=p.name)


# ---------------------------------------------------------------- dims and guards


def eval_dim(d: Dim | int, dims: Mapping[str, int]) -> int:
    """The value of a dim expression once its symbols are bound (fast for symbols and literals)."""
    if isinstance(d, int):
        return d
    if d.is_Integer:
        return int(d)
    if d.is_Symbol:
        try:
            return dims[d.name]
        except KeyError:
            raise InterpError(f"dim `{d.name}` is not bound (have {dict(dims)})") from None
    try:
        return evaluate(d, dict(dims))
    except ValueError as err:
        raise InterpError(str(err)) from None


def _by_name(fn: S.Function, values: Mapping[str, Any] | Sequence[Any], what: str) -> dict[str, Any]:
    """Arguments keyed by parameter name, from a mapping or a sequence in parameter order."""
    names = [p.name for p in fn.params]
    if isinstance(values, Mapping):
        unknown = [k for k in values if k not in names]
        if unknown:
            raise GuardError(fn.name, f"no parameter `{unknown[0]}`{_did_you_mean(unknown[0], names)}",
                             rule="arity", param=unknown[0])
        return dict(values)
    if len(values) != len(names):
        raise GuardError(fn.name, f"takes {len(names)} {what} ({', '.join(names)}), but {len(values)} were given",
                         rule="arity")
    return dict(zip(names, values, strict=True))


def _did_you_mean(name: str, names: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1)
    return f"; did you mean `{close[0]}`?" if close else f" (parameters: {', '.join(names)})"


def dim_params(fn: S.Function) -> frozenset[str]:
    """The parameters of ``fn`` that are dims given as numbers (``G: dim``: a binding of axis -1)."""
    return frozenset(b.param for b in fn.bindings if b.axis < 0)


def dim_value(fn: S.Function, p: S.Param, value: Any) -> int:
    """The value of dim parameter ``p``: a positive Python, NumPy or 0-d tensor integer (not a bool)."""
    found = dtype_of(value) if isinstance(value, torch.Tensor | np.ndarray) and value.ndim == 0 else None
    if found is not None and found.is_int:  # a 0-d integer tensor or array
        value = int(value.item())
    elif isinstance(value, np.integer):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        shown = repr(value) if isinstance(value, bool | int | float | str) else type(value).__name__
        raise GuardError(fn.name, f"`{p.name}` is a dim: it needs a positive integer, but was given {shown}",
                         rule="dim", param=p.name)
    if value > 2**63 - 1:
        raise GuardError(fn.name, f"`{p.name}` = {value} is beyond the 64-bit sizes kernels compute with",
                         rule="size", param=p.name)
    return value


def _bind(fn: S.Function, shapes: Mapping[str, Sequence[int]], dim_args: Mapping[str, Any] | None = None
          ) -> tuple[dict[str, int], dict[str, str]]:
    """Dim values and, for messages, where each came from (``"`x` axis 1"``)."""
    dims: dict[str, int] = {}
    origin: dict[str, str] = {}
    params = {p.name: p for p in fn.params}
    for b in fn.bindings:
        if b.param not in params:
            raise InterpError(f"{fn.name}: dim {b.dim} is bound from `{b.param}`, which is not a parameter")
        if b.axis < 0:  # a dim parameter: its value, or its default
            p = params[b.param]
            given = (dim_args or {}).get(b.param, p.default)
            if given is None:
                raise GuardError(fn.name, f"missing argument `{b.param}`", rule="missing", param=b.param)
            value, where = dim_value(fn, p, given), f"`{b.param}`"
            if b.dim in dims and dims[b.dim] != value:
                raise GuardError(fn.name, f"{b.dim} = {dims[b.dim]} from {origin[b.dim]}, but {where} is {value}",
                                 rule="dim", param=b.param)
            dims[b.dim], origin[b.dim] = value, where
            continue
        if b.param not in shapes:
            raise GuardError(fn.name, f"missing argument `{b.param}`", rule="missing", param=b.param)
        shape = tuple(shapes[b.param])
        if len(shape) != params[b.param].type.rank or b.axis >= len(shape):
            raise _rank_error(fn, params[b.param], shape)
        value, where = int(shape[b.axis]), f"`{b.param}` axis {b.axis}"
        if b.dim in dims and dims[b.dim] != value:
            raise GuardError(fn.name, f"{b.dim} = {dims[b.dim]} from {origin[b.dim]}, but {where} has {value}",
                             rule="dim", param=b.param)
        if value < 1:
            raise GuardError(fn.name, f"{b.dim} = {value} from {where}: dims must be at least 1", rule="dim",
                             param=b.param)
        dims[b.dim], origin[b.dim] = value, where
    return dims, origin


def bind_dims(fn: S.Function, shapes: ShapeArgs) -> dict[str, int]:
    """The value of every dim symbol of ``fn``, read from the arguments' shapes.

    ``shapes`` maps parameter names to shapes, or lists every parameter's shape in order.
    Raises :class:`GuardError` when a binding parameter is missing or has the wrong rank,
    when one symbol is bound twice to different sizes, or when a dim is below 1.
    """
    return _bind(fn, _by_name(fn, shapes, "arguments"))[0]


def _rank_error(fn: S.Function, p: S.Param, shape: tuple[int, ...]) -> GuardError:
    want = f"{p.type.dtype}[{', '.join(dim_str(d) for d in p.type.shape)}]" if p.type.rank else str(p.type.dtype)
    given = f"shape {list(shape)}" if shape else "a scalar"
    return GuardError(fn.name, f"parameter `{p.name}` is {want} (rank {p.type.rank}), but was given {given} "
                      f"(rank {len(shape)})", rule="rank", param=p.name)


def _check_axes(fn: S.Function, shapes: Mapping[str, Sequence[int]], dims: dict[str, int],
                origin: dict[str, str]) -> None:
    for p in fn.params:
        if p.name not in shapes:
            continue
        for axis, (d, size) in enumerate(zip(p.type.shape, shapes[p.name], strict=True)):
            want = eval_dim(d, dims)
            if want == size:
                continue
            here = f"`{p.name}` axis {axis} has {size}"
            if isinstance(d, sympy.Symbol):
                text = f"{d.name} = {want} from {origin.get(d.name, 'the call')}, but {here}"
            elif isinstance(d, int) or d.is_Integer:
                text = f"`{p.name}` axis {axis} must be {want}, but has {size}"
            else:
                known = ", ".join(f"{s} = {dims[s]} from {origin.get(s, 'the call')}" for s in sorted(free_dims(d)))
                text = f"`{p.name}` axis {axis} must be {dim_str(d)} = {want} ({known}), but has {size}"
            raise GuardError(fn.name, text, rule="dim", param=p.name)


def eval_cond(cond: S.Cond, dims: Mapping[str, int]) -> bool:
    """Whether a condition over dims holds for these dim values."""
    if isinstance(cond, S.Rel):
        a, b = eval_dim(cond.lhs, dims), eval_dim(cond.rhs, dims)
        ops = {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}
        if cond.op not in ops:
            raise InterpError(f"unknown relation {cond.op!r}")
        return ops[cond.op]
    if isinstance(cond, S.InSet):
        x, literal = eval_dim(cond.x, dims), _literal_set(cond)
        if literal is not None:
            return x in literal
        return any(eval_dim(v, dims) == x for v in cond.values)
    if cond.op == "and":
        return all(eval_cond(c, dims) for c in cond.parts)
    if cond.op == "or":
        return any(eval_cond(c, dims) for c in cond.parts)
    if cond.op == "not":
        return not eval_cond(cond.parts[0], dims)
    raise InterpError(f"unknown condition operator {cond.op!r}")


# InSet conditions whose values are all literals, by id (the condition is kept, so the id stays
# its own): a `where N in {...}` of thousands of values is a set lookup per call, not a rebuild.
_LITERAL_SETS: dict[int, tuple[S.InSet, frozenset[int] | None]] = {}


def _literal_set(cond: S.InSet) -> frozenset[int] | None:
    known = _LITERAL_SETS.get(id(cond))
    if known is not None and known[0] is cond:
        return known[1]
    literal = (frozenset(int(v) for v in cond.values)
               if all(isinstance(v, int) or v.is_Integer for v in cond.values) else None)
    if len(_LITERAL_SETS) > 4096:  # bounded: kernels built and dropped by the thousand
        _LITERAL_SETS.clear()
    _LITERAL_SETS[id(cond)] = (cond, literal)
    return literal


def _clipped(text: str, limit: int = 200) -> str:
    """A clause as a message quotes it: whole up to ``limit`` characters, else its two ends."""
    return text if len(text) <= limit else f"{text[:limit - 60]} … {text[-50:]}"


def cond_dims(cond: S.Cond) -> set[str]:
    """The dim symbols a condition reads."""
    if isinstance(cond, S.Rel):
        return free_dims(cond.lhs) | free_dims(cond.rhs)
    if isinstance(cond, S.InSet):
        return free_dims(cond.x).union(*(free_dims(v) for v in cond.values))
    return set().union(*(cond_dims(c) for c in cond.parts))


def check_guards(fn: S.Function, dims: Mapping[str, int]) -> None:
    """Raise :class:`GuardError` for the first ``where`` clause of ``fn`` that does not hold."""
    for g in fn.guards:
        if not cond_holds(fn.name, f"where clause `{_clipped(g.text)}`", g.cond, dims):
            values = ", ".join(f"{s} = {dims[s]}" for s in sorted(cond_dims(g.cond)) if s in dims)
            raise GuardError(fn.name, f"where clause `{_clipped(g.text)}` does not hold: {values}", rule="where")


def cond_holds(kernel: str, what: str, cond: S.Cond, dims: Mapping[str, int]) -> bool:
    """:func:`eval_cond`, with a division or modulo by zero in it a :class:`GuardError` (``arith``, spec
    §9.3) naming ``what`` (a ``where`` clause, a strategy's ``when``) and the dims' values."""
    try:
        return eval_cond(cond, dims)
    except ZeroDivisionError:
        values = ", ".join(f"{s} = {dims[s]}" for s in sorted(cond_dims(cond)) if s in dims)
        raise GuardError(kernel, f"{what} divides by zero at {values}", rule="arith") from None


_I64_MAX = 2**63 - 1


def _sizes_fit(fn: S.Function, what: str, shape: Sequence[Dim | int], dims: Mapping[str, int],
               origin: Mapping[str, str]) -> None:
    count = 1
    for axis, d in enumerate(shape):
        value = eval_dim(d, dims)
        count *= max(value, 0)
        if value <= _I64_MAX and count <= _I64_MAX:  # below zero: the interpreter's own message (`dim`)
            continue
        known = ", ".join(f"{s} = {dims[s]} from {origin.get(s, 'the call')}"
                          for s in sorted(free_dims(d)) if s in dims)
        size = f"axis {axis} is {dim_str(d)} = {value}" + (f" ({known})" if known else "")
        if value > _I64_MAX:
            text = f"{what} {size}, beyond the 64-bit sizes kernels compute with (at most 2**63 - 1)"
        else:
            text = f"{what} would hold {count} or more elements at {size}, beyond 2**63 - 1"
        raise GuardError(fn.name, f"{text}; call it with smaller dims", rule="size")


def check_sizes(fn: S.Function, dims: Mapping[str, int], origin: Mapping[str, str] | None = None) -> None:
    """Raise :class:`GuardError` (``size``) when a result or an op's domain of ``fn`` cannot exist: a dim (or
    an element count) beyond 2**63 - 1, which every target's 64-bit size arithmetic would wrap."""
    where = origin or {}
    for k, (name, rtype) in enumerate(zip(fn.results, fn.result_types, strict=True)):
        _sizes_fit(fn, f"result {k} (%{name})", rtype.shape, dims, where)
    for op in fn.ops:
        if isinstance(op, S.CallOp):
            continue
        label = f"`{op.name}`" if op.name else f"%{op.result}"
        reduce_axes = op.reduce_axes if isinstance(op, S.ReduceOp | S.ContractOp) else ()
        _sizes_fit(fn, f"the op {label}", [a.extent for a in op.axes], dims, where)
        for a in reduce_axes:
            _sizes_fit(fn, f"the reduction of {label} over `{a.name}`", [a.extent], dims, where)


def check_call(fn: S.Function, arg_shapes: ShapeArgs, arg_dtypes: DTypeArgs | None = None,
               dim_args: Mapping[str, Any] | None = None) -> dict[str, int]:
    """Check a call of ``fn`` from its arguments' shapes and dtypes; return the dim values.

    ``arg_shapes`` (and ``arg_dtypes``, when given) map parameter names to shapes (dtypes),
    or list them for every parameter in order. A dtype may be a DType, a torch dtype or a
    NumPy dtype. In a mapping, scalar (rank-0) parameters may be left out: they are not
    checked. ``dim_args`` gives the values of dim parameters (``G: dim``; left out, their
    defaults). Raises :class:`GuardError` at the first broken rule (see the module doc).
    """
    shapes = {k: tuple(int(n) for n in v) for k, v in _by_name(fn, arg_shapes, "arguments").items()}
    dtypes = _by_name(fn, arg_dtypes, "dtypes") if arg_dtypes is not None else {}
    for p in fn.params:
        if p.name not in shapes:
            if p.type.rank:
                raise GuardError(fn.name, f"missing argument `{p.name}`", rule="missing", param=p.name)
            continue
        if len(shapes[p.name]) != p.type.rank:
            raise _rank_error(fn, p, shapes[p.name])
        if p.name in dtypes and dtype_of(dtypes[p.name]) != p.type.dtype:
            raise _dtype_mismatch(fn, p, dtypes[p.name])
    dims, origin = _bind(fn, shapes, dim_args)
    _check_axes(fn, shapes, dims, origin)
    check_guards(fn, dims)
    check_sizes(fn, dims, origin)
    return dims


# ---------------------------------------------------------------- user arguments

_INT_RANGE = INT_RANGE


def scalar_tensor(fn: S.Function, p: S.Param, value: Any) -> torch.Tensor:
    """A scalar argument as a 0-d tensor of the parameter's dtype.

    Accepted: Python ``bool``/``int``/``float``, NumPy scalars and 0-d arrays, 0-d (or
    one-element 0-d) torch tensors. A ``bool`` parameter takes only booleans; an integer
    parameter takes only integers that fit its type; a float parameter takes any
    non-boolean number (rounded to its dtype).
    """
    if isinstance(value, torch.Tensor):
        check_tensor_kind(fn.name, f"parameter `{p.name}`", p.name, value)
    if isinstance(value, torch.Tensor | np.ndarray):
        if value.ndim != 0:
            raise _rank_error(fn, p, tuple(value.shape))
        value = value.item()
    elif isinstance(value, np.generic):
        value = value.item()
    if not isinstance(value, bool | int | float):
        raise GuardError(fn.name, f"parameter `{p.name}` is a {p.type.dtype} scalar, but was given "
                         f"{type(value).__name__}", rule="type", param=p.name)
    dt = p.type.dtype
    shown = (f"{value!r} ({type(value).__name__})" if not isinstance(value, int) or value.bit_length() < 256 else
             f"an integer of {value.bit_length()} bits")
    if dt.is_bool and not isinstance(value, bool):
        raise GuardError(fn.name, f"parameter `{p.name}` needs a bool, but was given {shown}", rule="scalar",
                         param=p.name)
    if dt.is_int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise GuardError(fn.name, f"parameter `{p.name}` needs an integer ({dt}), but was given {shown}",
                             rule="scalar", param=p.name)
        lo, hi = _INT_RANGE[dt]
        if not lo <= value <= hi:
            raise GuardError(fn.name, f"parameter `{p.name}` is {dt}, which cannot hold {value} "
                             f"(range {lo} .. {hi})", rule="scalar", param=p.name)
    if dt.is_float and isinstance(value, bool):
        raise GuardError(fn.name, f"parameter `{p.name}` needs a number ({dt}), but was given {shown}",
                         rule="scalar", param=p.name)
    if dt.is_float and isinstance(value, int):
        try:
            value = float(value)
        except OverflowError:
            raise GuardError(fn.name, f"parameter `{p.name}` is {dt}, but was given {shown}, beyond any float; "
                             "give a number within the float range", rule="scalar", param=p.name) from None
    return torch.tensor(value, dtype=TORCH_DTYPES[dt])


def to_cpu_tensor(value: torch.Tensor | np.ndarray, kernel: str = "", name: str = "") -> torch.Tensor:
    """A CPU torch tensor with the same values (sharing memory when it can; strides are kept); ``kernel`` and
    ``name`` are the parameter's, for the error of a broadcast array too large to copy (:func:`numpy_in`)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    return numpy_in(kernel, name, value)


def _shape_and_dtype(fn: S.Function, p: S.Param, value: Any) -> tuple[tuple[int, ...], AnyDType]:
    if isinstance(value, torch.Tensor):
        if value.is_nested:  # (it has no one shape)
            check_tensor_kind(fn.name, f"parameter `{p.name}`", p.name, value)
        return tuple(value.shape), value.dtype
    if isinstance(value, np.ndarray):
        return tuple(value.shape), value.dtype
    if isinstance(value, bool | int | float | np.generic):
        raise _rank_error(fn, p, ())
    raise GuardError(fn.name, f"parameter `{p.name}` needs a tensor (a NumPy array or a torch tensor), but was "
                     f"given {type(value).__name__}", rule="type", param=p.name)


def _check_one_device(fn: S.Function, tensors: Mapping[str, Any]) -> None:
    """A kernel runs on one device: torch tensors on two different ones are an error (NumPy arrays go anywhere)."""
    first: tuple[str, torch.device] | None = None
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            continue
        if value.device.type == "meta":  # no values at all: that, rather than a device to move it to
            check_tensor_kind(fn.name, f"parameter `{name}`", name, value)
        if first is None:
            first = (name, value.device)
        elif value.device != first[1]:
            raise GuardError(fn.name, f"parameter `{name}` is on {value.device}, but `{first[0]}` is on "
                             f"{first[1]}; move them to one device (tensor.to(device))", rule="device", param=name)


def prepare_args(fn: S.Function, arrays: Sequence[Any], scalars: Mapping[str, Any], keep_device: bool = False
                 ) -> tuple[dict[str, torch.Tensor], dict[str, int], bool]:
    """Check a user's call and convert its arguments: ``(tensors by name, dims, any torch input)``.

    Positional arguments fill the parameters in declaration order, whatever their kind;
    keyword arguments fill any parameter by name; scalars left out take their defaults.
    Tensors come back on the CPU, or, with ``keep_device`` (the GPU runtimes), where they
    are, after checking that they are all on one device.
    """
    names = [p.name for p in fn.params]
    if len(arrays) > len(names):
        raise GuardError(fn.name, f"takes {len(names)} arguments ({', '.join(names)}), but {len(arrays)} were "
                         f"given", rule="arity")
    given: dict[str, Any] = dict(zip(names, arrays, strict=False))
    for key, value in scalars.items():
        if key not in names:
            raise GuardError(fn.name, f"no parameter `{key}`{_did_you_mean(key, names)}", rule="arity", param=key)
        if key in given:
            raise GuardError(fn.name, f"parameter `{key}` given twice (by position and by name)", rule="arity",
                             param=key)
        given[key] = value
    missing = [p for p in fn.params if p.name not in given and (p.type.rank or p.default is None)]
    if missing:
        listed = ", ".join(f"`{p.name}`" for p in missing)
        raise GuardError(fn.name, f"missing argument{'s' if len(missing) > 1 else ''} {listed}", rule="missing",
                         param=missing[0].name)
    any_torch = any(isinstance(v, torch.Tensor) for v in given.values())
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, AnyDType] = {}
    for p in fn.params:
        if p.type.rank == 0:
            continue
        shapes[p.name], dtypes[p.name] = _shape_and_dtype(fn, p, given[p.name])
    # Scalars are converted first (their own errors are clearer), tensors checked together.
    args: dict[str, torch.Tensor] = {}
    as_dims = dim_params(fn)
    dim_args: dict[str, int] = {}
    for p in fn.params:
        if p.name in as_dims:
            dim_args[p.name] = dim_value(fn, p, given.get(p.name, p.default))
            args[p.name] = torch.tensor(dim_args[p.name], dtype=torch.int64)
        elif p.type.rank == 0:
            args[p.name] = scalar_tensor(fn, p, given.get(p.name, p.default))
    dims = check_call(fn, shapes, dtypes, dim_args)
    if keep_device:
        _check_one_device(fn, {p.name: given[p.name] for p in fn.params if p.type.rank})
    for p in fn.params:
        if p.type.rank and isinstance(given[p.name], torch.Tensor):
            check_tensor_kind(fn.name, f"parameter `{p.name}`", p.name, given[p.name])
    for p in fn.params:
        if p.type.rank:
            value = given[p.name]
            keep = keep_device and isinstance(value, torch.Tensor)
            value = value.detach() if keep else to_cpu_tensor(value, fn.name, p.name)
            args[p.name] = resolved(value)
    return {p.name: args[p.name] for p in fn.params}, dims, any_torch
