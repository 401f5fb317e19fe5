"""The checker: one `.ak` file (and what it imports) from text to diagnostics and IR.

Order of work: parse → resolve imports (each imported module is checked once per
process and cached) → check every kernel's signature → check every body and lower it to
SemanticIR → check strategies → warn. A kernel with errors is left out of the IR; the
others are still checked, so one file reports all its problems at once.

Each step is a function of its own (:func:`resolve_imports`, :func:`declare_kernel`,
:func:`check_kernel`, :func:`late_checks`, :func:`finish`), so the language server can
run the same steps item by item and re-check only what an edit changed
(``arke.lsp.incremental``).
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass, field
from graphlib import CycleError, TopologicalSorter
from importlib import resources
from pathlib import Path

from arke.ir import semantic
from arke.ir.dtypes import DType
from arke.ir.strategy import Strategy, StrategySet
from arke.lang import ast
from arke.lang.diagnostics import Diagnostic, Related, did_you_mean, make
from arke.lang.exprs import BUILTINS
from arke.lang.generics import Dispatch, dispatch, merge, per_specialisation
from arke.lang.indices import IndexInfo
from arke.lang.kernels import KernelChecker
from arke.lang.parser import parse
from arke.lang.recursion import deep_recursion
from arke.lang.signatures import Signature, build_signature
from arke.lang.source import Source, Span
from arke.lang.strategies import check_strategies


@dataclass(frozen=True)
class CheckResult:
    """What checking a file produced: its diagnostics and, when it is clean, its IR.

    ``kernel_map`` maps every kernel name in scope to its function's name in the IR
    (imported kernels are qualified by their module, as ``std.nn.rmsnorm``); a generic kernel's
    specialisations are in it too, each by its own name (``linear__W_bf16``, spec §5.6).
    """

    diagnostics: tuple[Diagnostic, ...]
    semantic: semantic.Module | None = None
    strategies: StrategySet | None = None
    kernel_names: tuple[str, ...] = ()
    kernel_map: dict[str, str] = field(default_factory=dict)
    indices: dict[str, dict[str, IndexInfo]] = field(default_factory=dict)
    signatures: dict[str, Signature] = field(default_factory=dict)
    ast: ast.Module | None = None
    #: the generic kernels in scope (§5.6) by IR name: how a call picks a specialisation
    generics: dict[str, Dispatch] = field(default_factory=dict)


@dataclass(frozen=True)
class _Loaded:
    """A checked module as its importers see it."""

    signatures: dict[str, Signature]  # by plain name (the module's own kernels)
    functions: tuple[semantic.Function, ...]  # its kernels and everything they import
    strategies: StrategySet
    errors: tuple[Diagnostic, ...]
    indices: dict[str, dict[str, IndexInfo]]  # by IR name: what strategies may name


_CACHE: dict[tuple[str, str, float], _Loaded] = {}


def stdlib_path(module: str) -> Path:
    """The file of a standard-library module (``std.nn`` -> ``arke/stdlib/nn.ak``)."""
    parts = module.split(".")[1:]
    return Path(str(resources.files("arke.stdlib"))).joinpath(*parts[:-1], parts[-1] + ".ak") if parts else Path()


def _folder(importer: str) -> Path:
    """The folder a file's imports are looked up in: its own (the current one for text without a path)."""
    return Path(importer).parent if importer and not importer.startswith("<") else Path.cwd()


def _module_file(module: str, importer: str) -> Path:
    if module == "std" or module.startswith("std."):
        return stdlib_path(module)
    return _folder(importer).joinpath(*module.split(".")[:-1], module.split(".")[-1] + ".ak")


def find_module(module: str, importer: str) -> Path | None:
    """Where ``import module`` in file ``importer`` points: the stdlib for ``std.*``, else next to the
    importer; None when there is no such file or it is refused (:func:`refused_module`)."""
    path = _module_file(module, importer)
    try:
        found = path.is_file()
    except OSError:  # a name past the system's limits (ENAMETOOLONG): no such module
        return None
    return path if found and refused_module(module, importer) is None else None


