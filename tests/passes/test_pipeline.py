"""The pass pipeline on every kernel of the standard library and of examples/: valid IR, same results.

Each kernel runs on the interpreter before and after ``run_passes`` (verified after every
pass) on random ragged inputs, and must give bit-identical results (see passes_support for
why that holds). Op counts after the pipeline are pinned: they are what the partitioner
and the codegens see.
"""

from __future__ import annotations

import zlib

import pytest
from passes_support import ROOT, assert_same, count_ops, default_dims, load, optimise, own_kernels, program_paths

from arke.ir import semantic as S
from arke.ir.text import print_function
from arke.ir.verify import IRVerifyError
from arke.lang.checker import stdlib_path
from arke.passes import PIPELINE, inline_all, inline_calls, run_passes

#: Dims per kernel where its `where` clauses or its cost need chosen values (others draw from 1, 3, 17).
DIMS: dict[str, list[dict[str, int]]] = {
    "attention": [dict(B=1, H=1, G=1, S=1, T=1, D=1), dict(B=2, H=4, G=2, S=3, T=17, D=5),
                  dict(B=1, H=3, G=1, S=17, T=17, D=3), dict(B=1, H=2, G=2, S=1, T=33, D=4)],
    "rope": [dict(T=1, H=1, D=2), dict(T=3, H=2, D=6), dict(T=17, H=1, D=34)],
    "bmm": [dict(B=1, M=1, K=1, N=1), dict(B=3, M=17, K=3, N=1), dict(B=2, M=3, K=17, N=17)],
}
DIMS["route_top2"] = [dict(T=1, E=2), dict(T=17, E=8)]  # E >= 2
DIMS["causal_attention"] = DIMS["attention"]
DIMS["rope_interleaved"] = DIMS["rope"]
# std.decoder: the fused QKV matrix has (H + 2 G) E rows, E = 2 R
for _name in ("attn_in__W_f32", "attn_in__W_bf16", "attn_in__W_f16", "attn_in_q__Q_i8", "attn_in_q__Q_u8", "heads"):
    DIMS[_name] = [dict(N=1, D=1, H=1, G=1, E=2, R=1, C=6), dict(N=3, D=17, H=4, G=2, E=8, R=4, C=64)]
for _name in ("attn_cached", "attn_window"):
    DIMS[_name] = [dict(B=1, T=1, H=1, G=1, M=1, E=1), dict(B=2, T=3, H=4, G=2, M=17, E=5)]
for _a in ("bf16", "f16"):
    DIMS[f"attn_in_h__A_{_a}"] = DIMS["heads"]
    DIMS[f"attn_cached_h__A_{_a}"] = DIMS[f"attn_window_h__A_{_a}"] = DIMS["attn_cached"]

# paged attention (rows of S sequences over NB blocks of P slots), GPT-2's fused QKV (C = 3 H E), sampling
PAGED = [dict(N=1, H=1, G=1, E=1, NB=1, P=1, S=1, MB=1), dict(N=5, H=4, G=2, E=3, NB=9, P=3, S=2, MB=4)]
DIMS["attn_paged"] = DIMS["attn_paged_window"] = PAGED
for _w in ("f32", "bf16", "f16"):
    DIMS[f"ln_qkv__W_{_w}"] = [dict(N=1, D=1, H=1, E=1, C=3), dict(N=3, D=17, H=2, E=3, C=18)]
DIMS["candidates"] = [dict(B=1, V=64), dict(B=3, V=70)]
# std.deepseek: R = 2 R2 rope dims
DIMS["rope_pairs"] = [dict(N=1, H=1, R=2, R2=1), dict(N=3, H=2, R=8, R2=4)]
for _w in ("f32", "bf16"):
    for _k in ("mla_heads", "mla_in", "mla_in_lora"):
        DIMS[f"{_k}__W_{_w}"] = [dict(N=1, D=1, H=1, P=1, R=2, R2=1, C=1, L=1),
                                 dict(N=3, D=17, H=2, P=5, R=4, R2=2, C=9, L=7)]
    DIMS[f"mla_paged__W_{_w}"] = [dict(N=1, H=1, C=1, R=1, NB=1, G=1, P=1, V=1, S=1, MB=1),
                                  dict(N=5, H=2, C=9, R=4, NB=9, G=1, P=3, V=5, S=2, MB=4)]
DIMS["candidates_k"] = [dict(B=1, V=1, K=1), dict(B=3, V=17, K=5)]
#: integer parameters' bounds where the defaults (passes_support) do not fit the kernel
RANGES: dict[str, dict[str, object]] = {
    "attn_paged": {"blk": "NB", "seq": "S", "pos": lambda d: d["MB"] * d["P"]},
    "embed_panels": {"ids": lambda d: d["P"] * d["R"]},
    "embed_pos_panels": {"ids": lambda d: d["P"] * d["R"], "pos": "S"},
    **{f"embed_pos__W_{w}": {"pos": "S"} for w in ("f32", "bf16", "f16")},
}
RANGES["attn_paged_window"] = RANGES["attn_paged"]
RANGES["pick"] = {"ids": 1000}  # token ids: any integers
for _w in ("f32", "bf16"):
    RANGES[f"mla_paged__W_{_w}"] = RANGES["attn_paged"]

