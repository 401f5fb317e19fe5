"""GPU kernels side by side: arke's GPU targets against torch, on one NVIDIA GPU, in one command.

    python benchmarks/gpu.py [--no-compile] [--only NAME] [--skip-check] [--targets triton,cuda,llvm-ptx]

Three arke columns, one per GPU target: ``triton`` (Triton kernels), ``cuda`` (CUDA C through
NVRTC, launched by the CUDA driver) and ``llvm-ptx`` (the LLVM target's GPU flavour:
``target="llvm", arch=...``, one thread per element, no tensor cores or shared-memory tiles).

1. **Check**: every stdlib kernel, built for each target, on small ragged shapes,
   against the reference interpreter (the oracle, itself run with torch on the CPU). A kernel
   the renderer cannot express yet is listed as ``unsupported`` with the reason.
2. **Benchmark** (``triton.testing.do_bench``: warmed, median of many runs), bf16 storage with
   f32 accumulation: matmul 4096³ and 8192³ vs ``torch.matmul``; rmsnorm, softmax, fused
   linear+bias+gelu and swiglu vs torch eager and ``torch.compile``; causal GQA attention
   forward (B=4, H=32, G=8, S=4096, D=128) and split-KV decode (T=32768) vs
   ``scaled_dot_product_attention``. Each row shows TFLOP/s (compute-bound) or TB/s
   (memory-bound) and the % of the device's peak: the datasheet's dense bf16 and HBM numbers
   for H100/H200/A100, else measured (a bf16 matmul and a device copy).
3. **Decoder layer**: a Llama-3.2-1B-shaped layer (:func:`layer_rows`) with bf16 weights and
   inputs, ``arke.models.from_transformers(..., target="triton", weights="bf16")`` against the
   transformers layer in bf16 under torch eager and ``torch.compile``: prefill 512 tokens and
   a decode step at context 2048, checked first.

The run stops starting new rows after ``--budget`` seconds (default 270) so it finishes in
under 5 minutes. Without a CUDA device it says so and exits 0. The check is also a function,
:func:`check_stdlib`, that runs on CPU tensors under ``TRITON_INTERPRET=1`` (the tests do).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

import arke
from arke.cli.build import random_inputs
from arke.lang.checker import stdlib_path

STDLIB = ("std.nn", "std.attention", "std.moe", "std.decoder")
#: Small, ragged dims for the check; they satisfy every stdlib `where` (H % G, T >= S, D even,
#: C == (H + 2 G) E and E == 2 R for the decoder's fused QKV).
CHECK_DIMS = {"B": 2, "H": 4, "G": 2, "S": 3, "T": 9, "D": 16, "M": 5, "N": 37, "K": 19, "F": 24, "V": 33, "E": 8,
              "C": 64, "R": 4}

#: Datasheet peaks: (name fragment, dense bf16 FLOP/s, HBM bytes/s); the first fragment found wins.
PEAKS = (
    ("H200", 989e12, 4.8e12),
    ("H100 NVL", 835e12, 3.9e12),
    ("H100 PCIe", 756e12, 2.0e12),
    ("H100", 989e12, 3.35e12),  # SXM5 (HBM3)
    ("A100-SXM4-80GB", 312e12, 2.039e12),
    ("A100 80GB PCIe", 312e12, 1.935e12),
    ("A100", 312e12, 1.555e12),
)

BENCH_AK = """
kernel matmul_bf16(a: bf16[M, K], b: bf16[K, N]) -> bf16[M, N] {
  return bf16(sum(f32(a[m, k]) * f32(b[k, n]) for k))
}

kernel rmsnorm_bf16(x: bf16[M, N], w: bf16[N], eps: f32 = 1e-6) -> bf16[M, N] {
  inv[m] = rsqrt(mean(f32(x[m, n]) * f32(x[m, n]) for n) + eps)
  return bf16(f32(x[m, n]) * inv[m] * f32(w[n]))
}

