"""The argreduce pass (``arke.passes.argreduce``): arg-reductions become a ``max``/``min`` and a ``min``
of positions, and the interpreter gives the lowered kernel exactly the answer it gives the
arg-reduction itself, on every kind of row (NaN, ties, signed zeros, infinities, 16-bit floats
computed in f32, booleans, an axis that may be empty)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from argreduce_support import COMPOSED, DTYPES, kinds, rows_source, values
from codegen_support import same_bits, seeded, text_module

from arke.ir import semantic as S
from arke.ir.verify import verify
from arke.passes import run_passes
from arke.runtime import interp


def lowered(module: S.Module, name: str) -> S.Module:
    fn = run_passes(module, name, verify_each=True)
    assert not any(isinstance(op, S.ReduceOp) and op.kind in S.ARG_KINDS for op in fn.ops)
    out = S.Module((fn,))
    verify(out)
    return out


@pytest.mark.parametrize(("dtype", "kind"), [(d, k) for d in DTYPES for k in kinds(d)])
def test_lowered_rows_equal_the_arg_reduction(dtype: str, kind: str) -> None:
    module = text_module(rows_source(dtype))
    for shape in ((1, 1), (6, 33), (7, 5)):
        x = values(kind, dtype, shape, seeded("argreduce-pass", dtype, kind, shape))
        for name in ("amax", "amin", "cmax", "cmin"):
            ir_name = module.kernel_map[f"{name}_{dtype}"]
            want = interp.run(module.semantic, ir_name, (x,), {})
            got = interp.run(lowered(module.semantic, ir_name), ir_name, (x,), {})
            assert same_bits(got, want), f"{name}_{dtype} on {kind} rows"


def test_lowered_composed_kernels_equal_the_arg_reductions() -> None:
    module = text_module(COMPOSED)
    rng = seeded("argreduce-pass-composed")
    logits = values("nan", "f32", (6, 33), rng)
    x16 = values("ties", "f16", (6, 17), rng)
    cases = {
        "greedy_step": (logits, rng.integers(0, 33, 6)),
        "nearest": (x16, np.array([0.5, -1.0, 2.0, 9.0, 0.0, -0.0], dtype=np.float16)),
        "value_and_position": (values("zeros", "bf16", (5, 9), rng),),
        "tail": (values("ties", "f32", (4, 5), rng), values("ties", "f32", (4, 4), rng)),
    }
    for name, args in cases.items():
        ir_name = module.kernel_map[name]
        want = interp.run(module.semantic, ir_name, args, {})
        got = interp.run(lowered(module.semantic, ir_name), ir_name, args, {})
        assert same_bits(got, want), name
    ir_name = module.kernel_map["tail"]
    empty = (np.ones((2, 1), dtype=np.float32), np.ones((2, 0), dtype=np.float32))
    assert same_bits(interp.run(lowered(module.semantic, ir_name), ir_name, empty, {}),
                     (torch.zeros(2, dtype=torch.int64).numpy(),) * 2)


def test_a_plain_axis_needs_no_fix_up_map_and_a_compound_one_does() -> None:
    module = text_module(COMPOSED)
    ops = lowered(module.semantic, module.kernel_map["tail"]).functions[0].ops
    kinds_seen = [op.kind if isinstance(op, S.ReduceOp) else "map" for op in ops]
    # argmax over N - 1 (may be empty): max, min of positions, the map that turns an empty min into 0;
    # argmin over N: min, min of positions
    assert kinds_seen == ["max", "min", "map", "min", "min"]
