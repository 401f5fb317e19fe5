"""The reference interpreter: runs SemanticIR directly, with torch on the CPU. It is THE oracle.

Every compiled target is tested against :func:`run`: this module aims at clear, fully specified semantics, not speed.

How it computes (the language spec quotes this list):

* **Storage and compute types.** Every SSA value is stored in its op's dtype. Inside an op's body,
  ``f16``/``bf16`` arithmetic runs in ``f32`` and is rounded (to nearest even) only when the op's result is
  stored. The leaves of a body hold values of their own type: loads are exact, literals and explicit casts to
  ``f16``/``bf16`` round at once. Integer arithmetic wraps at its type's width (two's complement). Unsigned
  values are held in ``int64`` while a body runs (torch's CPU kernels have no ``uint16``/``uint32`` arithmetic)
  and every operation that yields one keeps its low bits, so the result is arithmetic modulo ``2**width``
  exactly.
* **Bits.** ``bitand bitor bitxor bitnot`` act on two's complement bits; ``shl`` keeps the low bits of ``a *
  2**b``, ``shr`` is ``floor(a / 2**b)`` (arithmetic on signed types, logical on unsigned ones). A shift count
  outside ``0 <= b < width`` is a :class:`GuardError` (``arith``); it is never masked.
* **Division.** Integer ``div`` and ``floordiv`` are floor division and ``mod`` follows Python's sign rule; an
  integer division or modulo by zero, and an integer raised to a negative power, are :class:`GuardError` s. On
  floats ``div`` is IEEE division, ``floordiv`` is ``floor(a / b)``, and ``mod`` is Python's float ``%``
  (``fmod`` with the divisor's sign, which is exact).
* **max / min** (elementwise and reductions) propagate NaN. ``gelu`` is the exact erf form.
* **Casts.** float → int truncates toward zero into i64, saturating at its range (NaN is 0), and then wraps to
  the type as integer → integer does (``i8(300.0)`` is 44, as torch converts). Anything → ``bool`` is
  ``x != 0``; ``bool`` → number is 0 or 1.
* **Arg-reductions** (``argmax argmin``) give the first position along their one reduce axis of the largest /
  smallest value, a NaN beating every number (the first NaN wins; torch's ``argmax``/``argmin`` exactly); 0 over
  an empty axis. **Top-k** (``topk bottomk argtopk argbottomk``): a stable sort of each row (``interp_topk``).
* **Reductions** (``sum max min prod`` and :class:`~arke.ir.semantic.ContractOp`) run in a fixed order (torch's,
  deterministic on the CPU). Floats accumulate in ``f32`` and are rounded to the op's dtype at the end; integers
  accumulate in ``i64``, which wraps to the same answer as accumulating in the op's dtype. An empty range gives
  the identity: ``0``, ``1``, and for ``max``/``min`` ``-inf``/``+inf`` on floats, the type's smallest/largest
  value on integers and ``False``/``True`` on bools.
* **Scans** (``cumsum cumprod cummax cummin`` and the linear recurrence ``h = a * h + b``) run in sequence along
  their axis, one rounding per operation, accumulating as reductions do; an exclusive scan starts from the
  identity (or ``init``).
* **Loads.** A subscript outside its axis is a :class:`GuardError` naming the tensor, the subscript position and
  the value; it never wraps or clamps.
* **Lengths** (``limits``, spec §8.11): nothing past a reduce axis's length is evaluated (``interp_lengths``).
* **Extents.** An op axis whose extent evaluates below zero is a :class:`GuardError` (the checker should have
  turned it into a guard).

Each body is evaluated over its op's domain (its axes, then its reduce axes) by broadcasting: every sub-expression is
a tensor with one dimension per domain axis, of size 1 where it does not depend on that axis. Loads with plain index
subscripts are views of the source; computed subscripts (offsets, gathers) use advanced indexing. A sum of a product
(``ContractOp``, or a ``sum`` reduction whose body is ``a * b`` on floats) runs as one ``torch.einsum``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from arke.ir import semantic as S
from arke.ir.dtypes import DType, promote
from arke.ir.shapes import dim_str
from arke.runtime.guards import (
    TORCH_DTYPES,
    GuardError,
    InterpError,
    bind_dims,
    check_call,
    dim_params,
    eval_dim,
    prepare_args,
    scalar_tensor,
    to_cpu_tensor,
)
from arke.runtime.interp_lengths import bounded, checked, fold, positions
from arke.runtime.interp_ops import BITWISE, COMPARE, PLAIN, UNARY, compute, float_mod, float_to_i64, wrap
from arke.runtime.interp_topk import select_topk
from arke.runtime.source_form import op_description, source_form

__all__ = ["GuardError", "InterpError", "bind_dims", "check_call", "run", "run_function"]


def run(module: S.Module, name: str, arrays: tuple[Any, ...], scalars: Mapping[str, Any]) -> Any:
    """Run kernel ``name`` of ``module`` on user arguments; the result is one value or a tuple.

    ``arrays`` fill the parameters in declaration order; ``scalars`` fill parameters by
    name; scalars left out take their defaults. Arguments are checked first (see
    :mod:`arke.runtime.guards`). Results are NumPy arrays when no argument is a torch
    tensor (except ``bf16`` results, which stay torch tensors), else CPU torch tensors;
    rank-0 results are 0-d arrays/tensors.
    """
    try:
        fn = module.get(name)
    except KeyError:
        known = ", ".join(f.name for f in module.functions)
        raise GuardError(name, f"no such kernel in this module (kernels: {known})", rule="kernel") from None
    args, dims, any_torch = prepare_args(fn, tuple(arrays), scalars)
    try:
        outs: tuple[Any, ...] = _Frame(module, fn, dims, args).run()
    except (MemoryError, RuntimeError) as e:  # torch's allocator: "can't allocate memory: you tried to ..."
        if not isinstance(e, MemoryError) and "allocate" not in str(e):
            raise
        shown = ", ".join(f"{k} = {v}" for k, v in dims.items())
        raise GuardError(name, f"the reference interpreter could not allocate memory for this call ({shown}): "
                         "it holds every intermediate and result whole; call it with smaller tensors",
                         rule="size") from None
    if not any_torch:
        outs = tuple(o if o.dtype == torch.bfloat16 else o.numpy() for o in outs)
    return outs[0] if len(outs) == 1 else outs


def run_function(fn: S.Function, module: S.Module, args_by_name: Mapping[str, Any],
                 *, dims: Mapping[str, int] | None = None) -> tuple[torch.Tensor, ...]:
    """Run ``fn`` on torch tensors keyed by parameter name; returns its results as CPU tensors.

    For other runtimes and tests. Tensors must have their parameter's dtype exactly;
    scalars may be 0-d tensors of that dtype or Python numbers, and take their defaults
    when left out. ``dims`` presets dim values (as a :class:`~arke.ir.semantic.CallOp`
    does); they must agree with the ones the arguments bind.
    """
    args: dict[str, torch.Tensor] = {}
    for p in fn.params:
        if p.name in args_by_name:
            value = args_by_name[p.name]
            args[p.name] = to_cpu_tensor(value) if isinstance(value, torch.Tensor) else scalar_tensor(fn, p, value)
        elif p.type.rank == 0:
            if p.default is None:
                raise GuardError(fn.name, f"missing argument `{p.name}`", rule="missing", param=p.name)
            args[p.name] = scalar_tensor(fn, p, p.default)
    extra = [k for k in args_by_name if k not in args]
    found = check_call(fn, {**{k: tuple(v.shape) for k, v in args.items()}, **{k: () for k in extra}},
                       {k: v.dtype for k, v in args.items()}, {k: args[k] for k in dim_params(fn) if k in args})
    for key, value in (dims or {}).items():
        if key in found and found[key] != value:
            raise GuardError(fn.name, f"{key} = {value} at the call, but the arguments give {key} = {found[key]}",
                             rule="dim")
        found[key] = value
    return _Frame(module, fn, found, args).run()


def _identity(kind: str, dt: DType) -> float | int | bool:
    """The value of a reduction over an empty range, for a result of type ``dt``."""
    if kind in ("sum", "prod"):
        return 0 if kind == "sum" else 1
    low = kind == "max"
    if dt.is_float:
        return -math.inf if low else math.inf
    if dt.is_bool:
        return not low
    info = torch.iinfo(TORCH_DTYPES[dt])
    return info.min if low else info.max


class _Domain:
    """The named axes an op's body runs over, with their sizes."""

    def __init__(self, names: tuple[str, ...], sizes: tuple[int, ...]):
        self.names = names
        self.sizes = sizes
        self.pos = {n: i for i, n in enumerate(names)}
        self.ones = (1,) * len(names)

    def axis_shape(self, name: str) -> list[int]:
        """A broadcast shape that runs along ``name`` only."""
        shape = list(self.ones)
        shape[self.pos[name]] = self.sizes[self.pos[name]]
        return shape


