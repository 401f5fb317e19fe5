"""``akc build`` and ``akc run``: compile a file's kernels for a target, and run one on random inputs.

    akc build FILE --target llvm [--kernel NAME] [--emit source|asm|obj] [-o PATH]
    akc build FILE --target llvm --arch sm_90|sm_80 [--kernel NAME] [--emit source|ptx|cubin] [-o PATH]
    akc build FILE --target triton [--arch sm_90|sm_80] [--kernel NAME] [--emit source|ptx|cubin] [-o PATH]
    akc build FILE --target cuda [--arch sm_90|sm_80] [--kernel NAME] [--emit source|ptx|cubin] [-o PATH]
    akc build FILE --target mlir [--device cpu|cuda] [--arch sm_80] [--kernel NAME]
                   [--emit source|transform|vmfb] [-o PATH]
    akc build FILE --target T --explain [--kernel NAME] [--arch A] [--dims M=128,N=4097]
    akc run FILE KERNEL --dims M=128,N=4097 [--threads N] [--repeat R]

``build --target triton`` needs no GPU: ``ptx``/``cubin`` compile through ``triton.compile`` for
the architecture and print each entry's registers, spills and shared memory; a strategy whose
tiles need more than the architecture has is error ``AK4012`` at the decision that set them.
``build --target mlir`` (see :mod:`arke.targets.mlir.build_cli`) writes MLIR, transform scripts, or IREE's
``.vmfb`` for the CPU or a CUDA architecture (no GPU needed).
``run`` makes random inputs from the kernel's signature and the dims, runs the compiled
kernel and the reference interpreter, and prints the largest difference and the times.

A strategy decision that no dispatch of its kernel honours on the target is warning ``AK4014``:
``akc check`` (so every build) reports what the plan alone shows, and ``build``/``run`` add what
only the target and architecture show (a strategy for every target, the llvm GPU flavour), at the
decision. ``build --explain`` prints each kernel's dispatches per strategy variant instead of
building: family, ops, the decisions applied and dropped (with why), and what each dispatch takes
(values too for the dims given with ``--dims``).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from typing import Any

EMITS = ("source", "asm", "obj", "ptx", "cubin", "transform", "vmfb")


def add_commands(sub: Any) -> None:
    """Register the subcommands on ``akc``'s subparsers."""
    build = sub.add_parser("build", help="compile a .ak file's kernels for a target",
                           description="Compile kernels and write what the target made.")
    build.add_argument("path", metavar="FILE")
    build.add_argument("--target", default="llvm", help="the target (default: llvm)")
    build.add_argument("--kernel", action="append",
                       help="only this kernel (default: every kernel the file defines); with --bundle, repeat it "
                            "for several")
    build.add_argument("--bundle", metavar="DIR", default=None,
                       help="llvm: build an ahead-of-time bundle in DIR (a shared library with every strategy "
                            "variant, its C header and manifest.json), loaded by arke.load_bundle or from C")
    build.add_argument("--cpu", default=None, help="with --bundle: the CPU to build for (default: this host), e.g. "
                       "x86-64-v3, sapphirerapids, znver4, neoverse-n1, neoverse-v1")
    build.add_argument("--triple", default=None, help="with --bundle: the target triple (default: the CPU's), e.g. "
                       "aarch64-linux-gnu")
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
    build.add_argument("--explain", action="store_true",
                       help="build nothing: print each dispatch of each strategy variant, with the decisions "
                            "applied and dropped (and why) and what it takes")
    build.add_argument("--dims", default="", help="with --explain: dim values (M=128,N=4097) for legal values")
    build.add_argument("--dtypes", default="", help="a generic kernel's dtypes (W=bf16,Q=i8); without them every "
                       "specialisation is built, each named like linear__W_bf16")
    build.set_defaults(handler=cmd_build)

    run = sub.add_parser("run", help="run a kernel on random inputs and compare it with the interpreter",
                         description="Run KERNEL of FILE on random inputs of the given dims.")
    run.add_argument("path", metavar="FILE")
    run.add_argument("kernel", metavar="KERNEL")
    run.add_argument("--dims", default="", help="dim values, as M=128,N=4097")
    run.add_argument("--dtypes", default="", help="a generic kernel's dtypes, as W=bf16")
    run.add_argument("--target", default="llvm")
    run.add_argument("--threads", type=int, default=None)
    run.add_argument("--repeat", type=int, default=5, help="timed runs (the median is shown)")
    run.add_argument("--seed", type=int, default=0)
    run.set_defaults(handler=cmd_run)


