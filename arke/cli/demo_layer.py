"""The main demo: a Llama-3.2-1B-shaped decoder layer compiled for the CPU, next to torch.

It builds transformers' ``LlamaDecoderLayer`` with random weights (hidden 2048, MLP 8192, 32
heads, 8 KV heads, head dim 64, llama3 rotary scaling), compiles it with
:func:`arke.models.from_transformers` (LLVM, f32), runs a 128-token prefill and 32 decode
steps, and checks every output against the same plan run on the reference interpreter (the
oracle) and against transformers itself (torch eager, with its own KV cache). It prints both
errors and the times side by side; the exit status is 1 when a check fails.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

#: Largest accepted max |difference| / max |reference| (f32 everywhere).
TOLERANCE = 1e-4


@dataclass(frozen=True)
class LlamaSizes:
    """A decoder layer's sizes: Llama 3.2 1B's by default."""

    hidden: int = 2048
    mlp: int = 8192
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 64


@dataclass(frozen=True)
class DemoShape(LlamaSizes):
    """The layer's shape and the run: prefill tokens, decode steps."""

    prefill: int = 128
    steps: int = 32


@dataclass
class Run:
    """One way of running the layer: its outputs (prefill, then each decode step) and times."""

    outputs: list[Any]
    prefill_s: float
    step_s: list[float]


def llama_config(hidden: int, mlp: int, heads: int, kv_heads: int, head_dim: int) -> Any:
    """A transformers ``LlamaConfig`` of these sizes, otherwise Llama 3.2's (llama3 rotary scaling, theta
    500000, RMSNorm epsilon 1e-5), with SDPA attention; also what ``benchmarks/gpu.py`` builds."""
    from transformers import LlamaConfig

    rope = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}
    # transformers 5 takes rope_parameters (theta included); 4 reads rope_theta and rope_scaling
    options: dict[str, Any] = {"rope_theta": 500000.0, "rope_scaling": rope}
    config = LlamaConfig(hidden_size=hidden, intermediate_size=mlp, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, head_dim=head_dim, rms_norm_eps=1e-5,
                         max_position_embeddings=131072, **options)
    config._attn_implementation = "sdpa"
    return config


#: Prefills timed per run (the median is shown: this kind of machine is shared and noisy).
PREFILL_REPEATS = 3


