"""The Triton target's fused families: contractions (``arke/targets/triton/gemm.py``) and attention
(``arke/targets/triton/attention.py``), run in Triton's interpreter against the reference interpreter.

Kernels are planned with the contraction and attention families on (whatever the target's
renderer declares) and launched by the Triton runtime (``arke.targets.triton.kernel``) on CPU tensors
under ``TRITON_INTERPRET=1`` (``tests/conftest.py`` sets it unless the environment does).
Shapes are tiny and ragged (the interpreter is slow); strategies change the blocks and the
attention algorithm, never the result.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from codegen_support import HALF_ATTENTION, assert_conforms, random_inputs, seeded, std_module, text_module

import arke
from arke.plan.dispatch import make_plan
from arke.runtime.guards import GuardError
from arke.targets.triton import kernel as gpu
from arke.targets.triton.render import TritonRenderer

pytest.importorskip("triton")

pytestmark = pytest.mark.skipif(not gpu.interpreting() and not torch.cuda.is_available(),
                                reason="Triton kernels need TRITON_INTERPRET=1 or a CUDA device")

FAMILIES = frozenset({"rows", "contraction", "attention"})


class _Renderer(TritonRenderer):
    """The Triton renderer with both fused families on (whatever the shipped one declares)."""

    families = FAMILIES


_BUILT: dict[tuple[int, str, int], tuple[arke.Module, Any]] = {}


def compiled(module: arke.Module, name: str, variant: int = 0) -> Any:
    """Kernel ``name`` of ``module`` built for Triton with its ``variant``-th strategy (-1: none), once."""
    key = (id(module), name, variant)
    if key not in _BUILT:
        _BUILT[key] = (module, _compile(module, name, variant))  # the module is kept alive: its id stays unique
    return _BUILT[key][1]


def _compile(module: arke.Module, name: str, variant: int) -> Any:
    ir_name = module.kernel_map[name]
    strategies = module.strategies.for_kernel(ir_name, "triton")
    strategy = strategies[variant] if 0 <= variant < len(strategies) else None
    plan = make_plan(module.semantic, ir_name, strategy, FAMILIES)
    return gpu.TritonKernel(plan, _Renderer().render(plan), module.semantic)


def families(module: arke.Module, name: str) -> list[str]:
    return [d.family for d in compiled(module, name).plan.dispatches]


def check(module: arke.Module, name: str, dims: dict[str, int], variant: int = 0) -> None:
    """The compiled kernel on random inputs equals the interpreter within the rule (codegen_support.tolerance)."""
    kernel = module.kernels[name]
    args = random_inputs(kernel, dims, seeded(name, dims, variant))
    assert_conforms(compiled(module, name, variant)(*args), kernel, *args, what=f"{name} {dims}")


# ---------------------------------------------------------------- contractions

NN = "std.nn"
GEMMS = [
    ("matmul", {"M": 5, "K": 37, "N": 19}),
    ("matmul", {"M": 70, "K": 3, "N": 66}),  # several row and column blocks, K below one step
    ("bmm", {"B": 3, "M": 4, "K": 9, "N": 17}),
    ("linear", {"M": 1, "K": 40, "N": 23}),  # decode: one row in a padded block
    ("linear_bias", {"M": 6, "K": 33, "N": 20}),
    ("linear_int8", {"M": 3, "K": 21, "N": 18}),
    ("swiglu", {"T": 5, "D": 19, "F": 22}),
    ("geglu", {"T": 2, "D": 35, "F": 9}),
]


@pytest.mark.parametrize(("name", "dims"), GEMMS, ids=[f"{n}-{'-'.join(map(str, d.values()))}" for n, d in GEMMS])
def test_stdlib_contractions(name: str, dims: dict[str, int]) -> None:
    module = std_module(NN)
    assert "contraction" in families(module, name)
    check(module, name, dims)


def test_bf16_operands_reach_the_dot_as_stored() -> None:
    module = std_module(NN)
    source = compiled(module, "linear_bf16").artifact.source
    assert "tl.dot(" in source and "_ak_wide_dot" in source
    check(module, "linear_bf16", {"M": 7, "K": 45, "N": 21})


GEMM_STRATEGIES = """
import std.nn

