"""arke.models against Hugging Face transformers: whole decoder layers, prefill then decode, on every target.

Each compiled layer runs a sequence in chunks (a prefill, more prefill chunks, single-token decode
steps) against one KV cache and must match transformers' layer run over the whole sequence at once:
in f32 to 1e-4 of the output's scale, with bf16 / int8 weights against transformers' layer holding
the same rounded / dequantized weights. Bad calls raise a GuardError and leave the cache as it was.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from hf_support import (
    ARCHS,
    CONVERT,
    HIDDEN,
    MAX_SEQ,
    PREFIX,
    RTOL,
    WINDOW,
    config,
    hf_layer,
    inputs,
    randomize,
    reference,
    relative_error,
    run_chunks,
    with_weights,
)
from safetensors.torch import save_file

import arke.models
from arke.models.config import KVCache
from arke.models.layer import CompiledLayer
from arke.runtime.errors import DTypeError, GuardError, ShapeError
from arke.targets.triton import kernel as gpu

TARGETS = ("llvm", "triton")
PREFILL, DECODE = 9, 16
CHUNKS = [PREFILL] + [1] * DECODE
#: Triton's CPU interpreter spends ~0.3 s per decode step: fewer steps there (still past Mistral's window).
TRITON_CHUNKS = [PREFILL] + [1] * 6
#: Triton's interpreter evaluates masked-off lanes too, and NumPy warns about their inf / nan.
INTERPRETER_NOISE = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")


def need(target: str) -> None:
    """Skip a triton test where Triton cannot run (no triton package, no GPU and no interpreter)."""
    if target == "triton" and not gpu.runnable():
        pytest.skip("triton cannot run here (no triton, or neither a GPU nor TRITON_INTERPRET=1)")


def compiled(arch: str, target: str = "llvm", weights: str = "f32", seed: int = 0, **overrides: Any
             ) -> tuple[Any, Any, CompiledLayer]:
    """A config, a random transformers layer of ``arch`` and its compiled twin."""
    cfg = config(arch, **overrides)
    layer = hf_layer(arch, cfg, seed)
    return cfg, layer, arke.models.from_transformers(layer, cfg, target=target, max_seq=MAX_SEQ, weights=weights)


# ---------------------------------------------------------------- numerics


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("arch", ARCHS)
@INTERPRETER_NOISE
def test_prefill_then_decode_matches_transformers(arch: str, target: str) -> None:
    """Batch 2: a prefill of 9 tokens, then 16 single-token decode steps (6 on triton), in f32."""
    need(target)
    cfg, layer, c = compiled(arch, target)
    chunks = CHUNKS if target == "llvm" else TRITON_CHUNKS
    x, pos = inputs(2, sum(chunks))
    ref = reference(arch, layer, cfg, x, pos)
    y = run_chunks(c, x, pos, chunks)
    assert y.shape == x.shape and y.dtype == torch.float32
    assert relative_error(y, ref) <= RTOL


@pytest.mark.parametrize("kind", ["bf16", "int8"])
@pytest.mark.parametrize("arch", ARCHS)
def test_weight_kinds_match_rounded_transformers(arch: str, kind: str) -> None:
    """bf16 / int8 weights: the same as transformers with its matrices rounded / dequantized alike (llvm)."""
    cfg, layer, c = compiled(arch, weights=kind)
    x, pos = inputs(2, sum(CHUNKS))
    y = run_chunks(c, x, pos, CHUNKS)
    assert relative_error(y, reference(arch, with_weights(layer, CONVERT[kind]), cfg, x, pos)) <= RTOL
    # ... and the rounding is real: against the f32 layer the error is far larger
    assert relative_error(y, reference(arch, layer, cfg, x, pos)) > 10 * RTOL


@pytest.mark.parametrize(("arch", "kind"), [("llama", "int8"), ("mixtral", "bf16")])
@INTERPRETER_NOISE
def test_weight_kinds_on_triton(arch: str, kind: str) -> None:
    """bf16 / int8 weights on the triton target: a prefill and a few decode steps."""
    need("triton")
    cfg, layer, c = compiled(arch, "triton", kind)
    chunks = [6, 1, 1, 1]
    x, pos = inputs(2, sum(chunks))
    y = run_chunks(c, x, pos, chunks)
    assert relative_error(y, reference(arch, with_weights(layer, CONVERT[kind]), cfg, x, pos)) <= RTOL


def test_weight_bytes_shrink_with_the_weight_kind() -> None:
    """f32 > bf16 > int8 (with its f32 scales) for the same layer; the int8 scales are one per output row."""
    cfg = config("llama")
    layer = hf_layer("llama", cfg)
    sizes = {k: arke.models.from_transformers(layer, cfg, max_seq=MAX_SEQ, weights=k).weight_bytes
             for k in ("f32", "bf16", "int8")}
    assert sizes["f32"] > sizes["bf16"] > sizes["int8"]
    matrices = sum(p.numel() for n, p in layer.named_parameters() if n.endswith("proj.weight"))
    assert sizes["f32"] - sizes["bf16"] == 2 * matrices


@pytest.mark.parametrize(("arch", "batch", "target"), [
    ("llama", 1, "llvm"), ("llama", 3, "llvm"), ("qwen2", 3, "llvm"), ("mistral", 3, "llvm"), ("mixtral", 3, "llvm"),
    ("mistral", 3, "triton"),
])
@INTERPRETER_NOISE
def test_chunked_prefill_and_batches(arch: str, batch: int, target: str) -> None:
    """Prefill chunks appended to a non-empty cache, mixed with decode steps; rows at different positions."""
    need(target)
    cfg, layer, c = compiled(arch, target)
    chunks = [5, 4, 1, 3, 1, 1] if target == "llvm" else [4, 3, 1]
    offsets = [0, 7, 20][:batch]  # each sequence's rotary positions start elsewhere
    x, pos = inputs(batch, sum(chunks), seed=batch, offsets=offsets)
    ref = reference(arch, layer, cfg, x, pos)
    assert relative_error(run_chunks(c, x, pos, chunks), ref) <= RTOL


def test_window_crossing_chunks_sees_only_the_window() -> None:
    """Mistral's window is shorter than the prefill: tokens out of the window do not change a later output."""
    _, _, c = compiled("mistral")
    x, pos = inputs(1, 12)
    y = run_chunks(c, x, pos, [8, 4])
    x2 = x.clone()
    x2[:, :12 - WINDOW] += 1.0  # only keys the last token cannot see
    y2 = run_chunks(c, x2, pos, [8, 4])
    assert relative_error(y2[:, -1], y[:, -1]) <= 1e-6  # rounding aside, the same
    first = 12 - WINDOW  # the first unchanged token: it sees changed keys
    assert relative_error(y2[:, first], y[:, first]) > 1e-2


