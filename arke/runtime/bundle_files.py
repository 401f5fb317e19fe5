"""A bundle's folder on disk: its manifest (read and checked: format, checksums, architecture, ISA flags, the
shape of every field) and the staging that writes a new bundle in place of an old one without ever
replacing what is not a bundle. :mod:`arke.runtime.bundle` loads and calls what these check."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from arke.runtime.cache import opened_regular, read_regular

#: The manifest's ``format`` and the newest ``version`` this Arke reads.
FORMAT, VERSION = "arke.bundle", 1
MANIFEST, LIBRARY = "manifest.json", "libarke_bundle.so"
#: The dtype names a manifest may give (arke_bundle.h's codes).
DTYPE_NAMES = frozenset({"bool", "i8", "i32", "i64", "u8", "u16", "u32", "f16", "bf16", "f32"})


class BundleError(RuntimeError):
    """A bundle that cannot be loaded here: the message says which check failed and what to do."""



@cache
def isa_flags() -> frozenset[str]:
    """The ISA flags of this CPU as Linux lists them (``flags`` on x86, ``Features`` on ARM), limited to
    the ones code generation can use."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(f for f in value.split() if _is_isa(f))
    return frozenset()


def _is_isa(flag: str) -> bool:
    prefixes = ("sse", "ssse", "avx", "amx", "fma", "f16c", "bmi", "popcnt", "movbe", "abm", "cx16", "gfni",
                "vaes", "vpclmul", "asimd", "fp", "sve", "bf16", "i8mm", "atomics")
    return flag.startswith(prefixes)


def bundle_error(path: Path, what: str) -> BundleError:
    return BundleError(f"bundle {path}: {what}")


_fail = bundle_error


#: The most bytes a bundle's manifest may hold, and any file its checksums list (a library, weights).
MAX_MANIFEST, MAX_FILE = 64 << 20, 64 << 30


def sha256(path: Path) -> str:
    """The sha256 of a file's bytes (a manifest's checksums), read in pieces: a regular file of at most
    :data:`MAX_FILE` bytes, else :class:`ValueError` (a FIFO, a device or a link to one never blocks or streams)."""
    h = hashlib.sha256()
    with opened_regular(path, MAX_FILE) as (f, _):
        while piece := f.read(1 << 22):
            h.update(piece)
    return h.hexdigest()


#: The field of a manifest (``manifest.json``, a model's ``model.json``) that holds the sha256 of the rest of it.
DIGEST = "digest"


