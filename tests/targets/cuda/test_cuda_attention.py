"""The CUDA-C target's attention family (``arke/targets/cuda/attention*.py``), checked without a GPU.

Kernels are planned with the attention family on and run in the host simulator
(:mod:`cuda_host`: g++, the threads of a block as fibers, shuffles and tensor-core MMAs with
their PTX meaning) against the reference interpreter: every conformance case whose plan has an
attention dispatch; causal GQA prefill and decode in f32 (SIMT) and bf16/f16 (tensor cores)
under the flash, split_kv and default algorithms; fully masked rows; expression ``q``/``k``,
bias tensors and wide head dims. NVRTC + ptxas compile every stdlib kernel with an attention
dispatch, and the 16-bit kernels, for sm_80 and sm_90 with no spills. Strategies the kernel
cannot run are an UnsupportedError naming the decision.

Results are compared within the suite's one rule (``codegen_support.tolerance``): a 16-bit
result may be one ulp of its type away where its f32 value lies near a rounding boundary (the
f32 values before rounding differ by the sums' order), and the tensor cores round ``p`` to
``v``'s type for ``p·v`` (spec/codegen.md §7), which the rule allows in kernels whose float
inputs are all 16-bit (half a 16-bit ulp of each term of the sum).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import cuda_host
import pytest
import torch
from codegen_support import assert_conforms, random_inputs, seeded, std_module, text_module
from gpu_support import ARCHS
from test_conformance import CASES, Case

from arke.ir.shapes import evaluate, parse_dim
from arke.plan.dispatch import KernelPlan, make_plan
from arke.targets.artifact import UnsupportedError
from arke.targets.cuda import nvrtc
from arke.targets.cuda.render import CudaRenderer

pytestmark = pytest.mark.skipif(not cuda_host.available(), reason="no g++")

RENDERER = CudaRenderer(frozenset({"attention"}))


def plan_of(module: Any, name: str, variant: int = 0) -> KernelPlan:
    ir_name = module.kernel_map.get(name, name)
    strategies = module.strategies.for_kernel(ir_name, "cuda")
    strategy = strategies[variant] if 0 <= variant < len(strategies) else None
    return make_plan(module.semantic, ir_name, strategy, families=RENDERER.families)


def strategy_of(module: Any, name: str) -> Any:
    found = module.strategies.for_kernel(module.kernel_map[name], "cuda")
    return found[0] if found else None


def has_attention(module: Any, name: str) -> bool:
    return any(d.family == "attention" and d.pattern is not None for d in plan_of(module, name).dispatches)


# ---------------------------------------------------------------- conformance


@cache
def _std_has_attention(module: str, kernel: str) -> bool:
    return has_attention(std_module(module), kernel)


ATTENTION_CASES = [c for c in CASES if _std_has_attention(c.module, c.member)]


def test_some_conformance_cases_have_attention() -> None:
    assert {c.kernel for c in ATTENTION_CASES} >= {"attention", "causal_attention", "attn_cached", "attn_window"}


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=lambda c: c.id)
def test_conformance_case(case: Case) -> None:
    cuda_host.check_host_case(case, RENDERER, "cuda attention (host)")


# ---------------------------------------------------------------- GQA in f32, bf16, f16


MASKS = {"causal": "j <= i + T - S", "starved": "j < i - 3"}  # starved: rows 0..3 see no key (NaN)
ALGORITHMS = {"auto": "", "flash": "algorithm = flash", "split": "split j = 3"}


def _kernel(name: str, t: str, mask: str) -> str:
    def wide(x: str) -> str:
        return x if t == "f32" else f"f32({x})"

    out = f"sum(p[b, h, i, j] * {wide('v[b, h / R, j, d]')} for j) / sum(p[b, h, i, j] for j)"
    return (f"kernel {name}(q: {t}[B, H, S, D], k: {t}[B, G, T, D], v: {t}[B, G, T, D]) -> {t}[B, H, S, D]\n"
            "  where H % G == 0\n{\n  let R = H / G\n"
            f"  s[b, h, i, j] = sum({wide('q[b, h, i, d]')} * {wide('k[b, h / R, j, d]')} for d) / sqrt(f32(D))\n"
            f"  c[b, h, i, j] = s[b, h, i, j] if {mask} else -inf\n"
            "  mx[b, h, i] = max(c[b, h, i, j] for j)\n  p[b, h, i, j] = exp(c[b, h, i, j] - mx[b, h, i])\n"
            f"  return {out if t == 'f32' else f'{t}({out})'}\n}}\n")


def _gqa_source() -> str:
    text = ""
    for t in ("f32", "bf16", "f16"):
        for alg, decisions in ALGORITHMS.items():
            text += _kernel(f"{t}_{alg}", t, MASKS["causal"])
            if decisions:
                text += f"@strategy({t}_{alg}, target = cuda) {{ {decisions} }}\n"
        text += _kernel(f"{t}_starved", t, MASKS["starved"])
    return text


GQA = _gqa_source()
# (B, H, G, S, T, D): decode over ragged keys, GQA prefill, MQA prefill over more keys than queries
DECODE = [(1, 8, 2, 1, 129, 32), (1, 4, 1, 1, 37, 16)]
PREFILL = [(1, 4, 2, 37, 37, 64), (1, 2, 1, 20, 129, 20)]  # D = 20: rows not 16-byte aligned


def check(module: Any, name: str, dims: dict[str, int]) -> tuple[Any, Any]:
    kernel = module.kernels[name]
    args = random_inputs(kernel, dims, seeded(name, dims))
    got, err = cuda_host.run(module, name, *args, renderer=RENDERER, strategy=strategy_of(module, name))
    assert err == 0, f"{name} {dims}: the error word was raised on in-range inputs"
    want = assert_conforms(got, kernel, *args, what=f"{name} {dims}")  # see the module doc
    return got, want


@pytest.mark.parametrize("alg", list(ALGORITHMS))
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("shape", DECODE + PREFILL, ids=lambda s: "-".join(map(str, s)))
def test_causal_gqa(dtype: str, alg: str, shape: tuple[int, ...]) -> None:
    check(text_module(GQA), f"{dtype}_{alg}", dict(zip("BHGSTD", shape)))


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_16_bit_inputs_take_the_tensor_cores(dtype: str) -> None:
    source = str(RENDERER.render(plan_of(text_module(GQA), f"{dtype}_auto")).source)
    source = source[source.index("// attention"):]  # the kernels, not the prelude's primitives
    assert ("ak_mma_" in source) == (dtype != "f32")
    assert ("ak_cp_async16" in source) == (dtype != "f32")
    assert "__shfl_xor_sync" in source


def _grids(plan: KernelPlan, dims: dict[str, int]) -> dict[str, int]:
    launches = RENDERER.render(plan).launches
    return {launch.entry: evaluate(parse_dim(launch.grid[0]), dims) for launch in launches}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_default_runs_split_kv_for_decode_and_flash_for_prefill(dtype: str) -> None:
    plan = plan_of(text_module(GQA), f"{dtype}_auto")
    flash, split = (launch for launch in RENDERER.render(plan).launches)
    assert split.entry == flash.entry + "s" and split.scratch is not None and flash.scratch == "1"
    decode = dict(zip("BHGSTD", DECODE[0]))
    assert _grids(plan, decode)[flash.entry] == 0 and _grids(plan, decode)[split.entry] > 0
    prefill = dict(zip("BHGSTD", PREFILL[0]))
    assert _grids(plan, prefill)[flash.entry] > 0 and _grids(plan, prefill)[split.entry] == 0
    # one launch each for the forced algorithms; `split j = 3` cuts the keys into 3 chunks
    (one,) = RENDERER.render(plan_of(text_module(GQA), f"{dtype}_flash")).launches
    assert one.scratch == "1"
    # decode (B=1, G=2, R*S=4): one row block per group; chunks of 4 tiles (64 keys on tensor cores,
    # 32 in SIMT) by default, 3 chunks with `split j = 3`
    assert _grids(plan, decode)[split.entry] == 2 * (1 if dtype == "bf16" else 2)
    chunked = plan_of(text_module(GQA), f"{dtype}_split")
    (launch,) = RENDERER.render(chunked).launches
    assert _grids(chunked, decode)[launch.entry] == 2 * 3
    assert "atomicAdd" in RENDERER.render(chunked).source and "__threadfence" in RENDERER.render(chunked).source


@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("shape", [(1, 2, 1, 9, 9, 16), (1, 8, 2, 2, 40, 16)], ids=["square", "decode"])
def test_fully_masked_rows_are_nan(dtype: str, shape: tuple[int, ...]) -> None:
    got, want = check(text_module(GQA), f"{dtype}_starved", dict(zip("BHGSTD", shape)))
    nan = torch.as_tensor(want).float().isnan()
    assert nan.any() and torch.equal(torch.as_tensor(got).float().isnan(), nan)


# ---------------------------------------------------------------- other forms and strategies


FORMS = """
# sequence-major layouts, an additive bias read at the key, o * (1 / l)
kernel bshd(q: f32[B, S, H, D], k: f32[B, T, G, D], v: f32[B, T, G, D], bias: f32[H, S, T]) -> f32[B, S, H, D]
  where H % G == 0
{
  let R = H / G
  s[b, i, h, j] = sum(q[b, i, h, d] * k[b, j, h / R, d] for d) * 0.125 + bias[h, i, j]
  mx[b, i, h] = max(s[b, i, h, j] for j)
  return sum(exp(s[b, i, h, j] - mx[b, i, h]) * v[b, j, h / R, d] for j)
       * (1.0 / sum(exp(s[b, i, h, j] - mx[b, i, h]) for j))
}

