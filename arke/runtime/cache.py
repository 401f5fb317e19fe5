"""The on-disk compilation cache every target's runtime uses (object code, PTX, .vmfb …).

Keys come from :func:`cache_key`: a SHA-256 over the caller's parts (IR, strategy, target,
CPU, toolchain versions), this format's version, arke's version and a fingerprint of arke's
source, so code built by another compiler is never reused. Guarantees:

- **Nothing half-written**: entries go to a temporary file, fsynced, then ``os.replace``
  (atomic); a failed write leaves neither an entry nor a temporary file.
- **Checked on every read**: header (magic, version, SHA-256 of key + metadata + payload,
  lengths), JSON metadata, payload. A bad file gives a :class:`CacheWarning` naming it and
  saying what to do; it is removed and the caller rebuilds. Only a regular file of at most
  :data:`MAX_ENTRY_BYTES` is read: an entry that is a FIFO, a device, a link to one or a
  folder is such a bad file too, found by ``stat`` before any open, so it never blocks.
- **Concurrent builders both succeed**: :meth:`Cache.get_or_build` holds a per-key ``flock``
  while building, so a second process waits, then reads the entry; after
  ``ARKE_CACHE_LOCK_TIMEOUT`` it builds itself. A dead holder's lock is freed by the OS.
- **A cache problem never fails a build**: an unwritable directory warns once per
  :class:`Cache`, which then keeps entries in memory only. ``ARKE_NO_CACHE=1`` skips the disk.

Files: ``<dir>/<key[:2]>/<key>.entry`` and an empty ``<key>.lock`` beside it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import stat
import struct
import tempfile
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arke import knobs

_fcntl: types.ModuleType | None
try:
    import fcntl as _fcntl
except ImportError:  # Windows: no advisory locks; concurrent builders each build, writes stay atomic
    _fcntl = None

log = logging.getLogger("arke.cache")

#: Version of the entry layout and of the key encoding; bump it when either changes.
FORMAT_VERSION = 1
MAGIC = b"ARKECACH"
#: magic, format version, reserved (0), SHA-256 of key + metadata + payload, payload length, metadata length.
_HEADER = struct.Struct("<8sHH32sQI")
#: The largest entry the cache reads or writes (1 GiB; compiled kernels are far smaller): a larger one
#: stays in memory only, and a larger file on disk is a corrupted entry, never read whole.
MAX_ENTRY_BYTES = 1 << 30
_KEY_RE = re.compile(r"[A-Za-z0-9_-]{2,128}")
_SUFFIXES = (".entry", ".lock", ".tmp")


class CacheWarning(UserWarning):
    """A cache problem that costs time, never correctness: a corrupted entry or an unwritable directory."""


@dataclass(frozen=True)
class Entry:
    """One cached artifact: its bytes and the string metadata stored with them."""

    data: bytes
    meta: Mapping[str, str] = field(default_factory=dict)


class _Corrupt(ValueError):
    """An entry file that fails a check; the message says which (and ``inode`` is the file's, when known)."""

    def __init__(self, message: str, inode: int = -1) -> None:
        super().__init__(message)
        self.inode = inode


def read_regular(path: str | os.PathLike[str], limit: int | None = None) -> tuple[bytes, int]:
    """The bytes and inode of the regular file at ``path`` (a link is followed), at most ``limit`` bytes
    (default :data:`MAX_ENTRY_BYTES`).

    Never blocks and never reads a device: ``path`` is checked with ``stat`` before it is opened
    (without blocking), and the open file again before it is read. A FIFO, a device, a folder or
    a larger file raises ``ValueError`` (saying which); an unreadable one :class:`OSError`.
    """
    limit = MAX_ENTRY_BYTES if limit is None else limit
    with opened_regular(path, limit) as (f, inode):
        blob = f.read(limit + 1)
    if len(blob) > limit:  # it grew while being read
        raise _Corrupt(f"more than {limit} bytes", inode)
    return blob, inode


@contextlib.contextmanager
def opened_regular(path: str | os.PathLike[str], limit: int) -> Iterator[tuple[Any, int]]:
    """(the open file, its inode) for reading a regular file of at most ``limit`` bytes, as
    :func:`read_regular` checks it, for a caller that reads it in pieces (a bundle's checksums)."""
    _regular(os.stat(path), limit)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        inode = _regular(os.fstat(fd), limit)  # replaced between the stat and the open
        with os.fdopen(fd, "rb", closefd=False) as f:
            yield f, inode
    finally:
        os.close(fd)


def _regular(st: os.stat_result, limit: int) -> int:
    """The inode of ``st`` (links followed) if it is a regular file of at most ``limit`` bytes; else
    :class:`_Corrupt`."""
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode) \
            else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a special file"
        raise _Corrupt(f"not a regular file but {kind}", st.st_ino)
    if st.st_size > limit:
        raise _Corrupt(f"{st.st_size} bytes, more than the {limit} it may have", st.st_ino)
    return st.st_ino


