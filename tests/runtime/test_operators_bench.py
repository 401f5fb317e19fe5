"""``benchmarks/operators.py --quick`` runs end to end: every operator of issue 17 built from its `.ak`
source, checked against torch, and timed briefly (no timing asserts).

The script runs in a subprocess, as a real run does. Its exit status covers its own correctness
checks, so an operator that fails to build or gives torch's answer wrongly fails here although no time is ever asserted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "operators.py"

sys.path.insert(0, str(ROOT / "benchmarks"))
from operator_refs import OPERATORS  # noqa: E402


def test_quick_run_checks_every_operator() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert f"{len(OPERATORS)} operators: 0 failed, 0 mismatched checks" in out, out[-4000:]
    rows = [line for line in out.splitlines() if line.split("  ")[0].strip() in {op.name for op in OPERATORS}]
    assert len(rows) == len(OPERATORS) and all(" ok (" in line for line in rows), out[-4000:]


def test_every_operator_names_a_kernel_of_the_source() -> None:
    import arke

    module = arke.load(ROOT / "benchmarks" / "operators" / "operators.ak")
    assert {op.kernel for op in OPERATORS} <= set(module.kernels)
    assert len({op.name for op in OPERATORS}) == len(OPERATORS)
