"""Whole causal LMs (arke.models.from_pretrained) against transformers: models made locally from small
configs with random weights, saved with save_pretrained and loaded back from the folder.

Logits of a prompt within 1e-4 of their scale, greedy generation token for token, batches of prompts of
different lengths over the paged cache equal to one prompt at a time (sequences joining and leaving),
sampling reproducible under a seed, and bad input refused with the running batch intact."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from hf_support import ARCHS, RTOL, config, randomize, relative_error

import arke.models
from arke.models.lm import CausalLM
from arke.runtime.errors import GuardError

CAUSAL_LM = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM",
             "mixtral": "MixtralForCausalLM", "gpt2": "GPT2LMHeadModel"}
MODELS = (*ARCHS, "gpt2")
VOCAB = 320
MAX_SEQ = 96


@cache
def saved(arch: str, tied: bool | None = None) -> tuple[Path, Any]:
    """A 2-layer random ``arch`` causal LM saved to a temporary folder, and the transformers model."""
    import tempfile

    tie = arch in ("llama", "gpt2") if tied is None else tied
    if arch == "gpt2":  # LayerNorm with bias, learned positions, GELU-tanh MLP, fused Conv1D QKV
        cfg = transformers.GPT2Config(n_embd=64, n_head=4, n_layer=2, vocab_size=VOCAB, n_positions=128,
                                      bos_token_id=0, eos_token_id=0, tie_word_embeddings=tie)
    else:
        cfg = config(arch, num_hidden_layers=2, vocab_size=VOCAB, tie_word_embeddings=tie)
    model = getattr(transformers, CAUSAL_LM[arch])(cfg).eval()
    randomize(model, seed=5)
    folder = Path(tempfile.mkdtemp(prefix=f"arke-lm-{arch}-"))
    model.save_pretrained(folder)
    return folder, model


@cache
def loaded(arch: str) -> CausalLM:
    return arke.models.from_pretrained(saved(arch)[0], max_seq=MAX_SEQ)


def prompt(length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def hf_generate(model: Any, ids: torch.Tensor, new: int) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=new, do_sample=False, attention_mask=torch.ones_like(ids),
                              pad_token_id=0, eos_token_id=None)


@pytest.mark.parametrize("arch", MODELS)
def test_logits_of_a_prompt_match_transformers(arch: str) -> None:
    lm, (_, hf) = loaded(arch), saved(arch)
    ids = prompt(11)
    got = lm(ids, lm.new_cache(1), every_token=True)
    with torch.no_grad():
        want = hf(ids).logits
    assert relative_error(got, want) <= RTOL
    assert lm.tied == (arch in ("llama", "gpt2"))


@pytest.mark.parametrize("arch", MODELS)
def test_greedy_generation_is_token_identical(arch: str) -> None:
    lm, (_, hf) = loaded(arch), saved(arch)
    ids = prompt(7, seed=1)
    got = lm.generate(ids, 32)
    assert got.tolist() == hf_generate(hf, ids, 32).tolist()
    assert lm.stats["decode_steps"] == 31 and lm.stats["prefill_tokens"] == 7


def test_streaming_gives_the_same_tokens_as_generate() -> None:
    lm = loaded("qwen2")
    ids = prompt(5, seed=2)
    streamed = [int(t[0]) for t in lm.stream(ids, 10)]
    assert streamed == lm.generate(ids, 10)[0, 5:].tolist()


@pytest.mark.parametrize("arch", ["qwen2", "mistral", "mixtral", "gpt2"])
def test_a_batch_of_different_lengths_equals_one_at_a_time(arch: str) -> None:
    """Prompts of 5, 9, 1 and 13 tokens: two join first, two more after two steps (mistral's window of 5
    is shorter than most of them)."""
    lm = loaded(arch)
    prompts = [prompt(n, seed=n)[0].tolist() for n in (5, 9, 1, 13)]
    alone = [lm.generate([p], 12)[0, len(p):].tolist() for p in prompts]
    batch = lm.batch(blocks=40, block_size=4)
    sids = [batch.add(p, 12) for p in prompts[:2]]
    batch.step()
    batch.step()
    sids += [batch.add(p, 12) for p in prompts[2:]]
    done = batch.run()
    assert [done[s] for s in sids] == alone
    assert len(batch.cache.free) == 40  # every block came back
    together = lm.generate(prompts, 12)  # the same through generate
    assert [t[len(p):].tolist() for t, p in zip(together, prompts)] == alone


def test_a_sequence_leaving_frees_its_blocks_and_the_others_go_on() -> None:
    lm = loaded("llama")
    a, b = prompt(6, seed=3)[0].tolist(), prompt(10, seed=4)[0].tolist()
    want_b = lm.generate([b], 8)[0, len(b):].tolist()
    batch = lm.batch(blocks=16, block_size=4)
    sa, sb = batch.add(a, 8), batch.add(b, 8)
    first = batch.step()
    used = 16 - len(batch.cache.free)
    assert batch.remove(sa) == [first[sa]]
    assert 16 - len(batch.cache.free) < used
    done = batch.run()
    assert done[sb] == want_b and batch.active == []


def test_a_step_the_pool_cannot_hold_changes_nothing() -> None:
    lm = loaded("qwen2")
    batch = lm.batch(blocks=5, block_size=4)
    s1 = batch.add(prompt(12)[0], 4)  # 3 blocks for its prompt
    batch.step()
    batch.add(prompt(9, seed=9)[0], 4)  # 3 more: only 2 are free
    lengths, free = dict(batch.cache.lengths), list(batch.cache.free)
    with pytest.raises(GuardError, match="blocks"):
        batch.step()
    assert batch.cache.lengths == lengths and batch.cache.free == free  # nothing was taken
    batch.remove(batch.active[-1])
    out = batch.run()
    assert len(out[s1]) == 4


def test_sampling_is_reproducible_and_top_k_1_is_greedy() -> None:
    lm = loaded("qwen2")
    ids = prompt(6, seed=7)
    options: dict[str, Any] = dict(do_sample=True, temperature=0.8, top_k=20, top_p=0.9, repetition_penalty=1.3)
    one = lm.generate(ids, 16, seed=11, **options)
    assert one.tolist() == lm.generate(ids, 16, seed=11, **options).tolist()
    others = {tuple(lm.generate(ids, 16, seed=s, **options)[0].tolist()) for s in range(12, 16)}
    assert len(others | {tuple(one[0].tolist())}) > 1  # the seed matters
    assert lm.generate(ids, 16, do_sample=True, top_k=1, seed=3).tolist() == lm.generate(ids, 16).tolist()


def _pick_reference(c: torch.Tensor, ids: torch.Tensor, u: torch.Tensor, temperature: float, top_k: int,
                    top_p: float) -> torch.Tensor:
    out = []
    for b in range(c.shape[0]):
        p = torch.exp((c[b] - c[b, 0]) / temperature)
        p[top_k:] = 0
        q = p / p.sum()
        before = torch.cumsum(q, 0) - q
        keep = (before < top_p) | (torch.arange(len(q)) == 0)
        r = torch.where(keep, q, torch.zeros_like(q))
        cum = torch.cumsum(r, 0)
        out.append(ids[b, int(torch.nonzero(cum > u[b] * r.sum())[0])])
    return torch.stack(out)


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, 64, 1.0), (0.7, 10, 0.9), (1.5, 50, 0.3)])
def test_the_sampling_kernels_follow_their_definition(temperature: float, top_k: int, top_p: float) -> None:
    lm = loaded("qwen2")
    g = torch.Generator().manual_seed(top_k)
    logits = torch.randn(5, VOCAB, generator=g) * 3
    seen = torch.rand(5, VOCAB, generator=g) < 0.1
    c, ids = lm.call("candidates", logits, seen, 1.2)
    pen = torch.where(seen, torch.where(logits > 0, logits / 1.2, logits * 1.2), logits)
    values, where = torch.topk(pen, 64)
    assert torch.equal(c, values) and torch.equal(ids, where)
    u = torch.rand(5, generator=g)
    got = lm.call("pick", c, ids, u, temperature, top_k, top_p)
    assert got.tolist() == _pick_reference(c, ids, u, temperature, top_k, top_p).tolist()


def test_top_k_0_samples_from_every_token() -> None:
    """transformers' top_k=0 is no limit: draws at a high temperature land outside the 64 best tokens; the
    draw is std.lm.sample_all's definition (the first cumulative probability past u times the total)."""
    lm = loaded("qwen2")
    ids = prompt(3, seed=4)
    drawn = {int(lm.generate(ids, 1, do_sample=True, top_k=0, temperature=50.0, seed=s)[0, -1]) for s in range(40)}
    logits = lm(ids, lm.new_cache(1)).reshape(-1, VOCAB)[-1]
    assert drawn - set(torch.topk(logits, 64).indices.tolist())
    g = torch.Generator().manual_seed(5)
    logits, u = torch.randn(3, VOCAB, generator=g) * 3, torch.rand(3, generator=g)
    seen = torch.rand(3, VOCAB, generator=g) < 0.1
    got = lm.call("sample_all", logits, seen, u, 1.2, 0.7)
    pen = torch.where(seen, torch.where(logits > 0, logits / 1.2, logits * 1.2), logits)
    p = torch.exp((pen - pen.max(1, keepdim=True).values) / 0.7)
    want = [int(torch.nonzero(torch.cumsum(p[b], 0) > u[b] * p[b].sum())[0]) for b in range(3)]
    assert got.tolist() == want


