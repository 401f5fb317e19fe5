"""The error corpus: one small program per diagnostic code, and the catalogue in ``spec/diagnostics.md``.

Each ``tests/lang/errors/CODE_what.ak`` is a kernel a user might really write, with one
mistake. Its header says what the checker must report::

    # expect: AK2104 line 10 at `e`

(the code, the 1-based line, and optionally the exact source text the diagnostic's span
covers). A file may hold several ``expect`` lines. The tests check that every expected
diagnostic is there, that no other error is, and that each diagnostic reads well: no
parser internals, a span inside the file, help (a hint, a related site, a "did you mean")
where the catalogue entry calls for one, and a quick fix that really fixes.

Known checker bugs are marked ``xfail(strict=True)`` with the reason, on the one check
they break: when the bug is fixed the test XPASSes, fails, and the mark must go.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import arke
from arke.lang.diagnostics import CODES, Diagnostic, Severity
from arke.lang.hints import NOT_YET, NOT_YET_DTYPES

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ERRORS = HERE / "errors"
FILES = sorted(ERRORS.glob("*.ak"))
SPEC = ROOT / "spec" / "diagnostics.md"

# Catalogued codes that nothing in arke/ emits (test_not_triggerable_codes_are_never_emitted
# proves it by searching the source), so no program can get them and no corpus file exists.
NOT_TRIGGERABLE: dict[str, str] = {}

# Codes reported at build time, from what a compiler made (no `.ak` file alone gets them from
# `arke.check`): code -> the test file that triggers it instead of a corpus file.
BUILD_TIME: dict[str, str] = {"AK4012": "tests/cli/test_cli.py", "AK4013": "tests/targets/mlir/test_mlir_schedule.py",
                              "AK4015": "tests/targets/triton/test_triton_fit.py"}

# Files whose expected diagnostic is right but which also get follow-on errors.
EXTRA_ERRORS: dict[str, str] = {}
# Files whose expected diagnostic never comes.
MISSING: dict[str, str] = {}

# Files where a span misses part of the mistake.
BAD_SPANS: dict[str, str] = {}
# Files whose quick fix does not fix.
BAD_FIXES: dict[str, str] = {}

# Codes whose message says all there is to say; every other error must carry a hint or a related site.
SELF_EXPLANATORY = {"AK2202", "AK2203", "AK3012"}
# Codes about a second site (the first definition, the other use, the first block): they must point at it.
NEEDS_RELATED = {"AK2003", "AK2008", "AK3002", "AK3003", "AK3009", "AK3011", "AK4007", "AK4010"}
# Codes about a misspelt name: when a close name exists, the hint says "did you mean" and the quick fix is set
# (AK2002 and AK3001 for a reduction, function or dtype Arke does not have yet say what to write instead:
# arke.lang.hints).
DID_YOU_MEAN = {"AK2001", "AK2002", "AK2104", "AK3001", "AK4002", "AK4003"}

LARK_INTERNALS = ("Token(", "UnexpectedToken", "UnexpectedCharacters", "UnexpectedEOF", "$END", "__ANON", "Tree(")
EXPECT = re.compile(r"#\s*expect:\s*(AK\d{4})\s+line\s+(\d+)(?:\s+at\s+`(.*)`)?\s*$")


@dataclass(frozen=True)
class Expect:
    code: str
    line: int
    text: str | None  # the source text the span covers, when the header gives it


def read_text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:  # the AK1004 file is Latin-1 on purpose
        return data.decode("latin-1")


def expectations(path: Path) -> list[Expect]:
    """The ``# expect:`` lines of a file's leading comment block."""
    out = []
    for line in read_text(path).splitlines():
        if not line.startswith("#"):
            break
        m = EXPECT.match(line)
        if m:
            out.append(Expect(m.group(1), int(m.group(2)), m.group(3)))
    return out


def span_text(text: str, d: Diagnostic) -> str:
    """The source text a diagnostic's span covers, by its lines and columns (as an editor shows it)."""
    lines = text.split("\n")
    s = d.span
    if s.line == s.end_line:
        return lines[s.line - 1][s.col - 1:s.end_col - 1]
    parts = [lines[s.line - 1][s.col - 1:], *lines[s.line:s.end_line - 1], lines[s.end_line - 1][:s.end_col - 1]]
    return "\n".join(parts)