#: (ops after inlining, ops after the whole pipeline) of each kernel of std.* and examples/.
OP_COUNTS: dict[str, tuple[int, int]] = {
    "relu": (1, 1), "gelu": (1, 1), "gelu_tanh": (1, 1), "silu": (1, 1), "sigmoid": (1, 1), "tanh": (1, 1),
    "add": (1, 1), "mul": (1, 1), "matmul": (1, 1), "bmm": (1, 1), "linear": (1, 1), "embedding": (1, 1),
    "rope": (1, 1), "rope_interleaved": (1, 1),
    "softmax": (4, 3), "logsumexp": (3, 3), "log_softmax": (4, 3), "layernorm": (5, 4), "rmsnorm": (3, 2),
    "linear_bias": (2, 2), "linear_int8": (2, 2), "linear_bf16": (2, 2), "quantize_rows": (4, 3), "linear_w8a8": (2, 2),
    "swiglu": (3, 3), "geglu": (3, 3),
    "cross_entropy": (4, 3), "greedy": (1, 2), "route_top2": (2, 10),
    "cross_entropy_mean": (6, 4), "attention": (7, 6), "causal_attention": (8, 6), "topk_routing": (6, 5),
    "heads": (7, 5), "attn_cached": (8, 6), "attn_window": (8, 6), "moe_route": (10, 8), "moe_combine": (2, 2),
    # std.decoder's generic kernels (spec §5.6), per specialisation: f32 weights stay contractions (packed
    # panels); bf16 and f16 read and widen; the quantised ones scale each output channel
    "attn_in__W_f32": (11, 10), "attn_in__W_bf16": (11, 7), "attn_in__W_f16": (11, 7),
    "attn_in_q__Q_i8": (12, 8), "attn_in_q__Q_u8": (12, 8),
    "attn_out__W_f32": (2, 2), "attn_out__W_bf16": (2, 2), "attn_out__W_f16": (2, 2),
    "attn_out_q__Q_i8": (2, 2), "attn_out_q__Q_u8": (2, 2),
    "mlp__W_f32": (8, 7), "mlp__W_bf16": (8, 6), "mlp__W_f16": (8, 6), "mlp_q__Q_i8": (10, 6), "mlp_q__Q_u8": (10, 6),
    "expert__W_f32": (5, 5), "expert__W_bf16": (5, 4), "expert__W_f16": (5, 4),
    "expert_q__Q_i8": (7, 4), "expert_q__Q_u8": (7, 4),
    # the half-activation layer's kernels (every rounding to A is an op of its own until fused; SwiGLU's
    # gate stays its own sum's epilogue, stored in A, while the up projection's takes the product)
    **{f"{k}__A_{a}": v for a in ("bf16", "f16") for k, v in (
        ("norm_h", (3, 2)), ("attn_in_h", (8, 6)), ("attn_cached_h", (8, 6)), ("attn_window_h", (8, 6)),
        ("proj_add_h", (2, 2)), ("swiglu_h", (5, 4)))},
    "attn_paged": (7, 6), "attn_paged_window": (8, 6),
    # std.lm: a literal top-64 is lowered to its 64 rounds (each a max and its position over the row)
    "embed_panels": (1, 1), "penalized": (2, 1), "candidates": (4, 259), "candidates_k": (4, 5), "pick": (9, 9),
    "sample_all": (7, 6),  # the penalised row, its maximum, exp, cumsum, total, the first past u · total
    **{f"{k}__W_{w}": v for w in ("f32", "bf16", "f16") for k, v in (
        ("embed", (1, 1)), ("head", (4, 3 if w == "f32" else 2)), ("head_ln", (6, 5 if w == "f32" else 4)),
        ("embed_pos", (1, 1)), ("ln_qkv", (9, 8 if w == "f32" else 7)), ("out_bias", (2, 2)),
        ("ln_gelu_mlp", (10, 8 if w == "f32" else 6)))},
    "embed_pos_panels": (1, 1),
    # std.deepseek: the latent attention's projections (f32 weights stay contractions), MoE scores, shared experts
    "rope_pairs": (3, 1), "moe_scores": (8, 7),
    **{f"{k}__W_{w}": (v[0], v[1] - (w != "f32") * v[2]) for w in ("f32", "bf16") for k, v in (
        ("mla_heads", (14, 8, 1)), ("mla_in", (19, 12, 1)), ("mla_in_lora", (23, 15, 1)), ("mla_attn", (10, 9, 0)),
        ("mla_paged", (9, 8, 1)),
        ("shared_add", (5, 5, 1)))},
}
#: Where an example kernel differs from the std one of the same name (examples/attention.ak is causal).
EXAMPLE_OP_COUNTS: dict[str, tuple[int, int]] = {"attention": (8, 6), "mm": (1, 1)}

