"""The CUDA runtime: GPU code of the ``cuda`` target, or of the ``llvm`` target built for an ``arch``,
loaded through the CUDA driver and launched with torch CUDA tensors.

``target="cuda"``: each kernel's CUDA C (:mod:`arke.targets.cuda.render`) is compiled by NVRTC
(:mod:`arke.targets.cuda.nvrtc`); ``target="llvm", arch="sm_90"``: its NVPTX LLVM IR
(:mod:`arke.targets.llvm.nvptx`) is lowered to PTX by llvmlite. When the build's architecture
is the device's own and ``ptxas`` is at hand the PTX is assembled to a cubin, otherwise the
driver JIT-compiles the PTX (an sm_80 build runs on an sm_90 GPU). Both are cached on disk.

The module is loaded with ``cuModuleLoadData`` (``cuda-python``'s ``cuda.bindings.driver``, the
``cuda`` extra) into torch's primary context; each dispatch launches with
``cuLaunchKernel`` on torch's current stream, so results are ordered with the caller's own
torch work, and its arguments are the buffers' device pointers, the call's dims (one small
device array per distinct set of dims) and a zeroed error/scratch array (word 0 the error
word). Calls are checked before anything launches, tensors stay on their device, and the
error words are read once per call (:class:`~arke.runtime.device.DeviceKernel`).
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any

import torch

from arke.ir import semantic as ir
from arke.ir.shapes import evaluate, parse_dim
from arke.plan.dispatch import KernelPlan
from arke.runtime.device import DeviceKernel
from arke.targets.artifact import Artifact

#: What to install for launching (NVRTC and the driver bindings come with the same extra).
MISSING = "launching on a GPU needs cuda-python's driver bindings: pip install 'arke[cuda]'"
#: Shared memory a block may use without opting in (``cudaFuncAttributeMaxDynamicSharedMemorySize``).
DEFAULT_SHARED = 48 * 1024
_LOCK = threading.Lock()


class CudaError(RuntimeError):
    """The CUDA driver refused something (loading a module, a launch): its error name and message."""


class CudaUnavailableError(ValueError):
    """The ``cuda`` target (or ``llvm`` with an ``arch``) cannot run here: no GPU, or no driver bindings."""


def driver() -> Any:
    """``cuda.bindings.driver``, or :class:`CudaUnavailableError` naming the extra to install."""
    try:
        from cuda.bindings import driver as found
    except ImportError:
        raise CudaUnavailableError(MISSING) from None
    return found


def bindings_available() -> bool:
    try:
        driver()
    except CudaUnavailableError:
        return False
    return True


def runnable() -> bool:
    """Whether GPU code can launch here: a CUDA device torch can see, and the driver bindings."""
    return torch.cuda.is_available() and bindings_available()


def gpu_missing(target: str) -> str | None:
    """Why ``target``'s kernels cannot launch here and what to do (None: a GPU and the bindings are there)."""
    if not torch.cuda.is_available():
        return (f"the {target} target runs its kernels on an NVIDIA GPU, and torch sees none here "
                "(torch.cuda.is_available() is False). Build without running: akc build FILE --target "
                f"{target} --arch sm_90 --emit cubin")
    try:
        driver()
    except CudaUnavailableError as err:
        return str(err)
    return None


def require_gpu(target: str) -> None:
    """Raise :class:`CudaUnavailableError` saying what to do when ``target`` cannot launch here."""
    why = gpu_missing(target)
    if why is not None:
        raise CudaUnavailableError(why)


def _check(result: Any, what: str) -> Any:
    """The value of a driver call's ``(status, value...)`` tuple; a failed status is a :class:`CudaError`."""
    d = driver()
    status, *values = result if isinstance(result, tuple) else (result,)
    if status != d.CUresult.CUDA_SUCCESS:
        name, text = (_text(d.cuGetErrorName(status)[1]), _text(d.cuGetErrorString(status)[1]))
        raise CudaError(f"{what} failed: {name} ({text})")
    return values[0] if len(values) == 1 else tuple(values)


