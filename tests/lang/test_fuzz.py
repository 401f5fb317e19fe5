"""Fuzzing the front end: bad input gives diagnostics, never an exception, a hang or a bad span.

Inputs are mutations of real programs (the standard library, ``examples/*.ak`` and the
error corpus ``tests/lang/errors/*.ak``: truncated, with spans deleted, duplicated or
swapped, with tokens of the language inserted, with characters replaced, with a name or
number swapped for another), random bytes and random unicode text. Each goes to
``arke.check`` (a list of diagnostics) and ``arke.loads`` (a module, or
:class:`arke.CheckError`); nothing else may come out.

The example counts are small enough for the whole file to run in well under a minute;
raise them locally with ``--hypothesis-seed`` and a bigger ``FUZZ_SCALE`` environment
variable when hunting.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arke
from arke.lang.diagnostics import CODES, Diagnostic
from arke.lang.source import Span

ROOT = Path(__file__).resolve().parents[2]
SCALE = float(os.environ.get("FUZZ_SCALE", "1"))
TIME_LIMIT_S = 5  # per input: a front end that takes longer on a small file has a hang


def _seed_files() -> list[Path]:
    """Every real program to mutate, found when the tests run (others add examples over time)."""
    files = sorted((ROOT / "arke" / "stdlib").glob("*.ak"))
    files += sorted((ROOT / "examples").glob("*.ak"))
    files += sorted((ROOT / "tests" / "lang" / "errors").glob("*.ak"))
    return files


def _read(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:  # the AK1004 corpus file is Latin-1 on purpose
        return data.decode("latin-1")


SEEDS = [_read(p) for p in _seed_files()]

# The language's vocabulary: keywords, names it knows, operators, brackets and literals.
VOCAB = [
    "kernel", "import", "from", "let", "return", "where", "if", "else", "for", "in", "and", "or", "not",
    "when", "@strategy", "@", "target", "llvm", "triton", "cuda", "std.nn", "std",
    "f32", "f16", "bf16", "i64", "i32", "i8", "u8", "u16", "u32", "bool", "dim", "true", "false", "inf", "-inf",
    "sum", "max", "min", "mean", "prod", "argmax", "argmin", "topk", "argtopk", "bottomk",
    "argbottomk", "exp", "log", "sqrt", "rsqrt", "gelu", "silu",
    "transpose",
    "tile", "parallel", "split", "vectorize", "unroll", "warps", "stages", "algorithm", "flash", "pack",
    "x", "y", "w", "m", "n", "k", "i", "j", "M", "N", "K", "D", "H", "G", "R", "W", "Q",  # W, Q: dtype variables
    "+", "-", "*", "/", "//", "%", "**", "@", "&", "|", "^", "~", "<<", ">>", "==", "!=", "<", "<=", ">", ">=", "=",
    "->", ":", ",", ";", ".",
    "(", ")", "[", "]", "{", "}", "#", "\n", " ",
    "0", "1", "2", "16", "128", "1e-6", "0.5", "1.", ".5", "1e", "9" * 30, "1e999",
]

LARK_INTERNALS = ("Token(", "UnexpectedToken", "UnexpectedCharacters", "UnexpectedEOF", "$END", "__ANON", "Tree(")


class Hang(BaseException):
    """Raised by the alarm; a BaseException so no ``except Exception`` inside arke can swallow it."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Fail an input that takes too long (a hang), wherever it is stuck."""

    def on_alarm(signum: int, frame: object) -> None:
        raise Hang(f"took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------- what every outcome must satisfy


def _line_lengths(text: str) -> list[int]:
    """Lengths of the lines as spans count them: split on '\\n' and on a lone '\\r' (a CRLF is one line end)."""
    return [len(line) for line in re.sub(r"\r(?!\n)", "\n", text).split("\n")]


def _span_ok(span: Span, text: str, lengths: list[int]) -> str | None:
    """Why a span does not lie inside ``text`` (None when it does)."""
    line, col, end_line, end_col = span.line, span.col, span.end_line, span.end_col
    if not 1 <= line <= len(lengths) or not 1 <= end_line <= len(lengths):
        return f"line {line}..{end_line} outside 1..{len(lengths)}"
    if not 1 <= col <= lengths[line - 1] + 1:
        return f"column {col} outside line {line} (length {lengths[line - 1]})"
    if not 1 <= end_col <= lengths[end_line - 1] + 1:
        return f"end column {end_col} outside line {end_line} (length {lengths[end_line - 1]})"
    if (end_line, end_col) < (line, col):
        return f"ends ({end_line}:{end_col}) before it starts ({line}:{col})"
    if not 0 <= span.start <= span.end <= len(text):
        return f"offsets {span.start}..{span.end} outside 0..{len(text)}"
    return None


def assert_good_diagnostics(diags: object, text: str, name: str = "<input>") -> None:
    """A list of catalogued diagnostics, with clean messages and spans inside ``text``."""
    assert isinstance(diags, list | tuple), f"expected a list of diagnostics, got {type(diags).__name__}"
    lengths = _line_lengths(text)
    for d in diags:
        assert isinstance(d, Diagnostic), f"not a Diagnostic: {d!r}"
        assert d.code in CODES, f"uncatalogued code {d.code}"
        assert d.message and isinstance(d.message, str)
        for piece in (d.message, d.hint or "", *(r.message for r in d.related)):
            bad = [s for s in LARK_INTERNALS if s in piece and s not in text]  # the input's own words may echo
            assert not bad, f"{d.code} shows parser internals {bad}: {piece!r}"
        spans = [d.span] + [r.span for r in d.related]
        for s in spans:
            if s.file == name:
                why = _span_ok(s, text, lengths)
                assert why is None, f"{d.code} {d.message!r}: span {why}"


def run_front_end(text: str) -> None:
    """``check`` and ``loads`` on ``text``: only diagnostics or CheckError, quickly, with good spans."""
    with time_limit(TIME_LIMIT_S):  # a hang guard (an alarm), not a speed assertion
        diags = arke.check(text)
    assert_good_diagnostics(diags, text)
    errors = {d for d in diags if d.is_error}
    with time_limit(TIME_LIMIT_S):
        try:
            module = arke.loads(text)
        except arke.CheckError as err:
            assert_good_diagnostics(list(err.diagnostics), text)
            assert any(d.is_error for d in err.diagnostics), "CheckError without an error diagnostic"
            assert {d for d in err.diagnostics if d.is_error} == errors, "check and loads disagree"
            str(err)  # the message must build
        else:
            assert not errors, f"loads accepted a program check rejects: {sorted(d.code for d in errors)}"
            assert isinstance(module, arke.Module)


def _is_path_like(text: str) -> bool:
    """``arke.check`` reads a str without a newline that ends in `.ak` as a path."""
    return "\n" not in text and text.endswith(".ak")


# ---------------------------------------------------------------- mutations of real programs

MUTATIONS = ("truncate", "delete", "duplicate", "swap", "insert", "replace", "rename")
NAMES = [v for v in VOCAB if v.isidentifier()]
_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*|\d+(?:\.\d*)?")


@st.composite
def mutated_programs(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(MUTATIONS))
        n = len(text)
        a = draw(st.integers(0, n))
        b = draw(st.integers(a, min(n, a + 80)))
        if kind == "truncate":
            text = text[:a]
        elif kind == "delete":
            text = text[:a] + text[b:]
        elif kind == "duplicate":
            text = text[:b] + text[a:b] + text[b:]
        elif kind == "swap":
            c = draw(st.integers(b, n))
            d = draw(st.integers(c, min(n, c + 80)))
            text = text[:a] + text[c:d] + text[b:c] + text[a:b] + text[d:]
        elif kind == "rename":  # a name or number becomes another: mostly still parses, so the checker runs
            spots = [m.span() for m in _NAME.finditer(text)]
            if spots:
                lo, hi = spots[draw(st.integers(0, len(spots) - 1))]
                text = text[:lo] + draw(st.sampled_from([*NAMES, "0", "1", "3", "64", "2.5"])) + text[hi:]
        elif kind == "insert":
            tokens = draw(st.lists(st.sampled_from(VOCAB), min_size=1, max_size=4))
            sep = draw(st.sampled_from(["", " "]))
            text = text[:a] + sep + sep.join(tokens) + sep + text[a:]
        else:  # replace one character, by one of the language's or any other
            ch = draw(st.sampled_from("()[]{}=,:;.+-*/%@<>#_0aZ \n\t\"'\\$`^~!?") | st.characters())
            text = text[:a] + ch + text[a + 1:]
    return text


@settings(max_examples=int(3000 * SCALE), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated_programs())
def test_mutated_programs_give_diagnostics(text: str) -> None:
    if _is_path_like(text):
        return
    run_front_end(text)


def test_every_truncation_of_a_small_program() -> None:
    """Truncated at every character: each prefix of a real kernel is a program in progress."""
    text = (ROOT / "tests" / "lang" / "errors" / "AK4004_illegal_decision_value.ak").read_text()
    for cut in range(0, len(text) + 1, 3 if SCALE <= 1 else 1):
        with time_limit(TIME_LIMIT_S):
            diags = arke.check(text[:cut] + "\n")
        assert_good_diagnostics(diags, text[:cut] + "\n")


# ---------------------------------------------------------------- random bytes and text


@settings(max_examples=int(400 * SCALE), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600))
def test_random_bytes_as_text(data: bytes) -> None:
    for text in {data.decode("latin-1"), data.decode("utf-8", errors="replace")}:
        if not _is_path_like(text):
            run_front_end(text)