kernel softmax_bf16(x: bf16[M, N]) -> bf16[M, N] {
  mx[m] = max(f32(x[m, n]) for n)
  e[m, n] = exp(f32(x[m, n]) - mx[m])
  return bf16(e[m, n] / sum(e[m, k] for k))
}

kernel linear_bias_gelu(x: bf16[M, K], w: bf16[N, K], b: bf16[N]) -> bf16[M, N] {
  y[m, n] = sum(f32(x[m, k]) * f32(w[n, k]) for k) + f32(b[n])
  return bf16(gelu(y))
}

kernel swiglu_bf16(x: bf16[T, D], wg: bf16[F, D], wu: bf16[F, D]) -> bf16[T, F] {
  g[t, f] = sum(f32(x[t, d]) * f32(wg[f, d]) for d)
  u[t, f] = sum(f32(x[t, d]) * f32(wu[f, d]) for d)
  return bf16(silu(g) * u)
}

kernel attention_bf16(q: bf16[B, H, S, D], k: bf16[B, G, T, D], v: bf16[B, G, T, D]) -> bf16[B, H, S, D]
  where H % G == 0
{
  let R = H / G
  s[b, h, i, j] = sum(f32(q[b, h, i, d]) * f32(k[b, h / R, j, d]) for d) / sqrt(f32(D))
  mx[b, h, i] = max(s[b, h, i, j] for j)
  p[b, h, i, j] = exp(s[b, h, i, j] - mx[b, h, i])
  return bf16(sum(p[b, h, i, j] * f32(v[b, h / R, j, d]) for j) / sum(p[b, h, i, j] for j))
}

kernel causal_attention_bf16(q: bf16[B, H, S, D], k: bf16[B, G, T, D], v: bf16[B, G, T, D]) -> bf16[B, H, S, D]
  where H % G == 0, T >= S
{
  let R = H / G
  s[b, h, i, j] = sum(f32(q[b, h, i, d]) * f32(k[b, h / R, j, d]) for d) / sqrt(f32(D))
  c[b, h, i, j] = s[b, h, i, j] if j <= i + T - S else -inf
  mx[b, h, i] = max(c[b, h, i, j] for j)
  p[b, h, i, j] = exp(c[b, h, i, j] - mx[b, h, i])
  return bf16(sum(p[b, h, i, j] * f32(v[b, h / R, j, d]) for j) / sum(p[b, h, i, j] for j))
}
"""


# ---------------------------------------------------------------- the check (also runs under TRITON_INTERPRET=1)


@dataclass(frozen=True)
class Check:
    """One stdlib kernel's check: ``status`` is ``ok``, ``mismatch``, ``unsupported`` or ``error``."""

    name: str
    status: str
    error: float = 0.0  # max |triton - interpreter| / max(1, max |interpreter|)
    note: str = ""


def scaled_error(got: Any, want: Any) -> float:
    """max |got - want| / max(1, max |want|) over every result (NaNs where both have them agree)."""
    worst = 0.0
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        a, b = a.detach().cpu().double(), b.detach().cpu().double()
        if not a.numel():
            continue
        both_nan = torch.isnan(a) & torch.isnan(b)
        diff = torch.where(both_nan | (a == b), torch.zeros_like(a), (a - b).abs())
        finite = b[torch.isfinite(b)].abs()
        scale = max(1.0, float(finite.max())) if finite.numel() else 1.0
        worst = max(worst, float(diff.max()) / scale)
    return worst


def tolerance(dtypes: Iterable[str], device: torch.device) -> float:
    """Half-precision results round once (bf16: 8 bits); f32 on CUDA may use tf32 dot products."""
    if any(d in ("bf16", "f16") for d in dtypes):
        return 2e-2
    return 5e-3 if device.type == "cuda" else 1e-4


#: The GPU targets the script compares: (column, arke.build's target, whether it takes an arch).
TARGETS = {"triton": ("triton", False), "cuda": ("cuda", False), "llvm-ptx": ("llvm", True)}


