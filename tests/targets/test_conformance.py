"""Conformance: every kernel of the standard library, built for every runnable target, gives
the reference interpreter's answer on the same random inputs.

Shapes are sampled, not exhausted: each kernel runs on a degenerate shape (every dim 1), ragged
ones (3, 17, 33: no power of two, no multiple of a vector width) and, where it is cheap, one
with 4097 columns (a vector-width tail after many full vectors). Attention covers grouped
queries (H / G = 4), MQA, causal with T > S and decode (S = 1). Ids (embedding, cross-entropy
targets) are in range; out-of-range ids are tests/targets/llvm/test_cpu.py's business.

A new stdlib kernel without a case here fails ``test_every_stdlib_kernel_has_cases``; a new
target file in ``arke/codegen`` is picked up automatically (it is skipped, with the reason,
until ``arke.library`` can run it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from codegen_support import (
    RUNNABLE,
    STDLIB,
    TARGETS,
    assert_conforms,
    assert_matches,
    build,
    dims_id,
    random_inputs,
    seeded,
    std_module,
)


@dataclass(frozen=True)
class Case:
    """One stdlib kernel on one shape."""

    module: str
    kernel: str
    dims: dict[str, int]
    scalars: dict[str, Any] = field(default_factory=dict)
    ids: dict[str, str | int] = field(default_factory=dict)  # int tensor -> exclusive bound (dim name or number)
    ties: bool = False
    dtypes: dict[str, str] = field(default_factory=dict)  # a generic kernel's dtype variables (spec §5.6)

    @property
    def member(self) -> str:
        """The kernel's name, or for a generic kernel its specialisation's IR name (``attn_in__W_bf16``; a std
        module loaded from its file has unqualified IR names)."""
        return self.kernel + "".join(f"__{k}_{v}" for k, v in self.dtypes.items())

    @property
    def id(self) -> str:
        extra = [f"{k}={v}" for k, v in self.scalars.items()] + (["ties"] if self.ties else [])
        return "-".join([self.kernel, *(f"{k}={v}" for k, v in self.dtypes.items()), dims_id(self.dims), *extra])


def cases(module: str, kernels: str, shapes: list[dict[str, int]], **options: Any) -> list[Case]:
    return [Case(module, k, dict(s), **options) for k in kernels.split() for s in shapes]


def generic_cases(module: str, kernels: str, var: str, dtypes: str, shapes: list[dict[str, int]],
                  **options: Any) -> list[Case]:
    """:func:`cases` for generic kernels, once per dtype of ``var`` (the call binds it from the arguments)."""
    return [c for d in dtypes.split() for c in cases(module, kernels, shapes, dtypes={var: d}, **options)]


NN, ATTN, MOE, DEC, LM, GPT2 = "std.nn", "std.attention", "std.moe", "std.decoder", "std.lm", "std.gpt2"
DS = "std.deepseek"
#: DeepSeek-V2's latent attention: H heads of P no-rope and R rope dims (R = 2 R2), a latent of C, a query rank L
MLA = [{"N": 1, "D": 1, "H": 1, "P": 1, "R": 2, "R2": 1, "C": 1, "L": 1},
       {"N": 3, "D": 17, "H": 2, "P": 5, "R": 4, "R2": 2, "C": 9, "L": 7}]
#: paged attention: rows of S sequences over NB blocks of P slots, MB blocks per sequence (N, H, G, E)
PAGED = [{"N": 1, "H": 1, "G": 1, "E": 1, "NB": 1, "P": 1, "S": 1, "MB": 1},
         {"N": 7, "H": 8, "G": 2, "E": 16, "NB": 12, "P": 4, "S": 3, "MB": 4},  # prefill and decode rows
         {"N": 3, "H": 4, "G": 1, "E": 8, "NB": 20, "P": 16, "S": 3, "MB": 5},  # decode, 80 slots each
         # blocks that straddle the 64-key tiles (the slot and block carried from key to key)
         {"N": 4, "H": 2, "G": 2, "E": 8, "NB": 70, "P": 5, "S": 2, "MB": 30}]
HEADS = [{"N": 1, "D": 1, "H": 1, "G": 1, "E": 2, "R": 1, "C": 6},
         {"N": 3, "D": 17, "H": 4, "G": 2, "E": 8, "R": 4, "C": 64}]
ROWS = [{"M": 1, "N": 1}, {"M": 3, "N": 17}, {"M": 33, "N": 33}]
# A row of 4097: the codegen reduces in one sequence, the interpreter with torch's vectorised
# sums (the tolerance grows with the number of terms: codegen_support.tolerance).
LONG_ROW = {"M": 2, "N": 4097}
MATMUL = [{"M": 1, "K": 1, "N": 1}, {"M": 3, "K": 17, "N": 33}, {"M": 33, "K": 3, "N": 17}]
# K = 4097: sums of 4097 products of size ~1 (|result| ~ 64); see LONG_ROW.
LONG_K = {"M": 2, "K": 4097, "N": 3}

ELEMENTWISE = "relu gelu gelu_tanh silu sigmoid tanh"
ROW_REDUCING = "softmax logsumexp log_softmax layernorm rmsnorm"

CASES: list[Case] = [
    *cases(NN, ELEMENTWISE, [*ROWS, {"M": 5, "N": 4097}]),
    *cases(NN, "add mul", [*ROWS, {"M": 3, "N": 4097}]),
    *cases(NN, ROW_REDUCING, ROWS),
    *cases(NN, ROW_REDUCING, [LONG_ROW]),
    *cases(NN, "softmax logsumexp", [{"M": 5, "N": 33}], ties=True),  # tied row maxima
    Case(NN, "layernorm", {"M": 3, "N": 17}, scalars={"eps": 0.5}),
    Case(NN, "rmsnorm", {"M": 3, "N": 17}, scalars={"eps": 0.25}),
    *cases(NN, "matmul linear", MATMUL),
    *cases(NN, "matmul linear", [LONG_K]),
    Case(NN, "linear", {"M": 1, "K": 129, "N": 33}),  # decode: one row
    *cases(NN, "linear_bias linear_int8", MATMUL),
    *cases(NN, "linear_bf16", MATMUL),
    *cases(NN, "linear_w8a8", MATMUL),
    *cases(NN, "quantize_rows", [{"M": 1, "K": 1}, {"M": 3, "K": 67}, {"M": 5, "K": 4097}]),
    Case(NN, "linear_int8", {"M": 1, "K": 129, "N": 33}),  # int8 weights up to 100: sums cancel
    *cases(NN, "bmm", [{"B": 1, "M": 1, "K": 1, "N": 1}, {"B": 3, "M": 5, "K": 17, "N": 33}]),
    *cases(NN, "swiglu geglu", [{"T": 1, "D": 1, "F": 1}, {"T": 3, "D": 17, "F": 33}, {"T": 17, "D": 33, "F": 5}]),
    *cases(NN, "embedding", [{"T": 1, "V": 1, "D": 1}, {"T": 17, "V": 33, "D": 5}, {"T": 3, "V": 5, "D": 4097}],
           ids={"ids": "V"}),
    *cases(NN, "cross_entropy cross_entropy_mean", [{"M": 1, "V": 1}, {"M": 17, "V": 33}], ids={"target": "V"}),
    *cases(NN, "cross_entropy cross_entropy_mean", [{"M": 3, "V": 4097}], ids={"target": "V"}),
    *cases(NN, "greedy", [{"M": 1, "V": 1}, {"M": 17, "V": 33}, {"M": 3, "V": 4097}]),
    *cases(NN, "greedy", [{"M": 5, "V": 33}, {"M": 3, "V": 4097}], ties=True),  # tied maxima: the first wins
    *cases(NN, "route_top2", [{"T": 3, "E": 2}, {"T": 17, "E": 8}]),
    *cases(NN, "route_top2", [{"T": 17, "E": 8}], ties=True),  # tied logits: the lower expert first
    # (B, H, G, S, T, D)
    *cases(ATTN, "attention causal_attention", [
        {"B": 1, "H": 1, "G": 1, "S": 1, "T": 1, "D": 1},
        {"B": 2, "H": 8, "G": 2, "S": 5, "T": 33, "D": 16},  # GQA, H / G = 4, T > S
        {"B": 1, "H": 4, "G": 1, "S": 17, "T": 17, "D": 8},  # MQA, square
        {"B": 1, "H": 8, "G": 2, "S": 1, "T": 33, "D": 8},  # decode
    ]),
    Case(ATTN, "attention", {"B": 1, "H": 3, "G": 3, "S": 17, "T": 3, "D": 5}),  # S > T: only the plain kernel
    *cases(ATTN, "rope rope_interleaved", [{"T": 1, "H": 1, "D": 2}, {"T": 17, "H": 3, "D": 8},
                                           {"T": 5, "H": 2, "D": 64}], ids={"pos": 64}),
    *cases(ATTN, "rope rope_interleaved", [{"T": 3, "H": 2, "D": 16}], ids={"pos": 64}, scalars={"theta": 500000.0}),
    *cases(MOE, "topk_routing", [{"T": 1, "E": 1}, {"T": 17, "E": 8}, {"T": 3, "E": 33}]),
    Case(MOE, "topk_routing", {"T": 5, "E": 8}, scalars={"k": 1}),
    Case(MOE, "topk_routing", {"T": 5, "E": 8}, scalars={"k": 8}),
    Case(MOE, "topk_routing", {"T": 17, "E": 8}, ties=True),  # ties go to the lower expert
    # decoder layers: QKV heads with GQA (H / G = 2), a ragged hidden size, one-token decode
    *cases(DEC, "heads", HEADS, ids={"pos": 300}),
    *generic_cases(DEC, "attn_in", "W", "f32 bf16 f16", HEADS, ids={"pos": 300}),
    *generic_cases(DEC, "attn_in_q", "Q", "i8 u8", HEADS, ids={"pos": 300}),
    *cases(DEC, "attn_cached", [{"B": 1, "T": 1, "H": 1, "G": 1, "M": 1, "E": 1}], scalars={"n": 1}),
    *cases(DEC, "attn_cached", [{"B": 2, "T": 5, "H": 8, "G": 2, "M": 33, "E": 16}], scalars={"n": 20}),
    *cases(DEC, "attn_cached", [{"B": 1, "T": 1, "H": 4, "G": 1, "M": 70, "E": 8}], scalars={"n": 70}),  # decode
    *cases(DEC, "attn_window", [{"B": 1, "T": 6, "H": 4, "G": 2, "M": 40, "E": 8}],
           scalars={"n": 30, "window": 7}),
    *[Case(DEC, "attn_paged", d, ids={"blk": "NB", "seq": "S", "pos": d["MB"] * d["P"]}) for d in PAGED],
    *[Case(DEC, "attn_paged_window", d, ids={"blk": "NB", "seq": "S", "pos": d["MB"] * d["P"]},
           scalars={"window": 5}) for d in PAGED[1:]],
    *generic_cases(DEC, "attn_out", "W", "f32 bf16 f16", [{"N": 1, "C": 1, "D": 1}, {"N": 3, "C": 33, "D": 17}]),
    *generic_cases(DEC, "attn_out_q", "Q", "i8 u8", [{"N": 1, "C": 1, "D": 1}, {"N": 3, "C": 33, "D": 17}]),
    *generic_cases(DEC, "mlp", "W", "f32 bf16 f16", [{"N": 1, "D": 1, "F": 1}, {"N": 3, "D": 17, "F": 33}]),
    *generic_cases(DEC, "mlp_q", "Q", "i8 u8", [{"N": 1, "D": 1, "F": 1}, {"N": 3, "D": 17, "F": 33}]),
    *cases(DEC, "moe_route", [{"N": 1, "D": 1, "E": 1}, {"N": 5, "D": 17, "E": 8}]),
    *generic_cases(DEC, "expert", "W", "f32 bf16 f16", [{"N": 7, "D": 17, "M": 5, "F": 33}], ids={"rows": "N"}),
    *generic_cases(DEC, "expert_q", "Q", "i8 u8", [{"N": 7, "D": 17, "M": 5, "F": 33}], ids={"rows": "N"}),
    *cases(DEC, "moe_combine", [{"N": 5, "M": 10, "D": 17, "K": 2}], ids={"slot": "M"}),
    # the ends of a causal LM and the sampling steps
    *generic_cases(LM, "embed", "W", "f32 bf16", [{"N": 1, "V": 1, "D": 1}, {"N": 17, "V": 33, "D": 5}],
                   ids={"ids": "V"}),
    Case(LM, "embed_panels", {"N": 1, "P": 1, "D": 1, "R": 1}, ids={"ids": 1}),
    Case(LM, "embed_panels", {"N": 9, "P": 3, "D": 17, "R": 8}, ids={"ids": 24}),
    *generic_cases(LM, "head", "W", "f32 bf16", [{"N": 1, "D": 1, "V": 1}, {"N": 3, "D": 17, "V": 70}]),
    *generic_cases(LM, "head_ln", "W", "f32", [{"N": 1, "D": 1, "V": 1}, {"N": 3, "D": 17, "V": 70}]),
    *cases(LM, "penalized", [{"B": 1, "V": 1}, {"B": 3, "V": 33}], scalars={"penalty": 1.3}),
    Case(LM, "candidates", {"B": 1, "V": 64}),
    Case(LM, "candidates", {"B": 3, "V": 70}, ties=True),  # tied logits: the lower id first
    *cases(LM, "candidates_k", [{"B": 1, "V": 1, "K": 1}, {"B": 3, "V": 17, "K": 5}]),
    *cases(LM, "pick", [{"B": 1, "K": 1}, {"B": 5, "K": 64}], ids={"ids": 1000}),
    Case(LM, "pick", {"B": 5, "K": 64}, ids={"ids": 1000}, scalars={"temperature": 0.7, "top_k": 10, "top_p": 0.8}),
    *cases(LM, "sample_all", [{"B": 1, "V": 1}, {"B": 3, "V": 4097}], scalars={"penalty": 1.3, "temperature": 0.7}),
    # GPT-2's block and embeddings
    *generic_cases(GPT2, "embed_pos", "W", "f32 bf16", [{"N": 1, "V": 1, "S": 1, "D": 1},
                                                         {"N": 9, "V": 33, "S": 17, "D": 5}],
                   ids={"ids": "V", "pos": "S"}),
    Case(GPT2, "embed_pos_panels", {"N": 9, "P": 3, "D": 17, "R": 8, "S": 5}, ids={"ids": 24, "pos": "S"}),
    *generic_cases(GPT2, "ln_qkv", "W", "f32 bf16", [{"N": 1, "D": 1, "H": 1, "E": 1, "C": 3},
                                                      {"N": 3, "D": 17, "H": 4, "E": 8, "C": 96}]),
    *generic_cases(GPT2, "out_bias", "W", "f32", [{"N": 1, "C": 1, "D": 1}, {"N": 3, "C": 33, "D": 17}]),
    *generic_cases(GPT2, "ln_gelu_mlp", "W", "f32 bf16", [{"N": 1, "D": 1, "F": 1}, {"N": 3, "D": 17, "F": 33}]),
    # DeepSeek-V2's layer: latent attention (up-projections absorbed), shared experts
    *cases(DS, "rope_pairs", [{"N": 1, "H": 1, "R": 2, "R2": 1}, {"N": 3, "H": 2, "R": 8, "R2": 4}], ids={"pos": 300}),
    *generic_cases(DS, "mla_heads mla_in mla_in_lora", "W", "f32", MLA, ids={"pos": 300}),
    *generic_cases(DS, "mla_attn", "W", "f32", [{"B": 1, "T": 1, "H": 1, "C": 1, "R": 1, "M": 1, "V": 1}],
                   scalars={"n": 1, "sm": 0.5}),
    *generic_cases(DS, "mla_attn", "W", "f32", [{"B": 2, "T": 3, "H": 2, "C": 9, "R": 4, "M": 17, "V": 5}],
                   scalars={"n": 10, "sm": 0.3}),
    *[Case(DS, "mla_paged", d, ids={"blk": "NB", "seq": "S", "pos": d["MB"] * d["P"]}, scalars={"sm": 0.4},
           dtypes={"W": "f32"})
      for d in ({"N": 1, "H": 1, "C": 1, "R": 1, "NB": 1, "G": 1, "P": 1, "V": 1, "S": 1, "MB": 1},
                {"N": 7, "H": 2, "C": 9, "R": 4, "NB": 12, "G": 1, "P": 4, "V": 5, "S": 3, "MB": 4})],
    *cases(DS, "moe_scores", [{"N": 1, "D": 1, "E": 1}, {"N": 5, "D": 17, "E": 8}]),
    *generic_cases(DS, "shared_add", "W", "f32", [{"N": 1, "D": 1, "F": 1}, {"N": 3, "D": 17, "F": 33}]),
    # half-precision activations (bf16 throughout, f16 where the kernel rounds differently per dtype);
    # N = 37 rows of 70: a prefill whose projections run on a bf16 matrix unit where the host has one
    *generic_cases(DEC, "norm_h", "A", "bf16 f16", [{"N": 1, "D": 1}, {"N": 3, "D": 4097}]),
    *generic_cases(DEC, "attn_in_h", "A", "bf16", [*HEADS, {"N": 37, "D": 70, "H": 4, "G": 2, "E": 8, "R": 4,
                                                           "C": 64}], ids={"pos": 300}),
    *generic_cases(DEC, "attn_in_h", "A", "f16", HEADS[1:], ids={"pos": 300}),
    *generic_cases(DEC, "attn_cached_h", "A", "bf16", [{"B": 2, "T": 5, "H": 8, "G": 2, "M": 33, "E": 16}],
                   scalars={"n": 20}),
    *generic_cases(DEC, "attn_cached_h", "A", "bf16", [{"B": 1, "T": 1, "H": 4, "G": 1, "M": 70, "E": 8}],
                   scalars={"n": 70}),
    *generic_cases(DEC, "attn_window_h", "A", "f16", [{"B": 1, "T": 6, "H": 4, "G": 2, "M": 40, "E": 8}],
                   scalars={"n": 30, "window": 7}),
    *generic_cases(DEC, "proj_add_h", "A", "bf16 f16", [{"N": 3, "C": 33, "D": 17}, {"N": 37, "C": 70, "D": 40}]),
    *generic_cases(DEC, "swiglu_h", "A", "bf16", [{"N": 1, "D": 1, "F": 1}, {"N": 37, "D": 70, "F": 40}]),
    *generic_cases(DEC, "swiglu_h", "A", "f16", [{"N": 3, "D": 17, "F": 33}]),
]


def targets() -> list[Any]:
    """Every registered target; those the runtime cannot run yet are skipped with the reason."""
    return [t if t in RUNNABLE else pytest.param(t, marks=pytest.mark.skip(reason=f"{t} cannot run here yet"))
            for t in TARGETS]


def test_every_stdlib_kernel_has_cases() -> None:
    have = {(c.module, c.kernel) for c in CASES}
    missing = [f"{m}.{k}" for m in STDLIB for k in std_module(m).names if (m, k) not in have]
    assert not missing, f"stdlib kernels without a conformance case: {missing}"


def test_some_target_runs_here() -> None:
    assert RUNNABLE, f"no registered target ({TARGETS}) can run on this machine"


def check_case(case: Case, run: Callable[..., Any], what: str, reassociates: bool = False) -> None:
    """``run(module, *args, **scalars)`` (a compiled ``case.kernel``) on the case's random inputs equals
    the interpreter within :func:`codegen_support.tolerance`, the one rule for every target and
    machine. ``reassociates`` (the target may reorder float sums) changes nothing any more: the
    rule allows every order; it stays for the callers that say so."""
    module = std_module(case.module)
    reference = module.kernels[case.kernel]
    if case.dtypes:  # the reference is the specialisation; the compiled kernel is called generic (it binds them)
        reference = reference.specialise(**case.dtypes)
    args = random_inputs(reference, case.dims, seeded(case.id), ids=case.ids, ties=case.ties)
    assert_conforms(run(module, *args, **case.scalars), reference, *args, what=f"{what} {case.id}", **case.scalars)


#: (kernel, target) -> why a case is not run there (each target's conformance still covers the kernel's form)
NOT_HERE = {
    ("attn_paged", "mlir"): "iree-compile spends ~90 s on each paged kernel; attn_paged_window (the same kernel with "
                            "a window) is the mlir case",
    ("mla_paged", "mlir"): "iree-compile spends ~90 s on each paged kernel (attn_paged_window is the mlir case of "
                           "reading through a block table)",
}
#: (kernel, target) -> the error the target reports for it instead of running it
REFUSED = {
    ("candidates", "mlir"): "push constants",  # IREE's CPU runtime caps a dispatch's; a top-64 needs more
}


@pytest.mark.parametrize("target", targets())
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_stdlib_kernel_matches_interpreter(case: Case, target: str) -> None:
    from arke.targets.triton.kernel import interpreting

    if (case.kernel, target) in NOT_HERE:
        pytest.skip(NOT_HERE[case.kernel, target])
    if case.kernel == "candidates" and target == "triton" and interpreting():
        pytest.skip("Triton's interpreter runs a top-64 as 64 interpreted passes over the row (minutes); "
                    "candidates_k covers the same selection with a small K")
    if (case.kernel, target) in REFUSED:
        from arke.targets.mlir.kernel import IREEError

        with pytest.raises(IREEError, match=REFUSED[case.kernel, target]):
            check_case(case, lambda module, *args, **scalars: build(module, target).kernels[case.kernel](
                *args, **scalars), target)
        return
    check_case(case, lambda module, *args, **scalars: build(module, target).kernels[case.kernel](*args, **scalars),
               target)


@pytest.mark.parametrize("target", targets())
def test_scalars_by_position_and_by_default(target: str) -> None:
    """A scalar given by position equals the same value by name; left out, it takes its default."""
    module = std_module(NN)
    compiled = build(module, target).kernels["rmsnorm"]
    x, w = random_inputs(module.kernels["rmsnorm"], {"M": 3, "N": 17}, seeded("rmsnorm-scalars"))
    by_position = compiled(x, w, 0.5)
    assert_matches(by_position, compiled(x, w, eps=0.5), rtol=0, atol=0, what="eps by position vs by name")
    assert_conforms(compiled(x, w), module.kernels["rmsnorm"], x, w, eps=1e-6, what="default eps")