kernel tiled(a: f32[M, K], b: f32[K, N]) -> f32[M, N] {
  return sum(a[m, k] * b[k, n] for k)
}
@strategy(tiled, target = triton) { tile m = 16, n = 32, k = 16
  warps = 2
  stages = 1 }

# a prologue on both sides (not 0 at 0: the ragged edge must not count) and an epilogue
kernel fused(x: f32[M, K], w: f32[N, K], b: f32[N], r: f32[M, N]) -> f32[M, N] {
  return gelu(sum(exp(x[m, k]) * (w[n, k] + 1.0) for k) + b[n]) + r[m, n]
}
@strategy(fused, target = triton) { tile m = 16, n = 16, k = 16 }

# a batch axis between the rows and the columns, the weight shared by the batch
kernel shared(x: f32[M, B, K], w: f32[K, N]) -> f32[M, B, N] {
  return sum(x[m, b, k] * w[k, n] for k) * 0.5
}

# f16 operands fed to tl.dot, the result rounded to f16 once
kernel half(x: f16[M, K], w: f16[K, N]) -> f16[M, N] {
  return f16(sum(f32(x[m, k]) * f32(w[k, n]) for k))
}
"""


@pytest.mark.parametrize(("name", "dims"), [
    ("tiled", {"M": 37, "K": 50, "N": 45}),
    ("fused", {"M": 9, "K": 21, "N": 17}),
    ("shared", {"M": 5, "B": 3, "K": 7, "N": 11}),
])
def test_contraction_forms_and_tiles(name: str, dims: dict[str, int]) -> None:
    module = text_module(GEMM_STRATEGIES)
    assert families(module, name) == ["contraction"]
    check(module, name, dims)


def test_strategy_sets_blocks_warps_and_stages() -> None:
    launch = compiled(text_module(GEMM_STRATEGIES), "tiled").artifact.launches[0]
    assert dict(launch.options) == {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "num_warps": 2, "num_stages": 1}
    assert launch.scratch is None and len(launch.grid) == 1


def test_f16_contraction() -> None:
    check(text_module(GEMM_STRATEGIES), "half", {"M": 6, "K": 40, "N": 18})


# ---------------------------------------------------------------- attention

ATT = "std.attention"
# (B, H, G, S, T, D): MHA, GQA, MQA, decode, T > S, ragged D; decode over 300 keys runs split_kv
# by default with two chunks of 256 keys
SHAPES = [(1, 2, 2, 5, 7, 8), (2, 4, 2, 3, 9, 12), (1, 4, 1, 1, 40, 16), (1, 2, 1, 20, 20, 5), (1, 8, 2, 1, 70, 24),
          (1, 8, 2, 1, 300, 8)]


@pytest.mark.parametrize("name", ["attention", "causal_attention"])
@pytest.mark.parametrize("shape", SHAPES, ids=["-".join(map(str, s)) for s in SHAPES])
def test_stdlib_attention(name: str, shape: tuple[int, ...]) -> None:
    module = std_module(ATT)
    assert families(module, name) == ["attention"]
    check(module, name, dict(zip("BHGSTD", shape)))


SIG = "(q: f32[B, H, S, D], k: f32[B, G, T, D], v: f32[B, G, T, D]) -> f32[B, H, S, D]\n  where H % G == 0"
SCORE = "sum(q[b, h, i, d] * k[b, h / R, j, d] for d) / sqrt(f32(D))"
TAIL = """  mx[b, h, i] = max(c[b, h, i, j] for j)
  p[b, h, i, j] = exp(c[b, h, i, j] - mx[b, h, i])
  return sum(p[b, h, i, j] * v[b, h / R, j, d] for j) / sum(p[b, h, i, j] for j)"""
BODIES = {
    "causal": "s[b, h, i, j] if j <= i + T - S else -inf",
    "softcap": "5.0 * tanh(s[b, h, i, j] / 5.0) if j <= i + T - S else -inf",
    "window": "s[b, h, i, j] if j <= i + T - S and j + 4 > i + T - S else -inf",
    "starved": "s[b, h, i, j] if j < i - 3 else -inf",  # rows 0..3 see no key: NaN, as the reference
}
# 16-key blocks make split_kv's default chunks (8 blocks) several for 150 keys
ALGORITHMS = {"flash": "algorithm = flash", "split": "algorithm = split_kv\n  tile j = 16", "chunked": "split j = 3",
              "materialized": "algorithm = materialized\n  tile i = 16, j = 16, d = 16", "auto": "tile j = 16"}


def _attention_source() -> str:
    text = ""
    for body, c in BODIES.items():
        for alg, decisions in ALGORITHMS.items():
            name = f"{body}_{alg}"
            text += (f"kernel {name}{SIG}\n{{\n  let R = H / G\n  s[b, h, i, j] = {SCORE}\n"
                     f"  c[b, h, i, j] = {c}\n{TAIL}\n}}\n")
            if decisions:
                text += f"@strategy({name}, target = triton) {{ {decisions} }}\n"
    return text + OTHERS


OTHERS = f"""
# sequence-major layouts and an additive bias read at the key, o * (1 / l)
kernel bshd(q: f32[B, S, H, D], k: f32[B, T, G, D], v: f32[B, T, G, D], bias: f32[H, S, T]) -> f32[B, S, H, D]
  where H % G == 0
{{
  let R = H / G
  s[b, i, h, j] = sum(q[b, i, h, d] * k[b, j, h / R, d] for d) * 0.125 + bias[h, i, j]
  mx[b, i, h] = max(s[b, i, h, j] for j)
  return sum(exp(s[b, i, h, j] - mx[b, i, h]) * v[b, j, h / R, d] for j)
       * (1.0 / sum(exp(s[b, i, h, j] - mx[b, i, h]) for j))
}}

