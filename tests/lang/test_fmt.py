"""The formatter (``arke.lang.fmt``) and ``akc fmt`` (``arke.cli.fmt``).

What must hold for every program: formatting is idempotent, keeps every comment, and
keeps the meaning (the SemanticIR and StrategyIR texts, or the diagnostics, are the same).
It is checked over the standard library, the examples, every example of the language
spec, hand-made messy programs, and random re-spacings and commentings of all of those.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import re
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arke
from arke.cli.app import UsageError
from arke.cli.fmt import add_parser
from arke.ir import text as ir_text
from arke.lang.fmt import FormatError, format_source
from arke.lang.fmt_layout import WIDTH
from arke.lang.lark_parser import _lark

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted([*(ROOT / "arke" / "stdlib").glob("*.ak"), *(ROOT / "examples").glob("*.ak")])
_FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
SPEC_BLOCKS = [m.group(2) for m in _FENCE.finditer((ROOT / "spec" / "language.md").read_text(encoding="utf-8"))
               if m.group(1) == "ak"]

# ---------------------------------------------------------------- messy programs

ODD_SPACING = """\
import std.nn ;
from   std.nn import softmax,rmsnorm
;
kernel f( x :f32[ M,N ] , w:f32[N],eps : f32=1e-6 , ) -> f32[M,N]{
inv[m]=rsqrt(mean(x[m,n]*x[m,n] for n)+eps) ; y[m,n]=x[m,n]*inv[m]*w[n]
          return y[m,n]*-1.0+ - -2.0 }
kernel g(x: f32[N], k: i64 = -1) -> f32[N] where N in {1,2,4,},N>=1 { return -x[i] ** 2 if not (x[i] > 0.0 and x[i] < 1.0) or k in {1,2,} else x[i] }
"""  # noqa: E501

ODD_SPACING_FORMATTED = """\
import std.nn
from std.nn import softmax, rmsnorm

kernel f(x: f32[M, N], w: f32[N], eps: f32 = 1e-6) -> f32[M, N] {
  inv[m] = rsqrt(mean(x[m, n] * x[m, n] for n) + eps)
  y[m, n] = x[m, n] * inv[m] * w[n]
  return y[m, n] * -1.0 + - -2.0
}

kernel g(x: f32[N], k: i64 = -1) -> f32[N]
  where N in {1, 2, 4}, N >= 1
{
  return -x[i] ** 2 if not (x[i] > 0.0 and x[i] < 1.0) or k in {1, 2} else x[i]
}
"""

COMMENTS_EVERYWHERE = """\
# header comment


# second header paragraph
import std.nn   # trailing on an import
# about f
kernel f(x: f32[M, N],   # the input
         w: f32[N],
         # the epsilon, alone on its line
         eps: f32 = 1e-6) -> f32[M, N]
  where M >= 1,   N % 2 == 0   # even
{   # opening
  inv[m] = rsqrt(mean(x[m, n] * x[m, n]   # squares
                      for n) + eps)   # inverse norm
  y[m, n] = x[m, n] * inv[m] * w[n]; z[m, n] = y[m, n]  # two statements


  # before the return

  return z # done
  # end of the body
}
@strategy(f, target = llvm, when M >= 128 and N % 64 == 0) {  # big
  parallel m   # rows
  # vectors
  vectorize n = 16;   tile m = 64, n = 64
  # end of the strategy
}
# trailing file comment

# and a last one
"""

COMMENTS_FORMATTED = """\
# header comment

# second header paragraph
import std.nn  # trailing on an import

# about f
kernel f(x: f32[M, N],  # the input
         w: f32[N],
         # the epsilon, alone on its line
         eps: f32 = 1e-6)
    -> f32[M, N]
  where M >= 1,
        N % 2 == 0  # even
{  # opening
  # squares
  inv[m] = rsqrt(mean(x[m, n] * x[m, n] for n) + eps)  # inverse norm
  y[m, n] = x[m, n] * inv[m] * w[n]
  z[m, n] = y[m, n]  # two statements

  # before the return

  return z  # done
  # end of the body
}

@strategy(f, target = llvm, when M >= 128 and N % 64 == 0) {  # big
  parallel m  # rows
  # vectors
  vectorize n = 16
  tile m = 64, n = 64
  # end of the strategy
}
# trailing file comment

