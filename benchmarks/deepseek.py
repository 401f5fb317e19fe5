"""DeepSeek-V2 (std.deepseek) against transformers eager: decode and prefill of a small DeepSeek-V2-shaped
model with random weights (hidden 1024, 16 heads, a latent of 256, one dense layer then one of 16 routed
experts, top-4, plus 2 shared), saved with save_pretrained and loaded back with from_pretrained.

Decode runs the latent attention with the up-projections absorbed over Arke's latent cache;
transformers up-projects every cached token's keys and values each step.

    .venv/bin/python benchmarks/deepseek.py [--context 256] [--steps 24]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

import arke.models


def _median_ms(step: Callable[[], object], steps: int) -> float:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[steps // 6:]) * 1e3  # the first steps warm up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()
    torch.manual_seed(0)
    cfg = transformers.DeepseekV2Config(
        vocab_size=32000, hidden_size=1024, intermediate_size=4096, moe_intermediate_size=704, num_hidden_layers=2,
        num_attention_heads=16, num_key_value_heads=16, n_shared_experts=2, n_routed_experts=16, num_experts_per_tok=4,
        first_k_dense_replace=1, kv_lora_rank=256, q_lora_rank=None, qk_nope_head_dim=64, qk_rope_head_dim=32,
        v_head_dim=64, max_position_embeddings=4 * args.context, tie_word_embeddings=False)
    hf = transformers.DeepseekV2ForCausalLM(cfg).eval()
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        lm = arke.models.from_pretrained(Path(folder), max_seq=2 * args.context)
    ids = torch.randint(0, cfg.vocab_size, (1, args.context))
    token = torch.tensor([[5]])
    cache = lm.new_cache(1)
    lm(ids, cache)
    arke_ms = _median_ms(lambda: lm(token, cache), args.steps)
    with torch.no_grad():
        state = {"kv": hf(ids, use_cache=True).past_key_values}

        def hf_step() -> None:
            state["kv"] = hf(token, past_key_values=state["kv"], use_cache=True).past_key_values

        hf_ms = _median_ms(hf_step, args.steps)
        hf_prefill = _median_ms(lambda: hf(ids), 3)
    arke_prefill = _median_ms(lambda: lm(ids, lm.new_cache(1)), 3)
    print(f"decode at context {args.context}: arke {arke_ms:.2f} ms/token, transformers eager {hf_ms:.2f} ms/token "
          f"= {hf_ms / arke_ms:.2f}x")
    print(f"prefill {args.context}: arke {arke_prefill:.0f} ms, transformers eager {hf_prefill:.0f} ms "
          f"= {hf_prefill / arke_prefill:.2f}x")


if __name__ == "__main__":
    main()