def refused_module(module: str, importer: str) -> str | None:
    """Why the file ``import module`` names exists but is not imported, or None.

    Links are resolved first; what they lead to must be a regular `.ak` file inside the importing
    file's folder (resolved too). So a link (to a file, or a folder on the way) cannot make an
    import read a file elsewhere on the machine, nor a device, a FIFO or a non-`.ak` file.
    """
    if module == "std" or module.startswith("std."):
        return None
    path = _module_file(module, importer)
    if not os.path.lexists(path):
        return None
    try:
        real, root = path.resolve(strict=True), _folder(importer).resolve(strict=True)
    except (OSError, RuntimeError):  # a dangling link, or a loop of links: simply not found
        return None
    if not real.is_relative_to(root):
        return "it is a link that leads outside the importing file's folder"
    if real.suffix != ".ak":
        return "it is a link to a file that is not a `.ak` file"
    if not real.is_file():
        return "it is not a regular file"
    return None


def stdlib_modules() -> list[str]:
    root = Path(str(resources.files("arke.stdlib")))
    return sorted("std." + p.stem for p in root.glob("*.ak"))


#: The recursion limit while a file is checked (its trees are as deep as its expressions nest).
CHECK_RECURSION = 6000


def check_text(text: str, path: str, _stack: tuple[str, ...] = (), _prefix: str = "") -> CheckResult:
    """Check one file's text and what it imports; the IR is built whenever the file is clean."""
    text = text.removeprefix("\ufeff")  # a byte-order mark: not a column (editors hide it), nor a character
    collecting = gc.isenabled()
    gc.disable()  # the AST and IR hold no cycles: the collector's passes would only cost (~10%)
    try:
        with deep_recursion(CHECK_RECURSION):  # long operator chains make deep (but finite) trees
            return _check_text(text, path, _stack, _prefix)
    except RecursionError:
        end = len(text.rstrip())
        src = Source(path, text)
        return CheckResult((make("AK1006", "an expression is nested too deeply or is too long to check",
                                 src.span(0, min(end, 1)), hint="split long expressions into named steps"),))
    finally:
        if collecting:
            gc.enable()


def _check_text(text: str, path: str, _stack: tuple[str, ...], _prefix: str) -> CheckResult:
    module, diags = parse(text, path)
    source = Source(path, text)
    imported = resolve_imports(module.imports, path, diags, _stack)
    own: dict[str, Signature] = {}
    for k in module.kernels:
        if declare_kernel(k, own, diags):
            own[k.name] = build_signature(k, source, _prefix + k.name, diags)
    _specialisation_names(own, diags)
    scope = {**imported.scope, **own}  # a file's own kernels shadow imported ones
    calls: dict[str, list[tuple[str, Span]]] = {}
    own_functions: list[semantic.Function] = []
    indices = dict(imported.indices)
    for sig in own.values():
        fns, indices[sig.ir_name], calls[sig.ir_name] = check_kernel(sig, scope, imported.failed, diags)
        own_functions.extend(fns)
    strategies = late_checks(calls, module.strategies, scope, indices, diags,
                             functions=(*imported.functions, *own_functions))
    return finish(diags, imported, tuple(own), own_functions, strategies, scope, indices, module)


@dataclass(frozen=True)
class Imported:
    """What a file's imports bring into scope (:func:`resolve_imports`); ``failed``: some import failed."""

    scope: dict[str, Signature]
    functions: tuple[semantic.Function, ...]
    strategies: tuple[Strategy, ...]
    indices: dict[str, dict[str, IndexInfo]]
    failed: bool