def build_for(module: arke.Module, column: str) -> Any:
    """``module`` built for one column's target (``llvm-ptx``: the llvm target for this GPU's arch)."""
    target, needs_arch = TARGETS[column]
    if not needs_arch:
        return arke.build(module, target=target)
    from arke.targets.nvidia.driver import build_arch

    return arke.build(module, target=target, arch=build_arch(torch.device("cuda")))


def check_stdlib(device: torch.device, only: Iterable[str] | None = None, dims: dict[str, int] | None = None,
                 seed: int = 0, column: str = "triton") -> list[Check]:
    """Each stdlib kernel (``only``: names as ``std.nn.rmsnorm`` or ``rmsnorm``) built for ``column``'s
    target (:data:`TARGETS`), on ``device``, against the reference interpreter on the CPU."""
    from arke.targets.artifact import UnsupportedError

    wanted = set(only) if only is not None else None
    out = []
    for module in STDLIB:
        mod = arke.load(stdlib_path(module))
        lib = build_for(mod, column)
        for name in mod.names:
            full = f"{module}.{name}"
            if wanted is not None and not ({full, name} & wanted):
                continue
            fn = mod.semantic.get(mod.kernel_map[name])
            inputs = random_inputs(fn, dims or CHECK_DIMS, seed)
            want = mod.kernels[name](*inputs)
            moved = [t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs]
            try:
                got = lib.kernels[name](*moved)
            except UnsupportedError as err:
                out.append(Check(full, "unsupported", note=str(err)))
                continue
            except Exception as err:  # a report: one kernel's failure must not stop the others
                out.append(Check(full, "error", note=f"{type(err).__name__}: {err}"[:300]))
                continue
            err_ = scaled_error(got, want)
            tol = tolerance([str(r.dtype) for r in fn.result_types], device)
            out.append(Check(full, "ok" if err_ <= tol else "mismatch", err_, f"tolerance {tol:g}"))
    return out


def print_checks(checks: list[Check]) -> None:
    for c in checks:
        print(f"  {c.status:<11} {c.name:<34} {c.error:9.2e}  {c.note}")
    counts = {s: sum(c.status == s for c in checks) for s in ("ok", "mismatch", "unsupported", "error")}
    print("  " + ", ".join(f"{n} {s}" for s, n in counts.items()))


# ---------------------------------------------------------------- the benchmarks (CUDA only)


@dataclass
class Bench:
    """One kernel on one shape: inputs, torch's version, and its work (FLOPs or bytes)."""

    name: str
    kernel: str  # in BENCH_AK
    make: Callable[[], tuple[torch.Tensor, ...]]
    torch_fn: Callable[..., torch.Tensor]
    flops: float = 0.0
    nbytes: float = 0.0
    compile: bool = False  # also time torch.compile(torch_fn)
    ref: str = "torch"


def _bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def _rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).bfloat16()


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1, dtype=torch.float32).bfloat16()


def _lbg(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.linear(x, w, b))


def _swiglu(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor) -> torch.Tensor:
    return F.silu(F.linear(x, wg)) * F.linear(x, wu)


def _sdpa(causal: bool) -> Callable[..., torch.Tensor]:
    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    return run


def _square_pair(n: int) -> Callable[[], tuple[torch.Tensor, ...]]:
    return lambda: (_bf16(n, n), _bf16(n, n))


