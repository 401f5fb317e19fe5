"""``benchmarks/decoder.py --quick`` runs end to end: tiny layers, every section, no timing asserts.

The script runs in a subprocess, as a real run does. Its exit status covers its own correctness
checks: arke's layer against transformers' on every configuration (f32, bf16 and int8 weights,
dense and mixture-of-experts), so a wrong result fails here even though no time is ever asserted.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "decoder.py"

HEADERS = ("command: ", "prefill (batch 1, empty cache)", "decode: one token at a context",
           "with bf16 / int8 weights", "memory plan: one arena per call shape", "targets met:", "totals:")


@functools.cache
def bench_script() -> ModuleType:
    """benchmarks/decoder.py, imported once (registered first: its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location("arke_bench_decoder", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_quick_run_prints_every_table() -> None:
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    for header in HEADERS:
        assert header in out, f"{header!r} missing from:\n{out[-4000:]}"
    assert "Llama-3.2-1B" in out and "small Mixtral" in out
    assert "0 failed, 0 mismatched checks" in out


def test_prefill_flops_and_target_tally() -> None:
    from transformers import LlamaConfig

    bench = bench_script()
    config = LlamaConfig(hidden_size=8, intermediate_size=16, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=4)
    per_token = 8 * (2 + 2) * 4 + 2 * 4 * 8 + 3 * 8 * 16  # qkv, o, gate/up/down
    assert bench.prefill_flops(config, 3) == 2.0 * 3 * per_token + 4.0 * 2 * 4 * 6  # 6 visible (query, key) pairs
    targets = bench.Targets()
    assert targets.judge("a", True, "≥ 1×").endswith("met")
    assert "MISSED" in targets.judge("b", False, "≥ 1×")
    assert targets.judge("c", None, "—") == "—"
    assert (targets.met, targets.missed) == (["a"], ["b"])
