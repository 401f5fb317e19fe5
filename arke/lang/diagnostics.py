"""Diagnostics: stable codes, spans, messages a person understands, and hints.

Every problem Arke reports about a program is a :class:`Diagnostic`. The codes are
stable (tools and tests match on them) and catalogued in :data:`CODES` and in
``spec/diagnostics.md``; a test keeps the two in step.

* ``AK1xxx`` syntax
* ``AK2xxx`` names and indices
* ``AK3xxx`` shapes and dtypes
* ``AK4xxx`` strategies
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum

from arke.lang.source import Span


class Severity(IntEnum):
    """LSP severities (the numbers are LSP's)."""

    ERROR = 1
    WARNING = 2
    INFO = 3
    HINT = 4


#: code -> (severity, short title). The title is the catalogue entry; messages are specific.
CODES: dict[str, tuple[Severity, str]] = {
    # -- syntax
    "AK1001": (Severity.ERROR, "unexpected character"),
    "AK1002": (Severity.ERROR, "unexpected token"),
    "AK1003": (Severity.ERROR, "unexpected end of file"),
    "AK1004": (Severity.ERROR, "file cannot be read as UTF-8 text"),
    "AK1005": (Severity.ERROR, "invalid literal"),
    "AK1006": (Severity.ERROR, "nested too deeply"),
    # -- names and indices
    "AK2001": (Severity.ERROR, "unknown name"),
    "AK2002": (Severity.ERROR, "unknown kernel or function"),
    "AK2003": (Severity.ERROR, "name defined twice"),
    "AK2004": (Severity.ERROR, "module not found"),
    "AK2005": (Severity.ERROR, "name imported from two modules"),
    "AK2006": (Severity.ERROR, "recursive kernel call"),
    "AK2007": (Severity.ERROR, "name used before it is defined"),
    "AK2008": (Severity.ERROR, "imported module has errors"),
    "AK2009": (Severity.ERROR, "modules import each other in a cycle"),
    "AK2101": (Severity.ERROR, "index bound twice on the left"),
    "AK2102": (Severity.ERROR, "reduction index shadows an index already bound"),
    "AK2104": (Severity.ERROR, "index not bound"),
    "AK2105": (Severity.ERROR, "extent of an index cannot be inferred"),
    "AK2106": (Severity.ERROR, "free indices in a whole-tensor expression"),
    "AK2107": (Severity.ERROR, "a tensor used without indices among indexed terms"),
    "AK2110": (Severity.ERROR, "malformed scan"),
    "AK2112": (Severity.ERROR, "malformed top-k"),
    "AK2113": (Severity.ERROR, "dtype variable named like a dtype, dim or parameter, or declared twice"),
    "AK2114": (Severity.ERROR, "malformed length"),
    "AK2201": (Severity.ERROR, "kernel has no return"),
    "AK2202": (Severity.ERROR, "return does not match the declared outputs"),
    "AK2203": (Severity.ERROR, "statement after return"),
    "AK2301": (Severity.WARNING, "defined but never used"),
    # -- shapes and dtypes
    "AK3001": (Severity.ERROR, "unknown dtype"),
    "AK3002": (Severity.ERROR, "wrong number of indices"),
    "AK3003": (Severity.ERROR, "conflicting extents for an index"),
    "AK3004": (Severity.ERROR, "shapes do not broadcast"),
    "AK3005": (Severity.ERROR, "operand has the wrong dtype"),
    "AK3006": (Severity.ERROR, "index expression is not an integer"),
    "AK3007": (Severity.ERROR, "where clause is false"),
    "AK3008": (Severity.ERROR, "wrong number of arguments"),
    "AK3009": (Severity.ERROR, "argument shape does not match the parameter"),
    "AK3010": (Severity.ERROR, "argument dtype does not match the parameter"),
    "AK3011": (Severity.ERROR, "call violates the callee's where clause"),
    "AK3012": (Severity.ERROR, "result shape does not match the declared output"),
    "AK3013": (Severity.ERROR, "ambiguous mapping of free indices to output axes"),
    "AK3014": (Severity.ERROR, "matmul operands do not match"),
    "AK3015": (Severity.ERROR, "invalid dimension expression"),
    "AK3016": (Severity.ERROR, "result dtype does not match the declared output"),
    "AK3017": (Severity.ERROR, "condition is not a boolean"),
    "AK3018": (Severity.ERROR, "default value does not fit the parameter"),
    "AK3019": (Severity.ERROR, "bitwise operand is not an integer, or a shift count is out of range"),
    "AK3020": (Severity.ERROR, "scan body is not affine in its carry"),
    "AK3021": (Severity.ERROR, "a dim parameter's default or argument is not a positive dim"),
    "AK3022": (Severity.ERROR, "declared shape does not fit the definition"),
    "AK3023": (Severity.ERROR, "top-k keeps more values than its row has"),
    "AK3025": (Severity.ERROR, "a dtype variable's set holds something that is not a dtype"),
    "AK3026": (Severity.ERROR, "a dtype variable no tensor parameter binds"),
    "AK3027": (Severity.ERROR, "a call binds a dtype variable outside its set"),
    "AK3028": (Severity.ERROR, "length is not an integer"),
    "AK3029": (Severity.ERROR, "length uses an index its reduction binds"),
    # -- strategies
    "AK4001": (Severity.ERROR, "strategy for an unknown kernel"),
    "AK4002": (Severity.ERROR, "unknown decision"),
    "AK4003": (Severity.ERROR, "decision names an index the kernel does not have"),
    "AK4004": (Severity.ERROR, "illegal value for a decision"),
    "AK4005": (Severity.ERROR, "parallel over a reduced index"),
    "AK4006": (Severity.ERROR, "unknown target"),
    "AK4007": (Severity.ERROR, "decision given twice"),
    "AK4008": (Severity.ERROR, "strategy condition is not about the kernel's dims"),
    "AK4009": (Severity.WARNING, "decision has no effect on this target"),
    "AK4010": (Severity.ERROR, "two strategies for the same kernel, target and condition"),
    "AK4011": (Severity.ERROR, "split of an index that is not reduced"),
    "AK4012": (Severity.ERROR, "strategy needs more shared memory or registers than the GPU has"),
    "AK4013": (Severity.WARNING, "strategy decision the target cannot express"),
    "AK4014": (Severity.WARNING, "decision has no effect on any dispatch of the kernel"),
    "AK4015": (Severity.WARNING, "launch spills registers at every configuration the strategy leaves free"),
    "AK4016": (Severity.WARNING, "strategy never applies"),
}


@dataclass(frozen=True)
class Related:
    """A second site that explains a diagnostic ("first defined here")."""

    span: Span
    message: str


@dataclass(frozen=True)
class Diagnostic:
    """One problem in a program, with where it is and what to do about it.

    ``replacement`` is an exact text to put at ``span`` that fixes the problem (editors
    offer it as a quick fix); ``hint`` is the human sentence shown under the caret.
    """

    code: str
    message: str
    span: Span
    hint: str | None = None
    related: tuple[Related, ...] = ()
    replacement: str | None = None
    severity: Severity = field(default=Severity.ERROR)

    @property
    def is_error(self) -> bool:
        return self.severity == Severity.ERROR

    def __str__(self) -> str:
        text = f"{self.span}: {self.severity.name.lower()}[{self.code}]: {self.message}"
        return f"{text} ({self.hint})" if self.hint else text


def make(
    code: str,
    message: str,
    span: Span,
    hint: str | None = None,
    related: Iterable[Related] = (),
    replacement: str | None = None,
) -> Diagnostic:
    """Build a diagnostic with its catalogued severity (an unknown code is a bug, so it raises)."""
    severity, _ = CODES[code]
    return Diagnostic(code, message, span, hint, tuple(related), replacement, severity)


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """The closest candidate to ``name``, if one is close enough to be worth suggesting."""
    pool = sorted(set(candidates) - {name})
    close = difflib.get_close_matches(name, pool, n=1, cutoff=0.6)
    if close:
        return close[0]
    if len(name) == 1:  # one-letter names (indices) are never "close" by ratio; suggest a lone one
        singles = [c for c in pool if len(c) == 1]
        if len(singles) == 1:
            return singles[0]
    return None


class CheckError(Exception):
    """Raised by the Python API when a program has errors; carries all its diagnostics."""

    def __init__(self, diagnostics: Iterable[Diagnostic]):
        self.diagnostics = tuple(diagnostics)
        errors = [d for d in self.diagnostics if d.is_error]
        lines = [str(d) for d in errors[:10]]
        more = f"\n... and {len(errors) - 10} more" if len(errors) > 10 else ""
        super().__init__("\n".join(lines) + more)
