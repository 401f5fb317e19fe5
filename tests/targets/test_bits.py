"""Bitwise operators, shifts and unsigned dtypes (spec §8.10, §9) on every target, bit for bit.

* the interpreter against independent NumPy/torch expressions of the same bits, for every integer
  dtype and the edge values (0, the largest and smallest value, -1, shifts by 0 and width - 1);
* every runnable target (llvm, mlir, triton under its interpreter) and the CUDA C compiled for
  the host against the interpreter: integers must be equal, floats within the one tolerance rule;
* promotion between signed, unsigned and float operands, conversions (``u8 → f32``, wrapping
  integer casts, float → unsigned), unsigned reductions, ragged shapes (N = 4097, M = 3);
* a shift count out of range is the interpreter's ``arith`` GuardError on every target;
* the int4 weight-only linear of the spec (packed nibbles, group scales) against torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from codegen_support import RUNNABLE, assert_conforms, assert_matches, build, seeded, text_module

from arke.ir import semantic as S
from arke.ir.dtypes import DTYPES, DType
from arke.runtime.dtypes import NUMPY_DTYPES
from arke.runtime.guards import GuardError
from arke.targets.triton import kernel as triton_kernel

INTS = ("i8", "i32", "i64", "u8", "u16", "u32")
TARGETS = tuple(dict.fromkeys((*RUNNABLE, *(("triton",) if triton_kernel.runnable() else ()))))


def long(target: str) -> int:
    """A ragged length past many vector widths: 4097, but 61 under Triton's interpreter (which
    interprets every lane in Python: 4097 lanes of the ops kernel take minutes there)."""
    return 61 if target == "triton" else 4097

OPS = """
kernel ops_{t}(a: {t}[N], b: {t}[N], c: i64[N])
  -> (band: {t}[N], bor: {t}[N], bxor: {t}[N], inv: {t}[N], shl: {t}[N], shr: {t}[N], add: {t}[N],
      sub: {t}[N], mul: {t}[N], neg: {t}[N], lt: bool[N], ge: bool[N], mx: {t}[N], mn: {t}[N], f: f32[N],
      q: {t}[N], r: {t}[N], masked: bool[N], lit: {t}[N]) {{
  band[i] = a[i] & b[i]
  bor[i] = a[i] | b[i]
  bxor[i] = a[i] ^ b[i]
  inv[i] = ~a[i]
  shl[i] = a[i] << c[i]
  shr[i] = a[i] >> c[i]
  add[i] = a[i] + b[i]
  sub[i] = a[i] - b[i]
  mul[i] = a[i] * b[i]
  neg[i] = -a[i]
  lt[i] = a[i] < b[i]
  ge[i] = a[i] >= b[i]
  mx[i] = max(a[i], b[i])
  mn[i] = min(a[i], b[i])
  f[i] = f32(a[i])
  q[i] = a[i] / (b[i] | 1)
  r[i] = a[i] % (b[i] | 1)
  masked[i] = a[i] & 1 == 0 or b[i] | 2 < a[i] ^ b[i]
  lit[i] = (a[i] >> 1 | 3) ^ 5 & ~(a[i] << 2)
}}
"""

MIXED = """
kernel mixed(a: u8[N], b: i8[N], c: u32[N], d: i32[N], x: f32[N])
  -> (p: i32[N], q: i64[N], gt: bool[N], s: f32[N], w: u8[N], v: i8[N], z: u16[N], fu: u8[N], h: f16[N]) {
  p = a + b
  q = c - d
  gt = c > d
  s = f32(c) * 0.5
  w = u8(d)
  v = i8(a)
  z = u16(c) + u16(a)
  fu = u8(x)
  h = a * f16(x)
}

kernel reduce_u(a: u8[M, N], c: u32[M, N]) -> (s: u8[M], t: i64[M], mx: u32[M], mn: u32[M], tot: u32) {
  s[m] = sum(a[m, n] for n)
  t[m] = sum(i64(a[m, n]) for n)
  mx[m] = max(c[m, n] for n)
  mn[m] = min(c[m, n] for n)
  tot = sum(c[m, n] for m, n)
}

kernel shift_by(a: u32[N], c: i64[N]) -> u32[N] { return a[i] << c[i] }

