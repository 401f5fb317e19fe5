"""Arke: a compiler for AI operators written in the `.ak` language.

The public API is small: :func:`check`, :func:`load`, :func:`loads`, :func:`interpret` and
:func:`build` (see ``arke.api``), and :func:`load_bundle` (``arke.runtime.bundle``), which loads
an ahead-of-time bundle without the compiler. Importing ``arke`` stays cheap: each name is
imported on first use, so a process that only loads bundles never imports the compiler.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from arke.runtime.errors import DTypeError, GuardError, ShapeError

if TYPE_CHECKING:
    from arke.api import CheckError, Diagnostic, Kernel, Module, build, check, interpret, load, loads
    from arke.runtime.bundle import load_bundle

__version__ = "0.1.0"

__all__ = [
    "CheckError", "DTypeError", "Diagnostic", "GuardError", "Kernel", "Module", "ShapeError", "__version__", "build",
    "check", "interpret", "load", "load_bundle", "loads",
]

_LAZY = {"CheckError": "arke.api", "Diagnostic": "arke.api", "Kernel": "arke.api", "Module": "arke.api",
         "build": "arke.api", "check": "arke.api", "interpret": "arke.api", "load": "arke.api", "loads": "arke.api",
         "load_bundle": "arke.runtime.bundle"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'arke' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
