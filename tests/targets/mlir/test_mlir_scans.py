"""Scans on the mlir target (arke/targets/mlir/scan.py): ``iree_linalg_ext.scan`` run by IREE on the CPU
against the interpreter, every form and a sample of dtypes (tests/support/scan_cases.py), ragged
shapes included; max/min and integer scans bit for bit, float sums within the one tolerance rule;
and the same modules compiled for CUDA (IREE's sm_80), which needs no GPU.
"""

from __future__ import annotations

from typing import Any

import pytest
import scan_cases
from codegen_support import assert_conforms, build, results

from arke.plan.dispatch import make_plan
from arke.targets.mlir import kernel as iree
from arke.targets.mlir.render import RENDERER

pytestmark = pytest.mark.skipif(not iree.iree_available(), reason="IREE is not installed (pip install 'arke[mlir]')")


@pytest.mark.parametrize(("name", "dims"), scan_cases.CASES, ids=lambda v: str(v))
def test_scans_conform_on_the_cpu(name: str, dims: dict[str, int]) -> None:
    args = scan_cases.inputs(name, dims)
    got: Any = build(scan_cases.module(), "mlir").kernels[name](*args)
    assert_conforms(got, scan_cases.module().kernels[name], *args, what=f"{name} {dims} on mlir")
    want = results(scan_cases.module().kernels[name](*args))
    for k in scan_cases.EXACT.get(name, ()):
        scan_cases.assert_exact(results(got)[k], want[k], f"{name}: result {k}")


def test_the_scan_is_one_linear_op() -> None:
    # one iree_linalg_ext.scan per scan, over the collapsed rows of the selective scan's 4 axes
    plan = make_plan(scan_cases.module().semantic, "selective_scan", None, families=RENDERER.families)
    text = str(RENDERER.render(plan).source)
    assert text.count("iree_linalg_ext.scan dimension(1) inclusive(true)") == 1
    assert "tensor.collapse_shape" in text and "xi64>" in text  # (a, b) pairs packed in i64


@pytest.mark.parametrize("name", ["floats", "recur", "selective_scan"])
def test_scans_compile_for_cuda(name: str) -> None:
    plan = make_plan(scan_cases.module().semantic, name, None, families=RENDERER.families)
    assert iree.compile_vmfb(str(RENDERER.render(plan).source), "cuda")[:2] == b"PK"


def test_a_split_along_the_scan_axis_is_ak4014_everywhere() -> None:
    """`split n` on a scan's axis passed `akc check`, was listed as applied by `--explain`, and only
    `arke.build` said (as AK4013) that nothing took it: the scan has no reduction loop in linalg. It is now
    AK4014 in all three; a split of a reduction beside it is still taken."""
    import arke
    from arke.targets.mlir import TARGET

    src = ("kernel cs(x: f32[M, N]) -> f32[M, N] {\n  return cumsum(x[m, n] for n)\n}\n"
           "kernel rs(x: f32[M, N]) -> f32[M] {\n  return sum(x[m, n] for n)\n}\n"
           "@strategy(cs, target = mlir) {\n  split n = 4\n}\n@strategy(rs, target = mlir) {\n  split n = 4\n}\n")
    [d] = arke.check(src)
    assert d.code == "AK4014" and d.span.line == 8 and "iree_linalg_ext.scan" in d.message, d
    module = arke.loads(src)
    for name, dropped in (("cs", True), ("rs", False)):
        [strategy] = module.strategies.for_kernel(name, "mlir")
        plan = make_plan(module.semantic, name, strategy, families=RENDERER.families)
        [split] = strategy.decisions
        assert (TARGET.honoured(split, plan.dispatches[0]) is not None) is dropped


FOLDED = {  # terms IREE folds to values that read no input (IREE 3.13)
    "pow0": "kernel k(x: i64[M, N]) -> i64[M] { return sum(x[m, n] ** 0 for n) }",
    "times0": "kernel k(x: i64[M, N]) -> i64[M] { return sum(x[m, n] * 0 + n for n) }",
    "mean": "kernel k(x: f32[M, N]) -> f32[M] { return mean(x[m, n] ** 0.0 for n) }",
    "prod": "kernel k(x: i64[M, N]) -> i64[M] { return prod(x[m, n] * 0 + 2 for n) }",
    "same": "kernel k(x: i64[M, N]) -> i64 { return sum(i64(bool(x[m, n]) == bool(x[m, n])) for m, n) }",
    "cumsum": "kernel k(x: i64[M, N]) -> i64[M, N] { return cumsum(x[m, n] ** 0 for n) }",
    "cummax": "kernel k(x: i64[M, N]) -> i64[M, N] { return cummax(x[m, n] * 0 + n for n) }",
}


@pytest.mark.parametrize("case", list(FOLDED))
@pytest.mark.parametrize("n", [3, 37])
def test_a_term_iree_folds_still_runs_over_every_element(case: str, n: int) -> None:
    """`sum(x ** 0 for n)` over 3 gave 1 on mlir: IREE folded the term to a constant and its CPU vectorizer
    added it once per vector of the reduced loop; a scan of such a body failed to compile ("stack allocation
    size overflows 64 bits"). Every reduction's term is tied to an opaque input, every scan's body kept apart."""
    import numpy as np

    import arke

    module = arke.loads(FOLDED[case])
    x = np.arange(2 * n).reshape(2, n)
    x = x.astype(np.float32 if "f32" in FOLDED[case] else np.int64)
    got = build(module, "mlir").kernels["k"](x)
    assert_conforms(got, module.kernels["k"], x, what=f"{case} over {n}")


@pytest.mark.parametrize("kernel", ["rmsnorm", "softmax", "layernorm", "linear"])
def test_a_plain_reduction_is_not_tied(kernel: str) -> None:
    """The tie costs an input that stops IREE's fusion (rmsnorm took 3x as long): a term that cannot fold away
    is rendered as it was, with no barrier."""
    import arke

    module = arke.loads(f"from std.nn import {kernel}\n")
    plan = make_plan(module.semantic, module.kernel_map[kernel], None, families=RENDERER.families)
    assert "util.optimization_barrier" not in RENDERER.render(plan).source
