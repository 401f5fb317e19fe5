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
