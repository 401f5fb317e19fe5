"""f16 weights (the generic decoder kernels' third float member, spec/language.md §5.6) in a whole layer:
the same as transformers with its matrices rounded to f16, and the rounding real (llvm)."""

from __future__ import annotations

import pytest
import torch
from hf_support import MAX_SEQ, RTOL, config, hf_layer, inputs, reference, relative_error, run_chunks, with_weights

import arke.models


@pytest.mark.parametrize("arch", ["llama", "mixtral"])
def test_f16_weights_match_rounded_transformers(arch: str) -> None:
    cfg = config(arch)
    layer = hf_layer(arch, cfg, 0)
    compiled = arke.models.from_transformers(layer, cfg, max_seq=MAX_SEQ, weights="f16")
    assert "f16 weights" in repr(compiled)
    chunks = [5, 1, 1]
    x, pos = inputs(2, sum(chunks))
    y = run_chunks(compiled, x, pos, chunks)
    rounded = with_weights(layer, lambda w: w.to(torch.float16).float())
    near = relative_error(y, reference(arch, rounded, cfg, x, pos))
    assert near <= RTOL
    # ... and the rounding is real: against the f32 layer the error is far larger (f16 keeps 11 bits, so
    # less so than bf16's)
    assert relative_error(y, reference(arch, layer, cfg, x, pos)) > 10 * near
