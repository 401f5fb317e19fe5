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
import json
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arke.ir.scalars import decode_scalar
from arke.runtime.bundle_files import BundleError as BundleError  # what load_bundle raises, for its callers
from arke.runtime.bundle_files import bundle_error as _fail
from arke.runtime.bundle_files import read_manifest
from arke.runtime.errors import GuardError
from arke.runtime.limits import (
    check_tensor_kind,
    check_threads,
    count_writes,
    numpy_in,
    numpy_out,
    refuse_huge_broadcast,
    resolved,
)
from arke.runtime.panels import _PANELS, VNNI_KEY, panels_of
from arke.runtime.pool import BufferPool, evict_oldest

#: The ABI's dtype codes (arke_bundle.h) by dtype name, and the torch dtype of each (``TORCH_BY_NAME``).
#: Slots past a result's rank in the buffer its shape is written to, and what they hold until written.
SHAPE_SLACK, _UNSET = 16, -(2**63)
_CODES = {"bool": 0, "i8": 1, "i32": 2, "i64": 3, "u8": 4, "u16": 5, "u32": 6, "f16": 7, "bf16": 8, "f32": 9}
_TORCH = {"bool": torch.bool, "i8": torch.int8, "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8,
          "u16": torch.uint16, "u32": torch.uint32, "f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
_BY_TORCH = {_TORCH[d]: c for d, c in _CODES.items()}
TORCH_BY_NAME = _TORCH
_NUMPY = {"bool": "np.bool_", "i8": "np.int8", "i32": "np.int32", "i64": "np.int64", "u8": "np.uint8",
          "u16": "np.uint16", "u32": "np.uint32", "f16": "np.float16", "f32": "np.float32"}
_INT_RANGE = {"i8": (-2**7, 2**7 - 1), "i32": (-2**31, 2**31 - 1), "i64": (-2**63, 2**63 - 1), "u8": (0, 2**8 - 1),
              "u16": (0, 2**16 - 1), "u32": (0, 2**32 - 1)}


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("layout", ctypes.c_int32), ("reserved", ctypes.c_int32)]


class _Error(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int32), ("rule", ctypes.c_char * 16), ("param", ctypes.c_char * 64),
                ("message", ctypes.c_char * 1024)]


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
        from arke.runtime.bundle_generic import generics_of

        self.generics = generics_of(self.kernels)  # `lib.scaled` runs `scaled__W_f32` or `scaled__W_f16`

    def __getattr__(self, name: str) -> Any:
        kernels, generics = self.__dict__.get("kernels", {}), self.__dict__.get("generics", {})
        if name in kernels:
            return kernels[name]
        if name in generics:
            return generics[name]
        raise AttributeError(f"no kernel `{name}` in this bundle; it has: {', '.join([*kernels, *generics])}")

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *self.kernels, *self.generics]

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
        # read once: a ±inf or NaN default is a string in the (plain JSON) manifest
        self._defaults = [decode_scalar(p["default"]) if isinstance(p["default"], str) else p["default"]
                          for p in self.params]
        self._dim_slots = frozenset(k for k, p in enumerate(self.params) if p["dim"])  # their values set shapes
        self._results = [(len(r["shape"]), _TORCH[r["dtype"]], r["dtype"]) for r in record["results"]]
        self._entry = _argtypes(getattr(bundle._lib, record["symbol"]))
        self._result_shape = _shape_fn(getattr(bundle._lib, record["symbol"] + "_result_shape"))
        self._shapes: dict[tuple[Any, ...], list[tuple[int, ...]]] = {}  # argument shapes -> result shapes
        self._pool = BufferPool(self.name)

    def __repr__(self) -> str:
        return f"<arke bundled kernel {self.name} ({self.bundle.manifest['cpu']})>"

    def __call__(self, *arrays: Any, threads: int | None = None, out: Any = None, **scalars: Any) -> Any:
        """Check the call (arguments, dtypes, then the library's shape, dim and `where` guards, ``out=``)
        before anything runs, then run it: results are NumPy arrays for NumPy inputs, else tensors."""
        if threads is not None:
            threads = check_threads(self.name, threads)
        args, any_torch = self._bind(arrays, scalars)
        # a dim parameter's value sets result shapes as the tensors' shapes do
        key = tuple((tuple(a.shape), a.dtype, int(a) if k in self._dim_slots else None) for k, a in enumerate(args))
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
            count_writes(outs)
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
        for p, default in zip(self.params, self._defaults):
            value = given.get(p["name"], default)
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
        if isinstance(value, torch.Tensor):
            check_tensor_kind(self.name, f"parameter `{name}`", name, value)  # (a meta one has no value to read)
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
        shown = (f"an integer of {value.bit_length()} bits" if isinstance(value, int) and value.bit_length() > 64
                 else f"{value!r} ({type(value).__name__})")  # (repr of a huge int fails past 4300 digits)
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
            value = numpy_in(self.name, name, value)
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
            # room past the manifest's rank, marked: the manifest is the one file no checksum covers, and a
            # rank edited lower must not let the library write past the buffer unnoticed
            shape = (ctypes.c_int64 * (rank + SHAPE_SLACK))(*([0] * rank + [_UNSET] * SHAPE_SLACK))
            err = _Error()
            if self._result_shape(c_args, len(args), r, shape, ctypes.byref(err)):
                self._raise(err)
            if any(shape[k] != _UNSET for k in range(rank, rank + SHAPE_SLACK)):
                raise BundleError(f"bundle {self.bundle.path}: its manifest gives result {r} of `{self.name}` "
                                  f"rank {rank}, and its library more; the manifest was changed: rebuild the bundle")
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
                o = numpy_out(self.name, what, o, self._results[min(k, len(self._results) - 1)][2])
            if not isinstance(o, torch.Tensor):
                raise GuardError(self.name, f"{what} must be a tensor or NumPy array, not {type(o).__name__}",
                                 rule="type", param="out")
            check_tensor_kind(self.name, what, "out", o)
            rank, want, name = self._results[k]
            if o.dtype != want:  # said here by name (the library knows its own dtypes only)
                raise GuardError(self.name, f"{what} is {str(o.dtype).removeprefix('torch.')}, but the result is "
                                 f"{name}", rule="dtype", param="out")
            if o.dim() != rank:
                raise GuardError(self.name, f"{what} has {o.dim()} axes {list(o.shape)}, but the result has {rank}",
                                 rule="dim", param="out")
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
        try:
            functions = self.bundle.functions
            fn = functions.get(self.record["function"])
        except (KeyError, TypeError, ValueError):  # a manifest without its SemanticIR: the library's message
            return
        try:
            run_function(fn, functions, {p.name: a for p, a in zip(fn.params, args)})
        except GuardError:
            raise  # the interpreter's explanation: which subscript, which value, which axis
        except Exception:  # it could not tell (prepacked panels, say): the library's message
            return


_NP_TO_ARKE = {"bool": "bool", "int8": "i8", "int32": "i32", "int64": "i64", "uint8": "u8", "uint16": "u16",
               "uint32": "u32", "float16": "f16", "float32": "f32"}


def _tensor(t: torch.Tensor, keep: list[Any]) -> _Tensor:
    shape = (ctypes.c_int64 * max(1, t.dim()))(*t.shape)
    keep.append(shape)
    key = panels_of(t) if _PANELS else None  # prepacked weights: the kernels read their panels
    layout = 0 if key is None else -1 if key == VNNI_KEY else int(key)
    return _Tensor(t.data_ptr(), _BY_TORCH.get(t.dtype, -1), t.dim(), shape, None, layout, 0)
