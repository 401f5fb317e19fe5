"""The CUDA-C target's contraction family (``arke/targets/cuda/gemm*.py``), checked without a GPU.

Kernels are planned with the contraction family on and run through the host simulator
(:mod:`cuda_host`: the rendered CUDA C compiled by g++, a block's threads as fibers, ``ak_mma_*``
and ``ak_cp_async16`` with their GPU meaning) against the reference interpreter:

* every conformance case whose plan has a contraction dispatch;
* matmul and linear in f32, bf16 and f16 on ragged shapes (16-bit operands on the tensor cores),
  a batch with GQA subscripts (and a bad one raising the error word), a batch axis between the
  rows and the columns, int8 weights scaled in a prologue, prologues that are not 0 at 0,
  epilogues, matrix-vector products;
* strategies: blocks, warps and stages change the kernel, never the answer, and a combination
  no kernel can run is an UnsupportedError naming the decision;
* NVRTC + ptxas: every stdlib contraction compiles for sm_80 and sm_90 without spills.

Shapes stay small: the simulator switches fibers about a million times a second.
"""

from __future__ import annotations

import multiprocessing
import re
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import cuda_host
import pytest
import torch
from codegen_support import STDLIB, assert_conforms, kernel_names, random_inputs, seeded, std_module, text_module
from test_conformance import CASES, Case

import arke
from arke.ir.strategy import Strategy
from arke.plan.dispatch import KernelPlan, make_plan
from arke.targets.artifact import UnsupportedError
from arke.targets.cuda.gemm import render_contraction
from arke.targets.cuda.gemm_mv import MV_ROWS
from arke.targets.cuda.render import PRELUDE, CudaRenderer
from arke.targets.nvidia.simt import entry_name

pytestmark = pytest.mark.skipif(not cuda_host.available(), reason="no g++")

FAMILY = frozenset({"contraction"})
RENDERER = CudaRenderer(FAMILY)


def plan_of(module: arke.Module, name: str, strategy: Strategy | None = None) -> KernelPlan:
    return make_plan(module.semantic, module.kernel_map.get(name, name), strategy, families=FAMILY)


def has_contraction(plan: KernelPlan) -> bool:
    return any(d.family == "contraction" and d.pattern is not None for d in plan.dispatches)


# ---------------------------------------------------------------- conformance

CONTRACTION_CASES = [c for c in CASES if has_contraction(plan_of(std_module(c.module), c.member))]


def test_the_stdlib_contractions_are_covered() -> None:
    kernels = {c.kernel for c in CONTRACTION_CASES}
    assert {"matmul", "linear", "linear_bf16", "linear_int8", "bmm", "swiglu", "attention", "mlp",
            "expert_q", "moe_combine"} <= kernels


@pytest.mark.parametrize("case", CONTRACTION_CASES, ids=lambda c: c.id)
def test_conformance_case(case: Case) -> None:
    cuda_host.check_host_case(case, RENDERER, "cuda contraction (host)")


# ---------------------------------------------------------------- forms, dtypes, shapes

