"""``akc build --target mlir``: render a file's kernels as MLIR and compile them with IREE.

    akc build FILE --target mlir [--kernel NAME] [--emit source|transform|vmfb]
                   [--device cpu|cuda] [--arch sm_80] [-o PATH]

``source`` writes each kernel's MLIR module (linalg on tensors), ``transform`` its strategy as
a transform-dialect script; neither needs IREE. ``vmfb`` compiles each module with IREE (for
this CPU, or with ``--device cuda`` for ``--arch``, default sm_80; no GPU needed) and writes
the binary to ``-o``: a file for one kernel variant, else a folder. A kernel has a variant per
mlir strategy, plus the defaults unless a strategy always applies. A decision the MLIR target
cannot express is warning ``AK4013`` at the decision.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from arke.lang.source import read_source_bytes

if TYPE_CHECKING:
    pass

EMITS = ("source", "transform", "vmfb")
TARGET = "mlir"


def _usage(message: str) -> Exception:
    from arke.cli.app import UsageError

    return UsageError(message)


def _renderer() -> Any:
    """The MLIR renderer, or a usage error when this build of arke has none."""
    try:
        from arke.targets.mlir import render as mlir_codegen
    except ImportError:
        raise _usage("the MLIR renderer (arke.targets.mlir.render) is not available in this build") from None
    return mlir_codegen.RENDERER


def _options(args: argparse.Namespace) -> tuple[str, str | None]:
    """(device, arch) after checking them: usage errors, never a traceback."""
    from arke.targets.mlir import kernel as iree

    device: str = getattr(args, "device", None) or "cpu"
    arch: str | None = args.arch
    if args.emit not in EMITS:
        from arke.targets.base import for_emit

        raise _usage(f"--emit {args.emit} is for --target {' or '.join(for_emit(args.emit))}; the mlir target "
                     f"emits {', '.join(EMITS)}")
    if device not in iree.DEVICES:
        raise _usage(f"--device {device}: the mlir target builds for {' or '.join(iree.DEVICES)}")
    if device == "cpu":
        if arch is not None:
            raise _usage(f"--arch {arch} is for --device cuda; a cpu build targets this machine's CPU")
        return device, None
    try:
        return device, iree.cuda_arch(arch)
    except iree.IREEError as err:
        raise _usage(str(err)) from None


def _notes(artifact: Any, name: str, path: str, text: str) -> list[Any]:
    """The AK4013 warnings of an artifact's ``notes`` (decisions the MLIR target cannot express)."""
    from arke.targets.mlir.schedule import Note, note_diagnostics

    notes = [Note(n["decision"], n.get("subject"), n["message"]) for n in json.loads(artifact.meta.get("notes", "[]"))]
    return note_diagnostics(notes, name, path, text) if notes else []


def _file_name(name: str, label: str, device: str, arch: str | None) -> str:
    return f"{name}.{label.replace(' ', '')}.{arch or device}.vmfb"


def _write_binaries(built: list[tuple[str, bytes]], output: str) -> None:
    """One variant: the file ``output`` (unless it is a folder); several: files in the folder ``output``."""
    if len(built) == 1 and not os.path.isdir(output) and not output.endswith(os.sep):
        targets = [(output, built[0][1])]
    else:
        os.makedirs(output, exist_ok=True)
        targets = [(os.path.join(output, file), data) for file, data in built]
    for where, data in targets:
        with open(where, "wb") as f:
            f.write(data)


def cmd_build_mlir(args: argparse.Namespace) -> int:
    """``akc build --target mlir``: MLIR modules, transform scripts, or IREE's vmfb binaries."""
    from arke.cli.build import load_kernels
    from arke.lang.render import Sources, print_diagnostics
    from arke.plan.dispatch import make_plan
    from arke.plan.variants import variants
    from arke.targets.artifact import UnsupportedError
    from arke.targets.mlir import kernel as iree

    device, arch = _options(args)
    if args.emit == "vmfb":
        try:
            iree.require_iree()
        except iree.IREEMissingError as err:
            raise _usage(str(err)) from None
        if not args.output:
            raise _usage("--emit vmfb writes binary code: give a file (or a folder, for several kernels) with -o PATH")
    loaded = load_kernels(args)
    if isinstance(loaded, int):
        return loaded
    module, names = loaded
    render = _renderer()
    text = ""
    if args.path != "-":  # load_kernels read it already; only a regular file of bounded size, never a FIFO
        text = read_source_bytes(args.path).decode("utf-8")
    texts: list[str] = []
    built: list[tuple[str, bytes]] = []
    warnings: list[Any] = []
    failed = 0
    for name in names:
        ir_name = module.kernel_map[name]
        for label, strategy in variants(module, ir_name, TARGET):
            plan = make_plan(module.semantic, ir_name, strategy, render.families)
            try:
                artifact = render.render(plan)
            except UnsupportedError as err:
                print(f"akc: `{name}` ({label}): the mlir target cannot render it yet: {err}", file=sys.stderr)
                failed += 1
                continue
            warnings += _notes(artifact, name, args.path, text)
            if args.emit == "source":
                texts.append(f"// {name} ({label})\n{artifact.source}")
            elif args.emit == "transform":
                texts.append(f"// {name} ({label})\n{artifact.meta.get('transform', '')}")
            else:
                why = iree.cuda_unsupported(plan) if device == "cuda" else None
                if why is not None:  # refused before IREE runs, as arke.build refuses it
                    print(f"akc: `{name}` ({label}): {why}", file=sys.stderr)
                    failed += 1
                    continue
                try:
                    built.append((_file_name(name, label, device, arch), iree.compile_vmfb(artifact.source, device,
                                                                                           arch)))
                except iree.IREEError as err:
                    print(f"akc: `{name}` ({label}): {err}", file=sys.stderr)
                    failed += 1
    if warnings:
        print_diagnostics(warnings, Sources({args.path: text}), sys.stderr)
    if args.emit == "vmfb":
        if built:
            _write_binaries(built, args.output)
    else:
        # one module per variant, separated as `mlir-opt --split-input-file` reads them
        out = "// -----\n".join(t if t.endswith("\n") else t + "\n" for t in texts)
        if args.output:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(out)
        else:
            sys.stdout.write(out)
    return 1 if failed else 0
