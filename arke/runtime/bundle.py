"""Load a bundle (``akc build --bundle``) without the compiler: :func:`load_bundle`.

A bundle is a folder with a shared library, its C header and ``manifest.json``. Loading checks, in
order, that the manifest is a bundle's of a format version this Arke reads, that every file's
sha256 is the one recorded, that the library is for this machine's architecture and that the host
has every ISA flag its code may use; each failure is a :class:`BundleError` saying which and what
to do. Nothing here imports llvmlite or the compiler (``arke.lang``, ``arke.passes``,
``arke.plan``, ``arke.targets``): the kernels are the library's C entry points, called through
ctypes (which releases the GIL), after the same Python guards ``arke.build``'s kernels run.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
from functools import cache
from pathlib import Path
from typing import Any

import torch

from arke.ir import semantic as S
from arke.ir.dtypes import DType
from arke.ir.serialize import from_json
from arke.ir.shapes import evaluate
from arke.runtime.errors import GuardError
from arke.runtime.guards import TORCH_DTYPES, prepare_args
from arke.runtime.limits import check_threads, refuse_huge_broadcast
from arke.runtime.outputs import check_out

#: The manifest's ``format`` and the newest ``version`` this Arke reads.
FORMAT, VERSION = "arke.bundle", 1
MANIFEST, LIBRARY = "manifest.json", "libarke_bundle.so"
_CODES = {DType.BOOL: 0, DType.I8: 1, DType.I32: 2, DType.I64: 3, DType.U8: 4, DType.U16: 5, DType.U32: 6,
          DType.F16: 7, DType.BF16: 8, DType.F32: 9}
_BY_TORCH = {TORCH_DTYPES[d]: c for d, c in _CODES.items()}


class BundleError(RuntimeError):
    """A bundle that cannot be loaded here: the message says which check failed and what to do."""


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64))]


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


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checked manifest of the bundle at ``path`` (format, version, checksums, architecture, ISA flags)."""
    folder = Path(path)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        raise _fail(folder, f"no {MANIFEST}: this is not a bundle folder (build one with "
                            "`akc build FILE --target llvm --bundle DIR`)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _fail(folder, f"{MANIFEST} cannot be read ({err}); rebuild the bundle") from None
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
        found = hashlib.sha256(file.read_bytes()).hexdigest()
        if found != digest:
            raise _fail(folder, f"{name} does not match its checksum in {MANIFEST} (sha256 {found[:16]}…, recorded "
                                f"{str(digest)[:16]}…): the file was changed or damaged; rebuild the bundle")
    arch = platform.machine()
    if manifest.get("arch") != arch:
        raise _fail(folder, f"it was built for {manifest.get('arch')} ({manifest.get('triple')}), and this machine is "
                            f"{arch}; build one here, or with --cpu for this machine's architecture")
    missing = sorted(set(manifest.get("features", ())) - isa_flags())
    if missing:
        raise _fail(folder, f"it was built for CPU {manifest.get('cpu')}, and this CPU lacks {', '.join(missing)}; "
                            "rebuild it with --cpu naming an older CPU (e.g. --cpu x86-64-v3) or on this machine")
    return manifest


def load_bundle(path: str | os.PathLike[str]) -> Bundle:
    """Load the bundle at ``path``: a library whose kernels are called like ``arke.build``'s
    (positional or keyword arguments, ``threads=``, ``out=``; the same guards and results)."""
    return Bundle(Path(path), read_manifest(path))


class Bundle:
    """A loaded bundle: ``lib.rmsnorm(x, w)`` or ``lib.kernels["rmsnorm"]``; ``manifest`` as recorded."""

    def __init__(self, path: Path, manifest: dict[str, Any]):
        self.path, self.manifest = path, manifest
        try:
            self._lib = ctypes.CDLL(str(path / manifest["library"]))
        except OSError as err:
            raise _fail(path, f"the library cannot be loaded ({err})") from None
        abi = self._lib.arke_bundle_abi_version
        abi.restype = ctypes.c_int32
        if abi() != manifest.get("abi"):
            raise _fail(path, f"the library's ABI version {abi()} is not the manifest's {manifest.get('abi')}")
        try:
            functions = from_json(json.dumps(manifest["semantic"]))
        except (KeyError, ValueError) as err:
            raise _fail(path, f"the manifest's kernel signatures cannot be read ({err}); rebuild the bundle") from None
        self.functions = functions
        self.kernels = {r["name"]: BundleKernel(self, r, functions.get(r["function"])) for r in manifest["kernels"]}

    def __getattr__(self, name: str) -> BundleKernel:
        kernels = self.__dict__.get("kernels", {})
        if name in kernels:
            return kernels[name]
        raise AttributeError(f"no kernel `{name}` in this bundle; it has: {', '.join(kernels)}")

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *self.kernels]

    def __repr__(self) -> str:
        return f"<arke bundle {self.path} ({self.manifest['cpu']}): {', '.join(self.kernels)}>"


