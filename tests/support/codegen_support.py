"""Shared helpers of the codegen conformance tests (tests/targets/, tests/plan/).

Every compiled target is compared with the reference interpreter (the oracle) on the same
inputs. Libraries are built once per process and kept here, so each distinct kernel
compiles once however many tests call it (compile time is most of these tests' cost).
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Mapping, Sequence
from functools import cache
from typing import Any

import numpy as np
import torch

import arke
from arke.ir.dtypes import DType
from arke.ir.shapes import evaluate
from arke.lang.checker import stdlib_modules, stdlib_path
from arke.library import TARGETS_RUNNABLE, Library
from arke.runtime.guards import TORCH_DTYPES
from arke.runtime.tolerance import FLUSHED as FLUSHED  # re-exported: the tests import the rule from here
from arke.runtime.tolerance import results as results
from arke.runtime.tolerance import same_bits as same_bits
from arke.runtime.tolerance import tolerance as tolerance
from arke.runtime.tolerance import within
from arke.targets import base as targets

#: Every registered target, and those that can run on this machine.
TARGETS = targets.names()
RUNNABLE = tuple(t for t in TARGETS if t in TARGETS_RUNNABLE)
STDLIB = tuple(stdlib_modules())

@cache
def std_module(name: str) -> arke.Module:
    """The standard-library module ``name`` (``"std.nn"``), loaded once per process."""
    return arke.load(stdlib_path(name))


#: The weight dtypes decoder layers use: the slow per-kernel GPU compiles of every stdlib kernel take only the
#: specialisations of these (the f16 and u8 ones are compiled in tests/targets/test_generics_targets.py).
LAYER_DTYPES = ("f32", "bf16", "i8")


def kernel_names(module: arke.Module, dtypes: Collection[str] | None = None) -> list[str]:
    """The kernels ``module`` defines, each generic one (spec §5.6) as its specialisations (``attn_in__W_bf16``:
    names in ``kernel_map`` that plans and renderers take like any other); with ``dtypes``, only those
    whose every variable is one of them."""
    out: list[str] = []
    for n in module.names:
        generic = module.generics.get(module.kernel_map[n])
        out += [n] if generic is None else [n + ir[len(generic.name):] for combo, ir in generic.members
                                            if dtypes is None or all(str(d) in dtypes for d in combo)]
    return out


@cache
def text_module(text: str) -> arke.Module:
    """A module of `.ak` source text written in a test, loaded once per process."""
    return arke.loads(text, "<test>")


_LIBRARIES: dict[tuple[int, str], tuple[arke.Module, Library]] = {}


def build(module: arke.Module, target: str) -> Library:
    """``arke.build(module, target)``, once per module and target in this process."""
    key = (id(module), target)
    if key not in _LIBRARIES:
        _LIBRARIES[key] = (module, arke.build(module, target=target))  # the module is kept alive: its id stays unique
    return _LIBRARIES[key][1]


def seeded(*parts: object) -> np.random.Generator:
    """A generator seeded from ``parts`` (e.g. a kernel name and shape): reproducible per case."""
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def shape_of(param: Any, dims: Mapping[str, int]) -> tuple[int, ...]:
    """A parameter's shape for these dim values."""
    return tuple(evaluate(d, dict(dims)) for d in param.type.shape)


def random_inputs(kernel: arke.Kernel, dims: Mapping[str, int], rng: np.random.Generator, *,
                  ids: Mapping[str, str | int] | None = None, ties: bool = False) -> list[Any]:
    """Random tensors for every tensor parameter of ``kernel`` with these dims, in order.

    Floats are standard normal (bf16 comes as a torch tensor: NumPy has none); with ``ties``
    they are rounded to multiples of 0.5, so equal values (and tied maxima) occur. Integer
    tensors named in ``ids`` hold ids in ``[0, bound)`` (a dim name or a number); other
    integers span a small signed range; bools are fair coins.
    """
    out: list[Any] = []
    for p in kernel.function.params:
        if p.type.rank == 0:
            continue
        shape, dt = shape_of(p, dims), p.type.dtype
        if dt.is_float:
            values = rng.standard_normal(shape)
            if ties:
                values = np.round(values * 2) / 2
            out.append(as_dtype(values, dt))
        elif dt.is_int:
            bound = (ids or {}).get(p.name)
            if bound is not None:
                hi = dims[bound] if isinstance(bound, str) else bound
                out.append(rng.integers(0, hi, shape).astype(torch_to_numpy(dt)))
            else:
                out.append(rng.integers(-100, 100, shape).astype(torch_to_numpy(dt)))
        else:
            out.append(rng.random(shape) < 0.5)
    return out


