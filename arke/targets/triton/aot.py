"""Ahead-of-time compiles of Triton artifacts for an NVIDIA architecture, with no GPU needed.

``compile_artifact(artifact, plan, "sm_90")`` imports the artifact's module from a temporary
file (Triton reads a ``@triton.jit`` function's source from its file), builds each launch's
signature from the plan (``b<i>`` pointers to the plan's buffers, ``ws`` the scratch
pointer, ``d<j>`` the dims, then the launch's constexpr options) and compiles it with
``triton.compile`` for a :class:`GPUTarget`. Each :class:`CompiledEntry` carries the PTX,
the cubin and the resources the cubin needs: registers and stack (where spills go) read
from the cubin with the ``cuobjdump`` that ships with Triton, shared memory from Triton's
metadata. Those are what a GPU would refuse at launch, so :func:`check_resources` turns
them into a build-time error that names the decision that set the tiles
(:class:`ResourceError`, shown as ``AK4012`` by ``akc build``).

Dims are compiled as 16-divisible (see :func:`launch_job`), as Triton's JIT specialises
them for large shapes. A process that imported Triton for its interpreter
(``TRITON_INTERPRET=1``, as the tests do) cannot compile (Triton's own library functions
are then interpreter functions), so it compiles in a fresh Python process instead.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from arke.targets.nvidia.cubin import (
    MAX_REGISTERS,
    REGISTERS_PER_BLOCK,
    CompiledEntry,
    arch_of,
    cubin_resources,
    require_triton,
)

# Triton 3.9 warns on every import unless this is set; "1" keeps its current behaviour (fused
# multiply-adds), and a user's own setting wins.
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

if TYPE_CHECKING:
    from arke.plan.dispatch import KernelPlan
    from arke.targets.artifact import Artifact, LaunchSpec

LAUNCH_OPTIONS = ("num_warps", "num_stages")  # options that are not the kernel's constexprs

#: Triton's pointer element type for each Arke dtype (bool tensors are bytes, as torch stores them).
POINTER_TYPES: dict[str, str] = {
    "f32": "*fp32", "f16": "*fp16", "bf16": "*bf16", "f64": "*fp64",
    "i8": "*i8", "i16": "*i16", "i32": "*i32", "i64": "*i64", "u8": "*u8", "u16": "*u16", "u32": "*u32",
    "bool": "*i1",
}

_IMPORT_LOCK = threading.RLock()  # Triton's knobs are process-wide


class ResourceError(Exception):
    """A compiled entry needs more than the architecture has; ``decisions`` are the strategy's
    decisions that chose its size (tiles, stages, warps), as ``(kind, subject)`` pairs."""

    def __init__(self, entry: CompiledEntry, what: str, need: int, limit: int,
                 decisions: tuple[tuple[str, str | None], ...]):
        self.entry, self.what, self.need, self.limit, self.decisions = entry, what, need, limit, decisions
        unit = " bytes" if what == "shared memory" else ""
        chosen = ", ".join(f"{k} {s}" if s else k for k, s in decisions) or "the default tiles"
        opts = ", ".join(f"{k}={v}" for k, v in entry.options)
        super().__init__(
            f"`{entry.kernel}` (entry `{entry.entry}`) needs {need}{unit} of {what} per block, more than "
            f"{entry.arch} has ({limit}{unit}); set by {chosen} ({opts})")


def load_module(source: str, name: str = "arke_triton") -> tuple[ModuleType, tempfile.TemporaryDirectory[str]]:
    """Import generated source from a temporary file; keep the directory alive while compiling.

    The module's ``@triton.jit`` functions are made for compiling even under
    ``TRITON_INTERPRET=1`` (which would make them interpreter functions that cannot compile).
    """
    triton = require_triton()
    tmp = tempfile.TemporaryDirectory(prefix="arke-triton-")
    path = Path(tmp.name) / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"_arke_aot_{name}_{id(tmp)}", path)
    if spec is None or spec.loader is None:
        tmp.cleanup()
        raise ImportError(f"cannot import generated module {path}")
    module = importlib.util.module_from_spec(spec)
    with _IMPORT_LOCK, triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = False
        sys.modules[spec.name] = module
        try:
            spec.loader.exec_module(module)
        finally:
            sys.modules.pop(spec.name, None)
    return module, tmp


def signature(fn: Any, launch: LaunchSpec, plan: KernelPlan) -> tuple[dict[str, str], dict[str, int]]:
    """The (signature, constexprs) of one launch's ``@triton.jit`` function, from its parameter names."""
    options = dict(launch.options)
    constexprs = {k: v for k, v in options.items() if k not in LAUNCH_OPTIONS}
    sig: dict[str, str] = {}
    for arg in fn.arg_names:
        if arg in constexprs:
            sig[arg] = "constexpr"
        elif arg == "ws":
            sig[arg] = "*i64"
        elif re.fullmatch(r"b\d+", arg) and int(arg[1:]) < len(plan.buffers):
            dtype = plan.buffers[int(arg[1:])].dtype
            sig[arg] = POINTER_TYPES[getattr(dtype, "value", str(dtype))]
        elif re.fullmatch(r"d\d+", arg) and int(arg[1:]) < len(plan.dims):
            sig[arg] = "i64"
        else:
            raise ValueError(f"{launch.entry}: parameter `{arg}` is neither a buffer, a dim, `ws` nor an option "
                             f"({', '.join(options) or 'none given'})")
    return sig, constexprs


