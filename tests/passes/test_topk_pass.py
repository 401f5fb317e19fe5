"""The topk pass (``arke.passes.topk``): top-k selections become rounds of a ``max``/``min`` and a
``min`` of positions (a literal K) or ranks (a K given by a dim), and the interpreter gives the
lowered kernel exactly the answer it gives the selection itself, on every kind of row (NaN, ties,
signed zeros, infinities, integer extremes, 16-bit floats computed in f32); a values op and a
positions op over one body share one selection."""

from __future__ import annotations

import numpy as np
import pytest
from argreduce_support import DTYPES, kinds, values
from codegen_support import seeded, text_module
from topk_support import COMPOSED, rows_source, torch_of

from arke.ir import semantic as S
from arke.ir.verify import verify
from arke.passes import run_passes
from arke.runtime import interp


def lowered(module: S.Module, name: str) -> S.Module:
    fn = run_passes(module, name, verify_each=True)
    assert not any(isinstance(op, S.ReduceOp) and op.kind in S.TOPK_KINDS for op in fn.ops)
    out = S.Module((fn,))
    verify(out)
    return out


def same_values(got: object, want: object) -> bool:
    """Equal values, NaN equal to NaN (whatever its payload: a gather may quiet it), zeros by sign."""
    pairs = zip(got, want, strict=True) if isinstance(got, tuple) and isinstance(want, tuple) else [(got, want)]
    for g, w in pairs:
        a, b = np.asarray(torch_of(g).float()), np.asarray(torch_of(w).float())
        if a.shape != b.shape or not np.array_equal(a, b, equal_nan=True):
            return False
        if not np.array_equal(np.signbit(a) & ~np.isnan(a), np.signbit(b) & ~np.isnan(b)):
            return False
    return True


def _args(name: str, x: object, n: int) -> tuple[object, ...]:
    return (x, np.zeros(min(3, n), dtype=np.int64)) if name in ("topk", "bottomk") else (x,)


@pytest.mark.parametrize(("dtype", "kind"), [(d, k) for d in DTYPES for k in kinds(d)])
def test_lowered_rows_equal_the_selection(dtype: str, kind: str) -> None:
    module = text_module(rows_source(dtype, more=True))
    for shape in ((4, 4), (6, 33), (7, 5)):
        x = values(kind, dtype, shape, seeded("topk-pass", dtype, kind, shape))
        for name in ("top4", "bot4", "topk", "bottomk", "top1", "ctop2"):
            ir_name = module.kernel_map[f"{name}_{dtype}"]
            args = _args(name, x, shape[1])
            want = interp.run(module.semantic, ir_name, args, {})
            got = interp.run(lowered(module.semantic, ir_name), ir_name, args, {})
            assert same_values(got, want), f"{name}_{dtype} on {kind} rows {shape}"


def test_lowered_composed_kernels_equal_the_selections() -> None:
    module = text_module(COMPOSED)
    rng = seeded("topk-pass-composed")
    inputs = {
        "route_top2": (values("ties", "f32", (9, 8), rng),),
        "shifted": (values("nan", "f32", (5, 40), rng),),
        "picked": (values("random", "f32", (3, 17), rng), values("random", "f32", (17, 4), rng)),
        "sort5": (values("zeros", "bf16", (6, 5), rng),),
        "vec3": (values("ties", "f16", (1, 33), rng)[0],),
    }
    for name, args in inputs.items():
        ir_name = module.kernel_map[name]
        want = interp.run(module.semantic, ir_name, args, {})
        got = interp.run(lowered(module.semantic, ir_name), ir_name, args, {})
        assert same_values(got, want), name


def test_values_and_positions_share_one_selection() -> None:
    module = text_module(rows_source("f32", more=True))
    fn = lowered(module.semantic, module.kernel_map["top4_f32"]).functions[0]
    rounds = [op for op in fn.ops if isinstance(op, S.ReduceOp) and op.kind == "max"]
    assert len(rounds) == 4  # one per rank, not one per output
    ranked = lowered(module.semantic, module.kernel_map["topk_f32"]).functions[0]
    assert [op.kind for op in ranked.ops if isinstance(op, S.ReduceOp)] == ["sum", "min"]
