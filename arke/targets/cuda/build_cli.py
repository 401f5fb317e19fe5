"""``akc build FILE --target cuda [--arch sm_90|sm_80] --emit source|ptx|cubin``: the CUDA-C target.

Each kernel's plan (its rows, contractions and attention cores fused, every other op one
dispatch) is rendered by :mod:`arke.targets.cuda.render` once per strategy variant, compiled to PTX
by NVRTC (:mod:`arke.targets.cuda.nvrtc`) and, for ``cubin``, assembled by ``ptxas`` (no GPU
needed). ``source`` writes the CUDA C (``<kernel>.<arch>.cu`` in a folder); a table of each
entry's registers and spills follows ``ptx``/``cubin``, as ``--target llvm --arch`` prints.
"""

from __future__ import annotations

import argparse

from arke.targets.nvidia.build_cli import _usage, build_each


def cmd_build_cuda(args: argparse.Namespace) -> int:
    """Write CUDA C, PTX or cubin of a file's kernels for ``args.arch`` (default sm_90)."""
    from arke.targets.cuda import nvrtc
    from arke.targets.cuda.render import RENDERER

    if args.emit not in ("source", "ptx", "cubin"):
        raise _usage(f"--emit {args.emit}: the cuda target emits source, ptx or cubin")
    try:
        arch = nvrtc.arch_name(args.arch or "sm_90")
    except ValueError as err:
        raise _usage(str(err)) from None
    if args.emit != "source" and not nvrtc.available():
        raise _usage(f"--emit {args.emit}: {nvrtc.MISSING}")
    return build_each(args, arch, RENDERER,
                      lambda source, name, plan: nvrtc.compile_ptx(source, arch, kernel=name, plan=plan),
                      "cuda", (nvrtc.NvrtcError,))