# no batch axis, values wider than the keys
kernel single(q: f32[S, D], k: f32[T, D], v: f32[T, F]) -> f32[S, F] {{
  s[i, j] = sum(q[i, d] * k[j, d] for d)
  mx[i] = max(s[i, j] for j)
  p[i, j] = exp(s[i, j] - mx[i])
  return sum(p[i, j] * v[j, f] for j) / sum(p[i, j] for j)
}}
@strategy(single, target = triton) {{ tile d = 16, f = 16 }}

# normalised queries and keys: q and k are expressions, not loads
kernel qknorm(q: f32[B, H, S, D], k: f32[B, G, T, D], v: f32[B, G, T, D], wq: f32[D], wk: f32[D])
  -> f32[B, H, S, D] where H % G == 0
{{
  let R = H / G
  qi[b, h, i] = rsqrt(mean(q[b, h, i, d] * q[b, h, i, d] for d) + 1e-6)
  ki[b, g, j] = rsqrt(mean(k[b, g, j, d] * k[b, g, j, d] for d) + 1e-6)
  qn[b, h, i, d] = q[b, h, i, d] * qi[b, h, i] * wq[d]
  kn[b, g, j, d] = k[b, g, j, d] * ki[b, g, j] * wk[d]
  s[b, h, i, j] = sum(qn[b, h, i, d] * kn[b, h / R, j, d] for d) / sqrt(f32(D))
  c[b, h, i, j] = s[b, h, i, j] if j <= i + T - S else -inf
{TAIL}
}}