def _usage(message: str) -> Exception:
    from arke.cli.app import UsageError

    return UsageError(message)


#: (target, arch, kernel) of the ``akc build``/``run`` in progress: whose build-time AK4014 warnings
#: :func:`report_downgrades` prints when the target's command loads the file
_BUILDING: list[tuple[str, str | None, str | None]] = []


def _library(path: str, target: str, dtypes: str = "") -> Any:
    from arke.cli.app import load_or_report
    from arke.library import Library
    from arke.targets import base as targets

    module = load_or_report(path)
    if isinstance(module, int):
        return module
    module = specialised(module, parse_dtypes(dtypes))
    report_downgrades(module, path)
    try:
        why = targets.get(target).unavailable()
    except ValueError as err:
        raise _usage(str(err)) from None
    if why is not None:
        raise _usage(f"target `{target}` cannot run here: {why}")
    return Library(module, target, None)


def cmd_build(args: argparse.Namespace) -> int:
    """``akc build``: hand the file to the target's own build command (through the registry)."""
    from arke.targets import base as targets

    try:
        target = targets.get(args.target)
    except ValueError as err:
        raise _usage(str(err)) from None
    kernels = [args.kernel] if isinstance(args.kernel, str) else list(args.kernel or [])
    if getattr(args, "bundle", None) is None:
        if getattr(args, "cpu", None) or getattr(args, "triple", None):
            raise _usage("--cpu and --triple are for bundles: add --bundle DIR")
        if len(kernels) > 1:
            raise _usage("--kernel names one kernel, except with --bundle")
        args.kernel = kernels[0] if kernels else None
    else:
        if args.emit != "source" or args.output or args.explain:
            raise _usage("--bundle DIR writes the whole bundle there: leave out --emit, -o and --explain")
        return _reporting(args.target, None, None, lambda: target.bundle_command(args, kernels))
    if args.emit not in target.emits:
        raise _usage(f"--emit {args.emit} is for --target {' or '.join(targets.for_emit(args.emit))}; the "
                     f"{target.name} target emits {', '.join(target.emits)}")
    device = getattr(args, "device", "cpu")
    if device != "cpu":
        takers = []
        for other in targets.all_targets():
            try:
                other.check_options(device, None)
                takers.append(other.name)
            except ValueError:
                continue
        if target.name not in takers:
            raise _usage(f"--device {device} is for --target {' or '.join(takers)}")
    if getattr(args, "explain", False):
        return cmd_explain(args, target)
    return _reporting(args.target, args.arch, args.kernel, lambda: target.build_command(args))


def _reporting(target: str, arch: str | None, kernel: str | None, run: Any) -> int:
    """Run a build command that prints its AK4014 warnings as diagnostics (:func:`report_downgrades`),
    not as Python warnings too."""
    from arke.targets.downgrades import StrategyDowngradeWarning

    _BUILDING.append((target, arch, kernel))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", StrategyDowngradeWarning)
            status: int = run()
            return status
    finally:
        _BUILDING.pop()


def report_downgrades(module: Any, path: str) -> None:
    """Print (to stderr) the AK4014 warnings the build in progress adds to the check's: the decisions no
    dispatch honours on its target and architecture that ``akc check`` could not know. A target that
    reports what it cannot express itself (mlir: AK4013) adds none."""
    if not _BUILDING:
        return
    from arke.lang.diagnostics import make
    from arke.lang.render import Sources, print_diagnostics
    from arke.lang.strategies import decision_span
    from arke.targets import base as targets
    from arke.targets import downgrades

    name, arch, kernel = _BUILDING[-1]
    try:
        target = targets.get(name)
    except ValueError:
        return
    if target.reports_unexpressed:
        return
    text, blocks = _strategy_blocks(path)
    diags = []
    for n in [kernel] if kernel else list(module.names):
        ir_name = module.kernel_map.get(n)
        if ir_name is None:
            continue
        own = [b for b in blocks if b.kernel == n]
        mine = [s for s in module.strategies.strategies if s.kernel == ir_name]
        placed = dict(zip(map(id, mine[len(mine) - len(own):]), own)) if len(own) <= len(mine) else {}
        for s in module.strategies.for_kernel(ir_name, target.name):
            for g in downgrades.build_time(target, module.semantic, ir_name, s, arch, n):
                block = placed.get(id(s))
                if block is None:
                    print(f"akc: warning[{downgrades.CODE}]: {g.message()}", file=sys.stderr)
                    continue
                diags.append(make(downgrades.CODE, g.message(), decision_span(block, g.decision), hint=g.hint))
    if diags:
        print_diagnostics(diags, Sources({path: text}), sys.stderr)


