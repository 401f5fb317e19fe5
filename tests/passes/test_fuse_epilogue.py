"""A contraction's epilogue grows through the maps that read it element for element: GPT-2's
``h = x @ w + b`` then ``g = gelu_tanh(h)`` (h read three times) is one epilogue, so the plan has
no map dispatch between the two matmuls; anything else reading the epilogue keeps it stored.
Every runnable target gives the interpreter's answer on the fused plan."""

from __future__ import annotations

import numpy as np
import pytest
from codegen_support import assert_conforms, build, seeded, text_module

from arke.ir import semantic as S
from arke.plan.dispatch import make_plan

SOURCE = """
kernel mlp(x: f32[T, C], w_fc: f32[C, F], b_fc: f32[F], w_proj: f32[F, C], b_proj: f32[C]) -> f32[T, C] {
  h[t, f] = sum(x[t, c] * w_fc[c, f] for c) + b_fc[f]
  g[t, f] = 0.5 * h[t, f] * (1.0 + tanh(0.7978845608028654 * (h[t, f] + 0.044715 * h[t, f] ** 3)))
  return sum(g[t, f] * w_proj[f, c] for f) + b_proj[c]
}
kernel shifted(x: f32[T, C], w: f32[C, F]) -> f32[T, F] {
  h[t, f] = sum(x[t, c] * w[c, f] for c) * 2.0
  return h[t, f] + h[t, 0]
}
kernel two_readers(x: f32[T, C], w: f32[C, F]) -> (a: f32[T, F], b: f32[T]) {
  h[t, f] = sum(x[t, c] * w[c, f] for c) + 1.0
  a[t, f] = relu(h[t, f])
  b[t] = sum(h[t, f] for f)
}
"""


def families(kernel: str) -> list[str]:
    module = text_module(SOURCE)
    return [d.family for d in make_plan(module.semantic, module.kernel_map[kernel]).dispatches]


def test_activation_joins_the_epilogue() -> None:
    assert families("mlp") == ["contraction", "contraction"]
    plan = make_plan(text_module(SOURCE).semantic, "mlp")
    epilogue = plan.dispatches[0].pattern.epilogue
    assert isinstance(epilogue, S.MapOp)
    assert any(isinstance(n, S.Unary) and n.op == "tanh" for n in S.walk(epilogue.body))


def test_not_element_for_element_stays() -> None:
    """``h[t, 0]`` reads another element: h stays a stored epilogue and the map its own dispatch."""
    assert families("shifted")[0] == "contraction" and len(families("shifted")) == 2


def test_two_readers_stay() -> None:
    assert "contraction" in families("two_readers") and len(families("two_readers")) >= 2


@pytest.mark.parametrize("target", ["llvm", "triton", "mlir"])
@pytest.mark.parametrize("kernel", ["mlp", "shifted", "two_readers"])
def test_fused_epilogues_conform(target: str, kernel: str) -> None:
    from arke.targets import base

    if base.get(target).unavailable() is not None:
        pytest.skip(base.get(target).unavailable())
    module = text_module(SOURCE)
    k = module.kernels[kernel]
    dims = {"T": 3, "C": 37, "F": 65} if target != "llvm" else {"T": 5, "C": 129, "F": 4097}
    rng = seeded("fuse_epilogue", kernel, target)

    def arr(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    t, c, f = dims["T"], dims["C"], dims["F"]
    args = {"mlp": (arr(t, c), arr(c, f), arr(f), arr(f, c), arr(c)), "shifted": (arr(t, c), arr(c, f)),
            "two_readers": (arr(t, c), arr(c, f))}[kernel]
    got = getattr(build(module, target), kernel)(*args)
    assert_conforms(got, k, *args, what=f"{kernel} on {target}")


GATED = """
kernel gated(x: A[T, C], wg: A[F, C], wu: A[F, C]) -> A[T, F]
  where A in {bf16, f16}
{
  g[t, f] = A(sum(f32(x[t, c]) * f32(wg[f, c]) for c))
  u[t, f] = A(sum(f32(x[t, c]) * f32(wu[f, c]) for c))
  return A(f32(A(silu(f32(g[t, f])))) * f32(u[t, f]))
}
kernel gated32(x: f32[T, C], wg: f32[F, C], wu: f32[F, C]) -> f32[T, F] {
  g[t, f] = sum(x[t, c] * wg[f, c] for c)
  return silu(g[t, f]) * sum(x[t, c] * wu[f, c] for c)
}
"""


@pytest.mark.parametrize("half", ["bf16", "f16"])
def test_half_gate_stays_its_own_sums_epilogue(half: str) -> None:
    """A half-precision SwiGLU: the gate's rounding stays the gate sum's epilogue (stored in bf16/f16, half
    the bytes of its f32 sums), the product is the up projection's; in f32 the gate sum is read as is."""
    module = text_module(GATED)
    plan = make_plan(module.semantic, f"gated__A_{half}")
    assert [d.family for d in plan.dispatches] == ["contraction", "contraction"]
    first, second = (d.pattern.epilogue for d in plan.dispatches)
    assert isinstance(first, S.MapOp) and first.dtype.name.lower() == half
    assert isinstance(second, S.MapOp) and any(isinstance(n, S.Unary) and n.op == "silu" for n in S.walk(second.body))
    plan32 = make_plan(module.semantic, "gated32")
    assert plan32.dispatches[0].pattern.epilogue is None


@pytest.mark.parametrize("half", ["bf16", "f16"])
def test_half_gate_conforms(half: str) -> None:
    import torch

    module = text_module(GATED)
    rng = seeded("gated", half)
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[half]
    t, c, f = 5, 48, 70
    x, wg, wu = (torch.from_numpy((rng.standard_normal(s) / 4).astype(np.float32)).to(dtype)
                 for s in ((t, c), (f, c), (f, c)))
    got = build(module, "llvm").gated(x, wg, wu)
    assert_conforms(got, module.kernels["gated"], x, wg, wu, what=f"gated {half}")
