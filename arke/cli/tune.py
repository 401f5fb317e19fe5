"""``akc tune``: measure a kernel's strategy space on a target at given dims (:mod:`arke.tune`)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any


def add_command(sub: Any) -> None:
    """Register ``akc tune``."""
    tune = sub.add_parser("tune", help="search a kernel's strategies by measuring them",
                          description="Measure the strategies a target honours for KERNEL at DIMS: the defaults "
                                      "first, then the points a sampler proposes, each checked against the reference "
                                      "interpreter; confirm the best against the defaults and store the records.")
    tune.add_argument("path", metavar="FILE")
    tune.add_argument("--kernel", required=True)
    tune.add_argument("--dims", required=True, help="dim values, as M=1024,N=1024,K=1024")
    tune.add_argument("--target", default="llvm")
    stop = tune.add_mutually_exclusive_group()
    stop.add_argument("--budget", type=int, default=None, help="measurements, the defaults' included (default 40)")
    stop.add_argument("--time", type=float, default=None, help="seconds to spend (the budget is then unbounded)")
    tune.add_argument("--db", default=None, help="a SQLAlchemy URL or a SQLite file (default: ARKE_TUNING_DB, else "
                                                 "~/.cache/arke/tuning.db)")
    tune.add_argument("--write", default=None, metavar="FILE.ak",
                      help="append the confirmed strategy to this file as an @strategy block")
    tune.add_argument("--format", choices=("text", "json"), default="text")
    tune.add_argument("--seed", type=int, default=0)
    tune.add_argument("--timeout", type=float, default=120.0, help="seconds one candidate may take (default 120)")
    tune.add_argument("--ray", default=None, metavar="ADDRESS",
                      help="measure on the nodes of this Ray cluster that match this machine (pip install "
                           "'arke[distributed]'); records go to --db from here")
    tune.set_defaults(handler=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    import arke
    from arke.cli.build import parse_dims
    from arke.tune import tune
    from arke.tune.db import TuningDatabaseError

    dims = parse_dims(args.dims)
    if args.write:
        _check_writable(args.write)  # before minutes of measuring, not after
    quiet = args.format == "json"
    try:
        result = tune(args.path, args.kernel, dims, target=args.target,
                      budget=None if args.time is not None else (40 if args.budget is None else args.budget),
                      time_s=args.time, db=args.db, seed=args.seed, timeout_s=args.timeout, ray=args.ray,
                      progress=None if quiet else (lambda line: print(line, file=sys.stderr, flush=True)))
    except arke.CheckError as err:  # the file has errors: its diagnostics, as akc check prints them
        print(str(err), file=sys.stderr)
        return 1
    except (ValueError, TuningDatabaseError) as err:
        from arke.cli.app import UsageError

        raise UsageError(str(err)) from None
    if args.write and result.chosen.strategy is not None:
        _write(args, result)
    if quiet:
        print(json.dumps(result.as_json(), indent=2))
    else:
        _table(result)
    return 0 if result.default.outcome == "ok" else 1


def _check_writable(name: str) -> None:
    """``--write``'s file must be a UTF-8 text file we may write, or a new file in a folder that exists."""
    from pathlib import Path

    from arke.cli.app import UsageError

    path = Path(name)
    if path.is_dir():
        raise UsageError(f"--write {name} is a folder: name the .ak file to append the strategy to")
    if path.exists():
        try:
            _read(path)
        except (OSError, ValueError) as err:  # (a FIFO or a device is never opened for reading: it would block)
            raise UsageError(f"--write {name} cannot be read as UTF-8 text ({err}): name another file") from None
        if not os.access(path, os.W_OK):
            raise UsageError(f"--write {name} is not writable")
    elif not path.parent.is_dir() or not os.access(path.parent, os.W_OK):
        raise UsageError(f"--write {name}: its folder {path.parent} does not exist or is not writable")


def _read(path: Any) -> str:
    """The text of the regular file ``path``, line ends as written (a CRLF file stays CRLF)."""
    from arke.runtime.cache import read_regular

    data, _ = read_regular(path, 64 << 20)
    return data.decode("utf-8")


def _write(args: argparse.Namespace, result: Any) -> None:
    """Append the confirmed strategy as source, after checking the file with it is clean."""
    from pathlib import Path

    import arke
    from arke.tune.source import strategy_block

    assert result.chosen.strategy is not None
    path = Path(args.write)
    block = strategy_block(args.kernel, result.target, result.chosen.strategy, result.dims,
                           f"akc tune: {result.speedup:.2f}x the defaults at {result.dims} (noise {result.noise:.1%})")
    before = _read(path) if path.exists() else ""
    if not before and Path(args.path).resolve() != path.resolve():
        before = _read(Path(args.path))  # a new file: the kernel, then its strategy
    newline = "\r\n" if "\r\n" in before else "\n"
    block = block.replace("\n", newline)
    text = _replaced(before, block, args.kernel, result.target)
    try:
        arke.loads(text, path=str(path))  # never write a file that does not check
    except arke.CheckError as err:
        from arke.cli.app import UsageError

        first = err.diagnostics[0] if getattr(err, "diagnostics", None) else None
        hint = (" (a kernel written without named indices, as `a @ b`, cannot name them in a strategy: write it "
                "with them, as sum(a[m, k] * b[k, n] for k))") if first is not None and first.code in (
                    "AK4002", "AK4003") else ""
        raise UsageError(f"the tuned strategy is in the database but cannot be written to {path}: "
                         f"{first.message if first is not None else err}{hint}") from None
    with open(path, "w", encoding="utf-8", newline="") as f:  # line ends as `text` has them
        f.write(text)
    print(f"wrote the strategy to {path}", file=sys.stderr)