def found(d: Diagnostic, e: Expect) -> bool:
    return d.code == e.code and d.span.line == e.line


def check(path: Path) -> list[Diagnostic]:
    return arke.check(path)


def marked(names: dict[str, str], *more: dict[str, str]) -> list[Any]:
    """The corpus files as test params, xfail(strict) where a dict names a known bug."""
    params = []
    for f in FILES:
        reason = names.get(f.name) or next((m[f.name] for m in more if f.name in m), None)
        marks = [pytest.mark.xfail(strict=True, reason="arke bug: " + reason)] if reason else []
        params.append(pytest.param(f, id=f.name, marks=marks))
    return params


# ---------------------------------------------------------------- the corpus itself


@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_header_names_catalogued_codes(path: Path) -> None:
    expects = expectations(path)
    assert expects, f"{path.name} has no `# expect: CODE line N` header"
    for e in expects:
        assert e.code in CODES, f"{path.name} expects {e.code}, which is not in the catalogue"
        assert 1 <= e.line <= len(read_text(path).split("\n"))
    assert path.name.startswith(expects[0].code + "_"), "name the file after the code it shows"


@pytest.mark.parametrize("path", marked(MISSING))
def test_expected_diagnostics_are_reported(path: Path) -> None:
    diags = check(path)
    got = [f"{d.code} line {d.span.line}: {d.message}" for d in diags]
    for e in expectations(path):
        assert any(found(d, e) for d in diags), f"expected {e.code} at line {e.line}; got {got}"


@pytest.mark.parametrize("path", marked(EXTRA_ERRORS, MISSING))
def test_no_other_errors(path: Path) -> None:
    expects = expectations(path)
    extra = [f"{d.code} line {d.span.line}: {d.message}" for d in check(path)
             if d.is_error and not any(found(d, e) for e in expects)]
    assert not extra, f"errors beyond the expected ones: {extra}"


@pytest.mark.parametrize("path", marked(BAD_SPANS, MISSING))
def test_spans_cover_the_mistake(path: Path) -> None:
    text = read_text(path)
    diags = check(path)
    for e in expectations(path):
        if e.text is None:
            continue
        spans = [span_text(text, d) for d in diags if found(d, e)]
        assert spans, f"no {e.code} at line {e.line}"
        assert e.text in spans, f"{e.code} should cover `{e.text}`, but covers {spans}"


@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_diagnostics_read_well(path: Path) -> None:
    """Catalogued code and severity, a message in words, and spans inside the file."""
    text = read_text(path)
    lines = text.split("\n")
    for d in check(path):
        assert d.code in CODES
        assert d.severity == CODES[d.code][0]
        assert d.message.strip(), f"{d.code} has an empty message"
        assert d.message[0].islower() or d.message[0] == "`", f"{d.code}: messages start in lower case: {d.message}"
        for piece in (d.message, d.hint or "", *(r.message for r in d.related)):
            bad = [s for s in LARK_INTERNALS if s in piece]
            assert not bad, f"{d.code} shows parser internals {bad}: {piece!r}"
        for s in [d.span, *(r.span for r in d.related)]:
            if Path(s.file).resolve() != path.resolve():
                continue  # a related site in another file (an imported module)
            assert 1 <= s.line <= s.end_line <= len(lines), f"{d.code}: lines {s.line}..{s.end_line}"
            assert 1 <= s.col <= len(lines[s.line - 1]) + 1, f"{d.code}: column {s.col} of line {s.line}"
            assert 1 <= s.end_col <= len(lines[s.end_line - 1]) + 1, f"{d.code}: end column {s.end_col}"
            assert (s.line, s.col) <= (s.end_line, s.end_col)


