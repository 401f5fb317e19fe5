"""A `tile` larger than Triton's tensors allow (2**20 elements: arke/targets/triton/blocks.py) runs as 1024
along its index in a contraction (2**20 alone in an element-wise program), with AK4014 from `akc check` and
`arke.build` alike; the results stay the interpreter's.
Before, `tile j = 65536` was Triton's "numel exceeds triton maximum tensor numel" at the launch."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from codegen_support import assert_conforms, seeded, text_module

import arke
from arke.targets.downgrades import StrategyDowngradeWarning
from arke.targets.triton import kernel as gpu

pytestmark = pytest.mark.skipif(not gpu.runnable(), reason="triton cannot run here (no triton, no GPU, no interpreter)")

CASES = {
    "linear": ("kernel lin(x: f32[M, K], w: f32[N, K]) -> f32[M, N] { return sum(x[m, k] * w[n, k] for k) }\n"
               "@strategy(lin, target = triton) { tile m = 65536 }\n", {"M": 3, "K": 33, "N": 17}),
    "single": ("kernel add(x: f32[N], w: f32[N]) -> f32[N] { return x[n] * w[n] + 1.0 }\n"
               "@strategy(add, target = triton) { tile n = 2097152 }\n", {"N": 4097}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_block_too_large_runs_capped_with_a_warning(case: str) -> None:
    source, dims = CASES[case]
    assert [d.code for d in arke.check(source)] == ["AK4014"]
    module = text_module(source)
    name = next(iter(module.kernels))
    rng = seeded("blocks", case)
    if case == "linear":
        args = [rng.standard_normal((dims["M"], dims["K"])).astype(np.float32),
                rng.standard_normal((dims["N"], dims["K"])).astype(np.float32)]
    else:
        args = [rng.standard_normal(dims["N"]).astype(np.float32), rng.standard_normal(dims["N"]).astype(np.float32)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = getattr(arke.build(module, target="triton"), name)(*args)
    most = "1024" if case == "linear" else "1048576"
    assert any(isinstance(w.message, StrategyDowngradeWarning) and f"would run as {most} or less" in str(w.message)
               for w in caught)
    assert_conforms(got, module.kernels[name], *args, what=f"triton {case}")
