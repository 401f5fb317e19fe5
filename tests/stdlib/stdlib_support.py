"""Shared helpers of the standard-library tests (tests/stdlib/test_*.py).

The kernels run on the reference interpreter; every expected value is an independent
torch expression written in the test, evaluated in float64 (the "true" answer) and
compared with the f32 result. f32 has a unit roundoff of 2**-24 ≈ 6e-8, so the default
rtol = atol = 1e-5 leaves roughly a hundred ulps for the few roundings a short kernel does;
tests with long reductions loosen it and say why.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest
import torch

import arke
from arke.lang.checker import stdlib_path
from arke.runtime.interp import GuardError

__all__ = ["ATOL", "RTOL", "GuardError", "assert_close", "expect_guard", "f64", "kernel", "randn", "std_module"]

RTOL = 1e-5
ATOL = 1e-5


@cache
def std_module(name: str) -> arke.Module:
    """The loaded standard-library module ``name`` (``"std.nn"``), loaded once per session."""
    return arke.load(stdlib_path(name))


def kernel(module: str, name: str) -> arke.Kernel:
    """Kernel ``name`` of standard-library module ``module``."""
    return std_module(module).kernels[name]


def randn(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    """Standard-normal f32 samples times ``scale``."""
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def f64(a: np.ndarray | torch.Tensor) -> torch.Tensor:
    """``a`` as a float64 torch tensor (integer tensors keep their dtype)."""
    t = torch.as_tensor(a)
    return t.double() if t.is_floating_point() else t


def assert_close(actual: Any, expected: torch.Tensor, *, rtol: float = RTOL, atol: float = ATOL,
                 kind: type = np.ndarray) -> None:
    """``actual`` is an f32 result of the given kind (NumPy array or torch tensor) close to ``expected``."""
    assert isinstance(actual, kind), f"expected a {kind.__name__}, got {type(actual).__name__}"
    got = torch.as_tensor(actual)
    assert got.dtype == torch.float32, f"result dtype {got.dtype}, expected float32"
    shape, want = tuple(got.shape), tuple(expected.shape)
    assert shape == want, f"result shape {shape}, expected {want}"
    torch.testing.assert_close(got.double(), expected.double(), rtol=rtol, atol=atol)


def expect_guard(k: arke.Kernel, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None, *, rule: str,
                 param: str | None, mentions: tuple[str, ...] = ()) -> GuardError:
    """Call ``k(*args, **kwargs)``; check it raises a GuardError of ``rule`` naming the kernel and ``param``.

    ``param=None`` is for a broken ``where`` clause, which relates several parameters: its
    message quotes the clause instead (pass it in ``mentions``). Out-of-range subscripts
    (rule ``index``) are found while running, inside an op: their message names the tensor,
    but ``GuardError.param`` is left unset, so only the message is checked for them.
    """
    with pytest.raises(GuardError) as info:
        k(*args, **(kwargs or {}))
    err = info.value
    message = str(err)
    assert isinstance(err, ValueError)
    assert message.startswith(f"kernel `{k.name}`: "), message
    assert err.kernel == k.name
    assert err.rule == rule, (err.rule, message)
    if param is not None:
        assert f"`{param}`" in message, message
    if rule != "index":
        assert err.param == param, (err.param, message)
    for text in mentions:
        assert text in message, message
    return err