def interpreted() -> bool:
    """Whether Triton was imported for its interpreter (``TRITON_INTERPRET=1``): its own library
    functions (``tl.cdiv`` ...) are then interpreter functions, which no compile can call."""
    require_triton()
    from triton.language import standard
    from triton.runtime.jit import JITFunction

    return not isinstance(standard.cdiv, JITFunction)


def launch_job(fn: Any, launch: LaunchSpec, plan: KernelPlan, arch: str, aligned: bool = True) -> dict[str, Any]:
    """What compiling one launch for ``arch`` takes: entry, signature, constexprs, attributes, options.

    Pointers are taken as 16-byte aligned (torch allocations are) and, with ``aligned``, dims
    as multiples of 16: what Triton's JIT specialises for the large shapes that matter, and
    what lets it vectorise loads and pipeline them through shared memory (the most shared
    memory a launch can need, so the right case for the resource check).
    """
    sig, constexprs = signature(fn, launch, plan)
    options = dict(launch.options)
    divisible = [k for k, a in enumerate(fn.arg_names) if sig[a].startswith("*") or (aligned and sig[a] == "i64")]
    return {"entry": launch.entry, "signature": sig, "constexprs": constexprs, "divisible": divisible,
            "capability": arch_of(arch)[0], "num_warps": int(options.get("num_warps", 4)),
            "num_stages": int(options.get("num_stages", 3))}


def run_jobs(module: ModuleType, jobs: list[dict[str, Any]], tolerant: bool = False) -> list[dict[str, Any]]:
    """Compile launch jobs against the functions of an imported module: ptx, cubin, shared memory, name.
    With ``tolerant`` a job Triton cannot compile gives ``{"error": message}`` instead of raising."""
    import triton
    from triton.backends.compiler import GPUTarget

    out: list[dict[str, Any]] = []
    for job in jobs:
        attrs = {(k,): [["tt.divisibility", 16]] for k in job["divisible"]}
        src = triton.compiler.ASTSource(fn=getattr(module, job["entry"]), signature=job["signature"],
                                        constexprs=job["constexprs"], attrs=attrs)
        try:
            compiled = triton.compile(src, target=GPUTarget("cuda", job["capability"], 32),
                                      options={"num_warps": job["num_warps"], "num_stages": job["num_stages"]})
        except Exception as err:  # Triton raises many kinds (MLIR passes, ptxas): all are this job's failure
            if not tolerant:
                raise
            out.append({"error": f"{type(err).__name__}: {str(err).strip()[-2000:]}"})
            continue
        out.append({"ptx": str(compiled.asm["ptx"]), "cubin": bytes(compiled.asm["cubin"]),
                    "shared": int(compiled.metadata.shared), "name": str(compiled.metadata.name)})
    return out


