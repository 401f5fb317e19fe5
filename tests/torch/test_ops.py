"""Arke kernels as torch operators (arke.torch.register): every stdlib kernel passes torch.library.opcheck,
``out=`` overloads mutate what they declare, fake implementations keep sizes symbolic under torch.compile."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import torch

import arke
import arke.torch
from arke.cli.build import random_inputs
from arke.runtime.errors import GuardError
from arke.runtime.guards import check_guards

STD = ("std.nn", "std.attention", "std.decoder", "std.moe", "std.lm", "std.gpt2", "std.deepseek")
#: dims where the `where` clauses of a kernel need more than "every dim is 4"
DIMS: dict[str, dict[str, int]] = {
    "heads": {"H": 4, "G": 2, "E": 4, "R": 2, "C": 32},
    "rope": {"D": 4}, "rope_interleaved": {"D": 4},
    "candidates": {"V": 70},
    **{f"ln_qkv{w}": {"H": 4, "E": 4, "C": 48} for w in ("", "__W_f32", "__W_bf16", "__W_f16")},
    **{f"{k}{w}": {"R": 4, "R2": 2} for w in ("", "__W_f32", "__W_bf16")
       for k in ("rope_pairs", "mla_heads", "mla_in", "mla_in_lora")},
    **{f"mla_paged{w}": {"G": 1} for w in ("", "__W_f32", "__W_bf16")},
}
_EQUAL = {"H": 4, "G": 2, "E": 4, "R": 2, "C": 32, "K": 2}


@cache
def library() -> arke.Library:
    return arke.build(arke.loads("".join(f"import {m}\n" for m in STD)))


@cache
def ops() -> arke.torch.Ops:
    return arke.torch.register(library(), namespace="arke_test")


def sample(name: str) -> tuple[Any, ...]:
    """Random arguments of kernel ``name`` whose dims satisfy its `where` clauses."""
    k = library().kernels[name]
    fn = k.function if hasattr(k, "function") else k.member(k.generic.members[0][1]).function
    names = {b.dim for b in fn.bindings}
    dims = {d: DIMS.get(name, {}).get(d, _EQUAL.get(d, 4)) for d in names}
    check_guards(fn, dims)  # a new stdlib kernel whose clauses these dims break: give it a row in DIMS
    args = random_inputs(fn, dims, seed=len(name))  # every parameter, in declaration order
    for i, p in enumerate(fn.params):
        if p.name == "n" and not p.type.rank:  # the cached attentions' filled length: every query has keys
            args[i] = 4
    return tuple(args)


def _kernels() -> list[str]:
    return sorted(library().kernels)


@pytest.mark.parametrize("name", _kernels())
def test_opcheck_every_stdlib_kernel(name: str) -> None:
    op = getattr(ops(), name)
    args = sample(name)
    want = library().kernels[name](*args)
    got = op(*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)  # the same kernel: bit-identical
    # the aot_dispatch checks compile the op through AOTAutograd: a sample of kernels is enough for them
    utils = (("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
             if name in ("rmsnorm", "quantize_rows", "attn_cached", "embedding", "heads")
             else ("test_schema", "test_autograd_registration", "test_faketensor"))
    torch.library.opcheck(op.default, args, test_utils=utils)


def test_out_overload_writes_in_place_and_declares_it() -> None:
    x, w = torch.randn(5, 16), torch.randn(16)
    y = torch.full((5, 16), 7.0)
    version = y._version
    assert ops().rmsnorm.out(x, w, out=y) is None  # a mutating operator returns nothing
    torch.testing.assert_close(y, library().rmsnorm(x, w), rtol=0, atol=0)
    # the write is counted, as torch's own out= ops count theirs (a compiled graph keys packed copies on it)
    assert y._version > version
    version = y._version
    library().rmsnorm(x, w, out=y)
    assert y._version > version
    assert ops().rmsnorm.out._schema.arguments[-1].alias_info.is_write  # functionalization sees the write
    torch.library.opcheck(ops().rmsnorm.out, (x, w), {"out": torch.empty(5, 16)})

    out_op = ops().rmsnorm.out

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        z = torch.empty_like(a)
        out_op(a * 2, b, out=z)
        return z + 1

    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    torch.testing.assert_close(compiled(x, w), library().rmsnorm(x * 2, w) + 1, rtol=0, atol=0)
    q, s = torch.empty(5, 16, dtype=torch.int8), torch.empty(5)
    ops().quantize_rows.out(x, out0=q, out1=s)
    want_q, want_s = library().quantize_rows(x)
    assert torch.equal(q, want_q) and torch.equal(s, want_s)


def test_a_bad_call_is_the_kernels_guard_error_and_leaves_out_untouched() -> None:
    y = torch.full((5, 16), 7.0)
    with pytest.raises(GuardError, match="rmsnorm"):
        ops().rmsnorm.out(torch.randn(5, 16), torch.randn(15), out=y)
    assert bool((y == 7.0).all())
    with pytest.raises(GuardError, match="rank"):
        ops().rmsnorm(torch.randn(16), torch.randn(16))


def test_compiled_graph_has_no_break_and_keeps_sizes_symbolic() -> None:
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    ops()

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.ops.arke_test.rmsnorm(x, w)) * 2.0

    compiled = torch.compile(f, backend=counter, fullgraph=True, dynamic=True)
    w = torch.randn(16)
    for rows in (3, 9, 4097):
        x = torch.randn(rows, 16)
        torch.testing.assert_close(compiled(x, w), torch.relu(library().rmsnorm(x, w)) * 2.0, rtol=0, atol=0)
    assert counter.frame_count == 1  # one graph for every row count: the fake kept M symbolic


def test_fake_rejects_what_the_kernel_rejects() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), pytest.raises(GuardError, match="is f32, but was given float64"):
        ops().matmul(torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 5))


def test_registering_again_repoints_and_a_different_signature_is_refused() -> None:
    first = arke.torch.register(arke.build(arke.loads("kernel twice(x: f32[N]) -> f32[N] { return x * 2.0 }\n")),
                                namespace="arke_re")
    x = torch.randn(6)
    torch.testing.assert_close(first.twice(x), x * 2)
    again = arke.torch.register(arke.build(arke.loads("kernel twice(x: f32[N]) -> f32[N] { return x + x }\n")),
                                namespace="arke_re")
    torch.testing.assert_close(again.twice(x), x + x)
    other = arke.build(arke.loads("kernel twice(x: f32[N], y: f32[N]) -> f32[N] { return x + y }\n"))
    with pytest.raises(ValueError, match="another namespace"):
        arke.torch.register(other, namespace="arke_re")
    with pytest.raises(ValueError, match="identifier"):
        arke.torch.register(other, namespace="not a name")
    with pytest.raises(ValueError, match="torch's"):
        arke.torch.register(other, namespace="aten")
    lib = torch.library.Library("arke_taken", "FRAGMENT")
    lib.define("twice(Tensor x) -> Tensor")
    with pytest.raises(ValueError, match="already exists"):
        arke.torch.register(other, namespace="arke_taken")


def test_an_infinite_default_is_an_optional_float_that_means_the_kernels_default() -> None:
    src = "kernel clampish(x: f32[N], lo: f32 = -inf, hi: f32 = inf) -> f32[N] { return max(min(x[n], hi), lo) }\n"
    arke.torch.register(arke.build(arke.loads(src)), namespace="arke_test_inf")
    op = torch.ops.arke_test_inf.clampish
    assert "float? lo=None" in str(op.default._schema)
    x = torch.tensor([-5.0, 0.0, 5.0])
    assert op(x, hi=1.0).tolist() == [-5.0, 0.0, 1.0]
    assert torch.compile(lambda a: op(a), backend="eager", fullgraph=True)(x).tolist() == [-5.0, 0.0, 5.0]


def test_a_parameter_named_like_the_out_argument_is_refused_and_out_on_another_device_too() -> None:
    src = "kernel twice_out(out: f32[N]) -> f32[N] { return out * 2.0 }\n"
    with pytest.raises(ValueError, match="parameter named `out`"):
        arke.torch.register(arke.build(arke.loads(src)), namespace="arke_test_outname")
    arke.torch.register(arke.build(arke.loads("kernel twice_dev(x: f32[N]) -> f32[N] { return x * 2.0 }\n")),
                        namespace="arke_test_outdev")
    with pytest.raises(GuardError, match="out= is on meta"):
        torch.ops.arke_test_outdev.twice_dev.out(torch.ones(4), out=torch.empty(4, device="meta"))


@pytest.mark.parametrize("count", [11, 27])
def test_many_outputs_fill_out_in_order(count: int) -> None:
    outs = ", ".join(f"y{k}: f32[N]" for k in range(count))
    body = "; ".join(f"y{k}[n] = x[n] + {k}.0" for k in range(count))
    arke.torch.register(arke.build(arke.loads(f"kernel many(x: f32[N]) -> ({outs}) {{ {body} }}\n")),
                        namespace=f"arke_test_many{count}")
    got = [torch.empty(3) for _ in range(count)]
    getattr(torch.ops, f"arke_test_many{count}").many.out(torch.zeros(3), **{f"out{k}": t for k, t in enumerate(got)})
    assert [float(t[0]) for t in got] == [float(k) for k in range(count)]


def test_registering_again_takes_the_new_kernels_infinite_defaults() -> None:
    """-inf and inf defaults are both `float? =None` in a schema: the re-pointed op must use the new ones."""
    low = "kernel clip(x: f32[N], lim: f32 = -inf, s: f32 = 1.0) -> f32[N] { return max(x[i], lim) * s }\n"
    high = "kernel clip(x: f32[N], lim: f32 = inf, s: f32 = 1.0) -> f32[N] { return min(x[i], lim) * s }\n"
    arke.torch.register(arke.build(arke.loads(low)), namespace="arke_test_redefault")
    arke.torch.register(arke.build(arke.loads(high)), namespace="arke_test_redefault")
    x = torch.tensor([1.0, -2.0, 3.0])
    assert torch.ops.arke_test_redefault.clip(x, s=2.0).tolist() == [2.0, -4.0, 6.0]


def test_an_op_refuses_inputs_that_need_gradients_it_cannot_give() -> None:
    arke.torch.register(arke.build(arke.loads("kernel axpy(a: f32, x: f32[N], y: f32[N]) -> f32[N] "
                                              "{ return a * x[n] + y[n] }\n")), namespace="arke_test_grad")
    op = torch.ops.arke_test_grad.axpy
    x, y = torch.randn(4, requires_grad=True), torch.randn(4)
    with pytest.raises(GuardError, match="no derivative"):
        op(1.0, x, y)
    with pytest.raises(GuardError, match="no derivative"):
        op.out(1.0, x, y, out=torch.empty(4))
    with torch.no_grad():
        torch.testing.assert_close(op(1.0, x, y), x + y)
    torch.testing.assert_close(op(1.0, x.detach(), y), x.detach() + y)
    # compiled, the graph needing gradients is traced through the fake implementation (the compiled forward then
    # runs without gradients): the same refusal, at compile time, not a gradient silently missing
    torch._dynamo.reset()
    with pytest.raises(Exception, match="no derivative"):
        torch.compile(lambda x, y: op(1.0, x, y).sum() + (x * x).sum(), backend="aot_eager")(x, y).backward()


def test_a_generic_scalar_typed_by_its_dtype_variable_is_a_torch_scalar() -> None:
    """``c: W`` is an int for the i32 specialisation and a float for the f32 one: the schema says ``Scalar``."""
    src = ("kernel addc(x: W[N], c: W) -> W[N] where W in {i32, f32} { return x[n] + c }\n"
           "kernel addd(x: W[N], c: W = 2) -> W[N] where W in {f32, i32} { return x[n] + c }\n")
    arke.torch.register(arke.build(arke.loads(src)), namespace="arke_test_scalar")
    ops = torch.ops.arke_test_scalar
    assert "Scalar c" in str(ops.addc.default._schema)
    assert ops.addc(torch.ones(3), 2.5).tolist() == [3.5] * 3
    assert ops.addc(torch.ones(3, dtype=torch.int32), 4).tolist() == [5] * 3
    assert ops.addd(torch.ones(3, dtype=torch.int32), 3).tolist() == [4] * 3
    assert ops.addd(torch.ones(3)).tolist() == [3.0] * 3
    torch.library.opcheck(ops.addc.default, (torch.ones(3), 2.5))


def test_a_kernel_without_tensors_is_not_an_operator() -> None:
    """torch dispatches by the arguments' tensors: such a kernel is skipped with a warning, or refused by name."""
    lib = arke.build(arke.loads("kernel iota(N: dim) -> y: f32[N] { y[i] = f32(i) }\n"
                                "kernel dbl(x: f32[N]) -> f32[N] { return x[n] * 2.0 }\n"))
    with pytest.warns(UserWarning, match="`iota` takes no tensor and is not registered"):
        ops = arke.torch.register(lib, namespace="arke_test_tensorless")
    assert list(ops) == ["dbl"] and torch.ops.arke_test_tensorless.dbl(torch.ones(2)).tolist() == [2.0, 2.0]
    with pytest.raises(ValueError, match="`iota` takes no tensor"):
        arke.torch.register(lib, namespace="arke_test_tensorless2", kernels=["iota"])


def test_a_signature_torch_cannot_read_is_not_called_a_name_clash() -> None:
    lib = arke.build(arke.loads("kernel f(x: f32[N], None: f32 = 1.0) -> f32[N] { return x[n] * None }\n"))
    with pytest.raises(ValueError, match=r"kernel `f` cannot be a torch operator: .* not a valid torch schema"):
        arke.torch.register(lib, namespace="arke_test_badschema")
