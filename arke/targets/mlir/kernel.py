"""The mlir target's runtime: compile a rendered MLIR module with IREE, load it, call it.

The renderer (``arke.targets.mlir.render``) writes one ``func.func`` on tensors per kernel: its
arguments are the kernel's parameters in order (scalars as 0-d tensors), its results the
kernel's results, plus a last ``tensor<i8>`` error flag when ``meta["errors"] == "1"``.
Storage types follow :data:`ABI_VIEWS`: f16 and bf16 travel as their int16 bits, bool as
int8 (0/1), and u8/u16/u32 as the signed integers of their width (MLIR's integers are signless;
the bits are the same).

:func:`compile_vmfb` turns the module into a ``.vmfb`` with ``iree.compiler.compile_str``
(IREE's ``iree-compile`` in a child process, as long as an in-process compile takes: a
compiler crash then costs a build, never the caller's process), through the on-disk cache.
:class:`IREEKernel` loads it with ``iree.runtime`` and runs it: on the CPU (``local-task``),
torch tensors go in and come out through DLPack without a copy; on CUDA, through host
copies. Every call is checked first (:func:`~arke.runtime.guards.prepare_args`), and a raised
error flag makes the reference interpreter say exactly what was wrong.

IREE is optional (``pip install 'arke[mlir]'``); without it every entry point raises
:class:`IREEMissingError`, never an ImportError.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import threading
from typing import Any

import torch
from torch.utils.dlpack import from_dlpack, to_dlpack

from arke import knobs
from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.plan.dispatch import KernelPlan
from arke.runtime.guards import TORCH_DTYPES, GuardError, prepare_args
from arke.runtime.limits import check_threads, refuse_huge_broadcast
from arke.targets.artifact import Artifact, UnsupportedError

MISSING = ("the mlir target needs IREE: pip install 'arke[mlir]' "
           "(iree-base-compiler and iree-base-runtime 3.13)")
#: Where a kernel can run: the host CPU (IREE's ``local-task`` driver) or an NVIDIA GPU.
DEVICES = ("cpu", "cuda")
#: The CUDA architectures IREE 3.13 compiles for. It has no sm_90 target (IREE issue 22147);
#: sm_80 code runs on newer GPUs, since the vmfb embeds PTX that the driver JIT-compiles.
CUDA_ARCHS = ("sm_80", "sm_86", "sm_87", "sm_89")
DEFAULT_CUDA_ARCH = "sm_80"
#: The torch dtype whose bits carry a DType across the ABI, where it differs from the DType's own.
ABI_VIEWS: dict[DType, torch.dtype] = {DType.F16: torch.int16, DType.BF16: torch.int16, DType.BOOL: torch.int8,
                                       DType.U8: torch.int8, DType.U16: torch.int16, DType.U32: torch.int32}
#: IREE imports host memory only at this alignment; other tensors are copied first.
_ALIGN = 64
_DLPACK_CPU = 1  # DLPack's device type code of host memory (kDLCPU)


class IREEError(ValueError):
    """The mlir target cannot build or run here: an architecture IREE lacks, no GPU, a compile failure."""


class IREEMissingError(IREEError):
    """``iree.compiler`` or ``iree.runtime`` is not installed (``pip install 'arke[mlir]'``)."""


# ---------------------------------------------------------------- the toolchain


def _has(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a missing parent package, or a half-imported one
        return False


def iree_available() -> bool:
    """Whether IREE's compiler and runtime packages are installed."""
    return _has("iree.compiler") and _has("iree.runtime")


def require_iree() -> None:
    """Raise :class:`IREEMissingError` (naming the ``mlir`` extra) unless IREE is installed."""
    if not iree_available():
        raise IREEMissingError(MISSING)


def missing(device: str = "cpu") -> str | None:
    """Why kernels cannot run on ``device`` through IREE here and what to do (None: they can)."""
    if not iree_available():
        return MISSING
    if device == "cpu":
        return None
    try:
        runtime_config(device)
    except IREEError as err:
        return str(err)
    return None


@functools.cache
def iree_version() -> str:
    """The IREE compiler's version and revision: part of every cache key."""
    from iree.compiler import version

    revisions = ",".join(f"{k}={v}" for k, v in sorted(getattr(version, "REVISIONS", {}).items()))
    return f"{version.VERSION} {revisions}".strip()


