"""Whole decoder layers: arke's compiled layer (llvm target) against transformers' own, eager and torch.compile.

A report, not a test: the timings never fail anything. One run on one machine:

* **limits** — this machine's vector-FMA peak and read bandwidth, measured in the same run
  (``benchmarks/cpu.py``'s probes);
* **prefill** — a Llama-3.2-1B-shaped ``LlamaDecoderLayer`` (hidden 2048, MLP 8192, 32 heads,
  8 KV heads of 64, llama3 rope) in f32 with random weights, on T = 128 and 512 tokens
  (batch 1): arke, the transformers layer in torch eager (sdpa attention) and under
  ``torch.compile``; the speedups torch time / arke time;
* **decode** — one token at context 512 and 2048: the same three, plus the bandwidth bound
  (the bytes of the weights a step reads / the measured read bandwidth) and arke's ratio to it;
  the bf16- and int8-weight layers at context 512 against torch's f32 eager step;
* **memory** — each call shape's arena against its largest set of live buffers, and the KV cache;
* **moe** — a small Mixtral-shaped layer (hidden 1024, 8 experts of 3584, top 2): prefill 128
  and decode at 512 against eager and torch.compile.

Every configuration is also checked once: max |arke - transformers| over max |transformers - x|,
the layer's own update (the residual ``x`` would otherwise hide most errors). A failed check or
a configuration that fails to run makes the exit status 1.

The transformers layer gets what its model would give it: the rotary ``(cos, sin)`` computed
once outside the timing (the model shares them between layers; arke's layer computes its own
from the positions), ``attention_mask=None`` (sdpa's causal mask), and for decode a
``DynamicCache`` holding the context, reset before each call (its ``torch.cat`` append is part
of the step, as in a real generation); a Mixtral layer's experts run as ``from_pretrained``
would pick here (``grouped_mm``). arke's cache is preallocated: each decode call sets
``cache.length`` back to the context and appends the token. The machine's limits are measured
at the start and the end of the run and the better of each is used (other tenants come and go).

    .venv/bin/python benchmarks/decoder.py              # full run: ~1 min on 2 cores, +~1 min cold torch.compile
    .venv/bin/python benchmarks/decoder.py --quick      # tiny shapes, no torch.compile (seconds)
    .venv/bin/python benchmarks/decoder.py [--only prefill|decode|moe] [--budget 12] [--no-compile]
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu import Limits, fma_peak, library, read_bandwidth, short
from timing import Measurement, format_seconds, measure

console = Console(width=None if sys.stdout.isatty() else 190)

SECTIONS = ("prefill", "decode", "moe")
LOW_BITS = ("bf16", "int8")

# The targets.
PREFILL_VS_EAGER = 1.3  # arke prefill at least this much faster than torch eager
PREFILL_VS_COMPILE = 1.0  # ... and than torch.compile
DECODE_BOUND = 1.25  # f32 decode within this factor of its bandwidth bound
LOW_BIT_SPEEDUP = {"bf16": 2.5, "int8": 4.0}  # vs torch's f32 eager decode step
WORKSPACE = 2.0  # arena at most this many times the largest live set

#: max |arke - transformers| / max |transformers - x| allowed, per arke weight kind.
TOLERANCE = {"f32": 1e-3, "bf16": 3e-2, "int8": 1e-1}


# ---------------------------------------------------------------- sizes


@dataclass(frozen=True)
class Sizes:
    """What one run measures: the two layers' shapes, the token counts, budgets."""

    llama: dict[str, Any]  # LlamaConfig keyword arguments
    moe: dict[str, Any]  # MixtralConfig keyword arguments
    prefill: tuple[int, ...]  # prefill token counts (Llama)
    contexts: tuple[int, ...]  # decode contexts (Llama, f32)
    low_bit_context: int  # decode context of the bf16 / int8 rows
    moe_prefill: int
    moe_context: int
    max_seq: int
    budget_s: float  # timed rounds per row
    fma_s: float
    bandwidth_bytes: int
    bandwidth_s: float


