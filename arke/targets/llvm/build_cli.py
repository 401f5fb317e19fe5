"""``akc build --target llvm``: LLVM IR, host assembly or object code of a file's kernels
(with ``--arch sm_90|sm_80``: PTX or cubin of the GPU flavour, :func:`cmd_build_nvptx`)."""

from __future__ import annotations

import argparse
import sys

from arke.targets.base import UsageError


def cmd_build_llvm(args: argparse.Namespace) -> int:
    """Render (and, for asm/obj, compile) the kernels of ``args.path`` for this CPU."""
    from arke.cli.build import _library, chosen_kernels
    from arke.targets.llvm.jit import assembly, compile_object

    if args.emit in ("ptx", "cubin"):
        if args.arch is None:
            raise UsageError(f"--emit {args.emit} is for --target triton or cuda; the llvm target emits it for its "
                             "GPU flavour only: add --arch sm_90 (or sm_80)")
        return cmd_build_nvptx(args)
    if args.arch is not None:  # the GPU flavour: its LLVM IR (the arch checked there), never the host's code
        if args.emit != "source":
            raise UsageError(f"--emit {args.emit} is this CPU's code, which takes no --arch; for the GPU flavour "
                             f"of {args.arch} use --emit source|ptx|cubin")
        return cmd_build_nvptx(args)
    lib = _library(args.path, "llvm", getattr(args, "dtypes", ""))
    if isinstance(lib, int):
        return lib
    names = chosen_kernels(lib.module, args.kernel, args.path)
    sources = [lib.kernels[n].source() for n in names]
    if args.emit == "obj":
        if not args.output:
            raise UsageError("--emit obj writes binary object code: give a file with -o PATH")
        if len(names) != 1:
            raise UsageError("--emit obj builds one kernel: add --kernel NAME")
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


def cmd_build_nvptx(args: argparse.Namespace) -> int:
    """Write PTX or cubin of a file's kernels for ``args.arch`` and print their resources: each kernel's
    plan (one dispatch per op) rendered by :mod:`arke.targets.llvm.nvptx`, lowered to PTX by
    llvmlite's NVPTX backend and, for ``cubin``, assembled by ``ptxas``
    (:func:`arke.targets.nvidia.build_cli.build_each`)."""
    from arke.targets.llvm.nvptx import RENDERER
    from arke.targets.nvidia import ptx as nvptx
    from arke.targets.nvidia.build_cli import build_each

    try:
        arch = nvptx.arch_name(args.arch)
    except ValueError as err:
        raise UsageError(str(err)) from None
    # llvmlite reports a module its NVPTX backend rejects as a RuntimeError
    return build_each(args, arch, RENDERER, lambda source, name, plan: nvptx.compile_ptx(source, arch), "llvm",
                      (RuntimeError,))
