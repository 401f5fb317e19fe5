"""The cache against entries that are no regular files (issue 16, item 9): a FIFO, a link to
``/dev/zero``, a folder, an oversized file. Each is a corrupted entry: reported, replaced, never a hang.

What could hang runs in a fresh process with a timeout, so a regression fails instead of blocking.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from arke.runtime import cache as C
from arke.runtime.cache import Cache, CacheWarning, cache_key

ROOT = Path(__file__).resolve().parents[2]
KEY = cache_key(ir="func @f", target="llvm-cpu")
posix = pytest.mark.skipif(os.name != "posix", reason="FIFOs and /dev/zero are POSIX")

#: Run in a fresh process: make the entry for KEY a FIFO or a link to /dev/zero, then build through it.
SCRIPT = textwrap.dedent("""
    import os, sys, warnings
    from arke.runtime.cache import Cache, cache_key
    cache = Cache(sys.argv[1], disk=True, lock_timeout=1)
    key = cache_key(ir="func @f", target="llvm-cpu")
    path = cache.path(key)
    path.parent.mkdir(parents=True)
    if sys.argv[2] == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        data = cache.get_or_build(key, lambda: b"built")
    print(data.decode(), "|", "; ".join(str(w.message) for w in seen))
    print(Cache(sys.argv[1], disk=True).get(key))  # a fresh process's view: the rebuilt entry on disk
    print(path)
""")


# every test: its own cache directory and the default knobs (conftest.cache_env)
pytestmark = pytest.mark.usefixtures("cache_env")


@posix
@pytest.mark.parametrize(("kind", "what"), [("fifo", "a FIFO"), ("zero", "a device")])
def test_a_special_entry_is_replaced_not_read(cache_env: Path, kind: str, what: str) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(cache_env), kind], capture_output=True,
                          cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 0, done.stderr.decode()
    first, second, where = done.stdout.decode().splitlines()
    data, _, said = first.partition(" | ")
    assert data == "built"
    assert "corrupted entry" in said and f"not a regular file but {what}" in said and "removed it" in said
    assert second == "b'built'"
    entry = Path(where)  # its key is the subprocess's (the source fingerprint is part of it)
    assert entry.is_file() and not entry.is_symlink()


def test_a_folder_in_an_entrys_place_is_a_miss_with_a_warning(cache_env: Path) -> None:
    cache = Cache(cache_env, disk=True)
    cache.path(KEY).mkdir(parents=True)
    with pytest.warns(CacheWarning, match="not a regular file but a folder"):
        assert cache.get(KEY) is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)  # the folder cannot be replaced: memory only
        assert cache.get_or_build(KEY, lambda: b"built") == b"built"


def test_an_entry_over_the_bound_is_corrupted_and_never_written(cache_env: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    cache = Cache(cache_env, disk=True)
    cache.put(KEY, b"x" * 100)
    monkeypatch.setattr(C, "MAX_ENTRY_BYTES", 64)
    fresh = Cache(cache_env, disk=True)
    with pytest.warns(CacheWarning, match="more than the 64"):
        assert fresh.get(KEY) is None
    assert not fresh.path(KEY).exists()
    fresh.put(KEY, b"y" * 100)  # too large for the disk: kept in memory only
    assert fresh.get(KEY) == b"y" * 100
    assert not fresh.path(KEY).exists()


@posix
def test_read_regular_refuses_special_files(tmp_path: Path) -> None:
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    code = "import sys; from arke.runtime.cache import read_regular as r\ntry:\n r(sys.argv[1])\n" \
           "except ValueError as e:\n print(e)\n"
    done = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, cwd=ROOT, timeout=30,
                          check=False)
    assert done.stdout.decode().strip() == "not a regular file but a FIFO"
    with pytest.raises(ValueError, match="a device"):
        C.read_regular("/dev/zero")
    (tmp_path / "ok").write_bytes(b"abc")
    assert C.read_regular(tmp_path / "ok")[0] == b"abc"


@posix
def test_a_fifo_in_the_triton_module_cache_is_replaced(cache_env: Path) -> None:
    """The triton target keeps its rendered modules under ``<cache>/triton``; a FIFO there must not hang."""
    pytest.importorskip("torch")
    code = textwrap.dedent("""
        import hashlib, os, sys
        from pathlib import Path
        from arke.targets.triton import kernel
        source = "ANSWER = 42\\n"
        folder = Path(sys.argv[1]) / "triton"
        folder.mkdir(parents=True)
        os.mkfifo(folder / f"arke_triton_{hashlib.sha256(source.encode()).hexdigest()[:32]}.py")
        print(kernel.load_source(source).ANSWER)
    """)
    env = {**os.environ, "ARKE_CACHE_DIR": str(cache_env)}
    done = subprocess.run([sys.executable, "-c", code, str(cache_env)], capture_output=True, cwd=ROOT, env=env,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == "42"