kernel int4_linear(x: f32[M, K], w: u8[N, KH], scale: f32[N, KG]) -> f32[M, N]
    where K == 2 * KH, K % KG == 0 {
  y[m, n] = sum(x[m, k] * (f32((w[n, k / 2] >> (4 * (k % 2))) & 15) - 8.0) * scale[n, k / (K / KG)] for k)
  return y
}

kernel unpack_s4(w: u8[N, H]) -> (lo: i32[N, H], hi: i32[N, H]) {
  lo[n, h] = (i32(w[n, h] & 15) ^ 8) - 8
  hi = (i32(w >> 4) ^ 8) - 8
}
"""


def _module(text: str) -> Any:
    return text_module(text)


def ints(t: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Random values over the whole range of ``t``, the edges first."""
    dt = NUMPY_DTYPES[DTYPES[t]]
    info = np.iinfo(dt)
    v = rng.integers(info.min, info.max, size=n, endpoint=True, dtype=np.int64 if t != "u32" else np.uint64)
    v = v.astype(dt)
    edges = np.array([0, info.max, info.min, 1, -1 if info.min < 0 else 2, info.max - 1], dtype=np.int64)
    v[:len(edges)] = edges[:n].astype(dt)
    return v


def counts(t: str, n: int, rng: np.random.Generator) -> np.ndarray:
    bits = DTYPES[t].bits
    c = rng.integers(0, bits, size=n).astype(np.int64)
    c[:4] = np.array([0, bits - 1, 1, bits - 1])[:n]
    return c


