"""What to write instead of the reductions, functions and dtypes other tensor languages have and
Arke does not (yet): the hints of AK2002 for reductions and functions, and of AK3001 for
the unsigned dtypes it lacks or spells otherwise (`u64`, `uint8`).

Two tables, :data:`NOT_YET` (reductions and functions) and :data:`NOT_YET_DTYPES`: each entry
says what is missing and what to write today; a function's entry shows a whole kernel. The
examples are real: tests/lang/test_parse_messages.py checks each one, run by the interpreter,
against torch. When the language gains one of these, drop its
entry (and its case in the error corpus); nothing else refers to it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Instead:
    """What to write instead of a missing reduction or function."""

    #: what is missing, as a sentence start ("Arke has no arg-reductions yet")
    why: str
    #: how to compute it today, in words around the example's lines (in backticks)
    how: str
    #: a whole kernel computing it today; ``how`` quotes its body's lines
    example: str

    @property
    def hint(self) -> str:
        return f"{self.why}: {self.how}"


#: name -> what to write instead; consulted for `name(... for i)` and for `name(...)` (none today:
#: top-k, the last entry, is in the language since issue 17)
NOT_YET: dict[str, Instead] = {}


#: dtype name -> what to write instead (AK3001's hint; no quick fix: a signed dtype reads differently)
NOT_YET_DTYPES: dict[str, str] = {
    "u64": "Arke has no u64 (its unsigned dtypes are u8, u16 and u32): pass values below 2**63 as `i64`",
    "uint64": "Arke has no u64 (its unsigned dtypes are u8, u16 and u32): pass values below 2**63 as `i64`",
    "uint8": "Arke spells this dtype `u8`", "uint16": "Arke spells this dtype `u16`",
    "uint32": "Arke spells this dtype `u32`",
}
