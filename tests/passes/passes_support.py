"""Shared helpers of the pass tests: random arguments from a kernel's signature, and the before/after check.

Every pass must keep meaning, so each test runs a kernel on the reference interpreter
before and after the passes, on the same random inputs, and compares. The comparison is
**bit for bit** by default: inlining only renames, and fusion only recomputes a stored
element from the same inputs with the same operations (the store's rounding kept as an
explicit cast), so every element comes out identical. The one allowed difference is a
reduction whose body changed: the interpreter (like any target) may then sum in another
order — it runs ``sum(a * b)`` as an einsum, and torch's sum order depends on the body's
memory layout (a fused body read through a transposed view) — and a reassociated float sum of
``n`` terms differs from another order by at most ``2 * gamma(n) * sum |term|`` with
``gamma(n) = n * u / (1 - n * u)`` and ``u`` the unit roundoff (Higham, *Accuracy and Stability
of Numerical Algorithms*, §4.2). Tests that allow it say so and pass that bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import torch

import arke
from arke.ir import semantic as S
from arke.ir.dtypes import DType
from arke.ir.verify import verify
from arke.lang.checker import stdlib_modules, stdlib_path
from arke.passes import run_passes
from arke.runtime.guards import TORCH_DTYPES, eval_dim
from arke.runtime.interp import run_function

ROOT = Path(__file__).resolve().parents[2]
#: Ragged sizes every dim is drawn from unless a kernel's table says otherwise.
SIZES = (1, 3, 17)
#: Integer tensor parameters whose values index an axis: name -> the dim they index.
INDEX_PARAMS = {"ids": "V", "target": "V"}
#: Other integer tensor parameters with their own range (positions go up to a context length).
INT_RANGES = {"pos": 4096}


@cache
def load(path: str) -> arke.Module:
    """A checked `.ak` file, loaded once per session."""
    return arke.load(path)


def program_paths() -> list[str]:
    """Every standard-library module and every example program."""
    return [str(stdlib_path(m)) for m in stdlib_modules()] + sorted(str(p) for p in (ROOT / "examples").glob("*.ak"))


def own_kernels(path: str) -> list[tuple[str, str]]:
    """(path, IR name) of each kernel a file defines (imported ones are tested in their own file)."""
    mod = load(path)
    out = []
    for n in mod.names:
        ir_name = mod.kernel_map[n]
        generic = mod.generics.get(ir_name)  # a generic kernel (spec §5.6): each specialisation
        out += [(path, ir_name)] if generic is None else [(path, name) for _, name in generic.members]
    return out


def random_args(fn: S.Function, dims: Mapping[str, int], gen: torch.Generator,
                ranges: Mapping[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """Random tensors for ``fn``'s tensor parameters with the given dim values; scalars keep their defaults.

    Floats are standard normal (rounded to the parameter's dtype); integer parameters that
    index an axis (:data:`INDEX_PARAMS`) lie within it, others within :data:`INT_RANGES` or
    below the smallest dim; bools are fair coins. A scalar without a default gets 1. ``ranges`` gives
    a kernel's own integer parameters their bound: a dim's name, a number, or a function of the dims.
    """
    args: dict[str, torch.Tensor] = {}
    for p in fn.params:
        dtype = TORCH_DTYPES[p.type.dtype]
        if p.type.rank == 0:
            if p.default is None:
                args[p.name] = torch.tensor(1, dtype=dtype)
            continue
        shape = tuple(eval_dim(d, dims) for d in p.type.shape)
        if p.type.dtype.is_float:
            args[p.name] = torch.randn(shape, generator=gen).to(dtype)
        elif p.type.dtype.is_bool:
            args[p.name] = torch.randint(0, 2, shape, generator=gen).to(torch.bool)
        else:
            own = (ranges or {}).get(p.name)
            if own is not None:
                high = dims[own] if isinstance(own, str) else own(dims) if callable(own) else int(own)
            else:
                high = (dims[INDEX_PARAMS[p.name]] if p.name in INDEX_PARAMS
                        else INT_RANGES.get(p.name, min(dims.values())))
            args[p.name] = torch.randint(0, high, shape, generator=gen).to(dtype)
    return args


def default_dims(fn: S.Function, seed: int, count: int = 3) -> list[dict[str, int]]:
    """``count`` assignments of :data:`SIZES` to ``fn``'s dims: all ones, then random ragged mixes."""
    names = [b.dim for b in fn.bindings]
    gen = torch.Generator().manual_seed(seed)
    cases = [dict.fromkeys(names, 1)]
    while len(cases) < count:
        cases.append({n: SIZES[int(torch.randint(len(SIZES), (), generator=gen))] for n in names})
    return cases


def optimise(module: S.Module, name: str) -> S.Function:
    """Kernel ``name`` after the pipeline, verified after every pass and as a module of its own."""
    fn = run_passes(module, name, verify_each=True)
    verify(S.Module((fn,)))
    assert not any(isinstance(op, S.CallOp) for op in fn.ops), "a call is left after the passes"
    return fn


def assert_same(module: S.Module, name: str, optimised: S.Function, dims: Mapping[str, int], seed: int,
                *, reorder_bound: Any = None, ranges: Mapping[str, Any] | None = None) -> None:
    """Kernel ``name`` and ``optimised`` give the same results on random inputs of the given dims.

    Bit-identical unless ``reorder_bound`` is given: a function of the inputs returning, per
    result, the largest difference a reassociated reduction may make (see the module doc).
    """
    original = module.get(name)
    args = random_args(original, dims, torch.Generator().manual_seed(seed), ranges)
    before = run_function(original, module, args)
    after = run_function(optimised, S.Module((optimised,)), args)
    assert len(before) == len(after)
    bounds = reorder_bound(args) if reorder_bound is not None else [None] * len(before)
    for k, (b, a, bound) in enumerate(zip(before, after, bounds)):
        assert b.dtype == a.dtype and b.shape == a.shape, (k, b.dtype, a.dtype, b.shape, a.shape)
        if bound is None:
            same = torch.equal(b, a) or bool(torch.equal(b.isnan(), a.isnan()) and (b == a)[~b.isnan()].all())
            assert same, f"result {k} of @{name} changed at dims {dict(dims)}: max |diff| = " \
                         f"{(b.double() - a.double()).abs().max().item()}"
        else:
            diff = (b.double() - a.double()).abs()
            assert bool((diff <= bound).all()), f"result {k} of @{name}: |diff| {diff.max().item()} over the bound"


def gamma(n: int, dtype: DType = DType.F32) -> float:
    """Higham's ``gamma(n) = n u / (1 - n u)`` for the unit roundoff of ``dtype``'s accumulator (f32)."""
    u = 2.0**-24 if dtype.is_float else 0.0
    return n * u / (1 - n * u)


def count_ops(fn: S.Function, kind: type | None = None) -> int:
    """How many ops ``fn`` has (of one kind, if given)."""
    return sum(1 for op in fn.ops if kind is None or isinstance(op, kind))
