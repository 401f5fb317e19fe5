"""Names the checker once let through (outputs, reduction indices, a name given twice on the left) and
diagnostics that were misplaced, doubled or worded for another case: each with its code and the text
its span covers."""

from __future__ import annotations

from pathlib import Path

import pytest

import arke
from arke.lang.diagnostics import Diagnostic


def found(source: str) -> list[Diagnostic]:
    return list(arke.check(source))


def covered(source: str, d: Diagnostic) -> str:
    return source[d.span.start:d.span.end]


@pytest.mark.parametrize(("src", "at", "says"), [
    ("kernel f(x: f32[N]) -> (y: f32[N], y: f32[N]) { return x, x }", "y", "declared twice"),
    ("kernel f(x: f32[N]) -> N: f32[N] { N[i] = x[i] }", "N", "name of a dim"),
    ("kernel f(x: f32[N]) -> inf: f32[N] { inf[i] = x[i] + inf }", "inf", "name of a literal"),
    ("kernel f(x: f32[N]) -> sum: f32[N] { sum[i] = x[i] }", "sum", "name of a reduction"),
    ("kernel f(x: f32[N]) -> cumsum: f32[N] { cumsum[i] = x[i] }", "cumsum", "name of a scan"),
    ("kernel f(x: f32[N]) -> y: f32[N] { y[i] = sum(x[N] for N) }", "N", "reduction index `N` has the name of a dim"),
    ("kernel f(x: f32[N]) -> y: f32[N] { y[i] = sum(x[x] for x) }", "x", "name of a tensor"),
    ("kernel f(x: f32[N]) -> i: f32[N] { i[i] = x[i] }", "i", "index `i` has the name of an output"),
    ("kernel two(x: f32[N]) -> (a: f32[N], b: f32[N]) { a[i] = x[i]; b[i] = x[i] }\n"
     "kernel u(x: f32[N]) -> f32[N] { p, p = two(x); return p }", "p", "named twice on the left"),
])
def test_every_new_name_is_defined_once(src: str, at: str, says: str) -> None:
    [d] = [d for d in found(src) if d.is_error]
    assert d.code == "AK2003" and says in d.message, d
    assert covered(src, d) == at


def test_outputs_may_share_a_functions_name_as_parameters_do() -> None:
    src = "kernel table(p: f32[N]) -> (cos: f32[N], sin: f32[N]) { cos[i] = cos(p[i]); sin[i] = sin(p[i]) }"
    assert not [d for d in found(src) if d.is_error]


@pytest.mark.parametrize("when", ["not (N > 0)", "not (N == N)", "not (N >= 1 or N < 0)"])
def test_a_negated_when_that_never_holds_is_ak4016(when: str) -> None:
    src = (f"kernel f(x: f32[N]) -> f32[N] {{ return x[i] * 2.0 }}\n"
           f"@strategy(f, target = llvm, when {when}) {{ threads = 2 }}")
    [d] = found(src)
    assert d.code == "AK4016" and covered(src, d) == when


@pytest.mark.parametrize(("clause", "says"), [
    ("not (N >= 1)", "`not (N >= 1)` can never hold"),
    ("((N)) + 1 < 2", "`((N)) + 1 < 2` can never hold"),
    ("N % 2 == 3", "`N % 2 == 3` can never hold"),
])
def test_a_where_clause_is_quoted_and_marked_whole(clause: str, says: str) -> None:
    src = f"kernel f(x: f32[N]) -> f32[N] where {clause} {{ return x }}"
    [d] = found(src)
    assert d.code == "AK3007" and says in d.message and "before it" not in d.message
    assert covered(src, d) == clause


def test_only_a_clause_that_holds_alone_is_blamed_on_the_clauses_before_it() -> None:
    src = "kernel f(x: f32[N]) -> f32[N] where N > 4, N < 3 { return x }"
    [d] = found(src)
    assert covered(src, d) == "N < 3" and "together with the clauses before it" in d.message


