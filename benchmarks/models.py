"""Whole models: arke.models.from_pretrained's causal LM against transformers' own, eager and torch.compile.

A report, not a test: the timings never fail anything; a generation that differs from transformers' makes
the exit status 1. One run on one machine:

* **limits** — the machine's read bandwidth, measured in the same run over 1 GiB (more than any LLC here),
  its FMA peak and its bf16 matrix unit's peak (``benchmarks/unit_peak.py``);
* **decode** — a Llama-3.2-1B-shaped model (hidden 2048, MLP 8192, 32/8 heads of 64, a 128256-token tied
  vocabulary; ``--layers`` of its 16 layers, random weights, saved and loaded back from a folder), one
  sequence at context 512: tokens/s of arke, transformers eager and transformers under torch.compile (each
  with its own KV cache), and arke's step time against its bandwidth bound (weights + KV bytes a step reads
  / the measured bandwidth), and the step each target ratio would need, as a multiple of that bound;
* **batched decode** — 8 sequences of lengths 64 .. 512 over the paged KV cache: tokens/s against batch 1;
* **prefill** — 512 tokens: arke's forward pass against transformers' in eager and under torch.compile
  (all giving the last token's logits), and for Llama in bf16 against transformers in bf16 (medians of 5
  calls, the two sides alternating); each as a share of the FMA peak (bf16: of the matrix unit's), with
  the share the target ratio would need (``benchmarks/bounds.py`` counts the flops);
* **memory** — the process's resident bytes for arke's model against its weights + KV cache + arenas.

``--arch gpt2`` runs GPT-2 (124M: hidden 768, 12 blocks of 12 heads, vocabulary 50257) the same way.
DeepSeek-V2 has its own: benchmarks/deepseek.py.

    .venv/bin/python benchmarks/models.py                 # Llama-shaped, then GPT-2: ~6 min on 2 cores
    .venv/bin/python benchmarks/models.py --arch llama --layers 2 --no-compile --quick
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bounds import forward_flops
from cpu import fma_peak, read_bandwidth
from unit_peak import matrix_unit_peak

import arke.models
from arke.cli.demo_model import ModelShape, arke_decode, make_model, torch_decode


def _rss() -> int:
    """This process's resident bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _paired_medians(ours: Callable[[], object], theirs: Callable[[], object], rounds: int) -> tuple[float, float]:
    """Median seconds of each of two runs, after one untimed call of each (arke compiles its kernels on the
    first, torch warms its allocator), timed in alternating rounds: this machine's speed drifts by several
    percent from minute to minute, and alternating gives both sides the same drift."""
    ours()
    theirs()
    a, b = [], []
    for _ in range(rounds):
        for fn, times in ((ours, a), (theirs, b)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(a), statistics.median(b)


def _of_peak(flops: float, peak: float, unit: str, ours: float, theirs: float, name: str, target: float) -> str:
    """A prefill's speed as a share of a peak, and the share a target ratio against ``theirs`` would need."""
    return (f"  {flops / 1e9:.1f} GFLOP: arke at {flops / ours / peak:.0%} of {unit}, transformers {name} at "
            f"{flops / theirs / peak:.0%}; {target}× {name} would need {target * flops / theirs / peak:.0%}")


def make_gpt2(folder: Path, quick: bool) -> object:
    """A random GPT-2 (124M, or a small one with ``quick``) saved to ``folder``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=128, n_head=4, n_layer=2, vocab_size=4096) if quick else GPT2Config()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(folder)
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=("llama", "gpt2", "both"), default="both")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a small vocabulary and context (seconds)")
    args = parser.parse_args(argv)
    console = Console()
    shape = ModelShape(layers=args.layers, vocab=4096 if args.quick else 128256, prompt=args.context,
                       new=args.steps)
    if args.quick:
        shape = ModelShape(layers=args.layers, vocab=4096, hidden=512, mlp=1536, heads=8, kv_heads=2, head_dim=64,
                           prompt=min(args.context, 128), new=args.steps)
    bandwidth = read_bandwidth(1 << 30, 3.0)
    threads = torch.get_num_threads()
    peaks = (fma_peak(threads, 0.5), *matrix_unit_peak(threads, 0.5))
    console.print(f"machine: {threads} torch threads; read bandwidth {bandwidth / 1e9:.1f} GB/s "
                  f"(1 GiB, more than the last-level cache); FMA peak {peaks[0] / 1e9:.0f} GFLOP/s"
                  + (f", {peaks[1]} bf16 peak {peaks[2] / 1e9:.0f} GFLOP/s" if peaks[1] else ""))
    status = 0
    for arch in (("llama", "gpt2") if args.arch == "both" else (args.arch,)):
        if arch == "gpt2":
            shape = ModelShape(layers=2 if args.quick else 12, vocab=4096 if args.quick else 50257, hidden=128 if
                               args.quick else 768, prompt=shape.prompt, new=shape.new)
        status = max(status, run(console, arch, shape, bandwidth, peaks, args))
    console.print("DeepSeek-V2: benchmarks/deepseek.py")
    return status


def run(console: Console, arch: str, shape: ModelShape, bandwidth: float, peaks: tuple[float, str, float],
        args: argparse.Namespace) -> int:
    """One model's rows (``peaks``: the FMA peak, the bf16 matrix unit and its peak, FLOP/s)."""
    status = 0
    name = "GPT-2 (124M)" if arch == "gpt2" and shape.hidden == 768 else (
        "GPT-2" if arch == "gpt2" else "Llama-3.2-1B-shaped")
    with tempfile.TemporaryDirectory(prefix="arke-bench-") as tmp:
        hf: Any = make_gpt2(Path(tmp), args.quick) if arch == "gpt2" else make_model(shape, Path(tmp))
        gc.collect()
        max_seq = shape.prompt + shape.new + 8
        lm = arke.models.from_pretrained(tmp, max_seq=max_seq)
        ids = torch.randint(0, shape.vocab, (1, shape.prompt), generator=torch.Generator().manual_seed(0))
        tokens, arke_rate = arke_decode(lm, ids, shape.new)
        # the model's own memory: a second copy loaded and run once the kernels are compiled (the compiler's
        # own memory, LLVM's included, is not the model's)
        gc.collect()
        before = _rss()
        twin = arke.models.from_pretrained(tmp, max_seq=max_seq)
        arke_decode(twin, ids, 2)
        gc.collect()
        resident = _rss() - before
        del twin
    eager_tokens, eager_rate = torch_decode(hf, ids, shape.new)
    if tokens != eager_tokens:
        console.print("[red]arke's greedy tokens differ from transformers'[/red]")
        status = 1
    rows = [("arke (llvm, f32)", arke_rate), ("transformers eager", eager_rate)]
    if not args.no_compile:
        rows.append(("transformers torch.compile", torch_decode(hf, ids, shape.new, compiled=True)[1]))
    c = lm.layers[0].config
    kv_bytes = 2 * len(lm.layers) * c.kv_heads * c.head_dim * 4 * (shape.prompt + shape.new // 2)
    bound = (lm.weight_bytes + kv_bytes) / bandwidth
    table = Table(title=f"decode, batch 1, context {shape.prompt}: {name}, {shape.layers} layers, "
                        f"vocab {shape.vocab}")
    for column in ("run", "tokens/s", "ms/token", "arke's speedup"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for name, rate in rows:
        table.add_row(name, f"{rate:.2f}", f"{1e3 / rate:.1f}", "" if name.startswith("arke") else
                      f"{arke_rate / rate:.2f}×")
    console.print(table)
    console.print(f"bandwidth bound: {(lm.weight_bytes + kv_bytes) / 2**20:.0f} MiB per step / "
                  f"{bandwidth / 1e9:.1f} GB/s = {bound * 1e3:.1f} ms; arke's step is "
                  f"{(1 / arke_rate) / bound:.2f}× the bound")
    for (name, rate), target in zip(rows[1:], (1.3, 1.2)):  # what the ratios ask of a step
        console.print(f"  {target}× {name} needs a step of {1e3 / rate / target:.1f} ms: "
                      f"{1 / rate / target / bound:.2f}× the bound ({name}: {1 / rate / bound:.2f}×)")
    # batched decode over the paged cache: 8 sequences of different lengths
    lengths = [max(1, shape.prompt * (k + 1) // 8) for k in range(8)]
    batch = lm.batch(blocks=sum(-(-(n + shape.new + 3) // 16) for n in lengths), block_size=16)
    g = torch.Generator().manual_seed(2)
    for n in lengths:
        batch.add(torch.randint(0, shape.vocab, (n,), generator=g).tolist(), shape.new + 2)
    batch.step()  # every prompt, as one pass
    batch.step()  # one untimed decode step (its call shapes are checked and planned once), as batch 1 has
    start = time.perf_counter()
    for _ in range(shape.new):
        batch.step()
    batched = 8 * shape.new / (time.perf_counter() - start)
    console.print(f"batched decode, 8 sequences of {lengths[0]}..{lengths[-1]} tokens (paged cache): "
                  f"{batched:.2f} tokens/s = {batched / arke_rate:.2f}× batch 1")
    # prefill: both give the last token's logits (transformers' logits_to_keep=1), as generation needs
    prefill_ids = ids
    with torch.no_grad():
        arke_prefill, hf_prefill = _paired_medians(lambda: lm(prefill_ids, lm.new_cache(1)),
                                                   lambda: hf(prefill_ids, logits_to_keep=1), 5)
    console.print(f"prefill {shape.prompt} tokens: arke {arke_prefill * 1e3:.0f} ms, transformers eager "
                  f"{hf_prefill * 1e3:.0f} ms: {hf_prefill / arke_prefill:.2f}×")
    if not args.no_compile:  # the same forward pass under torch.compile (Inductor; compiled by an untimed call)
        compiled = torch.compile(hf.forward, dynamic=True)
        with torch.no_grad():
            again, compiled_prefill = _paired_medians(lambda: lm(prefill_ids, lm.new_cache(1)),
                                                      lambda: compiled(prefill_ids, logits_to_keep=1), 5)
        console.print(f"prefill {shape.prompt} tokens: arke {again * 1e3:.0f} ms, transformers torch.compile "
                      f"{compiled_prefill * 1e3:.0f} ms: {compiled_prefill / again:.2f}×")
        del compiled
    flops = forward_flops(hf, shape.prompt, 1)
    console.print(_of_peak(flops, peaks[0], "the FMA peak", arke_prefill, hf_prefill, "eager", 1.3))
    if arch == "llama":  # bf16 activations end to end (the matrix units where the CPU has them)
        with tempfile.TemporaryDirectory(prefix="arke-bench-") as tmp:
            hf.save_pretrained(tmp)
            half = arke.models.from_pretrained(tmp, max_seq=max_seq, dtype=torch.bfloat16)
            hf_half = type(hf).from_pretrained(tmp, dtype=torch.bfloat16).eval()
        with torch.no_grad():
            half_ms, hf_half_ms = _paired_medians(lambda: half(prefill_ids, half.new_cache(1)),
                                                  lambda: hf_half(prefill_ids, logits_to_keep=1), 5)
        console.print(f"prefill {shape.prompt} tokens in bf16: arke {half_ms * 1e3:.0f} ms, transformers bf16 "
                      f"{hf_half_ms * 1e3:.0f} ms: {hf_half_ms / half_ms:.2f}×")
        if peaks[1]:
            console.print(_of_peak(flops, peaks[2], f"the {peaks[1]} peak", half_ms, hf_half_ms, "bf16", 1.2))
        del half, hf_half
    arenas = sum(layer.memory(1, shape.prompt).arena_bytes + layer.memory(1, 1).arena_bytes for layer in lm.layers)
    planned = lm.weight_bytes + lm.new_cache(1).nbytes + arenas
    console.print(f"memory: {resident / 2**20:.0f} MiB resident for a model loaded and run (kernels compiled), against "
                  f"{planned / 2**20:.0f} MiB planned (weights + KV cache + arenas): {resident / planned:.2f}×")
    return status


if __name__ == "__main__":
    sys.exit(main())
