"""``akc fmt``: rewrite `.ak` files in the one canonical layout (:mod:`arke.lang.fmt`).

::

    akc fmt PATH... [--check]

PATHs are files, folders (every ``*.ak`` below them, sorted) or ``-`` (standard input,
formatted to standard output). A file is rewritten only when its layout changes, through a
temporary file in its folder and an atomic rename, so a reader never sees half a file. A
file with syntax errors is left as it is and its diagnostics are printed.

``--check`` changes nothing: it lists on standard output each file that would change.

Exit status: 0 done (or, with ``--check``, every file already formatted); 1 a file has
syntax errors, or with ``--check`` would change; 2 a file cannot be read or written.
Messages go to standard error; standard output carries only the ``--check`` list and the
formatted text of ``-``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
import tempfile
from typing import Any

from arke.lang.diagnostics import Diagnostic

EXIT_OK = 0
EXIT_CHANGES = 1
EXIT_UNREADABLE = 2


def add_parser(sub: Any) -> None:
    """Register ``fmt`` on ``akc``'s subparsers (the object ``add_subparsers`` returned)."""
    fmt = sub.add_parser("fmt", help="rewrite .ak files in the canonical layout",
                         description="Format .ak files in place: folders are searched for *.ak; - formats "
                                     "standard input to standard output. Files with syntax errors are left as "
                                     "they are.")
    fmt.add_argument("paths", nargs="+", metavar="PATH", help="a .ak file, a folder, or - for stdin")
    fmt.add_argument("--check", action="store_true",
                     help="change nothing: list the files that would change and exit 1 if there are any")
    fmt.set_defaults(handler=cmd_fmt)


def cmd_fmt(args: argparse.Namespace) -> int:
    """``akc fmt``: format every file of ``args.paths``; ``args.check`` only reports. Returns the exit status."""
    from arke.cli.app import STDIN, collect, read_input
    from arke.lang.fmt import FormatError, format_source
    from arke.lang.render import Sources, print_diagnostics

    status = EXIT_OK
    changed = same = broken = 0
    for path in collect(args.paths):
        read = read_input(path)
        if isinstance(read, Diagnostic):
            print_diagnostics([read], None, sys.stderr)
            status = max(status, EXIT_UNREADABLE)
            continue
        text, name = read
        try:
            new = format_source(text, name)
        except FormatError as err:
            print_diagnostics(err.diagnostics, Sources({name: text}), sys.stderr)
            status = max(status, EXIT_CHANGES)
            broken += 1
            continue
        if new == text:
            same += 1
        else:
            changed += 1
        if args.check:
            if new != text:
                print(f"would reformat {path}", flush=True)
                status = max(status, EXIT_CHANGES)
        elif path == STDIN:
            sys.stdout.write(new)
            sys.stdout.flush()
        elif new != text:
            try:
                write_atomically(path, new)
            except OSError as err:
                print(f"akc: error: cannot write `{path}`: {err.strerror or err}", file=sys.stderr)
                status = max(status, EXIT_UNREADABLE)
                continue
            print(f"reformatted {path}", file=sys.stderr)
    print(_summary(changed, same, broken, args.check), file=sys.stderr)
    return status


def _summary(changed: int, same: int, broken: int, check: bool) -> str:
    """``2 files reformatted, 3 files left unchanged``, or what ``--check`` found."""
    def files(n: int) -> str:
        return f"{n} file" if n == 1 else f"{n} files"

    if check:
        parts = [f"{files(changed)} would be reformatted", f"{files(same)} already formatted"]
    else:
        parts = [f"{files(changed)} reformatted", f"{files(same)} left unchanged"]
    if broken:
        parts.append(f"{files(broken)} with syntax errors left as they are")
    return ", ".join(parts)


def write_atomically(path: str, text: str) -> None:
    """Replace the file at ``path`` (through a link, its target) by ``text``, UTF-8 with ``\\n`` newlines.

    The text goes to a temporary file in the same folder, which then takes the file's place
    in one rename, with the file's permissions: the file is whole at every moment.
    """
    real = os.path.realpath(path)
    folder, base = os.path.split(real)
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            out.write(text)
        os.chmod(tmp, stat.S_IMODE(os.stat(real).st_mode))
        os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
