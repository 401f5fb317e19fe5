"""Arke: a compiler for AI operators written in the `.ak` language.

The public API is small: :func:`check`, :func:`load`, :func:`loads` and :func:`interpret`
(see ``arke.api``). Importing ``arke`` stays cheap; heavy dependencies load on first use.
"""

from arke.api import CheckError, Diagnostic, Kernel, Module, build, check, interpret, load, loads
from arke.runtime.errors import DTypeError, GuardError, ShapeError

__version__ = "0.1.0"

__all__ = [
    "CheckError", "DTypeError", "Diagnostic", "GuardError", "Kernel", "Module", "ShapeError", "__version__", "build",
    "check", "interpret", "load", "loads",
]