@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_errors_carry_help(path: Path) -> None:
    """Each expected error helps: a hint or a related site, and "did you mean" for a misspelt name."""
    for e in expectations(path):
        for d in (d for d in check(path) if found(d, e) and d.is_error):
            if d.code not in SELF_EXPLANATORY:
                assert d.hint or d.related, f"{d.code} `{d.message}` has neither a hint nor a related site"
            if d.code in NEEDS_RELATED:
                assert d.related, f"{d.code} `{d.message}` should point at the other site"
            name = span_text(read_text(path), d)
            instead = (NOT_YET[name].hint if d.code == "AK2002" and name in NOT_YET else
                       NOT_YET_DTYPES.get(name) if d.code == "AK3001" else None)
            if instead is not None:  # not a misspelling: what to write instead, and no quick fix
                assert d.hint == instead and d.replacement is None, f"{d.code} `{d.message}`: {d.hint!r}"
            elif d.code in DID_YOU_MEAN:
                assert d.hint and "did you mean" in d.hint, f"{d.code} `{d.message}`: hint {d.hint!r}"
                assert d.replacement, f"{d.code} `{d.message}` has no quick fix"


@pytest.mark.parametrize("path", marked(BAD_FIXES))
def test_quick_fix_removes_the_diagnostic(path: Path) -> None:
    """Putting a diagnostic's ``replacement`` at its span makes that diagnostic go away."""
    text = read_text(path)
    fixes = [d for d in check(path) if d.replacement is not None and Path(d.span.file).resolve() == path.resolve()]
    if not fixes:
        pytest.skip("no quick fix offered")
    for d in fixes:
        fixed = text[:d.span.start] + d.replacement + text[d.span.end:]  # type: ignore[operator]
        again = arke.check(fixed, path=str(path))
        assert not any(x.code == d.code and x.span.line == d.span.line for x in again), (
            f"replacing `{text[d.span.start:d.span.end]}` by `{d.replacement}` leaves {d.code}: "
            f"{[str(x) for x in again]}")


# ---------------------------------------------------------------- "did you mean" in more places

_RMSNORM = """kernel rmsnorm(x: f32[M, N], w: f32[N], eps: f32 = 1e-6) -> f32[M, N]
{
  inv[m] = rsqrt(mean(x[m, n] * x[m, n] for n) + eps)
  return x[m, n] * inv[m] * w[n]
}
"""
SUGGESTIONS = [
    # (what, source, code, suggested name)
    ("dim in a type", "kernel f(x: f32[Rows, Cols]) -> f32[Rows, Col] { return x }\n", "AK2001", "Cols"),
    ("name from an import", "from std.nn import rmsnrom\n", "AK2001", "rmsnorm"),
    ("tensor in a body", _RMSNORM.replace("* w[n]", "* ww[n]"), "AK2001", "w"),
    ("kernel from an import", "import std.nn\nkernel f(x: f32[M, N]) -> f32[M, N] { return sofmax(x) }\n",
     "AK2002", "softmax"),
    ("reduction", _RMSNORM.replace("mean(", "maen("), "AK2002", "mean"),
    ("index by extent", _RMSNORM.replace("return x[m, n] * inv[m] * w[n]", "y[m, n] = x[m, n] * inv[m] * w[k]\n"
                                         "  return y"), "AK2104", "n"),
    ("dtype", _RMSNORM.replace("w: f32[N]", "w: fp32[N]"), "AK3001", "f32"),
    ("output dtype", _RMSNORM.replace("-> f32[M, N]", "-> f3[M, N]"), "AK3001", "f32"),
    ("decision", _RMSNORM + "@strategy(rmsnorm, target = triton) {\n  num_warps = 4\n}\n", "AK4002", "warps"),
    ("operand of pack", "kernel lin(x: f32[M, K], weight: f32[N, K]) -> f32[M, N] {\n"
                        "  return sum(x[m, k] * weight[n, k] for k)\n}\n"
                        "@strategy(lin, target = llvm) {\n  pack weights\n}\n", "AK4003", "weight"),
    ("target", _RMSNORM + "@strategy(rmsnorm, target = trition) {\n  warps = 4\n}\n", "AK4006", "triton"),
    ("strategy's kernel", _RMSNORM + "@strategy(rmsnom, target = llvm) {\n  parallel m\n}\n", "AK4001", "rmsnorm"),
    ("stdlib module", "import std.nnn\n", "AK2004", "std.nn"),
]


