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


REDUCTIONS = {
    # a decided reduce chunk of 2**20: the default 16 outputs beside it held 2**24 elements (a launch error)
    "chunk": ("@strategy(rs, target = triton) { tile n = 1048576 }\n", []),
    # both decided: the outputs' block gives way, said as AK4014
    "both": ("@strategy(rs, target = triton) { tile m = 2048, n = 2048 }\n", ["AK4014"]),
    # a decided outputs' block: the default reduce chunk gives way, nothing to say
    "outputs": ("@strategy(rs, target = triton) { tile m = 1048576 }\n", []),
}


@pytest.mark.parametrize("case", list(REDUCTIONS))
def test_a_reductions_two_blocks_fit_one_tensor(case: str) -> None:
    """A reduction's program holds its outputs' block by its reduce chunk in one tensor: together they stay
    within 2**20 elements (blocks.two_wide), and only a decision that gives way is warned."""
    strategy, codes = REDUCTIONS[case]
    source = "kernel rs(x: f32[M, N]) -> f32[M] { return sum(x[m, n] for n) }\n" + strategy
    assert [d.code for d in arke.check(source)] == codes
    module = text_module(source)
    x = seeded("blocks", case).standard_normal((5, 300)).astype(np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = arke.build(module, target="triton").rs(x)
    said = [w.message for w in caught if isinstance(w.message, StrategyDowngradeWarning)]
    assert [w.code for w in said] == codes, said
    assert all("would run as 512" in str(w) for w in said)
    assert_conforms(got, module.kernels["rs"], x, what=f"triton {case}")
