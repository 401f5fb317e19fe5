"""``akc tune-model``: tune the whole-layer plan of a model folder's decoder layer (:mod:`arke.tune.layer`)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any


def add_command(sub: Any) -> None:
    """Register ``akc tune-model``."""
    p = sub.add_parser("tune-model", help="tune a model folder's decoder-layer plan by measuring whole layer calls",
                       description="Compile one decoder layer of a Hugging Face model folder (config.json and "
                                   "*.safetensors), then measure plans for each call shape on complete layer calls: "
                                   "per-call strategies, the attention algorithm, the thread count. The defaults are "
                                   "replaced only by a win beyond the noise; the chosen plans go to the tuning "
                                   "database, where layers built on this machine find them.")
    p.add_argument("path", metavar="FOLDER")
    p.add_argument("--layer", type=int, default=0, help="which layer's sizes and weights (default 0)")
    p.add_argument("--prefill", default="", help="prefill token counts, as 128,512")
    p.add_argument("--decode", default="", help="decode contexts, as 512,2048 (one plan for decode)")
    p.add_argument("--target", default="llvm")
    p.add_argument("--weights", default="f32", choices=("f32", "bf16", "f16", "int8"))
    p.add_argument("--dtype", default="f32", choices=("f32", "bf16", "f16"), help="the activations' dtype")
    p.add_argument("--max-seq", type=int, default=4096)
    p.add_argument("--budget", type=int, default=24, help="layer measurements per call shape (default 24)")
    p.add_argument("--dispatch-budget", type=int, default=10,
                   help="kernel measurements per kernel call before the layer-level search (default 10; 1: none)")
    p.add_argument("--time", type=float, default=None, help="seconds to spend in all")
    p.add_argument("--db", default=None, help="a SQLAlchemy URL or a SQLite file (default: ARKE_TUNING_DB, else "
                                              "~/.cache/arke/tuning.db)")
    p.add_argument("--write", default=None, metavar="FILE.ak", help="write the chosen plan as .ak source")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one plan's measurement may take")
    p.set_defaults(handler=cmd_tune_model)


def _counts(text: str, flag: str, least: int) -> list[int]:
    from arke.cli.app import UsageError

    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if not (part.isascii() and part.isdigit()) or int(part) < least:
            raise UsageError(f"{flag} takes token counts (integers of at least {least}), as 128,512; not `{part}`")
        out.append(int(part))
    return out


def cmd_tune_model(args: argparse.Namespace) -> int:
    import torch

    from arke.cli.app import UsageError
    from arke.tune.db import TuningDatabaseError

    prefill, decode = _counts(args.prefill, "--prefill", 1), _counts(args.decode, "--decode", 0)
    if not prefill and not decode:
        raise UsageError("give the call shapes to tune: --prefill 128,512 and/or --decode 512")
    if not Path(args.path, "config.json").is_file():
        raise UsageError(f"{args.path} is not a model folder (no config.json)")
    if args.write:  # checked before minutes of tuning: the plan is a whole file of its own
        out = Path(args.write)
        if out.exists() or out.is_symlink():
            raise UsageError(f"--write {args.write} exists: akc tune-model writes the plan as a file of its own; "
                             "name a new file (or remove that one first)")
        if not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
            raise UsageError(f"--write {args.write}: its folder {out.parent} does not exist or is not writable")
    try:
        import arke.models
    except ImportError as err:
        raise UsageError(f"akc tune-model needs transformers and safetensors: pip install 'arke[models]' ({err})") \
            from None
    quiet = args.format == "json"
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    try:
        layer = arke.models.layer_from_pretrained(args.path, args.layer, target=args.target, max_seq=args.max_seq,
                                            weights=args.weights if args.dtype == "f32" else "f32", dtype=dtype,
                                            tuning="off")
        result = arke.models.tune(layer, prefill, decode, budget=args.budget, dispatch_budget=args.dispatch_budget,
                                  time_s=args.time, db=args.db, seed=args.seed, timeout_s=args.timeout,
                                  progress=None if quiet else (lambda line: print(line, file=sys.stderr, flush=True)))
    except (ValueError, ImportError, OSError, TuningDatabaseError) as err:
        raise UsageError(str(err)) from None
    if args.write:
        with open(args.write, "x", encoding="utf-8") as f:  # never another file made meanwhile
            f.write(result.plan())
        print(f"wrote the plan to {args.write}", file=sys.stderr)
    if quiet:
        print(json.dumps(result.as_json(), indent=2))
    else:
        _table(result)
    return 0 if all(p.result is not None and p.result.default.outcome == "ok" for p in result.phases) else 1


def _table(result: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"akc tune-model: {result.layer} on {result.target}")
    for column in ("shape", "default", "tuned", "speedup", "% of FMA peak", "noise", "measured"):
        table.add_column(column)
    for row in result.as_json()["phases"]:
        tuned = row["tuned_s"]
        peak = f"{row['percent_of_fma_peak']:.0f}%" if row["percent_of_fma_peak"] and not math.isinf(tuned) else "n/a"
        table.add_row(row["phase"], f"{row['default_s'] * 1e3:.3f} ms", f"{tuned * 1e3:.3f} ms",
                      f"{row['speedup']:.2f}×", peak, f"{row['noise']:.1%}",
                      ", ".join(f"{v} {k}" for k, v in row["outcomes"].items()))
    console = Console()
    console.print(table)
    console.print(f"{result.seconds:.0f} s; plans in {result.db_url}")
    for p in result.phases:
        if p.result is not None:
            for note in p.result.notes:
                console.print(f"note ({p.name}): {note}")
    for note in result.notes:
        console.print(f"note: {note}")