@settings(max_examples=int(150 * SCALE), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600))
def test_random_bytes_as_a_file(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "input.ak"
    path.write_bytes(data)
    with time_limit(TIME_LIMIT_S):
        diags = arke.check(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        assert [d.code for d in diags] == ["AK1004"], [str(d) for d in diags]
        lines = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").count(b"\n") + 1  # any line end counts
        assert 1 <= diags[0].span.line <= lines
        return
    assert_good_diagnostics(diags, text, str(path))


@settings(max_examples=int(400 * SCALE), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=400))
def test_random_unicode_text(text: str) -> None:
    if not _is_path_like(text):
        run_front_end(text)


@settings(max_examples=int(300 * SCALE), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SEEDS), st.data())
def test_random_unicode_inside_a_program(seed: str, data: st.DataObject) -> None:
    """Non-ASCII letters, digits, spaces and symbols where the program has ASCII ones."""
    at = data.draw(st.integers(0, len(seed)))
    junk = data.draw(st.text(st.characters(min_codepoint=0x80), min_size=1, max_size=8))
    run_front_end(seed[:at] + junk + seed[at:])


def test_token_soup() -> None:
    """Long runs of the language's own tokens in random order (seeded: reproducible)."""
    import random

    rng = random.Random(1234)
    for _ in range(int(100 * SCALE)):
        run_front_end(" ".join(rng.choice(VOCAB) for _ in range(rng.randint(1, 120))))


