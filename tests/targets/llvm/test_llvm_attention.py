"""The attention family: which kernels are recognised, and that every algorithm (flash,
split_kv, materialized, and the run-time choice) gives the interpreter's answer on sampled
shapes (ragged sizes, MHA / GQA / MQA, causal with T > S, decode, long key ranges), for
score expressions with extra math and masks, at every vector width, with bit-identical
results for any thread count.

Each algorithm is forced by a ``@strategy`` on its own copy of the kernel: the source below
is generated from a few bodies, one kernel per (body, algorithm). (The file is named after
arke/targets/llvm/attention.py: tests/stdlib already has a test_attention.py, and test
modules need distinct names.)
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from codegen_support import (
    HALF_ATTENTION,
    RUNNABLE,
    assert_conforms,
    assert_matches,
    build,
    random_inputs,
    same_bits,
    seeded,
    text_module,
)

from arke.ir import semantic as ir
from arke.plan.attention import QUERY, Attention
from arke.plan.dispatch import KernelPlan, make_plan
from arke.plan.prologue import PREFIX
from arke.runtime.guards import GuardError
from arke.targets.llvm.render import LLVMRenderer

pytestmark = pytest.mark.skipif("llvm" not in RUNNABLE, reason="the llvm target cannot run here")

SIG = "(q: f32[B, H, S, D], k: f32[B, G, T, D], v: f32[B, G, T, D]) -> f32[B, H, S, D]\n  where H % G == 0"
SCORE = "sum(q[b, h, i, d] * k[b, h / R, j, d] for d) / sqrt(f32(D))"
TAIL = """  mx[b, h, i] = max(c[b, h, i, j] for j)
  p[b, h, i, j] = exp(c[b, h, i, j] - mx[b, h, i])
  return sum(p[b, h, i, j] * v[b, h / R, j, d] for j) / sum(p[b, h, i, j] for j)"""

#: Bodies (the score expression ``c`` and what follows), each compiled once per algorithm.
BODIES = {
    "causal": f"  c[b, h, i, j] = s[b, h, i, j] if j <= i + T - S else -inf\n{TAIL}",
    "full": f"  c[b, h, i, j] = s[b, h, i, j]\n{TAIL}",
    # softcapping (Gemma 2) under the causal mask: tanh on whole vectors
    "softcap": f"  c[b, h, i, j] = 5.0 * tanh(s[b, h, i, j] / 5.0) if j <= i + T - S else -inf\n{TAIL}",
    # a sliding window: keys below the window are skipped too
    "window": f"  c[b, h, i, j] = s[b, h, i, j] if j <= i + T - S and j + 4 > i + T - S else -inf\n{TAIL}",
    # rows before the fourth see no key at all: exp(-inf - -inf) makes them NaN, as in the reference
    "starved": f"  c[b, h, i, j] = s[b, h, i, j] if j < i - 3 else -inf\n{TAIL}",
}
ALGORITHMS = ("flash", "split_kv", "materialized", "auto")


def _kernel(name: str, body: str, algorithm: str) -> str:
    text = f"kernel {name}{SIG}\n{{\n  let R = H / G\n  s[b, h, i, j] = {SCORE}\n{body}\n}}\n"
    if algorithm != "auto":
        text += f"@strategy({name}, target = llvm) {{ algorithm = {algorithm} }}\n"
    return text


OTHERS = f"""
# the exponentials written inside both sums (nothing for the fusion pass to fold), o * (1 / l)
kernel inlined{SIG}
{{
  let R = H / G
  s[b, h, i, j] = {SCORE}
  mx[b, h, i] = max(s[b, h, i, j] for j)
  return sum(exp(s[b, h, i, j] - mx[b, h, i]) * v[b, h / R, j, d] for j)
       * (1.0 / sum(exp(s[b, h, i, j] - mx[b, h, i]) for j))
}}

# sequence-major layouts (B, S, H, D) and an additive bias read at the key
kernel bshd(q: f32[B, S, H, D], k: f32[B, T, G, D], v: f32[B, T, G, D], bias: f32[H, S, T]) -> f32[B, S, H, D]
  where H % G == 0
{{
  let R = H / G
  s[b, i, h, j] = sum(q[b, i, h, d] * k[b, j, h / R, d] for d) * 0.125 + bias[h, i, j]
  mx[b, i, h] = max(s[b, i, h, j] for j)
  p[b, i, h, j] = exp(s[b, i, h, j] - mx[b, i, h])
  return sum(p[b, i, h, j] * v[b, j, h / R, d] for j) / sum(p[b, i, h, j] for j)
}}

