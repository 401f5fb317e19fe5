"""``akc fmt``: rewrite `.ak` files in the one canonical layout (:mod:`arke.lang.fmt`).

::

    akc fmt PATH... [--check]

PATHs are files, folders (every ``*.ak`` below them, sorted) or ``-`` (standard input,
formatted to standard output). A file is rewritten only when its layout changes, through a
temporary file in its folder and an atomic rename, so a reader never sees half a file. A
file with syntax errors is left as it is and its diagnostics are printed.

``--check`` changes nothing: it lists on standard output each file that would change.

A file is rewritten with its permissions. A read-only file (no write permission) is left as
it is, with a message; so is a file that changed while it was formatted (an editor saved it):
it is read again just before the rename.

Exit status: 0 done (or, with ``--check``, every file already formatted); 1 a file has
syntax errors, or with ``--check`` would change; 2 a file cannot be read or written (it is
read-only, changed while it was formatted, is no regular file, or standard input or output
is closed).
Messages go to standard error; standard output carries only the ``--check`` list and the
formatted text of ``-``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
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
    changed = same = broken = unwritten = 0
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
        elif args.check:
            print(f"would reformat {path}", flush=True)
            status = max(status, EXIT_CHANGES)
            changed += 1
        elif path != STDIN:
            try:
                write_atomically(path, new, expected=text.encode("utf-8"))
            except OSError as err:
                print(f"akc: error: cannot write `{path}`: {err.strerror or err}", file=sys.stderr)
                status = max(status, EXIT_UNREADABLE)
                unwritten += 1
                continue
            print(f"reformatted {path}", file=sys.stderr)
            changed += 1
        else:
            changed += 1
        if path == STDIN and not args.check:
            sys.stdout.write(new)
            sys.stdout.flush()
    print(_summary(changed, same, broken, unwritten, args.check), file=sys.stderr)
    return status


def _summary(changed: int, same: int, broken: int, unwritten: int, check: bool) -> str:
    """``2 files reformatted, 3 files left unchanged``, or what ``--check`` found."""
    def files(n: int) -> str:
        return f"{n} file" if n == 1 else f"{n} files"

    if check:
        parts = [f"{files(changed)} would be reformatted", f"{files(same)} already formatted"]
    else:
        parts = [f"{files(changed)} reformatted", f"{files(same)} left unchanged"]
    if broken:
        parts.append(f"{files(broken)} with syntax errors left as they are")
    if unwritten:
        parts.append(f"{files(unwritten)} not written")
    return ", ".join(parts)


class NotRewritten(OSError):
    """A file ``akc fmt`` will not replace: it is read-only, or it changed since it was read."""


def write_atomically(path: str, text: str, expected: bytes | None = None) -> None:
    """Replace the file at ``path`` (through a link, its target) by ``text``, UTF-8 with ``\\n`` newlines.

    The text goes to a temporary file in the same folder, which then takes the file's place
    in one rename, with the file's permissions (and owner, where that can be set): the file is
    whole at every moment. A read-only file (no write bit, or not writable by this user) is
    refused. With ``expected`` (the bytes the text was made from), the file is read again just
    before the rename and left alone if it no longer holds them: an editor saved it meanwhile.
    Raises :class:`OSError` (:class:`NotRewritten` for the refusals), leaving no temporary file.
    """
    real = os.path.realpath(path)
    before = os.stat(real)
    if not before.st_mode & 0o222 or not os.access(real, os.W_OK):  # root may write anything: ask the mode too
        raise NotRewritten(errno.EACCES, "it is read-only (make it writable to format it)", path)
    folder, base = os.path.split(real)
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            out.write(text)
        os.chmod(tmp, stat.S_IMODE(before.st_mode))
        if hasattr(os, "chown") and (before.st_uid, before.st_gid) != (os.stat(tmp).st_uid, os.stat(tmp).st_gid):
            with contextlib.suppress(OSError):  # only root can give a file away; the rest keep theirs
                os.chown(tmp, before.st_uid, before.st_gid)
        if expected is not None and _current(real) != expected:
            raise NotRewritten(errno.EAGAIN, "it changed while it was being formatted, so it was left as it is "
                                             "(run akc fmt again)", path)
        os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _current(real: str) -> bytes | None:
    """What the file at ``real`` holds now (None when it is gone or no longer a readable regular file)."""
    from arke.lang.source import read_source_bytes

    try:
        return read_source_bytes(real)
    except OSError:
        return None