def _strategy_blocks(path: str) -> tuple[str, list[Any]]:
    """The text of ``path`` and its ``@strategy`` blocks (none for stdin, read already)."""
    from arke.lang.parser import parse
    from arke.lang.source import read_source_bytes

    if path == "-":
        return "", []
    try:
        text = read_source_bytes(path).decode("utf-8")  # a regular file of bounded size: never a FIFO
    except (OSError, UnicodeDecodeError):
        return "", []
    tree, _ = parse(text, path)
    return text, list(tree.strategies)


def cmd_explain(args: argparse.Namespace, target: Any) -> int:
    """``akc build --explain``: each kernel's dispatches per strategy variant, with the decisions applied
    and dropped (and why) and what each takes; builds nothing."""
    from arke.targets.downgrades import explain

    arch = None
    if args.arch is not None and target.takes_arch:
        try:
            arch = target.check_options("cpu", args.arch)
        except ValueError as err:
            raise _usage(str(err)) from None
    dims = parse_dims(args.dims) if args.dims else None
    loaded = _module_and_names(args)
    if isinstance(loaded, int):
        return loaded
    module, names = loaded
    parts = []
    for n in names:
        ir_name = module.kernel_map[n]
        parts.append(explain(target, module.semantic, ir_name, module.strategies.for_kernel(ir_name, target.name),
                             n, arch, dims))
    sys.stdout.write("\n".join(parts))
    sys.stdout.flush()
    return 0


def load_kernels(args: argparse.Namespace) -> tuple[Any, list[str]] | int:
    """The checked module of ``args.path`` and the kernels to build (``--kernel``, else every kernel
    the file defines); the exit status instead when the file has errors (already reported)."""
    loaded = _module_and_names(args)
    if not isinstance(loaded, int):
        report_downgrades(loaded[0], args.path)
    return loaded


def _module_and_names(args: argparse.Namespace) -> tuple[Any, list[str]] | int:
    """The checked module of ``args.path`` and ``--kernel`` (else every kernel the file defines); the
    exit status instead when the file has errors (already reported)."""
    from arke.cli.app import load_or_report

    module = load_or_report(args.path)
    if isinstance(module, int):
        return module
    module = specialised(module, parse_dtypes(getattr(args, "dtypes", "")))
    return module, chosen_kernels(module, args.kernel, args.path)


def chosen_kernels(module: Any, kernel: str | None, path: str) -> list[str]:
    """The kernels a build command makes: ``kernel`` (a generic one: each specialisation it stands for, as
    :func:`specialised` named them), else every kernel the file defines; a usage error for an unknown name."""
    names = [kernel] if kernel else list(module.names)
    if kernel and kernel not in module.names:
        names = [n for n in module.names if n.startswith(kernel + "__")] or names
    for n in names:
        if n not in module.kernel_map:
            raise _usage(f"`{path}` has no kernel `{n}`; it has: {', '.join(module.kernel_map)}")
    return names


def parse_dtypes(text: str) -> dict[str, str]:
    """``--dtypes W=bf16,Q=i8`` as a dict (a usage error for anything else)."""
    from arke.ir.dtypes import DTYPES

    found: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if not name.strip().isidentifier() or value.strip() not in DTYPES:
            raise _usage(f"--dtypes takes NAME=DTYPE pairs, as W=bf16 (dtypes: {', '.join(DTYPES)}); not `{part}`")
        found[name.strip()] = value.strip()
    return found


