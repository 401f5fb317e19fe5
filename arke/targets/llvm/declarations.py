"""The top-level lines of one LLVM module, one per symbol, and the one spelling of each intrinsic.

Every emitter of a module (the contraction, attention, rows and generic ones, and the vector
helpers they share) asks for the declarations and helper definitions it uses; a kernel of
several dispatches (an attention core followed by a contraction over its output, say) asks for
the same intrinsic from several emitters. LLVM refuses a second declaration of a function, so
the module keeps one line per symbol (:class:`Declarations`), and the intrinsics two emitters
share are spelled here, once (:func:`masked_load`, :func:`masked_store`, :func:`vector_fma`):
two spellings of one intrinsic (LLVM 22's ``masked.load`` without the alignment operand next to
the older form with it) were once emitted side by side and made the module unparsable.

A second, different line for a symbol already declared is an internal error raised when the
module is rendered, naming both lines: it cannot reach LLVM's parser as a redefinition.
"""

from __future__ import annotations

import re

# ``declare <type> @name(`` / ``define internal <type> @"name"(`` / ``@name = ...`` / ``!7 = ...``
_FUNCTION = re.compile(r'^\s*(?:declare|define)\b[^@]*@("[^"]+"|[\w.$-]+)\s*\(')
_GLOBAL = re.compile(r'^\s*(@"[^"]+"|@[\w.$-]+|![\w.$-]+)\s*=')


def symbol(text: str) -> str:
    """The symbol a top-level line declares or defines: ``@name`` (functions, globals) or ``!id``
    (metadata); a line that names none is its own key."""
    m = _FUNCTION.match(text)
    if m is not None:
        return "@" + m.group(1).strip('"')
    m = _GLOBAL.match(text)
    if m is not None:
        return m.group(1).replace('"', "")
    return text


class Declarations:
    """The declarations and helper definitions of one module, in first-use order, one per symbol.

    Call it with a line (``declare ...``, ``define internal ...``, ``!7 = ...``) as the emitters'
    ``declare`` callback; asking again for the same line adds nothing; asking for a different line
    for a symbol already present raises :class:`ValueError`.
    """

    def __init__(self) -> None:
        self._lines: dict[str, str] = {}

    def __call__(self, text: str) -> None:
        key = symbol(text)
        have = self._lines.setdefault(key, text)
        if have != text:
            raise ValueError(f"two different top-level lines for {key} in one LLVM module:\n  {have}\n  {text}")

    def __contains__(self, key: str) -> bool:
        return key in self._lines

    def lines(self) -> list[str]:
        """The lines, in the order they were first asked for."""
        return list(self._lines.values())


# ---------------------------------------------------------------- intrinsics several emitters use


def masked_load(lanes: int, elem: str) -> tuple[str, str]:
    """``llvm.masked.load`` of ``lanes`` values of LLVM type ``elem``: (the callee, its declaration).

    LLVM 22's form: ``(ptr, <n x i1> mask, <n x T> passthru)``; the alignment is a parameter
    attribute at the call (``ptr align 4 %p``), not an operand.
    """
    vt, mt = f"<{lanes} x {elem}>", f"<{lanes} x i1>"
    name = f"@llvm.masked.load.v{lanes}{_suffix(elem)}.p0"
    return name, f"declare {vt} {name}(ptr, {mt}, {vt})"


def masked_load_call(lanes: int, elem: str, ptr: str, mask: str, align: int) -> str:
    """The right-hand side of a masked load from ``ptr`` (lanes off in ``mask`` read nothing, give 0)."""
    vt, mt = f"<{lanes} x {elem}>", f"<{lanes} x i1>"
    name, _ = masked_load(lanes, elem)
    return f"call {vt} {name}(ptr align {align} {ptr}, {mt} {mask}, {vt} zeroinitializer)"


def masked_store(lanes: int, elem: str) -> tuple[str, str]:
    """``llvm.masked.store`` of ``lanes`` values of ``elem``: (the callee, its declaration)."""
    vt, mt = f"<{lanes} x {elem}>", f"<{lanes} x i1>"
    name = f"@llvm.masked.store.v{lanes}{_suffix(elem)}.p0"
    return name, f"declare void {name}({vt}, ptr, {mt})"


def vector_fma(lanes: int) -> tuple[str, str]:
    """``llvm.fma`` on ``<lanes x float>``: (the callee, its declaration)."""
    vt = f"<{lanes} x float>"
    name = f"@llvm.fma.v{lanes}f32"
    return name, f"declare {vt} {name}({vt}, {vt}, {vt})"


def prefetch(ptr: str) -> tuple[str, str]:
    """``llvm.prefetch`` of the line at ``ptr`` for reading, into every cache level: (the call, its declaration)."""
    return (f"call void @llvm.prefetch.p0(ptr {ptr}, i32 0, i32 3, i32 1)",
            "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")


def _suffix(elem: str) -> str:
    return {"float": "f32", "double": "f64", "half": "f16", "bfloat": "bf16"}.get(elem, elem)