@pytest.mark.parametrize("rope", [
    {"rope_type": "default"},
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    {"rope_type": "dynamic", "factor": 2.0},
])
def test_rope_types(rope: dict[str, Any]) -> None:
    """Every rope type transformers computes frequencies (and an attention scaling) for is reproduced."""
    cfg, layer, c = compiled("llama", rope_scaling=rope)
    x, pos = inputs(2, 12, offsets=[0, 40])
    assert relative_error(run_chunks(c, x, pos, [8, 1, 1, 1, 1]), reference("llama", layer, cfg, x, pos)) <= RTOL


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_output_has_the_input_dtype(dtype: torch.dtype) -> None:
    """x of another float dtype: computed in f32, returned in x's dtype."""
    cfg, layer, c = compiled("llama")
    x, pos = inputs(2, 6)
    x = x.to(dtype)
    y = run_chunks(c, x, pos, [5, 1])
    assert y.dtype == dtype
    ref = reference("llama", layer, cfg, x.float(), pos)
    assert relative_error(y, ref) <= (RTOL if dtype == torch.float64 else 1e-2)


def test_outputs_are_not_overwritten_by_later_calls() -> None:
    """A call's result is its own: later calls (reusing the planned arena) leave it alone."""
    _, _, c = compiled("llama")
    x, pos = inputs(2, 4)
    cache = c.new_cache(2)
    first = c(x[:, :1], pos[:, :1].contiguous(), cache)
    kept = first.clone()
    for t in range(1, 4):
        c(x[:, t:t + 1], pos[:, t:t + 1].contiguous(), cache)
    assert torch.equal(first, kept)


