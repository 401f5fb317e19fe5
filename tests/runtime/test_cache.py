"""The compilation cache: keys, round trips, corruption, atomic writes, concurrent builders, knobs."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from arke import knobs
from arke.runtime import cache as C
from arke.runtime.cache import Cache, CacheWarning, cache_key

PARTS: dict[str, str | bytes | int] = {
    "ir": "func @f(%0: f32[n]) ...", "strategy": "tile=64", "target": "llvm-cpu", "cpu": "sapphirerapids",
    "features": "+avx512f,+fma", "llvmlite": "0.50.0", "opt": 3,
}
KEY = cache_key(**PARTS)
PAYLOAD = bytes(range(256)) * 4096  # 1 MiB: a half-written entry would show


# every test: its own cache directory and the default knobs (conftest.cache_env)
pytestmark = pytest.mark.usefixtures("cache_env")


def counting(data: bytes = PAYLOAD) -> tuple[list[int], Callable[[], bytes]]:
    calls: list[int] = []

    def build() -> bytes:
        calls.append(1)
        return data

    return calls, build


def leftovers(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.name.endswith(".tmp"))


# -- keys -------------------------------------------------------------------------------------


def test_key_is_stable_and_order_free(monkeypatch: pytest.MonkeyPatch) -> None:
    assert re.fullmatch(r"[0-9a-f]{64}", KEY)
    assert cache_key(**dict(reversed(list(PARTS.items())))) == KEY
    # Another process gives the same key. The source fingerprint is pinned on both sides: arke's
    # files may be edited while the tests run, and that (rightly) changes every key.
    monkeypatch.setattr(C, "source_fingerprint", lambda: "pinned")
    script = f"import arke.runtime.cache as C; C.source_fingerprint = lambda: 'pinned'; print(C.cache_key(**{PARTS!r}))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == cache_key(**PARTS)


@pytest.mark.parametrize("name", sorted(PARTS))
def test_key_depends_on_every_part(name: str) -> None:
    value = PARTS[name]
    changed = value + 1 if isinstance(value, int) else value * 2
    assert cache_key(**{**PARTS, name: changed}) != KEY
    assert cache_key(**{k: v for k, v in PARTS.items() if k != name}) != KEY


def test_key_encoding_is_unambiguous() -> None:
    assert cache_key(a="bc") != cache_key(ab="c")
    assert cache_key(a="b", c="") != cache_key(a="bc")
    assert cache_key(n=1) != cache_key(n="1") != cache_key(n=b"1")
    assert cache_key(n=True) != cache_key(n=1)
    with pytest.raises(TypeError, match="must be str, bytes or int"):
        cache_key(n=1.5)  # type: ignore[arg-type]


def test_key_covers_arke_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(C, "source_fingerprint", lambda: "edited")
        assert cache_key(**PARTS) != KEY
    with monkeypatch.context() as patch:
        patch.setattr("arke.__version__", "9.9.9")
        assert cache_key(**PARTS) != KEY
    assert cache_key(**PARTS) == KEY


def test_bad_keys_and_values_are_rejected() -> None:
    cache = Cache()
    for bad in ("", "a", "../etc", "a/b", "x" * 129):
        with pytest.raises(ValueError, match="bad cache key"):
            cache.get(bad)
    with pytest.raises(TypeError, match="must be bytes"):
        cache.put(KEY, "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="map str to str"):
        cache.put(KEY, b"x", {"n": 1})  # type: ignore[dict-item]


# -- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("data", [PAYLOAD, b"", b"\0"])
def test_put_get_round_trip(data: bytes, cache_env: Path) -> None:
    Cache().put(KEY, data)
    assert Cache().get(KEY) == data  # a fresh instance reads the disk
    assert Cache().path(KEY).parent.parent == cache_env
    assert leftovers(cache_env) == []


def test_meta_round_trip() -> None:
    meta = {"entry": "kernel_main", "target": "llvm-cpu", "note": "µ-kernel ✓"}
    Cache().put(KEY, b"obj", meta)
    entry = Cache().load(KEY)
    assert entry is not None and entry.data == b"obj" and dict(entry.meta) == meta
    assert Cache().get("ab" * 32) is None


def test_get_or_build_builds_once_and_memory_layer_skips_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = Cache()
    calls, build = counting()
    assert cache.get_or_build(KEY, build) == PAYLOAD
    assert cache.get_or_build(KEY, build) == PAYLOAD
    assert Cache().get_or_build(KEY, build) == PAYLOAD  # from disk
    assert calls == [1]
    monkeypatch.setattr(Cache, "_read", lambda *a: pytest.fail("read the disk on a memory hit"))
    assert cache.get(KEY) == PAYLOAD


def test_failed_build_stores_nothing_and_releases_the_lock() -> None:
    cache = Cache(lock_timeout=600)  # a lock left held would hang the second call (caught by the run's timeout)

    def broken() -> bytes:
        raise RuntimeError("codegen bug")

    with pytest.raises(RuntimeError, match="codegen bug"):
        cache.get_or_build(KEY, broken)
    assert Cache().get(KEY) is None
    with pytest.raises(TypeError, match="returned str, not bytes"):
        cache.get_or_build(KEY, lambda: "text")  # type: ignore[arg-type,return-value]
    assert Cache().get_or_build(KEY, lambda: b"ok") == b"ok"


# -- corruption -------------------------------------------------------------------------------


def _flip(blob: bytes, at: int) -> bytes:
    return blob[:at] + bytes([blob[at] ^ 0xFF]) + blob[at + 1 :]


CORRUPTIONS: dict[str, Callable[[bytes], bytes]] = {
    "payload byte": lambda b: _flip(b, len(b) - 7),
    "metadata byte": lambda b: _flip(b, C._HEADER.size + 2),
    "checksum byte": lambda b: _flip(b, 20),
    "truncated": lambda b: b[: len(b) // 2],
    "truncated header": lambda b: b[:10],
    "extra bytes": lambda b: b + b"junk",
    "wrong magic": lambda b: b"NOTARKE!" + b[8:],
    "other format": lambda b: b[:8] + (C.FORMAT_VERSION + 1).to_bytes(2, "little") + b[10:],
    "empty file": lambda b: b"",
}


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_corrupted_entry_is_reported_removed_and_rebuilt(how: str, cache_env: Path) -> None:
    Cache().put(KEY, PAYLOAD, {"k": "v"})
    path = Cache().path(KEY)
    path.write_bytes(CORRUPTIONS[how](path.read_bytes()))
    calls, build = counting()
    with pytest.warns(CacheWarning, match=re.escape(str(path))) as record:
        assert Cache().get_or_build(KEY, build) == PAYLOAD
    assert len(record) == 1
    message = str(record[0].message)
    assert "rebuilt" in message and f"rm -rf {cache_env}" in message and "ARKE_NO_CACHE=1" in message
    assert calls == [1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Cache().get(KEY) == PAYLOAD  # the rebuilt entry is sound


def test_entry_under_the_wrong_key_is_corrupt() -> None:
    other = cache_key(**{**PARTS, "opt": 0})
    Cache().put(other, b"other kernel")
    path = Cache().path(KEY)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.replace(Cache().path(other), path)
    with pytest.warns(CacheWarning, match="checksum mismatch"):
        assert Cache().get(KEY) is None
    assert not path.exists()


# -- atomic writes ----------------------------------------------------------------------------


@pytest.mark.parametrize("victim", ["replace", "fsync"])
def test_crash_mid_write_loses_nothing(victim: str, cache_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Cache().put(KEY, b"old kernel")
    cache, fresh = Cache(), "cd" * 32

    def crash(*args: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(os, victim, crash)
        with pytest.raises(KeyboardInterrupt):
            cache.put(KEY, PAYLOAD)
        with pytest.raises(KeyboardInterrupt):
            cache.put(fresh, PAYLOAD)
    assert leftovers(cache_env) == []
    assert Cache().get(KEY) == b"old kernel"  # the old entry is intact
    assert cache.get(fresh) is None and Cache().get(fresh) is None


def test_write_error_falls_back_to_memory(cache_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    cache = Cache()
    with pytest.warns(CacheWarning, match="No space left"):
        cache.put(KEY, PAYLOAD)
    assert cache.get(KEY) == PAYLOAD
    assert leftovers(cache_env) == []


def test_unwritable_directory_warns_once_and_still_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("ARKE_CACHE_DIR", str(blocker / "cache"))  # root can write anywhere; this still fails
    cache = Cache()
    calls, build = counting()
    with pytest.warns(CacheWarning, match=re.escape(str(blocker / "cache"))) as record:
        assert cache.get_or_build(KEY, build) == PAYLOAD
    assert len(record) == 1 and "ARKE_CACHE_DIR" in str(record[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.get_or_build(KEY, build) == PAYLOAD
        assert cache.get_or_build("ef" * 32, lambda: b"second") == b"second"
    assert calls == [1]


def test_no_cache_knob_bypasses_disk(cache_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Cache().put(KEY, b"on disk")
    monkeypatch.setenv("ARKE_NO_CACHE", "1")
    cache = Cache()
    assert not cache.disk and cache.get(KEY) is None
    calls, build = counting()
    other = "ab" * 32
    assert cache.get_or_build(other, build) == PAYLOAD
    assert cache.get_or_build(other, build) == PAYLOAD  # the in-process layer still works
    assert calls == [1] and not cache.path(other).exists()


def test_clear_removes_only_cache_files(cache_env: Path) -> None:
    cache = Cache()
    cache.get_or_build(KEY, lambda: b"x")
    (cache_env / "notes.txt").write_text("mine")
    cache.clear()
    assert cache.get(KEY) is None and Cache().get(KEY) is None
    assert sorted(p.name for p in cache_env.rglob("*")) == ["notes.txt"]
    Cache(cache_env / "missing").clear()


# -- concurrent builders ----------------------------------------------------------------------

BUILDER = """
import hashlib, pathlib, sys, time
from arke.runtime.cache import Cache

