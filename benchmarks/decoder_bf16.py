"""A decoder layer on bf16 activations: arke's half layer against transformers' layer run in bf16.

A report, not a test: the timings never fail anything. One run on one machine:

* **limits** — this machine's bf16 matrix-unit peak (AMX or AVX512-BF16, ``benchmarks/unit_peak.py``;
  the f32 FMA peak where it has none) and its read bandwidth, measured in the same run;
* **prefill** — the Llama-3.2-1B-shaped layer of ``benchmarks/decoder.py`` (hidden 2048, MLP 8192,
  32 heads, 8 KV heads of 64), random weights, on T = 128 and 512 tokens (batch 1): arke's
  :class:`~arke.models.layer_half.HalfLayer` (``from_transformers(..., dtype=torch.bfloat16)``),
  transformers' layer in bf16 in torch eager (sdpa attention) and under ``torch.compile``; each
  as GFLOP/s and % of the unit peak;
* **decode** — one token at context 512: the same three, and the bandwidth bound (bf16 weights
  plus the bf16 KV cache a step reads / read bandwidth, a ``torch.sum`` over as many bytes timed
  in the same rounds).

Every configuration is checked once: max |arke - transformers bf16| / max |transformers bf16|, which
must stay within a few units in the last place of bf16 (the residual sum rounds at the scale of
``x``, so the f32 benchmark's "relative to the layer's update" measure would see bf16's own
rounding). A failed check or a configuration that fails to run makes the exit status 1.

    .venv/bin/python benchmarks/decoder_bf16.py              # ~1 min on 2 cores, + cold torch.compile
    .venv/bin/python benchmarks/decoder_bf16.py --quick      # tiny shapes, no torch.compile (seconds)
    .venv/bin/python benchmarks/decoder_bf16.py [--budget 12] [--no-compile]
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu import fma_peak, read_bandwidth
from decoder import (
    FULL,
    QUICK,
    CompileState,
    Sizes,
    Targets,
    console,
    first_compiled_call,
    prefill_flops,
    ratio,
    times,
)
from timing import Measurement, format_seconds, measure
from unit_peak import matrix_unit_peak

PREFILL_VS_EAGER = 1.3  # the targets: prefill vs transformers bf16 eager ...
PREFILL_VS_COMPILE = 1.0  # ... and vs torch.compile
DECODE_BOUND = 1.25  # decode within this factor of its bandwidth bound
TOLERANCE = 4 * 2.0 ** -8  # max |arke - transformers bf16| / max |transformers bf16|: 4 ulp of the largest
BF16 = torch.bfloat16


def make_layer(sizes: Sizes) -> tuple[Any, Any, Any]:
    """transformers' Llama-shaped layer in bf16 (matrices N(0, 0.02)), its rotary embedding, its config."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = LlamaConfig(**sizes.llama)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    layer = LlamaDecoderLayer(config, 0).eval()
    with torch.no_grad():
        for p in layer.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.02)
    return layer.to(BF16), LlamaRotaryEmbedding(config), config