# no batch axis, values wider than the keys, both over one tile: walked in chunks
kernel single(q: f32[S, D], k: f32[T, D], v: f32[T, F]) -> f32[S, F] {
  s[i, j] = sum(q[i, d] * k[j, d] for d)
  mx[i] = max(s[i, j] for j)
  p[i, j] = exp(s[i, j] - mx[i])
  return sum(p[i, j] * v[j, f] for j) / sum(p[i, j] for j)
}
@strategy(single, target = cuda) { tile d = 16, f = 16 }

# normalised queries and keys (expressions, not loads), a softcap, a sliding window
kernel qknorm(q: f32[B, H, S, D], k: f32[B, G, T, D], v: f32[B, G, T, D], wq: f32[D], wk: f32[D])
  -> f32[B, H, S, D] where H % G == 0
{
  let R = H / G
  qi[b, h, i] = rsqrt(mean(q[b, h, i, d] * q[b, h, i, d] for d) + 1e-6)
  ki[b, g, j] = rsqrt(mean(k[b, g, j, d] * k[b, g, j, d] for d) + 1e-6)
  qn[b, h, i, d] = q[b, h, i, d] * qi[b, h, i] * wq[d]
  kn[b, g, j, d] = k[b, g, j, d] * ki[b, g, j] * wk[d]
  s[b, h, i, j] = sum(qn[b, h, i, d] * kn[b, h / R, j, d] for d) / sqrt(f32(D))
  c[b, h, i, j] = 5.0 * tanh(s[b, h, i, j] / 5.0) if j <= i + T - S and j + 4 > i + T - S else -inf
  mx[b, h, i] = max(c[b, h, i, j] for j)
  p[b, h, i, j] = exp(c[b, h, i, j] - mx[b, h, i])
  return sum(p[b, h, i, j] * v[b, h / R, j, d] for j) / sum(p[b, h, i, j] for j)
}