def benches() -> list[Bench]:
    b, h, g, s, d, t = 4, 32, 8, 4096, 128, 32768
    out = [Bench(f"matmul bf16 {n}³", "matmul_bf16", _square_pair(n), torch.matmul, flops=2.0 * n ** 3,
                 ref="torch.matmul") for n in (4096, 8192)]
    out += [
        Bench("rmsnorm bf16 8192×8192", "rmsnorm_bf16", lambda: (_bf16(8192, 8192), _bf16(8192)), _rmsnorm,
              nbytes=2.0 * 2 * 8192 * 8192, compile=True),
        Bench("softmax bf16 8192×8192", "softmax_bf16", lambda: (_bf16(8192, 8192),), _softmax,
              nbytes=2.0 * 2 * 8192 * 8192, compile=True),
        Bench("linear+bias+gelu 8192×4096×14336", "linear_bias_gelu",
              lambda: (_bf16(8192, 4096), _bf16(14336, 4096) / 64, _bf16(14336)), _lbg,
              flops=2.0 * 8192 * 4096 * 14336, compile=True),
        Bench("swiglu 8192×4096×14336", "swiglu_bf16",
              lambda: (_bf16(8192, 4096), _bf16(14336, 4096) / 64, _bf16(14336, 4096) / 64), _swiglu,
              flops=2 * 2.0 * 8192 * 4096 * 14336, compile=True),
        Bench(f"causal attention B{b} H{h} G{g} S{s} D{d}", "causal_attention_bf16",
              lambda: (_bf16(b, h, s, d), _bf16(b, g, s, d), _bf16(b, g, s, d)), _sdpa(True),
              flops=2.0 * b * h * s * s * d, ref="sdpa"),  # 4·B·H·S²·D halved by the causal mask
        Bench(f"decode (split-KV) B{b} H{h} G{g} T{t} D{d}", "attention_bf16",
              lambda: (_bf16(b, h, 1, d), _bf16(b, g, t, d), _bf16(b, g, t, d)), _sdpa(False),
              nbytes=2.0 * 2 * b * g * t * d, ref="sdpa"),
    ]
    return out


