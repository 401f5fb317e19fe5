"""The reference interpreter against independent NumPy / torch computations.

SemanticIR is built by hand (``interp_builders``), with no parser involved, so these tests
pin down the interpreter's semantics on their own.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from interp_builders import (
    BF16,
    BOOL,
    F32,
    I32,
    I64,
    RNG,
    attention_fn,
    axes,
    bi,
    c,
    call,
    dref,
    func,
    ix,
    ld,
    mapop,
    matmul_fn,
    mod,
    param,
    randn,
    red,
    rmsnorm_fn,
    rmsnorm_ref,
    softmax_fn,
    tt,
    un,
)

from arke.ir import semantic as S
from arke.ir.dtypes import DType
from arke.ir.shapes import const, sym
from arke.runtime.interp import GuardError, run_function

# ---------------------------------------------------------------- numerics


@pytest.mark.parametrize("m,n", [(1, 1), (3, 17), (17, 3), (64, 33)])
def test_rmsnorm(m: int, n: int) -> None:
    x, w = randn(m, n), randn(n)
    np.testing.assert_allclose(call(rmsnorm_fn(), x, w), rmsnorm_ref(x, w), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(call(rmsnorm_fn(), x, w, eps=0.5), rmsnorm_ref(x, w, 0.5), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(call(rmsnorm_fn(), x, w, np.float32(0.5)), rmsnorm_ref(x, w, 0.5), rtol=1e-5)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 20), n=st.integers(1, 40), scale=st.sampled_from([1.0, 30.0]))
def test_softmax(m: int, n: int, scale: float) -> None:
    x = randn(m, n) * scale
    np.testing.assert_allclose(call(softmax_fn(), x), torch.softmax(torch.from_numpy(x), -1).numpy(),
                               rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("style", ["contract", "reduce", "materialised"])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 17, 5), (33, 1, 7), (256, 256, 256)])
def test_matmul(style: str, m: int, k: int, n: int) -> None:
    if style == "materialised" and m == 256:
        m, k, n = 64, 96, 80
    a, b = randn(m, k), randn(k, n)
    np.testing.assert_allclose(call(matmul_fn(style), a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_integer_contraction_wraps_like_i32() -> None:
    a = RNG.integers(-2**20, 2**20, (5, 7)).astype(np.int32)
    b = RNG.integers(-2**20, 2**20, (7, 3)).astype(np.int32)
    for style in ("contract", "reduce"):
        got = call(matmul_fn(style, I32), a, b)
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32))


@pytest.mark.parametrize("b,h,g,s,t,d", [(2, 4, 2, 64, 64, 32), (1, 3, 1, 3, 17, 5), (2, 4, 4, 1, 9, 8)])
def test_gqa_causal_attention(b: int, h: int, g: int, s: int, t: int, d: int) -> None:
    q, k, v = (torch.randn(*shape) for shape in [(b, h, s, d), (b, g, t, d), (b, g, t, d)])
    kr, vr = (x.repeat_interleave(h // g, dim=1) for x in (k, v))
    mask = torch.arange(t)[None, :] <= torch.arange(s)[:, None] + t - s
    ref = F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask)
    got = call(attention_fn(), q, k, v)
    assert isinstance(got, torch.Tensor)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("id_dt", [I32, I64])
def test_gather(id_dt: DType) -> None:
    body = ld("table", ld("ids", "t", dt=id_dt), "d")
    fn = func("embed", [param("table", F32, "V", "D"), param("ids", id_dt, "T")],
              [mapop("0", F32, axes(t="T", d="D"), body)], ["0"])
    table = randn(11, 3)
    ids = RNG.integers(0, 11, 17).astype(np.int32 if id_dt == I32 else np.int64)
    np.testing.assert_array_equal(call(fn, table, ids), table[ids])
    ids[5] = 11
    with pytest.raises(GuardError, match=r"embed.*subscript 0 of `table` is 11.*`t0`") as err:
        call(fn, table, ids)
    assert err.value.rule == "index"
    ids[5] = -1
    with pytest.raises(GuardError, match="is -1"):
        call(fn, table, ids)


def test_offset_load_out_of_range_and_in_range() -> None:
    shifted = mapop("0", F32, axes(i="N"), ld("x", bi("add", ix("i"), dref("K"))))
    fn = func("shift", [param("x", F32, "N"), param("y", F32, "K")], [shifted], ["0"])
    with pytest.raises(GuardError, match="subscript 0 of `x` is 5"):
        call(fn, randn(5), randn(1))
    wide = func("wide", [param("x", F32, "N")], [mapop("0", F32, axes(i=sym("N") + 1), ld("x", "i"))], ["0"])
    with pytest.raises(GuardError, match="subscript 0 of `x` is 4"):
        call(wide, randn(4))
    narrow = func("narrow", [param("x", F32, "N")], [mapop("0", F32, axes(i=sym("N") - 1), ld("x", "i"))], ["0"])
    x = randn(6)
    np.testing.assert_array_equal(call(narrow, x), x[:5])


def test_bf16_rounds_once_per_store() -> None:
    # (x * y) + z in bf16 is computed in f32 and rounded once, when stored.
    body = bi("add", bi("mul", ld("x", "i", dt=BF16), ld("y", "i", dt=BF16)), ld("z", "i", dt=BF16))
    fn = func("fma", [param(n, BF16, "N") for n in "xyz"], [mapop("0", BF16, axes(i="N"), body)], ["0"])
    x, y, z = (torch.randn(1000).to(torch.bfloat16) for _ in range(3))
    got = call(fn, x, y, z)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, (x.float() * y.float() + z.float()).to(torch.bfloat16))
    # An explicit cast rounds at once.
    cast = mapop("0", F32, axes(i="N"), bi("add", S.Cast(bi("mul", ld("x", "i", dt=BF16), ld("y", "i", dt=BF16)),
                                                          BF16), ld("z", "i", dt=BF16), F32))
    fn2 = func("fma2", [param(n, BF16, "N") for n in "xyz"], [cast], ["0"])
    want = (x.float() * y.float()).to(torch.bfloat16).float() + z.float()
    assert torch.equal(call(fn2, x, y, z), want)


@pytest.mark.parametrize("m,n", [(3, 17), (8, 1000)])
def test_bf16_rmsnorm_and_sum(m: int, n: int) -> None:
    x, w = torch.randn(m, n).to(torch.bfloat16), torch.randn(n).to(torch.bfloat16)
    got = call(rmsnorm_fn(BF16), x, w)
    assert got.dtype == torch.bfloat16
    ref = torch.from_numpy(rmsnorm_ref(x.float().numpy(), w.float().numpy())).float()
    torch.testing.assert_close(got.float(), ref, rtol=1.6e-2, atol=1e-2)
    total = func("total", [param("x", BF16, "M", "N")],
                 [red("0", BF16, "sum", axes(m="M"), axes(n="N"), ld("x", "m", "n", dt=BF16))], ["0"])
    torch.testing.assert_close(call(total, x), x.double().sum(-1).to(torch.bfloat16), rtol=1.6e-2, atol=1e-2)
    # bf16 results stay torch tensors, even in NumPy mode (here: a kernel with only scalars).
    const = func("one", [param("s", F32, default=1.5)], [mapop("0", BF16, axes(i=3), ld("s"))], ["0"])
    out = call(const)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16


def test_integer_floor_div_mod_and_float_floordiv() -> None:
    a = np.array([7, -7, 7, -7, 0, 5, -1], dtype=np.int64)
    b = np.array([2, 2, -2, -2, 3, -7, 4], dtype=np.int64)
    ops = [mapop(str(k), I64, axes(i="N"), bi(op, ld("a", "i", dt=I64), ld("b", "i", dt=I64)))
           for k, op in enumerate(["div", "mod", "floordiv"])]
    fn = func("ints", [param("a", I64, "N"), param("b", I64, "N")], ops, ["0", "1", "2"])
    q, r, fq = call(fn, a, b)
    np.testing.assert_array_equal(q, a // b)
    np.testing.assert_array_equal(r, a % b)
    np.testing.assert_array_equal(fq, a // b)
    with pytest.raises(GuardError, match="integer div by zero") as err:
        call(fn, a, np.where(b == 3, 0, b))
    assert err.value.rule == "arith"
    x, y = np.array([7.5, -7.5, 7.5, -7.5], np.float32), np.array([2.0, 2.0, -2.0, -2.0], np.float32)
    fops = [mapop(str(k), F32, axes(i="N"), bi(op, ld("x", "i"), ld("y", "i"))) for k, op in
            enumerate(["floordiv", "mod", "div", "pow", "max", "min"])]
    fx = func("floats", [param("x", F32, "N"), param("y", F32, "N")], fops, [str(k) for k in range(6)])
    got = call(fx, x, y)
    for g, want in zip(got, [np.floor(x / y), np.mod(x, y), x / y, x ** y, np.maximum(x, y), np.minimum(x, y)],
                       strict=True):
        np.testing.assert_allclose(g, want, rtol=1e-6)


def test_unary_ops_and_casts() -> None:
    x = torch.linspace(-3, 3, 13)
    refs = {"neg": -x, "abs": x.abs(), "exp": x.exp(), "tanh": x.tanh(), "erf": torch.erf(x),
            "sigmoid": x.sigmoid(), "silu": x * x.sigmoid(), "gelu": x * (1 + torch.erf(x / 2 ** 0.5)) / 2,
            "relu": x.clamp(min=0), "sin": x.sin(), "cos": x.cos(), "floor": x.floor(), "ceil": x.ceil(),
            "exp2": 2 ** x}
    names = sorted(refs)
    ops = [mapop(str(k), F32, axes(i="N"), un(op, ld("x", "i"))) for k, op in enumerate(names)]
    fn = func("unary", [param("x", F32, "N")], ops, [str(k) for k in range(len(ops))])
    for name, got in zip(names, call(fn, x), strict=True):
        torch.testing.assert_close(got, refs[name], rtol=1e-6, atol=1e-6, msg=name)
    pos = torch.rand(7) + 0.1
    for op, ref in [("log", pos.log()), ("sqrt", pos.sqrt()), ("rsqrt", pos.rsqrt()), ("log2", pos.log2())]:
        f = func("u", [param("x", F32, "N")], [mapop("0", F32, axes(i="N"), un(op, ld("x", "i")))], ["0"])
        torch.testing.assert_close(call(f, pos), ref)
    # Casts: float -> int truncates toward zero; anything -> bool is x != 0; comparisons give bool.
    casts = [mapop("0", I32, axes(i="N"), S.Cast(ld("x", "i"), I32)),
             mapop("1", BOOL, axes(i="N"), S.Cast(ld("x", "i"), BOOL)),
             mapop("2", BOOL, axes(i="N"), un("not", bi("lt", ld("x", "i"), c(0.5)))),
             mapop("3", F32, axes(i="N"), S.Cast(bi("ge", ld("x", "i"), c(0)), F32))]
    fc = func("casts", [param("x", F32, "N")], casts, ["0", "1", "2", "3"])
    v = np.array([-2.7, -0.5, 0.0, 0.5, 2.7], np.float32)
    t, nz, ge, f = call(fc, v)
    np.testing.assert_array_equal(t, np.trunc(v).astype(np.int32))
    np.testing.assert_array_equal(nz, v != 0)
    np.testing.assert_array_equal(ge, v >= 0.5)
    np.testing.assert_array_equal(f, (v >= 0).astype(np.float32))


@pytest.mark.parametrize("dt", [F32, I32, BOOL])
def test_empty_reductions_give_the_identity(dt: DType) -> None:
    body = ld("x", "m", "j", dt=dt)
    empty = axes(j=sym("T") - sym("S"))
    ops = [red(str(k), dt, kind, axes(m="M"), empty, body) for k, kind in enumerate(S.REDUCE_KINDS)]
    ops.append(red("4", F32, "sum", axes(m="M"), axes(z=0), c(1.0)))
    fn = func("empty", [param("x", dt, "M", "T"), param("y", F32, "S")], ops, ["0", "1", "2", "3", "4"])
    x: np.ndarray = RNG.integers(0, 2, (3, 4)).astype({F32: np.float32, I32: np.int32, BOOL: np.bool_}[dt])
    s, mx, mn, p, z = call(fn, x, randn(4))
    np.testing.assert_array_equal(z, np.zeros(3))
    info = np.iinfo(np.int32)
    want = {F32: (0, -np.inf, np.inf, 1), I32: (0, info.min, info.max, 1), BOOL: (False, False, True, True)}[dt]
    for got, w in zip((s, mx, mn, p), want, strict=True):
        np.testing.assert_array_equal(got, np.full(3, w, dtype=x.dtype))


def test_reductions_over_every_kind_and_broadcast_body() -> None:
    x = randn(4, 6)
    ops = [red(str(k), F32, kind, axes(m="M"), axes(n="N"), ld("x", "m", "n")) for k, kind in
           enumerate(S.REDUCE_KINDS)]
    ops.append(red("4", F32, "sum", axes(m="M"), axes(n="N", k=3), bi("mul", ld("x", "m", "n"), c(2.0))))
    ops.append(red("5", F32, "sum", axes(m="M"), axes(n="N", k=3), ld("x", "m", "n")))
    fn = func("reds", [param("x", F32, "M", "N")], ops, [str(k) for k in range(6)])
    s, mx, mn, p, twice, thrice = call(fn, x)
    for got, want in [(s, x.sum(1)), (mx, x.max(1)), (mn, x.min(1)), (p, x.prod(1)), (twice, 6 * x.sum(1)),
                      (thrice, 3 * x.sum(1))]:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert call(func("all", [param("x", F32, "M", "N")],
                     [red("0", F32, "sum", (), axes(m="M", n="N"), ld("x", "m", "n"))], ["0"]), x).shape == ()


def test_call_op_and_several_outputs() -> None:
    norm = rmsnorm_fn()
    body = S.CallOp(("0",), (tt(F32, "T", "D"),), "rmsnorm", ("x", "w"), (("M", sym("T")), ("N", sym("D"))))
    res = mapop("1", F32, axes(t="T", d="D"), bi("add", ld("x", "t", "d"), ld("0", "t", "d")))
    total = red("2", F32, "sum", (), axes(t="T", d="D"), ld("1", "t", "d"))
    block = func("block", [param("x", F32, "T", "D"), param("w", F32, "D")], [body, res, total], ["1", "2"])
    x, w = randn(5, 7), randn(7)
    got, tot = call(block, x, w, module=mod(norm, block))
    np.testing.assert_allclose(got, x + rmsnorm_ref(x, w), rtol=1e-5, atol=1e-6)
    assert isinstance(tot, np.ndarray) and tot.shape == ()
    np.testing.assert_allclose(tot, (x + rmsnorm_ref(x, w)).sum(), rtol=1e-4)
    outs = run_function(block, mod(norm, block), {"x": torch.from_numpy(x), "w": torch.from_numpy(w)})
    assert isinstance(outs, tuple) and len(outs) == 2
    torch.testing.assert_close(outs[0], torch.from_numpy(got))


def test_guard_in_callee_names_both_kernels() -> None:
    guarded = func("g", [param("x", F32, "N")], [mapop("0", F32, axes(i="N"), ld("x", "i"))], ["0"],
                   (S.Guard(S.InSet(sym("N"), (const(2), const(4))), "N in {2, 4}"),))
    caller = func("caller", [param("x", F32, "N")],
                  [S.CallOp(("0",), (tt(F32, "N"),), "g", ("x",), (("N", sym("N")),))], ["0"])
    np.testing.assert_array_equal(call(caller, np.ones(4, np.float32), module=mod(guarded, caller)), np.ones(4))
    with pytest.raises(GuardError, match=r"kernel `caller`: in the call of `g`.*kernel `g`.*`N in \{2, 4\}`.*N = 3"):
        call(caller, np.ones(3, np.float32), module=mod(guarded, caller))


def test_input_and_output_kinds() -> None:
    fn = softmax_fn()
    x = randn(3, 5)
    out = call(fn, x)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    out_t = call(fn, torch.from_numpy(x))
    assert isinstance(out_t, torch.Tensor) and out_t.dtype == torch.float32
    np.testing.assert_array_equal(out, out_t.numpy())
    # Non-contiguous, transposed and negatively strided inputs are read as they are.
    xt = randn(5, 3).T
    np.testing.assert_allclose(call(fn, xt), call(fn, np.ascontiguousarray(xt)))
    np.testing.assert_allclose(call(fn, x[:, ::-1]), call(fn, np.ascontiguousarray(x[:, ::-1])))
    tt_ = torch.randn(6, 10)[::2, ::3]
    torch.testing.assert_close(call(fn, tt_), call(fn, tt_.contiguous()))


def test_identity_output_does_not_alias_the_input() -> None:
    fn = func("ident", [param("x", F32, "N")], [mapop("0", F32, axes(i="N"), ld("x", "i"))], ["0", "x"])
    x = randn(4)
    y, z = call(fn, x)
    y[0] = 100.0
    z[1] = 100.0
    assert x[0] != 100.0 and x[1] != 100.0


def test_transposed_diagonal_and_broadcast_loads() -> None:
    x = randn(4, 4)
    ops = [mapop("0", F32, axes(i="N", j="M"), ld("x", "j", "i")),
           mapop("1", F32, axes(i="N"), ld("x", "i", "i")),
           mapop("2", F32, axes(i="M", j="N", k=2), ld("x", "i", "j")),
           mapop("3", F32, axes(i=2), ld("x", bi("add", ix("i"), c(1, I64)), bi("mul", ix("i"), c(3, I64))))]
    fn = func("loads", [param("x", F32, "M", "N")], ops, ["0", "1", "2", "3"])
    t, d, b, o = call(fn, x)
    np.testing.assert_array_equal(t, x.T)
    np.testing.assert_array_equal(d, np.diag(x))
    np.testing.assert_array_equal(b, np.broadcast_to(x[:, :, None], (4, 4, 2)))
    np.testing.assert_array_equal(o, [x[1, 0], x[2, 3]])


@settings(max_examples=20, deadline=None)
@given(m=st.integers(1, 19), k=st.integers(1, 19), n=st.integers(1, 19), style=st.sampled_from(["contract", "reduce"]))
def test_matmul_random_shapes(m: int, k: int, n: int, style: str) -> None:
    a, b = randn(m, k), randn(k, n)
    np.testing.assert_allclose(call(matmul_fn(style), a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-5)


@settings(max_examples=15, deadline=None)
@given(b=st.integers(1, 2), g=st.integers(1, 3), r=st.integers(1, 3), s=st.integers(1, 9), extra=st.integers(0, 9),
       d=st.integers(1, 17))
def test_attention_random_shapes(b: int, g: int, r: int, s: int, extra: int, d: int) -> None:
    h, t = g * r, s + extra
    q, k, v = torch.randn(b, h, s, d), torch.randn(b, g, t, d), torch.randn(b, g, t, d)
    mask = torch.arange(t)[None, :] <= torch.arange(s)[:, None] + t - s
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1), attn_mask=mask)
    torch.testing.assert_close(call(attention_fn(), q, k, v), ref, rtol=1e-5, atol=1e-5)


def test_bf16_literal_is_a_bf16_value() -> None:
    fn = func("lit", [param("x", F32, "N")], [mapop("0", F32, axes(i="N"), bi("add", ld("x", "i"), c(0.1, BF16),
                                                                             F32))], ["0"])
    x = np.zeros(2, np.float32)
    np.testing.assert_array_equal(call(fn, x), np.full(2, torch.tensor(0.1).to(torch.bfloat16).item()))


@pytest.mark.parametrize("n", [1, 15, 16, 64])
def test_float_mod_is_pythons_at_any_length(n: int) -> None:
    """Python's float ``%`` whatever the tensor's length (torch's vectorised remainder, from 16 elements on, is
    NaN where ``a / b`` overflows, though the remainder is exact)."""
    import arke

    cases = [(1.0, 1e-40), (3.4e38, 0.5), (-1.0, 3.0), (1.0, -3.0), (-4.0, 2.0), (4.0, -2.0), (5.5, float("inf")),
             (-5.5, float("inf")), (float("inf"), 2.0), (1.0, 0.0), (7.25, 0.5), (-1e30, 7.0)]
    k = arke.loads("kernel fmod(x: f32[N], y: f32[N]) -> f32[N] { return x[i] % y[i] }").kernels["fmod"]
    a = np.array([cases[i % len(cases)][0] for i in range(n)], np.float32)
    b = np.array([cases[i % len(cases)][1] for i in range(n)], np.float32)
    got = np.asarray(k(a, b))
    for i in range(n):
        x, y = float(a[i]), float(b[i])
        want = float("nan") if y == 0 or math.isinf(x) else np.float32(x % y)  # exact in f32 for these
        assert (math.isnan(got[i]) and math.isnan(want)) or (got[i] == want and math.copysign(1, got[i])
                                                              == math.copysign(1, want)), (x, y, got[i], want)


@pytest.mark.parametrize("n", [1, 16, 64])
def test_gelu_at_large_values_and_infinity(n: int) -> None:
    """``gelu(x)`` is ``x`` where erf(x / √2) rounds to 1, up to +inf, at any length (torch's vectorised gelu
    is NaN at +inf and overflows near f32's maximum)."""
    import arke

    k = arke.loads("kernel g(x: f32[N]) -> f32[N] { return gelu(x[i]) }").kernels["g"]
    big = [float("inf"), 3.4e38, 1e20, 41.0, 50.0]
    x = np.array([big[i % len(big)] for i in range(n)], np.float32)
    np.testing.assert_array_equal(np.asarray(k(x)), x)
    small = np.linspace(-6, 6, max(n, 16)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(k(small)), F.gelu(torch.from_numpy(small)).numpy(), rtol=0, atol=0)


def test_a_let_of_dims_wraps_as_i64_arithmetic() -> None:
    """`let a = N * N * N * N * N` is exact in SymPy: its value wraps as i64 arithmetic does (spec §9.3)."""
    import arke

    module = arke.loads("kernel f(x: f32[N]) -> i64 {\n  let a = N * N * N * N * N\n  return a\n}\n"
                        "kernel g(x: f32[N]) -> i64 {\n  let a = 9223372036854775807 + N\n  return a\n}\n")
    x = np.zeros(10000, np.float32)
    assert int(module.kernels["f"](x)) == (10000**5 + 2**63) % 2**64 - 2**63
    assert int(module.kernels["g"](x)) == -(2**63) + 9999


def test_float_mod_of_a_single_value() -> None:
    """A rank-0 float ``%`` (a scalar parameter, an element, a sum) is a rank-0 value, as the targets give it
    (NumPy's ascontiguousarray made it [1]: every kernel with one failed in the interpreter)."""
    import arke

    module = arke.loads("""
kernel of_scalar(x: f32[N], s: f32 = 0.5) -> f32 { return s % 2.0 }
kernel of_element(x: f32[N]) -> f32 { return x[0] % 2.0 }
kernel of_sum(x: f32[N]) -> f32 { return sum(x[i] for i) % -2.0 }
""")
    x = np.array([2.75, -0.5], np.float32)
    assert float(module.kernels["of_scalar"](x, s=-7.5)) == 0.5
    assert float(module.kernels["of_element"](x)) == 0.75
    assert float(module.kernels["of_sum"](x)) == -1.75


def test_a_call_too_big_for_memory_is_a_clear_error() -> None:
    """A broadcast view of 2**40 elements: the interpreter's result cannot be allocated, which is a GuardError
    naming the dims (it was torch's raw allocator message)."""
    import arke
    from arke.runtime.errors import GuardError

    k = arke.loads("kernel p(x: f32[M, N]) -> f32[M, N] { return x[m, n] * 2.0 }").kernels["p"]
    with pytest.raises(GuardError, match=r"could not allocate memory for this call \(M = 1, N = 1099511627776\)"):
        k(torch.zeros(1, 1).expand(1, 2**40))