# ---------------------------------------------------------------- deep nesting

_HEADER = "kernel f(x: f32[N]) -> f32[N]\n{\n  return "
DEEP = {
    # Brackets past 200 levels are AK1006, found before any tree is built.
    "parens_5000": _HEADER + "(" * 5000 + "x[i]" + ")" * 5000 + "\n}\n",
    "unclosed_parens_5000": _HEADER + "(" * 5000 + "x[i]\n}\n",
    "bare_parens_5000": "(" * 5000,
    # Each of these adds a level to the tree per operator (a long generated sum is plausible):
    # checked, or AK1006 when too deep for the checker.
    "sum_of_1000_terms": _HEADER + " + ".join(["x[i]"] * 1000) + "\n}\n",
    "minus_1000_times": _HEADER + "-" * 1000 + "x[i]\n}\n",
    "calls_nested_1000": _HEADER + "exp(" * 1000 + "x[i]" + ")" * 1000 + "\n}\n",
}


@pytest.mark.parametrize("name", list(DEEP))
def test_deep_nesting(name: str) -> None:
    """Deep or long expressions check, or end in AK1006: never a RecursionError (or a crash)."""
    text = DEEP[name]
    run_front_end(text)
    codes = {d.code for d in arke.check(text) if d.is_error}
    assert codes <= {"AK1006", "AK1002", "AK1003"}, codes
    if name.startswith(("parens", "unclosed")):
        assert codes == {"AK1006"}, "more than 200 brackets deep is AK1006"


