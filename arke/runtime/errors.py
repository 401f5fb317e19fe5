"""The errors a call of a kernel raises before (or instead of) running it.

Kept free of torch and numpy imports: ``import arke`` (and ``akc check``) must stay light.
"""

from __future__ import annotations

import re
from typing import Any

_SPECIALISED = re.compile(r"^(.+?)((?:__[A-Za-z_]\w*?_(?:f32|f16|bf16|i64|i32|i8|u8|u16|u32|bool))+)$")


def shown_kernel(name: str) -> str:
    """A kernel's name as its user wrote it: a generic kernel's specialisation ``lin__W_f32`` is `lin` (W = f32)."""
    found = _SPECIALISED.match(name)
    if found is None:
        return f"`{name}`"
    binds = [part.rsplit("_", 1) for part in found.group(2).split("__") if part]
    return f"`{found.group(1)}` ({', '.join(f'{n} = {d}' for n, d in binds)})"


class GuardError(ValueError):
    """Arguments that break a kernel's contract. The message names the kernel, parameter and rule.

    ``rule`` says which check failed (tools match on it): ``kernel`` (no such kernel),
    ``arity``, ``missing``, ``type`` (not a tensor / not a number), ``rank``, ``dtype``,
    ``scalar`` (a scalar value that does not fit), ``dim``, ``where`` (a guard), ``device``
    (tensors on different devices, an ``out=`` on the wrong one, a tensor on the meta device),
    ``size`` (a result or op whose dims overflow 64-bit sizes, a broadcast input too big to
    copy), ``threads`` (a ``threads=`` that is not a whole number from 1 to 1024), and, while
    running, ``index`` (a subscript out of range) and ``arith`` (integer division by zero,
    integer to a negative power). ``param`` is the parameter concerned, if any (``out`` and
    ``threads`` for those keywords).
    """

    def __new__(cls, kernel: str, message: str, *, rule: str, param: str | None = None) -> GuardError:
        # The rule decides the class: shape problems are ShapeError, dtype problems DTypeError,
        # so callers can catch either (or GuardError for all).
        if cls is GuardError:
            cls = _KINDS.get(rule, GuardError)
        return super().__new__(cls, message)

    def __init__(self, kernel: str, message: str, *, rule: str, param: str | None = None):
        super().__init__(f"kernel {shown_kernel(kernel)}: {message}")
        self.kernel = kernel
        self.message = message
        self.rule = rule
        self.param = param

    def __reduce__(self) -> tuple[Any, ...]:  # picklable, for worker processes
        return (_guard_error, (self.kernel, self.message, self.rule, self.param))


def _guard_error(kernel: str, message: str, rule: str, param: str | None) -> GuardError:
    return GuardError(kernel, message, rule=rule, param=param)


class ShapeError(GuardError):
    """A shape, rank, dim, `where` clause or subscript that breaks the kernel's contract."""


class DTypeError(GuardError):
    """An argument of the wrong dtype or kind (not a tensor, a scalar that does not fit)."""


_KINDS: dict[str, type[GuardError]] = {"rank": ShapeError, "dim": ShapeError, "where": ShapeError,
                                       "index": ShapeError, "size": ShapeError, "dtype": DTypeError,
                                       "type": DTypeError, "scalar": DTypeError}
