"""``akc``: the Arke command line.

::

    akc check PATH... [--format text|json]     check files, folders (every *.ak below) or - (stdin)
    akc fmt PATH... [--check]                  rewrite files, folders (every *.ak below) in the canonical
                                               layout; - formats stdin to stdout
    akc lsp                                    the language server over stdio (for editors)
    akc ir PATH --stage semantic|strategy [--format text|json]
    akc demo [--kernels | --layer]             the examples and a whole model generating, next to torch
    akc --version

Exit status: 0 clean (warnings allowed), 1 the program has errors, 2 a usage or I/O
problem (a missing or unreadable file, one that is not a regular file or is over 16 MiB, a
folder that cannot be listed, standard input or output closed, a full disk under standard
output), 3 an internal error (a bug: please report it; ``AKC_DEBUG=1`` shows its traceback).
Bad input never shows a Python traceback; an I/O problem is one line on standard error.

``akc check`` starts fast: it must not import torch, triton or llvmlite (a test holds
this), so every heavy module is imported inside the command that needs it.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import stat
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from arke.lang.diagnostics import Diagnostic, Severity

# a problem with how akc was called (exit status 2), shown as is; the targets' build commands raise it too
from arke.targets.base import UsageError

if TYPE_CHECKING:
    from arke.api import Module as api_Module
    from arke.lang.render import Sources

EXIT_OK = 0
EXIT_ERRORS = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3

STDIN = "-"
_IO_CODES = frozenset({"AK1004"})  # diagnostics that mean "could not read", not "bad program"




# ---------------------------------------------------------------- arguments


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``akc`` (its subcommands set ``handler``)."""
    from arke import __version__

    parser = argparse.ArgumentParser(
        prog="akc", description="Arke: check, inspect and run .ak operator programs.",
    )
    parser.add_argument("--version", action="version", version=f"akc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    check = sub.add_parser("check", help="check .ak files and report their diagnostics",
                           description="Check .ak files: folders are searched for *.ak; - reads stdin.")
    check.add_argument("paths", nargs="+", metavar="PATH", help="a .ak file, a folder, or - for stdin")
    check.add_argument("--format", choices=("text", "json"), default="text",
                       help="text for people (default); json: LSP Diagnostic objects, 0-based ranges")
    check.set_defaults(handler=cmd_check)
    from arke.cli.fmt import add_parser as add_fmt_parser

    add_fmt_parser(sub)
    from arke.cli.lsp import add_parser as add_lsp_parser

    add_lsp_parser(sub)

    ir = sub.add_parser("ir", help="print the IR of a .ak file",
                        description="Check and lower a .ak file, then print its SemanticIR or StrategyIR.")
    ir.add_argument("path", metavar="PATH", help="a .ak file, or - for stdin")
    ir.add_argument("--stage", choices=("semantic", "strategy"), default="semantic",
                    help="which IR to print (default: semantic)")
    ir.add_argument("--format", choices=("text", "json"), default="text",
                    help="the canonical text form (default) or versioned JSON")
    ir.set_defaults(handler=cmd_ir)

    demo = sub.add_parser("demo", help="the examples and a whole model generating, compared with torch",
                          description="Load examples/rmsnorm.ak and examples/attention.ak, run them on the "
                                      "reference interpreter and compiled, and compare with torch; then save a "
                                      "Llama-3.2-1B-shaped causal LM (2 layers, random weights), load it with "
                                      "arke.models.from_pretrained, generate greedily, check the tokens against "
                                      "transformers' generate and time decoding next to torch eager and torch.compile "
                                      "(--layer: a single decoder layer instead).")
    demo.add_argument("--kernels", action="store_true", help="only the example kernels (no model)")
    demo.add_argument("--layer", action="store_true", help="a single decoder layer instead of the whole model")
    demo.set_defaults(handler=cmd_demo)

    from arke.cli.build import add_commands
    from arke.cli.generate import add_command as add_generate
    from arke.cli.tune import add_command as add_tune
    from arke.cli.tune import add_mcp_command
    from arke.cli.tune_model import add_command as add_tune_model

    add_commands(sub)
    add_generate(sub)
    add_tune(sub)
    add_tune_model(sub)
    add_mcp_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``akc`` with ``argv`` (``sys.argv[1:]`` by default); returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse reports usage problems (and --help, --version) this way
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if sys.stdout is None:  # `akc ... >&-`: no command can say anything (and fd 1 would go to a file it opens)
        print("akc: error: standard output is closed; give akc somewhere to write (or >/dev/null)", file=sys.stderr)
        return EXIT_USAGE
    stdout = sys.stdout
    if handler.__module__ != "arke.cli.lsp":  # the language server writes bytes under stdout, on its own terms
        sys.stdout = cast(IO[str], _Stdout(stdout))
    try:
        status = handler(args)
        if not sys.stdout.closed:  # (the language server closes it when the client says exit)
            sys.stdout.flush()  # a full disk shows here, not in Python's final flush
        return status
    except UsageError as err:
        print(f"akc: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("akc: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `akc check ... | head`: the reader left; say nothing more
        _silence_stdout()
        return EXIT_ERRORS
    except OSError as err:  # an I/O problem, not a bug: a full disk under stdout, a file that vanished …
        return _io_error(err)
    except Exception as exc:  # the one place that turns a bug into a clear message
        if os.environ.get("AKC_DEBUG"):
            traceback.print_exc()
        hint = "" if os.environ.get("AKC_DEBUG") else " (AKC_DEBUG=1 shows the traceback)"
        print(f"akc: internal error: {type(exc).__name__}: {exc}, please report{hint}", file=sys.stderr)
        return EXIT_INTERNAL
    finally:
        sys.stdout = stdout


class _StdoutError(OSError):
    """Writing standard output failed (a full disk, a closed descriptor): what :func:`main` reports as such."""


class _Stdout:
    """``sys.stdout`` while a command runs: the same stream, but an :class:`OSError` from writing or
    flushing it becomes :class:`_StdoutError`, so the message can say it was standard output."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as err:
            raise _StdoutError(err.errno, err.strerror) from err

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as err:
            raise _StdoutError(err.errno, err.strerror) from err

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _io_error(err: OSError) -> int:
    """Say in one line what could not be read or written, and return the usage/I/O exit status."""
    reason = err.strerror or str(err)
    if isinstance(err, _StdoutError):
        message = f"cannot write standard output: {reason}"
        _silence_stdout()
    elif err.filename:
        message = f"`{err.filename}`: {reason}"
    else:
        message = f"I/O error: {reason}"
    print(f"akc: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _silence_stdout() -> None:
    """Point stdout at /dev/null so Python's final flush does not fail on a closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


# ---------------------------------------------------------------- reading input


def collect(paths: Sequence[str]) -> list[str]:
    """The files to check: files and ``-`` as given, folders expanded to their ``*.ak`` files.

    Folders are searched recursively in sorted order, skipping hidden folders; a ``*.ak`` there
    that is no regular file (a FIFO, a device, a link to one) is skipped with a message on stderr.
    A path that does not exist is kept: reading it reports the problem as a diagnostic. A folder
    that cannot be listed, or has no ``.ak`` files, is a usage error.
    """
    files: list[str] = []
    for path in paths:
        if path != STDIN and os.path.isdir(path):
            found = _ak_files(Path(path))
            if not found:
                raise UsageError(f"no .ak files in folder `{path}`")
            files += found
        else:
            files.append(path)
    return list(dict.fromkeys(files))  # each file once, in order


def _ak_files(folder: Path) -> list[str]:
    from arke.lang.source import file_kind

    def unlistable(err: OSError) -> None:
        raise UsageError(f"cannot list folder `{err.filename or folder}`: {err.strerror or err}")

    out = []
    for root, dirs, names in os.walk(folder, onerror=unlistable):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(n for n in names if n.endswith(".ak")):
            path = os.path.join(root, name)
            try:
                mode = os.stat(path).st_mode
            except OSError:  # a dangling link, say: reading it reports the problem
                mode = stat.S_IFREG
            if stat.S_ISREG(mode):
                out.append(path)
            else:
                print(f"akc: skipping `{path}`: not a regular file (it is {file_kind(mode)})", file=sys.stderr)
    return out


def read_input(path: str, stdin: IO[str] | None = None) -> tuple[str, str] | Diagnostic:
    """(text, path) of a file or of stdin (``-``), or the AK1004 diagnostic saying why it cannot be read.

    Standard input is read up to :data:`arke.lang.source.MAX_SOURCE_BYTES`; a closed or unreadable
    one is AK1004 too.
    """
    from arke.api import decode_source, read_file
    from arke.lang.diagnostics import make
    from arke.lang.source import Span, read_bounded

    if path != STDIN:
        return read_file(path)
    stream = stdin or sys.stdin
    try:
        if stream is None:  # the shell closed it (`akc check - <&-`)
            raise OSError(errno.EBADF, "it is closed")
        buffer = getattr(stream, "buffer", None)
        if buffer is None:  # a text stream without bytes underneath (tests, embedding)
            return stream.read(), STDIN
        data: bytes = read_bounded(buffer, "standard input")
    except (OSError, ValueError) as err:  # ValueError: a closed Python file object
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        return make("AK1004", f"cannot read standard input: {reason}", Span(STDIN, 1, 1, 1, 1, 0, 0),
                    hint=getattr(err, "hint", "give akc a file, or something to read on standard input"))
    return decode_source(data, STDIN, "standard input")


# ---------------------------------------------------------------- akc check


def check_file(path: str, sources: Sources) -> list[Diagnostic]:
    """Read and check one file (``-``: stdin), recording its text in ``sources`` for rendering."""
    from arke.lang import checker

    read = read_input(path)
    if isinstance(read, Diagnostic):
        return [read]
    text, name = read
    sources.add(name, text)
    return list(checker.check_text(text, name).diagnostics)


def exit_status(diagnostics: Sequence[Diagnostic]) -> int:
    """2 when a file could not be read, 1 when there are errors, 0 otherwise (warnings allowed)."""
    if any(d.code in _IO_CODES for d in diagnostics):
        return EXIT_USAGE
    return EXIT_ERRORS if any(d.severity == Severity.ERROR for d in diagnostics) else EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    """``akc check``: diagnostics of every file, then a summary (text) or one JSON document."""
    from arke.lang.render import Sources, file_report, print_diagnostics, print_lines, summary, use_color

    files = collect(args.paths)
    sources = Sources()
    results = [(path, check_file(path, sources)) for path in files]
    everything = [d for _, diags in results for d in diags]
    out = sys.stdout
    if args.format == "json":
        document = {"files": [file_report(path, diags, sources) for path, diags in results]}
        out.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
        out.flush()
        return exit_status(everything)
    color = use_color(out)
    for _, diags in results:
        print_diagnostics(diags, sources, out, color)
    errors = any(d.severity == Severity.ERROR for d in everything)
    print_lines([[(summary(everything, len(files)), "bold red" if errors else "bold green")]], out, color)
    return exit_status(everything)


# ---------------------------------------------------------------- akc ir


def load_or_report(path: str) -> api_Module | int:
    """Check and lower one file (``-``: stdin); on errors, print them to stderr and return the exit status."""
    from arke import api
    from arke.lang.render import Sources, print_diagnostics, print_lines, summary

    sources = Sources()
    try:
        read = read_input(path)
        if isinstance(read, Diagnostic):
            raise api.CheckError([read])
        sources.add(read[1], read[0])
        module = api.loads(*read)
    except api.CheckError as err:
        if not any(d.is_error for d in err.diagnostics):  # the checker's contract: no IR means an error
            raise RuntimeError(f"`{path}` produced no IR and no error") from err
        print_diagnostics(err.diagnostics, sources, sys.stderr)
        print_lines([[(summary(err.diagnostics, 1), "bold red")]], sys.stderr)
        return exit_status(err.diagnostics)
    if module.warnings:
        print_diagnostics(module.warnings, sources, sys.stderr)
    return module


def cmd_ir(args: argparse.Namespace) -> int:
    """``akc ir``: check and lower one file, then print its SemanticIR or StrategyIR."""
    module = load_or_report(args.path)
    if isinstance(module, int):
        return module
    if args.format == "json":
        from arke.ir import serialize

        text = serialize.to_json(module.semantic, indent=2) if args.stage == "semantic" \
            else serialize.strategies_to_json(module.strategies, indent=2)
    else:
        from arke.ir import text as ir_text

        text = ir_text.print_module(module.semantic) if args.stage == "semantic" \
            else ir_text.print_strategies(module.strategies)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()
    return EXIT_OK


# ---------------------------------------------------------------- akc demo


def cmd_demo(args: argparse.Namespace) -> int:
    """``akc demo``: the same as ``make demo`` (``examples/demo.py``)."""
    from arke.cli.demo import run_all

    return run_all(layer=not args.kernels, part="layer" if args.layer else "model")


if __name__ == "__main__":
    sys.exit(main())
