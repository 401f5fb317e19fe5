"""Load a bundle (``akc build --bundle``) without the compiler: :func:`load_bundle`.

A bundle is a folder with a shared library, its C header and ``manifest.json``. Loading checks, in
order, that the manifest is a bundle's of a format version this Arke reads, that every file's
sha256 is the one recorded, that the library is for this machine's architecture and that the host
has every ISA flag its code may use; each failure is a :class:`BundleError` saying which and what
to do. Nothing here imports llvmlite, SymPy or the compiler (``arke.lang``, ``arke.passes``,
``arke.plan``, ``arke.targets``): a call binds its arguments in Python (by position or name, scalars
converted and range-checked, dtypes checked with the messages ``arke.build`` gives), and the
library's own guards check shapes, dims and `where` clauses (:mod:`arke.targets.llvm.bundle.cwrap`:
the Python guards' rules and messages) and give each result's shape, before its dispatches run on
the library's worker pool through ctypes (which releases the GIL).
"""

from __future__ import annotations

import ctypes
import difflib
import hashlib
import json
import os
import platform
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arke.runtime.errors import GuardError
from arke.runtime.limits import check_tensor_kind, check_threads, refuse_huge_broadcast, resolved
from arke.runtime.panels import _PANELS, VNNI_KEY, panels_of
from arke.runtime.pool import BufferPool, evict_oldest

#: The manifest's ``format`` and the newest ``version`` this Arke reads.
FORMAT, VERSION = "arke.bundle", 1
MANIFEST, LIBRARY = "manifest.json", "libarke_bundle.so"
#: The ABI's dtype codes (arke_bundle.h) by dtype name, and the torch dtype of each (``TORCH_BY_NAME``).
_CODES = {"bool": 0, "i8": 1, "i32": 2, "i64": 3, "u8": 4, "u16": 5, "u32": 6, "f16": 7, "bf16": 8, "f32": 9}
_TORCH = {"bool": torch.bool, "i8": torch.int8, "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8,
          "u16": torch.uint16, "u32": torch.uint32, "f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
_BY_TORCH = {_TORCH[d]: c for d, c in _CODES.items()}
TORCH_BY_NAME = _TORCH
_NUMPY = {"bool": "np.bool_", "i8": "np.int8", "i32": "np.int32", "i64": "np.int64", "u8": "np.uint8",
          "u16": "np.uint16", "u32": "np.uint32", "f16": "np.float16", "f32": "np.float32"}
_INT_RANGE = {"i8": (-2**7, 2**7 - 1), "i32": (-2**31, 2**31 - 1), "i64": (-2**63, 2**63 - 1), "u8": (0, 2**8 - 1),
              "u16": (0, 2**16 - 1), "u32": (0, 2**32 - 1)}


class BundleError(RuntimeError):
    """A bundle that cannot be loaded here: the message says which check failed and what to do."""


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("layout", ctypes.c_int32), ("reserved", ctypes.c_int32)]


class _Error(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int32), ("rule", ctypes.c_char * 16), ("param", ctypes.c_char * 64),
                ("message", ctypes.c_char * 1024)]


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


def _fail(path: Path, what: str) -> BundleError:
    return BundleError(f"bundle {path}: {what}")