# the row max is also returned: the generic path keeps it
kernel with_max{SIG.replace("-> f32[B, H, S, D]", "-> (f32[B, H, S, D], f32[B, H, S])")}
{{
  let R = H / G
  s[b, h, i, j] = {SCORE}
  mx[b, h, i] = max(s[b, h, i, j] for j)
  p[b, h, i, j] = exp(s[b, h, i, j] - mx[b, h, i])
  return sum(p[b, h, i, j] * v[b, h / R, j, d] for j) / sum(p[b, h, i, j] for j), mx
}}

# values stored feature-major: their feature axis is not the innermost, so not this family
kernel v_by_feature(q: f32[B, H, S, D], k: f32[B, G, T, D], v: f32[B, G, D, T]) -> f32[B, H, S, D]
  where H % G == 0
{{
  let R = H / G
  s[b, h, i, j] = {SCORE}
  mx[b, h, i] = max(s[b, h, i, j] for j)
  p[b, h, i, j] = exp(s[b, h, i, j] - mx[b, h, i])
  return sum(p[b, h, i, j] * v[b, h / R, d, j] for j) / sum(p[b, h, i, j] for j)
}}

# no batch axis at all, values of another width than the keys
kernel single(q: f32[S, D], k: f32[T, D], v: f32[T, F]) -> f32[S, F] {{
  s[i, j] = sum(q[i, d] * k[j, d] for d)
  mx[i] = max(s[i, j] for j)
  p[i, j] = exp(s[i, j] - mx[i])
  return sum(p[i, j] * v[j, f] for j) / sum(p[i, j] for j)
}}

# normalised queries and keys (QK-norm): the fused norms make q and k expressions, not loads
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

# keys stored feature-major and rotated (rotate-half) in the kernel: read lane by lane
kernel rotated(q: f32[H, S, D], k: f32[G, D, T], v: f32[G, T, D], pos: f32[T]) -> f32[H, S, D]
  where D % 2 == 0, H % G == 0
{{
  let R = H / G
  let half = D / 2
  kr[g, j, d] = k[g, d, j] * cos(pos[j]) + (-1.0 if d < half else 1.0) * k[g, (d + half) % D, j] * sin(pos[j])
  s[h, i, j] = sum(q[h, i, d] * kr[h / R, j, d] for d)
  mx[h, i] = max(s[h, i, j] for j)
  p[h, i, j] = exp(s[h, i, j] - mx[h, i])
  return sum(p[h, i, j] * v[h / R, j, d] for j) / sum(p[h, i, j] for j)
}}

# 16-bit queries and keys, widened as they are read: q and k are casts, computed row by row
kernel narrow(q: bf16[H, S, D], k: f16[H, T, D], v: f32[H, T, D]) -> f32[H, S, D] {{
  s[h, i, j] = sum(f32(q[h, i, d]) * f32(k[h / 1, j, d]) for d) * 0.5
  mx[h, i] = max(s[h, i, j] for j)
  p[h, i, j] = exp(s[h, i, j] - mx[h, i])
  return sum(p[h, i, j] * v[h / 1, j, d] for j) / sum(p[h, i, j] for j)
}}

