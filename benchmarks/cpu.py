"""CPU kernels side by side: arke (llvm target) against torch eager and torch.compile, and the
mlir target (the same kernels through IREE's llvm-cpu) in the same interleaved rounds.

A report, not a test: it never fails the build. One run first measures this machine's
limits, then times each kernel with the shared helper (``benchmarks/timing.py``: equal
warm-up, interleaved rounds, median and spread) and prints one table:

* **limits** — vector-FMA peak on all cores (independent FMA chains on ``<16 x float>``
  in a JIT'd LLVM loop, one Python thread per core: ctypes releases the GIL) and read
  bandwidth (``torch.sum`` over a 1 GB array);
* **per kernel** — arke, torch eager and torch.compile times; the ratios arke/torch and
  arke/torch.compile (below 1: arke is faster); arke's GFLOP/s (compute-bound kernels) or
  GB/s (memory-bound ones) and that rate as a % of the machine's limit; a correctness check
  of arke against torch.

Shapes are the issue's: matmul 1024³, 2048³, 128×8192×2048 and 1×8192×2048 (decode,
``linear``), rmsnorm and softmax 4096×4096, causal GQA attention prefill (B=1, H=32, G=8,
S=T=512, D=64) and decode (S=1, T=4096). The LLVM code is still generic (no tiling or
packing yet), so large shapes can be slow: each kernel's timed rounds have a budget
(``--budget``, default 10 s), and the full run stays under ~5 minutes on 2 cores.
``--quick`` uses smaller shapes and short budgets and skips torch.compile (its first
compile alone takes ~20 s here): under a minute.

    .venv/bin/python benchmarks/cpu.py --quick
    .venv/bin/python benchmarks/cpu.py [--budget 10] [--only matmul] [--no-compile]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

# No OMP_WAIT_POLICY: arke's launches run on torch's own OpenMP team (spec/codegen.md §3), so torch's
# spinning workers pick up arke's chunks; passive waiting would make both wake their workers per region
# (measured: a torch linear 21 -> 128 µs, an arke launch 184 -> 338 µs).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Measurement, format_seconds, measure
from unit_peak import matrix_unit_peak

import arke
from arke.lang.checker import stdlib_path
from arke.runtime.peaks import fma_peak as fma_peak  # decoder benchmarks import it from here
from arke.targets.llvm.isa import INT8_UNITS

console = Console(width=None if sys.stdout.isatty() else 190)  # a wide table, also when piped

# ---------------------------------------------------------------- machine limits

#: the second target timed in the same rounds as llvm: linalg through IREE on this CPU
SECOND = "mlir"


def _sum_speed(data: torch.Tensor, budget_s: float) -> float:
    """Bytes/s of ``torch.sum`` over ``data`` (its best sample)."""
    result = measure({"sum": lambda: torch.sum(data)}, budget_s=budget_s, max_rounds=7)
    return data.numel() * data.element_size() / min(result["sum"].samples)


def read_bandwidth(nbytes: int, budget_s: float) -> float:
    """Bytes/s of ``torch.sum`` over an ``nbytes`` f32 array (its best sample), the better of an array on
    torch's memory and one on huge pages: Arke keeps models' weights on huge pages where the system gives
    them (``arke.runtime.hugepages``), and they read faster, so the machine's limit is the faster of the two.
    The arrays are made one at a time."""
    from arke.runtime import hugepages

    plain = _sum_speed(torch.ones(nbytes // 4, dtype=torch.float32), budget_s / 2)
    huge = _sum_speed(hugepages.buffer((nbytes // 4,), torch.float32, waste=1.0).fill_(1.0), budget_s / 2)
    return max(plain, huge)


@dataclass(frozen=True)
class Limits:
    flops: float  # FLOP/s
    bandwidth: float  # bytes/s
    threads: int
    unit: str = ""  # the bf16 matrix unit arke uses here (AMX, AVX512-BF16), "" if none
    unit_flops: float = 0.0  # its measured peak, FLOP/s (benchmarks/unit_peak.py)
    int8_unit: str = ""  # the int8 one (AMX-INT8), "" if none
    int8_ops: float = 0.0  # its measured peak, operations/s


# ---------------------------------------------------------------- kernels


@dataclass
class Bench:
    """One kernel on one shape: how to make its inputs, torch's version, and its work."""

    name: str
    shape: str
    module: str
    kernel: str
    make: Callable[[torch.Generator], tuple[Any, ...]]  # the arguments: tensors (and scalars, by position)
    torch_fn: Callable[..., torch.Tensor]
    flops: float = 0.0  # useful floating-point operations (compute-bound kernels)
    nbytes: float = 0.0  # bytes that must move at least once (memory-bound kernels)
    tol: float = 1e-4  # the check: max |arke - torch| / max |torch| (bf16 results: one bf16 rounding)
    unit: str = ""  # compute-bound on a matrix unit ("bf16", "int8"): a % of its peak, not of the FMA peak
    llvm_only: str = ""  # why only the llvm target runs it (its inputs are in a layout only llvm reads)

    @property
    def bound(self) -> str:
        return "compute" if self.flops else "memory"


def randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float32)


def matmul(m: int, k: int, n: int) -> Bench:
    return Bench(f"matmul {m}×{k}×{n}" if len({m, k, n}) > 1 else f"matmul {m}³", f"[{m},{k}]@[{k},{n}]",
                 "std.nn", "matmul", lambda g: (randn(g, m, k), randn(g, k, n)), torch.matmul, flops=2.0 * m * k * n)


def decode_linear(k: int, n: int) -> Bench:
    return Bench(f"linear 1×{k}×{n} (decode)", f"[1,{k}]·[{n},{k}]ᵀ", "std.nn", "linear",
                 lambda g: (randn(g, 1, k), randn(g, n, k)), F.linear, nbytes=4.0 * (n * k + k + n))


def decode_linear_int8(k: int, n: int) -> Bench:
    """Weight-only int8 (one f32 scale per output channel): torch's own CPU kernel for it is
    ``torch._weight_int8pack_mm`` (what gpt-fast uses); the bytes are the int8 weights."""
    def make(g: torch.Generator) -> tuple[torch.Tensor, ...]:
        w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
        return randn(g, 1, k), w, torch.rand(n, generator=g) / 127

    return Bench(f"linear int8 1×{k}×{n} (decode)", f"[1,{k}]·i8[{n},{k}]ᵀ·s[{n}]", "std.nn", "linear_int8", make,
                 torch._weight_int8pack_mm, nbytes=1.0 * n * k + 4.0 * (k + 2 * n))


def decode_linear_bf16(k: int, n: int) -> Bench:
    def make(g: torch.Generator) -> tuple[torch.Tensor, ...]:
        return randn(g, 1, k).bfloat16(), randn(g, n, k).bfloat16()

    return Bench(f"linear bf16 1×{k}×{n} (decode)", f"bf16 [1,{k}]·[{n},{k}]ᵀ", "std.nn", "linear_bf16", make,
                 F.linear, nbytes=2.0 * (n * k + k + n), tol=1e-2)


def packed(w: torch.Tensor) -> torch.Tensor:
    """``w`` packed once into the panels this host's matrix-unit kernels read in place (``w`` itself where none)."""
    from arke.targets import base

    found = base.get("llvm").pack_weight(w)
    return w if found is None else found


def linear_bf16(m: int, k: int, n: int, prepack: bool = False) -> Bench:
    """bf16 activations and weights, f32 sums, a bf16 result: torch's is oneDNN on the same unit.
    ``prepack``: the weight packed once into VNNI panels (as a model's are), not on every call."""
    plain: dict[str, torch.Tensor] = {}

    def make(g: torch.Generator) -> tuple[torch.Tensor, ...]:
        x, plain["w"] = randn(g, m, k).bfloat16(), randn(g, n, k).bfloat16()
        return x, packed(plain["w"]) if prepack else plain["w"]

    def ref(x: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
        return F.linear(x, plain["w"])

    return Bench(f"linear bf16 {m}×{k}×{n}" + (" prepacked" if prepack else ""), f"bf16 [{m},{k}]·[{n},{k}]ᵀ",
                 "std.nn", "linear_bf16", make, ref, flops=2.0 * m * k * n, tol=1e-2, unit="bf16",
                 llvm_only="the weight is in llvm's VNNI panels" if prepack else "")


def linear_w8a8(m: int, k: int, n: int) -> Bench:
    """int8 activations (per-row scales) × int8 weights (per-channel scales), against torch's bf16 linear of
    the same (dequantised) values: the issue's comparison. Its rate is a % of the int8 unit's peak
    (twice the bf16 one on AMX: ``TDPBSSD`` does 64 products per 32-bit lane pair where ``TDPBF16PS`` does 32)."""
    bf16: dict[str, torch.Tensor] = {}

    def make(g: torch.Generator) -> tuple[torch.Tensor, ...]:
        x = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
        w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
        sx, sw = torch.rand(m, generator=g) / 127, torch.rand(n, generator=g) / 127
        bf16["x"], bf16["w"] = (x * sx[:, None]).bfloat16(), (w * sw[:, None]).bfloat16()
        return x, sx, w, sw

    def ref(*_: torch.Tensor) -> torch.Tensor:
        return F.linear(bf16["x"], bf16["w"])

    return Bench(f"linear w8a8 {m}×{k}×{n}", f"i8 [{m},{k}]·i8[{n},{k}]ᵀ vs bf16", "std.nn", "linear_w8a8", make, ref,
                 flops=2.0 * m * k * n, tol=2e-2, unit="int8")


def rmsnorm(m: int, n: int) -> Bench:
    def ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (n,), w, 1e-6)

    return Bench(f"rmsnorm {m}×{n}", f"[{m},{n}]", "std.nn", "rmsnorm", lambda g: (randn(g, m, n), randn(g, n)),
                 ref, nbytes=4.0 * (2 * m * n + n))