# A clean process for compiles when this one imported Triton for its interpreter: it reads
# ([(module path, jobs)...], tolerant) as JSON on stdin and writes the results as JSON (cubins in base64).
_WORKER = """
import base64, importlib.util, json, sys
from arke.targets.triton.aot import run_jobs
units, tolerant = json.load(sys.stdin)
out = []
for k, (path, jobs) in enumerate(units):
    spec = importlib.util.spec_from_file_location(f"arke_aot_worker_{k}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    out.append([dict(r, cubin=base64.b64encode(r["cubin"]).decode()) if "cubin" in r else r
                for r in run_jobs(module, jobs, tolerant)])
json.dump(out, sys.stdout)
"""


def _run_in_worker(units: list[tuple[str, list[dict[str, Any]]]], tolerant: bool) -> list[list[dict[str, Any]]]:
    import base64
    import json

    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, "-c", _WORKER], input=json.dumps([units, tolerant]), capture_output=True,
                          text=True, env=env, timeout=1800, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the Triton compile failed:\n{proc.stderr[-4000:]}")
    return [[dict(r, cubin=base64.b64decode(r["cubin"])) if "cubin" in r else r for r in rs]
            for rs in json.loads(proc.stdout)]


#: One compile request: an artifact, its plan, the architectures and the entries to compile (None: all).
Request = tuple["Artifact", "KernelPlan", Sequence[str], "Sequence[str] | None"]


def compile_requests(requests: Sequence[Request], aligned: bool = True,
                     tolerant: bool = False) -> list[list[CompiledEntry | str]]:
    """Compile each request's launches for each of its archs, arch-major, all in one worker at most.

    With ``tolerant`` a launch Triton cannot compile is its error text instead of an exception;
    no resource check is made (see :func:`check_resources`).
    """
    triton = require_triton()
    units: list[tuple[ModuleType, list[dict[str, Any]], list[tuple[LaunchSpec, KernelPlan]]]] = []
    temps = []
    try:
        for artifact, plan, archs, only in requests:
            if artifact.target != "triton":
                raise ValueError(f"not a Triton artifact (target {artifact.target!r})")
            for arch in archs:
                arch_of(arch)
            module, tmp = load_module(artifact.source, plan.name)
            temps.append(tmp)
            jobs, launches = [], []
            for arch in archs:
                for launch in artifact.launches:
                    if only is not None and launch.entry not in only:
                        continue
                    fn = getattr(module, launch.entry, None)
                    if fn is None or not hasattr(fn, "arg_names"):
                        raise ValueError(f"the artifact has no @triton.jit function `{launch.entry}`")
                    jobs.append(launch_job(fn, launch, plan, arch, aligned))
                    launches.append((launch, plan))
            units.append((module, jobs, launches))
        if interpreted():
            raw = _run_in_worker([(str(m.__file__), jobs) for m, jobs, _ in units], tolerant)
        else:
            with _IMPORT_LOCK, triton.knobs.runtime.scope():
                triton.knobs.runtime.interpret = False
                raw = [run_jobs(m, jobs, tolerant) for m, jobs, _ in units]
    finally:
        for tmp in temps:
            tmp.cleanup()
    out: list[list[CompiledEntry | str]] = []
    for (_, jobs, launches), results in zip(units, raw):
        entries: list[CompiledEntry | str] = []
        for job, (launch, plan), r in zip(jobs, launches, results):
            if "error" in r:
                entries.append(str(r["error"]))
                continue
            regs, stack, static_shared = cubin_resources(r["cubin"], r["name"])
            entries.append(CompiledEntry(plan.name, launch.entry, f"sm_{job['capability']}", r["ptx"], r["cubin"],
                                         regs, stack // 4, stack, r["shared"] + static_shared, job["num_warps"],
                                         job["num_stages"], tuple(launch.options)))
        out.append(entries)
    return out