# and a last one
"""

LONG_SIGNATURES = """\
kernel very_long_kernel_name_for_testing(alpha: f32[B, H, S, D], beta: f32[B, G, T, D], gamma: f32[B, G, T, D], delta: f32 = 1.0) -> (out_a: f32[B, H, S, D], out_b: f32[B, H, S, D]) where H % G == 0, T >= S, D % 16 == 0 or D in {1, 2, 4, 8} {
  let R = H / G
  out_a[b, h, i, d] = alpha[b, h, i, d] * beta[b, h / R, i, d] + gamma[b, h / R, i, d] * delta + alpha[b, h, i, d] * alpha[b, h, i, d] * beta[b, h / R, i, d] - gamma[b, h / R, i, d]
  out_b[b, h, i, d] = sum(alpha[b, h, i, e] * beta[b, h / R, j, e] * gamma[b, h / R, j, d] * delta * delta * delta * delta for e) / f32(T)
}
kernel pick(x: f32[N], y: f32[N]) -> f32[N] {
  return x[i] if x[i] > y[i] and x[i] > 0.0 and y[i] > 0.0 and x[i] + y[i] > 1.0 else y[i] if y[i] > 100000.0 else x[i] + y[i] + 1.0
}
kernel just_outputs_too_long(first_long_argument: f32[M, N], second_long_argument: f32[M, N]) -> f32[M, N] {
  return first_long_argument + second_long_argument
}
"""  # noqa: E501

LONG_FORMATTED = """\
kernel very_long_kernel_name_for_testing(alpha: f32[B, H, S, D], beta: f32[B, G, T, D],
                                         gamma: f32[B, G, T, D], delta: f32 = 1.0)
    -> (out_a: f32[B, H, S, D], out_b: f32[B, H, S, D])
  where H % G == 0, T >= S, D % 16 == 0 or D in {1, 2, 4, 8}
{
  let R = H / G
  out_a[b, h, i, d] = alpha[b, h, i, d] * beta[b, h / R, i, d] + gamma[b, h / R, i, d] * delta
      + alpha[b, h, i, d] * alpha[b, h, i, d] * beta[b, h / R, i, d] - gamma[b, h / R, i, d]
  out_b[b, h, i, d] = sum(alpha[b, h, i, e] * beta[b, h / R, j, e] * gamma[b, h / R, j, d] * delta
                          * delta * delta * delta for e) / f32(T)
}

kernel pick(x: f32[N], y: f32[N]) -> f32[N] {
  return x[i] if x[i] > y[i] and x[i] > 0.0 and y[i] > 0.0 and x[i] + y[i] > 1.0
      else y[i] if y[i] > 100000.0
      else x[i] + y[i] + 1.0
}

kernel just_outputs_too_long(first_long_argument: f32[M, N], second_long_argument: f32[M, N])
    -> f32[M, N]
{
  return first_long_argument + second_long_argument
}
"""

STRATEGIES = """\
kernel mm(a: f32[M, K], b: f32[K, N]) -> f32[M, N] { return sum(a[m, k] * b[k, n] for k) }
@strategy( mm , target=llvm ){parallel m;tile m=64,n=64;vectorize n=16 split k = 4 threads=8 pack b}
@strategy(mm,target = triton,when M>=128 and N%64==0,){ tile m = 128, n = 64 ; warps=4; stages = 3; }
@strategy(mm, when M in {1, 2} or (K > 4096 and not N < 8)) {
  tile m=16
}
"""

STRATEGIES_FORMATTED = """\
kernel mm(a: f32[M, K], b: f32[K, N]) -> f32[M, N] {
  return sum(a[m, k] * b[k, n] for k)
}

@strategy(mm, target = llvm) {
  parallel m
  tile m = 64, n = 64
  vectorize n = 16
  split k = 4
  threads = 8
  pack b
}

@strategy(mm, target = triton, when M >= 128 and N % 64 == 0) {
  tile m = 128, n = 64
  warps = 4
  stages = 3
}

