"""Lowering: every checked program's SemanticIR and StrategyIR verify and round-trip.

The lowering is the first pass; the verifier runs on its output for every standard-library
file, example and clean program of the spec, and the text and JSON forms read back equal.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import arke
from arke.ir import semantic as S
from arke.ir.serialize import from_json, strategies_from_json, strategies_to_json, to_json
from arke.ir.text import print_module, print_strategies, read_module, read_strategies
from arke.ir.verify import verify, verify_strategies
from arke.lang.checker import stdlib_modules, stdlib_path

ROOT = Path(__file__).resolve().parents[2]
FILES = [stdlib_path(m) for m in stdlib_modules()] + sorted((ROOT / "examples").glob("*.ak"))


def _spec_programs() -> list[str]:
    text = (ROOT / "spec" / "language.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```ak\n(.*?)```", text, flags=re.S)
    return [b for b in blocks if not b.lstrip().startswith(("# error", "# warning", "# file", "import", "from"))]


SPEC = _spec_programs()


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_files_lower_verify_and_round_trip(path: Path) -> None:
    mod = arke.load(path)
    verify(mod.semantic)
    verify_strategies(mod.strategies, mod.semantic)
    assert read_module(print_module(mod.semantic)) == mod.semantic
    assert from_json(to_json(mod.semantic)) == mod.semantic
    assert read_strategies(print_strategies(mod.strategies)) == mod.strategies
    assert strategies_from_json(strategies_to_json(mod.strategies)) == mod.strategies


@pytest.mark.parametrize("source", SPEC, ids=[f"spec{k}" for k in range(len(SPEC))])
def test_spec_programs_lower_verify_and_round_trip(source: str) -> None:
    mod = arke.loads(source)
    verify(mod.semantic)
    assert read_module(print_module(mod.semantic)) == mod.semantic
    assert from_json(to_json(mod.semantic)) == mod.semantic


def test_contraction_is_recognised_and_transposes_fold_in() -> None:
    mod = arke.loads("kernel f(a: f32[M, K], b: f32[N, K]) -> f32[M, N] { return a @ transpose(b) }\n"
                     "kernel g(a: f32[M, K], b: f32[N, K]) -> f32[M, N] { return sum(a[m, k] * b[n, k] for k) }")
    for name in ("f", "g"):
        ops = mod.semantic.get(name).ops
        assert [type(op) for op in ops] == [S.ContractOp], ops


def test_imported_kernels_are_qualified_and_shadowed_by_own_ones() -> None:
    mod = arke.loads("import std.nn\nkernel softmax(x: f32[N]) -> f32[N] { return x }\n"
                     "kernel f(x: f32[A, B], w: f32[B]) -> f32[A, B] { return rmsnorm(x, w) }")
    assert mod.kernel_map["softmax"] == "softmax"
    assert mod.kernel_map["rmsnorm"] == "std.nn.rmsnorm"
    call = mod.semantic.get("f").ops[-1]
    assert isinstance(call, S.CallOp) and call.callee == "std.nn.rmsnorm"
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    w = np.ones(5, dtype=np.float32)
    want = x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(mod.kernels["f"](x, w), want, rtol=1e-5, atol=1e-6)


def test_callee_dims_are_renamed_all_at_once() -> None:
    # The callee's [M, N] meets the caller's [N, M]: a chained renaming would give [M, M].
    mod = arke.loads("from std.nn import softmax\nkernel f(x: f32[N, M]) -> f32[N, M] { return softmax(x) }")
    x = np.random.default_rng(1).standard_normal((2, 7)).astype(np.float32)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(mod.kernels["f"](x), e / e.sum(1, keepdims=True), rtol=1e-5)


def test_nested_calls_compose_shapes_and_guards() -> None:
    src = ("kernel half(x: f32[N]) -> y: f32[N / 2] where N % 2 == 0 { y[i] = x[2 * i] }\n"
           "kernel g(x: f32[N]) -> f32 { h = half(x)\n z = half(h)\n return sum(z[i] for i) }")
    g = arke.loads(src).kernels["g"]
    assert float(g(np.arange(64, dtype=np.float32))) == sum(range(0, 64, 4))
    with pytest.raises(ValueError, match="N % 2 == 0"):
        g(np.arange(6, dtype=np.float32))  # 6 / 2 = 3 is odd: the second call's clause fails