def _text(b: Any) -> str:
    return b.decode() if isinstance(b, bytes) else str(b)


def device_arch(dev: torch.device) -> str:
    """The device's architecture, ``"sm_90"``."""
    major, minor = torch.cuda.get_device_capability(dev)
    return f"sm_{major}{minor}"


def build_arch(dev: torch.device) -> str:
    """The architecture to build for on ``dev``: the device's own when arke builds for it (sm_80,
    sm_90), else the newest older one whose PTX the driver can JIT for it."""
    major, minor = torch.cuda.get_device_capability(dev)
    return "sm_90" if (major, minor) >= (9, 0) else "sm_80"


def image(ptx: str, arch: str, dev: torch.device) -> bytes:
    """What the driver loads: a cubin when ``arch`` is the device's own and ptxas is here, else the PTX
    (NUL-terminated) for the driver to JIT."""
    from arke.targets.nvidia import ptx as nvptx

    if arch == device_arch(dev) and nvptx.ptxas_path() is not None:
        return nvptx.assemble(ptx, arch)[0]
    return ptx.encode() + b"\0"


class LoadedModule:
    """A module loaded into the current context, with its entry functions."""

    def __init__(self, data: bytes, entries: list[str], shared: dict[str, int], dev: torch.device):
        d = driver()
        torch.cuda.init()
        with torch.cuda.device(dev):
            torch.empty(1, device=dev)  # makes torch's primary context current on this thread
            _check(d.cuInit(0), "cuInit")
            self.handle = _check(d.cuModuleLoadData(data), "loading the module (cuModuleLoadData)")
            self.functions = {}
            for name in entries:
                fn = _check(d.cuModuleGetFunction(self.handle, name.encode()), f"finding entry {name}")
                if shared.get(name, 0) > DEFAULT_SHARED:
                    attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                    _check(d.cuFuncSetAttribute(fn, attr, shared[name]),
                           f"{name}: asking for {shared[name]} bytes of shared memory")
                self.functions[name] = fn


class CudaKernel(DeviceKernel):
    """A kernel built for an NVIDIA GPU: call it with torch tensors (CUDA, or CPU: copied) and scalars."""

    def __init__(self, plan: KernelPlan, artifact: Artifact, module: ir.Module, ptx: str, arch: str,
                 target: str, threads: int = 1):
        super().__init__(plan, artifact, module, threads)
        self.target, self.ptx, self.arch = target, ptx, arch
        self._loaded: dict[int, LoadedModule] = {}
        self._dims: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}
        self._planned: dict[tuple[int, ...], list[Launch]] = {}  # dims -> launches (decode repeats its dims)
        self._launches = [(spec, [parse_dim(g) for g in spec.grid],
                           parse_dim(spec.scratch) if spec.scratch else None, dict(spec.options))
                          for spec in artifact.launches]

    def device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device())

    def loaded(self, dev: torch.device) -> LoadedModule:
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        with _LOCK:
            if index not in self._loaded:
                where = torch.device("cuda", index)
                shared = {spec.entry: options.get("shared", 0) for spec, _, _, options in self._launches}
                self._loaded[index] = LoadedModule(image(self.ptx, self.arch, where),
                                                   [spec.entry for spec in self.artifact.launches], shared, where)
            return self._loaded[index]

    def dims_on(self, dev: torch.device, dims: dict[str, int]) -> torch.Tensor:
        """The plan's dim values as a device array (made once per device and set of values)."""
        values = tuple(dims[d] for d in self.plan.dims) or (0,)
        key = (dev.index or 0, values)
        found = self._dims.get(key)
        if found is None:
            if len(self._dims) >= 64:
                self._dims.pop(next(iter(self._dims)))
            found = self._dims[key] = torch.tensor(values, dtype=torch.int64, device=dev)
        return found

    def launches_for(self, dims: dict[str, int]) -> list[Launch]:
        """What a call with these dims launches, in order (a dispatch whose grid is empty is left out);
        worked out once per set of dim values, not on every call."""
        key = tuple(dims[d] for d in self.plan.dims)
        found = self._planned.get(key)
        if found is None:
            if len(self._planned) >= 64:
                self._planned.pop(next(iter(self._planned)))
            found = self._planned[key] = self._plan_launches(dims)
        return found

    def _plan_launches(self, dims: dict[str, int]) -> list[Launch]:
        out = []
        for spec, grid, scratch, options in self._launches:
            size = [evaluate(g, dims) for g in grid]
            if 0 in size:
                continue
            size += [1] * (3 - len(size))
            words = max(1, evaluate(scratch, dims)) if scratch is not None else 1
            out.append(Launch(spec.entry, (size[0], size[1], size[2]), int(options.get("block", 128)),
                              int(options.get("shared", 0)), words, spec.buffers))
        return out

    def launch_all(self, buffers: list[torch.Tensor], dims: dict[str, Any], dev: torch.device,
                   traced: bool = False) -> list[torch.Tensor]:
        if traced:  # a cubin launch reads pointers: it cannot be traced (its operator stays opaque)
            raise NotImplementedError("cubin launches cannot be traced; the operator is opaque to torch.compile")
        d = driver()
        module = self.loaded(dev)
        dim_array = self.dims_on(dev, dims)
        stream = d.CUstream(torch.cuda.current_stream(dev).cuda_stream)
        words: list[torch.Tensor] = []
        for launch in self.launches_for(dims):
            ws = torch.zeros(launch.words, dtype=torch.int64, device=dev)  # word 0: the error word
            words.append(ws[:1])
            pointers = [buffers[i].data_ptr() for i in launch.buffers] + [dim_array.data_ptr(), ws.data_ptr()]
            params, _held = kernel_params(pointers)
            _check(d.cuLaunchKernel(module.functions[launch.entry], *launch.grid, launch.block, 1, 1, launch.shared,
                                    stream, ctypes.addressof(params), 0), f"launching {launch.entry}")
        return words