def peaks(name: str) -> tuple[float, float, str]:
    """(bf16 FLOP/s, bytes/s, where from) for the device: the datasheet, else measured here."""
    import triton.testing

    for fragment, flops, nbytes in PEAKS:
        if fragment in name:
            return flops, nbytes, f"datasheet ({fragment})"
    a = _bf16(8192, 8192)
    mm = triton.testing.do_bench(lambda: a @ a) * 1e-3
    big = torch.empty(1 << 29, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(big)
    cp = triton.testing.do_bench(lambda: dst.copy_(big)) * 1e-3
    return 2.0 * 8192 ** 3 / mm, 2.0 * big.numel() / cp, "measured (torch bf16 matmul, device copy)"


def rate(bench: Bench, seconds: float, limits: tuple[float, float, str]) -> str:
    if bench.flops:
        return f"{bench.flops / seconds / 1e12:7.1f} TFLOP/s {100 * bench.flops / seconds / limits[0]:5.1f}%"
    return f"{bench.nbytes / seconds / 1e12:7.2f} TB/s    {100 * bench.nbytes / seconds / limits[1]:5.1f}%"


def bench_row(bench: Bench, kernels: dict[str, Any], compile_too: bool, limits: tuple[float, float, str]) -> list[str]:
    """Time one benchmark (each arke column, torch eager, torch.compile) and format its rows: one per column."""
    import triton.testing

    torch.manual_seed(0)
    inputs = bench.make()
    want = bench.torch_fn(*inputs)
    t_torch = triton.testing.do_bench(lambda: bench.torch_fn(*inputs)) * 1e-3
    comp, t_comp = f"{'-':>10}", None
    if bench.compile and compile_too:
        compiled = torch.compile(bench.torch_fn)
        compiled(*inputs)
        t_comp = triton.testing.do_bench(lambda: compiled(*inputs)) * 1e-3
        comp = f"{t_comp * 1e3:8.3f}ms"
    rows = []
    for column, kernel in kernels.items():
        label = f"{bench.name} [{column}]"
        try:
            got = kernel(*inputs)
        except Exception as err:  # a report: show why and go on
            rows.append(f"  {label:<54} failed: {type(err).__name__}: {str(err)[:200]}")
            continue
        err_ = scaled_error(got, want)
        t_arke = triton.testing.do_bench(lambda k=kernel: k(*inputs)) * 1e-3
        vs_comp = f"{t_comp / t_arke:8.2f}x" if t_comp is not None else f"{'-':>9}"
        rows.append(f"  {label:<54}{t_arke * 1e3:8.3f}ms{t_torch * 1e3:8.3f}ms{comp}  {t_torch / t_arke:9.2f}x"
                    f"{vs_comp}  {rate(bench, t_arke, limits):<28}{err_:.1e}")
    return rows


def run_benches(selected: list[Bench], compile_too: bool, deadline: float,
                limits: tuple[float, float, str], columns: list[str]) -> None:
    """Print one row per benchmark and column (rows that would start after ``deadline`` are skipped)."""
    mod = arke.loads(BENCH_AK, "<benchmarks/gpu.py>")
    libs = {}
    for column in columns:
        try:
            libs[column] = build_for(mod, column)
        except Exception as err:  # a report: a target that cannot build here is said, the others run
            print(f"  {column}: cannot build here: {type(err).__name__}: {str(err)[:200]}")
    print(f"  {'kernel [target]':<54}{'arke':>10}{'torch':>10}{'compile':>10}  {'torch/arke':>10}{'comp/arke':>9}  "
          f"{'arke rate, % of peak':<28}err")
    for bench in selected:
        if time.perf_counter() > deadline:
            print(f"  {bench.name:<54} skipped: the time budget is spent")
            continue
        for row in bench_row(bench, {c: lib.kernels[bench.kernel] for c, lib in libs.items()}, compile_too, limits):
            print(row, flush=True)
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- a whole decoder layer


@dataclass(frozen=True)
class LayerShape:
    """A Llama-style layer and the run: prefill tokens, the context of the decode step."""

    hidden: int = 2048
    intermediate: int = 8192
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 64
    prefill: int = 512
    context: int = 2048


def _timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    """Seconds per call: ``triton.testing.do_bench`` on CUDA, a median of a few calls elsewhere."""
    if device.type == "cuda":
        import triton.testing

        return lambda fn: triton.testing.do_bench(fn) * 1e-3

    def median(fn: Callable[[], object]) -> float:
        fn()
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return sorted(times)[1]

    return median


def layer_rows(device: torch.device, shape: LayerShape = LayerShape(), compile_too: bool = True) -> list[str]:
    """The layer in bf16 (arke: bf16 weights, f32 sums) vs transformers in bf16: eager and compiled.

    Returns the table's rows; the first says how far arke's outputs are from transformers'.
    Runs anywhere Triton does (the tests run it tiny under ``TRITON_INTERPRET=1``).
    """
    from transformers import DynamicCache
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    import arke.models
    from arke.cli.demo_layer import llama_config

    config = llama_config(shape.hidden, shape.intermediate, shape.heads, shape.kv_heads, shape.head_dim)
    torch.manual_seed(0)
    hf = LlamaDecoderLayer(config, layer_idx=0).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.02)
    hf = hf.to(device=device, dtype=torch.bfloat16)
    rotary = LlamaRotaryEmbedding(config).to(device)
    layer = arke.models.from_transformers(hf, config, target="triton", max_seq=shape.context + 1, weights="bf16")
    timer = _timer(device)
    x = torch.randn(1, shape.prefill, shape.hidden, device=device, dtype=torch.bfloat16)
    pos = torch.arange(shape.prefill, device=device)[None]
    emb = rotary(x, pos)
    cache = layer.new_cache(1)

    def ours_prefill() -> object:
        cache.length = 0
        return layer(x, pos, cache)

    def eager_prefill() -> object:
        with torch.no_grad():
            return hf(x, position_embeddings=emb)

    got, want = ours_prefill(), eager_prefill()
    rows = [f"  layer check: prefill max |arke - transformers| / max |transformers| = "
            f"{scaled_error(got, want[0] if isinstance(want, tuple) else want):.1e} (bf16 weights, both)"]
    times = {"arke": timer(ours_prefill), "eager": timer(eager_prefill)}
    if compile_too:
        compiled = torch.compile(hf)
        with torch.no_grad():
            compiled(x, position_embeddings=emb)
            times["compile"] = timer(lambda: compiled(x, position_embeddings=emb))
    rows.append(_layer_row(f"prefill {shape.prefill} (batch 1, bf16)", times))
    # one decode step at the context: arke's cache refilled to that length, transformers' own cache likewise
    x1 = torch.randn(1, 1, shape.hidden, device=device, dtype=torch.bfloat16)
    p1 = torch.full((1, 1), shape.context - 1, device=device)
    past = DynamicCache()
    kv = torch.randn(1, shape.kv_heads, shape.context - 1, shape.head_dim, device=device, dtype=torch.bfloat16)
    past.update(kv, kv.clone(), 0)
    emb1 = rotary(x1, p1)

    def ours_decode() -> object:
        cache.length = shape.context - 1
        return layer(x1, p1, cache)

    def eager_decode() -> object:
        with torch.no_grad():
            out = hf(x1, cache=past, use_cache=True, position_embeddings=emb1)
        past.crop(-1)  # drop the step's token: every timed step sees the same context
        return out

    rows.append(_layer_row(f"decode step at {shape.context} (batch 1, bf16)",
                           {"arke": timer(ours_decode), "eager": timer(eager_decode)}))
    return rows


