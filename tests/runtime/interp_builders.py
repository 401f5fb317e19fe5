"""Builders for hand-made SemanticIR, and kernels shared by the interpreter tests.

Short names on purpose: ``ld("x", "m", "n")`` is ``%x[m, n]``, ``bi("add", a, b)`` a
binary op whose dtype is promoted from its operands, ``func`` binds each dim symbol to the
first parameter axis that names it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from arke.ir import semantic as S
from arke.ir.dtypes import DType, promote
from arke.ir.shapes import Dim, const, floordiv, sym
from arke.runtime.interp import run

F32, BF16, I64, I32, BOOL = DType.F32, DType.BF16, DType.I64, DType.I32, DType.BOOL
RNG = np.random.default_rng(0)

# ---------------------------------------------------------------- IR builders


def dim(d: str | int | Dim) -> Dim:
    return sym(d) if isinstance(d, str) else const(d) if isinstance(d, int) else d


def tt(dt: DType, *dims: str | int | Dim) -> S.TensorType:
    return S.TensorType(dt, tuple(dim(d) for d in dims))


def param(name: str, dt: DType, *dims: str | int | Dim, default: float | None = None) -> S.Param:
    return S.Param(name, tt(dt, *dims), default)


def ix(name: str) -> S.Idx:
    return S.Idx(name)


def c(value: float | int | bool, dt: DType = F32) -> S.Const:
    return S.Const(value, dt)


def dref(d: str | Dim) -> S.DimRef:
    return S.DimRef(dim(d))


def ld(src: str, *indices: str | S.SExpr, dt: DType = F32) -> S.Load:
    return S.Load(src, tuple(ix(i) if isinstance(i, str) else i for i in indices), dt)


def bi(op: str, a: S.SExpr, b: S.SExpr, dt: DType | None = None) -> S.Binary:
    if dt is None:
        dt = BOOL if op in S.COMPARISONS or op in ("and", "or") else promote(a.dtype, b.dtype)
    return S.Binary(op, a, b, dt)


def un(op: str, x: S.SExpr, dt: DType | None = None) -> S.Unary:
    return S.Unary(op, x, dt or x.dtype)


def axes(**extents: str | int | Dim) -> tuple[S.Axis, ...]:
    return tuple(S.Axis(n, dim(e)) for n, e in extents.items())


def mapop(result: str, dt: DType, ax: tuple[S.Axis, ...], body: S.SExpr) -> S.MapOp:
    return S.MapOp(result, dt, ax, body, name=f"t{result}")


def red(result: str, dt: DType, kind: str, ax: tuple[S.Axis, ...], rax: tuple[S.Axis, ...],
        body: S.SExpr) -> S.ReduceOp:
    return S.ReduceOp(result, dt, kind, ax, rax, body)


def func(name: str, params: Sequence[S.Param], ops: Sequence[S.Op], results: Sequence[str],
         guards: tuple[S.Guard, ...] = ()) -> S.Function:
    """A function whose dims are bound from the first param axis that names each symbol."""
    bindings: dict[str, S.DimBinding] = {}
    for p in params:
        for k, d in enumerate(p.type.shape):
            if d.is_Symbol and d.name not in bindings:
                bindings[d.name] = S.DimBinding(d.name, p.name, k)
    types = {p.name: p.type for p in params}
    for op in ops:
        types.update(S.op_results(op))
    return S.Function(name, tuple(params), tuple(bindings.values()), guards, tuple(ops), tuple(results),
                      tuple(types[r] for r in results))


def mod(*fns: S.Function) -> S.Module:
    return S.Module(tuple(fns))


def call(fn: S.Function, *args: Any, module: S.Module | None = None, **kw: Any) -> Any:
    return run(module or mod(fn), fn.name, args, kw)


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------- kernels used by several tests


def rmsnorm_fn(dt: DType = F32, name: str = "rmsnorm") -> S.Function:
    x = ld("x", "m", "n", dt=dt)
    ss = red("0", F32, "sum", axes(m="M"), axes(n="N"), bi("mul", x, x, F32))
    mean = bi("div", ld("0", "m"), S.Cast(dref("N"), F32))
    inv = mapop("1", F32, axes(m="M"), un("rsqrt", bi("add", mean, ld("eps", dt=F32))))
    out = mapop("2", dt, axes(m="M", n="N"), bi("mul", bi("mul", x, ld("1", "m"), F32), ld("w", "n", dt=dt), F32))
    return func(name, [param("x", dt, "M", "N"), param("w", dt, "N"), param("eps", F32, default=1e-6)],
                [ss, inv, out], ["2"])


def rmsnorm_ref(x: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps) * w


def softmax_fn() -> S.Function:
    mx = red("0", F32, "max", axes(m="M"), axes(n="N"), ld("x", "m", "n"))
    e = mapop("1", F32, axes(m="M", n="N"), un("exp", bi("sub", ld("x", "m", "n"), ld("0", "m"))))
    s = red("2", F32, "sum", axes(m="M"), axes(k="N"), ld("1", "m", "k"))
    out = mapop("3", F32, axes(m="M", n="N"), bi("div", ld("1", "m", "n"), ld("2", "m")))
    return func("softmax", [param("x", F32, "M", "N")], [mx, e, s, out], ["3"])


def matmul_fn(style: str, dt: DType = F32) -> S.Function:
    a, b = ld("a", "m", "k", dt=dt), ld("b", "k", "n", dt=dt)
    ax, rax = axes(m="M", n="N"), axes(k="K")
    if style == "contract":
        op: S.Op = S.ContractOp("0", dt, ax, rax, a, b)
    elif style == "reduce":
        op = red("0", dt, "sum", ax, rax, bi("mul", a, b))
    else:  # a body that is not a bare product: the materialised path
        op = red("0", dt, "sum", ax, rax, bi("add", bi("mul", a, b), c(0, dt)))
    return func("matmul", [param("a", dt, "M", "K"), param("b", dt, "K", "N")], [op], ["0"])


def attention_fn() -> S.Function:
    """Causal GQA attention with ``k[b, h // R, j, d]`` (R = H // G) and a bottom-right causal mask."""
    r = dref(floordiv(sym("H"), sym("G")))
    kv = bi("div", ix("h"), r)
    bhij = axes(b="B", h="H", i="S", j="T")
    s = S.ContractOp("0", F32, bhij, axes(d="D"), ld("q", "b", "h", "i", "d"), ld("k", "b", kv, "j", "d"))
    causal = bi("le", ix("j"), bi("sub", bi("add", ix("i"), dref("T")), dref("S")))
    scaled = bi("div", ld("0", "b", "h", "i", "j"), un("sqrt", S.Cast(dref("D"), F32)))
    masked = mapop("1", F32, bhij, S.Select(causal, scaled, c(-math.inf), F32))
    mx = red("2", F32, "max", axes(b="B", h="H", i="S"), axes(j="T"), ld("1", "b", "h", "i", "j"))
    p = mapop("3", F32, bhij, un("exp", bi("sub", ld("1", "b", "h", "i", "j"), ld("2", "b", "h", "i"))))
    den = red("4", F32, "sum", axes(b="B", h="H", i="S"), axes(j="T"), ld("3", "b", "h", "i", "j"))
    o = S.ContractOp("5", F32, axes(b="B", h="H", i="S", d="D"), axes(j="T"), ld("3", "b", "h", "i", "j"),
                     ld("v", "b", kv, "j", "d"))
    out = mapop("6", F32, axes(b="B", h="H", i="S", d="D"), bi("div", ld("5", "b", "h", "i", "d"),
                                                                  ld("4", "b", "h", "i")))
    guards = (S.Guard(S.Rel("==", sym("H") % sym("G"), const(0)), "H % G == 0"),
              S.Guard(S.Rel(">=", sym("T"), sym("S")), "T >= S"))
    params = [param("q", F32, "B", "H", "S", "D"), param("k", F32, "B", "G", "T", "D"),
              param("v", F32, "B", "G", "T", "D")]
    return func("attention", params, [s, masked, mx, p, den, o, out], ["6"], guards)