@dataclass(frozen=True)
class Launch:
    """One launch of a call: its entry, grid (x, y, z), threads per block, dynamic shared memory
    (bytes), error/scratch words and the plan buffers it takes."""

    entry: str
    grid: tuple[int, int, int]
    block: int
    shared: int
    words: int
    buffers: tuple[int, ...]


def kernel_params(pointers: list[int]) -> tuple[ctypes.Array[ctypes.c_void_p], list[ctypes.c_void_p]]:
    """``cuLaunchKernel``'s ``kernelParams``: an array of addresses, each of one argument's value (here
    every argument is a pointer). The second item keeps the values alive until the launch is queued."""
    held = [ctypes.c_void_p(p) for p in pointers]
    return (ctypes.c_void_p * len(held))(*[ctypes.addressof(h) for h in held]), held


def compile_plan(plan: KernelPlan, target: Any, arch: str) -> tuple[Artifact, str]:
    """The artifact and PTX of ``plan`` on ``target`` (a GPU-capable :class:`~arke.targets.base.Target`
    with ``to_ptx``) for ``arch``; no GPU needed."""
    artifact = target.render(plan, arch)
    return artifact, target.to_ptx(artifact, plan, arch)


def build_kernel(target: Any, module: ir.Module, ir_name: str, strategy: Any, threads: int = 1,
                 arch: str | None = None) -> CudaKernel:
    """Plan, render, compile and wrap a kernel of ``target`` for the GPU (same surface as the CPU runtime's)."""
    from arke.targets.nvidia.ptx import arch_name

    require_gpu(target.name)
    arch = arch_name(arch) if arch is not None else build_arch(torch.device("cuda", torch.cuda.current_device()))
    plan = target.plan(module, ir_name, strategy, arch)
    artifact, ptx = compile_plan(plan, target, arch)
    return CudaKernel(plan, artifact, module, ptx, arch, target.name, threads)


__all__ = ["CudaError", "CudaKernel", "CudaUnavailableError", "Launch", "LoadedModule", "bindings_available",
           "build_arch", "build_kernel", "compile_plan", "device_arch", "image", "kernel_params", "require_gpu",
           "runnable"]