def specialised(module: Any, dtypes: dict[str, str]) -> Any:
    """``module`` as the build commands see it (language spec §5.6): each generic kernel the file defines
    stands for the specialisation ``dtypes`` pick (under its own name), or, where they do not give every
    variable, for each specialisation that agrees with them (named like ``linear__W_bf16``)."""
    from dataclasses import replace

    used: set[str] = set()
    names: list[str] = []
    kernel_map = dict(module.kernel_map)
    for n in module.names:
        g = module.generics.get(module.kernel_map[n])
        if g is None:
            names.append(n)
            continue
        given = {v: dtypes[v] for v, _, _, _ in g.vars if v in dtypes}
        used |= set(given)
        for v, value in given.items():
            members = next(ds for name, _, _, ds in g.vars if name == v)
            if value not in {str(d) for d in members}:
                raise _usage(f"--dtypes {v}={value}: `{v}` of kernel `{n}` is one of "
                             f"{', '.join(map(str, members))}")
        picked = [(c, ir) for c, ir in g.members
                  if all(str(d) == given.get(v, str(d)) for (v, _, _, _), d in zip(g.vars, c))]
        if len(given) == len(g.vars):
            kernel_map[n] = picked[0][1]
            names.append(n)
            continue
        for c, ir in picked:
            label = n + "".join(f"__{v}_{d}" for (v, _, _, _), d in zip(g.vars, c))
            kernel_map[label] = ir
            names.append(label)
    unknown = sorted(set(dtypes) - used)
    if unknown:
        raise _usage(f"--dtypes {', '.join(unknown)}: no generic kernel of the file has "
                     f"{'this dtype variable' if len(unknown) == 1 else 'these dtype variables'}")
    return replace(module, names=tuple(names), kernel_map=kernel_map)


def parse_dims(text: str) -> dict[str, int]:
    dims: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        value = value.strip()
        if not name.isidentifier() or not (value.isascii() and value.isdigit()) or not 1 <= int(value) < 2 ** 63:
            raise _usage(f"--dims takes NAME=VALUE pairs with positive values below 2**63, as M=128,N=4097; "
                         f"not `{part}`")
        if name in dims:
            raise _usage(f"--dims gives {name} twice ({name}={dims[name]} and `{part}`): give each dim once")
        dims[name] = int(value)
    return dims


def random_inputs(fn: Any, dims: dict[str, int], seed: int) -> list[Any]:
    """Random tensors for a kernel's parameters (integer tensors are small non-negative values)."""
    import torch

    from arke.ir.shapes import evaluate
    from arke.runtime.guards import TORCH_DTYPES, dim_params

    g = torch.Generator().manual_seed(seed)
    out = []
    as_dims = dim_params(fn)
    for p in fn.params:
        if p.name in as_dims:  # a dim parameter: its value comes with --dims (or is its default)
            if p.name not in dims and p.default is None:
                raise _usage(f"give the dim parameter `{p.name}` with --dims ({p.name}=...)")
            out.append(dims.get(p.name, p.default))
            continue
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
    return _reporting(args.target, None, args.kernel, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    import torch

    from arke.runtime.guards import GuardError

    lib = _library(args.path, args.target, args.dtypes)
    if isinstance(lib, int):
        return lib
    if args.kernel not in lib.kernels:
        raise _usage(f"`{args.path}` has no kernel `{args.kernel}`; it has: {', '.join(lib.kernels)}")
    kernel = lib.kernels[args.kernel]
    if not hasattr(kernel, "function"):  # a generic kernel: one specialisation runs, which --dtypes picks
        raise _usage(f"`{args.kernel}` is generic ({kernel.generic.constraint()}): pick its dtypes with --dtypes, "
                     f"as in --dtypes {kernel.generic.vars[0][0]}={kernel.generic.vars[0][3][0]}")
    fn = kernel.function
    if args.repeat < 1 or (args.threads is not None and args.threads < 1):
        raise _usage("--repeat and --threads take positive whole numbers")
    from arke.tune.search import checked_dims

    try:  # every dim of the kernel, each once, none it lacks, its `where` clauses kept
        dims = checked_dims(fn, args.kernel, parse_dims(args.dims))
    except ValueError as err:
        raise _usage(str(err)) from None
    try:
        inputs = random_inputs(fn, dims, args.seed)
    except (RuntimeError, MemoryError) as err:  # torch's allocator: "can't allocate memory"
        raise _usage(f"--dims {args.dims}: the inputs do not fit in this machine's memory "
                     f"({str(err).splitlines()[0][:160]}); give smaller dims") from None
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
    # a kernel of scalars alone gives NumPy values: compared as tensors too
    got_t = tuple(torch.as_tensor(x) for x in (got if isinstance(got, tuple) else (got,)))
    want_t = tuple(torch.as_tensor(x) for x in (want if isinstance(want, tuple) else (want,)))
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
