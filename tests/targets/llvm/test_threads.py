"""The thread count never changes a result: the runtime splits only independent axes into
static chunks and every reduction runs in one fixed order, so 1, 2, 3 and 7 workers give
bit-identical results (ARCHITECTURE.md, "Strategies never change meaning").

Extents are chosen so the chunks are uneven (37 rows over 7 workers) and so that some
dispatches have fewer iterations than workers (decode attention, a single row).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from codegen_support import RUNNABLE, build, random_inputs, same_bits, seeded, std_module, text_module

THREADS = (1, 2, 3, 7)

ELEMENTWISE = """
kernel axpy(x: f32[N], y: f32[N], a: f32 = 2.5) -> f32[N] {
  return a * x + exp(y) / (1.0 + abs(x))
}

# the parallel axis runs over a compound extent (N / 2), then over a literal one (4)
kernel pairs(x: f32[N]) -> y: f32[N / 2] where N % 2 == 0 {
  y[i] = x[2 * i] * x[2 * i + 1]
}

kernel quarters(x: f32[N, 4]) -> y: f32[4] {
  y[j] = sum(x[i, j] * x[i, j] for i)
}
"""

CASES: list[tuple[str, str, dict[str, int]]] = [
    ("std.nn", "rmsnorm", {"M": 37, "N": 129}),
    ("std.nn", "rmsnorm", {"M": 1, "N": 4097}),
    ("std.nn", "softmax", {"M": 37, "N": 129}),
    ("std.nn", "matmul", {"M": 37, "K": 65, "N": 19}),
    ("std.attention", "causal_attention", {"B": 1, "H": 8, "G": 2, "S": 13, "T": 29, "D": 16}),
    ("std.attention", "causal_attention", {"B": 1, "H": 8, "G": 2, "S": 1, "T": 29, "D": 16}),
    ("elementwise", "axpy", {"N": 10007}),
    ("elementwise", "pairs", {"N": 34}),
    ("elementwise", "quarters", {"N": 1001}),
]


def module(label: str) -> Any:
    return text_module(ELEMENTWISE) if label == "elementwise" else std_module(label)


@pytest.mark.parametrize("target", RUNNABLE)
@pytest.mark.parametrize(("label", "name", "dims"), CASES, ids=lambda v: v if isinstance(v, str) else
                         ",".join(f"{k}={n}" for k, n in v.items()))
def test_thread_count_gives_bit_identical_results(target: str, label: str, name: str, dims: dict[str, int]) -> None:
    mod = module(label)
    args = random_inputs(mod.kernels[name], dims, seeded(name, dims))
    compiled = build(mod, target).kernels[name]
    one = compiled(*args, threads=1)
    for n in THREADS[1:]:
        again = compiled(*args, threads=n)
        assert same_bits(again, one), f"{name} with {n} threads differs from 1 thread"
    assert np.array_equal(one, compiled(*args, threads=7))  # and repeated runs agree