def resolve_imports(imports: tuple[ast.Import, ...], path: str, diags: list[Diagnostic],
                    _stack: tuple[str, ...] = ()) -> Imported:
    """Check the imports of file ``path`` (each imported module once per process) and gather what they bring."""
    if not path.startswith("<") and os.path.isfile(path):
        _stack = (*_stack, str(Path(path).resolve()))  # so a cycle back to this file is reported here
    scope: dict[str, Signature] = {}
    origin: dict[str, str] = {}
    functions: list[semantic.Function] = []
    imported_strategies: list[Strategy] = []
    indices: dict[str, dict[str, IndexInfo]] = {}
    import_failed = False
    for imp in imports:
        loaded = _import(imp, path, _stack, diags)
        if loaded is None:
            import_failed = True
            continue
        names = imp.names if imp.names is not None else tuple(loaded.signatures)
        for n in names:
            if n not in loaded.signatures:
                guess = did_you_mean(n, loaded.signatures)
                diags.append(make("AK2001", f"module `{imp.module}` has no kernel `{n}`", imp.span,
                                  hint=f"did you mean `{guess}`?" if guess else None))
                continue
            if n in scope and origin[n] != imp.module:
                diags.append(make("AK2005", f"`{n}` is imported from both `{origin[n]}` and `{imp.module}`",
                                  imp.span, hint=f"import only the one you need: `from {imp.module} import ...`"))
                continue
            scope[n], origin[n] = loaded.signatures[n], imp.module
        functions.extend(loaded.functions)
        imported_strategies.extend(loaded.strategies.strategies)
        indices.update(loaded.indices)
    return Imported(scope, tuple(functions), tuple(imported_strategies), indices, import_failed)


def _specialisation_names(own: dict[str, Signature], diags: list[Diagnostic]) -> None:
    """AK2003 for a kernel named like a generic kernel's specialisation (``scaled__W_f32``): both would be one
    IR function, and calls of either would run the one defined last."""
    taken = {m.ir_name: sig.name for sig in own.values() if sig.generic is not None
             for m in sig.generic.members.values()}
    for sig in own.values():
        if sig.generic is None and sig.ir_name in taken:
            diags.append(make("AK2003", f"kernel `{sig.name}` has the name of a specialisation of the generic kernel "
                                        f"`{taken[sig.ir_name]}`", sig.node.name_span,
                              related=[Related(own[taken[sig.ir_name]].node.name_span, "the generic kernel")],
                              hint="rename the kernel"))


def declare_kernel(k: ast.Kernel, own: dict[str, Signature], diags: list[Diagnostic]) -> bool:
    """Report a kernel defined twice or named like a built-in; False for a second definition (never checked)."""
    if k.name in own:
        diags.append(make("AK2003", f"kernel `{k.name}` is defined twice", k.name_span,
                          related=[Related(own[k.name].node.name_span, "first defined here")]))
        return False
    if k.name in BUILTINS and k.name not in _BUILTIN_KERNELS_OK:
        diags.append(make("AK2003", f"kernel `{k.name}` has the name of a built-in function", k.name_span,
                          hint="rename the kernel"))
    return True


def check_kernel(sig: Signature, scope: dict[str, Signature], import_failed: bool, diags: list[Diagnostic]
                 ) -> tuple[tuple[semantic.Function, ...], dict[str, IndexInfo], list[tuple[str, Span]]]:
    """Check one kernel's body: its IR functions (none after errors; a generic kernel has one per
    specialisation, each checked, §5.6), its indices and the kernels it calls."""
    if sig.generic is None:
        one, bound, called = _check_one(sig, scope, import_failed, diags)
        return (() if one is None else (one,)), bound, called
    found: dict[tuple[DType, ...], list[Diagnostic]] = {}
    functions: list[semantic.Function | None] = []
    indices: dict[str, IndexInfo] = {}
    calls: list[tuple[str, Span]] = []
    for combo, member in sig.generic.members.items():
        found[combo] = []
        fn, bound, called = _check_one(member, scope, import_failed, found[combo])
        functions.append(fn)
        indices = indices or bound
        calls.extend(c for c in called if c not in calls)
    diags.extend(merge(sig.generic.vars, found))
    return (() if None in functions else tuple(f for f in functions if f is not None)), indices, calls