def test_sampling_options_are_checked_only_when_sampling() -> None:
    lm = loaded("qwen2")
    ids = prompt(3, seed=4)
    greedy = lm.generate(ids, 4).tolist()
    assert lm.generate(ids, 4, top_k=100, top_p=0.0, temperature=0.0).tolist() == greedy  # as transformers
    with pytest.raises(ValueError, match="top_k is at most 64"):
        lm.generate(ids, 4, do_sample=True, top_k=100)
    with pytest.raises(ValueError, match=r"top_p=0\.9 with top_k=0"):
        lm.generate(ids, 4, do_sample=True, top_k=0, top_p=0.9)


def test_a_vocabulary_under_64_samples_from_all_of_it(tmp_path: Path) -> None:
    cfg = config("llama", num_hidden_layers=1, vocab_size=32)
    model = transformers.LlamaForCausalLM(cfg).eval()
    randomize(model, seed=2)
    model.save_pretrained(tmp_path)
    lm = arke.models.from_pretrained(tmp_path, max_seq=32)
    ids = torch.tensor([[1, 2, 3]])
    assert lm.generate(ids, 8).tolist() == hf_generate(model, ids, 8).tolist()
    sampled = lm.generate(ids, 8, do_sample=True, top_k=0, seed=1)
    assert sampled.shape == (1, 11) and int(sampled.max()) < 32


