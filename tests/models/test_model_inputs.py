"""Hostile and unusual input to whole models: token ids, generation options, config.json values and checkpoint
tensors a layer does not compute. Each is refused by name before anything runs, or taken as transformers
takes it; nothing is dropped or truncated silently."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from hf_support import config, randomize
from test_causal_lm import VOCAB, hf_generate, loaded, prompt, saved

import arke.models
from arke.runtime.errors import GuardError


@pytest.mark.parametrize(("ids", "message"), [
    ([[1.7, 2.2, 3.9]], "integer token ids, not 1.7"),
    ([[True, False]], "integer token ids, not True"),
    ([[1, 2], 3], "mixes token ids and rows"),
    ([torch.tensor([1.0, 2.0])], "1-D tensor of integer ids"),
])
def test_ids_that_are_not_integers_are_refused(ids: object, message: str) -> None:
    with pytest.raises(GuardError, match=message):
        loaded("qwen2").generate(ids, 2)


def test_rows_given_as_tensors_are_one_batch() -> None:
    lm = loaded("qwen2")
    rows = [torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])]
    assert torch.equal(lm.generate(rows, 3), lm.generate(torch.stack(rows), 3))
    assert torch.equal(lm.generate([np.int64(1), np.int64(2)], 2), lm.generate([1, 2], 2))


def test_numpy_rows_ragged_or_not_and_meta_ids() -> None:
    lm = loaded("qwen2")
    ragged = lm.generate([np.array([1, 2]), np.array([3])], 2)
    assert [r.tolist()[:2] for r in ragged] == [[1, 2], [3, lm.generate([[3]], 1)[0, 1].item()]]
    assert torch.equal(lm.generate(np.array([[1, 2]]), 2), lm.generate([[1, 2]], 2))
    with pytest.raises(GuardError, match="meta device"):
        lm.generate(torch.tensor([[1, 2]], device="meta"), 2)


def test_caches_too_big_for_memory_are_a_guard_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from arke.models import lm as lm_module

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")

    model = loaded("qwen2")
    monkeypatch.setattr(lm_module, "ModelCache", refuse)
    with pytest.raises(GuardError, match=r"do not fit in this machine's memory.*smaller max_seq"):
        model.new_cache(1)


def test_a_ragged_batch_takes_one_sequence_per_prompt() -> None:
    lm = loaded("qwen2")
    with pytest.raises(ValueError, match="each prompt of a ragged batch is one sequence"):
        lm.generate([torch.tensor([[1, 2], [3, 4]]), torch.tensor([5])], 2)
    for bad in (2.5, None, -1):
        with pytest.raises(ValueError, match="max_new_tokens must be a non-negative integer"):
            lm.generate([[1, 2], [3, 4, 5]], bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("options", "message"), [
    ({"do_sample": True, "top_k": 2.7}, "top_k must be an integer, not 2.7"),
    ({"do_sample": True, "top_k": "5"}, "top_k must be an integer"),
    ({"do_sample": True, "temperature": "hot"}, "temperature must be a number"),
    ({"do_sample": True, "temperature": 0.0}, "temperature must be positive"),
    ({"eos_token_id": True}, "eos_token_id must be token ids"),
    ({"eos_token_id": torch.tensor([1.5])}, "eos_token_id must be token ids"),
    ({"do_sample": True, "seed": 2 ** 70}, r"seed must be an integer in \[0, 2\*\*64\)"),
    ({"do_sample": True, "seed": 1.5}, "seed must be an integer, not 1.5"),
])
def test_bad_options_are_named(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        loaded("qwen2").generate(prompt(3), 2, **options)


def test_options_as_transformers_takes_them() -> None:
    """None is the default; one id may be a NumPy or 0-d/1-element tensor; greedy decoding ignores temperature."""
    lm = loaded("qwen2")
    ids = prompt(4)
    greedy = lm.generate(ids, 4)
    assert torch.equal(lm.generate(ids, 4, temperature=0.0), greedy)
    a = lm.generate(ids, 4, do_sample=True, top_k=None, top_p=None, temperature=None, seed=3)
    b = lm.generate(ids, 4, do_sample=True, top_k=50, top_p=1.0, temperature=1.0, seed=3)
    assert torch.equal(a, b)
    stop = int(greedy[0, 5])
    length = 4 + greedy[0, 4:].tolist().index(stop) + 1  # up to the first time it is generated
    for eos in (stop, np.int64(stop), torch.tensor(stop), torch.tensor([stop])):
        assert lm.generate(ids, 4, eos_token_id=eos).shape[1] == length


def test_a_bad_sequence_does_not_use_up_an_id() -> None:
    batch = loaded("qwen2").batch(blocks=8, block_size=4)
    with pytest.raises(ValueError, match="seed"):
        batch.add([1, 2], 2, do_sample=True, seed=-1)
    assert batch.add([1, 2], 2) == 0


def _llama_folder(tmp_path: Path, **overrides: object) -> Path:
    cfg = config("llama", num_hidden_layers=1, vocab_size=VOCAB, **overrides)
    model = transformers.LlamaForCausalLM(cfg).eval()
    randomize(model, seed=3)
    model.save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("overrides", "message"), [
    ({"attention_bias": True}, r"output projection with a bias \(self_attn\.o_proj\.bias"),
    ({"mlp_bias": True}, r"tensors this architecture's layer does not use: mlp\.down_proj\.bias"),
])
def test_weights_a_layer_does_not_compute_are_refused(tmp_path: Path, overrides: dict[str, object],
                                                      message: str) -> None:
    """A Llama with biases Arke's layer has no place for: refused (its results were silently wrong)."""
    with pytest.raises(ValueError, match=message):
        arke.models.from_pretrained(_llama_folder(tmp_path, **overrides))


