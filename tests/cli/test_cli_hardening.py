"""``akc`` against a hostile file system: special files, huge files, closed or full standard streams,
unlistable folders, and ``akc fmt`` racing an editor (issue 16, items 8, 11 and 15).

A hang is tested in a fresh process with a timeout: the test fails (it does not hang) if akc blocks.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from arke.cli import app as cli
from arke.lang.source import MAX_SOURCE_BYTES, SourceFileError, read_source_bytes

ROOT = Path(__file__).resolve().parents[2]
posix = pytest.mark.skipif(os.name != "posix", reason="FIFOs, /dev/zero and closed descriptors are POSIX")

GOOD = """\
kernel double(x: f32[N]) -> f32[N] {
  return x[n] * 2.0
}
"""
MESSY = "kernel double(x: f32[N])->f32[N]{return x[n]*2.0}\n"


def akc(*args: str, timeout: float = 60, preexec: Callable[[], None] | None = None,
        **streams: Any) -> subprocess.CompletedProcess[bytes]:
    """``python -m arke ARGS`` in a fresh process, killed after ``timeout`` seconds (a hang fails the test)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "AKC_DEBUG")}
    env["NO_COLOR"] = "1"
    streams.setdefault("stdout", subprocess.PIPE)
    streams.setdefault("stderr", subprocess.PIPE)
    return subprocess.run([sys.executable, "-m", "arke", *args], env=env, cwd=ROOT, timeout=timeout,
                          preexec_fn=preexec, check=False, **streams)


@pytest.fixture(autouse=True)
def _plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("AKC_DEBUG", raising=False)


@pytest.fixture()
def specials(tmp_path: Path) -> Path:
    """A folder with one good program, a FIFO named ``x.ak`` and a ``z.ak`` link to ``/dev/zero``."""
    (tmp_path / "good.ak").write_text(GOOD, encoding="utf-8")
    os.mkfifo(tmp_path / "x.ak")
    (tmp_path / "z.ak").symlink_to("/dev/zero")
    return tmp_path


# ---------------------------------------------------------------- item 8: only regular files, bounded


@posix
def test_check_folder_skips_fifo_and_dev_zero_link(specials: Path) -> None:
    done = akc("check", str(specials), timeout=30)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert done.stdout.decode() == "ok: 1 file\n"
    assert f"skipping `{specials / 'x.ak'}`: not a regular file (it is a FIFO)" in err
    assert f"skipping `{specials / 'z.ak'}`: not a regular file (it is a character device)" in err


@posix
@pytest.mark.parametrize("command", [["check"], ["fmt"], ["fmt", "--check"], ["ir"],
                                     ["build", "--target", "llvm"]])
def test_special_files_named_directly_are_ak1004(specials: Path, command: list[str]) -> None:
    for name, kind in (("x.ak", "a FIFO"), ("z.ak", "a character device")):
        done = akc(*command, str(specials / name), timeout=30)
        err = done.stdout.decode() + done.stderr.decode()  # check reports on stdout, the others on stderr
        assert done.returncode == 2, err
        assert "AK1004" in err and f"not a regular file (it is {kind})" in err
        assert "internal error" not in err


def test_a_source_over_the_limit_is_refused_not_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "big.ak"
    with open(big, "wb") as f:
        f.truncate(MAX_SOURCE_BYTES + 1)  # sparse: costs no disk
    assert cli.main(["check", str(big)]) == 2
    assert "larger than 16 MiB" in capsys.readouterr().out
    with pytest.raises(SourceFileError, match="larger than 16 MiB"):
        read_source_bytes(big)
    assert read_source_bytes(big, limit=MAX_SOURCE_BYTES + 1) == b"\0" * (MAX_SOURCE_BYTES + 1)


@posix
def test_stdin_over_the_limit_is_refused(tmp_path: Path) -> None:
    with open("/dev/zero", "rb") as zero:  # endless: akc must stop at the limit
        done = akc("check", "-", stdin=zero, timeout=60)
    assert done.returncode == 2
    assert b"cannot read standard input: larger than 16 MiB" in done.stdout


@posix
def test_read_source_bytes_never_blocks_on_a_fifo(specials: Path) -> None:
    code = ("import sys; from arke.lang.source import read_source_bytes as r\n"
            "try:\n    r(sys.argv[1])\nexcept OSError as e:\n    print(e.strerror)\n")
    done = subprocess.run([sys.executable, "-c", code, str(specials / "x.ak")], capture_output=True,
                          cwd=ROOT, timeout=30, check=False)
    assert done.stdout.decode().strip() == "not a regular file (it is a FIFO)"


