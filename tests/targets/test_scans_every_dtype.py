"""Every scan form over a sample of dtypes (tests/support/scan_cases.py) on the llvm and triton targets
against the interpreter: the one tolerance rule for float sums, products and recurrences, the
interpreter's values exactly for max/min (NaN from the first NaN on) and every integer scan (8- to
64-bit, unsigned, booleans, the integer recurrence). The mlir target's run is
tests/targets/mlir/test_mlir_scans.py, CUDA C's tests/targets/cuda/test_cuda_scans.py.

Triton runs under its CPU interpreter here, which takes a tenth of a second per program: it gets
rows of 300 (two blocks of 256, a ragged second one) instead of 4097, and the kernel that also
scans along its first axis (one program per column) rows of 20.
"""

from __future__ import annotations

from typing import Any

import pytest
import scan_cases
from codegen_support import RUNNABLE, assert_conforms, build, results

SMALL = {"floats": {"M": 3, "N": 20}, "ints": {"M": 3, "N": 300}, "recur": {"M": 3, "N": 300},
         "sum_1d": {"N": 300}, "selective_scan": {"B": 1, "D": 2, "S": 3, "T": 300}}
CASES = [pytest.param("llvm", n, d, id=f"llvm-{n}-{d}") for n, d in scan_cases.CASES] + [
    pytest.param("triton", n, d, id=f"triton-{n}-{d}") for n, d in SMALL.items()]


@pytest.mark.parametrize(("target", "name", "dims"), CASES)
def test_scans_conform(target: str, name: str, dims: dict[str, int]) -> None:
    if target not in RUNNABLE:
        pytest.skip(f"{target} does not run here")
    args = scan_cases.inputs(name, dims)
    got: Any = build(scan_cases.module(), target).kernels[name](*args)
    assert_conforms(got, scan_cases.module().kernels[name], *args, what=f"{name} {dims} on {target}")
    want = results(scan_cases.module().kernels[name](*args))
    for k in scan_cases.EXACT.get(name, ()):
        scan_cases.assert_exact(results(got)[k], want[k], f"{name} {dims} on {target}: result {k}")
