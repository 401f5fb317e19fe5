"""``akc``: the Arke command line, one module per command (:mod:`arke.cli.app` parses and dispatches)."""

from arke.cli.app import main

__all__ = ["main"]