def sha256(path: Path) -> str:
    """The sha256 of a file's bytes (a manifest's checksums)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_json(folder: Path, name: str, absent: str, what: str = "bundle") -> Any:
    """``folder/name`` parsed, or a :class:`BundleError` saying it is ``absent`` or cannot be read."""
    try:
        return json.loads((folder / name).read_text())
    except FileNotFoundError:
        raise BundleError(f"{what} {folder}: no {name}: {absent}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BundleError(f"{what} {folder}: {name} cannot be read ({err}); write it again") from None


def _bundle_files(folder: Path, mark: str) -> set[str]:
    """The names in ``folder`` its bundle wrote: ``mark`` and the files its checksums list (nothing more where
    ``mark`` cannot be read)."""
    try:
        files = json.loads((folder / mark).read_text()).get("files", {})
    except (OSError, ValueError, AttributeError):
        return {mark}
    return {mark} | {Path(str(name)).parts[0] for name in files if Path(str(name)).parts} if isinstance(
        files, dict) else {mark}


@contextmanager
def staged(out: Path, mark: str) -> Iterator[Path]:
    """A new folder beside ``out`` to write a bundle into; once the block succeeds it replaces ``out`` (an
    existing one is kept until then, and a failed write leaves it as it was). Only an empty folder or a
    bundle (a folder with the file ``mark``) is replaced: anything else at ``out`` is the user's, and
    a :class:`BundleError` says so before anything is written."""
    if out.is_symlink() or out.exists():
        if not out.is_dir() or out.is_symlink():
            raise BundleError(f"{out} exists and is not a folder: name a new folder for the bundle (nothing "
                              "was written)")
        found = sorted(p.name for p in out.iterdir())
        if found and mark not in found:
            raise BundleError(f"{out} is a folder with files in it and no {mark}: it is not a bundle, and "
                              "saving would replace it; name a new or empty folder (nothing was written)")
        others = sorted(set(found) - _bundle_files(out, mark))
        if found and others:
            raise BundleError(f"{out} holds files its bundle did not write ({', '.join(others[:4])}"
                              f"{', ...' if len(others) > 4 else ''}), which saving would delete: move them, or "
                              "name another folder (nothing was written)")
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield stage
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
    files = manifest.get("files")
    if not isinstance(files, dict) or manifest.get("library") not in files:
        raise _fail(folder, f"{MANIFEST} lists no checksums for its files; rebuild the bundle")
    for name, digest in files.items():
        file = folder / str(name)
        if Path(str(name)).name != name or not file.is_file():
            raise _fail(folder, f"{name} is missing; rebuild the bundle")
        found = sha256(file)
        if found != digest:
            raise _fail(folder, f"{name} does not match its checksum in {MANIFEST} (sha256 {found[:16]}…, recorded "
                                f"{str(digest)[:16]}…): the file was changed or damaged; rebuild the bundle")
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
    """What in a manifest is not as a build writes it (it has no checksum of its own), or None."""
    def strings(v: Any) -> bool:
        return isinstance(v, list) and all(isinstance(x, str) for x in v)

    def tensor(t: Any, param: bool) -> bool:
        return (isinstance(t, dict) and t.get("dtype") in _TORCH and strings(t.get("shape"))
                and (not param or (isinstance(t.get("name"), str) and isinstance(t.get("dim"), bool))))

    if not strings(manifest.get("features", [])) or not strings(manifest.get("units", [])):
        return "features and units must be lists of names"
    kernels = manifest.get("kernels")
    if not isinstance(kernels, list) or not kernels:
        return "no list of kernels"
    for k in kernels:
        if not isinstance(k, dict) or not all(isinstance(k.get(f), str) for f in ("name", "function", "symbol")):
            return "a kernel without a name, function and symbol"
        if not isinstance(k.get("params"), list) or not all(tensor(p, True) for p in k["params"]):
            return f"kernel {k['name']!r}: a parameter without a name, a known dtype, a shape and a dim flag"
        if not isinstance(k.get("results"), list) or not k["results"] or not all(tensor(r, False) for r in
                                                                                  k["results"]):
            return f"kernel {k['name']!r}: a result without a known dtype and a shape"
        if not isinstance(k.get("variants"), list) or not strings(k.get("where", [])):
            return f"kernel {k['name']!r}: no list of variants or where clauses"
    return None


def _by_content(library: Path, digest: str) -> str:
    """A path naming ``library`` by its sha256, to dlopen: the dynamic loader returns an already loaded
    library for a path it has seen, so a bundle rebuilt in place would otherwise run its old code."""
    folder = Path(tempfile.gettempdir()) / f"arke-bundles-{os.getuid()}"
    link = folder / f"{digest}.so"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        if folder.stat().st_uid != os.getuid():
            return str(library)  # someone else's folder: not trusted with the link
        target = library.resolve()
        if link.is_symlink() and os.readlink(link) == str(target):
            return str(link)
        # made under a name of its own, then renamed over the old link in one step: another process loading
        # the same library never finds the path missing
        fresh = folder / f".{digest}.{os.getpid()}.{threading.get_ident()}.so"
        if fresh.is_symlink():
            fresh.unlink()
        fresh.symlink_to(target)
        os.replace(fresh, link)
    except OSError:
        return str(library)  # no link here: the path itself (right unless rebuilt in this process)
    return str(link)


def load_bundle(path: str | os.PathLike[str]) -> Bundle:
    """Load the bundle at ``path``: a library whose kernels are called like ``arke.build``'s
    (positional or keyword arguments, ``threads=``, ``out=``; the same guards and results)."""
    return Bundle(Path(path), read_manifest(path))


class Bundle:
    """A loaded bundle: ``lib.rmsnorm(x, w)`` or ``lib.kernels["rmsnorm"]``; ``manifest`` as recorded."""

    def __init__(self, path: Path, manifest: dict[str, Any]):
        self.path, self.manifest = path, manifest
        try:
            self._lib = ctypes.CDLL(_by_content(path / manifest["library"], manifest["files"][manifest["library"]]))
        except OSError as err:
            raise _fail(path, f"the library cannot be loaded ({err})") from None
        abi = self._lib.arke_bundle_abi_version
        abi.restype = ctypes.c_int32
        if abi() != manifest.get("abi"):
            raise _fail(path, f"the library's ABI version {abi()} is not the manifest's {manifest.get('abi')}")
        try:
            self.kernels = {r["name"]: BundleKernel(self, r) for r in manifest["kernels"]}
        except (KeyError, TypeError, AttributeError) as err:
            raise _fail(path, f"the manifest's kernel records cannot be read ({err!r}); rebuild the bundle") from None

    def __getattr__(self, name: str) -> BundleKernel:
        kernels = self.__dict__.get("kernels", {})
        if name in kernels:
            return kernels[name]
        raise AttributeError(f"no kernel `{name}` in this bundle; it has: {', '.join(kernels)}")

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *self.kernels]

    def __repr__(self) -> str:
        return f"<arke bundle {self.path} ({self.manifest['cpu']}): {', '.join(self.kernels)}>"

    @property
    def functions(self) -> Any:
        """The kernels' SemanticIR (read on first use: only the interpreter's explanations need it)."""
        if "_functions" not in self.__dict__:
            from arke.ir.serialize import from_json

            self._functions = from_json(json.dumps(self.manifest["semantic"]))
        return self._functions


def _argtypes(fn: Any) -> Any:
    fn.argtypes = [ctypes.POINTER(_Tensor), ctypes.c_int64, ctypes.POINTER(_Tensor), ctypes.c_int64, ctypes.c_int32,
                   ctypes.POINTER(_Error)]
    fn.restype = ctypes.c_int
    return fn


def _shape_fn(fn: Any) -> Any:
    fn.argtypes = [ctypes.POINTER(_Tensor), ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64),
                   ctypes.POINTER(_Error)]
    fn.restype = ctypes.c_int
    return fn


class BundleKernel:
    """A kernel of a loaded bundle: call it like the function it is (as ``arke.build``'s kernels)."""

    def __init__(self, bundle: Bundle, record: dict[str, Any]):
        self.bundle, self.record = bundle, record
        self.name: str = record["name"]
        self.params: list[dict[str, Any]] = record["params"]
        self._names = [p["name"] for p in self.params]
        self._results = [(len(r["shape"]), _TORCH[r["dtype"]], r["dtype"]) for r in record["results"]]
        self._entry = _argtypes(getattr(bundle._lib, record["symbol"]))
        self._result_shape = _shape_fn(getattr(bundle._lib, record["symbol"] + "_result_shape"))
        self._shapes: dict[tuple[Any, ...], list[tuple[int, ...]]] = {}  # argument shapes -> result shapes
        self._pool = BufferPool()

    def __repr__(self) -> str:
        return f"<arke bundled kernel {self.name} ({self.bundle.manifest['cpu']})>"

    def __call__(self, *arrays: Any, threads: int | None = None, out: Any = None, **scalars: Any) -> Any:
        """Check the call (arguments, dtypes, then the library's shape, dim and `where` guards, ``out=``)
        before anything runs, then run it: results are NumPy arrays for NumPy inputs, else tensors."""
        if threads is not None:
            threads = check_threads(self.name, threads)
        args, any_torch = self._bind(arrays, scalars)
        # a dim parameter's value (a 0-d integer) sets result shapes as the tensors' shapes do
        key = tuple((tuple(a.shape), a.dtype, int(a) if a.dim() == 0 and not a.is_floating_point() else None)
                    for a in args)
        shapes = self._shapes.get(key)
        if shapes is None:
            shapes = self._result_shapes(args)
            if len(self._shapes) >= 64:
                evict_oldest(self._shapes)
            self._shapes[key] = shapes
        if out is not None:
            outs = self._outs(out)
        else:
            outs = [self._pool.take(shape, dtype) for shape, (_, dtype, _) in zip(shapes, self._results)]
        try:
            self.run_tensors(args, outs, threads or torch.get_num_threads())
        except BaseException:
            if out is None:
                for o in outs:
                    self._pool.give(o)
            raise
        if out is not None:
            users = tuple(out) if isinstance(out, tuple | list) else (out,)
            return users[0] if len(users) == 1 else users
        for o in outs:  # reused only once the caller lets go of it
            self._pool.give(o)
        results = [o.numpy() if not any_torch and o.dtype != torch.bfloat16 else o for o in outs]
        return results[0] if len(results) == 1 else tuple(results)

    def _bind(self, arrays: Sequence[Any], scalars: Mapping[str, Any]) -> tuple[list[torch.Tensor], bool]:
        """Arguments in parameter order as contiguous CPU tensors (scalars and dims as 0-d tensors)."""
        names = self._names
        if len(arrays) > len(names):
            raise GuardError(self.name, f"takes {len(names)} arguments ({', '.join(names)}), but {len(arrays)} were "
                             "given", rule="arity")
        given: dict[str, Any] = dict(zip(names, arrays, strict=False))
        for key, value in scalars.items():
            if key not in names:
                close = difflib.get_close_matches(key, names, n=1)
                hint = f"; did you mean `{close[0]}`?" if close else f" (parameters: {', '.join(names)})"
                raise GuardError(self.name, f"no parameter `{key}`{hint}", rule="arity", param=key)
            if key in given:
                raise GuardError(self.name, f"parameter `{key}` given twice (by position and by name)", rule="arity",
                                 param=key)
            given[key] = value
        missing = [p["name"] for p in self.params
                   if p["name"] not in given and (p["shape"] or p["default"] is None)]
        if missing:
            listed = ", ".join(f"`{m}`" for m in missing)
            raise GuardError(self.name, f"missing argument{'s' if len(missing) > 1 else ''} {listed}", rule="missing",
                             param=missing[0])
        any_torch = any(isinstance(v, torch.Tensor) for v in given.values())
        out: list[torch.Tensor] = []
        for p in self.params:
            value = given.get(p["name"], p["default"])
            if p["dim"]:
                out.append(torch.tensor(self._dim(p, value), dtype=torch.int64))
            elif not p["shape"]:
                out.append(self._scalar(p, value))
            else:
                out.append(self._tensor(p, value))
        return out, any_torch

    def _dim(self, p: dict[str, Any], value: Any) -> int:
        integer = ((isinstance(value, torch.Tensor) and not value.is_floating_point() and value.dtype != torch.bool)
                   or (isinstance(value, np.ndarray) and value.dtype.kind in "iu"))
        if integer and value.ndim == 0:  # a 0-d integer tensor or array
            value = int(value.item())
        if isinstance(value, np.integer):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            shown = repr(value) if isinstance(value, bool | int | float | str) else type(value).__name__
            raise GuardError(self.name, f"`{p['name']}` is a dim: it needs a positive integer, but was given {shown}",
                             rule="dim", param=p["name"])
        if value > 2**63 - 1:
            raise GuardError(self.name, f"`{p['name']}` = {value} is beyond the 64-bit sizes kernels compute with",
                             rule="size", param=p["name"])
        return value

    def _scalar(self, p: dict[str, Any], value: Any) -> torch.Tensor:
        name, dt = p["name"], p["dtype"]
        if isinstance(value, torch.Tensor | np.ndarray):
            if value.ndim != 0:
                raise GuardError(self.name, f"parameter `{name}` is {dt} (rank 0), but was given shape "
                                 f"{list(value.shape)} (rank {value.ndim})", rule="rank", param=name)
            value = value.item()
        elif isinstance(value, np.generic):
            value = value.item()
        if not isinstance(value, bool | int | float):
            raise GuardError(self.name, f"parameter `{name}` is a {dt} scalar, but was given {type(value).__name__}",
                             rule="type", param=name)
        shown = f"{value!r} ({type(value).__name__})"
        if dt == "bool" and not isinstance(value, bool):
            raise GuardError(self.name, f"parameter `{name}` needs a bool, but was given {shown}", rule="scalar",
                             param=name)
        if dt in _INT_RANGE:
            if not isinstance(value, int) or isinstance(value, bool):
                raise GuardError(self.name, f"parameter `{name}` needs an integer ({dt}), but was given {shown}",
                                 rule="scalar", param=name)
            lo, hi = _INT_RANGE[dt]
            if not lo <= value <= hi:
                raise GuardError(self.name, f"parameter `{name}` is {dt}, which cannot hold {value} (range {lo} .. "
                                 f"{hi})", rule="scalar", param=name)
        if dt in ("f16", "bf16", "f32"):
            if isinstance(value, bool):
                raise GuardError(self.name, f"parameter `{name}` needs a number ({dt}), but was given {shown}",
                                 rule="scalar", param=name)
            try:
                value = float(value)
            except OverflowError:
                raise GuardError(self.name, f"parameter `{name}` is {dt}, but was given an integer beyond any float; "
                                 "give a number within the float range", rule="scalar", param=name) from None
        return torch.tensor(value, dtype=_TORCH[dt])

    def _tensor(self, p: dict[str, Any], value: Any) -> torch.Tensor:
        name, dt = p["name"], p["dtype"]
        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "biuf" or str(value.dtype) not in _NP_TO_ARKE:
                shown, found = str(value.dtype), None
            else:
                shown, found = str(value.dtype), _NP_TO_ARKE[str(value.dtype)]
            if found != dt:
                how = (f"convert it with `.astype({_NUMPY[dt]})`" if dt in _NUMPY else
                       f"NumPy has no {dt}: pass a torch tensor, e.g. `torch.from_numpy(a).to({_TORCH[dt]})`")
                raise GuardError(self.name, f"parameter `{name}` needs {dt}, but was given {shown}; {how}",
                                 rule="dtype", param=name)
            if not value.flags.writeable or any(st < 0 for st in value.strides) or not value.dtype.isnative:
                value = np.array(value, dtype=value.dtype.newbyteorder("="))
            value = torch.from_numpy(value)
        elif isinstance(value, torch.Tensor):
            check_tensor_kind(self.name, f"parameter `{name}`", name, value)
            value = resolved(value)
            if value.dtype != _TORCH[dt]:
                shown = str(value.dtype).removeprefix("torch.")
                raise GuardError(self.name, f"parameter `{name}` needs {dt}, but was given {shown}; convert it with "
                                 f"`.to({_TORCH[dt]})`", rule="dtype", param=name)
            value = value.detach().cpu()
        else:
            rank = len(p["shape"])
            if isinstance(value, bool | int | float | np.generic):
                raise GuardError(self.name, f"parameter `{name}` is {dt}[{', '.join(p['shape'])}] (rank {rank}), but "
                                 "was given a scalar (rank 0)", rule="rank", param=name)
            raise GuardError(self.name, f"parameter `{name}` needs a tensor (a NumPy array or a torch tensor), but was "
                             f"given {type(value).__name__}", rule="type", param=name)
        if not value.is_contiguous():
            refuse_huge_broadcast(self.name, name, value)
            value = value.contiguous()
        return value

    def _result_shapes(self, args: list[torch.Tensor]) -> list[tuple[int, ...]]:
        """Each result's shape, from the library (which checks the arguments' shapes, dims and `where`s)."""
        keep: list[Any] = []
        c_args = (_Tensor * max(1, len(args)))(*(_tensor(t, keep) for t in args))
        shapes = []
        for r, (rank, _, _) in enumerate(self._results):
            shape = (ctypes.c_int64 * max(1, rank))()
            err = _Error()
            if self._result_shape(c_args, len(args), r, shape, ctypes.byref(err)):
                self._raise(err)
            shapes.append(tuple(shape[:rank]))
        return shapes

    def _outs(self, out: Any) -> list[torch.Tensor]:
        outs = tuple(out) if isinstance(out, tuple | list) else (out,)
        n = len(self._results)
        if len(outs) != n:
            raise GuardError(self.name, f"out= needs {n} tensor{'s' if n > 1 else ''}, one per result, but {len(outs)} "
                             "were given", rule="arity", param="out")
        tensors = []
        for k, o in enumerate(outs):
            what = f"out[{k}]" if n > 1 else "out"
            if isinstance(o, np.ndarray):
                if not o.flags.writeable:
                    raise GuardError(self.name, f"{what} is a read-only array", rule="type", param="out")
                o = torch.from_numpy(o)
            if not isinstance(o, torch.Tensor):
                raise GuardError(self.name, f"{what} must be a tensor or NumPy array, not {type(o).__name__}",
                                 rule="type", param="out")
            check_tensor_kind(self.name, what, "out", o)
            if o.device.type != "cpu":
                raise GuardError(self.name, f"{what} is on {o.device}, but the kernel runs on cpu", rule="device",
                                 param="out")
            if not o.is_contiguous():
                raise GuardError(self.name, f"{what} must be a contiguous tensor (write into a fresh one, then copy)",
                                 rule="dim", param="out")
            tensors.append(o)
        return tensors

    def run_tensors(self, args: list[torch.Tensor], outs: list[torch.Tensor], threads: int) -> None:
        """Call the C entry on contiguous CPU tensors (one per parameter, one per result); the library's
        guards raise as the Python guards do."""
        keep: list[Any] = []
        c_args = (_Tensor * max(1, len(args)))(*(_tensor(t, keep) for t in args))
        c_outs = (_Tensor * max(1, len(outs)))(*(_tensor(t, keep) for t in outs))
        err = _Error()
        if self._entry(c_args, len(args), c_outs, len(outs), threads, ctypes.byref(err)):
            if err.rule == b"index":
                self._explain(args)
            self._raise(err)

    def _raise(self, err: _Error) -> None:
        message = err.message.decode(errors="replace").removeprefix(f"kernel `{self.name}`: ")
        raise GuardError(self.name, message, rule=err.rule.decode(), param=err.param.decode() or None)

    def _explain(self, args: list[torch.Tensor]) -> None:
        """A subscript or division failed as it ran: the reference interpreter, where it is installed, says
        exactly which (a bundle runs without it otherwise, with the library's message)."""
        try:
            from arke.runtime.interp import run_function
        except ImportError:
            return
        functions = self.bundle.functions
        fn = functions.get(self.record["function"])
        run_function(fn, functions, {p.name: a for p, a in zip(fn.params, args)})


_NP_TO_ARKE = {"bool": "bool", "int8": "i8", "int32": "i32", "int64": "i64", "uint8": "u8", "uint16": "u16",
               "uint32": "u32", "float16": "f16", "float32": "f32"}


def _tensor(t: torch.Tensor, keep: list[Any]) -> _Tensor:
    shape = (ctypes.c_int64 * max(1, t.dim()))(*t.shape)
    keep.append(shape)
    key = panels_of(t) if _PANELS else None  # prepacked weights: the kernels read their panels
    layout = 0 if key is None else -1 if key == VNNI_KEY else int(key)
    return _Tensor(t.data_ptr(), _BY_TORCH.get(t.dtype, -1), t.dim(), shape, None, layout, 0)