def update_error(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor) -> float:
    """max |got - want| / max |want| (``x``, the input, is not subtracted: see the module docstring)."""
    got, want = got.float(), want.float()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def compiled_candidate(forward: Any, call: Callable[[Any], Any], compiling: CompileState,
                       candidates: dict[str, Callable[[], object]], notes: list[str]) -> None:
    """torch.compile's first call outside the timings, then a candidate (a failure is a note)."""
    if forward is None:
        notes.append(f"torch.compile: {compiling.reason}")
        return
    note, _ = first_compiled_call(forward, call, compiling, candidates)
    if note:
        notes.append(f"torch.compile: {note}")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables; 1 when a configuration failed or a check mismatched, else 0."""
    import arke.models

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, short budgets, no torch.compile")
    parser.add_argument("--budget", type=float, help="seconds of timed rounds per row (default 12, --quick 0.15)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    budget = args.budget if args.budget is not None else sizes.budget_s
    use_compile = not (args.quick or args.no_compile)
    compiling = CompileState(use_compile, "skipped by --quick" if args.quick else "skipped (--no-compile)")
    console.print(f"command: {shlex.join([sys.executable, str(Path(__file__)), *argv])}")
    threads = torch.get_num_threads()
    unit, peak = matrix_unit_peak(threads, 0.2 if args.quick else 0.5)
    if not unit:
        unit, peak = "f32 FMA", fma_peak(threads, sizes.fma_s)
    bandwidth = read_bandwidth(sizes.bandwidth_bytes, sizes.bandwidth_s)
    console.print(f"limits on {threads} threads: {unit} peak {peak / 1e9:.0f} GFLOP/s, read bandwidth "
                  f"{bandwidth / 1e9:.1f} GB/s")
    layer, rotary, config = make_layer(sizes)
    start = time.perf_counter()
    half = arke.models.from_transformers(layer, config, max_seq=sizes.max_seq, dtype=BF16)
    build_s = time.perf_counter() - start
    forward = torch.compile(layer.forward, dynamic=False) if use_compile else None
    targets, failures, notes = Targets(), [], []
    prefill = Table(title=f"prefill (batch 1, empty cache), bf16 activations: arke vs transformers' layer in bf16; "
                          f"% of the measured {unit} peak")
    for column in ("T", "arke", "torch bf16 eager", "torch.compile", "× vs eager", "target", "× vs compile",
                   "target", "arke GFLOP/s", f"% {unit} peak", "torch % peak", "check"):
        prefill.add_column(column, justify="left" if column in ("target", "check") else "right")
    with torch.no_grad():
        for t in sizes.prefill:
            console.print(f"prefill {t} …")
            try:
                x = torch.randn(1, t, config.hidden_size, generator=torch.Generator().manual_seed(t)).to(BF16)
                positions = torch.arange(t).unsqueeze(0)
                cos, sin = rotary(x, positions)
                pe = (cos.to(BF16), sin.to(BF16))
                cache = half.new_cache()

                def arke_call(x: torch.Tensor = x, positions: torch.Tensor = positions, cache: Any = cache) -> Any:
                    cache.length = 0
                    return half(x, positions, cache)

                def hf(f: Any, x: torch.Tensor = x, positions: torch.Tensor = positions,
                       pe: tuple[torch.Tensor, torch.Tensor] = pe) -> Any:
                    return f(x, position_embeddings=pe, position_ids=positions)

                err = update_error(arke_call(), hf(layer), x)
                cands: dict[str, Callable[[], object]] = {"arke": arke_call, "torch": lambda hf=hf: hf(layer)}
                compiled_candidate(forward, hf, compiling, cands, notes)
                m = measure(cands, budget_s=budget)
            except Exception as err_:  # a report goes on: say what broke, exit 1 at the end
                failures.append(f"prefill {t}: {type(err_).__name__}: {err_}")
                continue
            flops = prefill_flops(config, t)
            eager, comp = (m["torch"].median / m["arke"].median,
                           m["torch.compile"].median / m["arke"].median if "torch.compile" in m else math.nan)
            rate = flops / m["arke"].median
            ok = err <= TOLERANCE
            failures += [] if ok else [f"prefill {t}: check {err:.1e} > {TOLERANCE}"]
            prefill.add_row(str(t), times(m["arke"]), times(m["torch"]), times(m.get("torch.compile")), ratio(eager),
                            targets.judge(f"bf16 prefill {t} vs eager", eager >= PREFILL_VS_EAGER,
                                          f"≥ {PREFILL_VS_EAGER}×"),
                            ratio(comp), targets.judge(f"bf16 prefill {t} vs torch.compile",
                                                       None if math.isnan(comp) else comp >= PREFILL_VS_COMPILE,
                                                       f"≥ {PREFILL_VS_COMPILE}×"),
                            f"{rate / 1e9:.0f}", f"{rate / peak * 100:.1f}%",
                            f"{flops / m['torch'].median / peak * 100:.1f}%",
                            f"ok ({err:.0e})" if ok else f"[red]MISMATCH ({err:.1e})[/red]")
        decode = decode_table(half, layer, rotary, config, sizes, budget, bandwidth, compiling, forward, targets,
                              failures, notes)
    console.print(prefill)
    if decode is not None:
        console.print(decode)
    console.print(f"arke build (compile or cache load, weight conversion; outside the timings): "
                  f"{format_seconds(build_s)}; dispatches at prefill {sizes.prefill[-1]}: "
                  f"{'; '.join(half.dispatches(1, sizes.prefill[-1]))}")
    console.print("Times: median ± interquartile range over interleaved rounds (benchmarks/timing.py); × = torch time "
                  "/ arke time. check: max |arke − transformers bf16| / max |transformers bf16|, tolerance "
                  f"{TOLERANCE:g}. transformers: sdpa attention, (cos, sin) precomputed outside the timing.")
    for note in sorted(set(notes)):
        console.print(f"n/a — {note}")
    total = len(targets.met) + len(targets.missed)
    console.print(f"targets met: {len(targets.met)} of {total}"
                  + (f"; missed: {', '.join(targets.missed)}" if targets.missed else ""))
    for problem in failures:
        console.print(f"[red]{problem}[/red]")
    return 1 if failures else 0


def decode_table(half: Any, layer: Any, rotary: Any, config: Any, sizes: Sizes, budget: float, bandwidth: float,
                 compiling: CompileState, forward: Any, targets: Targets, failures: list[str],
                 notes: list[str]) -> Table | None:
    """One token after ``sizes.low_bit_context`` cached ones: arke, eager, torch.compile, the bandwidth bound."""
    from transformers import DynamicCache

    context = sizes.low_bit_context
    console.print(f"decode at {context} …")
    g = torch.Generator().manual_seed(context)
    shape = (1, int(config.num_key_value_heads), context, int(config.head_dim))
    keys, values = torch.randn(*shape, generator=g).to(BF16), torch.randn(*shape, generator=g).to(BF16)
    x = torch.randn(1, 1, int(config.hidden_size), generator=g).to(BF16)
    positions = torch.tensor([[context]])
    cos, sin = rotary(x, positions)
    pe = (cos.to(BF16), sin.to(BF16))
    hf_cache = DynamicCache()
    hf_cache.update(keys, values, 0)
    slot = hf_cache.layers[0]

    def hf(f: Any) -> Any:
        slot.keys, slot.values = keys, values
        return f(x, position_embeddings=pe, position_ids=positions, cache=hf_cache)

    cache = half.new_cache()
    cache.k[:, :, :context].copy_(keys)
    cache.v[:, :, :context].copy_(values)

    def arke_call() -> Any:
        cache.length = context
        return half(x, positions, cache)

    try:
        err = update_error(arke_call(), hf(layer), x)
        cands: dict[str, Callable[[], object]] = {"arke": arke_call, "torch": lambda: hf(layer)}
        compiled_candidate(forward, hf, compiling, cands, notes)
        step_bytes = half.weight_bytes + 2 * keys.numel() * keys.element_size()
        data = torch.ones(step_bytes // 4)
        cands["read"] = lambda: torch.sum(data)
        m: dict[str, Measurement] = measure(cands, budget_s=budget)
    except Exception as err_:  # a report goes on
        failures.append(f"decode {context}: {type(err_).__name__}: {err_}")
        return None
    table = Table(title=f"decode: one token at context {context} (batch 1), bf16; bound = bf16 weight and KV bytes "
                        "/ read bandwidth (torch.sum over as many bytes, in the same rounds)")
    for column in ("context", "arke", "torch bf16 eager", "torch.compile", "× vs eager", "× vs compile",
                   "bytes read", "bound", "arke / bound", "target", "check"):
        table.add_column(column, justify="left" if column in ("target", "check") else "right")
    bound = m["read"].median
    within = m["arke"].median / bound
    comp = m["torch.compile"].median / m["arke"].median if "torch.compile" in m else math.nan
    ok = err <= TOLERANCE
    failures += [] if ok else [f"decode {context}: check {err:.1e} > {TOLERANCE}"]
    table.add_row(str(context), times(m["arke"]), times(m["torch"]), times(m.get("torch.compile")),
                  ratio(m["torch"].median / m["arke"].median), ratio(comp), f"{step_bytes / 1e6:.1f} MB",
                  format_seconds(bound), f"{within:.2f}× (read {step_bytes / bound / 1e9:.1f} GB/s; measured "
                  f"{bandwidth / 1e9:.1f})",
                  targets.judge(f"bf16 decode {context} bound", within <= DECODE_BOUND, f"≤ {DECODE_BOUND}×"),
                  f"ok ({err:.0e})" if ok else f"[red]MISMATCH ({err:.1e})[/red]")
    return table


if __name__ == "__main__":
    sys.exit(main())