def _canonical(record: dict[str, Any]) -> bytes:
    """The record as its file reads back (tuples as lists, keys as strings), in one spelling."""
    plain = json.loads(json.dumps({k: v for k, v in record.items() if k != DIGEST}))
    return json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def stamped(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with its :data:`DIGEST`: the checksums cover the other files, this one covers the manifest
    itself (a symbol, a default or a shape edited in it would otherwise run, wrongly)."""
    return {**record, DIGEST: hashlib.sha256(_canonical(record)).hexdigest()}


def edited(record: dict[str, Any]) -> str | None:
    """Why ``record`` is not as its build wrote it (no digest, or one that does not match), or None."""
    digest = record.get(DIGEST)
    if not isinstance(digest, str):
        return "it has no digest of its own (written by an older Arke, or edited)"
    try:
        found = hashlib.sha256(_canonical(record)).hexdigest()
    except (TypeError, ValueError):  # (not JSON as a build writes it: a NaN, a key that is no string)
        found = ""
    return None if found == digest else "it was edited after the build (its digest does not match its contents)"


def read_json(folder: Path, name: str, absent: str, what: str = "bundle") -> Any:
    """``folder/name`` parsed, or a :class:`BundleError` saying it is ``absent`` or cannot be read."""
    try:
        return json.loads(read_regular(folder / name, MAX_MANIFEST)[0])
    except FileNotFoundError:
        raise BundleError(f"{what} {folder}: no {name}: {absent}") from None
    except (OSError, ValueError, RecursionError) as err:  # (JSON and UTF-8 errors are ValueErrors)
        raise BundleError(f"{what} {folder}: {name} cannot be read ({err}); write it again") from None


def _bundle_files(folder: Path, mark: str) -> set[str]:
    """The names in ``folder`` its bundle wrote: ``mark`` and the files its checksums list (nothing more where
    ``mark`` cannot be read)."""
    try:
        record = json.loads(read_regular(folder / mark, MAX_MANIFEST)[0])
        files = record.get("files", {})
    except (OSError, ValueError, AttributeError, RecursionError):
        return {mark}
    if not str(record.get("format", "")).startswith("arke."):  # another tool's manifest.json: its files are not ours
        return set()
    return {mark} | {Path(str(name)).parts[0] for name in files if Path(str(name)).parts} if isinstance(
        files, dict) else {mark}


def _umask() -> int:
    """The process's umask, read without setting it (os.umask sets it: a race with other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _replaceable(out: Path, mark: str) -> None:
    """A :class:`BundleError` unless ``out`` is absent, an empty folder or a bundle (a folder with ``mark``)."""
    if out.is_symlink() or out.exists():
        if not out.is_dir() or out.is_symlink():
            raise BundleError(f"{out} exists and is not a folder: name a new folder for the bundle (nothing "
                              "was written)")
        found = sorted(p.name for p in out.iterdir())
        if found and mark not in _bundle_files(out, mark):
            raise BundleError(f"{out} holds a {mark} that is not an Arke bundle's: saving would replace the folder; "
                              "name a new or empty folder (nothing was written)")
        if found and mark not in found:
            raise BundleError(f"{out} is a folder with files in it and no {mark}: it is not a bundle, and "
                              "saving would replace it; name a new or empty folder (nothing was written)")
        others = sorted(set(found) - _bundle_files(out, mark))
        if found and others:
            raise BundleError(f"{out} holds files its bundle did not write ({', '.join(others[:4])}"
                              f"{', ...' if len(others) > 4 else ''}), which saving would delete: move them, or "
                              "name another folder (nothing was written)")


@contextmanager
def staged(out: Path, mark: str) -> Iterator[Path]:
    """A new folder beside ``out`` to write a bundle into; once the block succeeds it replaces ``out`` (an
    existing one is kept until then, and a failed write leaves it as it was). Only an empty folder or a
    bundle (a folder with the file ``mark``) is replaced: anything else at ``out`` is the user's, and
    a :class:`BundleError` says so before anything is written."""
    if out.parent.is_dir():
        with _parent_locked(out.parent):  # (not while another save swaps its folder in)
            _replaceable(out, mark)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    stage.chmod(0o777 & ~_umask())  # mkdtemp's folder is private (0700); a bundle is shipped: the umask's mode
    try:
        yield stage
        _shipped_modes(stage)
        with _parent_locked(out.parent):  # two saves into one folder at once: one swap after the other
            _replaceable(out, mark)
            if out.exists():
                old = out.with_name(f".{out.name}.old")
                shutil.rmtree(old, ignore_errors=True)
                out.rename(old)
                stage.rename(out)
                shutil.rmtree(old, ignore_errors=True)
            else:
                stage.rename(out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def _shipped_modes(stage: Path) -> None:
    """The umask's modes on everything staged: writers that make private files (safetensors' 0600) would keep
    a shipped bundle from other users (executables keep their x bits)."""
    mask = _umask()
    for path in stage.rglob("*"):
        if path.is_symlink():
            continue
        if path.is_dir() or path.stat().st_mode & 0o111:
            path.chmod(0o777 & ~mask)
        else:
            path.chmod(0o666 & ~mask)


@contextmanager
def _parent_locked(folder: Path) -> Iterator[None]:
    """An exclusive lock on ``folder`` (``flock`` of the folder itself: nothing is written in it), where the
    system has one."""
    try:
        import fcntl
    except ImportError:  # (not a POSIX system)
        yield
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a folder that cannot be opened for reading: saved without the lock (as before)
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def check_listed(folder: Path, mark: str, files: dict[Any, Any], fail: Callable[[Path, str], BundleError],
                 again: str) -> None:
    """Each file a bundle's ``mark`` lists (name -> sha256) is a regular file inside ``folder`` with that
    checksum; else ``fail(folder, why)`` is raised, saying to do ``again``."""
    for name, digest in files.items():
        listed = Path(str(name))
        if listed.is_absolute() or ".." in listed.parts:
            raise fail(folder, f"{mark} lists {name}, which is not a file inside the bundle; {again}")
        file = folder / listed
        if not os.path.lexists(file):
            raise fail(folder, f"{name} is missing; {again}")
        if not file.is_file():  # a folder, a device, a FIFO, a link to one or a dangling link
            raise fail(folder, f"{name} is not a regular file; {again}")
        try:
            found = sha256(file)
        except (OSError, ValueError) as err:
            raise fail(folder, f"{name} cannot be read ({err}); {again}") from None
        if found != digest:
            raise fail(folder, f"{name} does not match its checksum in {mark} (sha256 {found[:16]}…, recorded "
                               f"{str(digest)[:16]}…): the file was changed or damaged; {again}")


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checked manifest of the bundle at ``path`` (format, version, checksums, architecture, ISA flags)."""
    folder = Path(path)
    manifest = read_json(folder, MANIFEST, "this is not a bundle folder (build one with "
                                           "`akc build FILE --target llvm --bundle DIR`)")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _fail(folder, f"{MANIFEST} is not an Arke bundle's (format {FORMAT!r})")
    version = manifest.get("version")
    if not isinstance(version, int) or not 1 <= version <= VERSION:
        raise _fail(folder, f"format version {version!r} is unknown to this Arke (it reads version {VERSION}); "
                            "rebuild the bundle with this Arke, or load it with the Arke that built it")
    changed = edited(manifest)
    if changed is not None:
        raise _fail(folder, f"{MANIFEST}: {changed}; rebuild the bundle")
    files = manifest.get("files")
    if not isinstance(files, dict) or manifest.get("library") not in files:
        raise _fail(folder, f"{MANIFEST} lists no checksums for its files; rebuild the bundle")
    check_listed(folder, MANIFEST, files, _fail, "rebuild the bundle")
    why = _malformed(manifest)
    if why is not None:
        raise _fail(folder, f"{MANIFEST} is malformed ({why}); rebuild the bundle")
    arch = platform.machine()
    if manifest.get("arch") != arch:
        raise _fail(folder, f"it was built for {manifest.get('arch')} ({manifest.get('triple')}), and this machine is "
                            f"{arch}; build one here, or with --cpu for this machine's architecture")
    missing = sorted(set(manifest.get("features", ())) - isa_flags())
    if missing:
        raise _fail(folder, f"it was built for CPU {manifest.get('cpu')}, and this CPU lacks {', '.join(missing)}; "
                            "rebuild it with --cpu naming an older CPU (e.g. --cpu x86-64-v3) or on this machine")
    return manifest


def _malformed(manifest: dict[str, Any]) -> str | None:
    """What in a manifest is not as a build writes it, or None (its digest can be recomputed by hand: a build of
    another Arke, or a hand edit stamped again, must still not reach the library with fields of the wrong kind)."""
    def strings(v: Any) -> bool:
        return isinstance(v, list) and all(isinstance(x, str) for x in v)

    def tensor(t: Any, param: bool) -> bool:
        return (isinstance(t, dict) and t.get("dtype") in DTYPE_NAMES and strings(t.get("shape"))
                and (not param or (isinstance(t.get("name"), str) and isinstance(t.get("dim"), bool))))

    if not strings(manifest.get("features", [])) or not strings(manifest.get("units", [])):
        return "features and units must be lists of names"
    kernels = manifest.get("kernels")
    if not isinstance(kernels, list) or not kernels:
        return "no list of kernels"
    def default(p: dict[str, Any]) -> bool:  # a number, true/false, null, or "inf", "-inf", "nan"
        d = p.get("default")
        return d is None or isinstance(d, bool | int | float) or d in ("inf", "-inf", "nan")

    seen: set[str] = set()
    for k in kernels:
        if not isinstance(k, dict) or not all(isinstance(k.get(f), str) for f in ("name", "function", "symbol")):
            return "a kernel without a name, function and symbol"
        if k["name"] in seen:
            return f"kernel {k['name']!r} is listed twice"
        seen.add(k["name"])
        if not isinstance(k.get("params"), list) or not all(tensor(p, True) for p in k["params"]):
            return f"kernel {k['name']!r}: a parameter without a name, a known dtype, a shape and a dim flag"
        if not all(default(p) for p in k["params"]):
            return f"kernel {k['name']!r}: a parameter default that is not a number, true/false or \"inf\""
        if not isinstance(k.get("results"), list) or not k["results"] or not all(tensor(r, False) for r in
                                                                                  k["results"]):
            return f"kernel {k['name']!r}: a result without a known dtype and a shape"
        if not isinstance(k.get("variants"), list) or not strings(k.get("where", [])):
            return f"kernel {k['name']!r}: no list of variants or where clauses"
    return None