# ---------------------------------------------------------------- the command line


def _akc() -> list[str] | None:
    if not (ROOT / "arke" / "cli.py").exists():
        return None
    akc = Path(sys.executable).with_name("akc")
    return [str(akc)] if akc.exists() else [sys.executable, "-m", "arke"]


NASTY = {
    "binary_junk": bytes(range(256)) * 8 + b"\xff\xfe\x00kernel",
    "nul_bytes": b"kernel f(x: f32[N]) -> f32[N] {\x00 return x }\n",
    "bom_and_crlf": "\ufeffkernel f(x: f32[N]) -> f32[N]\r\n{\r\n  return x\r\n}\r\n".encode(),
    "bare_parens_5000": DEEP["bare_parens_5000"].encode(),
    "parens_5000": DEEP["parens_5000"].encode(),
    "sum_of_1000_terms": DEEP["sum_of_1000_terms"].encode(),
    # 2 MB: a long licence-style comment, a real kernel and a broken tail.
    "two_megabytes": (b"# " + b"=" * 77 + b"\n") * (2 * 1024 * 1024 // 80)
    + (ROOT / "examples" / "rmsnorm.ak").read_bytes() + b"\nkernel (",
    "two_megabyte_line": b"x" * (2 * 1024 * 1024),
}


@pytest.mark.parametrize("name", list(NASTY))
def test_cli_survives_nasty_input(name: str) -> None:
    cmd = _akc()
    if cmd is None:
        pytest.skip("arke/cli/app.py is not there yet")
    env = {k: v for k, v in os.environ.items() if k != "AKC_DEBUG"}
    proc = subprocess.run([*cmd, "check", "-"], input=NASTY[name], capture_output=True, timeout=120,
                          env=env, cwd=ROOT, check=False)
    stderr = proc.stderr.decode("utf-8", errors="replace")
    assert "Traceback" not in stderr, stderr[-2000:]
    assert proc.returncode in (0, 1, 2), f"exit {proc.returncode}: {stderr[-500:]}"


# ---------------------------------------------------------------- size


def _many_kernels(n: int, broken: bool) -> str:
    body = "".join(f"kernel k{i}(x: f32[N]) -> f32[N] {{ return x }}\n" for i in range(n))
    return body + ("kernel (\n" if broken else "")


def test_error_recovery_parses_each_item_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a syntax error every top-level item is parsed again on its own: the work is
    linear in the file's size (counted in characters handed to the parser, not in seconds)."""
    from arke.lang import parser

    parsed: list[int] = []
    real = parser._parse_one

    def counting(src: Any, text: str, diags: Any, base: int = 0) -> Any:
        parsed.append(len(text))
        return real(src, text, diags, base)

    monkeypatch.setattr(parser, "_parse_one", counting)
    text = _many_kernels(800, broken=True)
    diags = arke.check(text)
    assert [d.code for d in diags] == ["AK1002"]
    assert sum(parsed) <= 2 * len(text), f"parsed {sum(parsed)} characters of a {len(text)}-character file"


def test_too_long_expression_is_reported_where_it_is() -> None:
    text = ("kernel ok(x: f32[N]) -> f32[N]\n{\n  return x\n}\n\n" + _HEADER.replace("f(", "long(")
            + " + ".join(["x[i]"] * 6000) + "\n}\n\nkernel bad(x: f32[N]) -> f32[N]\n{\n  return y\n}\n")
    got = [(d.code, d.span.line) for d in arke.check(text) if d.is_error]
    assert ("AK1006", 8) in got and ("AK2001", 13) in got, got


@pytest.mark.parametrize("terms", [200, 300, 1000])
def test_what_check_accepts_builds_and_prints(terms: int) -> None:
    """A long chain of operators either checks and then builds and prints as IR, or is AK1006 at the check:
    the checker may go deeper than the passes and renderers after it, and what it accepts must get through."""
    import numpy as np

    from arke.ir import serialize
    from arke.ir.text import print_module
    from arke.lang.checker import MAX_EXPR_DEPTH

    text = _HEADER + " + ".join(["x[i]"] * terms) + "\n}\n"
    codes = {d.code for d in arke.check(text) if d.is_error}
    if terms + 1 > MAX_EXPR_DEPTH:
        assert codes == {"AK1006"}, codes
        return
    assert not codes
    module = arke.loads(text)
    assert print_module(module.semantic) and serialize.to_json(module.semantic)
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_allclose(arke.build(module).f(x), x * terms)


def test_a_byte_order_mark_is_no_column() -> None:
    """Editors hide a BOM: a diagnostic's column on the first line is where the editor shows the token."""
    text = "\ufeffkernel f(x: f32[N]) -> f32[N] { return x + q }\n"
    (diag,) = [d for d in arke.check(text) if d.is_error]
    assert (diag.code, diag.span.line, diag.span.col) == ("AK2001", 1, text.index("q"))


@pytest.mark.parametrize("statements", [255, 300])
def test_a_long_chain_of_statements_builds(statements: int) -> None:
    """`t1 = t0 * 1.0`, ..., each statement shallow: the checker takes it, and the fused rows kernel nests
    them into one expression a few hundred deep. The LLVM rows emitter (four Python frames a level) ran out of
    Python's default recursion at ~250: renderers now run under `deep_recursion`."""
    import numpy as np

    lines = ["kernel g(x: f32[N]) -> f32[N] {", "  t0[i] = x[i] + 1.0"]
    lines += [f"  t{k + 1}[i] = t{k}[i] * 1.0" for k in range(statements)]
    module = arke.loads("\n".join([*lines, f"  return t{statements}", "}"]) + "\n")
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(arke.build(module).g(x), x + 1)


def test_a_chain_of_kernel_calls_past_the_limit_is_AK1006() -> None:
    """500 kernels each calling the one before passed the checker; the inliner and the interpreter then
    recursed too deep. A chain longer than MAX_CALL_DEPTH is AK1006 at the call that crosses it."""
    import numpy as np

    from arke.lang.checker import MAX_CALL_DEPTH

    lines = ["kernel g0(x: f32[N]) -> f32[N] { return x[n] + 1.0 }"]
    lines += [f"kernel g{k}(x: f32[N]) -> f32[N] {{ return g{k - 1}(x) }}" for k in range(1, 200)]
    [diag] = arke.check("\n".join(lines) + "\n")
    assert (diag.code, diag.span.line) == ("AK1006", MAX_CALL_DEPTH + 1), diag
    module = arke.loads("\n".join(lines[:MAX_CALL_DEPTH]) + "\n")
    x = np.arange(3, dtype=np.float32)
    name = f"g{MAX_CALL_DEPTH - 1}"
    np.testing.assert_array_equal(module.kernels[name](x), x + 1)
    np.testing.assert_array_equal(getattr(arke.build(module), name)(x), x + 1)
