"""Dead-code elimination: unread ops go, chains of them too, and the rest is numbered densely."""

from __future__ import annotations

import torch

from arke.ir import semantic as S
from arke.ir.text import print_function, read_module
from arke.ir.verify import verify
from arke.passes import dead_code, run_passes
from arke.passes.rewrite import renumber
from arke.runtime.interp import run_function

TEXT = """arke.semantic 1

kernel @pair(%x: f32[N]) -> (f32[N], f32[N])
  dims N = %x.0
{
  %0 = map f32 [i < N] { exp(%x[i]) }
  %1 = map f32 [i < N] { neg(%x[i]) }
  return %0, %1
}

kernel @k(%x: f32[N], %y: f32[N]) -> (f32[N], f32[N])
  dims N = %x.0
  where N > 0
{
  %3 = map f32 [i < N] { exp(%x[i]) }
  %5 = map f32 [i < N] { mul(%3[i], 2.0) }
  %7 = map f32 [i < N] { add(%x[i], %y[i]) }
  %8, %9 = call @pair(%7) : (f32[N], f32[N]) dims {N = N}
  %12 = reduce.sum f32 [] over [i < N] { %5[i] }
  %13 = map f32 [i < N] { add(%9[i], 1.0) }
  return %13, %y
}
"""


def test_dead_ops_go_and_values_are_renumbered() -> None:
    module = read_module(TEXT)
    verify(module)
    fn = dead_code(module.get("k"))
    verify(S.Module((fn, module.get("pair"))))
    # %3 -> %5 -> %12 is a dead chain; the call stays (one of its two results is read).
    assert [type(op) for op in fn.ops] == [S.MapOp, S.CallOp, S.MapOp]
    call = fn.ops[1]
    assert isinstance(call, S.CallOp) and call.results == ("1", "2") and call.args == ("0",)
    assert fn.results == ("3", "y")
    assert fn.guards == module.get("k").guards
    args = {"x": torch.randn(5), "y": torch.randn(5)}
    before = run_function(module.get("k"), module, args)
    after = run_function(fn, S.Module((fn, module.get("pair"))), args)
    assert all(torch.equal(b, a) for b, a in zip(before, after))


def test_dead_code_is_idempotent_and_keeps_live_kernels_as_they_are() -> None:
    module = read_module(TEXT)
    fn = dead_code(module.get("k"))
    assert dead_code(fn) == fn
    pair = module.get("pair")
    assert dead_code(pair) == pair
    assert renumber(pair) == pair


def test_pipeline_removes_unread_calls() -> None:
    """After inlining, the callee's unread result (exp) is dead like any other op."""
    fn = run_passes(read_module(TEXT), "k", verify_each=True)
    assert "exp" not in print_function(fn)
    assert [type(op) for op in fn.ops] == [S.MapOp]