def softmax(m: int, n: int) -> Bench:
    def ref(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, -1)

    return Bench(f"softmax {m}×{n}", f"[{m},{n}]", "std.nn", "softmax", lambda g: (randn(g, m, n),), ref,
                 nbytes=8.0 * m * n)


def attention(h: int, g_: int, s: int, t: int, d: int) -> Bench:
    """Causal GQA attention (bottom-right mask). S = 1 is decode: the query sees every key."""
    def ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=s > 1, enable_gqa=True)

    def make(g: torch.Generator) -> tuple[torch.Tensor, ...]:
        return randn(g, 1, h, s, d), randn(g, 1, g_, t, d), randn(g, 1, g_, t, d)

    visible = sum(min(t, i + t - s + 1) for i in range(s))  # (query, key) pairs the mask keeps
    label = "decode" if s == 1 else "prefill"
    shape = f"B=1 H={h} G={g_} S={s} T={t} D={d}"
    if s == 1:
        return Bench(f"attention {label}", shape, "std.attention", "causal_attention", make, ref,
                     nbytes=4.0 * (2 * g_ * t * d + 2 * h * d))
    return Bench(f"attention {label}", shape, "std.attention", "causal_attention", make, ref,
                 flops=4.0 * h * d * visible)


def attention_bf16(h: int, g_: int, s: int, d: int) -> Bench:
    """Causal GQA prefill on bf16 q, k, v (``std.decoder.attn_cached_h``: f32 softmax statistics, a bf16
    result) against torch's SDPA in bf16, as a % of the bf16 matrix unit's peak."""
    def make(g: torch.Generator) -> tuple[Any, ...]:
        return (randn(g, 1, s, h, d).bfloat16(), randn(g, 1, g_, s, d).bfloat16(), randn(g, 1, g_, s, d).bfloat16(),
                s)

    def ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, _: int) -> torch.Tensor:
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True, enable_gqa=True)
        return out.transpose(1, 2)

    visible = s * (s + 1) // 2
    return Bench("attention bf16 prefill", f"B=1 H={h} G={g_} S=T={s} D={d}", "std.decoder", "attn_cached_h", make,
                 ref, flops=4.0 * h * d * visible, tol=2e-2, unit="bf16")


def benches(quick: bool) -> list[Bench]:
    if quick:
        return [matmul(256, 256, 256), matmul(512, 512, 512), matmul(32, 2048, 512), decode_linear(4096, 1024),
                decode_linear_int8(4096, 1024), decode_linear_bf16(4096, 1024), linear_bf16(256, 512, 512),
                rmsnorm(1024, 1024),
                softmax(1024, 1024), attention(32, 8, 128, 128, 64), attention_bf16(8, 2, 128, 64),
                attention(32, 8, 1, 1024, 64)]
    return [matmul(1024, 1024, 1024), matmul(2048, 2048, 2048), matmul(128, 8192, 2048), decode_linear(8192, 2048),
            decode_linear_int8(8192, 2048), decode_linear_bf16(8192, 2048), linear_bf16(2048, 2048, 2048),
            linear_bf16(128, 2048, 8192), linear_bf16(512, 2048, 2048), linear_bf16(2048, 2048, 2048, True),
            linear_bf16(128, 2048, 8192, True), linear_w8a8(128, 2048, 8192),
            linear_w8a8(2048, 2048, 2048),
            rmsnorm(4096, 4096), softmax(4096, 4096), attention(32, 8, 512, 512, 64), attention_bf16(32, 8, 512, 64),
            attention(32, 8, 1, 4096, 64)]


