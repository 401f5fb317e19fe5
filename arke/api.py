"""The Python API: check, load and interpret `.ak` programs.

>>> import arke
>>> diags = arke.check("examples/rmsnorm.ak")          # [] when clean
>>> mod = arke.load("examples/rmsnorm.ak")             # raises arke.CheckError on errors
>>> y = arke.interpret(mod.kernels["rmsnorm"], x, w)   # the reference interpreter

Nothing here imports torch or llvmlite at import time: ``akc check`` must start fast.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from arke.lang.diagnostics import CheckError, Diagnostic, make

if TYPE_CHECKING:
    from arke.ir import semantic
    from arke.ir.strategy import StrategySet
    from arke.lang.generics import Dispatch


@dataclass(frozen=True)
class Kernel:
    """A checked kernel of a loaded module; call it (or :func:`interpret` it) to run the reference."""

    name: str
    module: Module = field(repr=False, compare=False)

    @property
    def function(self) -> semantic.Function:
        """The kernel's SemanticIR (a generic kernel has one per specialisation: see :meth:`specialise`)."""
        if self.name in self.module.generics:
            g = self.module.generics[self.name]
            raise TypeError(f"kernel `{self.name}` is generic ({g.constraint()}): pick a specialisation with "
                            f".specialise({g.vars[0][0]}=...)")
        return self.module.semantic.get(self.name)

    @property
    def generic(self) -> Dispatch | None:
        """How calls of a generic kernel (language spec §5.6) pick their specialisation; None if it is not one."""
        return self.module.generics.get(self.name)

    def specialise(self, **dtypes: str) -> Kernel:
        """The specialisation of a generic kernel for these dtypes (``W="bf16"``); a ValueError names the sets."""
        from arke.lang.generics import by_names

        return Kernel(by_names(self.module.generics, self.name, dtypes), self.module)

    def bound(self, *arrays: Any, **scalars: Any) -> Kernel:
        """The kernel these arguments call: a generic kernel's specialisation that their dtypes bind (a
        GuardError naming the set for a dtype outside it); any other kernel itself."""
        if self.name not in self.module.generics:
            return self
        from arke.runtime.generics import pick

        return Kernel(pick(self.module.generics[self.name], arrays, scalars), self.module)

    def __call__(self, *arrays: Any, **scalars: Any) -> Any:
        return interpret(self, *arrays, **scalars)


@dataclass(frozen=True)
class Module:
    """A checked `.ak` file: its kernels (imported ones included), SemanticIR and strategies."""

    path: str
    semantic: semantic.Module
    strategies: StrategySet
    names: tuple[str, ...]  # the kernels this file defines, in order
    kernel_map: dict[str, str] = field(default_factory=dict)  # name in scope -> IR function name
    warnings: tuple[Diagnostic, ...] = ()
    generics: dict[str, Dispatch] = field(default_factory=dict)  # generic kernels (§5.6) by IR name

    @property
    def kernels(self) -> dict[str, Kernel]:
        """Every kernel in scope in this module, by name: the file's own and the imported ones."""
        return {name: Kernel(ir_name, self) for name, ir_name in self.kernel_map.items()}


def _read(source_or_path: str | os.PathLike[str]) -> tuple[str, str] | Diagnostic:
    """(text, path) of a file path or of source text given directly."""
    if isinstance(source_or_path, os.PathLike) or (
        isinstance(source_or_path, str) and "\n" not in source_or_path and source_or_path.endswith(".ak")
    ):
        path = os.fspath(source_or_path)
        return read_file(path)
    return str(source_or_path), "<input>"


def read_file(path: str) -> tuple[str, str] | Diagnostic:
    """The text of a `.ak` file, or a diagnostic saying why it cannot be read.

    Only a regular file (a link is followed) of at most :data:`arke.lang.source.MAX_SOURCE_BYTES`
    is read: a FIFO, a device or a larger file is AK1004 too, and never blocks.
    """
    from arke.lang.source import NO_SPAN, Span, read_source_bytes

    span = Span(path, 1, 1, 1, 1, 0, 0) if path else NO_SPAN
    try:
        data = read_source_bytes(path)
    except OSError as err:
        return make("AK1004", f"cannot read `{path}`: {err.strerror or err}", span,
                    hint=getattr(err, "hint", "check the path and its permissions"))
    return decode_source(data, path, f"`{path}`")


