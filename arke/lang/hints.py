"""What to write instead of the reductions, functions and dtypes other tensor languages have and
Arke does not (yet): the hints of AK2002 for `argmax`, `topk`, `cumsum` and friends, and of
AK3001 for the unsigned dtypes.

Two tables, :data:`NOT_YET` (reductions and functions) and :data:`NOT_YET_DTYPES`: each entry
says what is missing and what to write today; a function's entry shows a whole kernel. The
examples are real: tests/lang/test_parse_messages.py checks each one, run by the interpreter,
against torch. When the language gains one of these (arg-reductions, scans and unsigned dtypes
are on their way), drop its entry (and its case in the error corpus); nothing else refers to it.
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


_ARGMAX = """kernel argmax_rows(x: f32[T, E]) -> i64[T] {
  mx[t] = max(x[t, e] for e)
  return min(e if x[t, e] == mx[t] else E for e)
}"""
_ARGMIN = _ARGMAX.replace("argmax", "argmin").replace("max(", "min(", 1).replace("mx", "mn")
_TOPK = """kernel topk_mask(x: f32[T, E], k: i64 = 2) -> bool[T, E] {
  rank[t, e] = sum(i64(x[t, f] > x[t, e] or (x[t, f] == x[t, e] and f < e)) for f)
  return rank[t, e] < k
}"""


def _scan(name: str, op: str, neutral: str) -> str:
    return (f"kernel {name}_rows(x: f32[T, N]) -> y: f32[T, N] {{\n"
            f"  y[t, i] = {op}(x[t, j] if j <= i else {neutral} for j)\n}}")


_SCAN_HOW = ("a cumulative {what} along `j` is a masked `{op}` into a named output (`-> y: f32[T, N]`, whose "
             "declared shape gives `i` its extent): `y[t, i] = {op}(x[t, j] if j <= i else {neutral} for j)`; "
             "its cost grows with the square of the length")
_NO_SCANS = "Arke has no scans yet"


def _scan_entry(name: str, what: str, op: str, neutral: str) -> Instead:
    return Instead(_NO_SCANS, _SCAN_HOW.format(what=what, op=op, neutral=neutral), _scan(name, op, neutral))


#: name -> what to write instead; consulted for `name(... for i)` and for `name(...)`
NOT_YET: dict[str, Instead] = {
    "argmax": Instead("Arke has no arg-reductions yet",
                      "take the first index that reaches the maximum: `mx[t] = max(x[t, e] for e)`, then "
                      "`return min(e if x[t, e] == mx[t] else E for e)` (a row holding NaN gives `E`)", _ARGMAX),
    "argmin": Instead("Arke has no arg-reductions yet",
                      "take the first index that reaches the minimum: `mn[t] = min(x[t, e] for e)`, then "
                      "`return min(e if x[t, e] == mn[t] else E for e)` (a row holding NaN gives `E`)", _ARGMIN),
    "topk": Instead("Arke has no top-k yet",
                    "rank each value by counting those before it, "
                    "`rank[t, e] = sum(i64(x[t, f] > x[t, e] or (x[t, f] == x[t, e] and f < e)) for f)`, and keep "
                    "`return rank[t, e] < k` (as `std.moe.topk_routing` does)", _TOPK),
    "cumsum": _scan_entry("cumsum", "sum", "sum", "0.0"),
    "cumprod": _scan_entry("cumprod", "product", "prod", "1.0"),
    "cummax": _scan_entry("cummax", "maximum", "max", "-inf"),
    "cummin": _scan_entry("cummin", "minimum", "min", "inf"),
    "scan": Instead(_NO_SCANS, _SCAN_HOW.format(what="sum", op="sum", neutral="0.0")
                    + " (a linear recurrence such as `h[t] = a[t] * h[t - 1] + b[t]` cannot be written yet)",
                    _scan("scan", "sum", "0.0")),
}
NOT_YET["top_k"] = NOT_YET["topk"]
NOT_YET["cumulative_sum"] = NOT_YET["cumsum"]


def _unsigned(bits: int) -> str:
    signed = {8: "i8", 16: "i32", 32: "i64", 64: "i64"}[bits]
    if bits == 8:
        how = ("pass the bytes as `i8` and read each as its unsigned value with `i32(w[n, k]) % 256`, "
               "`%` taking the sign of the divisor")
    elif bits in (16, 32):
        how = f"pass the values in a wider signed dtype (`{signed}`)"
    else:
        how = "pass the values as `i64` (the values below 2**63)"
    return f"Arke has no unsigned dtypes yet: {how}"


#: dtype name -> what to write instead (AK3001's hint; no quick fix: a signed dtype reads differently)
NOT_YET_DTYPES: dict[str, str] = {
    "u8": _unsigned(8), "uint8": _unsigned(8), "u16": _unsigned(16), "uint16": _unsigned(16),
    "u32": _unsigned(32), "uint32": _unsigned(32), "u64": _unsigned(64), "uint64": _unsigned(64),
}