# heads in pairs with no `where`: the last group reads past k's heads (an error, never a wild read)
kernel pairs(q: f32[H, S, D], k: f32[G, T, D], v: f32[G, T, D]) -> f32[H, S, D] {{
  s[h, i, j] = sum(q[h, i, d] * k[h / 2, j, d] for d)
  mx[h, i] = max(s[h, i, j] for j)
  p[h, i, j] = exp(s[h, i, j] - mx[h, i])
  return sum(p[h, i, j] * v[h / 2, j, d] for j) / sum(p[h, i, j] for j)
}}
"""

VARIANTS = [(body, alg) for body in BODIES for alg in ALGORITHMS]
# (B, H, G, S, T, D): decode over many key blocks (split_kv by default), and prefill
ATT_SHAPES = [(1, 4, 2, 1, 150, 8), (1, 2, 1, 19, 23, 20)]


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # starved rows: 0 / 0
@pytest.mark.parametrize(("body", "alg"), VARIANTS, ids=[f"{b}-{a}" for b, a in VARIANTS])
def test_attention_algorithms(body: str, alg: str) -> None:
    module = text_module(_attention_source())
    assert families(module, f"{body}_{alg}") == ["attention"]
    for shape in ATT_SHAPES:
        check(module, f"{body}_{alg}", dict(zip("BHGSTD", shape)))


def test_split_kv_workspace_and_grid() -> None:
    """split_kv: one program per (row block, chunk), partials and counters in the workspace."""
    module = text_module(_attention_source())
    launch = compiled(module, "causal_chunked").artifact.launches[0]
    assert launch.scratch is not None and "T" in launch.grid[0]
    assert "tl.atomic_add" in compiled(module, "causal_chunked").artifact.source
    flash = compiled(module, "causal_flash").artifact
    assert flash.launches[0].scratch in (None, "1") and "atomic" not in flash.source  # "1": the error word


@pytest.mark.parametrize(("name", "dims"), [
    ("bshd", {"B": 2, "S": 3, "H": 4, "G": 2, "T": 11, "D": 8}),
    ("single", {"S": 4, "D": 21, "T": 30, "F": 37}),  # D and F over one block: chunked
    ("qknorm", {"B": 1, "H": 2, "G": 1, "S": 3, "T": 6, "D": 8}),
    ("pairs", {"H": 4, "G": 2, "S": 2, "T": 5, "D": 4}),
])
def test_attention_forms(name: str, dims: dict[str, int]) -> None:
    module = text_module(_attention_source())
    assert "attention" in families(module, name)
    check(module, name, dims)


def test_gqa_reading_past_the_heads_is_an_error() -> None:
    module = text_module(_attention_source())
    dims = {"H": 3, "G": 1, "S": 2, "T": 5, "D": 4}  # heads 2 reads k[1]: out of range
    args = random_inputs(module.kernels["pairs"], dims, seeded("pairs-bad"))
    with pytest.raises(GuardError):
        compiled(module, "pairs")(*args)


def test_no_source_name_reaches_the_text() -> None:
    module = text_module(_attention_source())
    for name in ("bshd", "qknorm", "causal_auto"):
        source = compiled(module, name).artifact.source
        for word in ("bias", "qknorm", "wq", "mx", "bshd"):
            assert word not in source


HALF_ATT = HALF_ATTENTION


@pytest.mark.parametrize("dims", [{"B": 1, "H": 4, "G": 2, "S": 5, "T": 37, "D": 24},  # split_kv (R * S <= 16)
                                  {"B": 1, "H": 2, "G": 1, "S": 20, "T": 40, "D": 40},  # flash
                                  {"B": 2, "H": 8, "G": 2, "S": 1, "T": 300, "D": 16}])  # decode, chunks
def test_16_bit_attention_on_the_matrix_units(dims: dict[str, int]) -> None:
    """bf16 q, k, v: tl.dot on the stored blocks (f32 in the interpreter), head dims covered by one
    block sized at launch, flash and split_kv as separate kernels (each grid empty unless chosen)."""
    module = text_module(HALF_ATT)
    kernel = compiled(module, "half_io", -1)
    assert [d.family for d in kernel.plan.dispatches] == ["attention"]
    flash, split = kernel.artifact.launches
    assert dict(flash.covers) == {"BLOCK_D": "D", "BLOCK_E": "D"} and split.entry == flash.entry + "s"
    assert dict(flash.options)["BLOCK_M"] == 128 and dict(split.options)["BLOCK_M"] == 16
    source = kernel.artifact.source
    assert "tl.dot(" in source and 'input_precision="ieee"' not in source and ".to(tl.bfloat16)" in source
    check(module, "half_io", dims, -1)