def test_stop_tokens_end_a_sequence_and_pad_it() -> None:
    lm = loaded("qwen2")
    ids = torch.cat([prompt(4, seed=8), prompt(4, seed=9)])
    free = lm.generate(ids, 10)[:, 4:].tolist()
    stop = free[0][2]

    def ends(row: list[int]) -> int:  # the new tokens a row makes when it stops on `stop`
        return row.index(stop) + 1 if stop in row else 10

    got = lm.generate(ids, 10, eos_token_id=stop, pad_token_id=0)[:, 4:].tolist()
    assert len(got[0]) == max(ends(free[0]), ends(free[1]))  # generation ends when every row has stopped
    for row, want in zip(got, free):
        k = ends(want)
        assert row[:k] == want[:k] and all(t == 0 for t in row[k:])  # then padded


def test_bad_input_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    lm = loaded("qwen2")
    with pytest.raises(ValueError, match="max_seq"):
        lm.generate(prompt(MAX_SEQ), 1)
    with pytest.raises(GuardError, match="vocabulary"):
        lm.generate([[1, VOCAB]], 2)
    with pytest.raises(ValueError, match="top_p"):
        lm.generate(prompt(3), 2, do_sample=True, top_p=0.0)
    batch = lm.batch(blocks=20, block_size=4)
    sid = batch.add(prompt(5)[0], 6)
    batch.step()
    for bad in ([0] * MAX_SEQ, [-1, 2]):
        with pytest.raises((ValueError, GuardError)):
            batch.add(bad, 4)
    assert batch.active == [sid] and len(batch.run()[sid]) == 6  # the running sequence went on
    cache_ = lm.new_cache(1)
    with pytest.raises(GuardError, match="cache"):
        lm(prompt(3), lm.new_cache(2))
    assert cache_.length == 0


def test_bad_folders_are_refused(tmp_path: Path) -> None:
    # an architecture arke.models does not know
    transformers.GPTNeoXConfig(hidden_size=64, num_attention_heads=4, intermediate_size=96,
                               num_hidden_layers=1, vocab_size=VOCAB).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="unsupported model type 'gpt_neox'"):
        arke.models.from_pretrained(tmp_path)
    # a shard the index names is missing
    shard = tmp_path / "sharded"
    saved_model = saved("qwen2")[1]
    saved_model.save_pretrained(shard, max_shard_size="60KB")
    victim = sorted(shard.glob("*.safetensors"))[-1]
    victim.unlink()
    with pytest.raises(FileNotFoundError, match=victim.name):
        arke.models.from_pretrained(shard)
    # a shard whose tensors do not match config.json
    bad = tmp_path / "bad"
    saved_model.save_pretrained(bad)
    (bad / "config.json").write_text(json.dumps(json.loads((bad / "config.json").read_text())
                                                | {"intermediate_size": 80}))
    with pytest.raises(ValueError, match=r"80|96"):
        arke.models.from_pretrained(bad)
    # a config transformers itself refuses
    (bad / "config.json").write_text(json.dumps(json.loads((bad / "config.json").read_text())
                                                | {"hidden_size": 50, "head_dim": None}))
    with pytest.raises(ValueError, match="config"):
        arke.models.from_pretrained(bad)
    # a shard cut short, and an index that is not one: errors that name the file
    cut = tmp_path / "cut"
    saved_model.save_pretrained(cut)
    with open(cut / "model.safetensors", "r+b") as f:
        f.truncate(4000)
    with pytest.raises(ValueError, match=r"model\.safetensors is not a readable safetensors file"):
        arke.models.from_pretrained(cut)
    (shard / "model.safetensors.index.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a shard index"):
        arke.models.from_pretrained(shard)


