"""Decoder layers on bf16 / f16 activations (std.decoder's ``_h`` kernels, :mod:`arke.models.layer_half`).

Each compiled layer runs a sequence in chunks (prefill, then single-token decode steps) against one
KV cache and is held to two references: transformers' own layer run in the same dtype (its rounding
points are the kernels', so the two differ only by summation order: far less than either differs
from the f32 layer), and the same plan on the reference interpreter (the oracle).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hf_support import MAX_SEQ, config, hf_layer, inputs, reference, relative_error, run_chunks

import arke.models
from arke.models.layer_half import HalfLayer
from arke.runtime.errors import GuardError
from arke.targets.triton import kernel as gpu

CHUNKS = [9, 1, 1, 1, 1, 1, 1]
#: max |y - ref| / max |ref| allowed against a reference in the same half dtype: a few units in the
#: last place of the largest outputs (bf16 keeps 8 bits: 2^-8 = 0.0039)
HALF_RTOL = {torch.bfloat16: 4 * 2.0 ** -8, torch.float16: 4 * 2.0 ** -11}


def _half_reference(arch: str, cfg: Any, dtype: torch.dtype, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """transformers' layer (seed 0) run in ``dtype`` over the whole sequence at once."""
    return reference(arch, hf_layer(arch, cfg, 0).to(dtype), cfg, x.to(dtype), pos)


def _close_to_transformers(y: torch.Tensor, arch: str, cfg: Any, dtype: torch.dtype, x: torch.Tensor,
                           pos: torch.Tensor) -> None:
    ours = _half_reference(arch, cfg, dtype, x, pos)
    full = reference(arch, hf_layer(arch, cfg, 0), cfg, x, pos)
    assert y.dtype == dtype and y.shape == ours.shape
    assert relative_error(y, ours) <= HALF_RTOL[dtype]
    # the same rounding points: much nearer transformers in this dtype than that is to its f32 layer
    near = (y.float() - ours.float()).abs().mean()
    assert near <= 0.5 * (ours.float() - full).abs().mean()


@pytest.mark.parametrize("target", ["llvm", "triton"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
@pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")
def test_bf16_layer_matches_transformers_in_bf16(arch: str, target: str) -> None:
    if target == "triton" and not gpu.runnable():
        pytest.skip("triton cannot run here (no triton, or neither a GPU nor TRITON_INTERPRET=1)")
    cfg = config(arch)
    compiled = arke.models.from_transformers(hf_layer(arch, cfg, 0), cfg, target=target, max_seq=MAX_SEQ,
                                             dtype=torch.bfloat16)
    assert isinstance(compiled, HalfLayer) and "bf16 activations and weights" in repr(compiled)
    x, pos = inputs(2, sum(CHUNKS))
    cache = compiled.new_cache(2)
    assert cache.k.dtype == torch.bfloat16
    y = run_chunks(compiled, x.bfloat16(), pos, CHUNKS, cache)
    _close_to_transformers(y, arch, cfg, torch.bfloat16, x, pos)
    # the oracle: the same plan with every kernel on the reference interpreter
    oracle = arke.models.from_transformers(hf_layer(arch, cfg, 0), cfg, target="reference", max_seq=MAX_SEQ,
                                           dtype=torch.bfloat16)
    assert relative_error(y, run_chunks(oracle, x.bfloat16(), pos, CHUNKS)) <= HALF_RTOL[torch.bfloat16]


def test_f16_layer_matches_transformers_in_f16() -> None:
    cfg = config("llama")
    compiled = arke.models.from_transformers(hf_layer("llama", cfg, 0), cfg, max_seq=MAX_SEQ, dtype=torch.float16)
    x, pos = inputs(1, sum(CHUNKS))
    y = run_chunks(compiled, x.half(), pos, CHUNKS)
    _close_to_transformers(y, "llama", cfg, torch.float16, x, pos)


def test_f32_input_comes_back_f32_and_weights_are_half() -> None:
    cfg = config("llama")
    layer = hf_layer("llama", cfg, 0)
    half = arke.models.from_transformers(layer, cfg, max_seq=MAX_SEQ, dtype=torch.bfloat16)
    full = arke.models.from_transformers(layer, cfg, max_seq=MAX_SEQ)
    x, pos = inputs(1, 4)
    y = half(x, pos, half.new_cache())
    assert y.dtype == torch.float32
    assert torch.equal(y, half(x.bfloat16(), pos, half.new_cache()).float())
    assert half.weight_bytes < 0.55 * full.weight_bytes


def test_half_layer_refusals() -> None:
    cfg = config("llama")
    layer = hf_layer("llama", cfg, 0)
    with pytest.raises(ValueError, match="bf16 activations read bf16 weights, not 'int8'"):
        arke.models.from_transformers(layer, cfg, dtype=torch.bfloat16, weights="int8")
    with pytest.raises(ValueError, match=r"dtype must be torch\.float32, torch\.bfloat16 or torch\.float16"):
        arke.models.from_transformers(layer, cfg, dtype=torch.float64)
    moe = config("mixtral")
    with pytest.raises(ValueError, match="a mixture of experts runs with f32 activations"):
        arke.models.from_transformers(hf_layer("mixtral", moe, 0), moe, dtype=torch.bfloat16)


def test_bad_call_leaves_the_cache_as_it_was() -> None:
    cfg = config("qwen2")
    compiled = arke.models.from_transformers(hf_layer("qwen2", cfg, 0), cfg, max_seq=MAX_SEQ, dtype=torch.bfloat16)
    x, pos = inputs(1, 5)
    cache = compiled.new_cache()
    compiled(x.bfloat16(), pos, cache)
    keys = cache.k.clone()
    with pytest.raises(GuardError, match="positions"):
        compiled(x.bfloat16(), pos[:, :3], cache)
    assert cache.length == 5 and torch.equal(cache.k, keys)


def test_from_pretrained_in_bf16(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = config("qwen2", num_hidden_layers=2)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.save_pretrained(tmp_path)
    loaded = arke.models.layer_from_pretrained(tmp_path, layer_index=1, max_seq=MAX_SEQ, dtype=torch.bfloat16)
    direct = arke.models.from_transformers(model.model.layers[1], cfg, max_seq=MAX_SEQ, dtype=torch.bfloat16)
    x, pos = inputs(1, 6)
    assert torch.equal(loaded(x.bfloat16(), pos, loaded.new_cache()), direct(x.bfloat16(), pos, direct.new_cache()))