SOURCE = """
kernel mm_f32(a: f32[M, K], b: f32[K, N]) -> f32[M, N] { return sum(a[m, k] * b[k, n] for k) }
kernel mm_bf16(a: bf16[M, K], b: bf16[K, N]) -> bf16[M, N] { return bf16(sum(f32(a[m, k]) * f32(b[k, n]) for k)) }
kernel mm_f16(a: f16[M, K], b: f16[K, N]) -> f16[M, N] { return f16(sum(f32(a[m, k]) * f32(b[k, n]) for k)) }
kernel lin_f32(x: f32[M, K], w: f32[N, K]) -> f32[M, N] { return sum(x[m, k] * w[n, k] for k) }
kernel lin_bf16(x: bf16[M, K], w: bf16[N, K]) -> f32[M, N] { return sum(f32(x[m, k]) * f32(w[n, k]) for k) }
kernel lin_f16(x: f16[M, K], w: f16[N, K]) -> f32[M, N] { return sum(f32(x[m, k]) * f32(w[n, k]) for k) }

# a 16-bit contract op (rounded once, no epilogue) and mixed operands (SIMT)
kernel mmop(a: bf16[M, K], b: bf16[K, N]) -> bf16[M, N] { return a @ b }
kernel mixed(x: bf16[M, K], w: f32[N, K]) -> f32[M, N] { return sum(f32(x[m, k]) * w[n, k] for k) }

# GQA: heads h read the key/value group h / R
kernel gqa(q: bf16[B, H, S, D], k: bf16[B, G, T, D]) -> f32[B, H, S, T] where H % G == 0 {
  let R = H / G
  return sum(f32(q[b, h, i, d]) * f32(k[b, h / R, j, d]) for d) * 0.25
}
kernel pv(p: f32[B, H, S, T], v: f32[B, G, T, D]) -> f32[B, H, S, D] where H % G == 0 {
  let R = H / G
  return sum(p[b, h, i, j] * v[b, h / R, j, d] for j)
}
# heads in pairs with no `where`: an odd head count reads past k's groups (the error word)
kernel pairs(q: f32[H, S, D], k: f32[G, T, D]) -> f32[H, S, T] { return sum(q[h, i, d] * k[h / 2, j, d] for d) }

# a batch axis between the rows and the columns, the weight shared by the batch
kernel shared(x: f32[M, B, K], w: f32[K, N]) -> f32[M, B, N] { return sum(x[m, b, k] * w[k, n] for k) * 0.5 }

# int8 weights scaled per output channel in the prologue
kernel q8(x: f32[M, K], w: i8[N, K], s: f32[N]) -> f32[M, N] { return sum(x[m, k] * (f32(w[n, k]) * s[n]) for k) }

# prologues on both sides that are not 0 at 0 (the ragged edge must not count), bias, gelu, residual
kernel fused(x: f32[M, K], w: f32[N, K], b: f32[N], r: f32[M, N]) -> f32[M, N] {
  return gelu(sum(exp(x[m, k]) * (w[n, k] + 1.0) for k) + b[n]) + r[m, n]
}
kernel fused_bf16(x: bf16[M, K], w: bf16[N, K], b: f32[N]) -> bf16[M, N] {
  return bf16(silu(sum(f32(x[m, k]) * f32(w[n, k]) for k) + b[n]))
}

# matrix-vector products: no row axis
kernel mv(w: f32[N, K], x: f32[K]) -> f32[N] { return sum(w[n, k] * x[k] for k) }
kernel mv_bf16(w: bf16[N, K], x: bf16[K]) -> f32[N] { return sum(f32(w[n, k]) * f32(x[k]) for k) }
kernel vm(x: f32[K], w: f32[K, N]) -> f32[N] { return sum(x[k] * w[k, n] for k) }

@strategy(mm_bf16, target = cuda, when M > 0) { tile m = 16, n = 32, k = 16
  warps = 2
  stages = 2 }
@strategy(mm_bf16, target = cuda, when M > 1) { tile m = 64, n = 32, k = 64
  warps = 4
  stages = 4 }
@strategy(mm_bf16, target = cuda, when M > 2) { tile m = 32, n = 64, k = 32
  warps = 1 }
@strategy(lin_bf16, target = cuda, when M > 0) { tile m = 16, n = 32, k = 16
  warps = 2
  stages = 2 }
@strategy(lin_f16, target = cuda, when M > 0) { tile m = 48, n = 48, k = 48
  warps = 2 }
@strategy(gqa, target = cuda, when S > 0) { tile i = 16, j = 16, d = 16
  warps = 1 }
@strategy(mm_f32, target = cuda, when M > 0) { tile m = 32, n = 32, k = 8
  warps = 4
  stages = 1 }
@strategy(mm_f32, target = cuda, when M > 1) { tile m = 16, n = 64, k = 32
  warps = 2 }
@strategy(mm_f32, target = cuda, when M > 2) { tile m = 48, n = 40, k = 5
  warps = 1 }
@strategy(q8, target = cuda, when M > 0) { tile m = 16, n = 16, k = 16
  warps = 1 }
"""

