"""``akc generate``: load a Hugging Face model folder with :func:`arke.models.from_pretrained` and generate
text, streaming each token as it comes, then the prefill and decode throughput."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_command(sub: Any) -> None:
    """Register ``akc generate``."""
    p = sub.add_parser("generate", help="generate text with a model folder, compiled",
                       description="Compile a Hugging Face causal LM folder (config.json and *.safetensors; "
                                   "Llama, Qwen2, Mistral, Mixtral) and generate from a prompt, streaming the "
                                   "tokens; the folder's tokenizer.json (through the tokenizers package) turns "
                                   "text into ids and back. Ends with prefill and decode throughput.")
    p.add_argument("path", metavar="FOLDER")
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt", help="the prompt text (needs the folder's tokenizer.json)")
    given.add_argument("--ids", help="the prompt as token ids, as 1,2,3")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--target", default="llvm")
    p.add_argument("--dtype", default="f32", choices=("f32", "bf16", "f16"), help="the activations' dtype")
    p.add_argument("--weights", default="f32", choices=("f32", "bf16", "f16", "int8"))
    p.add_argument("--max-seq", type=int, default=None, help="KV cache slots (default: prompt + new tokens)")
    p.add_argument("--sample", action="store_true", help="sample (default: greedy)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=50)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--layers", type=int, default=None, help="only the first N layers (a quick check)")
    p.add_argument("--eos", default=None, help="stop at these token ids, as 2 or 2,32000 (default: the folder's "
                   "generation_config.json or config.json eos_token_id; `none`: never stop early)")
    p.set_defaults(handler=cmd_generate)


def _tokenizer(folder: Path) -> Any:
    """The folder's tokenizer (tokenizer.json through the tokenizers package), or None when it has none."""
    path = folder / "tokenizer.json"
    if not path.exists():
        return None
    from arke.cli.app import UsageError

    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError("reading tokenizer.json needs the tokenizers package: pip install 'arke[models]'") from None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # the tokenizers package raises its own plain Exception for a bad file
        raise UsageError(f"{path} cannot be read as a tokenizer ({str(err).strip() or type(err).__name__}): fix or "
                         "remove it, or give the prompt as --ids 1,2,3") from None


def _ids(text: str, option: str = "--ids") -> list[int]:
    from arke.cli.app import UsageError

    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isascii() and p.isdigit() for p in parts):
        raise UsageError(f"{option} takes token ids as 1,2,3, not `{text}`")
    return [int(p) for p in parts]


def cmd_generate(args: argparse.Namespace) -> int:
    import torch

    import arke.models
    from arke.cli.app import UsageError
    from arke.runtime.errors import GuardError

    folder = Path(args.path)
    if not (folder / "config.json").exists():
        raise UsageError(f"{folder} is not a model folder: it has no config.json")
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be at least 1, not {args.max_new_tokens}")
    tokenizer = _tokenizer(folder) if args.prompt is not None else None  # --ids print ids: no tokenizer needed
    if args.prompt is not None:
        if tokenizer is None:
            raise UsageError(f"{folder} has no tokenizer.json: give the prompt as --ids 1,2,3")
        ids = tokenizer.encode(args.prompt).ids
        if not ids:
            raise UsageError("the prompt has no tokens")
    else:
        ids = _ids(args.ids)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    max_seq = args.max_seq if args.max_seq is not None else len(ids) + args.max_new_tokens
    try:
        model = arke.models.from_pretrained(folder, target=args.target, dtype=dtype, max_seq=max_seq,
                                            weights=args.weights, layers=args.layers)
    except (ValueError, FileNotFoundError, ImportError) as err:
        raise UsageError(str(err)) from None
    print(f"# {model!r}", file=sys.stderr)
    try:
        # one prefill and one decode step first: the throughput below is then the model's, not the first
        # call's (which plans memory and loads the kernels for these shapes)
        warm = model.new_cache(1)
        model([ids], warm)
        if len(ids) < max_seq:
            model([ids[-1:]], warm)
        eos = _eos(args.eos, folder)
        if args.eos is None and eos:  # the folder's own ids past the vocabulary: transformers warns and goes on
            outside = [i for i in eos if not 0 <= i < model.vocab]
            if outside:
                print(f"# the folder's eos_token_id {', '.join(map(str, outside))} lies outside the vocabulary "
                      f"({model.vocab} tokens): no stop there", file=sys.stderr)
                eos = [i for i in eos if 0 <= i < model.vocab] or None
        steps = model.stream([ids], args.max_new_tokens, do_sample=args.sample, temperature=args.temperature,
                             top_k=args.top_k, top_p=args.top_p, repetition_penalty=args.repetition_penalty,
                             seed=args.seed, eos_token_id=eos)
    except (ValueError, GuardError) as err:
        raise UsageError(str(err)) from None
    made: list[int] = []
    stream = TextStream(tokenizer.decode, ids) if tokenizer is not None and args.prompt is not None else None
    if stream is not None:
        sys.stdout.write(args.prompt)
    for token in steps:
        made.append(int(token[0]))
        if stream is not None:
            sys.stdout.write(stream.push(made[-1]))
        else:
            sys.stdout.write(("" if len(made) == 1 else ",") + str(made[-1]))
        sys.stdout.flush()
    if stream is not None:
        sys.stdout.write(stream.flush())
    sys.stdout.write("\n")
    s = model.stats
    line = f"# prefill: {s.get('prefill_tokens', 0)} tokens at {s.get('prefill_tok_s', 0.0):.1f} tokens/s"
    if "decode_tok_s" in s:
        line += f"; decode: {s['decode_steps']} steps at {s['decode_tok_s']:.1f} tokens/s"
    print(line, file=sys.stderr)
    return 0


class TextStream:
    """Generated text as it comes, for a tokenizer's ``decode``: the prompt and the tokens so far are decoded as
    a whole each time (spacing, and tokens that only make sense together, as the tokenizer joins them), and
    only what was not printed yet is printed. Text ending in U+FFFD (the first bytes of a character whose
    other bytes are still to come, from byte-fallback tokens) is held back until the character is whole."""

    def __init__(self, decode: Any, ids: list[int]):
        self.decode, self.ids = decode, list(ids)
        self.shown = decode(self.ids)  # the text printed so far, as decoded (the prompt's own)
        self.text = self.shown

    def push(self, token: int) -> str:
        """The text ``token`` adds that can be printed now ('' while a character is incomplete)."""
        self.ids.append(token)
        self.text = self.decode(self.ids)
        return "" if self.text.endswith("\ufffd") else self._new()

    def flush(self) -> str:
        """What is held back at the end (an incomplete character is printed as the tokenizer decodes it)."""
        return self._new()

    def _new(self) -> str:
        # what was printed cannot be taken back: where the tokenizer joins earlier text differently now, what
        # lies past the printed length is printed (never the whole text again)
        text, printed = self.text, len(self.shown)
        self.shown = text
        return text[printed:]


def _eos(given: str | None, folder: Path) -> list[int] | None:
    """The ids that end generation: ``--eos``, else the folder's ``eos_token_id`` (as transformers' ``generate``
    reads it: generation_config.json first, then config.json); None for ``--eos none`` or a folder without one."""
    if given is not None:
        if given.strip().lower() == "none":
            return None
        return _ids(given, "--eos")
    for name in ("generation_config.json", "config.json"):
        try:
            value = json.loads((folder / name).read_text(encoding="utf-8")).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            return [value]
        if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return value
    return None