# bf16 keys and values with f32 queries: SIMT, the 16-bit operands widened as read; f16 result
kernel mixed(q: f32[B, H, S, D], k: bf16[B, H, T, D], v: bf16[B, H, T, D]) -> f16[B, H, S, D] {
  s[b, h, i, j] = sum(q[b, h, i, d] * f32(k[b, h, j, d]) for d)
  mx[b, h, i] = max(s[b, h, i, j] for j)
  p[b, h, i, j] = exp(s[b, h, i, j] - mx[b, h, i])
  return f16(sum(p[b, h, i, j] * f32(v[b, h, j, d]) for j) / sum(p[b, h, i, j] for j))
}

# bf16 head dims over one tile (features chunked per key tile, values as passes over the keys),
# the key tiles in one buffer
kernel narrow(q: bf16[H, S, D], k: bf16[H, T, D], v: bf16[H, T, D]) -> bf16[H, S, D] {
  s[h, i, j] = sum(f32(q[h, i, d]) * f32(k[h, j, d]) for d)
  mx[h, i] = max(s[h, i, j] for j)
  p[h, i, j] = exp(s[h, i, j] - mx[h, i])
  return bf16(sum(p[h, i, j] * f32(v[h, j, d]) for j) / sum(p[h, i, j] for j))
}
@strategy(narrow, target = cuda) { tile d = 16
  stages = 1 }

# bf16, sequence-major: group 0's rows of 40 bytes go by cp.async (the last copy of a row ragged),
# group 1's (not 16-byte aligned) element by element
kernel bshd16(q: bf16[B, S, H, D], k: bf16[B, T, G, D], v: bf16[B, T, G, D]) -> bf16[B, S, H, D]
  where H % G == 0
{
  let R = H / G
  s[b, i, h, j] = sum(f32(q[b, i, h, d]) * f32(k[b, j, h / R, d]) for d) / sqrt(f32(D))
  mx[b, i, h] = max(s[b, i, h, j] for j)
  p[b, i, h, j] = exp(s[b, i, h, j] - mx[b, i, h])
  return bf16(sum(p[b, i, h, j] * f32(v[b, j, h / R, d]) for j) / sum(p[b, i, h, j] for j))
}

