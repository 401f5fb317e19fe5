"""The main demo: a Llama-3.2-1B-shaped causal LM generating text, compiled for this CPU, next to torch.

It builds transformers' ``LlamaForCausalLM`` of Llama 3.2 1B's shape (hidden 2048, MLP 8192, 32 heads,
8 KV heads of 64, llama3 rotary scaling, a 128256-token vocabulary with tied embeddings) with a few layers
and random weights, saves it with ``save_pretrained`` (nothing can be downloaded here), loads the folder
with :func:`arke.models.from_pretrained` (LLVM, f32), and generates greedily from a random prompt. The
tokens must equal transformers' own ``generate`` token for token; the decode throughput is printed next
to transformers in torch eager and under ``torch.compile``, each decoding the same tokens with its own KV
cache. The exit status is 1 when the tokens differ.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from arke.cli.demo_layer import LlamaSizes


@dataclass(frozen=True)
class ModelShape(LlamaSizes):
    """The model (Llama 3.2 1B's sizes, fewer layers) and the run: prompt tokens, new tokens."""

    layers: int = 2
    vocab: int = 128256
    prompt: int = 32
    new: int = 32


def make_model(shape: ModelShape, folder: Path, seed: int = 0) -> Any:
    """A random transformers ``LlamaForCausalLM`` of ``shape``, saved to ``folder`` (returned, in eval mode)."""
    from transformers import LlamaForCausalLM
    from transformers.utils import logging

    from arke.cli.demo_layer import llama_config

    logging.disable_progress_bar()
    config = llama_config(shape.hidden, shape.mlp, shape.heads, shape.kv_heads, shape.head_dim)
    config.num_hidden_layers, config.vocab_size, config.tie_word_embeddings = shape.layers, shape.vocab, True
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    return model


def torch_decode(model: Any, ids: torch.Tensor, new: int, compiled: bool = False) -> tuple[list[int], float]:
    """Greedy decoding with transformers' model and its own KV cache (``DynamicCache``): the new tokens and
    the decode steps' tokens/s (the prefill not counted). ``compiled``: the forward under ``torch.compile``
    (one untimed run first, so compiling is not timed)."""
    import inspect

    forward = torch.compile(model.forward, dynamic=True) if compiled else model.forward
    # transformers 5.x names the cache argument `cache` (`past_key_values` is deprecated there)
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def run() -> tuple[list[int], float]:
        from transformers import DynamicCache

        with torch.no_grad():
            cache = DynamicCache()
            out = forward(input_ids=ids, use_cache=True, **{key: cache})
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            tokens = [int(token)]
            start = time.perf_counter()
            for _ in range(new - 1):
                out = forward(input_ids=token, use_cache=True, **{key: cache})
                token = out.logits[:, -1].argmax(-1, keepdim=True)
                tokens.append(int(token))
            spent = time.perf_counter() - start
        return tokens, (new - 1) / spent

    if compiled:
        run()
    return run()


def arke_decode(lm: Any, ids: torch.Tensor, new: int) -> tuple[list[int], float]:
    """Greedy generation with the compiled model: the new tokens and the decode steps' tokens/s (one untimed
    run first, so loading each shape's kernels is not timed)."""
    lm.generate(ids, min(new, 2))
    out = lm.generate(ids, new)
    return out[0, ids.shape[1]:].tolist(), lm.stats["decode_tok_s"]


def run_model_demo(console: Any = None, shape: ModelShape = ModelShape(), compiled: bool = True) -> int:
    """Build, save, load, generate, check and time the model; print the results. Returns the exit status."""
    from rich.console import Console
    from rich.table import Table

    import arke.models

    console = console or Console()
    with tempfile.TemporaryDirectory(prefix="arke-demo-") as tmp:
        folder = Path(tmp)
        console.print(f"\n[bold]A Llama-3.2-1B-shaped causal LM, {shape.layers} layers, random weights[/bold]")
        started = time.perf_counter()
        hf = make_model(shape, folder)
        made = time.perf_counter() - started
        console.print(f"  made with transformers and saved with save_pretrained in {made:.1f} s")
        started = time.perf_counter()
        lm = arke.models.from_pretrained(folder, max_seq=shape.prompt + shape.new)
        console.print(f"  {lm!r}: loaded and compiled in {time.perf_counter() - started:.1f} s "
                      f"({lm.weight_bytes / 2**30:.2f} GiB of weights, packed once)")
    ids = torch.randint(0, shape.vocab, (1, shape.prompt), generator=torch.Generator().manual_seed(1))
    tokens, arke_rate = arke_decode(lm, ids, shape.new)
    with torch.no_grad():
        want = hf.generate(ids, max_new_tokens=shape.new, do_sample=False, attention_mask=torch.ones_like(ids),
                           pad_token_id=0)[0, shape.prompt:].tolist()
    same = tokens == want
    mark = "[green]identical[/green]" if same else "[red]DIFFERENT[/red]"
    console.print(f"  greedy generation of {shape.new} tokens after a {shape.prompt}-token prompt: {mark} to "
                  "transformers' generate")
    if not same:
        first = next(i for i, (a, b) in enumerate(zip(tokens, want)) if a != b)
        console.print(f"    first difference at new token {first}: arke {tokens[first]}, transformers {want[first]}")
    rows = [("arke (llvm, f32)", arke_rate)]
    eager_tokens, eager_rate = torch_decode(hf, ids, shape.new)
    rows.append(("transformers, torch eager", eager_rate))
    if compiled:
        _, compile_rate = torch_decode(hf, ids, shape.new, compiled=True)
        rows.append(("transformers, torch.compile", compile_rate))
    table = Table(title=f"decode, batch 1, context {shape.prompt}..{shape.prompt + shape.new} "
                        f"(torch {torch.get_num_threads()} threads)")
    for column in ("run", "tokens/s", "arke's speedup"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for name, rate in rows:
        table.add_row(name, f"{rate:.1f}", "" if name.startswith("arke") else f"{arke_rate / rate:.2f}×")
    console.print(table)
    if eager_tokens != want:
        console.print("  (transformers' own decoding loop and its generate disagree: numerics of its kernels)")
    return 0 if same else 1