def _run_arke(layer: Any, x: Any, positions: Any, prefill_tokens: int) -> Run:
    cache = layer.new_cache(batch=1)
    times = []
    for _ in range(PREFILL_REPEATS):
        cache.length = 0  # the same prefill again, into the same slots
        start = time.perf_counter()
        first = layer(x[:, :prefill_tokens], positions[:, :prefill_tokens], cache)
        times.append(time.perf_counter() - start)
    outs, prefill = [first], sorted(times)[PREFILL_REPEATS // 2]
    steps = []
    for s in range(prefill_tokens, x.shape[1]):
        start = time.perf_counter()
        outs.append(layer(x[:, s:s + 1], positions[:, s:s + 1], cache))
        steps.append(time.perf_counter() - start)
    return Run(outs, prefill, steps)


def _run_torch(layer: Any, rotary: Any, x: Any, positions: Any, prefill_tokens: int) -> Run:
    import torch
    from transformers import DynamicCache

    def call(cache: Any, a: int, b: int) -> Any:
        emb = rotary(x[:, a:b], positions[:, a:b])
        y = layer(x[:, a:b], cache=cache, use_cache=True, position_embeddings=emb)
        return y[0] if isinstance(y, tuple) else y

    with torch.no_grad():
        times = []
        for _ in range(PREFILL_REPEATS):
            cache = DynamicCache()  # each prefill into an empty cache; the decode steps extend the last
            start = time.perf_counter()
            first = call(cache, 0, prefill_tokens)
            times.append(time.perf_counter() - start)
        outs, prefill = [first], sorted(times)[PREFILL_REPEATS // 2]
        steps = []
        for s in range(prefill_tokens, x.shape[1]):
            start = time.perf_counter()
            outs.append(call(cache, s, s + 1))
            steps.append(time.perf_counter() - start)
    return Run(outs, prefill, steps)


def _error(got: list[Any], want: list[Any]) -> float:
    import torch

    a, b = torch.cat([g.float() for g in got], 1), torch.cat([w.float() for w in want], 1)
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def run_layer_demo(console: Any = None, shape: DemoShape = DemoShape()) -> int:
    """Build, run, check and time the layer; print the results. Returns the exit status."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.table import Table

    console = console or Console(highlight=False)
    if not console.is_terminal:
        console.width = 120
    import torch
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    import arke.models

    torch.manual_seed(0)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=False) as progress:
        task = progress.add_task(f"transformers: a Llama decoder layer (hidden {shape.hidden}, MLP {shape.mlp}, "
                                 f"{shape.heads}/{shape.kv_heads} heads of {shape.head_dim}), random weights",
                                 total=None)
        config = llama_config(shape.hidden, shape.mlp, shape.heads, shape.kv_heads, shape.head_dim)
        hf = LlamaDecoderLayer(config, layer_idx=0).eval()
        with torch.no_grad():
            for p in hf.parameters():
                p.normal_(0.0, 0.02)
            for norm in (hf.input_layernorm, hf.post_attention_layernorm):
                norm.weight.uniform_(0.5, 1.5)
        rotary = LlamaRotaryEmbedding(config)
        progress.update(task, completed=1, total=1)
        task = progress.add_task("arke: compiling std.decoder for this CPU (LLVM), prefill and decode plans",
                                 total=None)
        start = time.perf_counter()
        total = shape.prefill + shape.steps
        layer = arke.models.from_transformers(hf, config, target="llvm", max_seq=total)
        plans = {"prefill": layer.dispatches(1, shape.prefill), "decode": layer.dispatches(1, 1)}
        built = time.perf_counter() - start
        progress.update(task, completed=1, total=1)
        task = progress.add_task("the reference interpreter: the same plan, every kernel interpreted", total=None)
        reference = arke.models.from_transformers(hf, config, target="reference", max_seq=total)
        progress.update(task, completed=1, total=1)

    x = torch.randn(1, total, shape.hidden)
    positions = torch.arange(total)[None]
    _run_arke(layer, x, positions, shape.prefill)  # warm: pages of the arena and caches, the signature memos
    ours = _run_arke(layer, x, positions, shape.prefill)
    oracle = _run_arke(reference, x, positions, shape.prefill)
    _run_torch(hf, rotary, x, positions, shape.prefill)  # warm, as ours was
    theirs = _run_torch(hf, rotary, x, positions, shape.prefill)
    errors = {"reference interpreter": _error(ours.outputs, oracle.outputs),
              "transformers (torch eager)": _error(ours.outputs, theirs.outputs)}

    console.print(f"\n[bold]{layer}[/bold]  (compiled in {built:.1f} s; cached on disk for the next run)")
    for phase, lines in plans.items():
        console.print(f"  {phase}: " + "; ".join(lines))
    memory = layer.memory(1, shape.prefill)
    kv = layer.new_cache(1).nbytes / 2**20
    console.print(f"  memory plan, prefill: arena {memory.arena_bytes / 2**20:.1f} MiB for a peak of "
                  f"{memory.peak_live_bytes() / 2**20:.1f} MiB live; KV cache {kv:.1f} MiB")

    table = Table(title=f"prefill {shape.prefill} tokens (median of {PREFILL_REPEATS}), then {shape.steps} decode "
                        "steps (batch 1, f32, this CPU)")
    table.add_column("")
    table.add_column("arke (llvm)", justify="right")
    table.add_column("torch eager (transformers)", justify="right")
    table.add_column("speedup", justify="right")
    step_ours, step_theirs = sorted(ours.step_s)[shape.steps // 2], sorted(theirs.step_s)[shape.steps // 2]
    table.add_row(f"prefill {shape.prefill}", f"{ours.prefill_s * 1e3:.1f} ms", f"{theirs.prefill_s * 1e3:.1f} ms",
                  f"{theirs.prefill_s / ours.prefill_s:.2f}×")
    table.add_row("decode step (median)", f"{step_ours * 1e3:.2f} ms", f"{step_theirs * 1e3:.2f} ms",
                  f"{step_theirs / step_ours:.2f}×")
    console.print(table)
    failed = False
    for against, err in errors.items():
        ok = err <= TOLERANCE
        failed |= not ok
        mark = "[green]agrees[/green]" if ok else "[red]DISAGREES[/red]"
        console.print(f"  against the {against}: max |difference| / max |output| = {err:.1e} {mark} "
                      f"(tolerance {TOLERANCE:.0e})")
    return 1 if failed else 0