# ---------------------------------------------------------------- running


@dataclass
class Row:
    bench: Bench
    times: dict[str, Measurement] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # candidate -> why it has no time
    error: float = math.nan  # max |arke - torch| / max |torch|
    mlir_error: float = math.nan  # the same for the mlir target (through IREE)
    build_s: float = 0.0  # arke's compile
    mlir_build_s: float = 0.0  # the mlir target's compile (iree-compile)
    compile_s: float = 0.0  # torch.compile's first call


@dataclass
class CompileBudget:
    enabled: bool
    reason: str
    left_s: float


_LIBS: dict[tuple[str, str, str], Any] = {}


def library(module: str, target: str = "llvm", tuning: str = "off") -> Any:
    """The stdlib module built for ``target``: its defaults (``tuning="off"``: the arke column), or with the
    strategies ``akc tune`` confirmed on this machine (``"on"``: the tuned column)."""
    if (module, target, tuning) not in _LIBS:
        _LIBS[module, target, tuning] = arke.build(stdlib_path(module), target=target, tuning=tuning)
    return _LIBS[module, target, tuning]


def mlir_available() -> str | None:
    """None when the mlir target can run here, else why not (IREE missing), as the target says."""
    from arke.targets import base as targets

    return targets.get(SECOND).unavailable()


def short(err: BaseException) -> str:
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first[:90]}"


def specialised(kernel: Any, args: tuple[Any, ...]) -> Any:
    """A generic kernel's specialisation for these arguments (the one a call would pick), else ``kernel``."""
    from arke.library import GenericKernel
    from arke.runtime.generics import pick

    return kernel.member(pick(kernel.generic, args, {})) if isinstance(kernel, GenericKernel) else kernel


def _dims_of(kernel: Any, shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """The kernel's dims bound by these argument shapes (for the hint of how to tune a row)."""
    from arke.runtime.guards import check_call

    try:
        return dict(check_call(kernel.function, shapes))
    except Exception:  # a hint only
        return {}


def run_bench(bench: Bench, budget_s: float, compiling: CompileBudget, mlir: str | None) -> Row:
    row = Row(bench)
    args = bench.make(torch.Generator().manual_seed(0))
    kernel = specialised(library(bench.module).kernels[bench.kernel], args)
    names = [p.name for p in kernel.library.module.semantic.get(kernel.ir_name).params]
    start = time.perf_counter()
    shapes = {n: tuple(a.shape) for n, a in zip(names, args) if isinstance(a, torch.Tensor)}
    dims = _dims_of(kernel, shapes)
    kernel.variant(kernel.choose(dims))  # compile outside the timing
    row.build_s = time.perf_counter() - start
    candidates: dict[str, Callable[[], object]] = {"arke": lambda: kernel(*args),
                                                   "torch": lambda: bench.torch_fn(*args)}
    tuned = specialised(library(bench.module, tuning="on").kernels[bench.kernel], args)
    if tuned.choose(dims) >= 0:  # a strategy akc tune confirmed for this bucket on this machine
        tuned.variant(tuned.choose(dims))
        candidates["tuned"] = lambda: tuned(*args)
    else:
        row.notes["tuned"] = (f"not tuned here: akc tune {stdlib_path(bench.module)} --kernel {bench.kernel} "
                              f"--dims " + ",".join(f"{k}={v}" for k, v in dims.items()))
    if mlir is None and bench.llvm_only:
        mlir = bench.llvm_only
    if mlir is not None:
        row.notes["mlir"] = mlir
    else:
        on_iree = specialised(library(bench.module, "mlir").kernels[bench.kernel], args)
        start = time.perf_counter()
        try:
            on_iree.variant(on_iree.choose(dims))
            candidates["mlir"] = lambda: on_iree(*args)
        except Exception as err:  # a report, never a crash: the row says why
            row.notes["mlir"] = short(err)
        row.mlir_build_s = time.perf_counter() - start
    if not compiling.enabled:
        row.notes["torch.compile"] = compiling.reason
    elif compiling.left_s <= 0:
        row.notes["torch.compile"] = "compile budget spent (--compile-budget)"
    else:
        start = time.perf_counter()
        try:
            compiled = torch.compile(bench.torch_fn, dynamic=False)
            compiled(*args)
            candidates["torch.compile"] = lambda: compiled(*args)
        except Exception as err:  # any failure of the optional competitor is a note, never a crash
            row.notes["torch.compile"] = short(err)
        row.compile_s = time.perf_counter() - start
        compiling.left_s -= row.compile_s
    got, want = kernel(*args), bench.torch_fn(*args)
    row.error = relative_error(got, want)
    if SECOND in candidates:
        row.mlir_error = relative_error(on_iree(*args), want)
    row.times = measure(candidates, budget_s=budget_s)
    return row


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30))