# ---------------------------------------------------------------- dispatch


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("arch", "kernel"), [("llama", "attn_cached"), ("mistral", "attn_window")])
def test_attention_strategy_by_shape(arch: str, kernel: str, target: str) -> None:
    """One new token per sequence runs split_kv; a prefill runs flash."""
    need(target)
    _, _, c = compiled(arch, target)
    decode, prefill = c.dispatches(2, 1), c.dispatches(1, 8)
    assert f"{kernel}: attention (split_kv)" in decode
    assert f"{kernel}: attention (flash)" in prefill
    assert [line.split(":")[0] for line in decode] == ["attn_in", kernel, "attn_out", "mlp"]


def test_moe_dispatches_and_repr() -> None:
    """A Mixtral layer runs the router, the experts and the combination; its repr says so."""
    _, _, c = compiled("mixtral", weights="int8")
    names = [line.split(":")[0] for line in c.dispatches(2, 1)]
    assert names == ["attn_in_q", "attn_cached", "attn_out_q", "moe_route", "expert_q", "moe_combine"]
    assert "8 experts (top 2)" in repr(c) and "int8 weights" in repr(c) and f"max_seq {MAX_SEQ}" in repr(c)


# ---------------------------------------------------------------- guards


@pytest.fixture(scope="module")
def guarded() -> tuple[Any, Any, CompiledLayer]:
    """A compiled llama layer (llvm) for the guard tests."""
    return compiled("llama")


@pytest.fixture
def filled(guarded: tuple[Any, Any, CompiledLayer]) -> KVCache:
    """A cache of batch 2 holding 9 tokens."""
    _, _, c = guarded
    x, pos = inputs(2, 9)
    cache = c.new_cache(2)
    c(x, pos, cache)
    return cache


def _decode_args(batch: int = 2, tokens: int = 1, start: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch, tokens, HIDDEN)
    return x, (start + torch.arange(tokens))[None].expand(batch, tokens).contiguous()


def _bad_calls() -> dict[str, tuple[Callable[[CompiledLayer, KVCache], tuple[Any, Any, Any]], type, str, str]]:
    """name -> (make the arguments, error class, rule, a pattern of the message)."""
    x, pos = _decode_args()
    return {
        "hidden size": (lambda c, k: (torch.randn(2, 1, HIDDEN - 1), pos, k), ShapeError, "dim",
                        rf"\[batch, tokens, {HIDDEN}\].*\[2, 1, {HIDDEN - 1}\]"),
        "x of rank 2": (lambda c, k: (torch.randn(2, HIDDEN), pos, k), ShapeError, "dim", "batch, tokens"),
        "no tokens": (lambda c, k: (torch.randn(2, 0, HIDDEN), pos[:, :0], k), ShapeError, "dim", "one token"),
        "position = max_seq": (lambda c, k: (x, torch.full((2, 1), MAX_SEQ), k), ShapeError, "dim", "max_seq"),
        "negative position": (lambda c, k: (x, torch.full((2, 1), -1), k), ShapeError, "dim", r"\[0, 64\)"),
        "more tokens than free slots": (lambda c, k: (torch.randn(2, MAX_SEQ - 8, HIDDEN),
                                                      torch.zeros(2, MAX_SEQ - 8, dtype=torch.int64), k),
                                        ShapeError, "dim", "free slots.*max_seq"),
        "cache of another batch": (lambda c, k: (*_decode_args(3), k), ShapeError, "dim", "2 sequences.*x has 3"),
        "cache of another layer": (lambda c, k: (x, pos, _other_layer().new_cache(2)), DTypeError, "type",
                                   "this layer's new_cache"),
        "not a cache": (lambda c, k: (x, pos, (k.k, k.v)), DTypeError, "type", "new_cache"),
        "positions of the wrong shape": (lambda c, k: (x, torch.zeros(2, 2, dtype=torch.int64), k), ShapeError,
                                         "dim", r"positions has shape \[2, 2\]"),
        "positions not integer": (lambda c, k: (x, pos.float(), k), DTypeError, "type", "int64"),
        "positions a list": (lambda c, k: (x, [[9], [9]], k), DTypeError, "type", "int64"),
        "x not float": (lambda c, k: (x.to(torch.int32), pos, k), DTypeError, "type", "float.*int32"),
        "x not a tensor": (lambda c, k: (x.numpy(), pos, k), DTypeError, "type", "float torch tensor.*ndarray"),
    }