@pytest.mark.parametrize(("what", "source", "code", "name"), SUGGESTIONS, ids=[s[0] for s in SUGGESTIONS])
def test_did_you_mean(what: str, source: str, code: str, name: str) -> None:
    diags = [d for d in arke.check(source) if d.code == code]
    assert diags, f"no {code}: {[str(d) for d in arke.check(source)]}"
    assert any(d.hint and f"did you mean `{name}`?" in d.hint for d in diags), [str(d) for d in diags]


# ---------------------------------------------------------------- imports between files


def test_import_cycle_between_two_files(tmp_path: Path) -> None:
    """The import that closes the cycle is AK2009; each file checked alone gets AK2008 saying so."""
    (tmp_path / "layers.ak").write_text("import blocks\n\nkernel double(x: f32[N]) -> f32[N] {\n"
                                        "  return x * 2.0\n}\n")
    (tmp_path / "blocks.ak").write_text("# blocks\nimport layers\n\nkernel half(x: f32[N]) -> f32[N] {\n"
                                        "  return x * 0.5\n}\n")
    for name, line, other in (("layers.ak", 1, "blocks.ak"), ("blocks.ak", 2, "layers.ak")):
        diags = arke.check(tmp_path / name)
        assert [(d.code, d.span.line) for d in diags] == [("AK2008", line)], [str(d) for d in diags]
        related = diags[0].related
        assert related and related[0].message.startswith("AK2009: "), related
        assert "cycle" in related[0].message and Path(related[0].span.file).name == other


# ---------------------------------------------------------------- one mistake, one error

_FLIP = "kernel flip(x: f32[N]) -> f32[N]\n{\n  t[i] = x[N - 1 - i]\n  return t\n}\n"
ONE_MISTAKE = [
    # id, source, and the one error expected as (code, line)
    pytest.param("kernel f(x: f32[N], w: f32[N]) -> f32[N]\n{\n  s[i] = x[i] * w[e]\n"
                 "  t[i] = s[i] * 2.0\n  return t[i] + s[i]\n}\n", ("AK2104", 3), id="poisoned tensor used later"),
    pytest.param("kernel f(x: f32[N]) -> f32[N]\n{\n  return x[i] * esp\n}\n"
                 "kernel g(x: f32[N]) -> f32[N]\n{\n  return f(x) + x\n}\n", ("AK2001", 3),
                 id="bad kernel called by a good one"),
    pytest.param("kernel f(x: f23[N]) -> f32[N]\n{\n  return x\n}\n", ("AK3001", 1), id="unknown dtype"),
    pytest.param(_FLIP, ("AK2105", 3), id="index only inside a subscript expression"),
]


@pytest.mark.parametrize(("source", "error"), ONE_MISTAKE)
def test_one_mistake_one_error(source: str, error: tuple[str, int]) -> None:
    got = [(d.code, d.span.line) for d in arke.check(source) if d.is_error]
    assert got == [error], [str(d) for d in arke.check(source)]


def test_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.ak"
    path.write_bytes(b"\xef\xbb\xbf" + (ERRORS.parent.parent.parent / "examples" / "rmsnorm.ak").read_bytes())
    assert [str(d) for d in arke.check(path)] == []


# ---------------------------------------------------------------- known gaps (catalogued codes never emitted)


def test_use_before_definition_is_AK2007() -> None:
    source = ("kernel f(x: f32[M, N]) -> f32[M, N]\n{\n"
              "  y = e + x\n"
              "  e = exp(x)\n"
              "  return y\n}\n")
    codes = [(d.code, d.span.line) for d in arke.check(source) if d.is_error]
    assert codes == [("AK2007", 3)]


def test_malformed_exponent_is_AK1005() -> None:
    source = "kernel f(x: f32[N]) -> f32[N]\n{\n  return x[n] * 2.5e + 1.0\n}\n"
    assert [(d.code, d.span.line) for d in arke.check(source) if d.is_error] == [("AK1005", 3)]