# heads in pairs with no `where`: the last group reads past k's heads (an error, never a wild read)
kernel pairs(q: f32[H, S, D], k: f32[G, T, D], v: f32[G, T, D]) -> f32[H, S, D] {
  s[h, i, j] = sum(q[h, i, d] * k[h / 2, j, d] for d)
  mx[h, i] = max(s[h, i, j] for j)
  p[h, i, j] = exp(s[h, i, j] - mx[h, i])
  return sum(p[h, i, j] * v[h / 2, j, d] for j) / sum(p[h, i, j] for j)
}
"""


@pytest.mark.parametrize(("name", "dims"), [
    ("bshd", {"B": 2, "S": 3, "H": 4, "G": 2, "T": 11, "D": 8}),
    ("single", {"S": 4, "D": 21, "T": 30, "F": 37}),
    ("qknorm", {"B": 1, "H": 2, "G": 1, "S": 5, "T": 12, "D": 8}),
    ("mixed", {"B": 1, "H": 3, "S": 17, "T": 33, "D": 24}),
    ("narrow", {"H": 2, "S": 19, "T": 45, "D": 40}),
    ("bshd16", {"B": 1, "S": 9, "H": 4, "G": 2, "T": 70, "D": 20}),
    ("pairs", {"H": 4, "G": 2, "S": 2, "T": 5, "D": 4}),
])
def test_attention_forms(name: str, dims: dict[str, int]) -> None:
    module = text_module(FORMS)
    assert has_attention(module, name)
    check(module, name, dims)


def test_gqa_reading_past_the_heads_raises_the_error_word() -> None:
    module = text_module(FORMS)
    args = random_inputs(module.kernels["pairs"], {"H": 3, "G": 1, "S": 2, "T": 5, "D": 4}, seeded("pairs-bad"))
    got, err = cuda_host.run(module, "pairs", *args, renderer=RENDERER)
    assert err == 1 and torch.as_tensor(got).isfinite().all()  # clamped: never a wild read


def test_tiles_reach_the_kernel() -> None:
    module = text_module(FORMS + "@strategy(bshd, target = cuda) { tile i = 32, j = 16\n warps = 2 }\n")
    artifact = RENDERER.render(plan_of(module, "bshd"))
    assert "BLOCK_M=32 BLOCK_N=16" in artifact.source and "warps=2" in artifact.source
    assert {dict(launch.options)["block"] for launch in artifact.launches} == {64}
    check(module, "bshd", {"B": 1, "S": 40, "H": 2, "G": 1, "T": 37, "D": 8})


BAD = [
    ("bf16", "tile i = 24", "`tile i = 24`.*16, 32, 64"),
    ("bf16", "tile j = 40\n algorithm = flash", "`tile j = 40`.*multiple of 16"),
    ("bf16", "tile d = 24", "`tile d = 24`.*multiples of 16"),
    ("bf16", "warps = 2\n tile i = 64", "`warps = 2`.*multiple of 4"),
    ("bf16", "stages = 5", "`stages = 5`.*1 to 4"),
    ("bf16", "tile i = 128, d = 256\n warps = 8", "202752 bytes of shared memory"),
    ("f32", "tile i = 12", "`tile i = 12`.*rows in \\{4, 8, 16"),
    ("f32", "tile j = 36", "`tile j = 36`.*multiple of 8"),
    ("f32", "tile i = 64\n warps = 1", "with `warps = 1`.*rows in \\{1, 2, 4"),
]


@pytest.mark.parametrize(("dtype", "decisions", "message"), BAD, ids=[b[1].split("\n")[0] for b in BAD])
def test_unusable_strategies_name_the_decision(dtype: str, decisions: str, message: str) -> None:
    module = text_module(_kernel("bad", dtype, MASKS["causal"]) + f"@strategy(bad, target = cuda) {{ {decisions} }}\n")
    with pytest.raises(UnsupportedError, match=f"(?s){message}"):
        RENDERER.render(plan_of(module, "bad"))


# ---------------------------------------------------------------- NVRTC + ptxas


needs_compilers = pytest.mark.skipif(not nvrtc.available() or nvrtc.ptxas_path() is None,
                                     reason="no NVRTC (pip install 'arke[cuda]') or no ptxas (it ships with Triton)")
STD_ATTENTION = sorted({(c.module, c.member) for c in ATTENTION_CASES})  # generic kernels: each specialisation
OURS = [("gqa", "bf16_auto"), ("gqa", "f16_split"), ("forms", "narrow")]


@cache
def _source(module: str, kernel: str) -> str:
    m = text_module(GQA) if module == "gqa" else text_module(FORMS) if module == "forms" else std_module(module)
    return str(RENDERER.render(plan_of(m, kernel)).source)


@needs_compilers
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(("module", "kernel"), STD_ATTENTION + OURS, ids=lambda v: v)
def test_assembles_without_spills(module: str, kernel: str, arch: str) -> None:
    from arke.targets.nvidia import ptx as nvptx

    ptx = nvrtc.compile_ptx(_source(module, kernel), arch, kernel=kernel)
    _, entries = nvptx.assemble(ptx, arch)
    assert entries
    for e in entries:
        assert e.spills == 0, f"{e.entry} spills {e.spills} words on {arch}"
        assert 0 < e.registers <= 255