_OTHER: list[CompiledLayer] = []


def _other_layer() -> CompiledLayer:
    """A second compiled layer of the same config (its caches fit in shape, but are not the guarded layer's)."""
    if not _OTHER:
        _OTHER.append(compiled("llama", seed=5)[2])
    return _OTHER[0]


@pytest.mark.parametrize("case", list(_bad_calls()))
def test_bad_call_raises_and_changes_nothing(case: str, guarded: tuple[Any, Any, CompiledLayer],
                                             filled: KVCache) -> None:
    """Each bad call raises a GuardError (the right subclass, rule and message) before the cache changes."""
    _, _, c = guarded
    make, error, rule, pattern = _bad_calls()[case]
    args = make(c, filled)
    length, k, v = filled.length, filled.k.clone(), filled.v.clone()
    with pytest.raises(error, match=pattern) as info:
        c(*args)
    assert isinstance(info.value, GuardError) and isinstance(info.value, ValueError)
    assert info.value.rule == rule and info.value.kernel == c.name
    assert filled.length == length and torch.equal(filled.k, k) and torch.equal(filled.v, v)


def test_layer_still_right_after_bad_calls() -> None:
    """After every kind of bad call, decoding goes on and still matches transformers."""
    cfg, layer, c = compiled("llama")
    x, pos = inputs(2, 12)
    cache = c.new_cache(2)
    ys = [c(x[:, :9], pos[:, :9].contiguous(), cache)]
    for make, error, _, _ in _bad_calls().values():
        with pytest.raises(error):
            c(*make(c, cache))
    ys += [c(x[:, t:t + 1], pos[:, t:t + 1].contiguous(), cache) for t in range(9, 12)]
    assert relative_error(torch.cat(ys, 1), reference("llama", layer, cfg, x, pos)) <= RTOL


def test_full_cache_refuses_one_more_token() -> None:
    """A cache holding max_seq tokens takes no more."""
    _, _, c = compiled("llama")
    cache = c.new_cache(1)
    x, pos = inputs(1, MAX_SEQ)
    c(x, pos, cache)
    assert cache.length == MAX_SEQ
    with pytest.raises(ShapeError, match="0 free slots"):
        c(x[:, :1], pos[:, :1], cache)
    assert cache.length == MAX_SEQ


def test_bad_layer_arguments() -> None:
    """Unknown weight kinds, max_seq below 1 and bad cache batches are refused clearly."""
    cfg = config("llama")
    layer = hf_layer("llama", cfg)
    with pytest.raises(ValueError, match="f32, bf16, f16, int8"):
        arke.models.from_transformers(layer, cfg, weights="fp16")
    with pytest.raises(ValueError, match="max_seq"):
        arke.models.from_transformers(layer, cfg, max_seq=0)
    c = arke.models.from_transformers(layer, cfg, max_seq=MAX_SEQ)
    for batch in (0, -1, 1.5):
        with pytest.raises(ValueError, match="batch"):
            c.new_cache(batch)  # type: ignore[arg-type]
    cache = c.new_cache(3)
    assert (cache.k.shape, cache.length) == ((3, 2, MAX_SEQ, 16), 0)
    assert cache.nbytes == 2 * 3 * 2 * MAX_SEQ * 16 * 4


# ---------------------------------------------------------------- unsupported configs


def test_unsupported_activation() -> None:
    """A non-SwiGLU MLP is refused, naming the activation."""
    cfg = config("llama", hidden_act="gelu")
    with pytest.raises(ValueError, match="gelu"):
        arke.models.layer_config(cfg)
    with pytest.raises(ValueError, match="activation 'gelu'"):
        arke.models.from_transformers(hf_layer("llama", cfg), cfg)


def test_unknown_model_type() -> None:
    """A config of a model type arke.models does not know is refused, naming it and the known ones."""
    cfg = transformers.GPT2Config(n_embd=64, n_layer=1, n_head=4)
    with pytest.raises(ValueError, match=r"unsupported model type 'gpt2'.*llama"):
        arke.models.layer_config(cfg)
    with pytest.raises(ValueError, match="gpt2"):
        arke.models.from_transformers(hf_layer("llama", config("llama")), cfg)