def decode_source(data: bytes, name: str, what: str) -> tuple[str, str] | Diagnostic:
    """(text, name) of UTF-8 source bytes, or AK1004 saying where the first bad byte is."""
    from arke.lang.source import Span

    try:
        return data.decode("utf-8"), name
    except UnicodeDecodeError as err:
        # the bytes before the first bad one are text: lines and columns in characters, as the checker counts
        # them (any line end; a byte-order mark is no column)
        before = data[: err.start].decode("utf-8").removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
        line = before.count("\n") + 1
        col = len(before) - (before.rfind("\n") + 1) + 1
        return make("AK1004", f"{what} is not UTF-8 text (byte {err.start})",
                    Span(name, line, col, line, col + 1, 0, 0), hint="save it as UTF-8")


def check(source_or_path: str | os.PathLike[str], *, path: str | None = None) -> list[Diagnostic]:
    """All diagnostics of a program (errors and warnings), sorted by position; ``[]`` when clean.

    ``source_or_path`` is a path to a `.ak` file or the source text itself (then ``path``
    names it in messages). Never raises for bad input.
    """
    from arke.lang.checker import check_text

    read = _read(source_or_path)
    if isinstance(read, Diagnostic):
        return [read]
    text, name = read
    result = check_text(text, path or name)
    return list(result.diagnostics)


def loads(text: str, path: str = "<input>") -> Module:
    """Check and lower source text; raises :class:`CheckError` when it has errors."""
    from arke.lang.checker import check_text

    result = check_text(text, path)
    errors = [d for d in result.diagnostics if d.is_error]
    if errors or result.semantic is None or result.strategies is None:
        raise CheckError(result.diagnostics)
    return Module(path, result.semantic, result.strategies, result.kernel_names, dict(result.kernel_map),
                  tuple(d for d in result.diagnostics if not d.is_error), dict(result.generics))


def load(path: str | os.PathLike[str]) -> Module:
    """Check and lower a `.ak` file; raises :class:`CheckError` with every diagnostic when it has errors."""
    read = read_file(os.fspath(path))
    if isinstance(read, Diagnostic):
        if isinstance(path, str) and ("{" in path or "\n" in path) and not os.path.exists(path):
            read = dataclasses.replace(read, message="cannot read a file named by this text: it looks like `.ak` "
                                                     "source, not a path", hint="pass source text through "
                                                     "`arke.loads(text)`, as in `arke.build(arke.loads(text))`")
        raise CheckError([read])
    return loads(*read)


def interpret(kernel: Kernel, *arrays: Any, **scalars: Any) -> Any:
    """Run ``kernel`` on the reference interpreter (the oracle every target is tested against).

    Tensors may be NumPy arrays or torch tensors (bf16/f16 need torch); scalar parameters
    are given by position or by name, and take their defaults when left out. Returns one
    result (or a tuple for several outputs) of the inputs' kind.
    """
    from arke.runtime.interp import run

    name = kernel.name
    if name in kernel.module.generics:  # bound by the arguments' dtypes, checked before anything runs
        from arke.runtime.generics import pick

        name = pick(kernel.module.generics[name], arrays, scalars)
    return run(kernel.module.semantic, name, arrays, scalars)


def build(path_or_module: str | os.PathLike[str] | Module, target: str = "llvm", threads: int | None = None,
          device: str = "cpu", arch: str | None = None, tuning: str = "on") -> Any:
    """Compile a module (or a `.ak` file) for ``target``: a Library of callable kernels.

    ``lib.rmsnorm(x, w)`` takes NumPy arrays or torch CPU tensors (zero-copy when contiguous)
    and returns the same kind; shapes, dtypes and `where` clauses are checked before any
    kernel runs. Kernels compile on first use, through the on-disk cache. ``threads``: the
    worker team's size (default: every core; results do not depend on it). ``device``: for
    ``target="mlir"`` (kernels compiled by IREE), ``"cpu"`` (default) or ``"cuda"`` (an NVIDIA
    GPU); the other targets take only ``"cpu"``. ``target="cuda"`` runs CUDA C on an NVIDIA GPU
    (``arch`` defaults to the device's); ``target="llvm", arch="sm_90"`` runs the LLVM target's
    GPU flavour there. Without a GPU both are a clear error; ``akc build --emit ptx|cubin`` still
    compiles them. ``tuning``: ``"on"`` (default) runs a kernel that has no strategy for the target
    with the one ``akc tune`` confirmed for this machine and the call's dims bucket, if any;
    ``"off"`` always runs the defaults. An explicit ``@strategy`` always wins.
    """
    from arke.library import Library

    module = path_or_module if isinstance(path_or_module, Module) else load(path_or_module)
    return Library(module, target, threads, device, arch, tuning)


__all__ = ["CheckError", "Diagnostic", "Kernel", "Module", "build", "check", "interpret", "load", "loads"]
