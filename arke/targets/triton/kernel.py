"""The Triton runtime: write a rendered module into the on-disk cache, import it, launch its kernels.

Triton's JIT reads a kernel's source from its file, so the module text goes to
``<cache>/triton/<hash>.py`` (written atomically) and is imported from there. A call is checked
exactly as on the CPU (:func:`~arke.runtime.guards.prepare_args`) before anything launches;
tensors go to the device (CUDA, or the CPU under ``TRITON_INTERPRET=1``, Triton's interpreter),
each dispatch launches over its grid, and a raised error word makes the reference interpreter
report the exact problem. On a GPU the launches are fitted for its architecture first
(:mod:`arke.targets.triton.fit`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from arke.ir import semantic as ir
from arke.ir.shapes import evaluate, parse_dim
from arke.ir.shapes import value as dim_value
from arke.plan.dispatch import KernelPlan
from arke.runtime.device import DeviceKernel
from arke.targets.artifact import Artifact

# Triton 3.9 warns on every import unless this is set; "1" keeps its current behaviour (fused
# multiply-adds), and a user's own setting wins.
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


def interpreting() -> bool:
    """Whether Triton runs in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def runnable() -> bool:
    """Whether Triton kernels can run here: triton installed, and a CUDA device or the interpreter."""
    if not triton_available():
        return False
    return interpreting() or torch.cuda.is_available()


def device() -> torch.device:
    return torch.device("cpu") if interpreting() or not torch.cuda.is_available() else torch.device("cuda")


def missing() -> str | None:
    """Why Triton kernels cannot run here and what to do (None: they can)."""
    if not triton_available():
        return "the triton target needs the triton package: pip install triton"
    if not runnable():
        return ("the triton target needs an NVIDIA GPU (CUDA), or TRITON_INTERPRET=1 to run "
                "its kernels in Triton's interpreter on the CPU")
    return None


def _require_triton() -> None:
    why = missing()
    if why is not None:
        raise RuntimeError(why)


def _directory() -> Path:
    from arke.runtime.cache import default_cache

    path = Path(default_cache().directory) / "triton"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _held(path: Path) -> bytes | None:
    """What the cached module file at ``path`` holds; None when it is missing, unreadable or no regular
    file (a FIFO there must not hang the build: it is replaced)."""
    from arke.runtime.cache import read_regular

    try:
        return read_regular(path)[0]
    except (OSError, ValueError):
        return None