def test_not_a_decoder_layer() -> None:
    """Something other than a decoder layer is refused."""
    cfg = config("llama")
    with pytest.raises(ValueError, match="decoder layer"):
        arke.models.from_transformers(torch.nn.Linear(4, 4), cfg)


def test_layer_config_reads_the_config() -> None:
    """Sizes, GQA, window and experts as the config says."""
    spec = arke.models.layer_config(config("qwen2"))
    assert (spec.hidden, spec.heads, spec.kv_heads, spec.head_dim, spec.window, spec.experts) == (64, 7, 1, 16,
                                                                                                  None, 0)
    assert arke.models.layer_config(config("mistral")).window == WINDOW
    moe = arke.models.layer_config(config("mixtral"))
    assert (moe.experts, moe.top_k, moe.intermediate) == (8, 2, 96)
    assert len(moe.inv_freq) == 8


# ---------------------------------------------------------------- model folders


CAUSAL_LM = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mixtral": "MixtralForCausalLM"}


@pytest.mark.parametrize(("arch", "shard"), [("llama", None), ("qwen2", "60KB"), ("mixtral", None)])
def test_from_pretrained_matches_the_model_layer(arch: str, shard: str | None, tmp_path: Path) -> None:
    """Layer 1 of a saved 2-layer model (one file, or shards with an index) equals model.model.layers[1]."""
    cfg = config(arch, num_hidden_layers=2)
    model = getattr(transformers, CAUSAL_LM[arch])(cfg).eval()
    randomize(model, seed=3)
    model.save_pretrained(tmp_path, **({"max_shard_size": shard} if shard else {}))
    if shard:
        assert (tmp_path / "model.safetensors.index.json").exists()
        assert len(list(tmp_path.glob("*.safetensors"))) > 1
    c = arke.models.layer_from_pretrained(tmp_path, 1, max_seq=MAX_SEQ)
    assert c.name == f"{PREFIX[arch]}DecoderLayer"
    hf = model.model.layers[1]
    x, pos = inputs(2, sum(CHUNKS))
    assert relative_error(run_chunks(c, x, pos, CHUNKS), reference(arch, hf, cfg, x, pos)) <= RTOL
    # layer 0 is a different layer
    c0 = arke.models.layer_from_pretrained(tmp_path, 0, max_seq=MAX_SEQ)
    assert relative_error(run_chunks(c0, x, pos, CHUNKS), reference(arch, model.model.layers[0], cfg, x, pos)
                          ) <= RTOL


@INTERPRETER_NOISE
def test_from_pretrained_int8_on_triton(tmp_path: Path) -> None:
    """from_pretrained takes a target and weight kind like from_transformers."""
    need("triton")
    cfg = config("llama", num_hidden_layers=1)
    model = transformers.LlamaForCausalLM(cfg).eval()
    randomize(model, seed=4)
    model.save_pretrained(tmp_path)
    c = arke.models.layer_from_pretrained(tmp_path, 0, target="triton", max_seq=MAX_SEQ, weights="int8")
    assert c.target == "triton" and c.kind == "int8"
    x, pos = inputs(2, 6)
    ref = reference("llama", with_weights(model.model.layers[0], CONVERT["int8"]), cfg, x, pos)
    assert relative_error(run_chunks(c, x, pos, [5, 1]), ref) <= RTOL