# heads in pairs with no `where`: the last group can read past k's heads (an error, never a wild read)
kernel pairs(q: f32[H, S, D], k: f32[G, T, D], v: f32[G, T, D]) -> f32[H, S, D] {{
  s[h, i, j] = sum(q[h, i, d] * k[h / 2, j, d] for d)
  mx[h, i] = max(s[h, i, j] for j)
  p[h, i, j] = exp(s[h, i, j] - mx[h, i])
  return sum(p[h, i, j] * v[h / 2, j, d] for j) / sum(p[h, i, j] for j)
}}
"""

SPLIT = f"{_kernel('chunked', BODIES['causal'], 'auto')}@strategy(chunked, target = llvm) {{ split j = 3 }}\n"
SOURCE = SPLIT + "".join(_kernel(f"{body}_{alg}", text, alg) for body, text in BODIES.items()
                         for alg in ALGORITHMS) + OTHERS

# (B, H, G, S, T, D)
SHAPES = [
    (1, 1, 1, 1, 1, 1),
    (2, 8, 2, 5, 33, 16),  # GQA (R = 4), T > S
    (1, 4, 1, 17, 17, 8),  # MQA, square
    (1, 3, 3, 3, 17, 5),  # MHA, ragged everything
    (1, 8, 2, 1, 70, 8),  # decode
    (1, 4, 2, 70, 100, 3),  # several row blocks and key tiles
]
LONG = (1, 2, 1, 1, 4097, 5)  # decode over a long key range: many split_kv chunks


def module() -> Any:
    return text_module(SOURCE)


def dims(shape: tuple[int, ...]) -> dict[str, int]:
    return dict(zip("BHGSTD", shape))


def check(name: str, shape: tuple[int, ...], threads: int | None = None) -> None:
    mod = module()
    args = random_inputs(mod.kernels[name], dims(shape), seeded(name, shape))
    got = build(mod, "llvm").kernels[name](*args, threads=threads)
    assert_conforms(got, mod.kernels[name], *args, what=f"{name} {shape}")


def plan_of(name: str) -> KernelPlan:
    mod = module()
    ir_name = mod.kernel_map[name]
    strategies = mod.strategies.for_kernel(ir_name, "llvm")
    return make_plan(mod.semantic, ir_name, strategies[0] if strategies else None)


def attention_patterns(plan: KernelPlan) -> list[Attention]:
    return [d.pattern for d in plan.dispatches if d.family == "attention" and isinstance(d.pattern, Attention)]


# ---------------------------------------------------------------- the matcher


def test_stdlib_attention_is_one_dispatch() -> None:
    from codegen_support import std_module

    mod = std_module("std.attention")
    for name in ("attention", "causal_attention"):
        plan = make_plan(mod.semantic, mod.kernel_map[name])
        assert [d.family for d in plan.dispatches] == ["attention"]
        (d,) = plan.dispatches
        assert len(d.internal) == len(d.members) - 1 and plan.buffers[-1].role == "result"
        (pattern,) = attention_patterns(plan)
        assert pattern.group == pattern.batch[1] and str(pattern.group_size) == "floor(H/G)"
        assert bool(pattern.bounds) == (name == "causal_attention")


@pytest.mark.parametrize("name", ["causal_flash", "softcap_auto", "window_flash", "inlined", "bshd"])
def test_variants_are_recognised(name: str) -> None:
    (pattern,) = attention_patterns(plan_of(name))
    assert pattern.q.src == "q" and pattern.k.src == "k" and pattern.v.src == "v"
    if name == "window_flash":
        assert sorted(b.upper for b in pattern.bounds) == [False, True]
    if name == "bshd":
        assert not pattern.bounds and pattern.out_axes.index(QUERY) == 1  # a load at the key: no tile is skipped
    if name == "inlined":
        assert pattern.recip


@pytest.mark.parametrize("name", ["with_max", "v_by_feature"])
def test_variants_left_to_the_generic_path(name: str) -> None:
    assert not attention_patterns(plan_of(name))
    check(name, (1, 4, 2, 5, 9, 3))


def test_key_bound_of_the_causal_mask() -> None:
    (pattern,) = attention_patterns(plan_of("causal_flash"))
    (bound,) = pattern.bounds  # j <= i + T - S: keys below i + T - S + 1
    names = {x.name for x in ir.walk(bound.limit) if isinstance(x, ir.Idx)}
    assert bound.upper and names == {QUERY}


def test_inner_score_drops_only_the_bound_masks() -> None:
    """``Attention.inner``: the score inside every key bound is the score without its masks (a whole tile
    inside every row's bounds skips the mask test); a mask that is not only key bounds stays."""
    (causal,) = attention_patterns(plan_of("causal_flash"))
    (window,) = attention_patterns(plan_of("window_flash"))
    (softcap,) = attention_patterns(plan_of("softcap_flash"))
    (full,) = attention_patterns(plan_of("full_flash"))
    for pattern in (causal, window, softcap):
        assert pattern.inner is not None and not any(isinstance(x, ir.Select) for x in ir.walk(pattern.inner))
    assert isinstance(softcap.inner, ir.Binary) and softcap.inner.op == "mul"  # 5 * tanh(s / 5) stays
    assert full.inner is None and not full.bounds
    keep = text_module(f"""kernel gated{SIG}
{{
  let R = H / G
  s[b, h, i, j] = {SCORE}
  c[b, h, i, j] = s[b, h, i, j] if j <= i + T - S and s[b, h, i, j] > -3.0 else -inf
{TAIL}
}}""")
    (gated,) = attention_patterns(make_plan(keep.semantic, keep.kernel_map["gated"]))
    assert gated.bounds and gated.inner is None  # s > -3 is no key bound: every tile keeps the mask


@pytest.mark.parametrize("name", ["causal_flash", "window_flash", "softcap_split_kv", "causal_materialized"])
def test_inner_and_edge_tiles(name: str) -> None:
    """Tasks whose tiles lie inside every row's bounds (no mask test) and tiles on a bound's edge."""
    check(name, (1, 4, 2, 300, 300, 7))
    check(name, (1, 2, 1, 129, 257, 16))


# ---------------------------------------------------------------- every algorithm


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_causal_and_full_match_interpreter(algorithm: str, shape: tuple[int, ...]) -> None:
    check(f"causal_{algorithm}", shape)
    check(f"full_{algorithm}", shape)


@pytest.mark.parametrize("algorithm", ["split_kv", "materialized", "auto"])
def test_long_key_range(algorithm: str) -> None:
    check(f"causal_{algorithm}", LONG)  # sums of 4097 terms


ONE_ROW = [
    (1, 4, 4, 1, 600, 16),  # MHA decode: every task is one row (its scores read the keys in place)
    (2, 3, 3, 1, 4097, 5),  # ... over a long ragged key range
    (1, 1, 1, 65, 70, 17),  # a last row block of one row beside a full one
]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_one_row_tasks(algorithm: str) -> None:
    mod = module()
    name = f"causal_{algorithm}"
    compiled = build(mod, "llvm").kernels[name]
    for shape in ONE_ROW:
        args = random_inputs(mod.kernels[name], dims(shape), seeded(name, shape, "one row"))
        one = compiled(*args, threads=1)
        assert_conforms(one, mod.kernels[name], *args, what=f"{name} {shape}")
        assert same_bits(compiled(*args, threads=3), one), f"{name} {shape}: 3 threads differ from 1"
    check("qknorm", (1, 4, 4, 1, 33, 16))  # a computed query row, keys from the hoisted map
    check("full_flash", (1, 2, 2, 1, 9, 40))  # short tiles
    size = {"H": 3, "S": 1, "T": 70, "D": 21}  # 16-bit keys widened as they are read
    args = random_inputs(mod.kernels["narrow"], size, seeded("narrow", size))
    assert_conforms(build(mod, "llvm").kernels["narrow"](*args), mod.kernels["narrow"], *args, what=str(size))


def test_split_decision_sets_the_chunks() -> None:
    plan = plan_of("chunked")
    assert plan.decision("split", "j") is not None and attention_patterns(plan)[0].key_index == "j"
    for shape in [(1, 8, 2, 1, 600, 16), (1, 2, 1, 5, 5, 3), LONG]:
        check("chunked", shape)


@pytest.mark.parametrize("body", ["softcap", "window", "starved"])
@pytest.mark.parametrize("algorithm", ["flash", "materialized", "split_kv"])
def test_score_expressions_and_masks(body: str, algorithm: str) -> None:
    for shape in [(1, 4, 2, 9, 9, 5), (1, 2, 1, 70, 100, 3)]:
        check(f"{body}_{algorithm}", shape)


def test_starved_rows_are_nan_as_in_the_reference() -> None:
    mod = module()
    args = random_inputs(mod.kernels["starved_flash"], dims((1, 2, 1, 6, 6, 4)), seeded("starved"))
    got = torch.as_tensor(build(mod, "llvm").kernels["starved_flash"](*args))
    assert torch.isnan(got[:, :, :4]).all() and not torch.isnan(got[:, :, 4:]).any()


def test_layouts_bias_and_reciprocal() -> None:
    check("inlined", (2, 8, 2, 5, 33, 16))
    check("bshd", (2, 8, 2, 5, 33, 16))
    check("bshd", (1, 3, 1, 1, 17, 5))


def test_fused_prologues_on_queries_and_keys() -> None:
    # q rows are computed per task; a computed k is hoisted into a map of its own (arke.plan.prologue)
    # that the core reads directly, one row per KV group (the renderer's computed-k path: `narrow`)
    (norm,) = attention_patterns(plan_of("qknorm"))
    assert not norm.q_direct and norm.k_direct and norm.group is not None and norm.bounds
    (rot,) = attention_patterns(plan_of("rotated"))
    assert rot.q_direct and rot.k_direct
    assert all(isinstance(p.k, ir.Load) and p.k.src.startswith(PREFIX) for p in (norm, rot))
    mod = module()
    for shape in [(1, 8, 2, 5, 33, 16), (2, 4, 4, 70, 70, 5), (1, 4, 1, 1, 40, 3)]:
        check("qknorm", shape)
    for size in [{"H": 4, "G": 2, "S": 5, "T": 33, "D": 16}, {"H": 1, "G": 1, "S": 70, "T": 70, "D": 6}]:
        args = random_inputs(mod.kernels["rotated"], size, seeded("rotated", size))
        assert_conforms(build(mod, "llvm").kernels["rotated"](*args), mod.kernels["rotated"], *args, what=str(size))


def test_16_bit_queries_and_keys() -> None:
    (pattern,) = attention_patterns(plan_of("narrow"))
    assert not pattern.q_direct and not pattern.k_direct
    mod = module()
    for size in [{"H": 2, "S": 5, "T": 33, "D": 16}, {"H": 3, "S": 70, "T": 9, "D": 5}]:
        args = random_inputs(mod.kernels["narrow"], size, seeded("narrow", size))
        assert_conforms(build(mod, "llvm").kernels["narrow"](*args), mod.kernels["narrow"], *args, what=str(size))


def test_no_batch_axis_and_another_value_width() -> None:
    assert attention_patterns(plan_of("single"))
    mod = module()
    for shape in [{"S": 1, "T": 1, "D": 1, "F": 1}, {"S": 70, "T": 33, "D": 5, "F": 67},
                  {"S": 3, "T": 130, "D": 20, "F": 2}]:
        args = random_inputs(mod.kernels["single"], shape, seeded("single", shape))
        assert_conforms(build(mod, "llvm").kernels["single"](*args), mod.kernels["single"], *args, what=str(shape))


def test_out_of_range_head_is_an_error_not_a_wild_read() -> None:
    mod = module()
    kernel = build(mod, "llvm").kernels["pairs"]
    q, k, v = random_inputs(mod.kernels["pairs"], {"H": 5, "G": 2, "S": 3, "T": 7, "D": 4}, seeded("pairs"))
    with pytest.raises(GuardError):
        mod.kernels["pairs"](q, k, v)
    with pytest.raises(GuardError):
        kernel(q, k, v)
    q, k, v = random_inputs(mod.kernels["pairs"], {"H": 5, "G": 3, "S": 3, "T": 7, "D": 4}, seeded("pairs"))
    assert_conforms(kernel(q, k, v), mod.kernels["pairs"], q, k, v, what="pairs")  # a partial last group of heads


# ---------------------------------------------------------------- threads and vector widths


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_thread_count_gives_bit_identical_results(algorithm: str) -> None:
    mod = module()
    name = f"causal_{algorithm}"
    compiled = build(mod, "llvm").kernels[name]
    for shape in [(1, 8, 2, 13, 29, 16), (1, 8, 2, 1, 600, 16), (1, 4, 2, 70, 100, 3), (2, 8, 2, 40, 50, 8)]:
        args = random_inputs(mod.kernels[name], dims(shape), seeded(name, shape, "threads"))
        one = compiled(*args, threads=1)
        for n in (2, 3, 7):
            assert same_bits(compiled(*args, threads=n), one), f"{name} {shape}: {n} threads differ from 1"


@pytest.mark.parametrize("bits", [256, 128])
def test_narrower_vectors(bits: int) -> None:
    """AVX2- and SSE-width code (LLVM legalises it on any x86): transposes, exp, masks."""
    from arke.targets.llvm.jit import compile_object
    from arke.targets.llvm.kernel import CPUKernel

    mod = module()
    for name in ("causal_auto", "softcap_materialized"):
        plan = plan_of(name)
        artifact = LLVMRenderer(vector_bits=bits).render(plan)
        assert f"<{bits // 32} x float>" in artifact.source
        kernel = CPUKernel(plan, artifact, compile_object(artifact.source), mod.semantic, 2)
        for shape in [(1, 4, 2, 9, 40, 5), (1, 8, 2, 1, 70, 8), (1, 3, 3, 1, 70, 19)]:
            args = random_inputs(mod.kernels[name], dims(shape), seeded(name, shape, bits))
            assert_conforms(kernel(*args), mod.kernels[name], *args, what=f"{name} {shape} at {bits} bits")


def test_nan_and_inf_inputs_match_the_reference() -> None:
    """A NaN score poisons its row (its exp is NaN), whichever way the row max treats it."""
    mod = module()
    for name in ("causal_flash", "causal_materialized", "causal_split_kv"):
        q, k, v = (torch.as_tensor(a).clone() for a in random_inputs(mod.kernels[name], dims((1, 2, 1, 6, 9, 4)),
                                                                        seeded("nan", name)))
        q[0, 0, 1, 0] = float("nan")  # row 1 of head 0
        k[0, 0, 5, 2] = float("nan")  # key 5: rows that see it
        q[0, 1, 4, 3] = float("inf")  # +inf and -inf scores in head 1
        assert_conforms(build(mod, "llvm").kernels[name](q, k, v), mod.kernels[name], q, k, v, what=name)


def test_a_contraction_op_as_scores() -> None:
    """The scores may come as a ContractOp (a lowering that keeps matmuls apart) as well."""
    from dataclasses import replace

    from codegen_support import std_module, tolerance

    from arke.passes import run_passes
    from arke.runtime.interp import run_function
    from arke.targets.llvm.jit import compile_object, host_renderer
    from arke.targets.llvm.kernel import CPUKernel

    mod = std_module("std.attention")
    fn = run_passes(mod.semantic, mod.kernel_map["causal_attention"])
    first = fn.ops[0]
    assert isinstance(first, ir.ReduceOp) and isinstance(first.body, ir.Binary)
    assert isinstance(first.body.a, ir.Load) and isinstance(first.body.b, ir.Load)
    contract = ir.ContractOp(first.result, first.dtype, first.axes, first.reduce_axes, first.body.a, first.body.b)
    fn = replace(fn, ops=(contract, *fn.ops[1:]))
    semantic = ir.Module((fn,))
    plan = make_plan(semantic, fn.name)
    assert [d.family for d in plan.dispatches] == ["attention"]
    artifact = host_renderer().render(plan)
    kernel = CPUKernel(plan, artifact, compile_object(artifact.source), semantic, 2)
    q, k, v = (torch.as_tensor(a) for a in random_inputs(mod.kernels["causal_attention"], dims((1, 8, 2, 5, 33, 16)),
                                                          seeded("contract")))
    (want,) = run_function(fn, semantic, {"q": q, "k": k, "v": v})
    assert_matches(kernel(q, k, v), want, bound=tolerance(mod.kernels["causal_attention"], (q, k, v)),
                   what="contract scores")


HALF_IO = HALF_ATTENTION + """
kernel f16_values(q: f32[H, S, D], k: f32[H, T, D], v: f16[H, T, E]) -> f16[H, S, E] {
  s[h, i, j] = sum(q[h, i, d] * k[h, j, d] for d)
  mx[h, i] = max(s[h, i, j] for j)
  p[h, i, j] = exp(s[h, i, j] - mx[h, i])
  return f16(sum(p[h, i, j] * f32(v[h, j, e]) for j) / sum(p[h, i, j] for j))
}
"""


@pytest.mark.parametrize("algorithm", ["flash", "split_kv", "materialized", None])
@pytest.mark.parametrize(("name", "size"), [
    ("half_io", {"B": 1, "H": 4, "G": 2, "S": 5, "T": 37, "D": 24}),
    ("half_io", {"B": 2, "H": 8, "G": 2, "S": 1, "T": 700, "D": 64}),
    ("f16_values", {"H": 3, "S": 4, "T": 19, "D": 8, "E": 21}),
])
def test_16_bit_values_and_results(name: str, size: dict[str, int], algorithm: str | None) -> None:
    """bf16/f16 v is widened as it is read and the result rounded once from the f32 ``o / l``."""
    text = HALF_IO + (f"\n@strategy({name}) {{ algorithm = {algorithm} }}\n" if algorithm else "")
    mod = text_module(text)
    plan = make_plan(mod.semantic, mod.kernel_map[name], mod.strategies.for_kernel(mod.kernel_map[name], "llvm")[0]
                     if algorithm else None)
    (pattern,) = attention_patterns(plan)
    assert pattern.v.dtype.name in ("BF16", "F16") and pattern.out_dtype == pattern.v.dtype
    args = random_inputs(mod.kernels[name], size, seeded(name, size))
    # one rounding to 16 bits of an f32 that may differ in its last bits: one 16-bit ulp where it is near a boundary
    assert_conforms(build(mod, "llvm").kernels[name](*args), mod.kernels[name], *args, what=str(size))