@functools.cache
def source_fingerprint() -> str:
    """SHA-256 over arke's own source files (``*.py``, ``*.lark``), computed once per process.

    Part of every key, so an edited compiler (an editable install keeps its version number)
    never picks up kernels its older self built.
    """
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(p for pattern in ("*.py", "*.lark") for p in root.rglob(pattern)):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _encode_part(name: str, value: str | bytes | int) -> bytes:
    """One key part as name length, name, type tag, value length, value: never ambiguous."""
    tag: bytes
    if isinstance(value, bool):
        tag, raw = b"t", b"1" if value else b"0"
    elif isinstance(value, int):
        tag, raw = b"i", str(value).encode()
    elif isinstance(value, str):
        tag, raw = b"s", value.encode("utf-8")
    elif isinstance(value, (bytes, bytearray, memoryview)):
        tag, raw = b"b", bytes(value)
    else:
        raise TypeError(f"cache_key part {name}= must be str, bytes or int, not {type(value).__name__}")
    encoded = name.encode("utf-8")
    return struct.pack("<Q", len(encoded)) + encoded + tag + struct.pack("<Q", len(raw)) + raw


def cache_key(**parts: str | bytes | int) -> str:
    """The cache key (64 hex digits) for these named parts, e.g. ``ir=…, target="llvm-cpu", cpu=…``.

    Part order does not matter; names, types and values all do (``n=1`` and ``n="1"`` differ).
    The key also covers :data:`FORMAT_VERSION`, arke's version and :func:`source_fingerprint`;
    toolchain versions (llvmlite, triton …) are parts the caller passes.
    """
    from arke import __version__

    h = hashlib.sha256(b"arke-cache-key\0")
    fixed: dict[str, str | bytes | int] = {"format": FORMAT_VERSION, "arke": __version__, "src": source_fingerprint()}
    for name, value in fixed.items():
        h.update(_encode_part(name, value))
    h.update(b"\0parts\0")
    for name in sorted(parts):
        h.update(_encode_part(name, parts[name]))
    return h.hexdigest()


def _digest(key: str, meta: bytes, payload: bytes) -> bytes:
    h = hashlib.sha256(key.encode("ascii") + b"\0")
    h.update(meta)
    h.update(payload)
    return h.digest()


def _encode(key: str, entry: Entry) -> bytes:
    meta = json.dumps(dict(entry.meta), sort_keys=True, separators=(",", ":")).encode()
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, _digest(key, meta, entry.data), len(entry.data), len(meta))
    return header + meta + entry.data


def _decode(key: str, blob: bytes) -> Entry:
    """The entry in ``blob``, or :class:`_Corrupt` saying what is wrong with it."""
    if len(blob) < _HEADER.size:
        raise _Corrupt("empty file" if not blob else f"truncated: {len(blob)} bytes, less than a header")
    magic, version, _reserved, digest, size, meta_size = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise _Corrupt("not an arke cache entry (bad magic)")
    if version != FORMAT_VERSION:
        raise _Corrupt(f"entry format {version}, expected {FORMAT_VERSION}")
    if len(blob) != _HEADER.size + meta_size + size:
        raise _Corrupt(f"{len(blob)} bytes on disk, the header says {_HEADER.size + meta_size + size}")
    meta_raw = blob[_HEADER.size : _HEADER.size + meta_size]
    payload = blob[_HEADER.size + meta_size :]
    if _digest(key, meta_raw, payload) != digest:
        raise _Corrupt("checksum mismatch")
    try:
        meta = json.loads(meta_raw.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError is a ValueError
        raise _Corrupt(f"unreadable metadata: {exc}") from None
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise _Corrupt("metadata is not a mapping of strings")
    return Entry(payload, meta)


def _acquire(fd: int, timeout: float) -> bool:
    """Take an exclusive ``flock`` on ``fd``, polling until ``timeout`` seconds pass; False if not taken."""
    assert _fcntl is not None
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        except OSError:  # a file system without locks: build without one
            return False
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(pause, remaining))
        pause = min(pause * 2, 0.05)