def _write(path: Path, source: str) -> None:
    """``source`` into ``path``, atomically."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(source)
    os.replace(tmp, path)


def load_source(source: str) -> ModuleType:
    """Import a rendered Triton module (written under a hashed name, atomically, into the cache)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:32]
    name = f"arke_triton_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    path = _directory() / f"{name}.py"
    if _held(path) != source.encode():
        _write(path, source)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import the generated module {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class TritonKernel(DeviceKernel):
    """A kernel built for Triton: call it with torch tensors (or NumPy arrays) and scalars."""

    target = "triton"

    def __init__(self, plan: KernelPlan, artifact: Artifact, module: ir.Module, threads: int = 1):
        super().__init__(plan, artifact, module, threads)
        self._code = load_source(artifact.source)
        self._launches = [(getattr(self._code, spec.entry), spec, [parse_dim(g) for g in spec.grid],
                           parse_dim(spec.scratch) if spec.scratch else None,
                           [(name, parse_dim(e)) for name, e in spec.covers]) for spec in artifact.launches]

    def device(self) -> torch.device:
        return device()

    def launch_all(self, buffers: list[torch.Tensor], dims: dict[str, Any], dev: torch.device,
                   traced: bool = False) -> list[torch.Tensor]:
        values = [dims[d] for d in self.plan.dims]
        words: list[torch.Tensor] = []
        for kernel, spec, grid, scratch, covers in self._launches:
            # traced: sizes stay symbolic (a SymInt grid), so the graph serves every length
            size = tuple(dim_value(g, dims) if traced else evaluate(g, dims) for g in grid)
            if 0 in size:
                continue
            call: list[Any] = [buffers[i] for i in spec.buffers]
            if scratch is not None:
                # word 0 is the dispatch's error word, the rest its scratch (split-KV partials)
                words_at = torch.sym_max(1, dim_value(scratch, dims)) if traced else max(1, evaluate(scratch, dims))
                ws = torch.zeros(words_at, dtype=torch.int64, device=dev)
                call.append(ws)
                words.append(ws[:1])
            options = dict(spec.options)
            for name, extent in covers:  # a block size is a constexpr: a symbolic extent is specialised here
                options[name] = max(16, 1 << max(0, int(evaluate(extent, dims)) - 1).bit_length())
            if traced:
                # Inductor sees the kernel itself (its launch is a node of the graph), not an opaque call
                from torch.library import wrap_triton

                wrap_triton(jit_function(kernel, self.artifact.source))[size](*call, *values, **options)
            else:
                kernel[size](*call, *values, **options)
        return words


def jit_function(kernel: Any, source: str) -> Any:
    """``kernel`` (an entry of the module rendered as ``source``) as a ``triton.JITFunction``. Under the
    interpreter (``TRITON_INTERPRET=1``) ``triton.jit`` makes ``InterpretedFunction``s, which ``wrap_triton``
    cannot trace: the module is imported once more with the interpreter off (nothing compiles until a
    launch on a GPU), and its entry of the same name is the traceable kernel."""
    from triton.runtime.jit import JITFunction

    if isinstance(kernel, JITFunction):
        return kernel
    with _JIT_LOCK:
        digest = hashlib.sha256(source.encode()).hexdigest()[:32]
        name = f"arke_triton_{digest}_jit"
        module = sys.modules.get(name)
        if module is None:
            path = _directory() / f"arke_triton_{digest}.py"
            if _held(path) != source.encode():  # the cache directory may have changed since the first import
                _write(path, source)
            before = os.environ.get("TRITON_INTERPRET")
            os.environ["TRITON_INTERPRET"] = "0"
            try:
                spec = importlib.util.spec_from_file_location(name, path)
                assert spec is not None and spec.loader is not None
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            finally:
                if before is None:
                    os.environ.pop("TRITON_INTERPRET", None)
                else:
                    os.environ["TRITON_INTERPRET"] = before
            sys.modules[name] = module
    return getattr(module, kernel.fn.__name__)


_JIT_LOCK = threading.Lock()


def device_arch() -> str | None:
    """The CUDA device's architecture (``sm_90``, ``sm_80``) when kernels run on one the fit step knows;
    None under the interpreter, without a GPU, or on another architecture."""
    if interpreting() or not torch.cuda.is_available():
        return None
    from arke.targets.nvidia.cubin import ARCHS

    major, minor = torch.cuda.get_device_capability()
    name = f"sm_{major}{minor}"
    return name if name in ARCHS else None


def build_kernel(module: ir.Module, ir_name: str, strategy: Any, threads: int = 1) -> TritonKernel:
    """Plan, render and load a kernel for Triton (same surface as the CPU runtime's ``build_kernel``);
    on a GPU of a known architecture its launches are fitted first (:mod:`arke.targets.triton.fit`:
    none spills where the strategy leaves a configuration that does not, else ``SpillWarning``)."""
    _require_triton()
    from arke.targets.triton import TARGET
    from arke.targets.triton.render import RENDERER

    plan = TARGET.plan(module, ir_name, strategy)
    arch = device_arch()
    if arch is None:
        return TritonKernel(plan, RENDERER.render(plan), module, threads)
    from arke.targets.triton.fit import fit_plan

    fitted = fit_plan(plan, [arch], RENDERER, check=False, warn=True)
    return TritonKernel(fitted.plan, fitted.artifact, module, threads)
