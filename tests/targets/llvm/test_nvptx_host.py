"""The LLVM target's GPU flavour, run: every conformance case's NVPTX module executed on the host.

:mod:`nvptx_host` JIT-compiles the very LLVM IR the NVPTX flavour renders (special registers and
address spaces rewritten, nothing else) and runs every thread of every launch; the results must
equal the reference interpreter's within the suite's rule (``codegen_support.tolerance``), and a
bad subscript must raise the error word. No GPU is needed; PTX and ptxas are
test_llvm_nvptx.py's.
"""

from __future__ import annotations

import numpy as np
import nvptx_host
import pytest
from codegen_support import random_inputs, seeded, std_module
from test_conformance import CASES, Case


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_nvptx_on_the_host_matches_interpreter(case: Case) -> None:
    nvptx_host.check_host_case(case)


@pytest.mark.parametrize("bad", [5, -1, 1 << 40])
def test_out_of_range_gather_raises_the_error_word(bad: int) -> None:
    module = std_module("std.nn")
    ids, table = random_inputs(module.kernels["embedding"], {"T": 3, "V": 5, "D": 4}, seeded("nvptx-host-gather"),
                               ids={"ids": "V"})
    _, err = nvptx_host.run(module, "embedding", ids, table)
    assert err == 0
    ids = np.array(ids, copy=True)
    ids[1] = bad
    got, err = nvptx_host.run(module, "embedding", ids, table)
    assert err == 1
    np.testing.assert_array_equal(got[1], table[0])  # clamped: a bad id reads row 0
