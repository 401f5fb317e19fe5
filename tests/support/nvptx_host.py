"""Run the LLVM target's GPU flavour (NVPTX) on the host: the same LLVM IR, JIT-compiled for this CPU.

There is no GPU here, so the NVPTX module :mod:`arke.targets.llvm.nvptx` renders is checked by
rewriting only what ties it to the GPU and running the rest as it is: the special registers
(``llvm.nvvm.read.ptx.sreg.{tid,ctaid,ntid}.x``) become loads of host globals, global-memory
pointers (``ptr addrspace(1)``) become plain pointers and ``ptx_kernel`` a plain function. Each
entry gets a driver ``host.<entry>(buffers..., dims, err, threads)`` that runs every thread of the
launch's grid in turn (``ctaid`` the thread's number, one thread per block: the kernels index by
``ctaid * ntid + tid`` only). The arithmetic, the subscripts, the checks and the inline float
math are the GPU module's own instructions; LLVM's host back end only chooses different machine
code for them (no fused multiply-add: the host target machine keeps ``fmul``/``fadd`` apart as
NVPTX does without ``contract`` flags).

:func:`run` allocates the plan's buffers, launches each dispatch over its grid with a zeroed error
word and returns the results as the runtimes do (NumPy for NumPy inputs, torch otherwise) with the
error word, like :func:`cuda_host.run`.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from typing import Any

import llvmlite.binding as llvm
import torch

import arke
from arke.ir.shapes import evaluate, parse_dim
from arke.plan.dispatch import KernelPlan, make_plan
from arke.runtime.guards import TORCH_DTYPES, prepare_args
from arke.targets.artifact import LaunchSpec
from arke.targets.llvm.nvptx import RENDERER

_SREGS = ("tid", "ctaid", "ntid")


def host_ir(source: str, launches: tuple[LaunchSpec, ...]) -> str:
    """The NVPTX module ``source`` as host LLVM IR, with a driver per launch."""
    text = source.replace('target triple = "nvptx64-nvidia-cuda"', "")
    for s in _SREGS:
        text = text.replace(f"declare i32 @llvm.nvvm.read.ptx.sreg.{s}.x()", f"@arke.sreg.{s} = global i32 0")
        text = text.replace(f"call i32 @llvm.nvvm.read.ptx.sreg.{s}.x()", f"load i32, ptr @arke.sreg.{s}")
    assert "llvm.nvvm" not in text, "an NVVM intrinsic the host emulation does not model"
    # `%b0 = addrspacecast ptr addrspace(1) %g0 to ptr`: the same pointer once both are generic
    text = re.sub(r"(%[\w.]+) = addrspacecast ptr addrspace\(1\) (%[\w.]+) to ptr",
                  r"\1 = getelementptr i8, ptr \2, i64 0", text)
    text = text.replace("ptr addrspace(1)", "ptr").replace("define ptx_kernel void", "define void")
    drivers = []
    for launch in launches:
        params = [f"ptr %a{i}" for i in range(len(launch.buffers))] + ["ptr %dims", "ptr %err"]
        drivers.append("\n".join([
            f'define void @"host.{launch.entry}"({", ".join(params)}, i64 %threads) {{',
            "entry:",
            "  store i32 1, ptr @arke.sreg.ntid",
            "  store i32 0, ptr @arke.sreg.tid",
            "  br label %head",
            "head:",
            "  %i = phi i64 [0, %entry], [%next, %body]",
            "  %more = icmp slt i64 %i, %threads",
            "  br i1 %more, label %body, label %exit",
            "body:",
            "  %i32 = trunc i64 %i to i32",
            "  store i32 %i32, ptr @arke.sreg.ctaid",
            f'  call void @"{launch.entry}"({", ".join(params)})',
            "  %next = add i64 %i, 1",
            "  br label %head",
            "exit:",
            "  ret void",
            "}"]))
    return text + "\n" + "\n\n".join(drivers) + "\n"


@dataclass
class HostKernel:
    """A kernel's plan, its NVPTX module, the launches and the host JIT that runs them."""

    plan: KernelPlan
    source: str
    launches: tuple[LaunchSpec, ...]
    engine: Any
    module: Any  # the parsed llvmlite module, kept alive with its engine


_KERNELS: dict[tuple[int, str], tuple[arke.Module, HostKernel]] = {}


def _engine(ir_text: str) -> tuple[Any, Any]:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    mod = llvm.parse_assembly(ir_text)
    mod.triple = llvm.get_process_triple()
    mod.verify()
    machine = llvm.Target.from_default_triple().create_target_machine(opt=2)
    engine = llvm.create_mcjit_compiler(mod, machine)
    engine.finalize_object()
    return engine, mod


def host_kernel(module: arke.Module, kernel: str) -> HostKernel:
    """Kernel ``kernel`` of ``module`` planned for the GPU flavour, rendered and JIT-compiled (once)."""
    key = (id(module), kernel)
    if key not in _KERNELS:
        plan = make_plan(module.semantic, module.kernel_map.get(kernel, kernel), None, families=RENDERER.families)
        artifact = RENDERER.render(plan)
        source = str(artifact.source)
        engine, mod = _engine(host_ir(source, tuple(artifact.launches)))
        _KERNELS[key] = (module, HostKernel(plan, source, tuple(artifact.launches), engine, mod))
    return _KERNELS[key][1]


def run(module: arke.Module, kernel: str, *arrays: Any, **scalars: Any) -> tuple[Any, int]:
    """Call ``kernel`` through its host-run NVPTX module: ``(results, error word)``."""
    k = host_kernel(module, kernel)
    plan, fn = k.plan, k.plan.function
    args, dims, any_torch = prepare_args(fn, arrays, scalars)
    buffers: list[torch.Tensor] = []
    for b in plan.buffers:
        if b.role == "param":
            buffers.append(args[b.name].contiguous())
        else:
            buffers.append(torch.zeros(tuple(evaluate(d, dims) for d in b.shape), dtype=TORCH_DTYPES[b.dtype]))
    dim_values = torch.tensor([dims[d] for d in plan.dims] or [0], dtype=torch.int64)
    raised = 0
    for launch in k.launches:
        grid = [evaluate(parse_dim(g), dims) for g in launch.grid]
        threads = dict(launch.options)["block"]
        for g in grid:
            threads *= g
        err = torch.zeros(1, dtype=torch.int64)
        address = k.engine.get_function_address(f"host.{launch.entry}")
        entry = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * (len(launch.buffers) + 2)), ctypes.c_int64)(address)
        entry(*[buffers[i].data_ptr() for i in launch.buffers], dim_values.data_ptr(), err.data_ptr(), threads)
        raised |= int(err[0].item())
    outs: list[torch.Tensor] = []
    for r in fn.results:
        t = buffers[plan.buffer_index(r)]
        outs.append(t.clone() if r in args or any(t is o for o in outs) else t)
    found = [o.numpy() if not any_torch and o.dtype != torch.bfloat16 else o for o in outs]
    return (found[0] if len(found) == 1 else tuple(found)), raised


def check_host_case(case: Any, what: str = "llvm nvptx (host)") -> None:
    """A conformance case (``test_conformance.Case``) through the host-run NVPTX module equals the
    interpreter within the suite's rule; the error word must stay clear on in-range inputs."""
    from test_conformance import check_case

    def call(module: arke.Module, *args: Any, **scalars: Any) -> Any:
        got, err = run(module, case.member, *args, **scalars)
        assert err == 0, f"{what} {case.id}: the error word was raised on in-range inputs"
        return got

    check_case(case, call, what)
