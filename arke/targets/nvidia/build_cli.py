"""``akc build --arch sm_90|sm_80 --emit ptx|cubin`` for the GPU targets that assemble PTX with ``ptxas``.

:func:`build_each` is the loop the LLVM target's GPU flavour (:mod:`arke.targets.llvm.build_cli`)
and the CUDA-C target (:mod:`arke.targets.cuda.build_cli`) share: each kernel's plan is rendered
by the target's renderer, compiled to PTX by the target's compiler and, for ``cubin``,
assembled by ``ptxas`` (no GPU needed). One PTX module (or cubin) per kernel holds an entry per
dispatch; a table of each entry's registers and spills follows, as ``--target triton`` prints.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from arke.lang.source import Span

#: The decisions that size a GPU launch (what AK4012 and AK4015 point at).
SIZING = ("tile", "stages", "warps")


def _usage(message: str) -> Exception:
    from arke.cli.app import UsageError

    return UsageError(message)


def build_each(args: argparse.Namespace, arch: str, renderer: Any, to_ptx: Callable[[str, str, Any], str],
               target: str,
               failures: tuple[type[Exception], ...]) -> int:
    """Render every kernel of ``args.path`` (or ``args.kernel``) with ``renderer``, once per strategy
    variant a call may use (``target``'s strategies, then the defaults); for ``--emit ptx|cubin``
    compile each to PTX with ``to_ptx(source, kernel, plan)`` (a failure of a kind in ``failures`` is reported
    against the kernel, and the others go on) and assemble it with ``ptxas``; write what ``--emit``
    asks for and print the registers/spills table. The exit status: 1 if a kernel failed."""
    from arke.cli.build import load_kernels
    from arke.plan.dispatch import make_plan
    from arke.plan.variants import variants
    from arke.targets.artifact import UnsupportedError
    from arke.targets.nvidia import ptx as nvptx
    from arke.targets.nvidia.cubin import CompiledEntry, resource_table
    from arke.targets.nvidia.simt import BLOCK

    if args.emit == "cubin":
        if nvptx.ptxas_path() is None:
            raise _usage("--emit cubin needs ptxas (it ships with Triton: pip install triton)")
        if not args.output:
            raise _usage("--emit cubin writes binary code: give a file or folder with -o PATH")
    loaded = load_kernels(args)
    if isinstance(loaded, int):
        return loaded
    module, names = loaded
    outputs: list[tuple[str, str, bytes]] = []  # (kernel, source or ptx, cubin)
    entries: list[CompiledEntry] = []
    failed = 0
    caught: tuple[type[Exception], ...] = (UnsupportedError, *failures)
    for name in names:
        ir_name = module.kernel_map[name]
        shapes = variants(module, ir_name, target)
        for which, (label, strategy) in enumerate(shapes):
            plan = make_plan(module.semantic, ir_name, strategy, families=renderer.families)
            called = name if len(shapes) == 1 else f"{name}.{label.replace(' ', '')}"
            try:
                artifact = renderer.render(plan)
                if args.emit == "source":
                    outputs.append((called, artifact.source, b""))
                    continue
                ptx = to_ptx(artifact.source, name, plan)
            except caught as err:
                if getattr(err, "code", None) and strategy is not None:  # a decision's value: at that decision
                    _report(err, args.path, name, target, arch, which)
                else:
                    decided = ", ".join(f"{d.kind}{' ' + d.subject if d.subject else ''}" for d in plan.decisions)
                    print(f"akc: `{name}` ({decided or 'default strategy'}): the {target} target cannot compile it "
                          f"for {arch}: {err}", file=sys.stderr)
                failed += 1
                continue
            cubin = b""
            if nvptx.ptxas_path() is not None:  # ptx alone needs no ptxas; the table then is left out
                cubin, assembled = nvptx.assemble(ptx, arch)
                warps = {spec.entry: dict(spec.options).get("block", BLOCK) // 32 for spec in artifact.launches}
                shared = {spec.entry: dict(spec.options).get("shared", 0) for spec in artifact.launches}
                stages = {spec.entry: dict(spec.options).get("stages", 1) for spec in artifact.launches}
                entries += [CompiledEntry(called, e.entry, arch, "", b"", e.registers, e.spills, e.stack,
                                          shared.get(e.entry, 0), warps.get(e.entry, BLOCK // 32),
                                          stages.get(e.entry, 1), ()) for e in assembled]
            outputs.append((called, ptx, cubin))
    _write(outputs, "cu" if args.emit == "source" else args.emit, args.output, arch)
    if entries:
        print(resource_table(entries), end="", file=sys.stdout if args.output else sys.stderr)
    return 1 if failed else 0


def decision_span(path: str, text: str, kernel: str, decisions: tuple[tuple[str, str | None], ...],
                  which: int | None = 0, target: str = "triton") -> Span:
    """Where to point AK4012/AK4015: the first sizing decision of the kernel's ``which``-th ``target`` strategy
    in the file (None: the defaults, which no strategy wrote), else that strategy block, else the kernel's name,
    else the file's first line."""
    from arke.lang.parser import parse

    tree, _ = parse(text, path)
    kinds = [k for k, _ in decisions] or list(SIZING)
    ours = [st for st in tree.strategies if st.kernel == kernel and st.target in (None, target)]
    if which is not None and which < len(ours):
        strat = ours[which]
        for d in strat.decisions:
            if d.name in kinds:
                return d.span
        return strat.kernel_span
    for k in tree.kernels:
        if k.name == kernel:
            return k.name_span
    return Span(path, 1, 1, 1, 1, 0, 0)


def _report(err: Any, path: str, kernel: str, target: str, arch: str, which: int) -> None:
    """A strategy decision the target cannot lower (AK4004) or fit on ``arch`` (AK4012), at the decision the
    message names (else the strategy's first sizing decision)."""
    from arke.lang.diagnostics import make
    from arke.lang.render import Sources, print_diagnostics
    from arke.lang.source import read_source_bytes

    text = read_source_bytes(path).decode("utf-8") if path != "-" else ""
    detail = str(getattr(err, "detail", err))
    named = tuple((k, None) for k in ("tile", "warps", "stages", "algorithm", "split") if f"{k} " in detail)
    span = decision_span(path, text, kernel, named, which, target)
    print_diagnostics([make(err.code, f"`{kernel}`: the {target} target cannot run this strategy on {arch}: {detail}",
                            span)], Sources({path: text}), sys.stderr)


def _write(outputs: list[tuple[str, str, bytes]], emit: str, output: str | None, arch: str) -> None:
    if output is None:
        sys.stdout.write("".join(ptx for _, ptx, _ in outputs))
        return
    if not outputs:  # every kernel failed, and each said why: nothing to write (nor a folder to make)
        return
    if len(outputs) == 1 and not os.path.isdir(output) and not output.endswith(os.sep):
        targets = [(outputs[0], output)]
    else:
        if os.path.exists(output) and not os.path.isdir(output):
            raise _usage(f"-o {output}: {len(outputs)} files to write, and this is a file; give a folder")
        os.makedirs(output, exist_ok=True)
        targets = [(o, os.path.join(output, f"{o[0]}.{arch}.{emit}")) for o in outputs]
    for (_, ptx, cubin), where in targets:
        if emit == "cubin":
            with open(where, "wb") as f:
                f.write(cubin)
        else:
            with open(where, "w", encoding="utf-8") as t:
                t.write(ptx)