HALF = ("bf16", "f16")


def mma(source: str) -> set[str]:
    """The tensor-core instructions the kernels call (the prelude defines them all)."""
    return set(re.findall(r"(ak_mma_(?:bf16|f16))\(acc\[", source))


def strategy(module: arke.Module, name: str, variant: int) -> Strategy | None:
    """The kernel's ``variant``-th cuda strategy (-1: none)."""
    found = module.strategies.for_kernel(module.kernel_map[name], "cuda")
    return found[variant] if variant >= 0 else None


def check(name: str, dims: dict[str, int], variant: int = -1) -> str:
    """Kernel ``name`` of SOURCE through the simulator against the interpreter; returns its CUDA C."""
    module = text_module(SOURCE)
    kernel = module.kernels[name]
    args = random_inputs(kernel, dims, seeded(name, dims, variant))
    got, err = cuda_host.run(module, name, *args, renderer=RENDERER, strategy=strategy(module, name, variant))
    assert err == 0, f"{name} {dims}: the error word was raised on in-range inputs"
    assert_conforms(got, kernel, *args, what=f"{name} {dims} (variant {variant})")
    return cuda_host.host_kernel(module, name, RENDERER, strategy(module, name, variant)).source


def launched(name: str, dims: dict[str, int], variant: int = -1) -> list[str]:
    """The entries of kernel ``name`` whose grids are not empty at these dims."""
    from arke.ir.shapes import evaluate, parse_dim

    module = text_module(SOURCE)
    k = cuda_host.host_kernel(module, name, RENDERER, strategy(module, name, variant))
    return [spec.entry for spec in k.launches if all(evaluate(parse_dim(g), dims) for g in spec.grid)]


SHAPES = [{"M": 3, "K": 19, "N": 37}, {"M": 130, "K": 72, "N": 129}, {"M": 20, "K": 64, "N": 48}]


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("op", ["mm", "lin"])
@pytest.mark.parametrize("dims", SHAPES, ids=lambda d: "-".join(map(str, d.values())))
def test_matmul_and_linear(op: str, dtype: str, dims: dict[str, int]) -> None:
    source = check(f"{op}_{dtype}", dims)
    assert mma(source) == ({f"ak_mma_{dtype}"} if dtype in HALF else set())
    assert ("ak_cp_async16(dst" in source) == (dtype in HALF)
    # decode-sized M takes the matrix-vector entry, else the tiled one
    want = f"{op}_{dtype}_d0_mv" if dims["M"] <= MV_ROWS else f"{op}_{dtype}_d0"
    assert launched(f"{op}_{dtype}", dims) == [want]


@pytest.mark.parametrize(("name", "dims"), [
    ("mmop", {"M": 17, "K": 40, "N": 24}),
    ("mmop", {"M": 2, "K": 40, "N": 24}),
    ("mixed", {"M": 19, "K": 33, "N": 21}),
    ("gqa", {"B": 2, "H": 4, "G": 2, "S": 10, "T": 19, "D": 24}),  # tensor cores, batch bases aligned
    ("gqa", {"B": 1, "H": 4, "G": 1, "S": 3, "T": 9, "D": 20}),  # matrix-vector, lanes split k
    ("pv", {"B": 2, "H": 4, "G": 2, "S": 12, "T": 9, "D": 11}),
    ("pv", {"B": 1, "H": 2, "G": 1, "S": 1, "T": 40, "D": 7}),  # a thread per column
    ("shared", {"M": 5, "B": 11, "K": 7, "N": 9}),
    ("shared", {"M": 3, "B": 2, "K": 7, "N": 9}),
    ("fused", {"M": 9, "K": 21, "N": 17}),
    ("fused", {"M": 2, "K": 21, "N": 17}),
    ("fused_bf16", {"M": 18, "K": 24, "N": 20}),
    ("mv", {"K": 45, "N": 37}),
    ("mv_bf16", {"K": 70, "N": 9}),
    ("vm", {"K": 45, "N": 300}),
])
def test_contraction_forms(name: str, dims: dict[str, int]) -> None:
    source = check(name, dims)
    assert mma(source) == ({"ak_mma_bf16"} if name in ("mmop", "gqa", "fused_bf16") else set())


