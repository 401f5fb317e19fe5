"""Renderers are pure: text in, text out, the same every time, and no compiler is touched.

* rendering a plan twice — or a plan made twice, or in another process with another hash
  seed — gives identical artifacts;
* rendering every stdlib kernel never imports llvmlite (compiling belongs to the runtime);
* the LLVM target's text parses and verifies with llvmlite, and its launch specs name
  functions the text defines, buffers the plan has and extents over the plan's dims.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from codegen_support import STDLIB, TARGETS, kernel_names, std_module, text_module
from test_dtypes import SOURCE as DTYPE_SOURCE

import arke
from arke.ir.shapes import free_dims, parse_dim
from arke.plan.dispatch import make_plan
from arke.targets import base as targets
from arke.targets.artifact import Artifact

# Kernels with strategies: rendered with each of them (the `parallel` axis changes the launch).
STRATEGIES = """
kernel scale(x: f32[M, N], s: f32[N]) -> f32[M, N] { return x[m, n] * s[n] }
kernel colsum(x: f32[M, N]) -> f32[N] { return sum(x[m, n] for m) }
@strategy(scale, target = llvm, when M == 1) { parallel n }
@strategy(scale, target = llvm) { parallel m }
@strategy(colsum) { parallel n }
"""


def every_kernel() -> list[tuple[str, str]]:
    """(module label, kernel name) of every stdlib kernel and of the test modules' kernels."""
    found = [(m, k) for m in STDLIB for k in kernel_names(std_module(m))]
    found += [("dtypes", k) for k in text_module(DTYPE_SOURCE).names]
    return found + [("strategies", k) for k in text_module(STRATEGIES).names]


def load(label: str) -> arke.Module:
    if label == "dtypes":
        return text_module(DTYPE_SOURCE)
    return text_module(STRATEGIES) if label == "strategies" else std_module(label)


def render_all(label: str, kernel: str, target: str) -> list[Artifact]:
    """The artifacts of one kernel: without a strategy, then with each of the target's strategies."""
    module = load(label)
    ir_name = module.kernel_map[kernel]
    strategies = [None, *module.strategies.for_kernel(ir_name, target)]
    return [targets.get(target).renderer().render(make_plan(module.semantic, ir_name, s)) for s in strategies]


KERNELS = pytest.mark.parametrize(("label", "kernel"), every_kernel(), ids=lambda v: str(v))
ALL_TARGETS = pytest.mark.parametrize("target", TARGETS)


@ALL_TARGETS
@KERNELS
def test_rendering_is_deterministic(label: str, kernel: str, target: str) -> None:
    module = load(label)
    ir_name = module.kernel_map[kernel]
    plan = make_plan(module.semantic, ir_name)
    first = targets.get(target).renderer().render(plan)
    assert targets.get(target).renderer().render(plan) == first
    assert targets.get(target).renderer().render(make_plan(module.semantic, ir_name)) == first
    assert first.target == target


RENDER_SCRIPT = """
import hashlib, json, sys
sys.path[:0] = {paths!r}
from test_renderer import every_kernel, render_all
out = {{}}
for label, kernel in every_kernel():
    for target in {targets!r}:
        text = "".join(a.source + repr(a.launches) for a in render_all(label, kernel, target))
        out[f"{{label}}.{{kernel}}.{{target}}"] = hashlib.sha256(text.encode()).hexdigest()
print(json.dumps({{"digests": out, "llvmlite": sorted(m for m in sys.modules if m.startswith("llvmlite"))}}))
"""


def render_in_subprocess(hash_seed: str) -> dict[str, object]:
    here = Path(__file__).resolve()
    script = RENDER_SCRIPT.format(paths=[str(here.parent), str(here.parents[1] / "support")], targets=list(TARGETS))
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_rendering_imports_no_compiler_and_is_the_same_in_every_process() -> None:
    first, second = render_in_subprocess("1"), render_in_subprocess("2")
    assert first["llvmlite"] == [], f"rendering imported {first['llvmlite']}: renderers must not compile"
    assert first["digests"] == second["digests"], "rendered text depends on the process's hash seed"
    here = {f"{label}.{kernel}.{target}": hashlib.sha256(
        "".join(a.source + repr(a.launches) for a in render_all(label, kernel, target)).encode()).hexdigest()
        for label, kernel in every_kernel() for target in TARGETS}
    assert first["digests"] == here


@KERNELS
def test_llvm_text_parses_and_launches_match_it(label: str, kernel: str) -> None:
    if "llvm" not in TARGETS:
        pytest.skip("the llvm target is not registered")
    import llvmlite.binding as llvm

    module = load(label)
    ir_name = module.kernel_map[kernel]
    for artifact in render_all(label, kernel, "llvm"):
        parsed = llvm.parse_assembly(artifact.source)
        parsed.verify()
        defined = {f.name for f in parsed.functions if not f.is_declaration}
        plan = make_plan(module.semantic, ir_name)
        assert artifact.launches, "no launch"
        for launch in artifact.launches:
            assert launch.entry in defined, f"launch entry {launch.entry} is not defined"
            assert all(0 <= b < len(plan.buffers) for b in launch.buffers), launch
            if launch.parallel_extent is not None:
                assert free_dims(parse_dim(launch.parallel_extent)) <= set(plan.dims), launch


def test_unknown_target_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown target 'cpu'") as info:
        targets.get("cpu")
    for t in TARGETS:
        assert t in str(info.value)

