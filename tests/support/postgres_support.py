"""A throwaway, real PostgreSQL server for tests.

``running_postgres(base)`` runs ``initdb`` into a fresh directory, starts a server that listens on a Unix socket
only (no TCP), creates the database ``arke_test`` and yields a SQLAlchemy URL for it; on exit it stops the server
and deletes everything it created, even when the body raised. ``unavailable()`` says, in one line, why no server
can be started here (for ``pytest.skip``), or ``None``.

The server's files (data directory, socket directory) live in a private directory made with
``tempfile.mkdtemp(dir="/tmp")``, not under ``base`` itself: when the tests run as root, ``initdb`` and the server
must run as the ``postgres`` user, who cannot enter pytest's ``tmp_path`` (``/tmp/pytest-of-root`` is mode 0700),
and a Unix socket path must stay under ~107 bytes, which a deep ``tmp_path`` can exceed. ``base`` receives the
server's log (``postgres.log``) when the server stops, so a failing test leaves it behind for reading.

No fixture is defined here: tests define their own from these two functions, e.g.::

    @pytest.fixture
    def pg_url(tmp_path: Path) -> Iterator[str]:
        if (reason := postgres_support.unavailable()) is not None:
            pytest.skip(reason)
        with postgres_support.running_postgres(tmp_path) as url:
            yield url
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import quote

#: the database ``running_postgres`` creates and names in the URL it yields
DATABASE = "arke_test"
#: the superuser ``initdb`` creates (and the system user the server runs as when the tests run as root)
SUPERUSER = "postgres"
#: where Debian and Ubuntu put the server binaries, one folder per major version
_DEBIAN_BINDIRS = "/usr/lib/postgresql/*/bin"
_TOOLS = ("initdb", "pg_ctl", "postgres")
#: seconds allowed to each step (initdb, start, stop, connect)
_INITDB_TIMEOUT = 120
_START_WAIT = 60
_STOP_TIMEOUT = 60
_CONNECT_TIMEOUT = 10


def _is_root() -> bool:
    geteuid = getattr(os, "geteuid", None)
    return geteuid is not None and geteuid() == 0


def _has_tools(bindir: Path) -> bool:
    return all((bindir / tool).is_file() and os.access(bindir / tool, os.X_OK) for tool in _TOOLS)


def _version_key(bindir: str) -> tuple[int, ...]:
    """``/usr/lib/postgresql/15/bin`` -> ``(15,)``; folders without a number sort first."""
    name = Path(bindir).parent.name
    return tuple(int(part) for part in re.findall(r"\d+", name)) or (-1,)


def find_bindir() -> Path | None:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``: the newest ``/usr/lib/postgresql/*/bin``, else
    ``pg_config --bindir``, else the folder of ``initdb`` on ``PATH``; ``None`` when none has all three."""
    for candidate in sorted(glob.glob(_DEBIAN_BINDIRS), key=_version_key, reverse=True):
        if _has_tools(Path(candidate)):
            return Path(candidate)
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            done = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=False)
            if done.returncode == 0 and done.stdout.strip() and _has_tools(Path(done.stdout.strip())):
                return Path(done.stdout.strip())
    initdb = shutil.which("initdb")
    if initdb is not None and _has_tools(Path(initdb).resolve().parent):
        return Path(initdb).resolve().parent
    return None


def _server_user_ids() -> tuple[int, int] | None:
    """``(uid, gid)`` of the ``postgres`` system user, or ``None`` where there is none."""
    try:
        import pwd
    except ImportError:  # not a Unix
        return None
    try:
        entry = pwd.getpwnam(SUPERUSER)
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def unavailable() -> str | None:
    """``None`` when ``running_postgres`` can start a server here, else a one-line reason to skip."""
    if not hasattr(socket, "AF_UNIX"):
        return "PostgreSQL test server needs Unix sockets"
    if importlib.util.find_spec("psycopg") is None:
        return "psycopg is not installed (pip install 'psycopg[binary]')"
    if importlib.util.find_spec("sqlalchemy") is None:
        return "sqlalchemy is not installed"
    if find_bindir() is None:
        return "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found"
    if _is_root():
        if shutil.which("runuser") is None:
            return "running as root and runuser is missing (initdb refuses to run as root)"
        if _server_user_ids() is None:
            return f"running as root and there is no {SUPERUSER!r} system user (initdb refuses to run as root)"
    return None


def _as_server_user(command: Sequence[str]) -> list[str]:
    """``command`` as the ``postgres`` user when we are root (initdb and postgres refuse root), else as is."""
    if _is_root():
        return ["runuser", "-u", SUPERUSER, "--", *command]
    return list(command)