def _llama3_rope(original: int) -> dict[str, Any]:
    return {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": original}


FULL = Sizes(
    llama={"hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32, "num_key_value_heads": 8,
           "head_dim": 64, "rope_theta": 500000.0, "rope_scaling": _llama3_rope(8192),
           "max_position_embeddings": 131072, "rms_norm_eps": 1e-5},
    moe={"hidden_size": 1024, "intermediate_size": 3584, "num_attention_heads": 16, "num_key_value_heads": 8,
         "head_dim": 64, "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None,
         "max_position_embeddings": 4096, "rms_norm_eps": 1e-5},
    prefill=(128, 512), contexts=(512, 2048), low_bit_context=512, moe_prefill=128, moe_context=512,
    max_seq=4096, budget_s=12.0, fma_s=0.5, bandwidth_bytes=1 << 30, bandwidth_s=3.0)

QUICK = Sizes(
    llama={"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2,
           "head_dim": 32, "rope_theta": 500000.0, "rope_scaling": _llama3_rope(64),
           "max_position_embeddings": 2048, "rms_norm_eps": 1e-5},
    moe={"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 32, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None,
         "max_position_embeddings": 512, "rms_norm_eps": 1e-5},
    prefill=(16, 32), contexts=(32, 64), low_bit_context=32, moe_prefill=16, moe_context=32,
    max_seq=128, budget_s=0.15, fma_s=0.05, bandwidth_bytes=64 << 20, bandwidth_s=0.3)


# ---------------------------------------------------------------- the layers


@dataclass
class Subject:
    """One transformers decoder layer (random weights), its arke compilations and its torch.compile'd forward."""

    name: str
    config: Any
    layer: torch.nn.Module
    rotary: torch.nn.Module
    arke: dict[str, Any] = field(default_factory=dict)  # weight kind -> CompiledLayer
    build_s: dict[str, float] = field(default_factory=dict)
    forward: Callable[..., Any] | None = None  # torch.compile(layer.forward), compiled on first use per shape
    compile_note: str = ""  # why there is no torch.compile candidate

    @property
    def hidden(self) -> int:
        return int(self.config.hidden_size)

    @property
    def kv_heads(self) -> int:
        return int(self.config.num_key_value_heads)

    @property
    def head_dim(self) -> int:
        return int(self.config.head_dim)


def make_subject(kind: str, sizes: Sizes, kinds: tuple[str, ...], compiling: CompileState) -> Subject:
    """A ``LlamaDecoderLayer`` (kind "llama") or ``MixtralDecoderLayer`` ("moe"), matrices N(0, 0.02), compiled."""
    import arke.models

    if kind == "llama":
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        config: Any = LlamaConfig(**sizes.llama)
        layer_cls, rotary_cls, name = LlamaDecoderLayer, LlamaRotaryEmbedding, "Llama-3.2-1B"
    else:
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralDecoderLayer, MixtralRotaryEmbedding

        config = MixtralConfig(**sizes.moe)
        config._experts_implementation = "grouped_mm"  # what from_pretrained picks here (torch >= 2.9 on CPU)
        layer_cls, rotary_cls, name = MixtralDecoderLayer, MixtralRotaryEmbedding, "small Mixtral"
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    layer = layer_cls(config, 0).eval()
    with torch.no_grad():
        for p in layer.parameters():
            if p.dim() > 1:  # projections, experts, router; the norms keep their ones
                p.normal_(0, 0.02)
    subject = Subject(name, config, layer, rotary_cls(config))
    for weights in kinds:
        start = time.perf_counter()
        subject.arke[weights] = arke.models.from_transformers(layer, config, target="llvm", max_seq=sizes.max_seq,
                                                              weights=weights)
        subject.build_s[weights] = time.perf_counter() - start
    if compiling.enabled:
        subject.forward = torch.compile(layer.forward, dynamic=False)
    else:
        subject.compile_note = compiling.reason
    return subject


@dataclass
class CompileState:
    """Whether torch.compile is timed, and what its first calls (the compiles) took."""

    enabled: bool
    reason: str
    spent_s: float = 0.0


# ---------------------------------------------------------------- rows


@dataclass
class Row:
    """One configuration (a layer, prefill of T tokens or decode at a context): times and checks."""

    subject: Subject
    phase: str  # "prefill" | "decode"
    tokens: int  # prefill: T; decode: the context the one new token sees besides itself
    times: dict[str, Measurement] = field(default_factory=dict)  # candidate -> timings
    notes: dict[str, str] = field(default_factory=dict)  # candidate -> why it has no time
    errors: dict[str, float] = field(default_factory=dict)  # arke weight kind -> checked error
    flops: float = 0.0  # prefill: useful FLOPs
    step_bytes: dict[str, float] = field(default_factory=dict)  # decode: weight kind -> weight bytes a step reads
    kv_bytes: float = 0.0  # decode: cache bytes the attention reads
    read_bytes: float = 0.0  # decode: bytes of the `read` candidate (torch.sum over that many f32 ones)

    def bound(self, weights: str, limits: Limits) -> float:
        """Seconds to read the step's weights once: at the bandwidth the `read` candidate reached in the
        same rounds, else at the machine's measured read bandwidth."""
        if "read" in self.times and self.read_bytes:
            return self.times["read"].median * self.step_bytes[weights] / self.read_bytes
        return self.step_bytes[weights] / limits.bandwidth
    compile_s: float = 0.0

    def speedup(self, over: str, candidate: str = "arke") -> float:
        """``times[over] / times[candidate]`` (NaN when either is missing)."""
        if over not in self.times or candidate not in self.times:
            return math.nan
        return self.times[over].median / self.times[candidate].median

    def failed_checks(self) -> list[str]:
        return [f"{self.label} {w}: {e:.1e}" for w, e in self.errors.items() if not e <= TOLERANCE[w]]

    @property
    def label(self) -> str:
        return f"{self.subject.name} {self.phase} {self.tokens}"


def candidate(weights: str) -> str:
    """The timing name of arke with these weights: ``arke``, ``arke bf16``, ``arke int8``."""
    return "arke" if weights == "f32" else f"arke {weights}"


def update_error(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor) -> float:
    """max |got - want| / max |want - x|: the error relative to the layer's own update of the residual."""
    return float((got - want).abs().max() / (want - x).abs().max().clamp_min(1e-30))


def add_compiled(row: Row, call: Callable[[Callable[..., Any]], Any], compiling: CompileState,
                 candidates: dict[str, Callable[[], object]]) -> None:
    """Compile ``call(subject.forward)`` (its first call, outside the timings) and add it as a candidate."""
    forward = row.subject.forward
    if forward is None:
        row.notes["torch.compile"] = row.subject.compile_note
        return
    note, row.compile_s = first_compiled_call(forward, call, compiling, candidates)
    if note:
        row.notes["torch.compile"] = note


def first_compiled_call(forward: Callable[..., Any], call: Callable[[Callable[..., Any]], Any],
                        compiling: CompileState, candidates: dict[str, Callable[[], object]]) -> tuple[str, float]:
    """``call(forward)`` once (torch.compile's compile, outside the timings), then ``candidates["torch.compile"]``;
    ``(why it failed or "", seconds spent)``: the optional competitor failing is a note, never a crash."""
    start = time.perf_counter()
    note = ""
    try:
        call(forward)
        candidates["torch.compile"] = lambda: call(forward)
    except Exception as err:
        note = short(err)
    spent = time.perf_counter() - start
    compiling.spent_s += spent
    return note, spent


def prefill_flops(config: Any, t: int) -> float:
    """Useful FLOPs of a prefill of ``t`` tokens into an empty cache (projections, attention, MLP or active experts)."""
    d, h, g, e, f = (int(config.hidden_size), int(config.num_attention_heads), int(config.num_key_value_heads),
                     int(config.head_dim), int(config.intermediate_size))
    experts = int(getattr(config, "num_local_experts", 0) or 0)
    per_token = d * (h + 2 * g) * e + h * e * d
    per_token += (d * experts + int(config.num_experts_per_tok) * 3 * d * f) if experts else 3 * d * f
    return 2.0 * t * per_token + 4.0 * h * e * t * (t + 1) / 2


def step_weight_bytes(compiled: Any) -> float:
    """Weight bytes one decode step reads: all of them, but only top-k of the experts of a mixture."""
    c = compiled.config
    if not c.experts:
        return float(compiled.weight_bytes)
    expert = sum(t.numel() * t.element_size() for name, t in compiled.weights.items()
                 if re.fullmatch(r"(gu\d+\.[gu]|down\d+)(_s)?", name))
    return compiled.weight_bytes - expert * (1 - c.top_k / c.experts)


def prefill_row(subject: Subject, t: int, budget_s: float, compiling: CompileState) -> Row:
    """Prefill of ``t`` tokens (batch 1, empty cache): arke, eager, torch.compile; checked against eager."""
    row = Row(subject, "prefill", t, flops=prefill_flops(subject.config, t))
    g = torch.Generator().manual_seed(t)
    x = torch.randn(1, t, subject.hidden, generator=g)
    positions = torch.arange(t).unsqueeze(0)
    compiled = subject.arke["f32"]
    cache = compiled.new_cache(batch=1)
    pe = subject.rotary(x, positions)

    def arke_call() -> torch.Tensor:
        cache.length = 0
        return compiled(x, positions, cache)

    def hf(forward: Callable[..., Any]) -> Any:
        return forward(x, position_embeddings=pe, position_ids=positions)

    want = hf(subject.layer)
    row.errors["f32"] = update_error(arke_call(), want, x)
    candidates: dict[str, Callable[[], object]] = {"arke": arke_call, "torch": lambda: hf(subject.layer)}
    add_compiled(row, hf, compiling, candidates)
    row.times = measure(candidates, budget_s=budget_s)
    return row


def decode_row(subject: Subject, context: int, kinds: tuple[str, ...], budget_s: float,
               compiling: CompileState) -> Row:
    """One token after ``context`` cached ones (batch 1), with each arke weight kind in ``kinds``.

    Both caches hold the same random keys and values (rotated keys, as both store them), so the
    step is checked without running a prefill; each timed call first resets its cache to ``context``.
    """
    from transformers import DynamicCache

    row = Row(subject, "decode", context)
    g = torch.Generator().manual_seed(context)
    shape = (1, subject.kv_heads, context, subject.head_dim)
    keys, values = torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)
    x = torch.randn(1, 1, subject.hidden, generator=g)
    positions = torch.tensor([[context]])
    pe = subject.rotary(x, positions)
    row.kv_bytes = 2.0 * keys.numel() * keys.element_size()

    hf_cache = DynamicCache()
    hf_cache.update(keys, values, 0)
    slot = hf_cache.layers[0]

    def hf(forward: Callable[..., Any]) -> Any:
        slot.keys, slot.values = keys, values  # back to `context` tokens; the call appends one by torch.cat
        return forward(x, position_embeddings=pe, position_ids=positions, cache=hf_cache)

    want = hf(subject.layer)
    candidates: dict[str, Callable[[], object]] = {}
    for weights in kinds:
        compiled = subject.arke[weights]
        cache = compiled.new_cache(batch=1)
        cache.k[:, :, :context].copy_(keys)
        cache.v[:, :, :context].copy_(values)

        def arke_call(compiled: Any = compiled, cache: Any = cache) -> torch.Tensor:
            cache.length = context
            return compiled(x, positions, cache)

        row.errors[weights] = update_error(arke_call(), want, x)
        row.step_bytes[weights] = step_weight_bytes(compiled)
        candidates[candidate(weights)] = arke_call
        if weights == "f32":
            candidates["torch"] = lambda: hf(subject.layer)
    add_compiled(row, hf, compiling, candidates)
    # the bound's read, timed in the same interleaved rounds: this shared machine's bandwidth moves
    # by 2x between minutes, so a bandwidth measured at another time would not be the same machine
    data = torch.ones(int(row.step_bytes[kinds[0]]) // 4)
    row.read_bytes = data.numel() * 4.0
    candidates["read"] = lambda: torch.sum(data)
    # measure re-checks the first two
    order = ["arke", "torch", "torch.compile", *(candidate(w) for w in kinds), "read"]
    row.times = measure({n: candidates[n] for n in dict.fromkeys(order) if n in candidates}, budget_s=budget_s)
    return row


# ---------------------------------------------------------------- report


def times(m: Measurement | None) -> str:
    return m.summary() if m is not None else "n/a"


def ratio(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}×"


class Targets:
    """The issue's targets met and missed in this run, for the closing tally."""

    def __init__(self) -> None:
        self.met: list[str] = []
        self.missed: list[str] = []

    def judge(self, name: str, ok: bool | None, goal: str) -> str:
        """``"≥ 1.3× met"`` / ``"≥ 1.3× MISSED"`` (recorded), or just the goal when there is no figure."""
        if ok is None:
            return goal
        (self.met if ok else self.missed).append(name)
        return f"{goal} met" if ok else f"[red]{goal} MISSED[/red]"


def check_cell(row: Row, weights: str) -> str:
    err = row.errors.get(weights, math.nan)
    ok = err <= TOLERANCE[weights]
    return f"ok ({err:.0e})" if ok else f"[red]MISMATCH ({err:.1e})[/red]"


def prefill_table(rows: list[Row], limits: Limits, targets: Targets) -> Table:
    table = Table(title="prefill (batch 1, empty cache): arke vs transformers' layer, f32")
    for column, justify in [("layer", "left"), ("T", "right"), ("arke", "right"), ("torch eager", "right"),
                            ("torch.compile", "right"), ("× vs eager", "right"), ("target", "left"),
                            ("× vs compile", "right"), ("target", "left"), ("arke GFLOP/s", "right"),
                            ("% FMA peak", "right"), ("check", "left")]:
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        t = row.times
        vs_eager, vs_compile = row.speedup("torch"), row.speedup("torch.compile")
        dense = not row.subject.arke["f32"].config.experts  # the targets are for the dense layer
        tag = f"{row.subject.name} prefill {row.tokens}"
        eager_goal = targets.judge(f"{tag} vs eager", vs_eager >= PREFILL_VS_EAGER if dense else None,
                                   f"≥ {PREFILL_VS_EAGER}×" if dense else "—")
        compile_ok = None if math.isnan(vs_compile) or not dense else vs_compile >= PREFILL_VS_COMPILE
        compile_goal = targets.judge(f"{tag} vs torch.compile", compile_ok,
                                     f"≥ {PREFILL_VS_COMPILE}×" if dense else "—")
        rate = row.flops / t["arke"].median
        table.add_row(row.subject.name, str(row.tokens), times(t.get("arke")), times(t.get("torch")),
                      times(t.get("torch.compile")), ratio(vs_eager), eager_goal, ratio(vs_compile), compile_goal,
                      f"{rate / 1e9:.1f}", f"{rate / limits.flops * 100:.1f}%", check_cell(row, "f32"))
    return table


def decode_table(rows: list[Row], limits: Limits, targets: Targets) -> Table:
    table = Table(title="decode: one token at a context (batch 1), f32 weights; bound = weight bytes read / read "
                        "bandwidth (torch.sum over as many bytes, timed in the same rounds)")
    for column, justify in [("layer", "left"), ("context", "right"), ("arke", "right"), ("torch eager", "right"),
                            ("torch.compile", "right"), ("× vs eager", "right"), ("× vs compile", "right"),
                            ("weights read", "right"), ("KV read", "right"), ("bound", "right"),
                            ("arke / bound", "right"), ("target", "left"), ("check", "left")]:
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        t = row.times
        bound = row.bound("f32", limits)
        within = t["arke"].median / bound
        dense = not row.subject.arke["f32"].config.experts
        goal = targets.judge(f"{row.subject.name} decode {row.tokens} bound", within <= DECODE_BOUND if dense else None,
                             f"≤ {DECODE_BOUND}×" if dense else "—")
        table.add_row(row.subject.name, str(row.tokens), times(t.get("arke")), times(t.get("torch")),
                      times(t.get("torch.compile")), ratio(row.speedup("torch")), ratio(row.speedup("torch.compile")),
                      f"{row.step_bytes['f32'] / 1e6:.1f} MB", f"{row.kv_bytes / 1e6:.1f} MB",
                      format_seconds(bound), f"{within:.2f}×", goal, check_cell(row, "f32"))
    return table


def low_bit_table(row: Row, limits: Limits, targets: Targets) -> Table:
    table = Table(title=f"decode at context {row.tokens} with bf16 / int8 weights (weight-only; int8: one f32 scale "
                        "per output channel) vs torch's f32 eager step")
    for column, justify in [("layer", "left"), ("arke weights", "left"), ("arke", "right"),
                            ("torch f32 eager", "right"), ("× vs torch f32 eager", "right"), ("target", "left"),
                            ("× vs torch.compile f32", "right"), ("weights read", "right"), ("bound", "right"),
                            ("arke / bound", "right"), ("check", "left")]:
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for weights in ("f32", *LOW_BITS):
        name = candidate(weights)
        if name not in row.times:
            continue
        speedup = row.speedup("torch", name)
        goal = LOW_BIT_SPEEDUP.get(weights)
        cell = targets.judge(f"{row.subject.name} {weights} decode {row.tokens} vs torch f32 eager",
                             speedup >= goal if goal else None, f"≥ {goal}×" if goal else "—")
        bound = row.bound(weights, limits)
        table.add_row(row.subject.name, weights, times(row.times[name]), times(row.times.get("torch")),
                      ratio(speedup), cell, ratio(row.speedup("torch.compile", name)),
                      f"{row.step_bytes[weights] / 1e6:.1f} MB", format_seconds(bound),
                      f"{row.times[name].median / bound:.2f}×", check_cell(row, weights))
    return table


def memory_table(subjects: list[tuple[Subject, list[tuple[str, int]]]], targets: Targets) -> Table:
    table = Table(title="memory plan: one arena per call shape (activations between kernels and kernel temporaries)")
    for column, justify in [("layer", "left"), ("call", "left"), ("arena", "right"), ("peak live", "right"),
                            ("arena / peak", "right"), ("target", "left"), ("KV cache (max_seq)", "right"),
                            ("KV per token", "right")]:
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for subject, calls in subjects:
        compiled = subject.arke["f32"]
        kv = compiled.new_cache(batch=1).nbytes
        for label, t in calls:
            plan = compiled.memory(1, t)
            peak = plan.peak_live_bytes()
            share = plan.arena_bytes / peak if peak else math.nan
            goal = targets.judge(f"{subject.name} {label} workspace", share <= WORKSPACE if peak else None,
                                 f"≤ {WORKSPACE}×")
            table.add_row(subject.name, label, f"{plan.arena_bytes / 1e6:.2f} MB", f"{peak / 1e6:.2f} MB",
                          ratio(share), goal, f"{kv / 1e6:.1f} MB ({compiled.max_seq})",
                          f"{kv // compiled.max_seq:,} B")
    return table


# ---------------------------------------------------------------- main


def machine_limits(sizes: Sizes, threads: int) -> Limits:
    """This machine's f32 FMA peak and read bandwidth, now (``benchmarks/cpu.py``'s probes)."""
    return Limits(fma_peak(threads, sizes.fma_s), read_bandwidth(sizes.bandwidth_bytes, sizes.bandwidth_s), threads)


def command_line(argv: list[str]) -> str:
    """The command that reproduces this run (the script's path relative to the working directory when it can be)."""
    script = Path(__file__).resolve()
    try:
        shown = str(script.relative_to(Path.cwd()))
    except ValueError:
        shown = str(script)
    exe = Path(sys.executable)
    try:
        python = str(exe.relative_to(Path.cwd()))
    except ValueError:
        python = str(exe)
    return shlex.join([python, shown, *argv])


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables; 1 when a configuration failed or a check mismatched, else 0."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, short budgets, no torch.compile (seconds)")
    parser.add_argument("--only", choices=SECTIONS, help="run only this section")
    parser.add_argument("--budget", type=float, help="seconds of timed rounds per row (default 12, --quick 0.15)")
    parser.add_argument("--compile", dest="compile", action="store_true", default=None,
                        help="time torch.compile even with --quick")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    budget = args.budget if args.budget is not None else sizes.budget_s
    use_compile = args.compile if args.compile is not None else not args.quick
    reason = "skipped by --quick (--compile forces it)" if args.quick else "skipped (--no-compile)"
    compiling = CompileState(use_compile, reason)
    sections = (args.only,) if args.only else SECTIONS
    started = time.perf_counter()
    console.print(f"command: {command_line(argv)}")
    try:
        import transformers
    except ImportError:
        console.print("[red]transformers is not installed: pip install 'arke[models]'[/red]")
        return 1

    threads = torch.get_num_threads()
    console.print(f"measuring this machine's limits on {threads} threads …")
    first = machine_limits(sizes, threads)
    console.print(f"  FMA peak {first.flops / 1e9:.0f} GFLOP/s (f32), read bandwidth {first.bandwidth / 1e9:.1f} GB/s")

    failures: list[str] = []
    rows: dict[str, list[Row]] = {"prefill": [], "decode": []}
    low_bit: Row | None = None
    memory: list[tuple[Subject, list[tuple[str, int]]]] = []
    subjects: list[Subject] = []

    def attempt(what: str, fn: Callable[[], Row]) -> Row | None:
        console.print(f"{what} …")
        try:
            return fn()
        except Exception as err:  # a report goes on: say what broke, and exit 1 at the end
            console.print(f"  [red]failed: {short(err)}[/red]")
            failures.append(f"{what}: {short(err)}")
            return None

    with torch.no_grad():
        if "prefill" in sections or "decode" in sections:
            kinds = ("f32", *LOW_BITS) if "decode" in sections else ("f32",)
            console.print(f"building the {'×'.join(kinds)} arke layers of the Llama-shaped layer …")
            llama = make_subject("llama", sizes, kinds, compiling)
            subjects.append(llama)
            calls: list[tuple[str, int]] = []
            if "prefill" in sections:
                for t in sizes.prefill:
                    row = attempt(f"{llama.name} prefill {t}", lambda t=t: prefill_row(llama, t, budget, compiling))
                    rows["prefill"] += [row] if row else []
                calls += [(f"prefill {t}", t) for t in sizes.prefill]
            if "decode" in sections:
                for ctx in sizes.contexts:
                    kinds_here = kinds if ctx == sizes.low_bit_context else ("f32",)
                    row = attempt(f"{llama.name} decode at {ctx}",
                                  lambda c=ctx, k=kinds_here: decode_row(llama, c, k, budget, compiling))
                    rows["decode"] += [row] if row else []
                    if row and ctx == sizes.low_bit_context:
                        low_bit = row
                if sizes.low_bit_context not in sizes.contexts:
                    low_bit = attempt(f"{llama.name} decode at {sizes.low_bit_context}",
                                      lambda: decode_row(llama, sizes.low_bit_context, kinds, budget, compiling))
                calls.append(("decode", 1))
            memory.append((llama, calls))
        if "moe" in sections:
            console.print("building the Mixtral-shaped layer …")
            moe = make_subject("moe", sizes, ("f32",), compiling)
            subjects.append(moe)
            row = attempt(f"{moe.name} prefill {sizes.moe_prefill}",
                          lambda: prefill_row(moe, sizes.moe_prefill, budget, compiling))
            rows["prefill"] += [row] if row else []
            row = attempt(f"{moe.name} decode at {sizes.moe_context}",
                          lambda: decode_row(moe, sizes.moe_context, ("f32",), budget, compiling))
            rows["decode"] += [row] if row else []
            memory.append((moe, [(f"prefill {sizes.moe_prefill}", sizes.moe_prefill), ("decode", 1)]))

    console.print("measuring this machine's limits again …")
    last = machine_limits(sizes, threads)
    limits = Limits(max(first.flops, last.flops), max(first.bandwidth, last.bandwidth), threads)
    targets = Targets()
    console.print()
    console.print(f"limits (the better of the run's start and end; other tenants share this machine): FMA peak "
                  f"{limits.flops / 1e9:.0f} GFLOP/s (f32, {threads} threads; start {first.flops / 1e9:.0f}, end "
                  f"{last.flops / 1e9:.0f}), read bandwidth {limits.bandwidth / 1e9:.1f} GB/s (torch.sum over "
                  f"{sizes.bandwidth_bytes >> 20} MB; start {first.bandwidth / 1e9:.1f}, end "
                  f"{last.bandwidth / 1e9:.1f})")
    if rows["prefill"]:
        console.print(prefill_table(rows["prefill"], limits, targets))
    if rows["decode"]:
        console.print(decode_table(rows["decode"], limits, targets))
    if low_bit is not None:
        console.print(low_bit_table(low_bit, limits, targets))
    if memory:
        console.print(memory_table(memory, targets))

    every = rows["prefill"] + rows["decode"] + ([low_bit] if low_bit and low_bit not in rows["decode"] else [])
    mismatches = [m for r in every for m in r.failed_checks()]
    console.print("Times: median ± interquartile range over interleaved rounds (benchmarks/timing.py); × = torch time "
                  "/ arke time (above 1: arke is faster). check: max |arke − transformers| / max |transformers − x| "
                  f"(the layer's update), tolerance {', '.join(f'{k} {v:g}' for k, v in TOLERANCE.items())}.")
    console.print("transformers: sdpa attention, (cos, sin) precomputed outside the timing; decode through a "
                  "DynamicCache reset to the context before each call (its torch.cat append included). "
                  "Mixture rows: experts_implementation grouped_mm (from_pretrained's choice); bound = the weights of "
                  "the top-k experts plus the rest; no targets.")
    for s in subjects:
        builds = ", ".join(f"{k} {format_seconds(v)}" for k, v in s.build_s.items())
        console.print(f"arke build of {s.name} (compile or on-disk cache load, weight packing; outside the timings): "
                      f"{builds}; decode dispatches: {'; '.join(s.arke['f32'].dispatches(1, 1))}")
    notes = {f"{n}: {why}" for r in every for n, why in r.notes.items()}
    for note in sorted(notes):
        console.print(f"n/a — {note}")
    if compiling.enabled:
        console.print(f"torch.compile first calls (outside the timings): {format_seconds(compiling.spent_s)} in all")
    arke_threads = library("std.nn").threads  # every arke build's default team
    wait = os.environ.get("OMP_WAIT_POLICY")
    console.print(f"threads: arke {arke_threads}, torch {threads} (OMP_WAIT_POLICY={wait}); torch {torch.__version__}, "
                  f"transformers {transformers.__version__}")
    total = len(targets.met) + len(targets.missed)
    console.print(f"targets met: {len(targets.met)} of {total}" +
                  (f"; missed: {', '.join(targets.missed)}" if targets.missed else ""))
    for problem in failures + [f"check failed: {m}" for m in mismatches]:
        console.print(f"[red]{problem}[/red]")
    console.print(f"totals: {len(every)} configurations, {len(failures)} failed, {len(mismatches)} mismatched checks; "
                  f"whole run {time.perf_counter() - started:.0f} s")
    return 1 if failures or mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