def _argtypes(fn: Any) -> Any:
    fn.argtypes = [ctypes.POINTER(_Tensor), ctypes.c_int64, ctypes.POINTER(_Tensor), ctypes.c_int64, ctypes.c_int32,
                   ctypes.POINTER(_Error)]
    fn.restype = ctypes.c_int
    return fn


class BundleKernel:
    """A kernel of a loaded bundle: call it like the function it is."""

    def __init__(self, bundle: Bundle, record: dict[str, Any], function: S.Function):
        self.bundle, self.record, self.function = bundle, record, function
        self.name = record["name"]
        self._entry = _argtypes(getattr(bundle._lib, record["symbol"]))

    def __repr__(self) -> str:
        return f"<arke bundled kernel {self.name} ({self.bundle.manifest['cpu']})>"

    def __call__(self, *arrays: Any, threads: int | None = None, out: Any = None, **scalars: Any) -> Any:
        """Check the call (shapes, dtypes, `where` clauses, ``out=``) before anything runs, then run it."""
        fn = self.function
        if threads is not None:
            threads = check_threads(self.name, threads)
        args, dims, any_torch = prepare_args(fn, arrays, scalars)
        for k, v in args.items():
            if not v.is_contiguous():
                refuse_huge_broadcast(self.name, k, v)
                args[k] = v.contiguous()
        if out is not None:
            given = check_out(fn, out, dims, args)
            outs = [given[r].pop(0) for r in fn.results]
        else:
            outs = [torch.empty(tuple(evaluate(d, dims) for d in t.shape), dtype=TORCH_DTYPES[t.dtype])
                    for t in fn.result_types]
        self.run_tensors([args[p.name] for p in fn.params], outs, threads or torch.get_num_threads())
        if out is not None:
            users = tuple(out) if isinstance(out, tuple | list) else (out,)
            return users[0] if len(users) == 1 else users
        results = [o.numpy() if not any_torch and o.dtype != torch.bfloat16 else o for o in outs]
        return results[0] if len(results) == 1 else tuple(results)

    def run_tensors(self, args: list[torch.Tensor], outs: list[torch.Tensor], threads: int) -> None:
        """Call the C entry on contiguous CPU tensors (one per parameter, one per result); a GuardError
        from the library's own guards is raised as the Python guards raise it."""
        keep: list[Any] = []
        c_args = (_Tensor * max(1, len(args)))(*(_tensor(t, keep) for t in args))
        c_outs = (_Tensor * max(1, len(outs)))(*(_tensor(t, keep) for t in outs))
        err = _Error()
        rc = self._entry(c_args, len(args), c_outs, len(outs), threads, ctypes.byref(err))
        if rc:
            rule = err.rule.decode()
            message = err.message.decode(errors="replace").removeprefix(f"kernel `{self.name}`: ")
            if rule == "index":
                self._explain(args)
            raise GuardError(self.name, message, rule=rule, param=err.param.decode() or None)

    def _explain(self, args: list[torch.Tensor]) -> None:
        """A subscript or division failed as it ran: the reference interpreter, where it is installed, says
        exactly which (a bundle runs without it otherwise, with the library's message)."""
        try:
            from arke.runtime.interp import run_function
        except ImportError:
            return
        fn = self.function
        run_function(fn, self.bundle.functions, {p.name: a for p, a in zip(fn.params, args)})


def _tensor(t: torch.Tensor, keep: list[Any]) -> _Tensor:
    shape = (ctypes.c_int64 * max(1, t.dim()))(*t.shape)
    keep.append(shape)
    return _Tensor(t.data_ptr(), _BY_TORCH.get(t.dtype, -1), t.dim(), shape, None)