@pytest.mark.parametrize("dims", [{"M": 3, "K": 45, "N": 37}, {"M": 20, "K": 45, "N": 37}])
def test_int8_weights_scaled_in_the_prologue(dims: dict[str, int]) -> None:
    # int8 weights span ±100: sums that cancel keep only f32's precision relative to the terms (the rule's Σ|t|)
    check("q8", dims)


@pytest.mark.parametrize("heads", [3, 2])
@pytest.mark.parametrize("rows", [2, 12])
def test_a_bad_gqa_subscript_raises_the_error_word(heads: int, rows: int) -> None:
    module = text_module(SOURCE)
    dims = {"H": heads, "G": 1, "S": rows, "T": 5, "D": 4}  # head 2 reads k[1]: past G = 1
    args = random_inputs(module.kernels["pairs"], dims, seeded("pairs", dims))
    got, err = cuda_host.run(module, "pairs", *args, renderer=RENDERER)
    assert err == (1 if heads == 3 else 0)
    assert torch.isfinite(torch.as_tensor(got)).all()  # clamped: never a wild read


# ---------------------------------------------------------------- strategies

@pytest.mark.parametrize(("name", "variant", "dims"), [
    ("mm_bf16", 0, {"M": 3, "K": 37, "N": 41}),  # a 16-row tile on the tensor cores at decode size
    ("mm_bf16", 1, {"M": 70, "K": 136, "N": 40}),  # 4 stages, cp.async on both sides
    ("mm_bf16", 2, {"M": 33, "K": 50, "N": 65}),  # one warp
    ("lin_bf16", 0, {"M": 5, "K": 40, "N": 33}),
    ("lin_f16", 0, {"M": 50, "K": 100, "N": 50}),  # tiles that are no power of two
    ("gqa", 0, {"B": 1, "H": 2, "G": 1, "S": 2, "T": 17, "D": 8}),
    ("mm_f32", 0, {"M": 37, "K": 19, "N": 45}),  # one shared buffer
    ("mm_f32", 1, {"M": 37, "K": 70, "N": 45}),
    ("mm_f32", 2, {"M": 50, "K": 23, "N": 41}),  # 6 × 10 outputs a thread, k steps of 5
    ("q8", 0, {"M": 2, "K": 33, "N": 20}),
])
def test_strategy_variants(name: str, variant: int, dims: dict[str, int]) -> None:
    source = check(name, dims, variant)
    assert bool(mma(source)) == (name in ("mm_bf16", "lin_bf16", "lin_f16", "gqa"))
    # a `tile m` decision asks for the tiled form at every M
    assert launched(name, dims, variant) == [f"{name}_d0"]


def test_strategy_sets_the_launch() -> None:
    module = text_module(SOURCE)
    tiled = cuda_host.host_kernel(module, "mm_bf16", RENDERER, strategy(module, "mm_bf16", 1)).launches
    # 4 stages of a 64 × 64 tile of a (rows along k, 8 elements of padding) and 64 × 32 of b (rows along n)
    assert [dict(s.options) for s in tiled] == [{"block": 128, "shared": 4 * 2 * (64 * 72 + 64 * 40), "stages": 4}]
    default = cuda_host.host_kernel(module, "mm_bf16", RENDERER).launches
    assert [s.entry for s in default] == ["mm_bf16_d0", "mm_bf16_d0_mv"]
    # 3 stages of 128 × 32 and 32 × 128 tiles, or the 128 × 128 f32 outputs staged for the epilogue
    shared = max(3 * 2 * (128 * 40 + 32 * 136), 4 * 128 * 132)
    assert dict(default[0].options) == {"block": 256, "shared": shared, "stages": 3}