directory, sync, key, name, timeout, builders = sys.argv[1:]
sync = pathlib.Path(sync)

def wait_for(condition, what):
    deadline = time.monotonic() + 60  # hang guard only
    while not condition():
        if time.monotonic() > deadline:
            sys.exit(f"{name}: gave up waiting for {what}")
        time.sleep(0.002)

class Spy(Cache):
    def get(self, key):
        data = super().get(key)
        if data is None:
            (sync / f"missed.{name}").touch()
        return data

def build():
    (sync / f"building.{name}").touch()
    wait_for(lambda: len(list(sync.glob("building.*"))) >= int(builders) and (sync / "finish").exists(), "finish")
    return bytes(range(256)) * 4096

(sync / f"ready.{name}").touch()
wait_for(lambda: (sync / "go").exists(), "go")
data = Spy(directory, disk=True, lock_timeout=float(timeout)).get_or_build(key, build)
print(hashlib.sha256(data).hexdigest())
"""


def _wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60  # hang guard only
    while not condition():
        assert time.monotonic() < deadline, "builder processes did not get there"
        time.sleep(0.002)


def _race(tmp_path: Path, lock_timeout: float, builders: int, release: Callable[[Path], None]) -> list[str]:
    """Two processes call get_or_build on one key at once; returns the builders' names."""
    sync = tmp_path / "sync"
    sync.mkdir()
    script = tmp_path / "builder.py"
    script.write_text(BUILDER)
    directory = str(tmp_path / "cache")
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), directory, str(sync), KEY, name, str(lock_timeout), str(builders)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for name in ("A", "B")
    ]
    try:
        _wait_for(lambda: all((sync / f"ready.{n}").exists() for n in "AB"))
        (sync / "go").touch()
        release(sync)
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    expected = hashlib.sha256(PAYLOAD).hexdigest()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and out.strip() == expected, err
        assert "Warning" not in err, err
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Cache(directory).get(KEY) == PAYLOAD
    assert leftovers(Path(directory)) == []
    return sorted(p.name.split(".")[1] for p in sync.glob("building.*"))