def _replaced(before: str, block: str, kernel: str, target: str) -> str:
    """``before`` with ``block`` in it: in place of its own block of the same header (kernel, target, `when`)
    and the `# akc tune:` comment above it (re-tuning updates its block), else before the file's first strategy
    for the kernel on the target (strategies apply in order: after one without `when` it never would), else
    at the end. Blocks are found by the parser's spans, whatever follows a closing brace on its line."""
    from arke.lang.parser import parse

    header = next((line for line in block.splitlines() if line.startswith("@strategy(")), "")
    gap = "\r\n" if "\r\n" in block else "\n"
    module, _ = parse(before)
    ours = [st for st in module.strategies if st.kernel == kernel and st.target in (target, None)]
    same = next((st for st in ours if _line_at(before, st.span.start).rstrip() == header), None)
    if same is not None:
        start = before.rfind("\n", 0, same.span.start) + 1
        above = before.rfind("\n", 0, max(0, start - 1)) + 1
        if start > 0 and before[above:start].startswith("# akc tune:"):
            start = above
        end = same.span.end
        rest = before[end:]
        tail = rest[:len(rest) - len(rest.lstrip(" \t"))]
        if rest[len(tail):].startswith(("\r\n", "\n")):  # the line's end after the brace is the block's own
            end += len(tail) + (2 if rest[len(tail):].startswith("\r\n") else 1)
        return before[:start] + block + before[end:]
    if ours:
        start = before.rfind("\n", 0, min(st.span.start for st in ours)) + 1
        return before[:start] + block + gap + before[start:]
    return before + (gap if before and not before.endswith(gap * 2) else "") + block


def _line_at(text: str, offset: int) -> str:
    """The line of ``text`` that holds ``offset``."""
    start = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", offset)
    return text[start:] if end < 0 else text[start:end]


def _table(result: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    default = result.confirmed.get("", result.default.median)
    chosen = result.confirmed.get(result.chosen.label, result.chosen.median)
    table = Table(title=f"akc tune {result.kernel} on {result.target} at "
                        + ",".join(f"{k}={v}" for k, v in result.dims.items()))
    for column in ("default", "tuned", "speedup", "% of FMA peak", "noise", "decisions changed"):
        table.add_column(column)
    peak = (f"{100 * result.flops / chosen / result.fma_peak:.0f}%"
            if result.flops and result.fma_peak and not math.isinf(chosen) else "n/a")
    table.add_row(f"{default * 1e3:.3f} ms", f"{chosen * 1e3:.3f} ms", f"{result.speedup:.2f}×", peak,
                  f"{result.noise:.1%}", ", ".join(result.changed()) or "none (the defaults stay)")
    console = Console()
    console.print(table)
    counts: dict[str, int] = {}
    for t in result.trials:
        counts[t.outcome] = counts.get(t.outcome, 0) + 1
    console.print(f"measured {sum(counts.values())} ({', '.join(f'{v} {k}' for k, v in counts.items())}) in "
                  f"{result.seconds:.0f} s; records in {result.db_url}")
    for note in result.notes:
        console.print(f"note: {note}")


def add_mcp_command(sub: Any) -> None:
    """Register ``akc mcp``."""
    mcp = sub.add_parser("mcp", help="the tuner's tools for agents, over the Model Context Protocol (stdio)",
                         description="Serve list_kernels, legal_decisions, check_strategy, measure and record over "
                                     "MCP on stdin/stdout; every call is appended to a trajectory log.")
    mcp.add_argument("--db", default=None, help="the tuning database (default: ARKE_TUNING_DB, else SQLite)")
    mcp.add_argument("--log", default=None, help="the trajectory log (default ~/.cache/arke/agent-trajectory.jsonl)")
    mcp.set_defaults(handler=cmd_mcp)


def cmd_mcp(args: argparse.Namespace) -> int:
    try:
        from arke.tune.agent import serve
    except ImportError as err:
        from arke.cli.app import UsageError

        raise UsageError(f"akc mcp needs the mcp package: pip install 'arke[tune]' ({err})") from None
    try:
        serve(args.db, args.log)
    except ValueError as err:  # a trajectory log that cannot be written: said before serving
        from arke.cli.app import UsageError

        raise UsageError(str(err)) from None
    return 0
