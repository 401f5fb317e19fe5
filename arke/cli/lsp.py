"""``akc lsp``: run the Arke language server over stdio (for editors).

::

    akc lsp            # speaks the Language Server Protocol on stdin/stdout

Editors start it themselves (see ``editors/vscode`` and the README). Log messages go to
stderr, never to stdout, which carries the protocol. With standard input or output closed it
exits with status 2 and a one-line message.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any


def add_parser(sub: Any) -> None:
    """Register ``lsp`` on ``akc``'s subparsers (as ``arke.cli.app`` registers ``check``)."""
    lsp = sub.add_parser("lsp", help="run the language server over stdio (for editors)",
                         description="Run the Arke language server on stdin/stdout: diagnostics, hover, "
                                     "go to definition, completion, symbols, formatting and quick fixes.")
    lsp.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="warning",
                     help="how much the server logs to stderr (default: warning)")
    lsp.set_defaults(handler=cmd_lsp)


def cmd_lsp(args: argparse.Namespace) -> int:
    """``akc lsp``: serve until the client says exit; returns the exit status."""
    if sys.stdin is None or sys.stdout is None:  # `akc lsp <&-`: there is no client to talk to
        from arke.targets.base import UsageError

        closed = "standard input" if sys.stdin is None else "standard output"
        raise UsageError(f"the language server speaks on standard input and output, and {closed} is closed")
    logging.basicConfig(stream=sys.stderr, level=getattr(args, "log_level", "warning").upper(),
                        format="akc lsp: %(levelname)s %(name)s: %(message)s")
    from arke.lsp.server import create_server

    server = create_server()
    server.start_io()
    # the protocol's status: 1 for an exit without a shutdown first; 0 otherwise (the client's end of input too)
    return 1 if "exit" in server.said and "shutdown" not in server.said else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``akc lsp`` directly (``python -c "from arke.cli.lsp import main; main()"``)."""
    parser = argparse.ArgumentParser(prog="akc lsp")
    sub = parser.add_subparsers(dest="command")
    add_parser(sub)
    args = parser.parse_args(["lsp", *(sys.argv[1:] if argv is None else argv)])
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
