"""``akc build --target triton``: render a file's kernels for Triton and compile them ahead of time.

    akc build FILE --target triton [--arch sm_90|sm_80] [--kernel NAME] [--emit source|ptx|cubin] [-o PATH]

``source`` prints the generated Python module of each kernel; ``ptx`` and ``cubin`` compile
every launch for the architecture through ``triton.compile`` (no GPU needed), fitted
(:mod:`arke.targets.triton.fit`: a launch that spills at its default options gets other free
ones; ``AK4015`` when none fits), and print a table of registers, spills and shared memory.
A kernel is compiled for each of its triton strategies (and with the default decisions when
no strategy applies to every call). An entry that needs more than the architecture has is
reported as ``AK4012`` at the decision that sized it.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from arke.lang.diagnostics import Diagnostic, make
from arke.lang.source import read_source_bytes
from arke.targets.nvidia.build_cli import decision_span

if TYPE_CHECKING:
    from arke.targets.nvidia.cubin import CompiledEntry
    from arke.targets.triton.aot import ResourceError
    from arke.targets.triton.fit import Unfit



def _usage(message: str) -> Exception:
    from arke.cli.app import UsageError

    return UsageError(message)


def _renderer() -> Any:
    """The Triton renderer, or a usage error when this build of arke has none."""
    try:
        from arke.targets.triton import render as triton_codegen
    except ImportError as err:
        if "triton" in str(err) and "arke" not in str(err):
            raise _usage("the triton target needs Triton: pip install triton") from None
        raise _usage("the Triton renderer (arke.targets.triton.render) is not available in this build") from None
    found = getattr(triton_codegen, "RENDERER", None)
    if found is None:
        raise _usage("the Triton renderer (arke.targets.triton.render) is not available in this build")
    return found


def resource_diagnostic(err: ResourceError, path: str, text: str, kernel: str, which: int | None = 0
                        ) -> Diagnostic:
    """The AK4012 diagnostic of an entry that needs more than its architecture has (``which``: the variant's
    strategy, as :func:`decision_span` takes it)."""
    e = err.entry
    span = decision_span(path, text, kernel, err.decisions, which)
    opts = ", ".join(f"{k} = {v}" for k, v in e.options)
    unit = " bytes" if err.what == "shared memory" else ""
    hint = ("smaller tiles or fewer stages" if err.what == "shared memory" else "smaller tiles or fewer warps")
    return make("AK4012", f"`{kernel}` needs {err.need}{unit} of {err.what} per block on {e.arch}, which has "
                          f"{err.limit}{unit} (entry `{e.entry}`: {opts})", span,
                hint=f"{hint} fit; a strategy with a `when` condition can keep these tiles for another GPU")


def spill_diagnostic(unfit: Unfit, path: str, text: str, kernel: str, which: int | None = 0) -> Diagnostic:
    """The AK4015 warning of a launch that spills at every configuration the fit tried: at the decision of the
    ``which``-th strategy that fixed its blocks, warps or stages (else that strategy, else the kernel's name)."""
    kinds = {"num_warps": "warps", "num_stages": "stages"}
    decisions = tuple((k, None) for k in dict.fromkeys(kinds.get(f, "tile") for f in unfit.fixed))
    return make("AK4015", unfit.message(), decision_span(path, text, kernel, decisions, which), hint=unfit.hint())


def _write_compiled(entries: list[CompiledEntry], emit: str, output: str | None) -> None:
    if output is None:
        if emit == "cubin":
            raise _usage("--emit cubin writes binary code: give a file or folder with -o PATH")
        sys.stdout.write("".join(e.ptx for e in entries))
        return
    if len(entries) == 1 and not os.path.isdir(output) and not output.endswith(os.sep):
        targets = [(entries[0], output)]
    else:
        os.makedirs(output, exist_ok=True)
        targets = [(e, os.path.join(output, f"{e.kernel}.{e.entry}.{e.arch}.{emit}")) for e in entries]
    for e, where in targets:
        if emit == "cubin":
            with open(where, "wb") as f:
                f.write(e.cubin)
        else:
            with open(where, "w", encoding="utf-8") as t:
                t.write(e.ptx)


def cmd_build_triton(args: argparse.Namespace) -> int:
    """``akc build --target triton``: the module source, or PTX/cubin with a resource table."""
    from arke.cli.build import load_kernels
    from arke.lang.render import Sources, print_diagnostics
    from arke.plan.variants import variants
    from arke.targets.artifact import UnsupportedError
    from arke.targets.triton import TARGET

    if args.emit not in ("source", "ptx", "cubin"):
        raise _usage(f"--emit {args.emit} is for the llvm target; the triton target emits source, ptx or cubin")
    from arke.targets.nvidia import cubin
    from arke.targets.triton import aot as triton_aot
    from arke.targets.triton.fit import fit_plan

    try:
        cubin.arch_of(args.arch)
        if args.emit != "source":
            triton_aot.require_triton()
    except (ValueError, cubin.TritonMissingError) as err:
        raise _usage(str(err)) from None
    loaded = load_kernels(args)
    if isinstance(loaded, int):
        return loaded
    module, names = loaded
    render = _renderer()
    texts: list[str] = []
    entries: list[CompiledEntry] = []
    failed = 0
    text = ""
    if args.path != "-":  # load_kernels read it already; only a regular file of bounded size, never a FIFO
        text = read_source_bytes(args.path).decode("utf-8")
    for name in names:
        ir_name = module.kernel_map[name]
        for which, (label, strategy) in enumerate(variants(module, ir_name, "triton")):
            at = which if strategy is not None else None  # the defaults: the kernel's name
            plan = TARGET.plan(module.semantic, ir_name, strategy)
            try:
                artifact = render.render(plan)
            except UnsupportedError as err:
                print(f"akc: `{name}` ({label}): the triton target cannot render it yet: {err}", file=sys.stderr)
                failed += 1
                continue
            if args.emit == "source":
                texts.append(f"# ---- {name} ({label})\n{artifact.source}")
                continue
            try:
                fitted = fit_plan(plan, [args.arch], render)
            except triton_aot.ResourceError as err:
                print_diagnostics([resource_diagnostic(err, args.path, text, name, at)], Sources({args.path: text}),
                                  sys.stderr)
                failed += 1
                continue
            entries += fitted.entries
            spills = [spill_diagnostic(u, args.path, text, name, at) for u in fitted.unfit]
            print_diagnostics(spills, Sources({args.path: text}), sys.stderr)
    if args.emit == "source":
        out = "\n".join(texts)
        if args.output:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(out)
        else:
            sys.stdout.write(out)
    elif entries:
        _write_compiled(entries, args.emit, args.output)
        print(cubin.resource_table(entries), end="", file=sys.stdout if args.output else sys.stderr)
    return 1 if failed else 0
