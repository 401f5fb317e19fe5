"""Run-time errors name what the user wrote (issue 17): the access and its subscript as written
(``table[ids[t] + 1, d]``) and what was being computed (a named tensor, a kernel's result),
never an internal SSA name such as ``%0`` — on the interpreter and on every runnable target,
whose runtimes ask the interpreter to explain a raised error word (after fusion, too)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import sympy
from codegen_support import RUNNABLE, build, text_module

from arke.ir import semantic as S
from arke.ir.dtypes import DType
from arke.runtime.guards import GuardError
from arke.runtime.source_form import op_description, source_form

SOURCE = """
kernel gather(table: f32[V, D], ids: i64[T]) -> f32[T, D] {
  return table[ids[t], d] * 2.0
}

kernel shifted(table: f32[V, D], ids: i64[T]) -> f32[T, D] {
  e[t, d] = table[ids[t] + 1, d]
  return e[t, d] * 2.0
}

kernel pick(x: f32[N], ids: i64[T]) -> f32[T] {
  return x[ids[t] % N] + x[(ids[t] * 3) // 2]
}

kernel ratio(x: i64[N], y: i64[N]) -> i64[N] {
  return x[n] // y[n]
}
"""
TABLE, IDS = np.ones((4, 3), np.float32), np.array([0, 5], np.int64)
# kernel -> (arguments, the message's words: the access and the subscript as written, the op computed)
CASES: dict[str, tuple[tuple[Any, ...], tuple[str, ...]]] = {
    "gather": ((TABLE, IDS), ("subscript 0 of `table` is 5", "(valid: 0 to 3): `ids[t]` in `table[ids[t], d]`",
                              "(in the result of `gather`)")),
    "shifted": ((TABLE, IDS), ("subscript 0 of `table` is 6", ": `ids[t] + 1` in `table[ids[t] + 1, d]`")),
    "pick": ((np.ones(4, np.float32), np.array([1, 3], np.int64)),
             ("subscript 0 of `x` is 4", ": `(ids[t] * 3) // 2` in `x[(ids[t] * 3) // 2]`")),
    "ratio": ((np.array([1, 2]), np.array([1, 0])), ("integer floordiv by zero", "(in the result of `ratio`)")),
}


def _message(run: Any, args: tuple[Any, ...]) -> str:
    with pytest.raises(GuardError) as caught:
        run(*args)
    return str(caught.value)


@pytest.mark.parametrize("target", ["interp", *RUNNABLE])
@pytest.mark.parametrize("name", sorted(CASES))
def test_run_time_errors_name_what_the_user_wrote(name: str, target: str) -> None:
    module = text_module(SOURCE)
    run = module.kernels[name] if target == "interp" else build(module, target).kernels[name]
    args, words = CASES[name]
    message = _message(run, args)
    for w in words:
        assert w in message, message
    assert not re.search(r"%\w", message), f"an internal name in: {message}"


def test_a_named_tensor_is_named() -> None:
    message = _message(text_module(SOURCE).kernels["shifted"], (TABLE, IDS))
    assert message.endswith("(in `e`)"), message


def test_source_form_of_each_kind_of_expression() -> None:
    load = S.Load("ids", (S.Idx("t"),), DType.I64)
    e = S.Select(S.Binary("lt", load, S.DimRef(sympy.Symbol("N")), DType.BOOL),
                 S.Unary("neg", S.Cast(load, DType.F32), DType.F32), S.Const(1.5, DType.F32), DType.F32)
    assert source_form(e, {"ids": "ids"}) == "-f32(ids[t]) if (ids[t] < N) else 1.5"
    assert source_form(S.Load("7", (S.Idx("t"),), DType.F32), {}) == "…[t]"  # a value without a source name


def test_op_description_names_no_ssa_value() -> None:
    fn = text_module("kernel f(x: f32[N]) -> f32[N] {\n  return x[n] * 2.0\n}\n").semantic.functions[0]
    body = S.Const(0.0, DType.F32)
    assert op_description(S.MapOp("e1", DType.F32, (), body, name="e"), fn) == "`e`"
    assert op_description(S.MapOp(fn.results[0], DType.F32, (), body), fn) == "the result of `f`"
    assert op_description(S.MapOp("other", DType.F32, (), body), fn) == "an intermediate value of `f`"


def test_a_generic_kernel_is_named_as_written_with_its_binding() -> None:
    """Errors name ``lin`` (W = f32), not the specialisation's IR name ``lin__W_f32``; ``.kernel`` keeps the IR name."""
    import torch

    import arke
    from arke.runtime.errors import GuardError, shown_kernel

    m = arke.loads("kernel lin(x: W[M, K], w: W[N, K]) -> f32[M, N] where W in {f32, bf16} "
                   "{ return sum(f32(x[m, k]) * f32(w[n, k]) for k) }", "<generic>")
    try:
        m.kernels["lin"](torch.zeros(2, 3), torch.zeros(4, 5))
    except GuardError as err:
        assert str(err).startswith("kernel `lin` (W = f32): ") and err.kernel == "lin__W_f32"
    else:
        raise AssertionError("no GuardError")
    assert shown_kernel("a__A_f32__B_i8") == "`a` (A = f32, B = i8)" and shown_kernel("x__y") == "`x__y`"