def _layer_row(name: str, times: dict[str, float]) -> str:
    arke_s = times["arke"]
    cells = [f"{times[k] * 1e3:9.3f}ms" if k in times else f"{'-':>11}" for k in ("arke", "eager", "compile")]
    ratios = [f"{times[k] / arke_s:6.2f}x" if k in times else f"{'-':>7}" for k in ("eager", "compile")]
    return f"  {name:<40}{''.join(cells)}   {' '.join(ratios)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--only", action="append", help="only benchmarks whose name contains this")
    parser.add_argument("--skip-check", action="store_true", help="skip the stdlib check")
    parser.add_argument("--budget", type=float, default=270.0, help="seconds after which no new row starts")
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help=f"comma-separated arke columns (default: {','.join(TARGETS)})")
    args = parser.parse_args(argv)
    columns = [c for c in args.targets.split(",") if c]
    unknown = [c for c in columns if c not in TARGETS]
    if unknown:
        parser.error(f"unknown target {unknown[0]!r}; the columns are {', '.join(TARGETS)}")
    start = time.perf_counter()
    if not torch.cuda.is_available():
        print("no CUDA device: benchmarks/gpu.py needs an NVIDIA GPU (the check runs on the CPU with "
              "TRITON_INTERPRET=1 in the tests: tests/runtime/test_gpu_bench.py)")
        return 0
    try:
        import triton
    except ImportError:
        print("the triton target needs Triton: pip install triton")
        return 0
    name = torch.cuda.get_device_name()
    print(f"device: {name}; torch {torch.__version__}, triton {triton.__version__}")
    if not args.skip_check:
        for column in columns:
            print(f"check: stdlib kernels built for {column} vs the reference interpreter")
            try:
                print_checks(check_stdlib(torch.device("cuda"), column=column))
            except Exception as err:  # a report: a target that cannot build here is said, the others run
                print(f"  {column}: cannot build here: {type(err).__name__}: {str(err)[:200]}")
    limits = peaks(name)
    print(f"peaks: {limits[0] / 1e12:.0f} TFLOP/s bf16 dense, {limits[1] / 1e12:.2f} TB/s ({limits[2]})")
    selected = [b for b in benches() if not args.only or any(o in b.name for o in args.only)]
    run_benches(selected, not args.no_compile, start + args.budget, limits, columns)
    if not args.only or any("layer" in o for o in args.only):
        print(f"  {'decoder layer (Llama-3.2-1B-shaped)':<40}{'arke':>11}{'eager':>11}{'compile':>11}   "
              f"{'eager/arke compile/arke'}")
        try:
            for row in layer_rows(torch.device("cuda"), compile_too=not args.no_compile):
                print(row, flush=True)
        except Exception as err:  # a report: show why
            print(f"  decoder layer failed: {type(err).__name__}: {str(err)[:300]}")
    print(f"total {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    sys.exit(main())