def cuda_arch(arch: str | None) -> str:
    """``arch`` checked against :data:`CUDA_ARCHS` (None: :data:`DEFAULT_CUDA_ARCH`).

    Checked before IREE sees it: IREE fails on sm_90 and crashes on a name it does not know.
    """
    chosen = DEFAULT_CUDA_ARCH if arch is None else arch
    if chosen not in CUDA_ARCHS:
        raise IREEError(f"IREE's CUDA target compiles for {', '.join(CUDA_ARCHS)}, not {chosen} "
                        f"(IREE 3.13 has no sm_90 target: IREE issue 22147); build for {DEFAULT_CUDA_ARCH}: "
                        f"the vmfb embeds PTX, which the CUDA driver JIT-compiles for newer GPUs (sm_90)")
    return chosen


def _check_device(device: str) -> None:
    if device not in DEVICES:
        raise IREEError(f"the mlir target runs on {' or '.join(DEVICES)}, not {device!r}")


def _diagnostics(err: Exception) -> str:
    """IREE's diagnostics out of a CompilerToolError (without the command line it adds)."""
    text = str(err)
    start = text.find("Diagnostics:\n")
    if start >= 0:
        text = text[start + len("Diagnostics:\n"):]
    end = text.find("\n\nInvoked with:")
    return (text[:end] if end >= 0 else text).strip()


def _compile(source: str, device: str, arch: str | None) -> bytes:
    from iree.compiler import CompilerToolError, compile_str

    # The renderer computes a few things in f64 on purpose (pow, sin/cos argument reduction);
    # IREE would otherwise demote them to f32 and lose exactly the precision they are there for.
    common = ["--iree-input-demote-f64-to-f32=false"]
    if device == "cpu":
        # Not --iree-opt-data-tiling: it takes a 1024³ f32 matmul from 49 to 170 GFLOP/s here, but
        # IREE 3.13 then gives wrong attention results (7 conformance cases) and 5x slower M = 1
        # products; ARKE_IREE_FLAGS adds it (or any flag) for experiments.
        backends, flags = ["llvm-cpu"], ["--iree-llvmcpu-target-cpu=host", *common]
    else:
        backends, flags = [], ["--iree-hal-target-device=cuda", f"--iree-cuda-target={arch}", *common]
    flags += list(knobs.iree_flags())
    try:
        data = compile_str(source, target_backends=backends, extra_args=flags, output_mlir_debuginfo=False)
    except CompilerToolError as err:
        found = _diagnostics(err)
        if "missing GPU target" in found:
            cuda_arch("an architecture IREE rejected")  # raises the explanation
        raise IREEError("IREE could not compile the MLIR that arke generated; this is a bug in arke's mlir "
                        f"renderer, please report it with the kernel. IREE said:\n{found}") from None
    if not isinstance(data, bytes | bytearray | memoryview):
        raise IREEError(f"iree.compiler.compile_str returned {type(data).__name__}, not the vmfb's bytes")
    return bytes(data)


def vmfb_key(source: str, device: str = "cpu", arch: str | None = None) -> str:
    """The cache key of the IREE module of MLIR ``source`` for ``device`` (and a CUDA ``arch``)."""
    from arke.runtime.cache import cache_key
    from arke.runtime.host import host_description

    host = host_description() if device == "cpu" else ""
    return cache_key(kind="vmfb", target=f"mlir-{device}", arch=arch or "", source=source,
                     iree=iree_version(), host=host, flags=" ".join(knobs.iree_flags()))


def compile_vmfb(source: str, device: str = "cpu", arch: str | None = None) -> bytes:
    """The ``.vmfb`` of an MLIR module for ``device``, built once and kept in the on-disk cache.

    ``cpu``: for this machine's CPU (its name and features are part of the key). ``cuda``: for
    ``arch`` (one of :data:`CUDA_ARCHS`, default sm_80); no GPU is needed to compile. Raises
    :class:`IREEMissingError` without IREE, :class:`IREEError` for an architecture IREE lacks
    or a module it cannot compile (with IREE's diagnostics).
    """
    require_iree()
    _check_device(device)
    if device == "cpu" and arch is not None:
        raise IREEError(f"arch {arch!r} is for device 'cuda'; a cpu build targets this machine's CPU")
    if device != "cpu":
        arch = cuda_arch(arch)
    from arke.runtime.cache import default_cache

    key = vmfb_key(source, device, arch)
    return default_cache().get_or_build(key, lambda: _compile(source, device, arch),
                                        meta={"target": "mlir", "device": device, "arch": arch or ""})


# ---------------------------------------------------------------- devices

_CONFIGS: dict[str, Any] = {}
_CONFIG_LOCK = threading.Lock()
_DRIVERS = {"cpu": "local-task", "cuda": "cuda"}