def test_a_decision_given_twice_on_one_line_marks_the_second_item() -> None:
    src = ("kernel mm(a: f32[M, K], b: f32[K, N]) -> f32[M, N] { return sum(a[m, k] * b[k, n] for k) }\n"
           "@strategy(mm, target = llvm) { tile m = 4, m = 8 }")
    [d] = found(src)
    assert d.code == "AK4007" and covered(src, d) == "m = 8"
    assert covered(src, d.related[0]) == "m = 4"


@pytest.mark.parametrize(("src", "code"), [
    ("kernel f(x: f32[N]) -> f32[N] { return x[i] * 2.0 }\n@strategy(f, arch = sm90) { threads = 2 }", "AK1002"),
    ("kernel f(x: f32[M, N]) -> f32[M] { return sum(sum(x[m, n] for n) for n) }", "AK2102"),
    ("kernel f(x: f32[M, N]) -> f32[M, N] { return cumsum(x[m, n] for n, exclusive = true, exclusive = false) }",
     "AK2110"),
])
def test_one_mistake_is_one_error(src: str, code: str) -> None:
    assert [d.code for d in found(src) if d.is_error] == [code]


@pytest.mark.parametrize(("src", "hint"), [
    ("kernel a(x: f32[M, N]) -> f32[M, N] { return cumsum(x[m, n] for n < 3) }", "if n < 3 else 0 for n"),
    ("kernel b(x: f32[M, N]) -> f32[M] { return sum(x[m, n] for n > 3) }", "`n < LENGTH`"),
    ("kernel c(x: f32[M, N], t: f32) -> f32[M] { return sum(x[m, n] for n < t) }", "`n < i64(t)`"),
])
def test_length_hints_quote_the_program(src: str, hint: str) -> None:
    [d] = [d for d in found(src) if d.is_error]
    assert hint in (d.hint or ""), d.hint


def test_a_decision_on_a_kernel_that_computes_nothing_says_so() -> None:
    src = "kernel f(x: f32[N]) -> f32[N] { return x }\n@strategy(f, target = llvm) { threads = 2 }"
    [d] = found(src)
    assert d.code == "AK4014" and "no dispatch" in d.message and "None" not in d.message


@pytest.mark.parametrize("signature", ["s: f32 = 1e400", "s: f65", "x: f32[M, N]"])
def test_a_broken_signature_has_no_strategy_follow_on(signature: str) -> None:
    """The body of a kernel whose signature has an error is not checked, so its indices are unknown: a strategy
    naming them gets no AK4003 ("kernel `f` has no index `m`") on top of the signature's own error."""
    src = (f"kernel f(x: f32[M, N], {signature}) -> f32[M, N] {{\n  return x[m, n]\n}}\n"
           "@strategy(f, target = llvm) {\n  parallel m\n}\n")
    codes = [d.code for d in found(src) if d.is_error]
    assert codes and "AK4003" not in codes, codes


def test_an_import_whose_name_is_too_long_for_the_system_is_not_found() -> None:
    """ENAMETOOLONG from the file system is "no such module" (AK2004 at the import), not an OSError."""
    for module in ("a" * 300, ".".join(["b" * 200] * 30)):
        [d] = found(f"import {module}\nkernel f(x: f32[N]) -> f32[N] {{ return x[n] }}\n")
        assert d.code == "AK2004" and d.span.line == 1, d


def test_a_bad_byte_is_placed_by_characters_not_bytes(tmp_path: Path) -> None:
    """AK1004's column counts the characters before the bad byte (``é`` is two bytes), and any line end."""
    path = tmp_path / "u.ak"
    path.write_bytes("# ééééé".encode() + b"\xff\n")
    [d] = found(str(path))
    assert (d.code, d.span.line, d.span.col) == ("AK1004", 1, 8), d
    path.write_bytes(b"kernel f() {}\r# \xc3\xa9\xff\r")
    [d] = found(str(path))
    assert (d.code, d.span.line, d.span.col) == ("AK1004", 2, 4), d
