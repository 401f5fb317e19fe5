"""arke.models.tune, measured: a Llama-3.2-1B-shaped decoder layer (f32, random weights) tuned for prefill
128 and 512 and decode at context 512, then timed — the layer's defaults, its tuned plan, the
transformers layer in torch eager and under torch.compile — in interleaved rounds, with the % of the
machine's FMA peak (prefill) and the bandwidth bound (decode: weight + KV bytes / the read
bandwidth, timed in the same rounds) from the same run.

    .venv/bin/python benchmarks/tune_layer.py [--quick] [--budget 16] [--dispatch-budget 8] [--db URL]

The tuned plan goes to the tuning database (default ~/.cache/arke/tuning.db, or --db), so a layer
built on this machine afterwards (``benchmarks/decoder.py`` included) runs it. The table's tuned
layer is built from the plan the tuner returned (``plan=``), and checked to be the plan a layer
built from the database gets. A report: nothing here fails on a time.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decoder import FULL, QUICK, CompileState, first_compiled_call, make_subject, prefill_flops, update_error
from timing import measure

import arke.models
from arke.runtime.host import cores
from arke.runtime.peaks import fma_peak

console = Console(width=None if sys.stdout.isatty() else 190)


def _call(layer: Any, x: torch.Tensor, positions: torch.Tensor, cache: Any, context: int) -> Callable[[], Any]:
    def call() -> Any:
        cache.length = context
        return layer(x, positions, cache)
    return call


def row(subject: Any, layers: dict[str, Any], tokens: int, context: int, compiling: CompileState,
        budget_s: float, peak: float) -> list[str]:
    """One shape: each arke layer, torch eager and torch.compile, interleaved; checked against eager."""
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(tokens * 7 + context)
    shape = (1, subject.kv_heads, context, subject.head_dim)
    keys, values = torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)
    x = torch.randn(1, tokens, subject.hidden, generator=g)
    positions = (context + torch.arange(tokens)).unsqueeze(0)
    pe = subject.rotary(x, positions)
    hf_cache = DynamicCache()
    if context:
        hf_cache.update(keys, values, 0)

    def hf(forward: Callable[..., Any]) -> Any:
        if context:
            slot = hf_cache.layers[0]
            slot.keys, slot.values = keys, values
            return forward(x, position_embeddings=pe, position_ids=positions, cache=hf_cache)
        return forward(x, position_embeddings=pe, position_ids=positions)

    want = hf(subject.layer)
    candidates: dict[str, Callable[[], object]] = {}
    errors = []
    for name, layer in layers.items():
        cache = layer.new_cache(1)
        if context:
            cache.k[:, :, :context].copy_(keys)
            cache.v[:, :, :context].copy_(values)
        candidates[name] = _call(layer, x, positions, cache, context)
        errors.append(f"{update_error(candidates[name](), want, x):.1e}")  # type: ignore[arg-type]
    candidates["torch"] = lambda: hf(subject.layer)
    if subject.forward is not None:
        first_compiled_call(subject.forward, hf, compiling, candidates)
    bytes_ = 0.0
    if tokens == 1:  # decode: the bound's read, timed in the same rounds
        bytes_ = layers["defaults"].weight_bytes + 2.0 * keys.numel() * keys.element_size()
        data = torch.ones(int(bytes_) // 4)
        candidates["read"] = lambda: torch.sum(data)
    m = measure(candidates, budget_s=budget_s)

    def over(a: str, b: str) -> str:
        return f"{m[a].median / m[b].median:.2f}×" if a in m and b in m else "n/a"

    if tokens == 1:
        limit = f"{m['tuned'].median / m['read'].median:.2f}× bound"
    else:
        limit = f"{prefill_flops(subject.config, tokens) / m['tuned'].median / peak * 100:.0f}% FMA peak"
    shape_name = f"prefill {tokens}" if tokens > 1 else f"decode at {context}"
    return [shape_name, m["defaults"].summary(), m["tuned"].summary(), m["torch"].summary(),
            m["torch.compile"].summary() if "torch.compile" in m else "n/a", over("defaults", "tuned"),
            over("torch", "tuned"), over("torch.compile", "tuned"), limit, " / ".join(errors)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small layer, tiny budgets, no torch.compile")
    parser.add_argument("--budget", type=int, default=None, help="layer measurements per shape (default 16)")
    parser.add_argument("--dispatch-budget", type=int, default=None, help="kernel measurements per call (default 8)")
    parser.add_argument("--db", default=None, help="the tuning database (default: ARKE_TUNING_DB or SQLite)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    prefill, context = (sizes.prefill, sizes.contexts[0])
    compiling = CompileState(not (args.quick or args.no_compile), "--quick or --no-compile")
    subject = make_subject("llama", sizes, (), compiling)
    max_seq = max(*prefill, context + 1)
    defaults = arke.models.from_transformers(subject.layer, subject.config, max_seq=max_seq, tuning="off")
    peak = fma_peak(cores(), 0.2 if args.quick else 0.5)
    from arke.tune.machine import cpu

    console.print(f"FMA peak {peak / 1e9:.0f} GFLOP/s on {cores()} threads; {cpu()['model']}")
    result = arke.models.tune(defaults, prefill=list(prefill), decode_context=[context],
                              budget=args.budget or (4 if args.quick else 16),
                              dispatch_budget=args.dispatch_budget or (2 if args.quick else 8), db=args.db,
                              progress=lambda line: console.print(f"  {line}", highlight=False, markup=False))
    tuned = arke.models.from_transformers(subject.layer, subject.config, max_seq=max_seq, plan=result.plan())
    # both read the very same weight memory: a second packing lands elsewhere, and its placement alone moved
    # a 1B layer's times by 10-20 % here (the plan reads the same panels: the tuner checked it)
    tuned.weights = defaults.weights
    if args.db:
        os.environ["ARKE_TUNING_DB"] = args.db
    from_db = arke.models.from_transformers(subject.layer, subject.config, max_seq=max_seq)
    same = sorted(map(str, from_db.plan)) == sorted(map(str, tuned.plan))
    console.print(f"tuning took {result.seconds:.0f} s; a layer built from the database runs "
                  f"{'the same plan' if same else 'ANOTHER plan'}")
    layers = {"defaults": defaults, "tuned": tuned}
    table = Table(title=f"{subject.name}-shaped layer (f32): tuned plan vs its defaults, torch eager, torch.compile")
    for column in ("shape", "defaults", "tuned", "torch", "torch.compile", "tuned/defaults", "torch/tuned",
                   "compile/tuned", "tuned vs limit", "update error (defaults / tuned)", "the tuner's choice"):
        table.add_column(column)
    # what the tuner chose per shape: a plan, or the defaults (then "tuned" runs the very same kernels)
    choice = {p.tokens: ("defaults kept (same kernels)" if p.result is None or not p.result.chosen.plan else
                         f"a plan, {p.result.speedup:.2f}× confirmed") for p in result.phases}
    for t in prefill:
        table.add_row(*row(subject, layers, t, 0, compiling, sizes.budget_s, peak), choice.get(t, "not tuned"))
    table.add_row(*row(subject, layers, 1, context, compiling, sizes.budget_s, peak), choice.get(1, "not tuned"))
    console.print(table)
    for p in result.phases:
        j = p.result.as_json() if p.result is not None else {}
        console.print(f"{p.name}: tuner's confirmation {j.get('speedup', 1.0):.2f}× (noise {j.get('noise', 0):.1%}), "
                      f"outcomes {j.get('outcomes')}; {'; '.join(j.get('notes', []))}", highlight=False)
    console.print("the plan:\n" + result.plan(), highlight=False, markup=False)
    return 0 if same else 1


if __name__ == "__main__":
    with torch.no_grad():
        sys.exit(main())