# ---------------------------------------------------------------- report


def rate(bench: Bench, seconds: float) -> str:
    return f"{bench.flops / seconds / 1e9:.1f} GFLOP/s" if bench.flops else f"{bench.nbytes / seconds / 1e9:.1f} GB/s"


def of_limit(bench: Bench, seconds: float, limits: Limits) -> str:
    if bench.unit == "bf16" and limits.unit_flops:
        return f"{bench.flops / seconds / limits.unit_flops * 100:.1f}% ({limits.unit})"
    if bench.unit == "int8" and limits.int8_ops:
        return f"{bench.flops / seconds / limits.int8_ops * 100:.1f}% ({limits.int8_unit})"
    fraction = bench.flops / seconds / limits.flops if bench.flops else bench.nbytes / seconds / limits.bandwidth
    return f"{fraction * 100:.1f}%"


def ratio(row: Row, other: str, of: str = "arke") -> str:
    if of not in row.times or other not in row.times:
        return "n/a"
    value = row.times[of].median / row.times[other].median
    return f"{value:.2f}×" + (" (re-measured)" if row.times[of].rechecked and other == "torch" else "")


def report(rows: list[Row], limits: Limits, quick: bool, wall_s: float) -> None:
    table = Table(title=f"arke (llvm) vs torch on this CPU{' — quick shapes' if quick else ''}", show_lines=False)
    for column, justify in [("kernel", "left"), ("shape", "left"), ("arke", "right"), ("torch", "right"),
                            ("torch.compile", "right"), ("tuned", "right"), ("arke/torch", "right"),
                            ("arke/compile", "right"), ("tuned/arke", "right"),
                            ("arke rate", "right"), ("arke % limit", "right"), ("torch % limit", "right"),
                            ("rounds", "right"), ("check", "left")]:
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        b, t = row.bench, row.times
        cells = [t[c].summary() if c in t else "n/a" for c in ("arke", "torch", "torch.compile", "tuned")]
        check = "ok" if row.error < b.tol else f"[red]MISMATCH {row.error:.1e}[/red]"
        table.add_row(b.name, b.shape, *cells, ratio(row, "torch"), ratio(row, "torch.compile"),
                      ratio(row, "arke", "tuned"),
                      rate(b, t["arke"].median), of_limit(b, t["arke"].median, limits),
                      of_limit(b, t["torch"].median, limits), str(len(t["arke"].samples)), f"{check} ({row.error:.0e})")
    console.print(table)
    mlir_table(rows, limits)
    console.print(f"limits: FMA peak {limits.flops / 1e9:.0f} GFLOP/s on {limits.threads} threads, read bandwidth "
                  f"{limits.bandwidth / 1e9:.1f} GB/s"
                  + (f", bf16 {limits.unit} peak {limits.unit_flops / 1e9:.0f} GFLOP/s" if limits.unit else "")
                  + (f", int8 {limits.int8_unit} peak {limits.int8_ops / 1e9:.0f} GOP/s" if limits.int8_unit else "")
                  + ". Compute-bound rows are % of the FMA peak (bf16 linear rows: of the matrix unit's), memory-bound "
                  "rows % of the read bandwidth. Ratios below 1× mean arke is faster. Times: median ± interquartile "
                  "range, over interleaved rounds.")
    builds = ", ".join(f"{r.bench.name} {format_seconds(r.build_s)}" for r in rows if r.build_s > 1e-3)
    mlir_builds = ", ".join(f"{r.bench.name} {format_seconds(r.mlir_build_s)}" for r in rows if r.mlir_build_s > 1e-3)
    if mlir_builds:
        console.print(f"mlir build per kernel (iree-compile or on-disk cache load, outside the timings): {mlir_builds}")
    console.print(f"arke build per kernel (compile or on-disk cache load, outside the timings): {builds}")
    if any(r.compile_s for r in rows):
        spent = sum(r.compile_s for r in rows)
        console.print(f"torch.compile first calls (outside the timings): {format_seconds(spent)} in all")
    if quick:
        console.print("quick shapes fit in the caches: memory-bound rows may exceed 100% of the DRAM read bandwidth.")
    reasons: dict[str, list[str]] = {}
    for r in rows:
        for candidate, why in r.notes.items():
            reasons.setdefault(f"{candidate} n/a: {why}", []).append(r.bench.name)
    for why, names in reasons.items():
        console.print(f"{why} — {'every kernel' if len(names) == len(rows) else ', '.join(names)}")
    console.print(f"threads: arke {library('std.nn').threads}, torch {torch.get_num_threads()} "
                  f"(OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}); whole run {wall_s:.0f} s")


