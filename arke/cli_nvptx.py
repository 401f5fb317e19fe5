"""``akc build --target llvm --arch sm_90|sm_80 --emit ptx|cubin``: the LLVM target's GPU flavour.

Each kernel's plan (one dispatch per op) is rendered by :mod:`arke.codegen.llvm_nvptx`,
lowered to PTX by llvmlite's NVPTX backend and, for ``cubin``, assembled by ``ptxas`` (no GPU
needed). One PTX module (or cubin) per kernel holds an entry per dispatch; a table of each
entry's registers and spills follows, as ``--target triton`` prints.
"""

from __future__ import annotations

import argparse
import os
import sys


def _usage(message: str) -> Exception:
    from arke.cli import UsageError

    return UsageError(message)


def cmd_build_nvptx(args: argparse.Namespace) -> int:
    """Write PTX or cubin of a file's kernels for ``args.arch`` and print their resources."""
    from arke.cli import load_or_report
    from arke.codegen.base import UnsupportedError
    from arke.codegen.llvm_nvptx import BLOCK, RENDERER
    from arke.codegen.plan import make_plan
    from arke.runtime import nvptx
    from arke.runtime.triton_aot import CompiledEntry, resource_table

    try:
        arch = nvptx.arch_name(args.arch)
    except ValueError as err:
        raise _usage(str(err)) from None
    if args.emit == "cubin":
        if nvptx.ptxas_path() is None:
            raise _usage("--emit cubin needs ptxas (it ships with Triton: pip install triton)")
        if not args.output:
            raise _usage("--emit cubin writes binary code: give a file or folder with -o PATH")
    module = load_or_report(args.path)
    if isinstance(module, int):
        return module
    names = [args.kernel] if args.kernel else list(module.names)
    for n in names:
        if n not in module.kernel_map:
            raise _usage(f"`{args.path}` has no kernel `{n}`; it has: {', '.join(module.kernel_map)}")
    outputs: list[tuple[str, str, bytes]] = []  # (kernel, ptx, cubin)
    entries: list[CompiledEntry] = []
    failed = 0
    for name in names:
        plan = make_plan(module.semantic, module.kernel_map[name], None, families=RENDERER.families)
        try:
            source = RENDERER.render(plan).source
        except UnsupportedError as err:
            print(f"akc: `{name}`: the llvm target cannot render it for {arch} yet: {err}", file=sys.stderr)
            failed += 1
            continue
        ptx = nvptx.compile_ptx(source, arch)
        cubin = b""
        if nvptx.ptxas_path() is not None:  # ptx alone needs no ptxas; the table then is left out
            cubin, assembled = nvptx.assemble(ptx, arch)
            entries += [CompiledEntry(name, e.entry, arch, "", b"", e.registers, e.spills, e.stack, 0,
                                      BLOCK // 32, 1, ()) for e in assembled]
        outputs.append((name, ptx, cubin))
    _write(outputs, args.emit, args.output, arch)
    if entries:
        print(resource_table(entries), end="", file=sys.stdout if args.output else sys.stderr)
    return 1 if failed else 0


def _write(outputs: list[tuple[str, str, bytes]], emit: str, output: str | None, arch: str) -> None:
    if output is None:
        sys.stdout.write("".join(ptx for _, ptx, _ in outputs))
        return
    if len(outputs) == 1 and not os.path.isdir(output) and not output.endswith(os.sep):
        targets = [(outputs[0], output)]
    else:
        os.makedirs(output, exist_ok=True)
        targets = [(o, os.path.join(output, f"{o[0]}.{arch}.{emit}")) for o in outputs]
    for (_, ptx, cubin), where in targets:
        if emit == "cubin":
            with open(where, "wb") as f:
                f.write(cubin)
        else:
            with open(where, "w", encoding="utf-8") as t:
                t.write(ptx)
