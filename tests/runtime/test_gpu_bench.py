"""``benchmarks/gpu.py`` without a GPU: its check runs under ``TRITON_INTERPRET=1`` on CPU tensors, and
the script itself says there is no CUDA device and exits 0."""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("triton")

import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu.py"

# One kernel per family, fast in Triton's interpreter (attention takes ~40 s there: the
# renderer's own interpreter tests cover it).
FAST = ("std.nn.relu", "std.nn.rmsnorm", "std.nn.softmax", "std.nn.linear_bias", "std.nn.embedding",
        "std.nn.cross_entropy_mean", "std.attention.rope")


@functools.cache
def gpu_script() -> ModuleType:
    """benchmarks/gpu.py, imported once (registered first: its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location("arke_bench_gpu", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_check_runs_under_the_interpreter() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("needs TRITON_INTERPRET=1 (tests/conftest.py sets it)")
    try:
        import arke.targets.triton.render  # noqa: F401
    except ImportError:
        pytest.skip("arke.targets.triton.render (the Triton renderer) is not available yet")
    bench = gpu_script()
    checks = bench.check_stdlib(torch.device("cpu"), only=FAST)
    assert sorted(c.name for c in checks) == sorted(FAST)
    bad = [c for c in checks if c.status in ("mismatch", "error")]
    assert not bad, bad
    bench.print_checks(checks)


def test_scaled_error_and_tolerance() -> None:
    bench = gpu_script()
    want = torch.tensor([100.0, float("nan"), 1.0])
    assert bench.scaled_error(torch.tensor([101.0, float("nan"), 1.0]), want) == pytest.approx(0.01)
    assert bench.scaled_error((torch.zeros(0),), (torch.zeros(0),)) == 0.0
    assert bench.tolerance(["bf16"], torch.device("cpu")) > bench.tolerance(["f32"], torch.device("cpu"))


def test_bench_kernels_check_clean() -> None:
    import arke

    bench = gpu_script()
    assert [str(d) for d in arke.check(bench.BENCH_AK) if d.is_error] == []
    mod = arke.loads(bench.BENCH_AK, "<gpu.py>")
    assert {b.kernel for b in bench.benches()} <= set(mod.names)


def test_without_cuda_it_says_so_and_exits_0() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA device" in proc.stdout


def test_decoder_layer_rows_under_the_interpreter() -> None:
    """The GPU script's decoder-layer section, tiny, on CPU tensors in Triton's interpreter."""
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("needs TRITON_INTERPRET=1 (tests/conftest.py sets it)")
    pytest.importorskip("transformers")
    bench = gpu_script()
    shape = bench.LayerShape(hidden=32, intermediate=48, heads=4, kv_heads=2, head_dim=8, prefill=5, context=12)
    rows = bench.layer_rows(torch.device("cpu"), shape, compile_too=False)
    assert len(rows) == 3 and "prefill 5" in rows[1] and "decode step at 12" in rows[2]
    error = float(rows[0].split("=")[1].split()[0])
    assert error < 2e-2, rows[0]  # bf16 on both sides: transformers rounds every activation, arke only weights