class Cache:
    """A content-addressed store of compiled artifacts: an in-process dict in front of a directory.

    ``directory`` defaults to ``ARKE_CACHE_DIR`` (see :func:`arke.knobs.cache_dir`); ``disk``
    defaults to not ``ARKE_NO_CACHE``; ``lock_timeout`` (seconds a builder waits for another
    process building the same key) defaults to ``ARKE_CACHE_LOCK_TIMEOUT``. Safe to share
    between threads and processes.
    """

    def __init__(
        self, directory: str | os.PathLike[str] | None = None, *, disk: bool | None = None,
        lock_timeout: float | None = None,
    ) -> None:
        self.directory = Path(directory) if directory is not None else knobs.cache_dir()
        self.disk = not knobs.cache_disabled() if disk is None else disk
        self.lock_timeout = knobs.cache_lock_timeout() if lock_timeout is None else lock_timeout
        self._memory: dict[str, Entry] = {}
        self._writable = True  # False after a failed write: memory only from then on

    def __repr__(self) -> str:
        return f"Cache({str(self.directory)!r}, disk={self.disk})"

    def path(self, key: str) -> Path:
        """Where the entry for ``key`` lives on disk (it may not exist)."""
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
            raise ValueError(f"bad cache key {key!r}: use cache_key(...) (2-128 of A-Z a-z 0-9 _ -)")
        return self.directory / key[:2] / f"{key}.entry"

    def load(self, key: str) -> Entry | None:
        """The entry for ``key`` with its metadata, or None (a miss, or a corrupted entry now removed)."""
        path = self.path(key)
        entry = self._memory.get(key)
        if entry is None and self.disk:
            entry = self._read(key, path)
            if entry is not None:
                self._memory[key] = entry
        log.debug("%s %s", "hit" if entry is not None else "miss", key)
        return entry

    def get(self, key: str) -> bytes | None:
        """The bytes stored under ``key``, or None."""
        entry = self.load(key)
        return None if entry is None else entry.data

    def put(self, key: str, data: bytes, meta: Mapping[str, str] | None = None) -> None:
        """Store ``data`` (and string ``meta``) under ``key``, replacing any old entry atomically."""
        path = self.path(key)
        strings = dict(meta or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in strings.items()):
            raise TypeError(f"cache metadata must map str to str, got {strings!r}")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"cache data must be bytes, not {type(data).__name__}")
        entry = Entry(bytes(data), strings)
        if len(entry.data) > MAX_ENTRY_BYTES:
            log.debug("entry %s is %d bytes, more than %d: kept in memory only", key, len(entry.data), MAX_ENTRY_BYTES)
        elif self.disk and self._writable:
            self._write(key, path, entry)
        self._memory[key] = entry

    def get_or_build(self, key: str, build: Callable[[], bytes], meta: Mapping[str, str] | None = None) -> bytes:
        """The bytes under ``key``; on a miss, ``build()`` them, store them and return them.

        While building, holds the key's lock, so another process asking for the same key waits
        and then reads this one's entry instead of building it again. An exception from
        ``build`` propagates and stores nothing.
        """
        data = self.get(key)
        if data is not None:
            return data
        with self._locked(key):
            data = self.get(key)  # another process may have built it while we waited
            if data is None:
                log.debug("build %s", key)
                data = build()
                if not isinstance(data, (bytes, bytearray, memoryview)):
                    raise TypeError(f"build() for cache key {key} returned {type(data).__name__}, not bytes")
                data = bytes(data)
                self.put(key, data, meta)
        return data

    def clear(self) -> None:
        """Forget every entry: the in-process layer, and the files this cache wrote in its directory.

        Only ``<2 chars>/<key>.entry|.lock|.tmp`` files are removed, never anything else there.
        """
        self._memory.clear()
        with contextlib.suppress(OSError):
            for sub in self.directory.iterdir():
                if not (len(sub.name) == 2 and _KEY_RE.fullmatch(sub.name) and sub.is_dir()):
                    continue
                for file in sub.iterdir():
                    if file.name.endswith(_SUFFIXES):
                        with contextlib.suppress(OSError):
                            file.unlink()
                with contextlib.suppress(OSError):
                    sub.rmdir()

    # -- disk ------------------------------------------------------------------------------

    def _read(self, key: str, path: Path) -> Entry | None:
        """The entry at ``path``; None for a miss or an unreadable file, and for a corrupted entry,
        removed. Only a regular file of at most :data:`MAX_ENTRY_BYTES` is read: a FIFO, a device
        (or a link to one), a folder or a larger file is a corrupted entry and never blocks."""
        try:
            blob, inode = read_regular(path)
        except FileNotFoundError:
            return None
        except _Corrupt as exc:
            self._discard(path, exc.inode, str(exc))
            return None
        except OSError as exc:  # unreadable: a miss; a later write reports a real problem
            log.debug("cannot read %s: %s", path, exc)
            return None
        try:
            return _decode(key, blob)
        except _Corrupt as exc:
            self._discard(path, inode, str(exc))
            return None

    def _discard(self, path: Path, inode: int, reason: str) -> None:
        """Remove a corrupted entry (unless a writer already replaced it) and say so."""
        outcome = "removed it"
        try:
            if os.stat(path).st_ino == inode:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            outcome = f"could not remove it ({exc})"
        warnings.warn(
            CacheWarning(
                f"arke cache: corrupted entry {path} ({reason}); {outcome} and the kernel will be rebuilt. "
                f"If this keeps happening, clear the cache with `rm -rf {self.directory}` "
                f"or bypass it with ARKE_NO_CACHE=1."
            ),
            stacklevel=2,
        )

    def _write(self, key: str, path: Path, entry: Entry) -> None:
        blob = _encode(key, entry)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key}.", suffix=".tmp")
        except OSError as exc:
            self._unwritable(exc)
            return
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)  # atomic: readers see the old entry or the new one, never a mix
        except BaseException as exc:  # incl. KeyboardInterrupt: never leave a temporary file behind
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if not isinstance(exc, OSError):
                raise
            self._unwritable(exc)

    def _unwritable(self, exc: OSError) -> None:
        """Warn once, then keep entries in memory only."""
        self._writable = False
        warnings.warn(
            CacheWarning(
                f"arke cache: cannot write to {self.directory} ({exc}); kernels are cached in memory only "
                f"for this process. Set ARKE_CACHE_DIR to a writable directory, or ARKE_NO_CACHE=1 to skip the disk."
            ),
            stacklevel=3,
        )

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        """Hold the key's advisory lock file, if locks are possible here; never fails, never waits forever."""
        fd = -1
        if _fcntl is not None and self.disk and self._writable:
            try:
                lock = self.path(key).with_suffix(".lock")
                lock.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NONBLOCK", 0), 0o644)
            except OSError:  # the write after the build reports the directory
                fd = -1
        if fd < 0:
            yield
            return
        try:
            if not _acquire(fd, self.lock_timeout):
                log.debug("lock for %s not taken within %ss: building anyway", key, self.lock_timeout)
            yield
        finally:
            os.close(fd)  # releases the lock


_default: Cache | None = None
_default_lock = threading.Lock()


def default_cache() -> Cache:
    """The process-wide :class:`Cache` for the current knobs (a new one when they change)."""
    global _default
    directory, disk, timeout = knobs.cache_dir(), not knobs.cache_disabled(), knobs.cache_lock_timeout()
    with _default_lock:
        current = _default
        if current is None or (current.directory, current.disk, current.lock_timeout) != (directory, disk, timeout):
            current = _default = Cache(directory, disk=disk, lock_timeout=timeout)
        return current
