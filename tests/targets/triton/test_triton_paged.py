"""Paged attention on the Triton target (spec/language.md §8.11, arke/targets/triton/attention.py):
decode and prefill attention whose k and v rows come through a block table, bounded by a length per
sequence, run as the attention family (each key's row looked up in place, the key blocks past the
length skipped, the table never read there) and equal the interpreter in Triton's interpreter, for
flash and split_kv; compiled ahead of time for sm_90 and sm_80, they spill nothing."""

from __future__ import annotations

import numpy as np
import pytest
from codegen_support import assert_conforms, build, seeded, text_module
from paged_support import paged_decode

pytest.importorskip("triton")

from arke.plan.attention import Attention
from arke.targets import base as targets
from arke.targets.triton import aot as triton_aot

PREFILL = """
kernel paged_prefill(q: f32[B, T, H, E], kc: f32[NB, G, P, E], vc: bf16[NB, G, P, E], blk: i32[B, MB],
                     lens: i64[B]) -> f32[B, T, H, E]
  where H % G == 0
{
  let R = H / G
  s[b, t, h, j] = sum(q[b, t, h, e] * kc[blk[b, j / P], h / R, j % P, e] for e) * 0.25
  mx[b, t, h] = max(s[b, t, h, j] for j < lens[b])
  p[b, t, h, j] = exp(s[b, t, h, j] - mx[b, t, h])
  return sum(p[b, t, h, j] * f32(vc[blk[b, j / P], h / R, j % P, e]) for j < lens[b])
         / sum(p[b, t, h, j] for j < lens[b])
}
"""


def _module(algorithm: str | None) -> object:
    strategy = "" if algorithm is None else (
        f"@strategy(paged_decode, target = triton) {{\n  algorithm = {algorithm}\n}}\n")
    return text_module(paged_decode() + PREFILL + strategy)


def _tables(rng: np.random.Generator, b: int, mb: int) -> np.ndarray:
    return rng.permutation(b * mb + 2)[: b * mb].reshape(b, mb).astype(np.int32)


@pytest.mark.parametrize("algorithm", [None, "split_kv"])
def test_paged_decode_in_the_interpreter(algorithm: str | None) -> None:
    module = _module(algorithm)
    plan = targets.get("triton").plan(module.semantic, module.kernel_map["paged_decode"], None)  # type: ignore[attr-defined]
    (d,) = plan.dispatches
    assert d.family == "attention" and isinstance(d.pattern, Attention) and d.pattern.k_rows and d.pattern.v_rows
    rng = seeded("triton-paged", algorithm)
    b, h, g, e, p, mb = 3, 8, 2, 16, 4, 9  # 36 keys a sequence at most
    kc, vc = (rng.standard_normal((b * mb + 2, g, p, e)).astype(np.float32) for _ in range(2))
    args = (rng.standard_normal((b, h, e)).astype(np.float32), kc, vc, _tables(rng, b, mb), np.array([0, 36, 13]))
    got = build(module, "triton").kernels["paged_decode"](*args)  # type: ignore[arg-type]
    assert_conforms(got, module.kernels["paged_decode"], *args, what=f"triton paged decode {algorithm}")  # type: ignore[attr-defined]


def test_paged_prefill_with_16_bit_values_in_the_interpreter() -> None:
    import torch

    module = _module(None)
    rng = seeded("triton-paged-prefill")
    b, t, h, g, e, p, mb = 2, 3, 4, 2, 16, 4, 5
    kc = rng.standard_normal((b * mb + 2, g, p, e)).astype(np.float32)
    vc = torch.from_numpy(rng.standard_normal((b * mb + 2, g, p, e)).astype(np.float32)).bfloat16()
    q = rng.standard_normal((b, t, h, e)).astype(np.float32)
    for lens in ([20, 1], [7, 13]):  # the whole table, one key, ragged
        args = (q, kc, vc, _tables(rng, b, mb), np.array(lens))
        got = build(module, "triton").kernels["paged_prefill"](*args)  # type: ignore[arg-type]
        assert_conforms(got, module.kernels["paged_prefill"], *args, what=f"triton paged prefill {lens}")  # type: ignore[attr-defined]


@pytest.mark.parametrize("kernel", ["paged_decode", "paged_prefill"])
def test_paged_attention_compiles_for_sm90_and_sm80_without_spills(kernel: str) -> None:
    module = _module(None)
    target = targets.get("triton")
    plan = target.plan(module.semantic, module.kernel_map[kernel], None)  # type: ignore[attr-defined]
    artifact = target.render(plan)
    for entry in triton_aot.compile_artifact_archs(artifact, plan, ["sm_90", "sm_80"]):
        assert entry.cubin and entry.spills == 0, f"{entry.entry} on {entry.arch} spills {entry.spills} bytes"
