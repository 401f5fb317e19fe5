"""``akc build`` and ``akc run``: compile a file's kernels for a target, and run one on random inputs.

    akc build FILE --target llvm [--kernel NAME] [--emit source|asm|obj] [-o PATH]
    akc build FILE --target llvm --arch sm_90|sm_80 [--kernel NAME] [--emit ptx|cubin] [-o PATH]
    akc build FILE --target triton [--arch sm_90|sm_80] [--kernel NAME] [--emit source|ptx|cubin] [-o PATH]
    akc build FILE --target cuda [--arch sm_90|sm_80] [--kernel NAME] [--emit source|ptx|cubin] [-o PATH]
    akc build FILE --target mlir [--device cpu|cuda] [--arch sm_80] [--kernel NAME]
                   [--emit source|transform|vmfb] [-o PATH]
    akc run FILE KERNEL --dims M=128,N=4097 [--threads N] [--repeat R]

``build --target triton`` needs no GPU: ``ptx``/``cubin`` compile through ``triton.compile`` for
the architecture and print each entry's registers, spills and shared memory; a strategy whose
tiles need more than the architecture has is error ``AK4012`` at the decision that set them.
``build --target mlir`` (see :mod:`arke.cli_mlir`) writes MLIR, transform scripts, or IREE's
``.vmfb`` for the CPU or a CUDA architecture (no GPU needed).
``run`` makes random inputs from the kernel's signature and the dims, runs the compiled
kernel and the reference interpreter, and prints the largest difference and the times.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

EMITS = ("source", "asm", "obj", "ptx", "cubin", "transform", "vmfb")
#: the target each emit other than ``source`` belongs to (for "--emit X is for --target T")
EMIT_TARGETS = {"asm": "llvm", "obj": "llvm", "ptx": "triton", "cubin": "triton", "transform": "mlir", "vmfb": "mlir"}
GPU_EMITS = ("source", "ptx", "cubin")


def add_commands(sub: Any) -> None:
    """Register the subcommands on ``akc``'s subparsers."""
    build = sub.add_parser("build", help="compile a .ak file's kernels for a target",
                           description="Compile kernels and write what the target made.")
    build.add_argument("path", metavar="FILE")
    build.add_argument("--target", default="llvm", help="the target (default: llvm)")
    build.add_argument("--kernel", help="only this kernel (default: every kernel the file defines)")
    build.add_argument("--emit", choices=EMITS, default="source",
                       help="source: the target's source (LLVM IR, Triton's Python, or MLIR); asm: host assembly; "
                            "obj: object code; ptx, cubin: the triton target's compiled kernels; transform: the "
                            "mlir target's transform scripts; vmfb: the mlir target's IREE binaries")
    build.add_argument("--arch", default=None,
                       help="the GPU architecture: llvm (with --emit ptx|cubin) and triton sm_90 or sm_80 (triton's "
                            "default sm_90); mlir with --device cuda sm_80, sm_86, sm_87 or sm_89 (default sm_80; "
                            "its PTX also runs on sm_90)")
    build.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                       help="mlir: build for this CPU or for an NVIDIA GPU (default cpu)")
    build.add_argument("-o", "--output", help="write here instead of standard output (needed for obj and vmfb; "
                                              "ptx/cubin/vmfb: a file for one entry, else a folder)")
    build.set_defaults(handler=cmd_build)

    run = sub.add_parser("run", help="run a kernel on random inputs and compare it with the interpreter",
                         description="Run KERNEL of FILE on random inputs of the given dims.")
    run.add_argument("path", metavar="FILE")
    run.add_argument("kernel", metavar="KERNEL")
    run.add_argument("--dims", default="", help="dim values, as M=128,N=4097")
    run.add_argument("--target", default="llvm")
    run.add_argument("--threads", type=int, default=None)
    run.add_argument("--repeat", type=int, default=5, help="timed runs (the median is shown)")
    run.add_argument("--seed", type=int, default=0)
    run.set_defaults(handler=cmd_run)


def _usage(message: str) -> Exception:
    from arke.cli import UsageError

    return UsageError(message)


def _library(path: str, target: str) -> Any:
    from arke.cli import load_or_report
    from arke.runtime.build import Library, runnable_targets

    module = load_or_report(path)
    if isinstance(module, int):
        return module
    if target == "mlir":
        from arke.runtime.iree import MISSING, iree_available

        if not iree_available():
            raise _usage(MISSING)
    if target == "cuda":
        from arke.runtime.cuda import CudaUnavailableError, require_gpu

        try:
            require_gpu("cuda")
        except CudaUnavailableError as err:
            raise _usage(str(err)) from None
    available = runnable_targets()  # asked now, not at import: IREE or Triton may have come since
    if target not in available:
        raise _usage(f"target `{target}` cannot be built here yet; available: {', '.join(available)}")
    return Library(module, target, None)