# ---------------------------------------------------------------- one running kernel


class _Frame:
    """One call of a function: dim values, SSA values (as tensors) and the op being run."""

    def __init__(self, module: S.Module, fn: S.Function, dims: dict[str, int], args: dict[str, torch.Tensor]):
        self.module = module
        self.fn = fn
        self.dims = dims
        self.env: dict[str, torch.Tensor] = dict(args)
        self.labels: dict[str, str] = {name: f"`{name}`" for name in args}
        self.names: dict[str, str] = {name: name for name in args}  # values with a source name
        self.where = ""  # the op being run, in the user's terms (source_form.op_description), for messages
        self._dim_cache: dict[Any, int] = {}
        self.valid: torch.Tensor | None = None  # the points below a bounded reduction's lengths

    def dim(self, d: Any) -> int:
        if d not in self._dim_cache:
            self._dim_cache[d] = eval_dim(d, self.dims)
        return self._dim_cache[d]

    def error(self, message: str, rule: str) -> GuardError:
        return GuardError(self.fn.name, f"{message} (in {self.where})", rule=rule)

    def run(self) -> tuple[torch.Tensor, ...]:
        for op in self.fn.ops:
            results = op.results if isinstance(op, S.CallOp) else (op.result,)
            self.where = op_description(op, self.fn)
            values = (self.call(op) if isinstance(op, S.CallOp) else (self.scan(op),) if isinstance(op, S.ScanOp)
                      else (self.compute(op),))
            for name, value in zip(results, values, strict=True):
                self.env[name] = value
                self.labels[name] = self.where if len(results) == 1 else f"%{name}"
                if op.name and len(results) == 1:
                    self.names[name] = op.name
        outs: list[torch.Tensor] = []
        params = {p.name for p in self.fn.params}
        for name, rtype in zip(self.fn.results, self.fn.result_types, strict=True):
            value = self.value(name)
            shape = tuple(self.dim(d) for d in rtype.shape)
            if tuple(value.shape) != shape or value.dtype != TORCH_DTYPES[rtype.dtype]:
                raise InterpError(f"{self.fn.name}: result %{name} is {value.dtype}{list(value.shape)}, "
                                  f"but the function declares {rtype.dtype}{list(shape)}")
            fresh = name not in params and all(value is not o for o in outs)
            outs.append(value if fresh else value.clone(memory_format=torch.contiguous_format))
        return tuple(outs)

    def value(self, name: str) -> torch.Tensor:
        try:
            return self.env[name]
        except KeyError:
            raise InterpError(f"{self.fn.name}: value %{name} is used before it is defined") from None

    def domain(self, axes: tuple[S.Axis, ...]) -> _Domain:
        sizes = tuple(self.dim(a.extent) for a in axes)
        for a, n in zip(axes, sizes, strict=True):
            if n < 0:
                raise self.error(f"axis `{a.name}` has extent {dim_str(a.extent)} = {n}, below zero", "dim")
        return _Domain(tuple(a.name for a in axes), sizes)

    # -------------------------------------------------------------- ops

    def compute(self, op: S.MapOp | S.ReduceOp | S.ContractOp) -> torch.Tensor:
        """The stored result of a map, reduction or contraction (a fresh contiguous tensor)."""
        reduce_axes = () if isinstance(op, S.MapOp) else op.reduce_axes
        dom = self.domain(op.axes + reduce_axes)
        keep = len(op.axes)
        out = torch.empty(dom.sizes[:keep], dtype=TORCH_DTYPES[op.dtype])
        if isinstance(op, S.MapOp):
            value = self.expr(op.body, dom)
        elif isinstance(op, S.ReduceOp) and op.limits:  # spec §8.11
            value = bounded(self, op, dom, keep, _identity(op.kind, op.dtype) if op.kind in S.REDUCE_KINDS else 0)
        elif isinstance(op, S.ReduceOp) and op.kind in S.ARG_KINDS + S.TOPK_KINDS:
            value = self.arg_reduce(op, dom, keep) if op.kind in S.ARG_KINDS else select_topk(self, op)
        elif 0 in dom.sizes:
            value = torch.tensor(_identity("sum" if isinstance(op, S.ContractOp) else op.kind, op.dtype))
        elif isinstance(op, S.ContractOp):
            dt = promote(op.lhs.dtype, op.rhs.dtype)
            acc = torch.float32 if dt.is_float else torch.int64
            value = self.sum_of_products(self.expr(op.lhs, dom).to(acc), self.expr(op.rhs, dom).to(acc), dom, keep)
        elif (op.kind == "sum" and isinstance(op.body, S.Binary) and op.body.op == "mul"
              and op.body.dtype.is_float and op.dtype.is_float):
            a, b = (self.expr(x, dom).to(torch.float32) for x in (op.body.a, op.body.b))
            value = self.sum_of_products(a, b, dom, keep)
        else:
            value = self.reduce(op, dom, keep)
        out.copy_(value)
        return out

    def scan(self, op: S.ScanOp) -> torch.Tensor:
        """A scan, in sequence along its axis (NumPy's ``accumulate`` and a loop over the positions for
        ``linear``: linear time, one rounding per operation, vectorised across the other axes)."""
        dom = self.domain(op.axes)
        out = torch.empty(dom.sizes, dtype=TORCH_DTYPES[op.dtype])
        if 0 in dom.sizes:
            return out
        acc = torch.float32 if op.dtype.is_float else torch.bool if op.dtype.is_bool else torch.int64
        k = dom.pos[op.axis]

        def along(e: S.SExpr) -> np.ndarray:  # the scanned axis first
            return np.moveaxis(self.expr(e, dom).to(acc).expand(dom.sizes).numpy(), k, 0)

        with np.errstate(all="ignore"):  # IEEE results (inf - inf is NaN) are the semantics, not a warning
            res = self.scan_values(op, along)
        out.copy_(torch.from_numpy(np.ascontiguousarray(np.moveaxis(res, 0, k))))
        return out

    def scan_values(self, op: S.ScanOp, along: Callable[[S.SExpr], np.ndarray]) -> np.ndarray:
        """The scan's values, the scanned axis first."""
        x = along(op.body)
        n = x.shape[0]
        if op.kind == "linear":
            assert op.coeff is not None and op.init is not None
            a = along(op.coeff)
            h = along(op.init)[0].copy()
            res = np.empty_like(x)
            for j in range(n):  # h = a * h + b: two roundings, never a fused multiply-add
                if op.exclusive:
                    res[j] = h
                h = np.add(np.multiply(a[j], h), x[j])
                if not op.exclusive:
                    res[j] = h
        else:
            ufunc = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}.get(op.kind)
            if ufunc is None:
                raise InterpError(f"{self.fn.name}: unknown scan {op.kind!r}")
            res = ufunc.accumulate(x, axis=0, dtype=x.dtype)  # sequential; maximum/minimum propagate NaN
            if op.exclusive:
                res = np.concatenate([np.full_like(res[:1], _identity(op.kind, op.dtype)), res[:-1]])
        return res

    def reduce(self, op: S.ReduceOp, dom: _Domain, keep: int) -> torch.Tensor:
        if op.kind not in S.REDUCE_KINDS:
            raise InterpError(f"{self.fn.name}: unknown reduction {op.kind!r}")
        acc = torch.float32 if op.dtype.is_float else torch.int64
        return fold(self.expr(op.body, dom).to(acc).expand(dom.sizes), dom.sizes, keep, op.kind, acc)

    def arg_reduce(self, op: S.ReduceOp, dom: _Domain, keep: int) -> torch.Tensor:
        """The first position of the largest (``argmax``) or smallest value along the one reduce
        axis; a NaN beats every number, so a row with NaN gives its first NaN; 0 over an empty axis."""
        if len(op.reduce_axes) != 1:
            raise InterpError(f"{self.fn.name}: reduce.{op.kind} over {len(op.reduce_axes)} axes")
        if dom.sizes[keep] == 0:
            return torch.zeros(dom.sizes[:keep], dtype=torch.int64)
        return positions(self.expr(op.body, dom).expand(dom.sizes), op.kind, None)

    @staticmethod
    def sum_of_products(a: torch.Tensor, b: torch.Tensor, dom: _Domain, keep: int) -> torch.Tensor:
        """``sum(a * b)`` over the domain's last axes, by einsum on the broadcast operands.

        A domain axis that neither operand depends on is left out of the einsum: kept
        axes broadcast afterwards, reduced ones multiply the result by their extent.
        """
        n = len(dom.sizes)
        labels = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
        if n > len(labels):
            raise InterpError(f"domain of {n} axes is too large for einsum")
        used: set[int] = set()
        operands, subscripts = [], []
        for t in (a, b):
            axes = [p for p in range(n) if t.shape[p] > 1]
            used.update(axes)
            operands.append(t.squeeze(tuple(p for p in range(n) if p not in axes)) if n else t)
            subscripts.append("".join(labels[p] for p in axes))
        out_axes = [p for p in range(keep) if p in used]
        result = torch.einsum(f"{subscripts[0]},{subscripts[1]}->{''.join(labels[p] for p in out_axes)}", *operands)
        repeat = math.prod(dom.sizes[p] for p in range(keep, n) if p not in used)
        if repeat != 1:
            result = result * repeat
        for p in range(keep):
            if p not in used:
                result = result.unsqueeze(p)
        return result

    def call(self, op: S.CallOp) -> tuple[torch.Tensor, ...]:
        try:
            callee = self.module.get(op.callee)
        except KeyError:
            raise InterpError(f"{self.fn.name}: call of unknown kernel `{op.callee}`") from None
        if len(op.args) > len(callee.params):
            raise InterpError(f"{self.fn.name}: `{op.callee}` called with {len(op.args)} arguments")
        args = {p.name: self.value(a) for p, a in zip(callee.params, op.args, strict=False)}
        preset = {name: self.dim(d) for name, d in op.dims}
        try:
            outs = run_function(callee, self.module, args, dims=preset)
        except GuardError as err:
            raise GuardError(self.fn.name, f"in the call of `{op.callee}` ({self.where}): {err}", rule=err.rule,
                             param=err.param) from err
        if len(outs) != len(op.results):
            raise InterpError(f"{self.fn.name}: `{op.callee}` gives {len(outs)} results, not {len(op.results)}")
        for out, t in zip(outs, op.types, strict=True):  # the call's declared types are the caller's contract
            shape = tuple(self.dim(d) for d in t.shape)
            if tuple(out.shape) != shape or out.dtype != TORCH_DTYPES[t.dtype]:
                raise InterpError(f"{self.fn.name}: `{op.callee}` returned {out.dtype}{list(out.shape)}, but the "
                                  f"call declares {t.dtype}{list(shape)}")
        return outs

    # -------------------------------------------------------------- scalar expressions

    def expr(self, e: S.SExpr, dom: _Domain) -> torch.Tensor:
        """``e`` over ``dom``: one dimension per domain axis (size 1 where unused), in ``e.dtype``'s compute type."""
        if isinstance(e, S.Const):  # a literal holds a value of its type: f16/bf16 literals are rounded
            return torch.full(dom.ones, e.value, dtype=TORCH_DTYPES[e.dtype]).to(compute(e.dtype))
        if isinstance(e, S.Idx):
            if e.name not in dom.pos:
                raise InterpError(f"{self.fn.name}: index `{e.name}` is not an axis of {self.where}")
            return torch.arange(dom.sizes[dom.pos[e.name]], dtype=compute(e.dtype)).view(dom.axis_shape(e.name))
        if isinstance(e, S.DimRef):  # a `let` of dims is exact in SymPy, and wraps as i64 arithmetic (spec §9.3)
            value = self.dim(e.dim)
            if e.dtype == DType.I64:
                value = (value + (1 << 63)) % (1 << 64) - (1 << 63)
            return torch.full(dom.ones, value, dtype=compute(e.dtype))
        if isinstance(e, S.Load):
            return self.load(e, dom).to(compute(e.dtype))
        if isinstance(e, S.Unary):
            return wrap(self.unary(e, dom), e.dtype)
        if isinstance(e, S.Binary):
            return wrap(self.binary(e, dom), e.dtype)
        if isinstance(e, S.Select):
            cond = self.expr(e.cond, dom).to(torch.bool)
            ct = compute(e.dtype)
            return torch.where(cond, self.expr(e.a, dom).to(ct), self.expr(e.b, dom).to(ct))
        if isinstance(e, S.Cast):
            x = self.expr(e.x, dom)
            if e.dtype.is_bool:
                return x != 0
            if e.dtype.compute != e.dtype:  # an explicit cast to f16/bf16 rounds now
                return x.to(TORCH_DTYPES[e.dtype]).to(compute(e.dtype))
            if e.x.dtype.is_float and not e.dtype.is_float:
                x = float_to_i64(x)
            return wrap(x.to(compute(e.dtype)), e.dtype)
        raise InterpError(f"{self.fn.name}: unknown expression {type(e).__name__}")

    def unary(self, e: S.Unary, dom: _Domain) -> torch.Tensor:
        x = self.expr(e.x, dom).to(compute(e.dtype))
        if e.op not in UNARY and e.op != "bitnot":
            raise InterpError(f"{self.fn.name}: unknown unary op {e.op!r}")
        if e.op in ("floor", "ceil") and not x.is_floating_point():
            return x
        if e.op == "bitnot":
            return torch.bitwise_not(x)  # on an unsigned value, _wrap then keeps its width
        return UNARY[e.op](x)

    def binary(self, e: S.Binary, dom: _Domain) -> torch.Tensor:
        a, b = self.expr(e.a, dom), self.expr(e.b, dom)
        if e.op in COMPARE:
            ct = compute(promote(e.a.dtype, e.b.dtype))
            return COMPARE[e.op](a.to(ct), b.to(ct))
        ct = compute(e.dtype)
        if e.op in S.SHIFTS:
            bits = e.dtype.bits
            bad = checked(self, (b < 0) | (b >= bits))
            if bool(bad.any()):
                count = int(b[bad].flatten()[0])
                raise self.error(f"shift count {count} is out of range for {e.dtype} (0 to {bits - 1})", "arith")
            b = b if self.valid is None else torch.where((b < 0) | (b >= bits), 0, b)  # past a length: unused
        a, b = a.to(ct), b.to(ct)
        if e.op in BITWISE:
            return BITWISE[e.op](a, b)
        if e.op in PLAIN:
            return PLAIN[e.op](a, b)
        floating = a.is_floating_point()
        if e.op in ("div", "floordiv", "mod") and not floating and bool(checked(self, b == 0).any()):
            raise self.error(f"integer {e.op} by zero", "arith")
        if e.op in ("div", "floordiv", "mod") and not floating and self.valid is not None:
            b = torch.where(b == 0, 1, b)  # past a length: unused
        if e.op == "div":
            return a / b if floating else torch.div(a, b, rounding_mode="floor")
        if e.op == "floordiv":
            return torch.floor(a / b) if floating else torch.div(a, b, rounding_mode="floor")
        if e.op == "mod":
            return float_mod(a, b) if floating else torch.remainder(a, b)
        if e.op == "pow":
            if not floating and bool(checked(self, b < 0).any()):
                raise self.error("integer raised to a negative power", "arith")
            return torch.pow(a, b)
        raise InterpError(f"{self.fn.name}: unknown binary op {e.op!r}")

    def load(self, e: S.Load, dom: _Domain) -> torch.Tensor:
        """The elements of ``e.src`` at ``e.indices`` over ``dom``, in the source's dtype."""
        src = self.value(e.src)
        if len(e.indices) != src.dim():
            raise InterpError(f"{self.fn.name}: {self.labels[e.src]} has rank {src.dim()} but is loaded with "
                              f"{len(e.indices)} subscripts in {self.where}")
        names = [i.name for i in e.indices if isinstance(i, S.Idx) and i.name in dom.pos]
        if len(names) == len(e.indices) and len(set(names)) == len(names):
            return self.view_load(e, src, names, dom)
        subs: list[torch.Tensor] = []
        for k, sub in enumerate(e.indices):
            index = self.expr(sub, dom)
            if index.is_floating_point() or index.dtype == torch.bool:
                raise InterpError(f"{self.fn.name}: subscript {k} of {self.labels[e.src]} is not an integer")
            index = index.to(torch.int64)
            self.check_range(e, k, index, src.shape[k])
            if self.valid is not None:  # past a length the subscript may be anything (unused): read element 0
                index = torch.where((index < 0) | (index >= src.shape[k]), 0, index)
            subs.append(index)
        if not subs:
            return src.reshape(dom.ones)
        return src[tuple(subs)]

    def view_load(self, e: S.Load, src: torch.Tensor, names: list[str], dom: _Domain) -> torch.Tensor:
        """A load whose subscripts are distinct domain axes: a strided view, no copy."""
        for k, name in enumerate(names):
            extent = dom.sizes[dom.pos[name]]
            if extent > src.shape[k]:
                self.check_range(e, k, torch.tensor([src.shape[k]]), src.shape[k])
            if extent < src.shape[k]:
                src = src.narrow(k, 0, extent)
        positions = [dom.pos[n] for n in names]
        view = src.permute(sorted(range(len(names)), key=lambda k: positions[k]))
        for p in range(len(dom.sizes)):
            if p not in positions:
                view = view.unsqueeze(p)
        return view

    def check_range(self, e: S.Load, k: int, index: torch.Tensor, size: int) -> None:
        """Every value of subscript ``k`` of the access ``e`` lies on its axis of ``size``; the error
        quotes the access as written (``table[ids[t] + 1, d]``)."""
        bad = checked(self, (index < 0) | (index >= size))
        if bool(bad.any()):
            value = int(index[bad].flatten()[0])
            tensor = f"`{self.names[e.src]}`" if e.src in self.names else "an intermediate value"
            sub = source_form(e.indices[k], self.names)
            raise self.error(f"subscript {k} of {tensor} is {value}, outside its axis {k} of size {size} "
                             f"(valid: 0 to {size - 1}): `{sub}` in `{source_form(e, self.names)}`", "index")