def mlir_table(rows: list[Row], limits: Limits) -> None:
    """The mlir target (linalg through IREE's llvm-cpu), timed in the same interleaved rounds."""
    if not any(SECOND in r.times for r in rows):
        return
    table = Table(title="mlir target (IREE llvm-cpu) in the same rounds", show_lines=False)
    for column in ("kernel", "shape", "mlir", "mlir/arke", "mlir/torch", "mlir/compile", "mlir rate",
                   "mlir % limit", "check"):
        table.add_column(column, justify="left" if column in ("kernel", "shape", "check") else "right")
    for row in rows:
        b, t = row.bench, row.times
        if SECOND not in t:
            table.add_row(b.name, b.shape, "n/a", "", "", "", "", "", row.notes.get("mlir", ""))
            continue
        check = "ok" if row.mlir_error < b.tol else f"[red]MISMATCH {row.mlir_error:.1e}[/red]"
        table.add_row(b.name, b.shape, t["mlir"].summary(), ratio(row, "arke", "mlir"), ratio(row, "torch", "mlir"),
                      ratio(row, "torch.compile", "mlir"), rate(b, t["mlir"].median),
                      of_limit(b, t["mlir"].median, limits), f"{check} ({row.mlir_error:.0e})")
    console.print(table)
    console.print("mlir/arke above 1× means the mlir target is slower than arke's llvm target.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes, short budgets, no torch.compile (<1 min)")
    parser.add_argument("--budget", type=float, help="seconds of timed rounds per kernel (default 10, --quick 2.5)")
    parser.add_argument("--compile", dest="compile", action="store_true", default=None,
                        help="time torch.compile even with --quick")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile")
    parser.add_argument("--compile-budget", type=float, default=150.0,
                        help="seconds torch.compile may spend compiling, all kernels together (default 150)")
    parser.add_argument("--only", help="run only kernels whose name contains this text")
    parser.add_argument("--no-mlir", action="store_true", help="skip the mlir target (IREE) column")
    args = parser.parse_args(argv)
    quick = bool(args.quick)
    budget = args.budget if args.budget is not None else (2.5 if quick else 10.0)
    use_compile = args.compile if args.compile is not None else not quick
    reason = "skipped by --quick (a first compile takes ~20 s here; --compile forces it)" if quick else "--no-compile"
    compiling = CompileBudget(use_compile, reason, args.compile_budget)
    started = time.perf_counter()
    mlir = "--no-mlir" if args.no_mlir else mlir_available()

    threads = library("std.nn").threads
    console.print(f"measuring this machine's limits on {threads} threads …")
    unit, unit_flops = matrix_unit_peak(threads, 0.2 if quick else 0.5)
    int8_unit, int8_ops = matrix_unit_peak(threads, 0.2 if quick else 0.5, INT8_UNITS)
    limits = Limits(fma_peak(threads, 0.2 if quick else 0.5),
                    read_bandwidth((256 if quick else 1024) << 20, 1.0 if quick else 3.0), threads, unit, unit_flops,
                    int8_unit, int8_ops)
    console.print(f"  FMA peak {limits.flops / 1e9:.0f} GFLOP/s, read bandwidth {limits.bandwidth / 1e9:.1f} GB/s"
                  + (f", {unit} peak {unit_flops / 1e9:.0f} GFLOP/s" if unit else ", no bf16 matrix unit"))
    rows = []
    for bench in benches(quick):
        if args.only and args.only not in bench.name:
            continue
        console.print(f"{bench.name} ({bench.shape}) …")
        try:
            rows.append(run_bench(bench, budget, compiling, mlir))
        except Exception as err:  # a report never fails: say what broke and go on
            console.print(f"  [red]failed: {short(err)}[/red]")
    report(rows, limits, quick, time.perf_counter() - started)
    if not args.only or args.only in "launch overhead":
        from launch import launch_table

        console.print(launch_table(1.0 if quick else 2.0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