BAD = """
kernel h(x: bf16[M, K], w: bf16[N, K]) -> f32[M, N] { return sum(f32(x[m, k]) * f32(w[n, k]) for k) }
kernel f(x: f32[M, K], w: f32[N, K]) -> f32[M, N] { return sum(x[m, k] * w[n, k] for k) }
@strategy(h, target = cuda, when M > 0) { tile k = 24 }
@strategy(h, target = cuda, when M > 1) { tile m = 24 }
@strategy(h, target = cuda, when M > 2) { tile m = 16, n = 8
  warps = 4 }
@strategy(h, target = cuda, when M > 3) { stages = 1 }
@strategy(h, target = cuda, when M > 4) { tile m = 128, n = 128, k = 128
  stages = 4 }
@strategy(h, target = cuda, when M > 5) { tile m = 256, n = 256 }
@strategy(f, target = cuda, when M > 0) { tile m = 48, n = 40
  warps = 32 }
@strategy(f, target = cuda, when M > 1) { tile m = 128, n = 128
  warps = 1 }
"""


@pytest.mark.parametrize(("name", "variant", "message", "code"), [
    ("h", 0, r"tile k = 24 is not a multiple of 16; use a multiple of 16 \(16, 32", "AK4004"),
    ("h", 1, r"tile m = 24 is not a multiple of 16", "AK4004"),
    ("h", 2, r"warps = 4 cannot split a 16 × 8 block .* warps can be 1\b", "AK4004"),
    ("h", 3, r"stages = 1; the cp.async pipeline needs at least 2", "AK4004"),
    ("h", 4, r"stages = 4 of a 128 × 128 × 128 tile need \d+ bytes of shared memory", "AK4012"),
    ("h", 5, r"tile m = 256, tile n = 256 with warps = 8 leave 256 accumulators", "AK4012"),
    ("f", 0, r"tile m = 48, tile n = 40 cannot be split .* warps = 32", "AK4004"),
    ("f", 1, r"give each thread 512 outputs", "AK4012"),
])
def test_unusable_strategies_are_refused(name: str, variant: int, message: str, code: str) -> None:
    """Each names the decision and what works, under the code of spec/diagnostics.md: a value the target
    cannot lower is AK4004, more registers or shared memory than the GPU has AK4012."""
    module = text_module(BAD)
    plan = plan_of(module, name, module.strategies.for_kernel(module.kernel_map[name], "cuda")[variant])
    with pytest.raises(UnsupportedError, match=message) as caught:
        RENDERER.render(plan)
    assert caught.value.code == code and str(caught.value).startswith(f"{code}: ")