@strategy(mm, when M in {1, 2} or (K > 4096 and not N < 8)) {
  tile m = 16
}
"""

GOLDEN = {
    "odd_spacing": (ODD_SPACING, ODD_SPACING_FORMATTED),
    "comments_everywhere": (COMMENTS_EVERYWHERE, COMMENTS_FORMATTED),
    "long_signatures": (LONG_SIGNATURES, LONG_FORMATTED),
    "strategies": (STRATEGIES, STRATEGIES_FORMATTED),
}

# Every program the invariants are checked on: name -> (text, path it is checked as).
PROGRAMS: dict[str, tuple[str, str]] = {
    **{str(p.relative_to(ROOT)): (p.read_text(encoding="utf-8"), str(p)) for p in SHIPPED},
    **{f"spec_block_{k}": (text, "<input>") for k, text in enumerate(SPEC_BLOCKS)},
    **{name: (messy, "<input>") for name, (messy, _) in GOLDEN.items()},
}


# ---------------------------------------------------------------- helpers


# A guard keeps the source spelling of its `where` clause for messages (`where N > 1 as "N>1"`).
_SPELLING = re.compile(r'^(  where .*) as ".*"$', re.MULTILINE)


def meaning(text: str, path: str) -> tuple[str, ...]:
    """What a program means: its SemanticIR and StrategyIR texts, or its diagnostic codes."""
    try:
        module = arke.loads(text, path)
    except arke.CheckError as err:
        return ("errors", *sorted(d.code for d in err.diagnostics))
    semantic = _SPELLING.sub(r"\1", ir_text.print_module(module.semantic))
    return semantic, ir_text.print_strategies(module.strategies)


def comments(text: str) -> list[str]:
    return sorted(str(t).rstrip() for t in _lark().lex(text, dont_ignore=True) if t.type == "COMMENT")


def formats(text: str, path: str = "<input>") -> bool:
    try:
        format_source(text, path)
    except FormatError:
        return False
    return True


# The programs without syntax errors (a few spec examples show syntax errors on purpose).
FORMATTABLE = sorted(n for n in PROGRAMS if formats(PROGRAMS[n][0]))


def assert_invariants(text: str, path: str) -> str:
    """Format ``text``: idempotent, every comment kept, same meaning. Returns the formatted text."""
    out = format_source(text, path)
    assert format_source(out, path) == out, "formatting is not idempotent"
    assert comments(out) == comments(text), "comments were lost or changed"
    assert meaning(out, path) == meaning(text, path), "formatting changed the program"
    return out


# ---------------------------------------------------------------- the layout


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_messy_programs_get_the_canonical_layout(name: str) -> None:
    messy, expected = GOLDEN[name]
    assert format_source(messy) == expected
    assert format_source(expected) == expected


@pytest.mark.parametrize("name", FORMATTABLE)
def test_idempotent_keeps_comments_and_meaning(name: str) -> None:
    assert_invariants(*PROGRAMS[name])


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_stdlib_and_examples_are_formatted(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert format_source(text, str(path)) == text, f"run `akc fmt {path.relative_to(ROOT)}`"


def test_lines_stay_within_the_width_when_they_can() -> None:
    for name in FORMATTABLE:
        long = [line for line in format_source(*PROGRAMS[name]).splitlines() if len(line) > WIDTH]
        assert not long, long


def test_semicolons_and_trailing_commas_go_and_a_sign_stays_apart() -> None:
    out = format_source("kernel f(x: f32[N],) -> f32[N] { y[i,] = - -x[i,]; return y; };")
    assert out == "kernel f(x: f32[N]) -> f32[N] {\n  y[i] = - -x[i]\n  return y\n}\n"


def test_empty_bodies_files_and_odd_input() -> None:
    assert format_source("") == ""
    assert format_source(" \n\n\t\n") == ""
    assert format_source(";;") == ""
    assert format_source("# only\n\n\n\n# comments   \n") == "# only\n\n# comments\n"
    assert format_source("@strategy(f) {}") == "@strategy(f) {\n}\n"
    assert format_source("kernel f() {   # nothing yet\n}") == "kernel f() {  # nothing yet\n}\n"
    # a byte-order mark and Windows line ends are not kept
    crlf = "\ufeffkernel f(x: f32[N]) -> f32[N] {\r\n  return x  # c\r\n}\r\n"
    assert format_source(crlf) == "kernel f(x: f32[N]) -> f32[N] {\n  return x  # c\n}\n"


def test_blank_lines_between_items_are_one_and_kept_between_imports() -> None:
    text = "import a\n\n\n\nimport b\nimport c\nkernel f() {\n}\n\n\n\nkernel g() {\n\n\n  y = 1\n\n\n  return y\n\n}\n"
    assert format_source(text) == ("import a\n\nimport b\nimport c\n\nkernel f() {\n}\n\n"
                                   "kernel g() {\n  y = 1\n\n  return y\n}\n")


# ---------------------------------------------------------------- comments


def test_end_of_line_comments_of_joined_lines_move_above() -> None:
    text = "kernel f(x: f32[N]) -> f32[N] {\n  a = x\n\n  y = a +   # first\n      x     # second\n  return y\n}\n"
    assert format_source(text) == ("kernel f(x: f32[N]) -> f32[N] {\n  a = x\n\n"
                                   "  # first\n  y = a + x  # second\n  return y\n}\n")


def test_a_comment_inside_a_list_puts_one_entry_per_line() -> None:
    text = "kernel f(a: f32[N], b: f32[N], c: f32[N]) -> (y: f32[N],  # first\n z: f32[N]) {\n}\n"
    assert format_source(text) == ("kernel f(a: f32[N], b: f32[N], c: f32[N])\n"
                                   "    -> (y: f32[N],  # first\n"
                                   "        z: f32[N])\n"
                                   "{\n}\n")


def test_comments_between_any_two_tokens_are_kept() -> None:
    for name in FORMATTABLE:
        text, path = PROGRAMS[name]
        tokens = list(_lark().lex(text, dont_ignore=True))
        pieces = []
        for k, tok in enumerate(tokens):
            pieces.append(str(tok))
            if tok.type not in ("WS", "COMMENT"):
                pieces.append(f"  # after {k}\n" if k % 2 else f"\n# before {k + 1}\n")
        assert_invariants("".join(pieces), path)


# ---------------------------------------------------------------- random re-spacing


_WORDS = frozenset({"NAME", "INT", "FLOAT", "BAD_NUMBER"})


def respace(text: str, rng: random.Random, comment_rate: float = 0.0) -> str:
    """``text`` with its white space changed where the layout does not depend on it.

    Spaces, tabs and single line breaks between tokens are replaced at random (added where
    there were none, removed next to punctuation); a blank line stays a blank line (of any
    length), and the line structure around comments stays as it was. With ``comment_rate``,
    comments are added after tokens.
    """
    tokens = list(_lark().lex(text, dont_ignore=True))
    out: list[str] = []

    def spaces() -> str:
        return rng.choice(["", " ", "  ", "\t", "   "])

    for k, tok in enumerate(tokens):
        prev = tokens[k - 1] if k else None
        nxt = tokens[k + 1] if k + 1 < len(tokens) else None
        if tok.type != "WS":
            out.append(str(tok))
            if comment_rate and tok.type != "COMMENT" and rng.random() < comment_rate:
                out.append(rng.choice(["  # c\n", "\n# alone\n", "\n\n  # after a blank\n\n"]))
            elif tok.type != "COMMENT" and nxt is not None and nxt.type not in ("WS", "COMMENT") \
                    and rng.random() < 0.3:
                out.append(rng.choice([" ", "\n", "  \t"]))
            continue
        breaks = str(tok).count("\n")
        by_comment = any(t is not None and t.type == "COMMENT" for t in (prev, nxt))
        if breaks >= 2:
            out.append(spaces() + "\n" * rng.randint(2, 4) + spaces())
        elif breaks == 1 or by_comment:  # a comment's line must stay as it is
            out.append(spaces() + "\n" * breaks + spaces() or " ")
        else:
            glued = prev is not None and nxt is not None and not (prev.type in _WORDS and nxt.type in _WORDS) \
                and not (str(prev)[-1].isalnum() and str(nxt)[0].isalnum())
            out.append(rng.choice(["", " ", "\n", "  "] if glued else [" ", "\n", "\t "]))
    respaced = "".join(out)
    code = [(t.type, str(t)) for t in _lark().lex(respaced)]
    assert code == [(t.type, str(t)) for t in _lark().lex(text)], "the re-spacing changed the tokens"
    return respaced



# Derandomized: the same examples on every run, so CI never fails by chance.
PROPERTY = settings(deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.large_base_example, HealthCheck.too_slow])


@settings(PROPERTY, max_examples=120)
@given(st.sampled_from(FORMATTABLE), st.randoms(use_true_random=False))
def test_any_respacing_formats_to_the_same_text(name: str, rng: random.Random) -> None:
    text, path = PROGRAMS[name]
    assert format_source(respace(text, rng), path) == format_source(text, path)


@settings(PROPERTY, max_examples=80)
@given(st.sampled_from(FORMATTABLE), st.randoms(use_true_random=False))
def test_any_commenting_keeps_the_invariants(name: str, rng: random.Random) -> None:
    text, path = PROGRAMS[name]
    assert_invariants(respace(text, rng, comment_rate=0.15), path)


# ---------------------------------------------------------------- syntax errors


def test_a_program_with_syntax_errors_is_refused_with_its_diagnostics() -> None:
    text = "kernel f(x: f32[N]) -> f32[N] { return x[i] $ 2.0 }\nkernel g(x: f32[N]) -> f32[N] { return x[\n"
    with pytest.raises(FormatError) as info:
        format_source(text, "bad.ak")
    assert [(d.code, d.span.line) for d in info.value.diagnostics] == [("AK1001", 1), ("AK1003", 2)]
    assert "bad.ak:1:45: error[AK1001]" in str(info.value)
    for text in ("kernel f(x: f32[N]) -> f32[N] { return x * 2.5e }", "@strat(f) {}"):
        with pytest.raises(FormatError):
            format_source(text)


def test_other_errors_do_not_stop_formatting() -> None:
    text = "kernel f(x: f32[N])->f32[N]{return q}"  # AK2001: the program is wrong but parses
    assert format_source(text) == "kernel f(x: f32[N]) -> f32[N] {\n  return q\n}\n"


# ---------------------------------------------------------------- akc fmt


def akc_fmt(*argv: str) -> int:
    """``akc fmt ARGV`` in process, through a parser holding only ``fmt``."""
    parser = argparse.ArgumentParser(prog="akc")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["fmt", *argv])
    status: int = args.handler(args)
    return status


@pytest.fixture(autouse=True)
def _plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("FORCE_COLOR", raising=False)


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    """A folder of programs: messy ones (also nested), a formatted one, a hidden folder and other files."""
    (tmp_path / "a.ak").write_text(ODD_SPACING, encoding="utf-8")
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "sub" / "b.ak").write_text(STRATEGIES, encoding="utf-8")
    (tmp_path / "sub" / "deeper" / "c.ak").write_text(COMMENTS_EVERYWHERE, encoding="utf-8")
    (tmp_path / "sub" / "ok.ak").write_text(STRATEGIES_FORMATTED, encoding="utf-8")
    (tmp_path / "sub" / "notes.txt").write_text("kernel   not a program", encoding="utf-8")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "h.ak").write_text(ODD_SPACING, encoding="utf-8")
    return tmp_path


def snapshot(folder: Path) -> dict[str, tuple[bytes, int, int]]:
    """Each file's bytes, inode and modification time: a rewrite changes the inode (atomic rename)."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_check_lists_what_would_change_and_writes_nothing(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(tree)
    assert akc_fmt(str(tree), "--check") == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"would reformat {tree / 'a.ak'}", f"would reformat {tree / 'sub' / 'b.ak'}",
                                f"would reformat {tree / 'sub' / 'deeper' / 'c.ak'}"]
    assert "3 files would be reformatted, 1 file already formatted" in err
    assert snapshot(tree) == before
    assert akc_fmt(str(tree / "sub" / "ok.ak"), "--check") == 0