def cmd_build(args: argparse.Namespace) -> int:
    """``akc build``: render (and, for asm/obj, compile) the kernels of a file."""
    from arke.runtime.cpu import assembly, compile_object

    if args.target == "mlir":
        from arke.cli_mlir import cmd_build_mlir

        return cmd_build_mlir(args)
    if args.target == "cuda":  # CUDA C through NVRTC (arke.cli_cuda); no GPU needed
        from arke.cli_cuda import cmd_build_cuda

        return cmd_build_cuda(args)
    if getattr(args, "device", "cpu") != "cpu":
        raise _usage(f"--device {args.device} is for --target mlir")
    if args.target == "triton":
        from arke.cli_triton import cmd_build_triton

        if EMIT_TARGETS.get(args.emit) == "mlir":
            raise _usage(f"--emit {args.emit} is for --target mlir; the triton target emits source, ptx or cubin")
        if args.arch is None:
            args.arch = "sm_90"
        return cmd_build_triton(args)
    if args.emit in ("ptx", "cubin") and args.arch is not None:  # the llvm target's GPU flavour
        from arke.cli_nvptx import cmd_build_nvptx

        return cmd_build_nvptx(args)
    if args.emit not in ("source", "asm", "obj"):
        raise _usage(f"--emit {args.emit} is for --target {EMIT_TARGETS[args.emit]}; the llvm target emits source, "
                     f"asm or obj (or, with --arch sm_90|sm_80, ptx or cubin)")
    lib = _library(args.path, args.target)
    if isinstance(lib, int):
        return lib
    names = [args.kernel] if args.kernel else list(lib.module.names)
    for n in names:
        if n not in lib.kernels:
            raise _usage(f"`{args.path}` has no kernel `{n}`; it has: {', '.join(lib.kernels)}")
    sources = [lib.kernels[n].source() for n in names]
    if args.emit == "obj":
        if not args.output:
            raise _usage("--emit obj writes binary object code: give a file with -o PATH")
        if len(names) != 1:
            raise _usage("--emit obj builds one kernel: add --kernel NAME")
        data = compile_object(sources[0])
        with open(args.output, "wb") as f:
            f.write(data)
        return 0
    text = "\n".join(assembly(s) if args.emit == "asm" else s for s in sources)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


def load_kernels(args: argparse.Namespace) -> tuple[Any, list[str]] | int:
    """The checked module of ``args.path`` and the kernels to build (``--kernel``, else every kernel
    the file defines); the exit status instead when the file has errors (already reported)."""
    from arke.cli import load_or_report

    module = load_or_report(args.path)
    if isinstance(module, int):
        return module
    names = [args.kernel] if args.kernel else list(module.names)
    for n in names:
        if n not in module.kernel_map:
            raise _usage(f"`{args.path}` has no kernel `{n}`; it has: {', '.join(module.kernel_map)}")
    return module, names


def parse_dims(text: str) -> dict[str, int]:
    dims: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if not name.isidentifier() or not value.strip().isdigit() or int(value) < 1:
            raise _usage(f"--dims takes NAME=VALUE pairs with positive values, as M=128,N=4097; not `{part}`")
        dims[name] = int(value)
    return dims


def random_inputs(fn: Any, dims: dict[str, int], seed: int) -> list[Any]:
    """Random tensors for a kernel's parameters (integer tensors are small non-negative values)."""
    import torch

    from arke.ir.shapes import evaluate
    from arke.runtime.guards import TORCH_DTYPES

    g = torch.Generator().manual_seed(seed)
    out = []
    for p in fn.params:
        if p.type.rank == 0:
            out.append(p.default if p.default is not None else 1)
            continue
        try:
            shape = tuple(evaluate(d, dims) for d in p.type.shape)
        except ValueError:
            missing = sorted({s.name for d in p.type.shape for s in getattr(d, "free_symbols", ())} - set(dims))
            raise _usage(f"give every dim of `{p.name}` with --dims (missing: {', '.join(missing)})") from None
        dtype = TORCH_DTYPES[p.type.dtype]
        if dtype.is_floating_point:
            out.append(torch.randn(shape, generator=g).to(dtype))
        elif dtype == torch.bool:
            out.append(torch.rand(shape, generator=g) > 0.5)
        else:
            out.append(torch.randint(0, 2, shape, generator=g, dtype=dtype))
    return out


def cmd_run(args: argparse.Namespace) -> int:
    """``akc run``: the compiled kernel against the interpreter, on random inputs."""
    import torch

    from arke.runtime.guards import GuardError

    lib = _library(args.path, args.target)
    if isinstance(lib, int):
        return lib
    if args.kernel not in lib.kernels:
        raise _usage(f"`{args.path}` has no kernel `{args.kernel}`; it has: {', '.join(lib.kernels)}")
    kernel = lib.kernels[args.kernel]
    fn = kernel.function
    inputs = random_inputs(fn, parse_dims(args.dims), args.seed)
    try:
        got = kernel(*inputs, threads=args.threads)
        times = []
        for _ in range(max(1, args.repeat)):
            start = time.perf_counter()
            kernel(*inputs, threads=args.threads)
            times.append(time.perf_counter() - start)
        want = lib.module.kernels[args.kernel](*inputs)
    except GuardError as err:
        print(f"akc: {err}", file=sys.stderr)
        return 1
    got_t = got if isinstance(got, tuple) else (got,)
    want_t = want if isinstance(want, tuple) else (want,)
    worst = 0.0
    for a, b in zip(got_t, want_t):
        if a.numel():
            worst = max(worst, float((a.double() - b.double()).abs().max()))
    times.sort()
    shapes = " ".join(str(list(t.shape)) for t in inputs if isinstance(t, torch.Tensor))
    print(f"{args.kernel} on {args.target}: inputs {shapes}")
    print(f"  max |{args.target} - interpreter| = {worst:.3g}")
    print(f"  time: {times[len(times) // 2] * 1e3:.3f} ms (median of {len(times)}, {lib.threads} threads)")
    return 0
