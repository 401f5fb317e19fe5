"""Arke inside PyTorch (issue 20): one thread pool, torch.ops call overhead, torch.compile(backend="arke").

    .venv/bin/python benchmarks/torch_interop.py [--quick] [--skip-backend]

1. **Alternating loop.** A Qwen2-0.5B-shaped decoder layer (hidden 896, 14/2 heads of 64, MLP 4864)
   decoding at context 256: Arke's layer alone, and in one loop with transformers' own layer (torch
   ops between Arke's steps), once on torch's OpenMP team (the default) and once on Arke's own team
   (``ARKE_NO_OMP=1``, the behaviour before issue 20), each in a fresh process, no environment
   variable of OpenMP set.
2. **Operator overhead.** ``torch.ops.arke.<kernel>`` against a direct call of the kernel (a tiny
   relu: the call is all overhead), and torch's own relu for scale.
3. **Backend.** A 2-layer Qwen2-0.5B-shaped transformers model: prefill 128 and a decode step at
   context 512, eager, ``torch.compile`` (Inductor) and ``torch.compile(backend="arke")``.

Times are medians of interleaved rounds (the backend rows: blocks of calls of one form, alternating); the
machine and torch's thread count are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

from arke.torch import backend

HIDDEN, HEADS, KV, HEAD, MLP = 896, 14, 2, 64, 4864


def _qwen2_config(layers: int = 1) -> Any:
    from transformers import Qwen2Config

    cfg = Qwen2Config(hidden_size=HIDDEN, intermediate_size=MLP, num_attention_heads=HEADS,
                      num_key_value_heads=KV, num_hidden_layers=layers, max_position_embeddings=2048,
                      vocab_size=32000)
    cfg._attn_implementation = "sdpa"
    return cfg


def _median_us(f: Any, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def alternating(context: int = 256, rounds: int = 60) -> dict[str, float]:
    """One process: Arke's decode step alone, then alternating with transformers' (times in µs)."""
    from transformers import DynamicCache
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

    import arke.models

    torch.manual_seed(0)
    cfg = _qwen2_config()
    hf = Qwen2DecoderLayer(cfg, layer_idx=0).eval()
    rotary = Qwen2RotaryEmbedding(cfg)
    layer = arke.models.from_transformers(hf, cfg, target="llvm", max_seq=context + 8)
    x = torch.randn(1, context, HIDDEN)
    cache = layer.new_cache(batch=1)
    with torch.no_grad():
        layer(x, torch.arange(context)[None], cache)
        hf_cache = DynamicCache()
        hf(x, cache=hf_cache, use_cache=True, position_embeddings=rotary(x, torch.arange(context)[None]))
    step = torch.randn(1, 1, HIDDEN)

    pos = torch.tensor([[context]])

    def ours() -> None:
        cache.length = context  # every step decodes at the same context
        layer(step, pos, cache)

    def theirs() -> None:
        hf(step, cache=hf_cache, use_cache=False, position_embeddings=rotary(step, pos))

    # controls: torch work on the same OpenMP team that touches little memory (matmuls in cache), and a
    # read of as many bytes as transformers' step reads (its weights): which part of a slowdown is the
    # threads' and which the cache's (the two layers' weights do not stay cached together)
    a, b = torch.randn(192, 192), torch.randn(192, 192)
    weights = torch.randn(sum(p.numel() for p in hf.parameters()))

    def compute() -> None:
        for _ in range(8):
            torch.mm(a, b)

    def read() -> None:
        weights.sum()

    def after(other: Any) -> float:
        times = []
        for _ in range(rounds):
            other()
            t = time.perf_counter()
            ours()
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e6

    with torch.no_grad():
        for _ in range(5):
            ours()
            theirs()
        alone = _median_us(ours, rounds)
        torch_alone = _median_us(theirs, rounds)
        mixed = after(theirs)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bounds import decode_bytes

        return {"alone": alone, "alternating": mixed, "torch": torch_alone, "after_compute": after(compute),
                "after_read": after(read), "bytes": decode_bytes(hf, context, config=cfg)}


def _in_fresh_process(env: dict[str, str]) -> dict[str, float]:
    code = "import json, benchmarks.torch_interop as b; print(json.dumps(b.alternating()))"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def overhead(rounds: int = 20000) -> dict[str, float]:
    """µs per call: a direct kernel call, the registered operator, torch's relu."""
    import arke
    import arke.torch

    lib = arke.build(arke.loads("import std.nn\n"), threads=1)
    ops = arke.torch.register(lib, kernels=["relu"])
    x = torch.randn(1, 8)
    op = ops.relu.default
    calls = {"direct": lambda: lib.relu(x), "torch.ops": lambda: op(x), "torch.relu": lambda: torch.relu(x)}
    best = {k: float("inf") for k in calls}
    for f in calls.values():
        for _ in range(500):
            f()
    for _ in range(7):  # interleaved: each round times every form
        for name, f in calls.items():
            t = time.perf_counter()
            for _ in range(rounds // 7):
                f()
            best[name] = min(best[name], (time.perf_counter() - t) / (rounds // 7) * 1e6)
    return best


#: timed calls per block of the backend rows (after one untimed call)
BLOCK = 3


def backend_model() -> Any:
    """The backend rows' model: a 2-layer Qwen2-0.5B-shaped transformers model, random weights."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(_qwen2_config(layers=2)).eval()


def backend_rows(model: Any, prefill: int = 128, context: int = 512, rounds: int = 6
                 ) -> list[tuple[str, float, float, float]]:
    """(phase, eager ms, inductor ms, arke ms) for ``model`` (:func:`backend_model`)."""
    from transformers import DynamicCache

    ids = torch.randint(0, 32000, (1, prefill))
    ctx_ids = torch.randint(0, 32000, (1, context))
    forms = {"eager": model, "inductor": torch.compile(model, dynamic=True),
             "arke": torch.compile(model, backend="arke", dynamic=True)}
    rows = []
    with torch.no_grad():
        want = model(ids).logits
        caches = {}
        for name, m in forms.items():
            got = m(ids).logits
            err = float((got - want).abs().max() / want.abs().max())
            print(f"  {name}: prefill logits max rel. difference {err:.1e}", flush=True)
            cache = DynamicCache()
            m(ctx_ids, past_key_values=cache, use_cache=True)
            caches[name] = cache
        token = torch.tensor([[7]])
        times: dict[str, dict[str, list[float]]] = {"prefill": {k: [] for k in forms}, "decode": {k: [] for k in forms}}
        # each form runs a block of calls as an application would (a decode loop steps one model), the blocks
        # alternating between forms; the first call of a block is not timed: it finds the caches holding the
        # previous form's weights (eager and Inductor read the model's own tensors, arke its packed copy)
        for _ in range(rounds):
            for name, m in forms.items():
                for k in range(BLOCK + 1):
                    t = time.perf_counter()
                    m(ids)
                    if k:
                        times["prefill"][name].append(time.perf_counter() - t)
                cache = caches[name]
                for k in range(BLOCK + 1):
                    cache.crop(-1) if cache.get_seq_length() > context else None  # the same context each step
                    t = time.perf_counter()
                    m(token, past_key_values=cache, use_cache=True)
                    if k:
                        times["decode"][name].append(time.perf_counter() - t)
    for phase, by in times.items():
        med = {k: statistics.median(v) * 1e3 for k, v in by.items()}
        rows.append((phase, med["eager"], med["inductor"], med["arke"]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-backend", action="store_true", help="no torch.compile rows (they compile for minutes)")
    parser.add_argument("--only-backend", action="store_true", help="the torch.compile rows only")
    args = parser.parse_args()
    from arke.runtime.host import host_description

    print(f"machine: {host_description().split()[1]}, {os.cpu_count()} CPUs, torch {torch.__version__} with "
          f"{torch.get_num_threads()} threads; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}")
    if args.only_backend:
        return _backend_table()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from cpu import read_bandwidth

    bandwidth = read_bandwidth(1 << 30, 3.0)
    print("\n1. Qwen2-0.5B-shaped layer, decode at context 256 (µs per Arke step, median)")
    print(f"{'pool':<34}{'alone':>10}{'alternating':>13}{'ratio':>8}{'transformers':>14}{'vs transformers':>17}"
          f"{'after matmuls':>15}{'after a read':>14}")
    pools = (("torch's OpenMP team (default)", {}), ("Arke's own team (ARKE_NO_OMP=1)", {"ARKE_NO_OMP": "1"}))
    found = []
    for label, env in pools:
        r = _in_fresh_process(env)
        found.append((label, r))
        print(f"{label:<34}{r['alone']:>10.0f}{r['alternating']:>13.0f}{r['alternating'] / r['alone']:>7.2f}×"
              f"{r['torch']:>14.0f}{r['torch'] / r['alternating']:>16.2f}×"
              f"{r['after_compute'] / r['alone']:>14.2f}×{r['after_read'] / r['alone']:>13.2f}×")
    # the step's bytes (weights and KV cache) against the memory's speed: a layer alone stays partly in the
    # last-level cache between its steps, and another layer's step between them evicts it
    print(f"  a step reads {found[0][1]['bytes'] / 2**20:.1f} MiB; this run measured {bandwidth / 1e9:.1f} GB/s "
          "of read bandwidth (1 GiB)")
    for label, r in found:
        rate = [r["bytes"] / (r[k] * 1e-6) / 1e9 for k in ("alone", "alternating", "after_read")]
        print(f"  {label}: alone {rate[0]:.1f} GB/s, alternating {rate[1]:.1f} GB/s, after a read {rate[2]:.1f} "
              f"GB/s; 1.1× alone needs {rate[0] / 1.1:.1f} GB/s ({rate[0] / 1.1 / (bandwidth / 1e9):.2f}× the "
              "memory's)")
    print("\n2. Call overhead (µs per call, best of 7 rounds; a 1×8 relu)")
    o = overhead()
    print("  " + ", ".join(f"{k} {v:.2f}" for k, v in o.items()) +
          f"; operator - direct = {o['torch.ops'] - o['direct']:.2f} µs")
    if not args.skip_backend:
        _backend_table()


def _backend_table(prefill: int = 128, context: int = 512) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bounds import decode_bytes, forward_flops
    from cpu import fma_peak, read_bandwidth

    model = backend_model()
    bandwidth, peak = read_bandwidth(1 << 30, 3.0), fma_peak(torch.get_num_threads(), 0.5)
    print(f"\n3. torch.compile(backend='arke'), 2-layer Qwen2-0.5B-shaped model (ms, median of rounds); this run "
          f"measured {bandwidth / 1e9:.1f} GB/s of read bandwidth (1 GiB) and an FMA peak of {peak / 1e9:.0f} GFLOP/s")
    print(f"{'':<10}{'eager':>9}{'inductor':>10}{'arke':>9}{'vs eager':>10}{'vs inductor':>13}{'limit':>8}"
          f"{'eager÷limit':>13}{'arke÷limit':>12}{'1.4× eager needs':>18}")
    # the least time each phase can take here: prefill's flops (every position's logits, as the graph returns
    # them) at the FMA peak; a decode step's weight and cache bytes at the read bandwidth
    limits = {"prefill": forward_flops(model, prefill, prefill) / peak,
              "decode": decode_bytes(model, context) / bandwidth}
    for phase, e, i, a in backend_rows(model, prefill, context):
        bound = limits[phase] * 1e3
        print(f"{phase:<10}{e:>9.2f}{i:>10.2f}{a:>9.2f}{e / a:>9.2f}×{i / a:>12.2f}×{bound:>8.2f}"
              f"{e / bound:>12.2f}×{a / bound:>11.2f}×{e / 1.4 / bound:>11.2f}× limit")
    seen: list[str] = []
    for r in backend.reports():  # each graph arke compiled (prefill, the first decode, decode with a symbolic length)
        if str(r) not in seen:
            seen.append(str(r))
            print(f"  {r}")


if __name__ == "__main__":
    main()