def test_fmt_rewrites_folders_recursively_and_only_what_changes(tree: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(tree)
    assert akc_fmt(str(tree)) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines()[:3] == [f"reformatted {tree / 'a.ak'}", f"reformatted {tree / 'sub' / 'b.ak'}",
                                    f"reformatted {tree / 'sub' / 'deeper' / 'c.ak'}"]
    assert "3 files reformatted, 1 file left unchanged" in err
    assert (tree / "a.ak").read_text(encoding="utf-8") == ODD_SPACING_FORMATTED
    assert (tree / "sub" / "b.ak").read_text(encoding="utf-8") == STRATEGIES_FORMATTED
    assert (tree / "sub" / "deeper" / "c.ak").read_text(encoding="utf-8") == COMMENTS_FORMATTED
    after = snapshot(tree)
    for untouched in ("sub/ok.ak", "sub/notes.txt", ".hidden/h.ak"):
        assert after[untouched] == before[untouched]  # not even rewritten: same bytes, same time
    assert not [p for p in tree.rglob("*.tmp")], "a temporary file was left behind"
    assert akc_fmt(str(tree), "--check") == 0
    assert akc_fmt(str(tree)) == 0
    assert snapshot(tree) == after


def test_a_file_with_syntax_errors_is_left_alone(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tree / "bad.ak"
    bad.write_text("kernel f(x: f32[N]) -> f32[N] {\n  return x[i] $ 2.0\n}\n", encoding="utf-8")
    before = bad.read_bytes()
    assert akc_fmt(str(bad), str(tree / "a.ak")) == 1
    _, err = capsys.readouterr()
    assert f"{bad}:2:15: error[AK1001]" in err
    assert "1 file with syntax errors left as they are" in err
    assert bad.read_bytes() == before
    assert (tree / "a.ak").read_text(encoding="utf-8") == ODD_SPACING_FORMATTED  # the others are still done
    assert akc_fmt(str(bad), "--check") == 1


def test_stdin_is_formatted_to_stdout(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(STRATEGIES))
    assert akc_fmt("-") == 0
    assert capsys.readouterr().out == STRATEGIES_FORMATTED
    monkeypatch.setattr("sys.stdin", io.StringIO(STRATEGIES))
    assert akc_fmt("-", "--check") == 1
    assert capsys.readouterr().out == "would reformat -\n"


def test_unreadable_files_and_empty_folders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert akc_fmt(str(tmp_path / "missing.ak")) == 2
    assert "AK1004" in capsys.readouterr().err
    (tmp_path / "latin1.ak").write_bytes(b"# caf\xe9\n")
    assert akc_fmt(str(tmp_path / "latin1.ak")) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UsageError, match=r"no \.ak files"):
        akc_fmt(str(empty))


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions and links")
def test_rewriting_keeps_permissions_and_links(tmp_path: Path) -> None:
    target = tmp_path / "real.ak"
    target.write_text(ODD_SPACING, encoding="utf-8")
    target.chmod(0o640)
    link = tmp_path / "link.ak"
    link.symlink_to(target)
    assert akc_fmt(str(link)) == 0
    assert link.is_symlink()
    assert target.read_text(encoding="utf-8") == ODD_SPACING_FORMATTED
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_check_passes_on_the_stdlib_and_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert akc_fmt(str(ROOT / "arke" / "stdlib"), str(ROOT / "examples"), "--check") == 0
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("where", ["kernel # c\ngroup_norm(", "kernel group_norm # c\n("])
def test_a_comment_before_a_long_header_settles_after_one_pass(where: str) -> None:
    """A comment after `kernel` or the name ends the header's first line: the parameters go one per line from
    the first pass (after a pass such a comment sits in the list), so the second pass changes nothing."""
    src = (where + "x: f32[B, C, L], w: f32[C], b: f32[C], G: dim = 32, eps: f32 = 1e-5) -> f32[B, C, L] {\n"
           "  return x[n, c, l]\n}\n")
    once = format_source(src)
    assert format_source(once) == once and "# c" in once


def test_a_comment_after_the_arrow_of_a_long_header_settles_after_one_pass() -> None:
    """A comment after `->` went after the outputs' `)` on the first pass, where the second pass found it in the
    list and laid the outputs one per line: the first pass now does so already."""
    src = ("kernel qkv_projection_long_name(x: f32[N, C], wn: f32[C], bn: f32[C], wq: f32[C, C], bq: f32[C], "
           "eps: f32 = 1e-5) ->  # c\n(q: f32[N, C], k: f32[N, C], v: f32[N, C]) {\n  return x, x, x\n}\n")
    once = format_source(src)
    assert format_source(once) == once and "# c" in once
