"""The llvm target's kernels on this CPU: plan, render and compile (through the cache) a kernel,
then run its dispatches on worker threads (:mod:`.jit` compiles and loads): the OpenMP runtime torch
loaded (:mod:`.omp`: one pool for torch and Arke), else Arke's native team (:mod:`.team`).

Each dispatch's parallel axis is cut into static, contiguous chunks, one per worker;
reductions never cross a chunk, so results are bit-identical for any thread count. JIT code
called through ctypes releases the GIL, so plain threads run on every core.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from arke import knobs
from arke.ir import semantic as ir
from arke.ir.shapes import evaluate, parse_dim
from arke.plan.dispatch import KernelPlan
from arke.runtime import panels
from arke.runtime.guards import TORCH_DTYPES, GuardError, prepare_args
from arke.runtime.host import worker_limit
from arke.runtime.limits import check_threads, refuse_huge_broadcast
from arke.runtime.outputs import can_fail, check_out
from arke.runtime.pool import BufferPool, evict_oldest
from arke.runtime.record import recording
from arke.targets.artifact import Artifact
from arke.targets.llvm.jit import Loaded, compile_object, host_renderer
from arke.targets.llvm.omp import launcher
from arke.targets.llvm.panels import _PANELS, _panels_of
from arke.targets.llvm.replay import KEEP, Program, Scratch
from arke.targets.llvm.team import MAX_BUFFERS, team

_EXECUTOR: ThreadPoolExecutor | None = None  # the launches' thread pool without the native team (one per process)
_EXECUTOR_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _EXECUTOR
    found = _EXECUTOR
    if found is None:
        with _EXECUTOR_LOCK:
            if _EXECUTOR is None:  # threads start as chunks are submitted, up to the worker limit
                _EXECUTOR = ThreadPoolExecutor(max_workers=worker_limit(), thread_name_prefix="arke")
            found = _EXECUTOR
    return found


def _forget_pool_in_child() -> None:
    """A forked child has none of the pool's threads: the inherited pool would queue its chunks for ever."""
    global _EXECUTOR, _EXECUTOR_LOCK
    _EXECUTOR, _EXECUTOR_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_in_child)


@dataclass
class _Launch:
    fn: Callable[..., None]
    address: int  # fn's entry point (the native team calls it through a trampoline)
    extent: Any  # a dim expression, or None
    buffers: tuple[int, ...]
    scratch: Any  # 8-byte elements of scratch per worker (a dim expression), or None


@dataclass
class _Sizes:
    shapes: list[tuple[int, ...]]  # per plan buffer
    launches: list[tuple[int, int]]  # per launch: parallel extent, scratch bytes per worker
    dim_array: Any  # the dims as the C array the entry points read (never written)
    programs: dict[tuple[Any, ...], Program | None] = field(default_factory=dict)  # replays (see .replay)