NN = str(stdlib_path("std.nn"))
EXAMPLE = str(ROOT / "examples" / "rmsnorm.ak")  # rmsnorm and softmax
KERNELS = [pk for path in program_paths() for pk in own_kernels(path)]


def _id(pk: tuple[str, str]) -> str:
    return f"{'/'.join(pk[0].rsplit('/', 2)[-2:])}:{pk[1]}"


@pytest.mark.parametrize("path,name", KERNELS, ids=[_id(pk) for pk in KERNELS])
def test_same_results(path: str, name: str) -> None:
    module = load(path).semantic
    fn = optimise(module, name)
    seed = zlib.crc32(f"{path}:{name}".encode())
    for k, dims in enumerate(DIMS.get(name) or default_dims(module.get(name), seed)):
        assert_same(module, name, fn, dims, seed + k, ranges=RANGES.get(name))


@pytest.mark.parametrize("path,name", KERNELS, ids=[_id(pk) for pk in KERNELS])
def test_op_counts(path: str, name: str) -> None:
    module = load(path).semantic
    inlined, final = count_ops(inline_calls(module, name)), count_ops(optimise(module, name))
    table = EXAMPLE_OP_COUNTS if "/examples/" in path else {}
    want = table[name] if name in table else OP_COUNTS[name]
    assert (inlined, final) == want, print_function(optimise(module, name))


@pytest.mark.parametrize("path,name", KERNELS, ids=[_id(pk) for pk in KERNELS])
def test_contracts_keep_plain_loads(path: str, name: str) -> None:
    """Contract operands are loads of parameters or of stored values, never a folded expression."""
    fn = optimise(load(path).semantic, name)
    params = {p.name for p in fn.params}
    defined = {op.result for op in fn.ops if not isinstance(op, S.CallOp)}
    for op in fn.ops:
        if isinstance(op, S.ContractOp):
            for side in (op.lhs, op.rhs):
                assert isinstance(side, S.Load) and side.src in params | defined


def test_rmsnorm_fuses_to_fewer_ops() -> None:
    fn = optimise(load(EXAMPLE).semantic, "rmsnorm")  # examples/rmsnorm.ak
    assert [type(op) for op in fn.ops] == [S.ReduceOp, S.MapOp]
    assert "rsqrt" in print_function(fn).splitlines()[-3]  # inv folded into the output map


def test_softmax_exp_folds_into_both_consumers() -> None:
    fn = optimise(load(EXAMPLE).semantic, "softmax")
    mx, total, out = fn.ops
    assert isinstance(mx, S.ReduceOp) and mx.kind == "max"
    assert isinstance(total, S.ReduceOp) and total.kind == "sum" and isinstance(total.body, S.Unary)
    assert total.body.op == "exp"
    assert isinstance(out, S.MapOp) and isinstance(out.body, S.Binary) and out.body.op == "div"
    assert isinstance(out.body.a, S.Unary) and out.body.a.op == "exp"
    assert not any(isinstance(op, S.MapOp) and op.name == "e" for op in fn.ops)


def test_contract_epilogue_left_for_the_codegen() -> None:
    fn = optimise(load(NN).semantic, "linear_bias")
    contract, epilogue = fn.ops
    assert isinstance(contract, S.ContractOp) and isinstance(epilogue, S.MapOp)
    assert print_function(fn).count("%0[m, n]") == 1


def test_inline_all_and_standalone_kernels() -> None:
    for path in program_paths():
        module = load(path).semantic
        inlined = inline_all(module)
        assert [f.name for f in inlined.functions] == [f.name for f in module.functions]
        assert not any(isinstance(op, S.CallOp) for f in inlined.functions for op in f.ops)


def test_trace_and_debug_switch(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    module = load(EXAMPLE).semantic
    seen: list[tuple[str, int]] = []
    run_passes(module, "softmax", trace=lambda step, fn: seen.append((step, len(fn.ops))))
    assert seen == [("inline", 4), ("unroll", 4), ("fuse", 3), ("argreduce", 3), ("topk", 3), ("dce", 3)]
    assert [step for step, _ in PIPELINE] == ["inline", "unroll", "fuse", "argreduce", "topk", "dce"]
    monkeypatch.setenv("ARKE_DEBUG_PASSES", "1")
    run_passes(module, "softmax")
    err = capsys.readouterr().err
    assert err.count("# ---- after ") == len(PIPELINE) and "kernel @softmax" in err
    monkeypatch.setenv("ARKE_DEBUG_PASSES", "0")
    run_passes(module, "softmax")
    assert capsys.readouterr().err == ""


def test_verify_each_names_the_broken_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    def breaks(fn: S.Function, module: S.Module) -> S.Function:
        return S.Function(fn.name, fn.params, fn.bindings, fn.guards, fn.ops, ("99",), fn.result_types)

    monkeypatch.setattr("arke.passes.PIPELINE", (*PIPELINE, ("broken", breaks)))
    module = load(EXAMPLE).semantic
    run_passes(module, "softmax")  # unchecked: no error
    with pytest.raises(IRVerifyError, match="after pass `broken`"):
        run_passes(module, "softmax", verify_each=True)