def test_akc_build_reports_an_unusable_strategy_at_its_decision(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`akc build --target cuda` showed such a refusal as a plain line with no code and no place, and then,
    with -o naming a file an earlier build wrote, failed again with "File exists". It is now the diagnostic
    at the decision, the exit status 1, and nothing written."""
    from arke.cli import app as cli

    text = ("kernel f(x: f32[M, K], w: f32[N, K]) -> f32[M, N] { return sum(x[m, k] * w[n, k] for k) }\n"
            "@strategy(f, target = cuda) { tile m = 128, n = 128\n  warps = 1 }\n")
    src = tmp_path / "bad.ak"
    src.write_text(text)
    out = tmp_path / "out.cu"
    out.write_text("an earlier build")
    assert cli.main(["build", str(src), "--target", "cuda", "--emit", "source", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    col = text.splitlines()[1].index("tile") + 1
    assert f"{src}:2:{col}: error[AK4012]:" in err and "give each thread 512 outputs" in err, err
    assert "File exists" not in err and out.read_text() == "an earlier build"
    src.write_text(text.replace("warps = 1", "warps = 32").replace("128, n = 128", "48, n = 40"))
    assert cli.main(["build", str(src), "--target", "cuda", "--emit", "source", "-o", str(out)]) == 1
    assert f"{src}:2:{col}: error[AK4004]:" in capsys.readouterr().err


# ---------------------------------------------------------------- NVRTC + ptxas

def _contraction_sources() -> tuple[str, dict[str, dict[str, int]]]:
    """One translation unit of every stdlib kernel's contraction entries (their default plans) and a few
    of SOURCE's (f16 tensor cores, prologues, epilogues), and each entry's launch options."""
    plans = [plan_of(std_module(name), kernel) for name in STDLIB for kernel in kernel_names(std_module(name))]
    plans += [plan_of(text_module(SOURCE), kernel) for kernel in ("mm_f16", "lin_f16", "fused", "fused_bf16", "q8")]
    texts, options = [], {}
    for plan in plans:
        for k, d in enumerate(plan.dispatches):
            if d.family == "contraction" and d.pattern is not None:
                text, launches = render_contraction(plan, d, entry_name(plan.name, k))
                texts.append(text)
                options |= {spec.entry: dict(spec.options) for spec in launches}
    return "\n\n".join([PRELUDE.strip(), *texts]) + "\n", options


def test_every_stdlib_contraction_assembles_without_spills() -> None:
    pytest.importorskip("nvidia.cuda_nvrtc")
    from arke.targets.cuda import nvrtc
    from arke.targets.nvidia import ptx as nvptx

    if nvptx.ptxas_path() is None:
        pytest.skip("no ptxas")
    source, options = _contraction_sources()
    archs = ("sm_80", "sm_90")
    # NVRTC holds a lock per process: one process per architecture compiles both at once (2 cores)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        ptx = list(pool.map(nvrtc.compile_ptx, [source] * 2, archs, ["contractions"] * 2))
    with ThreadPoolExecutor(2) as threads:
        found = dict(zip(archs, threads.map(lambda p, a: nvptx.assemble(p, a)[1], ptx, archs)))
    for arch, entries in found.items():
        by_name = {e.entry: e for e in entries}
        assert set(options) <= set(by_name), f"{arch}: entries missing from the cubin"
        for entry, opts in options.items():
            e = by_name[entry]
            assert e.spills == 0, f"{entry} spills {e.spills} words on {arch}"
            assert 0 < e.registers <= 255
            assert opts.get("shared", 0) <= 99 * 1024
    assert mma(source) == {"ak_mma_bf16", "ak_mma_f16"}


@pytest.mark.parametrize("rows", [1, 2, 3])
def test_a_small_tile_m_takes_warps_that_share_it_out(rows: int) -> None:
    """`tile m = 1` with the warps left to the target: the default 8 warps cannot split a 1 × 64 block into
    equal parts, so fewer are taken (the user chose the tile, not the warps)."""
    src = ("kernel mm1(a: f32[M, K], b: f32[K, N]) -> f32[M, N] { return sum(a[m, k] * b[k, n] for k) }\n"
           f"@strategy(mm1, target = cuda) {{\n  tile m = {rows}\n}}\n")
    module = arke.loads(src)
    dims = {"M": 5, "N": 70, "K": 9}
    args = random_inputs(module.kernels["mm1"], dims, seeded("mm1", rows))
    got, err = cuda_host.run(module, "mm1", *args, renderer=RENDERER,
                             strategy=module.strategies.for_kernel("mm1", "cuda")[0])
    assert err == 0
    assert_conforms(got, module.kernels["mm1"], *args)


def test_stages_past_double_buffering_on_an_f32_matmul_is_said() -> None:
    """The SIMT (f32) tiles double-buffer, no more: `stages = 8` ran as 2 with "applied" in --explain and no
    warning. It is AK4014 with the value that runs; on 16-bit operands (tensor cores) it runs as written."""
    import arke

    f32 = ("kernel mm(a: f32[M, K], b: f32[K, N]) -> f32[M, N] { return sum(a[m, k] * b[k, n] for k) }\n"
           "@strategy(mm, target = cuda) { stages = 8 }\n")
    [d] = arke.check(f32)
    assert d.code == "AK4014" and "would run as 2" in d.message, d
    half = ("kernel mm(a: bf16[M, K], b: bf16[K, N]) -> f32[M, N] { return sum(f32(a[m, k]) * f32(b[k, n]) for k) }\n"
            "@strategy(mm, target = cuda) { stages = 4 }\n")
    assert arke.check(half) == []