def _run(command: Sequence[str], *, timeout: float, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``command``; a failure or a timeout raises ``RuntimeError`` that carries its stderr."""
    try:
        done = subprocess.run(
            list(command), capture_output=True, text=True, timeout=timeout, cwd=cwd, stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        stderr = error.stderr.decode(errors="replace") if isinstance(error.stderr, bytes) else error.stderr
        raise RuntimeError(f"{' '.join(command)!r} timed out after {timeout}s; stderr: {stderr or ''}") from error
    except OSError as error:
        raise RuntimeError(f"{' '.join(command)!r} could not run: {error}") from error
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)!r} exited with {done.returncode}; stderr: {done.stderr.strip()}"
            + (f"; stdout: {done.stdout.strip()}" if done.stdout.strip() else "")
        )
    return done


def _free_port() -> int:
    """A port number nobody listens on now (the server uses it only to name its socket file)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _log_tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no server log)"


def _make_private_root() -> Path:
    """A fresh directory under /tmp that the server user can enter and write (it owns it when we are root)."""
    parent = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
    root = Path(tempfile.mkdtemp(prefix="arke-pg-", dir=parent))
    root.chmod(0o755)
    if _is_root():
        ids = _server_user_ids()
        if ids is None:
            shutil.rmtree(root, ignore_errors=True)
            raise RuntimeError(f"running as root and there is no {SUPERUSER!r} system user")
        os.chown(root, *ids)
    return root


def _kill_leftover(data: Path) -> None:
    """Last resort when ``pg_ctl stop`` failed: kill the postmaster named in ``postmaster.pid``, if any."""
    try:
        pid = int((data / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.05)


def _create_database(socket_dir: Path, port: int) -> None:
    import psycopg

    try:
        with psycopg.connect(
            host=str(socket_dir), port=port, user=SUPERUSER, dbname="postgres", autocommit=True,
            connect_timeout=_CONNECT_TIMEOUT,
        ) as connection:
            connection.execute(f'CREATE DATABASE "{DATABASE}"')
    except psycopg.Error as error:
        raise RuntimeError(f"could not create database {DATABASE!r}: {error}") from error


def url_for(socket_dir: Path | str, port: int, database: str = DATABASE) -> str:
    """The SQLAlchemy URL (psycopg 3 driver) for ``database`` on the server listening in ``socket_dir``."""
    return f"postgresql+psycopg://{SUPERUSER}@/{database}?host={quote(str(socket_dir), safe='/')}&port={port}"


@contextlib.contextmanager
def running_postgres(base: Path) -> Iterator[str]:
    """Start a throwaway PostgreSQL server, create the database ``arke_test`` and yield its SQLAlchemy URL
    (``postgresql+psycopg://postgres@/arke_test?host=<socket dir>&port=<port>``).

    The server listens on a Unix socket only, trusts every local connection, and runs without fsync. On exit it
    is stopped (``pg_ctl stop -m immediate``) and its files deleted, even when the body raised; its log is copied
    to ``base / "postgres.log"``. Raises ``RuntimeError`` (with the failing command's stderr) when it cannot start.
    """
    bindir = find_bindir()
    if bindir is None:
        raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found")
    base = Path(base)
    base.mkdir(parents=True, exist_ok=True)
    root = _make_private_root()
    data, socket_dir, log = root / "data", root / "sock", root / "postgres.log"
    started = False
    try:
        socket_dir.mkdir(mode=0o755)
        if _is_root():
            ids = _server_user_ids()
            assert ids is not None  # _make_private_root checked
            os.chown(socket_dir, *ids)
        _run(
            _as_server_user([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", SUPERUSER, "--no-sync",
                             "-E", "UTF8", "--locale=C"]),
            timeout=_INITDB_TIMEOUT, cwd=root,
        )
        port = _free_port()
        options = f"-k {socket_dir} -c listen_addresses='' -p {port} -c fsync=off"
        try:
            started = True  # from here on a half-started server may be running: always try to stop it
            _run(
                _as_server_user([str(bindir / "pg_ctl"), "start", "-D", str(data), "-l", str(log), "-o", options,
                                 "-w", "-t", str(_START_WAIT)]),
                timeout=_START_WAIT + 30, cwd=root,
            )
        except RuntimeError as error:
            raise RuntimeError(f"{error}\nserver log:\n{_log_tail(log)}") from error
        _create_database(socket_dir, port)
        yield url_for(socket_dir, port)
    finally:
        try:
            if started:
                try:
                    _run(
                        _as_server_user([str(bindir / "pg_ctl"), "stop", "-D", str(data), "-m", "immediate", "-w",
                                         "-t", str(_STOP_TIMEOUT)]),
                        timeout=_STOP_TIMEOUT + 30, cwd=root,
                    )
                except RuntimeError:
                    _kill_leftover(data)
            if log.is_file():
                with contextlib.suppress(OSError):
                    shutil.copyfile(log, base / "postgres.log")
        finally:
            shutil.rmtree(root, ignore_errors=True)
