"""``akc build --target llvm``: LLVM IR, host assembly or object code of a file's kernels
(with ``--arch sm_90|sm_80``: PTX or cubin of the GPU flavour, :mod:`arke.targets.nvidia.build_cli`)."""

from __future__ import annotations

import argparse
import sys

from arke.targets.base import UsageError


def cmd_build_llvm(args: argparse.Namespace) -> int:
    """Render (and, for asm/obj, compile) the kernels of ``args.path`` for this CPU."""
    from arke.cli.build import _library
    from arke.targets.llvm.jit import assembly, compile_object

    if args.emit in ("ptx", "cubin"):
        if args.arch is None:
            raise UsageError(f"--emit {args.emit} is for --target triton or cuda; the llvm target emits it for its "
                             "GPU flavour only: add --arch sm_90 (or sm_80)")
        from arke.targets.nvidia.build_cli import cmd_build_nvptx

        return cmd_build_nvptx(args)
    lib = _library(args.path, "llvm")
    if isinstance(lib, int):
        return lib
    names = [args.kernel] if args.kernel else list(lib.module.names)
    for n in names:
        if n not in lib.kernels:
            raise UsageError(f"`{args.path}` has no kernel `{n}`; it has: {', '.join(lib.kernels)}")
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