#: The smallest block a fit makes (what ``tl.dot`` needs; arke.targets.triton.fit's moves stop there).
MIN_BLOCK = 16


def least_shared(launch: LaunchSpec, free: Sequence[str] = ()) -> int:
    """A lower bound of the shared memory (bytes) a launch's block needs: a dot's two operand tiles staged
    there, one byte an element, once per pipeline stage but the one in registers (0 where it has no dot).
    ``free``: options a fit may still lower (taken at their least: one stage, blocks of :data:`MIN_BLOCK`)."""
    o = dict(launch.options)
    if not {"BLOCK_M", "BLOCK_N", "BLOCK_K"} <= o.keys():
        return 0
    for k in free:
        if k == "num_stages":
            o[k] = 1
        elif k.startswith("BLOCK_"):
            o[k] = min(o[k], MIN_BLOCK)
    return max(1, o.get("num_stages", 1) - 1) * (o["BLOCK_M"] + o["BLOCK_N"]) * o["BLOCK_K"]


def refuse_early(artifact: Artifact, plan: KernelPlan, archs: Sequence[str],
                 free: Callable[[LaunchSpec], Sequence[str]] = lambda launch: ()) -> None:
    """:class:`ResourceError` before compiling where a launch cannot fit even :func:`least_shared` (``free``: the
    options a fit may still lower, taken at their least): Triton takes minutes over tiles of 512 × 512 × 512
    that no architecture can hold."""
    for arch in archs:
        _, limit = arch_of(arch)
        for launch in artifact.launches:
            need = least_shared(launch, free(launch))
            if need > limit:
                o = dict(launch.options)
                entry = CompiledEntry(plan.name, launch.entry, arch, "", b"", 0, 0, 0, need,
                                      int(o.get("num_warps", 4)), int(o.get("num_stages", 1)), tuple(launch.options))
                raise ResourceError(entry, "shared memory", need, limit, sizing_decisions(plan))


def compile_artifact_archs(artifact: Artifact, plan: KernelPlan, archs: list[str], check: bool = True,
                           aligned: bool = True) -> list[CompiledEntry]:
    """Compile every launch of a Triton artifact for each of ``archs``, in that order (one worker at most)."""
    if check:
        refuse_early(artifact, plan, archs)
    entries = [e for e in compile_requests([(artifact, plan, archs, None)], aligned)[0]
               if isinstance(e, CompiledEntry)]
    if check:
        for entry in entries:
            check_resources(entry, plan)
    return entries


def compile_artifact(artifact: Artifact, plan: KernelPlan, arch: str, check: bool = True,
                     aligned: bool = True) -> list[CompiledEntry]:
    """Compile every launch of a Triton artifact for ``arch`` (``sm_90``/``sm_80``); no GPU is needed.

    With ``check`` (the default) an entry that needs more shared memory or registers than the
    architecture has raises :class:`ResourceError`; ``aligned``: see :func:`launch_job`.
    """
    return compile_artifact_archs(artifact, plan, [arch], check, aligned)


def sizing_decisions(plan: KernelPlan) -> tuple[tuple[str, str | None], ...]:
    """The plan's decisions that size a block: tiles, stages, warps and vector widths."""
    return tuple((d.kind, d.subject) for d in plan.decisions if d.kind in ("tile", "stages", "warps", "vectorize"))


def check_resources(entry: CompiledEntry, plan: KernelPlan) -> None:
    """Raise :class:`ResourceError` when ``entry`` needs more shared memory or registers than its arch has."""
    _, shared_limit = arch_of(entry.arch)
    decisions = sizing_decisions(plan)
    if entry.shared > shared_limit:
        raise ResourceError(entry, "shared memory", entry.shared, shared_limit, decisions)
    if entry.registers > MAX_REGISTERS:
        raise ResourceError(entry, "registers per thread", entry.registers, MAX_REGISTERS, decisions)
    block = entry.registers * entry.num_warps * 32
    if block > REGISTERS_PER_BLOCK:
        raise ResourceError(entry, "registers", block, REGISTERS_PER_BLOCK, decisions)