def test_not_triggerable_codes_are_never_emitted() -> None:
    """The allow-list stays honest: a code in it that arke starts emitting needs a corpus file instead."""
    assert set(NOT_TRIGGERABLE) <= set(CODES)
    sources = [p for p in (ROOT / "arke").rglob("*.py") if p.name != "diagnostics.py"]
    for code in NOT_TRIGGERABLE:
        users = [p.relative_to(ROOT) for p in sources if f'"{code}"' in p.read_text(encoding="utf-8")]
        assert not users, f"{code} is emitted by {users}: add tests/lang/errors/{code}_*.ak and drop it here"
        assert NOT_TRIGGERABLE[code] == CODES[code][1]


def test_every_code_has_a_corpus_file() -> None:
    covered = {f.name.split("_")[0] for f in FILES}
    missing = sorted(set(CODES) - covered - set(NOT_TRIGGERABLE) - set(BUILD_TIME))
    assert not missing, f"no tests/lang/errors/CODE_*.ak for {missing}"
    stale = sorted(covered & set(NOT_TRIGGERABLE))
    assert not stale, f"{stale} have corpus files: remove them from NOT_TRIGGERABLE"
    assert covered <= set(CODES), f"corpus files for uncatalogued codes: {sorted(covered - set(CODES))}"


def test_build_time_codes_are_tested_where_they_say() -> None:
    for code, test_file in BUILD_TIME.items():
        assert code in CODES and code not in NOT_TRIGGERABLE
        assert f'"{code}"' in (ROOT / test_file).read_text(encoding="utf-8"), f"{test_file} never checks {code}"


# ---------------------------------------------------------------- spec/diagnostics.md


def spec_table() -> dict[str, tuple[str, str]]:
    """code -> (severity, title) from the markdown table ``| code | severity | title |``."""
    rows: dict[str, tuple[str, str]] = {}
    for line in SPEC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else []
        if len(cells) == 3 and re.fullmatch(r"`?AK\d{4}`?", cells[0]):
            code = cells[0].strip("`")
            assert code not in rows, f"{code} is listed twice in the table"
            rows[code] = (cells[1], cells[2])
    return rows


def test_spec_lists_every_code_with_its_title() -> None:
    table = spec_table()
    want = {code: (sev.name.lower(), title) for code, (sev, title) in CODES.items()}
    assert sorted(table) == sorted(want), (
        f"missing from the spec: {sorted(set(want) - set(table))}; not in CODES: {sorted(set(table) - set(want))}")
    wrong = {c: (table[c], want[c]) for c in want if table[c] != want[c]}
    assert not wrong, f"(spec, CODES) differ: {wrong}"


def test_spec_has_a_section_per_code() -> None:
    text = SPEC.read_text(encoding="utf-8")
    headings = re.findall(r"^#{2,4}\s+`?(AK\d{4})`?", text, flags=re.MULTILINE)
    assert sorted(headings) == sorted(CODES), f"sections missing: {sorted(set(CODES) - set(headings))}"


def test_severities_are_lsp_numbers() -> None:
    assert {s.value for s in Severity} == {1, 2, 3, 4}


_RMS = ("kernel rms(x: f32[M, N], w: f32[N]) -> f32[M, N]\n{\n  inv[m] = rsqrt(mean(x[m, n] * x[m, n] for n))\n"
        "  return x[m, n] * inv[m] * w[n]\n}\n")


@pytest.mark.parametrize(("decision", "code"), [("vectorize q = 4", "AK4003"), ("unroll n = 65", "AK4004"),
                                                ("parallel n", "AK4005"), ("pack zz = 2", "AK4003")])
def test_a_decision_without_effect_on_its_target_is_still_checked(decision: str, code: str) -> None:
    """AK4009 (no effect on cuda) is a warning; the decision's own mistake is still the error it is on any target."""
    diags = arke.check(_RMS + f"@strategy(rms, target = cuda) {{\n  {decision}\n}}\n")
    assert [d.code for d in diags] == ["AK4009", code], [str(d) for d in diags]