def test_bf16_activations_follow_transformers_in_bf16() -> None:
    """dtype=torch.bfloat16: the layers of issue 12 (bf16 end to end); a paged batch asks for f32."""
    folder, _ = saved("qwen2")
    lm = arke.models.from_pretrained(folder, max_seq=32, dtype=torch.bfloat16)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    ids = prompt(9, seed=6)
    with torch.no_grad():
        want = hf(ids).logits.float()
    assert relative_error(lm(ids, lm.new_cache(1), every_token=True), want) < 2e-2
    with pytest.raises(ValueError, match="f32 activations"):
        lm.batch(blocks=8)


def test_gpt2_checks_its_own_limits(tmp_path: Path) -> None:
    folder, _ = saved("gpt2")
    with pytest.raises(ValueError, match="learned positions"):
        arke.models.from_pretrained(folder, max_seq=129)
    with pytest.raises(ValueError, match="int8"):
        arke.models.from_pretrained(folder, max_seq=32, weights="int8")
    lm = arke.models.from_pretrained(folder, max_seq=32, weights="bf16")  # bf16 weights: within their rounding
    ids = prompt(6)
    with torch.no_grad():
        want = saved("gpt2")[1](ids).logits
    assert relative_error(lm(ids, lm.new_cache(1), every_token=True), want) < 2e-2


def test_gpt2_with_an_odd_head_size(tmp_path: Path) -> None:
    """GPT-2 has no rotary embedding: a head of 15 (n_embd 60, 4 heads) runs as transformers runs it."""
    cfg = transformers.GPT2Config(n_embd=60, n_head=4, n_layer=1, vocab_size=VOCAB, n_positions=64,
                                  bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    randomize(model, seed=6)
    model.save_pretrained(tmp_path)
    lm = arke.models.from_pretrained(tmp_path, max_seq=32)
    ids = prompt(5, seed=3)
    with torch.no_grad():
        want = model(ids).logits
    assert relative_error(lm(ids, lm.new_cache(1), every_token=True), want) <= RTOL
    assert lm.generate(ids, 8).tolist() == hf_generate(model, ids, 8).tolist()


@pytest.mark.parametrize(("name", "shape"), [("transformer.wte.weight", (VOCAB + 20, 64)),
                                             ("transformer.wpe.weight", (128, 32)),
                                             ("transformer.ln_f.bias", (32,))])
def test_gpt2_tensors_of_the_wrong_shape_are_refused_at_load(tmp_path: Path, name: str, shape: tuple[int, ...]
                                                              ) -> None:
    from safetensors.torch import load_file, save_file

    folder, _ = saved("gpt2")
    tensors = load_file(folder / "model.safetensors")
    tensors[name] = torch.zeros(shape)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        arke.models.from_pretrained(tmp_path, max_seq=32)


def test_akc_generate_streams_ids_and_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    from arke.cli.app import main

    folder, hf = saved("llama")
    assert main(["generate", str(folder), "--ids", "1,2,3", "--max-new-tokens", "5", "--eos", "none"]) == 0
    out = capsys.readouterr()
    want = hf_generate(hf, torch.tensor([[1, 2, 3]]), 5)[0, 3:].tolist()
    assert out.out.strip() == ",".join(map(str, want))
    assert "decode: 4 steps" in out.err
    # with a tokenizer.json in the folder, text in and text out
    words = {f"w{i}": i for i in range(VOCAB)}
    tok = Tokenizer(WordLevel(words, unk_token="w0"))
    tok.pre_tokenizer = Whitespace()
    with_tok = tmp_path / "m"
    hf.save_pretrained(with_tok)
    tok.save(str(with_tok / "tokenizer.json"))
    assert main(["generate", str(with_tok), "--prompt", "w1 w2 w3", "--max-new-tokens", "5", "--eos", "none"]) == 0
    text = capsys.readouterr().out
    assert text.split() == ["w1", "w2", "w3"] + [f"w{i}" for i in want]
    assert main(["generate", str(folder), "--prompt", "hi"]) == 2  # no tokenizer.json: a usage error
    assert "tokenizer.json" in capsys.readouterr().err