class CPUKernel:
    """A compiled kernel: call it with NumPy arrays or torch CPU tensors (and scalars)."""

    def __init__(self, plan: KernelPlan, artifact: Artifact, obj: bytes, module: ir.Module, threads: int):
        self.plan, self.artifact, self.module, self.threads = plan, artifact, module, threads
        self.name = plan.name
        if artifact.meta.get("units"):
            from arke.targets.llvm.isa import AMX, AMX_INT8, amx_permitted

            # a tile instruction would fault (SIGILL) without the permission
            if {AMX, AMX_INT8} & set(artifact.meta["units"].split(",")) and not amx_permitted():
                raise RuntimeError("this kernel was rendered for AMX tiles, but Linux refused this process the tile "
                                   "data permission (arch_prctl ARCH_REQ_XCOMP_PERM): rebuild it with "
                                   "LLVMRenderer(units=host_units()) for this machine")
        self._loaded = Loaded(obj)
        self._launches = [
            _Launch(self._loaded.function(spec.entry, len(spec.buffers)),
                    int(self._loaded.engine.get_function_address(spec.entry)),
                    parse_dim(spec.parallel_extent) if spec.parallel_extent else None, spec.buffers,
                    parse_dim(spec.scratch) if spec.scratch else None)
            for spec in artifact.launches
        ]
        self._sized: dict[tuple[int, ...], _Sizes] = {}
        self._pool = BufferPool(self.name)
        self._own, self._scratch = threading.Lock(), Scratch()  # the replays' scratch, one call at a time
        # contractions that can read B prepacked: launch -> (B's buffer, nr); dims word len(dims) + launch
        self._panel_at = {int(key.split(".")[1]): (int(value.split(",")[0]), value.split(",")[1])
                          for key, value in artifact.meta.items() if key.startswith("panels.")}
        self._roles = [(b.role, b.name, TORCH_DTYPES[b.dtype]) for b in plan.buffers]
        self._result_at = [plan.buffer_index(r) for r in plan.function.results]
        # a kernel whose subscripts or integer divisions are checked as it runs writes an out= only on success
        self._may_fail = can_fail(plan.function, module)

    @property
    def panel_reads(self) -> set[tuple[int, str]]:
        """The (buffer, layout) pairs of the prepacked panels this kernel's contractions can read."""
        return set(self._panel_at.values())

    def __repr__(self) -> str:
        return f"<arke kernel {self.name} on llvm, {len(self._launches)} dispatches>"

    def __call__(self, *arrays: Any, threads: int | None = None, out: Any = None, **scalars: Any) -> Any:
        args, dims, any_torch = prepare_args(self.plan.function, arrays, scalars)
        return self.run_prepared(args, dims, not any_torch, threads, out)

    def temp_buffers(self, dims: dict[str, int]) -> dict[int, tuple[tuple[int, ...], torch.dtype]]:
        """The shape and dtype of each temporary buffer (by plan buffer index) of a call with these dims."""
        shapes = self._sizes(dims).shapes
        return {i: (shapes[i], dtype) for i, (role, _, dtype) in enumerate(self._roles) if role == "temp"}

    def run_prepared(self, args: dict[str, torch.Tensor], dims: dict[str, int], as_numpy: bool,
                     threads: int | None = None, out: Any = None,
                     temps: dict[int, torch.Tensor] | None = None, planned: bool = False) -> Any:
        """Run on arguments already checked and converted by :func:`~arke.runtime.guards.prepare_args`.

        ``out``: a tensor (or a tuple, one per result) to write the results into; checked like
        the arguments, and it may not overlap them. The results are then ``out`` itself.
        ``temps``: tensors for temporary buffers (plan buffer index -> a contiguous tensor of the
        shape and dtype :meth:`temp_buffers` gives), for a caller that plans memory itself.
        ``planned``: ``out`` comes from such a caller's memory plan (a tensor per result, of its
        shape and dtype, contiguous, overlapping nothing it reads), so its checks are skipped.
        A user's ``out`` is written in place only by a kernel that cannot fail once it runs;
        otherwise the results are copied there after the last dispatch succeeded.
        """
        fn = self.plan.function
        if threads is not None:
            threads = check_threads(self.name, threads)
        for k, v in args.items():
            if not v.is_contiguous():
                refuse_huge_broadcast(self.name, k, v)
                args[k] = v.contiguous()  # views are copied; contiguous ones are not
                if (rec := recording()) is not None:  # a replay would read this call's copy
                    rec.fail(f"kernel `{self.name}`: argument `{k}` is a strided view (copied at each call)")
        if out is not None and planned:
            outs_ = tuple(out) if isinstance(out, tuple | list) else (out,)
            given = {r: [o] for r, o in zip(fn.results, outs_)}
        else:
            given = check_out(fn, out, dims, args) if out is not None else {}
        sizes = self._sizes(dims)
        buffers: list[torch.Tensor] = []
        lent = temps or {}
        in_place = planned or not self._may_fail
        pooled: list[int] = []  # result buffers taken from the pool, given back once copied into out=
        for i, ((role, name, dtype), shape) in enumerate(zip(self._roles, sizes.shapes)):
            if role == "param":
                buffers.append(args[name])
            elif name in given and fn.results.count(name) == 1 and in_place:
                buffers.append(given[name][0])  # written in place
            elif role == "temp" and i in lent:
                buffers.append(lent[i])
            else:
                buffers.append(self._pool.take(shape, dtype))
                if role != "temp":
                    pooled.append(i)
        try:
            # a library built without a thread count follows torch's (0 here): one pool, one size
            self._run(buffers, sizes, threads or self.threads or torch.get_num_threads())
        finally:
            for i, ((role, _, _), t) in enumerate(zip(self._roles, buffers)):
                if role == "temp" and i not in lent:
                    self._pool.give(t)
        outs: list[torch.Tensor] = []
        taken: dict[str, int] = {}
        for r, at in zip(fn.results, self._result_at):  # a result never aliases an input or another result
            t = buffers[at]
            if out is not None:
                target = given[r][taken.get(r, 0)]
                taken[r] = taken.get(r, 0) + 1
                if target is not t:
                    target.copy_(t)
                outs.append(target)
            else:
                outs.append(t.clone() if r in args or any(t is o for o in outs) else t)
        if out is not None:
            for i in pooled:
                self._pool.give(buffers[i])
            users = tuple(out) if isinstance(out, tuple | list) else (out,)
            return users[0] if len(users) == 1 else users
        for o in outs:  # reused only once the caller lets go of it
            self._pool.give(o)
        results = [o.numpy() if as_numpy and o.dtype != torch.bfloat16 else o for o in outs]
        return results[0] if len(results) == 1 else tuple(results)

    def _sizes(self, dims: dict[str, int]) -> _Sizes:
        """Buffer shapes, launch extents and scratch widths for these dims (memoised: decode repeats them)."""
        key = tuple(dims[d] for d in self.plan.dims)
        found = self._sized.get(key)
        if found is None:
            if len(self._sized) >= 64:
                evict_oldest(self._sized)
            found = _Sizes(
                [tuple(evaluate(d, dims) for d in b.shape) for b in self.plan.buffers],
                [(evaluate(launch.extent, dims) if launch.extent is not None else 1,
                  8 * evaluate(launch.scratch, dims) if launch.scratch is not None else 0)
                 for launch in self._launches],
                (ctypes.c_int64 * max(1, len(key) + len(self._launches)))(*key))
            self._sized[key] = found
        return found

    def _with_panels(self, buffers: list[torch.Tensor], dim_array: Any) -> Any:
        """The dims array, copied with the addresses of prepacked panels where a launch reads them."""
        found = {i: nr for i, (role, _, _) in enumerate(self._roles)
                 if role == "param" and (nr := _panels_of(buffers[i])) is not None}
        if not found:
            return dim_array
        words = (ctypes.c_int64 * len(dim_array))(*dim_array)
        base = len(self.plan.dims)
        for k, launch in enumerate(self._launches):
            reads = self._panel_at.get(k)
            for i in launch.buffers:
                if i not in found:
                    continue
                if reads is None or reads[0] != i or reads[1] != found[i]:
                    raise RuntimeError(f"kernel `{self.name}`: `{self._roles[i][1]}` holds prepacked panels "
                                       f"(layout {found[i]}), which dispatch {k} cannot read")
                words[base + k] = buffers[i].data_ptr()
        return words

    def _run(self, buffers: list[torch.Tensor], sizes: _Sizes, threads: int) -> None:
        # no more workers than the widest launch has chunks, nor than a few per core: the same results
        threads = max(1, min(threads, worker_limit(), max((n for n, _ in sizes.launches), default=1)))
        omp = crew = None
        if threads > 1 and not knobs.no_team():  # each knob read once: an environment lookup costs ~0.7 µs
            omp = None if knobs.no_omp() else launcher()
            crew = team(threads) if omp is None else None
        if (threads == 1 or omp is not None or crew is not None) and self._own.acquire(blocking=False):
            try:  # replay this call's launches, prepared once for these buffers (see .replay)
                key = (tuple([b.data_ptr() for b in buffers]), threads, id(omp or crew), panels.generation())
                program = sizes.programs.get(key)
                if program is None and key not in sizes.programs:
                    program = self._program(buffers, sizes, threads, omp, crew)
                    if len(sizes.programs) >= KEEP:
                        evict_oldest(sizes.programs)
                    sizes.programs[key] = program
                ran = program.run() if program is not None else None
            finally:
                self._own.release()
            if ran is not None and (rec := recording()) is not None:  # a decode step being recorded
                rec.program(program, self._own, buffers, lambda: self._explain(buffers))
            if ran:
                return
            if ran is False:
                self._explain(buffers)  # raises the precise error
        if (rec := recording()) is not None:
            rec.fail(f"kernel `{self.name}` ran its launches one by one (a concurrent call, or too many buffers)")
        self._launch_each(buffers, sizes, threads, omp, crew)

    def _program(self, buffers: list[torch.Tensor], sizes: _Sizes, threads: int, omp: Any,
                 crew: Any) -> Program | None:
        """This call's launches prepared for replay (None: a launch too wide for the launchers' trampolines)."""
        plan = [(launch, n, width, min(threads, n)) for launch, (n, width) in zip(self._launches, sizes.launches)]
        if any(chunks > 1 and len(launch.buffers) > MAX_BUFFERS for launch, _, _, chunks in plan):
            return None
        self._scratch.fit(max((max(1, chunks) * width for _, _, width, chunks in plan), default=0), threads)
        scratch, program = self._scratch, Program(self._scratch.errors)
        dim_array = self._with_panels(buffers, sizes.dim_array) if _PANELS else sizes.dim_array
        program.keep.append(dim_array)
        base, at = ctypes.addressof(scratch.errors), scratch.address
        for launch, n, width, chunks in plan:
            ptrs = [buffers[i].data_ptr() for i in launch.buffers]
            if chunks <= 1:
                program.single(launch.fn, [*ptrs, dim_array, 0, n, base, at if width else 0])
                continue
            parts = [(k * n // chunks, (k + 1) * n // chunks, base + 8 * k, at + k * width if width else 0)
                     for k in range(chunks)]
            fixed = [*ptrs, ctypes.addressof(dim_array)]
            if omp is not None:
                program.omp(omp, launch.address, fixed, parts, threads)
            else:
                program.crew(crew, launch.fn, launch.address, fixed, parts)
        return program

    def _launch_each(self, buffers: list[torch.Tensor], sizes: _Sizes, threads: int, omp: Any, crew: Any) -> None:
        """Every launch prepared as it runs (a concurrent call of this kernel, or a launch too wide to replay)."""
        errors = (ctypes.c_int64 * max(1, threads))()
        pool = _pool() if threads > 1 else None
        dim_array = self._with_panels(buffers, sizes.dim_array) if _PANELS else sizes.dim_array
        for launch, (n, width) in zip(self._launches, sizes.launches):
            ptrs = [buffers[i].data_ptr() for i in launch.buffers]
            chunks = min(threads, n) if pool is not None else 1
            scratch = self._pool.take((max(1, chunks) * width,), torch.uint8) if width else None
            at = scratch.data_ptr() if scratch is not None else 0
            if chunks <= 1:
                launch.fn(*ptrs, dim_array, 0, n, ctypes.addressof(errors), at)
            elif (omp is not None or crew is not None) and len(ptrs) <= MAX_BUFFERS:
                # the OpenMP team or Arke's: the same chunks, each with its error word and scratch
                base = ctypes.addressof(errors)
                parts = [(k * n // chunks, (k + 1) * n // chunks, base + 8 * k, at + k * width if at else 0)
                         for k in range(chunks)]
                fixed = [*ptrs, ctypes.addressof(dim_array)]
                if omp is not None:
                    omp.run(launch.address, fixed, parts, threads)
                elif crew is not None:
                    crew.run(launch.fn, launch.address, fixed, parts)
            else:
                bounds = [(k * n // chunks, (k + 1) * n // chunks) for k in range(chunks)]
                base = ctypes.addressof(errors)
                # the calling thread runs the first chunk itself (a ctypes call releases the GIL):
                # one thread hand-off fewer, and on a busy machine a worker's wake-up is the cost
                futures = [pool.submit(launch.fn, *ptrs, dim_array, lo, hi, base + 8 * k,  # type: ignore[union-attr]
                                       at + k * width if at else 0)
                           for k, (lo, hi) in enumerate(bounds) if k]
                launch.fn(*ptrs, dim_array, bounds[0][0], bounds[0][1], base, at)
                for f in futures:
                    f.result()
            if scratch is not None:
                self._pool.give(scratch)
            if any(errors):
                self._explain(buffers)

    def _explain(self, buffers: list[torch.Tensor]) -> None:
        """A dispatch raised its error word: the reference interpreter says exactly what was wrong."""
        from arke.runtime.interp import run_function

        fn = self.plan.function
        inputs = {p.name: buffers[self.plan.buffer_index(p.name)] for p in fn.params}
        run_function(fn, ir.Module((fn,)), inputs)  # raises the precise GuardError
        raise GuardError(fn.name, "an index or an integer division was out of range", rule="index")


def object_key(source: str) -> str:
    """The cache key of the object code of LLVM IR ``source`` for this CPU."""
    import llvmlite

    import arke
    from arke.runtime.cache import cache_key
    from arke.runtime.host import host_description

    return cache_key(kind="object", target="llvm", source=source, host=host_description(),
                     arke=arke.__version__, llvmlite=llvmlite.__version__)


def build_kernel(module: ir.Module, ir_name: str, strategy: Any, threads: int) -> CPUKernel:
    """Plan, render (for this machine's vectors), compile (through the on-disk cache) and load a kernel."""
    from arke.plan.dispatch import make_plan
    from arke.runtime.cache import default_cache

    renderer = host_renderer()
    plan = make_plan(module, ir_name, strategy, renderer.families, bounded=True)
    artifact = renderer.render(plan)
    key = object_key(artifact.source)
    obj = default_cache().get_or_build(key, lambda: compile_object(artifact.source),
                                       meta={"kernel": ir_name, "target": "llvm"})
    return CPUKernel(plan, artifact, obj, module, threads)