@pytest.mark.parametrize(("key", "value", "message"), [
    ("num_attention_heads", 0, "num_attention_heads must be a positive integer, not 0"),
    # said as config.json's (it was "layers must be between 1 and 0 ..., not None", of an option nobody gave)
    ("num_hidden_layers", 0, "config.json: num_hidden_layers must be a positive integer, not 0"),
    ("vocab_size", 200, r"the token embeddings are \[320, 64\], but config.json says vocabulary 200"),
    ("sliding_window", -1, "sliding_window must be a positive number of tokens or null, not -1"),
    ("sliding_window", 0, "sliding_window must be a positive number of tokens or null, not 0"),
    ("rope_scaling", {"rope_type": "foo", "factor": 2.0}, "rope scaling type 'foo' is not one transformers knows"),
])
def test_config_values_no_model_can_have_are_refused(tmp_path: Path, key: str, value: object, message: str) -> None:
    folder = tmp_path / "m"
    shutil.copytree(saved("mistral" if key == "sliding_window" else "qwen2")[0], folder)
    record = json.loads((folder / "config.json").read_text())
    if key == "rope_scaling":
        record.pop("rope_parameters", None)
    if key == "num_hidden_layers":
        record.pop("layer_types", None)  # transformers checks its length against the count
    (folder / "config.json").write_text(json.dumps(record | {key: value}))
    with pytest.raises(ValueError, match=message):
        arke.models.from_pretrained(folder)


@pytest.mark.parametrize("max_seq", [2.5, None, 0, True])
def test_max_seq_is_a_positive_integer(max_seq: object) -> None:
    with pytest.raises(ValueError, match="max_seq must be a positive integer"):
        arke.models.from_pretrained(saved("qwen2")[0], max_seq=max_seq)  # type: ignore[arg-type]


def test_akc_generate_needs_a_readable_tokenizer_only_for_text(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from arke.cli.app import main

    folder, hf = saved("llama")
    bad = tmp_path / "m"
    shutil.copytree(folder, bad)
    (bad / "tokenizer.json").write_text("{not json")
    assert main(["generate", str(bad), "--ids", "1,2,3", "--max-new-tokens", "3", "--eos", "none"]) == 0
    want = hf_generate(hf, torch.tensor([[1, 2, 3]]), 3)[0, 3:].tolist()
    assert capsys.readouterr().out.strip() == ",".join(map(str, want))
    assert main(["generate", str(bad), "--prompt", "hi", "--max-new-tokens", "3"]) == 2
    assert "cannot be read as a tokenizer" in capsys.readouterr().err
    assert main(["generate", str(folder), "--ids", "\u00b2", "--max-new-tokens", "3"]) == 2
    assert "--ids takes token ids" in capsys.readouterr().err


def test_akc_generate_stops_at_the_folders_eos_unless_told(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As transformers' generate: the folder's eos_token_id (generation_config.json, then config.json) ends it."""
    from arke.cli.app import main

    folder, _ = saved("llama")
    assert main(["generate", str(folder), "--ids", "1,2,3", "--max-new-tokens", "6", "--eos", "none"]) == 0
    free = [int(t) for t in capsys.readouterr().out.strip().split(",")]
    stop = tmp_path / "m"
    shutil.copytree(folder, stop)
    (stop / "generation_config.json").write_text(json.dumps({"eos_token_id": [free[1]]}))
    assert main(["generate", str(stop), "--ids", "1,2,3", "--max-new-tokens", "6"]) == 0
    assert capsys.readouterr().out.strip() == ",".join(map(str, free[:free.index(free[1]) + 1]))
    assert main(["generate", str(stop), "--ids", "1,2,3", "--max-new-tokens", "6", "--eos", "x"]) == 2
    assert "--eos takes token ids" in capsys.readouterr().err
    # the folder's id past the vocabulary (GPT-2's 50256 in a small model): said, and generation goes on
    (stop / "generation_config.json").write_text(json.dumps({"eos_token_id": 10 ** 6}))
    assert main(["generate", str(stop), "--ids", "1,2,3", "--max-new-tokens", "6"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == ",".join(map(str, free)) and "outside the vocabulary" in out.err
    assert main(["generate", str(stop), "--ids", "1,2,3", "--max-new-tokens", "2", "--max-seq", "0"]) == 2
    assert "max_seq" in capsys.readouterr().err


def test_generated_text_is_printed_once_and_whole_characters_only() -> None:
    """Byte-fallback tokens (``<0xE2> <0x82> <0xAC>`` = "€") decode to U+FFFD until the character is whole: the
    stream holds them back, and never prints the text again from the start."""
    from arke.cli.generate import TextStream

    pieces = {6: b"a", 3: b"\xe2", 4: b"\x82", 5: b"\xac", 7: b" b"}

    def decode(ids: list[int]) -> str:
        return b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")

    stream = TextStream(decode, [6])
    out = [stream.push(t) for t in (3, 4, 5, 7, 3, 4)]
    assert out == ["", "", "€", " b", "", ""]
    assert stream.flush() == "\ufffd"  # a character left incomplete at the end: as the tokenizer decodes it
    assert "a" + "".join(out) + "\ufffd" == decode([6, 3, 4, 5, 7, 3, 4])