def runtime_config(device: str = "cpu") -> Any:
    """The process's ``iree.runtime.Config`` for ``device``, made on first use.

    Raises :class:`IREEError` when the device cannot be opened (``cuda`` on a machine without
    an NVIDIA GPU or its driver).
    """
    require_iree()
    _check_device(device)
    with _CONFIG_LOCK:
        found = _CONFIGS.get(device)
        if found is None:
            import iree.runtime as rt

            try:
                found = rt.Config(_DRIVERS[device])
            except (RuntimeError, ValueError) as err:
                if device == "cuda":
                    raise IREEError("device='cuda' needs an NVIDIA GPU, but IREE's cuda driver found none "
                                    f"(no CUDA GPU is present, or its driver is not installed): {err}") from None
                raise IREEError(f"IREE cannot open its {_DRIVERS[device]} device: {err}") from None
            _CONFIGS[device] = found
        return found


def cuda_runnable() -> bool:
    """Whether mlir kernels can run on a CUDA GPU here (IREE installed, its cuda driver finds a GPU)."""
    try:
        runtime_config("cuda")
    except IREEError:
        return False
    return True


# ---------------------------------------------------------------- kernels


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """The bytes a contiguous tensor occupies, as [start, end) addresses."""
    start = t.data_ptr()
    return start, start + t.numel() * t.element_size()