def ops_inputs(t: str, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = seeded("bits", t, n)
    return ints(t, n, rng), ints(t, n, rng), counts(t, n, rng)


def expected_ops(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> list[np.ndarray]:
    """The ops kernel in NumPy, whose integer operators wrap at the type's width as the spec says."""
    with np.errstate(all="ignore"):
        cc = c.astype(a.dtype)
        d = b | a.dtype.type(1)
        floor = np.floor_divide(a, d)
        return [a & b, a | b, a ^ b, ~a, np.left_shift(a, cc), np.right_shift(a, cc), a + b, a - b, a * b,
                (np.zeros_like(a) - a), a < b, a >= b, np.maximum(a, b), np.minimum(a, b), a.astype(np.float32),
                floor, np.mod(a, d), ((a & 1) == 0) | ((b | 2) < (a ^ b)),
                ((a >> 1) | 3) ^ (5 & ~(a << 2))]


@pytest.mark.parametrize("t", INTS)
@pytest.mark.parametrize("n", [37, 4097])
def test_interpreter_bits_match_numpy(t: str, n: int) -> None:
    kernel = _module(OPS.format(t=t)).kernels[f"ops_{t}"]
    a, b, c = ops_inputs(t, n)
    got = kernel(a, b, c)
    for k, (g, w) in enumerate(zip(got, expected_ops(a, b, c), strict=True)):
        assert g.dtype == w.dtype, (k, g.dtype, w.dtype)
        np.testing.assert_array_equal(g, w, err_msg=f"result {k} ({kernel.function.results[k]})")


def test_signed_shift_right_is_arithmetic_and_unsigned_logical() -> None:
    m = _module(OPS.format(t="i8") + OPS.format(t="u8"))
    a = np.array([-128, -1, 127, -2], dtype=np.int8)
    c = np.array([7, 7, 6, 1], dtype=np.int64)
    shr = m.kernels["ops_i8"](a, a, c)[5]
    np.testing.assert_array_equal(shr, [-1, -1, 1, -1])
    shr_u = m.kernels["ops_u8"](a.view(np.uint8), a.view(np.uint8), c)[5]
    np.testing.assert_array_equal(shr_u, [1, 1, 1, 127])


def test_mixed_promotion_and_conversions_match_numpy() -> None:
    m = _module(MIXED)
    rng = seeded("mixed")
    a, b, c, d = ints("u8", 41, rng), ints("i8", 41, rng), ints("u32", 41, rng), ints("i32", 41, rng)
    x = (rng.standard_normal(41) * 100).astype(np.float32)
    x[:3] = [0.0, 255.9, 17.5]
    got = m.kernels["mixed"](a, b, c, d, np.abs(x))
    want = [a.astype(np.int32) + b, c.astype(np.int64) - d, c.astype(np.int64) > d,
            c.astype(np.float32) * np.float32(0.5), d.astype(np.uint8), a.astype(np.int8),
            c.astype(np.uint16) + a.astype(np.uint16), np.trunc(np.abs(x)).astype(np.int64).astype(np.uint8),
            (torch.from_numpy(a).float() * torch.from_numpy(np.abs(x)).half().float()).half().numpy()]
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype, (k, g.dtype, w.dtype)
        np.testing.assert_array_equal(g, w, err_msg=f"result {k}")


def test_unsigned_reductions_wrap_and_compare_unsigned() -> None:
    m = _module(MIXED)
    rng = seeded("reduce_u")
    a = ints("u8", 3 * 4097, rng).reshape(3, 4097)
    c = ints("u32", 3 * 4097, rng).reshape(3, 4097)
    s, t, mx, mn, tot = m.kernels["reduce_u"](a, c)
    wide = a.astype(np.int64).sum(1)
    np.testing.assert_array_equal(s, (wide % 256).astype(np.uint8))
    np.testing.assert_array_equal(t, wide)
    np.testing.assert_array_equal(mx, c.max(1))
    np.testing.assert_array_equal(mn, c.min(1))
    assert tot == np.uint32(c.astype(np.int64).sum() % 2**32) and tot.dtype == np.uint32


def int4_inputs(dims: dict[str, int], seed: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = seeded("int4", seed, tuple(dims.items()))
    m, n, k, kg = dims["M"], dims["N"], dims["K"], dims["KG"]
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.integers(0, 256, (n, k // 2)).astype(np.uint8)
    scale = (rng.random((n, kg)) * 0.1 + 0.01).astype(np.float32)
    return x, w, scale


def int4_torch(x: np.ndarray, w: np.ndarray, scale: np.ndarray) -> torch.Tensor:
    """The reference dequantisation: nibbles interleaved low first, zero point 8, one scale per group."""
    wt = torch.from_numpy(w)
    q = torch.stack([wt & 15, wt >> 4], dim=-1).reshape(w.shape[0], -1).to(torch.float32) - 8.0
    group = x.shape[1] // scale.shape[1]
    deq = q * torch.from_numpy(scale).repeat_interleave(group, dim=1)
    return torch.from_numpy(x).double() @ deq.double().T


INT4_SHAPES = [{"M": 3, "N": 17, "K": 64, "KG": 2}, {"M": 1, "N": 4097, "K": 32, "KG": 4},
               {"M": 3, "N": 5, "K": 2, "KG": 1}]


@pytest.mark.parametrize("dims", INT4_SHAPES, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_int4_linear_interpreter_matches_torch(dims: dict[str, int]) -> None:
    kernel = _module(MIXED).kernels["int4_linear"]
    x, w, scale = int4_inputs(dims, "interp")
    got = torch.from_numpy(kernel(x, w, scale)).double()
    want = int4_torch(x, w, scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_signed_int4_unpack_matches_torch() -> None:
    kernel = _module(MIXED).kernels["unpack_s4"]
    w = np.arange(256, dtype=np.uint8).reshape(16, 16)
    lo, hi = kernel(w)
    wt = torch.from_numpy(w).to(torch.int32)
    nib_lo, nib_hi = wt & 15, wt >> 4
    np.testing.assert_array_equal(lo, torch.where(nib_lo > 7, nib_lo - 16, nib_lo).numpy())
    np.testing.assert_array_equal(hi, torch.where(nib_hi > 7, nib_hi - 16, nib_hi).numpy())


def test_shift_count_out_of_range_is_an_arith_error() -> None:
    kernel = _module(MIXED).kernels["shift_by"]
    a = np.array([1, 2, 3], dtype=np.uint32)
    for bad in (32, -1, 1 << 40):
        with pytest.raises(GuardError, match=f"shift count {bad} is out of range for u32") as info:
            kernel(a, np.array([0, bad, 1], dtype=np.int64))
        assert info.value.rule == "arith"


# ---------------------------------------------------------------- every target against the interpreter


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("t", INTS)
def test_targets_bits_match_interpreter(target: str, t: str) -> None:
    module = _module(OPS.format(t=t))
    lib = build(module, target)
    for n in (3, long(target)):
        a, b, c = ops_inputs(t, n)
        assert_conforms(getattr(lib, f"ops_{t}")(a, b, c), module.kernels[f"ops_{t}"], a, b, c, what=f"{target} {t}")


@pytest.mark.parametrize("target", TARGETS)
def test_targets_mixed_and_reductions_match_interpreter(target: str) -> None:
    module = _module(MIXED)
    lib = build(module, target)
    rng = seeded("mixed-targets")
    n = long(target)
    a, b, c, d = ints("u8", n, rng), ints("i8", n, rng), ints("u32", n, rng), ints("i32", n, rng)
    x = np.abs(rng.standard_normal(n) * 100).astype(np.float32)
    assert_conforms(lib.mixed(a, b, c, d, x), module.kernels["mixed"], a, b, c, d, x, what=target)
    for m, n in ((3, 17), (3, long(target)), (1, 1)):
        ra, rc = ints("u8", m * n, rng).reshape(m, n), ints("u32", m * n, rng).reshape(m, n)
        assert_conforms(lib.reduce_u(ra, rc), module.kernels["reduce_u"], ra, rc, what=f"{target} {m}x{n}")
    w = rng.integers(0, 256, (3, 33)).astype(np.uint8)
    assert_conforms(lib.unpack_s4(w), module.kernels["unpack_s4"], w, what=target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dims", INT4_SHAPES, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_targets_int4_linear_match_interpreter(target: str, dims: dict[str, int]) -> None:
    dims = {**dims, "N": min(dims["N"], long(target))}
    module = _module(MIXED)
    x, w, scale = int4_inputs(dims, target)
    assert_conforms(build(module, target).int4_linear(x, w, scale), module.kernels["int4_linear"], x, w, scale,
                    what=target)


@pytest.mark.parametrize("target", TARGETS)
def test_targets_raise_the_interpreters_shift_error(target: str) -> None:
    module = _module(MIXED)
    lib = build(module, target)
    a = np.arange(5, dtype=np.uint32)
    for bad in (32, -3):
        c = np.array([0, 1, bad, 31, 2], dtype=np.int64)
        with pytest.raises(GuardError, match=f"shift count {bad} is out of range") as info:
            lib.shift_by(a, c)
        assert info.value.rule == "arith"
    ok = np.array([0, 1, 31, 31, 2], dtype=np.int64)
    assert_matches(lib.shift_by(a, ok), module.kernels["shift_by"](a, ok), rtol=0, atol=0, what=target)


def test_unsigned_dtypes_round_trip_numpy_and_torch() -> None:
    module = _module(OPS.format(t="u16"))
    a, b, c = ops_inputs("u16", 9)
    out = module.kernels["ops_u16"](torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(c))
    assert out[0].dtype == torch.uint16 and out[0].device.type == "cpu"
    with pytest.raises(GuardError) as info:
        module.kernels["ops_u16"](a.astype(np.int16), b, c)
    assert info.value.rule == "dtype" and "uint16" in str(info.value)
    assert DType.U16.bits == 16


def test_int4_linear_is_a_contraction_with_a_dequantising_prologue() -> None:
    """The llvm contraction family takes the int4 linear: ``x`` is read in place, and the nibble
    unpacking times the group scale is the B operand's prologue, evaluated as a panel is packed."""
    from arke.plan.contraction import Contraction
    from arke.plan.dispatch import make_plan
    from arke.targets.llvm.render import RENDERER

    m = _module(MIXED)
    plan = make_plan(m.semantic, m.kernel_map["int4_linear"], None, families=RENDERER.families)
    [dispatch] = plan.dispatches
    assert dispatch.family == "contraction" and isinstance(dispatch.pattern, Contraction)
    assert dispatch.pattern.plain_a() is not None and dispatch.pattern.plain_b() is None
    ops = {x.op for x in S.walk(dispatch.pattern.b) if isinstance(x, S.Binary)}
    assert {"shr", "bitand", "mul"} <= ops
