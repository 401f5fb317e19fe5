"""Row groups whose map members index their innermost axis through conditions, remainders and selects of
subscripts (arke/targets/llvm/rows_partition.py): each such member's loop is partitioned like a single-op
map's. Against the interpreter on ragged rows (R = 1, 33, 2049), with values kept per row in scratch, 16-bit
storage, errors where the interpreter stops, and the same bits on 1, 2 and 3 threads; and the fact that the
rotary member runs as vector pieces (code, not timing)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from codegen_support import as_dtype, assert_conforms, build, seeded, text_module

from arke.ir.dtypes import DType
from arke.plan.dispatch import make_plan
from arke.runtime.guards import GuardError
from arke.targets.llvm.render import RENDERER

SOURCE = """
kernel rotary_rows(x: f32[T, H, D], k: f32[T, D], inv: f32[R], pos: i64[T])
    -> (y: f32[T, H, D], z: f32[T, D])
  where D == 2 * R
{
  cs[t, r]: f32[T, R] = cos(f32(pos[t]) * inv[r])
  sn[t, r]: f32[T, R] = sin(f32(pos[t]) * inv[r])
  y[t, h, d] = x[t, h, d] * cs[t, d % R]
      + (-1.0 if d < R else 1.0) * x[t, h, d + R if d < R else d - R] * sn[t, d % R]
  z[t, d] = k[t, d] * cs[t, d % R] + (-1.0 if d < R else 1.0) * k[t, d + R if d < R else d - R] * sn[t, d % R]
}
kernel rotary_rows_bf16(x: bf16[T, H, D], b: bf16[H, D], inv: f32[R], pos: i64[T])
    -> (q: bf16[T, H, D], k: bf16[T, D])
  where D == 2 * R
{
  cs[t, e]: bf16[T, D] = bf16(cos(f32(pos[t]) * inv[e % R]))
  sn[t, e]: bf16[T, D] = bf16(sin(f32(pos[t]) * inv[e % R]))
  xb[t, h, e] = bf16(f32(x[t, h, e]) + f32(b[h, e]))
  q[t, h, e] = bf16(f32(xb[t, h, e]) * f32(cs[t, e]) + (-1.0 if e < R else 1.0)
                    * f32(b[h, e + R if e < R else e - R]) * f32(sn[t, e]))
  k[t, e] = bf16(f32(x[t, 0, e]) * f32(cs[t, e])
                 + (-1.0 if e < R else 1.0) * f32(x[t, 0, e + R if e < R else e - R]) * f32(sn[t, e]))
}
kernel norm_then_shift(x: f32[T, D], s: f32[S]) -> y: f32[T, D] {
  ms[t] = sum(x[t, d] * x[t, d] for d) / f32(D)
  y[t, d] = x[t, (d + S) % D] / sqrt(ms[t] + 1e-5) if d >= S else 0.0
}
kernel unguarded_rows(x: f32[T, D], inv: f32[R]) -> y: f32[T, D] where D == 2 * R {
  cs[t, r]: f32[T, R] = cos(f32(t) * inv[r])
  y[t, d] = x[t, d] * cs[t, d % R] + x[t, d + R]
}
"""
MODULE = text_module(SOURCE)
LIB = build(MODULE, "llvm")


def normal(rng: np.random.Generator, *shape: int, dtype: DType = DType.F32) -> object:
    return as_dtype(rng.standard_normal(shape), dtype)


def conforms(name: str, *args: object) -> None:
    """The interpreter's values; and the same bits on 1, 2 and 3 threads (rows split across workers)."""
    kernel = LIB.kernels[name]
    assert_conforms(kernel(*args), MODULE.kernels[name], *args, what=name)
    tensors = [torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a for a in args]
    runs = [kernel(*tensors, threads=n) for n in (1, 2, 3)]
    for other in runs[1:]:
        for a, b in zip(runs[0] if isinstance(runs[0], tuple) else (runs[0],),
                        other if isinstance(other, tuple) else (other,)):
            assert torch.equal(torch.as_tensor(a), torch.as_tensor(b))


def rows_ir(name: str) -> str:
    plan = make_plan(MODULE.semantic, MODULE.kernel_map[name], None, families=RENDERER.families)
    assert any(d.family == "rows" for d in plan.dispatches), [d.family for d in plan.dispatches]
    return str(RENDERER.render(plan).source)


@pytest.mark.parametrize(("t", "h", "r"), [(3, 2, 32), (2, 1, 2049), (1, 3, 1), (37, 3, 33), (5, 2, 8)])
def test_rotary_members(t: int, h: int, r: int) -> None:
    rng = seeded("rotary_rows", t, h, r)
    pos = np.arange(t, dtype=np.int64) * 7 + 3
    conforms("rotary_rows", normal(rng, t, h, 2 * r), normal(rng, t, 2 * r), np.abs(normal(rng, r)), pos)


@pytest.mark.parametrize(("t", "h", "r"), [(3, 2, 32), (4, 3, 17), (1, 1, 1), (2, 2, 1025)])
def test_rotary_members_in_bf16_with_rows_kept_in_scratch(t: int, h: int, r: int) -> None:
    rng = seeded("rotary_rows_bf16", t, h, r)
    pos = np.arange(t, dtype=np.int64) * 11
    conforms("rotary_rows_bf16", normal(rng, t, h, 2 * r, dtype=DType.BF16), normal(rng, h, 2 * r, dtype=DType.BF16),
             np.abs(normal(rng, r)), pos)


@pytest.mark.parametrize(("t", "d", "s"), [(3, 4097, 5), (2, 3, 7), (4, 40, 40), (3, 17, 1), (2, 64, 63)])
def test_a_member_after_a_row_statistic(t: int, d: int, s: int) -> None:
    rng = seeded("norm_then_shift", t, d, s)
    conforms("norm_then_shift", normal(rng, t, d), normal(rng, s))


def test_an_out_of_range_partner_is_an_error_as_in_the_interpreter() -> None:
    rng = seeded("unguarded_rows")
    x, inv = normal(rng, 3, 40), normal(rng, 20)
    for fn in (MODULE.kernels["unguarded_rows"], LIB.kernels["unguarded_rows"]):
        with pytest.raises(GuardError):
            fn(x, inv)


@pytest.mark.parametrize("name", ["rotary_rows", "rotary_rows_bf16"])
def test_the_rotary_member_runs_as_vector_pieces(name: str) -> None:
    source = rows_ir(name)
    rows = next(f for f in source.split("\ndefine ")[1:] if "%pieces" in f)
    assert "<16 x" in rows and "masked.load" in rows and "masked.store" in rows
