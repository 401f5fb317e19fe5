"""The MLIR target's artifacts, kernel by kernel: every stdlib kernel renders to MLIR that
``iree-opt`` parses and verifies, its strategy's transform script applies and the result
verifies, and the whole library compiles for CUDA (sm_80) with no GPU present. Running on
``llvm-cpu`` against the interpreter is the conformance suite's business (test_conformance.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from codegen_support import LAYER_DTYPES, STDLIB, kernel_names, std_module, text_module

from arke.ir import semantic as ir
from arke.ir import strategy as sir
from arke.plan.dispatch import KernelPlan, make_plan
from arke.targets.mlir.kernel import cuda_unsupported
from arke.targets.mlir.lowering import may_fold_away
from arke.targets.mlir.render import RENDERER, fixed_dims

IREE_OPT = Path(sys.executable).parent / "iree-opt"
pytestmark = pytest.mark.skipif(not IREE_OPT.exists(), reason="IREE is not installed (pip install 'arke[mlir]')")

KERNELS = [(m, k) for m in STDLIB for k in kernel_names(std_module(m), LAYER_DTYPES)]


def plan_of(module: str, kernel: str, strategy: sir.Strategy | None = None) -> KernelPlan:
    mod = std_module(module)
    return make_plan(mod.semantic, mod.kernel_map[kernel], strategy, RENDERER.families)


def iree_opt(text: str, *flags: str, tmp: Path) -> str:
    """``iree-opt`` on ``text`` (parse, verify, print); a failure shows IREE's diagnostics."""
    path = tmp / "payload.mlir"
    path.write_text(text)
    done = subprocess.run([str(IREE_OPT), *flags, str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def strategy_for(plan: KernelPlan) -> sir.Strategy:
    """A strategy with a decision of every expressible kind the kernel's first ops allow: parallel
    over the first axis, a tile and vectorisation of the innermost, a split reduction."""
    fn = plan.function
    ops = [op for op in fn.ops if isinstance(op, ir.MapOp | ir.ReduceOp | ir.ContractOp)]
    decisions: list[sir.Decision] = []
    first = next((op for op in ops if op.axes), None)
    if first is not None:
        decisions.append(sir.Decision("parallel", first.axes[0].name, None))
        if len(first.axes) > 1:
            decisions.append(sir.Decision("vectorize", first.axes[-1].name, 8))
    red = next((op for op in ops if isinstance(op, ir.ReduceOp | ir.ContractOp)), None)
    if red is not None:
        name = red.reduce_axes[0].name
        if first is None or name not in {a.name for a in first.axes}:
            decisions.append(sir.Decision("tile", name, 16))
    return sir.Strategy(plan.name, "mlir", None, tuple(decisions))


@cache
def rendered(module: str, kernel: str) -> str:
    return RENDERER.render(plan_of(module, kernel)).source


@pytest.mark.parametrize(("module", "kernel"), KERNELS, ids=[f"{m}.{k}" for m, k in KERNELS])
def test_stdlib_kernel_verifies(module: str, kernel: str, tmp_path: Path) -> None:
    source = rendered(module, kernel)
    # upstream dialects only, but for a scan's iree_linalg_ext.scan (arke/targets/mlir/scan.py), and the
    # barrier and shape tie that keep IREE from folding a scan's body or a reduction's term (spec/codegen.md §8)
    used = set(re.findall(r"^\s*(?:%\w+ = )?([a-z_]+)\.[a-z_]+", source, flags=re.M))
    ops = plan_of(module, kernel).function.ops
    scans = any(isinstance(op, ir.ScanOp) for op in ops)
    kept = scans or any(isinstance(op, ir.ReduceOp) and may_fold_away(op.body) for op in ops)
    allowed = {"func", "arith", "math", "tensor", "linalg", "scf"} | ({"iree_linalg_ext"} if scans else set()) | \
        ({"util", "flow"} if kept else set())
    assert used <= allowed, used
    out = iree_opt(source, tmp=tmp_path)
    assert "linalg." in out


@pytest.mark.parametrize(("module", "kernel"), KERNELS, ids=[f"{m}.{k}" for m, k in KERNELS])
def test_stdlib_transform_applies(module: str, kernel: str, tmp_path: Path) -> None:
    plan = plan_of(module, kernel)
    strategy = strategy_for(plan)
    plan = plan_of(module, kernel, strategy)
    artifact = RENDERER.render(plan)
    script = tmp_path / "transform.mlir"
    script.write_text(artifact.meta["transform"])
    applied = iree_opt(artifact.source, f"--transform-preload-library=transform-library-paths={script}",
                       "--transform-interpreter", tmp=tmp_path)
    assert "scf.forall" in applied or not strategy.decisions
    iree_opt(applied, tmp=tmp_path)  # what the script made verifies


def test_whole_stdlib_compiles_for_cuda_sm80() -> None:
    """Every stdlib kernel in one module, compiled for CUDA sm_80 (no GPU needed)."""
    from arke.targets.mlir.kernel import compile_vmfb

    funcs = []
    for m, k in KERNELS:
        if cuda_unsupported(plan_of(m, k)):
            continue  # test_kernels_iree_cannot_compile_for_cuda_are_refused_first
        source = rendered(m, k)
        body = source[source.index("\n") + 1:source.rstrip().rindex("}")]
        funcs.append(body)
    module = "module {\n" + "\n".join(funcs) + "}\n"
    vmfb = compile_vmfb(module, device="cuda", arch="sm_80")
    assert len(vmfb) > 1000


def test_kernels_iree_cannot_compile_for_cuda_are_refused_first() -> None:
    """``cuda_unsupported`` names exactly the stdlib kernels IREE's CUDA pipeline fails on (an
    argmax's 64-bit reduction of positions; a reduction bounded by a length read from a tensor), and
    IREE does fail on them: when it learns to, this fails and the refusal must go."""
    from arke.targets.mlir.kernel import IREEError, compile_vmfb

    refused = [f"{m}.{k}" for m, k in KERNELS if cuda_unsupported(plan_of(m, k))]
    assert refused == ["std.decoder.attn_paged", "std.decoder.attn_paged_window", "std.deepseek.mla_paged__W_f32",
                       "std.deepseek.mla_paged__W_bf16", "std.lm.candidates", "std.lm.candidates_k",
                       "std.lm.sample_all", "std.lm.pick",
                       "std.nn.greedy", "std.nn.route_top2"]
    with pytest.raises(IREEError, match="failed to distribute"):
        compile_vmfb(rendered("std.nn", "greedy"), device="cuda", arch="sm_80")
    with pytest.raises(IREEError, match="failed to distribute"):
        compile_vmfb(rendered("std.lm", "sample_all"), device="cuda", arch="sm_80")
    with pytest.raises(IREEError, match="failed to distribute"):
        compile_vmfb(rendered("std.decoder", "attn_paged"), device="cuda", arch="sm_80")


GQA = """
kernel gqa(q: f32[B, H, S, D], k: f32[B, G, T, D]) -> f32[B, H, S, T]
  where H % G == 0
{
  let R = H / G
  return sum(q[b, h, i, d] * k[b, h / R, j, d] for d)
}
"""


def test_gqa_reads_kv_by_indexing_map_not_a_copy() -> None:
    mod = text_module(GQA)
    source = RENDERER.render(make_plan(mod.semantic, "gqa", None, RENDERER.families)).source
    assert "tensor.expand_shape" in source and "tensor.collapse_shape" in source
    assert "tensor.extract %" not in source.split("linalg.generic")[1]  # k is an operand, not a gather
    # k (rank 4) is read by a map that drops the inner head loop
    assert "affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d1, d4, d5)>" in source


def test_literal_and_when_dims_are_static() -> None:
    text = """
kernel scale(x: f32[M, 64], y: f32[M, N]) -> f32[M, N] { return x[m, 0] * y[m, n] }
@strategy(scale, target = mlir, when N == 128) { parallel m }
"""
    mod = text_module(text)
    plain = RENDERER.render(make_plan(mod.semantic, "scale", None, RENDERER.families)).source
    assert "tensor<?x64xf32>" in plain and "tensor<?x?xf32>" in plain
    strategy = mod.strategies.for_kernel("scale", "mlir")[0]
    assert fixed_dims(strategy.when) == {"N": 128}
    special = RENDERER.render(make_plan(mod.semantic, "scale", strategy, RENDERER.families)).source
    assert "tensor<?x128xf32>" in special


def test_schedule_attribute_states_parallel_dims() -> None:
    source = rendered("std.attention", "causal_attention")
    assert re.search(r'arke.schedule = \{"[\w.:]*causal_attention" = \{parallel_dims = \["b", "h", "i"\]\}\}',
                     source), source[:300]