def _check_one(sig: Signature, scope: dict[str, Signature], import_failed: bool, diags: list[Diagnostic]
               ) -> tuple[semantic.Function | None, dict[str, IndexInfo], list[tuple[str, Span]]]:
    kc = KernelChecker(sig, scope, diags)
    kc.import_failed = import_failed
    try:
        fn = kc.check() if sig.ok and not sig.node.body_broken else None  # a broken body: its syntax error is reported
    except RecursionError:  # one absurdly long expression: report it, check the other kernels
        diags.append(make("AK1006", f"an expression of kernel `{sig.name}` is too long to check",
                          sig.node.name_span, hint="split long expressions into named steps"))
        fn = None
    ops = fn.ops if fn is not None else ()
    deepest = max((semantic.depth(e) for op in ops for e in semantic.op_exprs(op)), default=0)
    if deepest > MAX_EXPR_DEPTH:
        # the checker goes deeper than the passes, planners and renderers after it: what it accepts must build
        diags.append(make("AK1006", f"an expression of kernel `{sig.name}` nests {deepest} operations deep, more "
                                    f"than the {MAX_EXPR_DEPTH} the compiler takes", sig.node.name_span,
                          hint="split the long expression into statements of their own (`part[i] = ...`)"))
        fn = None
    return fn, kc.indices, kc.calls


#: The deepest expression tree a kernel may hold (a chain of n `+` is n deep; brackets stop at 200 already).
MAX_EXPR_DEPTH = 256


def late_checks(calls: dict[str, list[tuple[str, Span]]], strategies: tuple[ast.Strategy, ...],
                scope: dict[str, Signature], indices: dict[str, dict[str, IndexInfo]],
                diags: list[Diagnostic], functions: tuple[semantic.Function, ...] = ()) -> StrategySet:
    """What needs every kernel checked first: call cycles, then the strategies (their StrategyIR, and
    with the lowered ``functions`` the decisions no dispatch of their kernel honours: AK4014)."""
    _report_cycles(calls, diags)
    _report_call_depth(calls, functions, diags)
    return check_strategies(strategies, scope, indices, diags, functions)


def finish(diags: list[Diagnostic], imported: Imported, own: tuple[str, ...], own_functions: list[semantic.Function],
           strategies: StrategySet, scope: dict[str, Signature], indices: dict[str, dict[str, IndexInfo]],
           module: ast.Module) -> CheckResult:
    """The result: diagnostics deduplicated and in file order, and the IR when none is an error."""
    diags = _dedupe(diags)
    errors = any(d.is_error for d in diags)
    sem = None
    strat = None
    if not errors:
        seen: set[str] = set()
        merged = []
        for f in imported.functions + tuple(own_functions):
            if f.name not in seen:
                seen.add(f.name)
                merged.append(f)
        sem = semantic.Module(tuple(merged))
    generics = {s.ir_name: dispatch(s.generic, s.ir_name) for s in scope.values() if s.generic is not None}
    if not errors:
        strat = StrategySet(per_specialisation(imported.strategies + strategies.strategies, generics))
    kernel_map = {n: s.ir_name for n, s in scope.items()}
    for n, s in scope.items():  # each specialisation of a generic kernel by its own name, as `linear__W_bf16`
        if s.generic is not None:
            kernel_map.update((n + m.ir_name[len(s.ir_name):], m.ir_name) for m in s.generic.members.values())
    return CheckResult(tuple(diags), sem, strat, own, kernel_map, indices, scope, module, generics)


# Stdlib activation kernels may share a built-in's name: the kernel wraps the built-in.
_BUILTIN_KERNELS_OK = frozenset({"relu", "gelu", "silu", "sigmoid", "tanh", "exp", "abs"})