def test_a_folder_that_cannot_be_listed_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The denial is simulated (``os.scandir`` refuses), so this also runs as root."""
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.scandir

    def scandir(path: Any = ".") -> Any:
        if os.fspath(path) == str(locked):
            raise PermissionError(errno.EACCES, "Permission denied", str(locked))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert cli.main(["check", str(locked)]) == 2
    err = capsys.readouterr().err
    assert f"cannot list folder `{locked}`: Permission denied" in err
    assert "no .ak files" not in err


@posix
def test_a_folder_without_permissions_says_permission_denied(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "a.ak").write_text(GOOD, encoding="utf-8")
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):
            pytest.skip("permissions are not enforced here (root)")
        assert cli.main(["check", str(locked)]) == 2
        assert "Permission denied" in capsys.readouterr().err
    finally:
        locked.chmod(0o755)


# ---------------------------------------------------------------- item 11: closed and full streams


def _close(fd: int) -> Callable[[], None]:
    return lambda: os.close(fd)


@posix
@pytest.mark.parametrize("command", [["check", "-"], ["fmt", "-"], ["lsp"]])
def test_closed_stdin_is_an_io_problem(command: list[str]) -> None:
    done = akc(*command, preexec=_close(0), timeout=30)
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 2, out
    assert "internal error" not in out and "Traceback" not in out
    assert "standard input" in out and "closed" in out


@posix
@pytest.mark.parametrize("command", [["check", "examples/rmsnorm.ak"], ["ir", "examples/rmsnorm.ak"],
                                     ["fmt", "--check", "examples/rmsnorm.ak"]])
def test_closed_stdout_is_an_io_problem(command: list[str]) -> None:
    done = akc(*command, preexec=_close(1), stdout=None, timeout=30)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err == "akc: error: standard output is closed; give akc somewhere to write (or >/dev/null)\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("command", [["check", "examples/rmsnorm.ak"], ["check", "--format", "json",
                                     "examples/rmsnorm.ak"], ["ir", "examples/rmsnorm.ak"]])
def test_stdout_on_a_full_disk_is_an_io_problem(command: list[str]) -> None:
    with open("/dev/full", "wb") as full:
        done = akc(*command, stdout=full, timeout=30)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err == "akc: error: cannot write standard output: No space left on device\n"


# ---------------------------------------------------------------- item 15: akc fmt and its writes


def test_fmt_leaves_a_file_an_editor_saved_meanwhile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "k.ak"
    path.write_text(MESSY, encoding="utf-8")
    saved = "# the editor's newer text\n" + MESSY
    from arke.lang import fmt

    real = fmt.format_source

    def format_while_saving(text: str, name: str = "<input>") -> str:
        out = real(text, name)
        path.write_text(saved, encoding="utf-8")  # the editor saves while akc fmt works
        return out

    monkeypatch.setattr(fmt, "format_source", format_while_saving)
    assert cli.main(["fmt", str(path)]) == 2
    err = capsys.readouterr().err
    assert path.read_text(encoding="utf-8") == saved  # the save is not lost
    assert "changed while it was being formatted" in err
    assert "0 files reformatted" in err and "1 file not written" in err
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_fmt_refuses_a_read_only_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "k.ak"
    path.write_text(MESSY, encoding="utf-8")
    path.chmod(0o444)
    inode = path.stat().st_ino
    assert cli.main(["fmt", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"cannot write `{path}`: it is read-only" in err
    assert "1 file not written" in err and "0 files reformatted" in err
    assert path.read_text(encoding="utf-8") == MESSY
    assert path.stat().st_ino == inode and stat.S_IMODE(path.stat().st_mode) == 0o444


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_fmt_keeps_the_mode_of_what_it_rewrites(tmp_path: Path) -> None:
    path = tmp_path / "k.ak"
    path.write_text(MESSY, encoding="utf-8")
    path.chmod(0o604)
    assert cli.main(["fmt", str(path)]) == 0
    assert path.read_text(encoding="utf-8") == GOOD
    assert stat.S_IMODE(path.stat().st_mode) == 0o604


def test_a_file_fmt_could_not_write_is_not_counted_reformatted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "k.ak"
    path.write_text(MESSY, encoding="utf-8")

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "mkstemp", full)
    assert cli.main(["fmt", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"cannot write `{path}`: No space left on device" in err
    assert "reformatted " + str(path) not in err
    assert "0 files reformatted, 0 files left unchanged, 1 file not written" in err
    assert path.read_text(encoding="utf-8") == MESSY


def test_llvm_arch_is_checked_and_gives_the_gpu_flavour() -> None:
    """``--arch`` on the llvm target is never ignored: an unknown one is a usage error, ``--emit source`` with it
    is the GPU flavour's IR, and the host's asm or object code takes none."""
    rms = str(ROOT / "examples" / "rmsnorm.ak")
    bad = akc("build", rms, "--target", "llvm", "--arch", "banana")
    assert bad.returncode == 2 and b"unknown architecture 'banana'" in bad.stderr
    gpu = akc("build", rms, "--target", "llvm", "--arch", "sm_90", "--kernel", "rmsnorm")
    assert gpu.returncode == 0 and b'target triple = "nvptx64-nvidia-cuda"' in gpu.stdout
    asm = akc("build", rms, "--target", "llvm", "--arch", "sm_90", "--emit", "asm")
    assert asm.returncode == 2 and b"takes no --arch" in asm.stderr