def _mixtral_v4_checkpoint(folder: Path, layers: int = 1) -> tuple[Any, dict[str, torch.Tensor]]:
    """A Mixtral folder in transformers 4's naming (``block_sparse_moe.experts.X.w1/w2/w3``); config and tensors."""
    cfg = config("mixtral", num_hidden_layers=layers)
    c = cfg
    d, f, e = c.hidden_size, c.intermediate_size, c.head_dim
    gen = torch.Generator().manual_seed(11)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen) * 0.2

    tensors: dict[str, torch.Tensor] = {"model.embed_tokens.weight": rand(c.vocab_size, d)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {p + "input_layernorm.weight": rand(d), p + "post_attention_layernorm.weight": rand(d),
                    p + "self_attn.q_proj.weight": rand(c.num_attention_heads * e, d),
                    p + "self_attn.k_proj.weight": rand(c.num_key_value_heads * e, d),
                    p + "self_attn.v_proj.weight": rand(c.num_key_value_heads * e, d),
                    p + "self_attn.o_proj.weight": rand(d, c.num_attention_heads * e),
                    p + "block_sparse_moe.gate.weight": rand(c.num_local_experts, d)}
        for x in range(c.num_local_experts):
            q = f"{p}block_sparse_moe.experts.{x}."
            tensors |= {q + "w1.weight": rand(f, d), q + "w3.weight": rand(f, d), q + "w2.weight": rand(d, f)}
    save_file(tensors, str(folder / "model.safetensors"))
    cfg.to_json_file(str(folder / "config.json"))
    return cfg, tensors


def test_from_pretrained_transformers4_mixtral(tmp_path: Path) -> None:
    """A Mixtral checkpoint with per-expert w1/w3/w2 tensors loads as the fused experts of transformers 5."""
    cfg, t = _mixtral_v4_checkpoint(tmp_path, layers=2)
    hf = hf_layer("mixtral", cfg, index=1)
    p = "model.layers.1."
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if not name.startswith("mlp."):
                param.copy_(t[p + name])
        hf.mlp.gate.weight.copy_(t[p + "block_sparse_moe.gate.weight"])
        for x in range(cfg.num_local_experts):
            q = f"{p}block_sparse_moe.experts.{x}."
            hf.mlp.experts.gate_up_proj[x] = torch.cat([t[q + "w1.weight"], t[q + "w3.weight"]])
            hf.mlp.experts.down_proj[x] = t[q + "w2.weight"]
    c = arke.models.layer_from_pretrained(tmp_path, 1, max_seq=MAX_SEQ)
    x, pos = inputs(2, sum(CHUNKS))
    assert relative_error(run_chunks(c, x, pos, CHUNKS), reference("mixtral", hf, cfg, x, pos)) <= RTOL


def test_from_pretrained_errors(tmp_path: Path) -> None:
    """No config.json, a layer index out of range, a missing tensor, an unsupported model type: clear errors."""
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        arke.models.layer_from_pretrained(tmp_path, 0)
    _, tensors = _mixtral_v4_checkpoint(tmp_path)
    for index in (1, -1):
        with pytest.raises(ValueError, match=rf"layer {index} does not exist.*1 layers"):
            arke.models.layer_from_pretrained(tmp_path, index)
    del tensors["model.layers.0.self_attn.o_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"layer 0 of .* lacks self_attn\.o_proj\.weight"):
        arke.models.layer_from_pretrained(tmp_path, 0)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        arke.models.layer_from_pretrained(tmp_path, 0)
    (tmp_path / "config.json").write_text(json.dumps(transformers.GPT2Config(n_layer=1).to_dict()))
    with pytest.raises(ValueError, match="unsupported model type 'gpt2'"):
        arke.models.layer_from_pretrained(tmp_path, 0)


def test_from_pretrained_missing_expert_tensor(tmp_path: Path) -> None:
    """A transformers-4 Mixtral checkpoint without one expert's w2 is refused like any missing tensor."""
    _, tensors = _mixtral_v4_checkpoint(tmp_path)
    del tensors["model.layers.0.block_sparse_moe.experts.3.w2.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"lacks block_sparse_moe\.experts\.3\.w2\.weight"):
        arke.models.layer_from_pretrained(tmp_path, 0)


def test_from_pretrained_base_model_checkpoint(tmp_path: Path) -> None:
    """A base model's checkpoint keeps its layers under ``layers.N.`` (no ``model.`` prefix)."""
    cfg = config("llama", num_hidden_layers=2)
    model = transformers.LlamaModel(cfg).eval()
    randomize(model, seed=5)
    model.save_pretrained(tmp_path)
    c = arke.models.layer_from_pretrained(tmp_path, 1, max_seq=MAX_SEQ)
    x, pos = inputs(1, sum(CHUNKS))
    assert relative_error(run_chunks(c, x, pos, CHUNKS), reference("llama", model.layers[1], cfg, x, pos)) <= RTOL


def test_calls_from_two_threads_are_serialised() -> None:
    """Each call shape has one arena: concurrent calls (own caches) must still give exact results."""
    import threading

    cfg = config("llama")
    hf = hf_layer("llama", cfg)
    c = arke.models.from_transformers(hf, cfg, max_seq=MAX_SEQ)
    x, pos = inputs(2, sum(CHUNKS))
    want = run_chunks(c, x, pos, CHUNKS)
    got: list[torch.Tensor] = []

    def work() -> None:
        for _ in range(4):
            got.append(run_chunks(c, x, pos, CHUNKS))

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and all(torch.equal(g, want) for g in got)


@pytest.mark.parametrize("top_k", [0, 9])
def test_a_mixtral_top_k_outside_its_experts_is_refused_by_name(top_k: Any) -> None:
    """k = 0 was read as 2 (`or 2`), k past the experts failed in torch.topk at the first call."""
    with pytest.raises(ValueError, match="num_experts_per_tok must be a whole number from 1 to num_local_experts"):
        arke.models.layer_config(config("mixtral", num_experts_per_tok=top_k))


@pytest.mark.parametrize(("rope", "limit"), [
    ({"rope_type": "dynamic", "factor": 2.0}, 256),
    ({"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
      "original_max_position_embeddings": 32}, 32),
])
def test_rope_types_that_change_with_the_length_bound_max_seq(rope: dict[str, Any], limit: int) -> None:
    """transformers rescales dynamic rope past max_position_embeddings and switches longrope to its long
    factors past the original length; the layers keep the frequencies of load time, so a longer cache is refused."""
    from arke.models.hf import check_rope_reach

    cfg = config("llama", rope_scaling=rope)
    check_rope_reach(cfg, limit)
    with pytest.raises(ValueError, match=f"max_seq={limit} or less"):
        check_rope_reach(cfg, limit + 1)


@pytest.mark.parametrize("case", ["no bias", "bias shape", "int weight", "theta", "eps", "bin"])
def test_a_damaged_folder_is_refused_by_name(case: str, tmp_path: Path) -> None:
    """Qwen2's q bias missing (taken as zero it changed every logit), a bias or weight of the wrong shape or
    kind, a config that makes every value NaN, a pickled checkpoint: each a ValueError naming what is wrong."""
    from safetensors.torch import load_file

    cfg = config("qwen2", num_hidden_layers=1)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    saved = json.loads((tmp_path / "config.json").read_text())
    p = "model.layers.0."
    if case == "no bias":
        del tensors[p + "self_attn.q_proj.bias"]
    elif case == "bias shape":
        tensors[p + "self_attn.q_proj.bias"] = torch.zeros(3)
    elif case == "int weight":
        tensors[p + "mlp.up_proj.weight"] = tensors[p + "mlp.up_proj.weight"].to(torch.int32)
    elif case == "theta":
        saved.setdefault("rope_parameters", {})["rope_theta"] = 0.0
        saved["rope_theta"] = 0.0
    elif case == "eps":
        saved["rms_norm_eps"] = -1.0
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps(saved))
    if case == "bin":
        torch.save(tensors, tmp_path / "pytorch_model.bin")
        (tmp_path / "model.safetensors").unlink()
    says = {"no bias": "lacks self_attn.q_proj.bias", "bias shape": r"'q_bias' has shape \[3\]",
            "int weight": "'up' is int32", "theta": "rope_theta must be a positive number",
            "eps": "rms_norm_eps must be", "bin": "pytorch_model.bin"}[case]
    with pytest.raises(ValueError, match=says):
        arke.models.layer_from_pretrained(tmp_path, 0, max_seq=MAX_SEQ)


def test_a_checkpoint_with_more_layers_than_its_config_is_refused(tmp_path: Path) -> None:
    """config.json saying 1 layer over 2 layers' weights: the model would run without the second, silently."""
    cfg = config("llama", num_hidden_layers=2)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    assert len(arke.models.from_pretrained(tmp_path, max_seq=MAX_SEQ, tuning="off", layers=1).layers) == 1
    saved = json.loads((tmp_path / "config.json").read_text())
    saved["num_hidden_layers"] = 1
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"holds layer 1, but config\.json says num_hidden_layers 1"):
        arke.models.from_pretrained(tmp_path, max_seq=MAX_SEQ, tuning="off")