def torch_to_numpy(dt: DType) -> Any:
    return torch.empty(0, dtype=TORCH_DTYPES[dt]).numpy().dtype


def as_dtype(values: np.ndarray, dt: DType) -> Any:
    """Float values stored in ``dt``: a NumPy array, or a torch tensor for bf16."""
    if dt is DType.BF16:
        return torch.from_numpy(np.asarray(values, dtype=np.float32)).to(torch.bfloat16)
    return np.asarray(values).astype(torch_to_numpy(dt))


def assert_matches(got: Any, want: Any, *, bound: Sequence[torch.Tensor | None] | None = None,
                   rtol: float | None = None, atol: float | None = None, what: str = "") -> None:
    """A compiled result equals the interpreter's: same kind, dtype and shape, values within tolerance.

    Integers and booleans must be equal. Floats must be within ``bound`` (from
    :func:`tolerance`, the rule), or within an explicit ``rtol``/``atol`` (``rtol=0, atol=0``:
    bit for bit up to NaN payloads); NaN matches NaN, infinities must match exactly.
    """
    assert (bound is None) != (rtol is None and atol is None), "give a bound (see tolerance) or rtol and atol"
    got_t, want_t = results(got), results(want)
    assert len(got_t) == len(want_t), f"{what}: {len(got_t)} results, the interpreter gives {len(want_t)}"
    for k, (g, w) in enumerate(zip(got_t, want_t)):
        label = f"{what} result {k}"
        assert type(g) is type(w), f"{label}: got a {type(g).__name__}, the interpreter gives a {type(w).__name__}"
        gt, wt = torch.as_tensor(g).detach().cpu(), torch.as_tensor(w).detach().cpu()
        assert gt.dtype == wt.dtype, f"{label}: dtype {gt.dtype}, the interpreter gives {wt.dtype}"
        assert gt.shape == wt.shape, f"{label}: shape {tuple(gt.shape)}, the interpreter gives {tuple(wt.shape)}"
        if not gt.is_floating_point():
            assert torch.equal(gt, wt), f"{label}: differs at {torch.nonzero(gt != wt)[:5].tolist()}:\n{gt}\n{wt}"
        elif bound is None:
            try:
                torch.testing.assert_close(gt.float(), wt.float(), rtol=rtol or 0.0, atol=atol or 0.0, equal_nan=True)
            except AssertionError as err:
                raise AssertionError(f"{label}: {err}") from None
        else:
            within(gt.double(), wt.double(), bound[k], label)


def assert_conforms(got: Any, kernel: arke.Kernel, *args: Any, what: str = "", **scalars: Any) -> Any:
    """``got`` (a compiled ``kernel`` on ``args`` and ``scalars``) equals the interpreter's answer
    within :func:`tolerance`; returns that answer. A generic ``kernel`` (spec §5.6) stands for the
    specialisation ``args`` bind."""
    kernel = kernel.bound(*args, **scalars)
    want = kernel(*args, **scalars)
    assert_matches(got, want, bound=tolerance(kernel, args, scalars), what=what)
    return want


def dims_id(dims: Mapping[str, int] | Sequence[tuple[str, int]]) -> str:
    items = dims.items() if isinstance(dims, Mapping) else dims
    return ",".join(f"{k}={v}" for k, v in items)


#: Causal GQA attention on bf16 q, k, v with a bf16 result (the 16-bit attention path of every target).
HALF_ATTENTION = """
kernel half_io(q: bf16[B, H, S, D], k: bf16[B, G, T, D], v: bf16[B, G, T, D]) -> bf16[B, H, S, D]
  where H % G == 0, T >= S
{
  let R = H / G
  s[b, h, i, j] = sum(f32(q[b, h, i, d]) * f32(k[b, h / R, j, d]) for d) / sqrt(f32(D))
  c[b, h, i, j] = s[b, h, i, j] if j <= i + T - S else -inf
  mx[b, h, i] = max(c[b, h, i, j] for j)
  p[b, h, i, j] = exp(c[b, h, i, j] - mx[b, h, i])
  return bf16(sum(p[b, h, i, j] * f32(v[b, h / R, j, d]) for j) / sum(p[b, h, i, j] for j))
}
"""