def _import(imp: ast.Import, importer: str, stack: tuple[str, ...], diags: list[Diagnostic]) -> _Loaded | None:
    path = find_module(imp.module, importer)
    refused = refused_module(imp.module, importer) if path is None else None
    if refused is not None:
        diags.append(make("AK2004", f"module `{imp.module}` cannot be imported: {refused}", imp.span,
                          hint="an import reads only regular `.ak` files inside the importing file's folder "
                          "(links are followed only within it); copy or move the module there"))
        return None
    if path is None:
        known = stdlib_modules()
        guess = did_you_mean(imp.module, known)
        diags.append(make("AK2004", f"module `{imp.module}` not found", imp.span,
                          hint=f"did you mean `{guess}`?" if guess else "the standard library has "
                          + ", ".join(known) if imp.module.startswith("std") else
                          f"looked for `{imp.module.replace('.', '/')}.ak` next to this file"))
        return None
    key_path = str(path.resolve())
    if key_path in stack:
        diags.append(make("AK2009", f"importing `{imp.module}` makes an import cycle", imp.span,
                          hint="move the shared kernels into a module both can import"))
        return None
    try:
        mtime = os.stat(key_path).st_mtime
        key = (key_path, imp.module, mtime)
        if key not in _CACHE:
            text = path.read_text(encoding="utf-8")
            result = check_text(text, str(path), (*stack, key_path), imp.module + ".")
            errors = tuple(d for d in result.diagnostics if d.is_error)
            sigs = {n: s for n, s in result.signatures.items() if n in result.kernel_names}
            _CACHE[key] = _Loaded(sigs, result.semantic.functions if result.semantic else (),
                                  result.strategies or StrategySet(), errors, result.indices)
    except (OSError, UnicodeDecodeError) as err:
        diags.append(make("AK2004", f"module `{imp.module}` cannot be read: {err}", imp.span))
        return None
    loaded = _CACHE[key]
    if loaded.errors:
        first = loaded.errors[0]
        diags.append(make("AK2008", f"module `{imp.module}` has {len(loaded.errors)} error"
                          f"{'s' if len(loaded.errors) > 1 else ''}", imp.span,
                          related=[Related(first.span, f"{first.code}: {first.message}")],
                          hint=f"run `akc check {path}`"))
        return None
    return loaded


def _report_cycles(calls: dict[str, list[tuple[str, Span]]], diags: list[Diagnostic]) -> None:
    """Kernels calling each other in a loop (a kernel calling itself is reported where it is checked)."""
    state: dict[str, int] = {}

    def visit(name: str) -> None:
        state[name] = 1
        for callee, span in calls.get(name, ()):
            if callee == name:
                continue
            if state.get(callee) == 1:
                diags.append(make("AK2006", f"kernels call each other in a loop ({name} → {callee})", span,
                                  hint="kernels cannot recurse"))
            elif callee in calls and callee not in state:
                visit(callee)
        state[name] = 2

    for name in calls:
        if name not in state:
            visit(name)


#: The longest chain of kernel calls a kernel may make (the inliner and the interpreter recurse along it).
MAX_CALL_DEPTH = 64


def _report_call_depth(calls: dict[str, list[tuple[str, Span]]], functions: tuple[semantic.Function, ...],
                       diags: list[Diagnostic]) -> None:
    """AK1006 at each call that makes a chain of kernel calls longer than :data:`MAX_CALL_DEPTH` (only where
    it crosses the limit: the kernels above it are follow-ons). A cycle is AK2006's."""
    callees = {f.name: {op.callee for op in f.ops if isinstance(op, semantic.CallOp)} for f in functions}
    for name, made in calls.items():
        callees.setdefault(name, set()).update(c for c, _ in made)
    try:  # callees first: a chain may be thousands of kernels long, so no recursion along it
        order = list(TopologicalSorter(callees).static_order())
    except CycleError:
        return  # AK2006 says so; a loop has no depth
    depth: dict[str, int] = {}
    for name in order:
        depth[name] = 1 + max((depth[c] for c in callees.get(name, ())), default=0)
    for made in calls.values():
        for callee, span in made:
            if depth.get(callee, 1) == MAX_CALL_DEPTH:
                diags.append(make("AK1006", f"this call makes a chain of {MAX_CALL_DEPTH + 1} kernel calls, more "
                                            f"than the {MAX_CALL_DEPTH} the compiler takes", span,
                                  hint="call fewer kernels in a chain: write several steps in one kernel"))


def _dedupe(diags: list[Diagnostic]) -> list[Diagnostic]:
    seen: set[Diagnostic] = set()
    out = []
    for d in diags:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return sorted(out, key=lambda d: (d.span.file, d.span.start, d.code))