@pytest.mark.skipif(C._fcntl is None, reason="no advisory locks on this platform")
def test_second_process_waits_for_the_first_builder(tmp_path: Path) -> None:
    def release(sync: Path) -> None:  # both have missed, one is building: the other is at the lock
        _wait_for(lambda: all((sync / f"missed.{n}").exists() for n in "AB") and any(sync.glob("building.*")))
        (sync / "finish").touch()

    assert len(_race(tmp_path, lock_timeout=60, builders=1, release=release)) == 1


def test_two_processes_building_at_once_both_succeed(tmp_path: Path) -> None:
    # lock_timeout=0: the second does not wait, so both build at the same time and both write
    assert _race(tmp_path, lock_timeout=0, builders=2, release=lambda sync: (sync / "finish").touch()) == ["A", "B"]


def test_threads_share_one_build() -> None:
    cache, calls, results = Cache(), [], []  # type: tuple[Cache, list[int], list[bytes]]
    barrier = threading.Barrier(4)

    def build() -> bytes:
        calls.append(1)
        return PAYLOAD

    def worker() -> None:
        barrier.wait(timeout=60)
        results.append(cache.get_or_build(KEY, build))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results == [PAYLOAD] * 4
    if C._fcntl is not None:
        assert calls == [1]


# -- knobs ------------------------------------------------------------------------------------


def test_cache_dir_knob(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert knobs.cache_dir() == tmp_path / "cache"
    monkeypatch.delenv("ARKE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert knobs.cache_dir() == tmp_path / "xdg" / "arke"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/is/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert knobs.cache_dir() == tmp_path / "home" / ".cache" / "arke"


def test_flag_and_number_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not knobs.cache_disabled() and not knobs.debug() and knobs.cache_lock_timeout() == 120
    for value, expected in [("1", True), ("yes", True), ("0", False), ("", False), ("off", False)]:
        monkeypatch.setenv("ARKE_NO_CACHE", value)
        assert knobs.cache_disabled() is expected
    monkeypatch.setenv("ARKE_NO_CACHE", "please")
    with pytest.raises(knobs.KnobError, match="ARKE_NO_CACHE='please'"):
        knobs.cache_disabled()
    monkeypatch.setenv("ARKE_CACHE_LOCK_TIMEOUT", "2.5")
    assert knobs.cache_lock_timeout() == 2.5
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv("ARKE_CACHE_LOCK_TIMEOUT", bad)
        with pytest.raises(knobs.KnobError, match="ARKE_CACHE_LOCK_TIMEOUT"):
            knobs.cache_lock_timeout()
    monkeypatch.setenv("AKC_DEBUG", "all")
    assert knobs.debug()


def test_default_cache_follows_the_knobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = C.default_cache()
    assert C.default_cache() is first and first.directory == tmp_path / "cache" and first.disk
    monkeypatch.setenv("ARKE_NO_CACHE", "1")
    assert not C.default_cache().disk
    monkeypatch.setenv("ARKE_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert C.default_cache().directory == tmp_path / "elsewhere"