class IREEKernel:
    """A kernel compiled by IREE: call it with torch tensors (or NumPy arrays) and scalars.

    ``threads`` is accepted for the same surface as the other runtimes; IREE's task system
    runs every dispatch on its own worker pool (results do not depend on it).
    """

    def __init__(self, plan: KernelPlan, artifact: Artifact, vmfb: bytes, module: ir.Module, threads: int = 1,
                 device: str = "cpu"):
        import iree.runtime as rt

        self.plan, self.artifact, self.module, self.threads, self.device = plan, artifact, module, threads, device
        self.name = plan.name
        config = runtime_config(device)
        self._rt, self._device = rt, config.device
        self._vm_module = rt.VmModule.copy_buffer(config.vm_instance, vmfb)  # copied: IREE needs it aligned
        self.name = plan.name
        try:
            self._context = rt.SystemContext(vm_modules=[self._vm_module], config=config)
        except (IndexError, RuntimeError, ValueError) as err:
            raise self._refused(err) from None
        self._vm_context = self._context.vm_context
        entry = artifact.meta.get("entry") or artifact.launches[0].entry
        self._function = self._vm_module.lookup_function(entry)
        if self._function is None:
            raise IREEError(f"kernel `{self.name}`: the compiled module has no function `{entry}`")
        self._errors = artifact.meta.get("errors", "0") == "1"
        fn = plan.function
        self._params = [(p.name, ABI_VIEWS.get(p.type.dtype)) for p in fn.params]
        self._results = [(TORCH_DTYPES[t.dtype], ABI_VIEWS.get(t.dtype)) for t in fn.result_types]
        self._n_out = len(self._results) + self._errors
        self._storage = [view or dtype for dtype, view in self._results] + [torch.int8] * self._errors
        # an IREE context is not safe to invoke from two threads at once
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<arke kernel {self.name} on mlir ({self.device})>"

    def __call__(self, *arrays: Any, threads: int | None = None, out: Any = None, **scalars: Any) -> Any:
        args, dims, any_torch = prepare_args(self.plan.function, arrays, scalars, keep_device=self.device != "cpu")
        return self.run_prepared(args, dims, not any_torch, threads, out)

    def run_prepared(self, args: dict[str, torch.Tensor], dims: dict[str, int], as_numpy: bool,
                     threads: int | None = None, out: Any = None) -> Any:
        """Run on arguments checked by :func:`~arke.runtime.guards.prepare_args`.

        Results are torch tensors (NumPy arrays when ``as_numpy``, except bf16, which NumPy
        lacks); with ``out=`` (a tensor, or one per result) they are written there and ``out``
        is returned. On ``cuda`` the results go to the device of the tensor arguments.
        """
        fn = self.plan.function
        check_threads(self.name, threads)
        for name, v in args.items():
            refuse_huge_broadcast(self.name, name, v)  # IREE takes dense buffers: a view is copied
        home = next((v.device for v in args.values() if v.dim()), torch.device("cpu"))
        given = None
        if out is not None:
            from arke.runtime.outputs import check_out

            given = check_out(fn, out, dims, args, home if self.device != "cpu" else None)
        inputs = [args[name] for name, _ in self._params]
        outs = self._invoke_host(inputs) if self.device == "cpu" else self._invoke_device(inputs)
        if self._errors and outs.pop().item():
            self._explain(args)
        results: list[torch.Tensor] = []
        # IREE hands back an argument's own buffer for `return x`, and one buffer for a value
        # returned twice: a result must never alias an input or another result
        taken = [_extent(t) for t in inputs] if self.device == "cpu" else []
        for o, (dtype, view) in zip(outs, self._results):
            if view is not None:
                o = o.view(dtype)
            if self.device != "cpu":
                o = o.to(home)
            else:
                lo, hi = _extent(o)
                if lo < hi and any(a < hi and lo < b for a, b in taken):
                    o = o.clone()
                taken.append(_extent(o))
            results.append(o)
        if given is not None:
            used: dict[str, int] = {}
            for r, o in zip(fn.results, results):
                given[r][used.get(r, 0)].copy_(o)
                used[r] = used.get(r, 0) + 1
            users = tuple(out) if isinstance(out, tuple | list) else (out,)
            return users[0] if len(users) == 1 else users
        shown = [o.cpu().numpy() if as_numpy and o.dtype != torch.bfloat16 else o for o in results]
        return shown[0] if len(shown) == 1 else tuple(shown)

    def _abi(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The arguments in their ABI storage types (views, no copies)."""
        return [t.view(view) if view is not None else t for t, (_, view) in zip(inputs, self._params)]

    def _invoke(self, arg_list: Any) -> Any:
        rets = self._rt.VmVariantList(self._n_out)
        with self._lock:
            try:
                self._vm_context.invoke(self._function, arg_list, rets)
            except (IndexError, RuntimeError, ValueError) as err:
                raise self._refused(err) from None
        return rets

    def _refused(self, err: Exception) -> Exception:
        """IREE's error as the reason the kernel cannot run here, when it is one a user can act on."""
        limit = re.search(r"requiring (\d+) constants exceeds limit of (\d+)", str(err))
        if limit is None:
            return err
        # IREE's CPU runtime caps a dispatch's push constants; nothing about the call can change that
        return IREEError(f"kernel `{self.name}`: IREE's runtime cannot load it: one of its dispatches needs "
                         f"{limit[1]} push constants and the {self.device} runtime allows {limit[2]}; run this "
                         "kernel on the llvm target (or write it with fewer unrolled steps, such as a smaller "
                         "literal top-k)")

    def _invoke_host(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """CPU: arguments and results cross by DLPack, sharing memory with the torch tensors."""
        rt, dev = self._rt, self._device
        arg_list = rt.VmVariantList(len(inputs))
        for t in self._abi(inputs):
            if t.numel() == 0:  # an empty view may have any strides (NumPy's are 0), which IREE refuses
                t = torch.empty(t.shape, dtype=t.dtype)
            elif not t.is_contiguous() or t.data_ptr() % _ALIGN:
                t = t.clone(memory_format=torch.contiguous_format)  # a fresh allocation is aligned
            arg_list.push_ref(dev.from_dlpack_capsule(to_dlpack(t)).ref)
        rets = self._invoke(arg_list)
        view = rt.HalBufferView
        return [from_dlpack(dev.create_dlpack_capsule(rets.get_as_object(i, view), _DLPACK_CPU, 0))
                for i in range(self._n_out)]

    def _invoke_device(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """CUDA: arguments are copied to the GPU by IREE's allocator, results copied back to the host."""
        rt, dev = self._rt, self._device
        arg_list = rt.VmVariantList(len(inputs))
        for t in self._abi(inputs):
            host = t.detach().cpu().contiguous()
            bv = dev.allocator.allocate_buffer_copy(memory_type=rt.MemoryType.DEVICE_LOCAL,
                                                    allowed_usage=rt.BufferUsage.DEFAULT, device=dev,
                                                    buffer=host.numpy(),
                                                    element_type=getattr(rt.HalElementType, _HAL_TYPES[host.dtype]))
            arg_list.push_ref(bv.ref)
        rets = self._invoke(arg_list)
        outs = []
        for i, dtype in enumerate(self._storage):
            bv = rets.get_as_object(i, rt.HalBufferView)
            array = rt.DeviceArray(dev, bv, implicit_host_transfer=True,
                                   override_dtype=torch.empty((), dtype=dtype).numpy().dtype).to_host()
            outs.append(torch.from_numpy(array.copy()))  # a copy: the mapping dies with the buffer view
        return outs

    def _explain(self, args: dict[str, torch.Tensor]) -> None:
        """The error flag was raised: the reference interpreter says exactly what was wrong."""
        from arke.runtime.interp import run_function

        fn = self.plan.function
        run_function(fn, ir.Module((fn,)), {p.name: args[p.name].cpu() for p in fn.params})
        raise GuardError(fn.name, "an index or an integer division was out of range", rule="index")


#: torch storage dtype -> the name of IREE's HalElementType for it (the CUDA path's host copies).
_HAL_TYPES = {torch.float32: "FLOAT_32", torch.int8: "SINT_8", torch.int16: "SINT_16", torch.int32: "SINT_32",
              torch.int64: "SINT_64"}


def build_kernel(module: ir.Module, ir_name: str, strategy: Any, threads: int = 1, device: str = "cpu",
                 arch: str | None = None) -> IREEKernel:
    """Plan, render, compile (through the on-disk cache) and load a kernel for the mlir target.

    ``device``: ``"cpu"`` or ``"cuda"`` (compiled for ``arch``, default sm_80; running needs a GPU).
    """
    require_iree()
    _check_device(device)
    if device == "cuda":
        runtime_config("cuda")  # no GPU: say so before planning and compiling
    from arke.plan.dispatch import make_plan
    from arke.targets.mlir.render import RENDERER

    plan = make_plan(module, ir_name, strategy, RENDERER.families)
    why = cuda_unsupported(plan) if device == "cuda" else None
    if why is not None:
        raise UnsupportedError(why)
    artifact = RENDERER.render(plan)
    vmfb = compile_vmfb(artifact.source, device, arch if device == "cuda" else None)
    return IREEKernel(plan, artifact, vmfb, module, threads, device)


def cuda_unsupported(plan: KernelPlan) -> str | None:
    """Why IREE's CUDA pipeline cannot compile ``plan`` (None when it can): a reduction bounded by a
    length (spec/language.md §8.11) fails IREE's vector distribution; so does a 64-bit integer
    reduction whose terms are reduced positions (the ``min`` of positions an ``argmax`` becomes,
    spec/codegen.md §1) fails IREE's vector distribution ("failed to distribute"); the i32 form
    compiles, but a position may need 64 bits. The cpu device, and the cuda and triton targets,
    run such kernels."""
    for op in plan.function.ops:
        if isinstance(op, ir.ReduceOp) and (op.limits or _length_masked(op.body, {a.name for a in op.reduce_axes})):
            return (f"{plan.name}: the mlir target cannot compile this kernel for device='cuda': IREE's CUDA "
                    "pipeline does not distribute a reduction bounded by a length (paged attention's); build "
                    "it for device='cpu', or with the cuda or triton target")
        if not (isinstance(op, ir.ReduceOp) and op.dtype is DType.I64):
            continue
        if _position_valued(op.body, {a.name for a in op.reduce_axes}):
            return (f"{plan.name}: the mlir target cannot compile this kernel for device='cuda': IREE's CUDA "
                    "pipeline does not distribute a 64-bit reduction of positions (an argmax, argmin or top-k); "
                    "build it for device='cpu', or with the cuda or triton target")
    return None


def _length_masked(e: ir.SExpr, reduced: set[str]) -> bool:
    """Whether ``e`` compares a reduced position with a value read from an integer tensor (a length
    bound planned as a mask: ``j < lens[b]``)."""
    for x in ir.walk(e):
        if isinstance(x, ir.Binary) and x.op in ir.COMPARISONS:
            sides = [{y.name for y in ir.walk(side) if isinstance(y, ir.Idx)} for side in (x.a, x.b)]
            reads = [any(isinstance(y, ir.Load) and y.indices and not y.dtype.is_float for y in ir.walk(side))
                     for side in (x.a, x.b)]
            if (sides[0] & reduced and reads[1]) or (sides[1] & reduced and reads[0]):
                return True
    return False


def _position_valued(e: ir.SExpr, reduced: set[str]) -> bool:
    """Whether ``e``'s value is computed from a position along ``reduced`` (not only compared or
    used as a subscript, which IREE distributes: a rank ``sum(i64(x[j] > x[e]) for j)``)."""
    if isinstance(e, ir.Idx):
        return e.name in reduced
    if isinstance(e, ir.Load) or (isinstance(e, ir.Binary) and e.op in ir.COMPARISONS):
        return False
    if isinstance(e, ir.Select):
        return _position_valued(e.a, reduced) or _position_valued(e.b, reduced)
    return any(_position_valued(c, reduced) for c in ir.children(e))
