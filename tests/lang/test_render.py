"""The two renderings of diagnostics: text for people (carets, hints, notes) and LSP JSON."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

import arke
from arke.lang.diagnostics import Diagnostic, Related, make
from arke.lang.render import (
    Sources,
    file_report,
    print_diagnostics,
    render_text,
    summary,
    to_lsp,
    uri_for,
    use_color,
)
from arke.lang.source import Source, Span

PROGRAM = """\
kernel softmax(x: f32[M, N]) -> f32[M, N]
{
  mx[m] = max(x[m, n] for n)
  e[m, n] = exp(x[m, n] - mx[m])
  return e[m, n] / sum(e[m, k] for q)
}
"""
PATH = "prog.ak"


def span_of(needle: str, text: str = PROGRAM, path: str = PATH, nth: int = 0) -> Span:
    """The span of the ``nth`` occurrence of ``needle`` in ``text``."""
    start = -1
    for _ in range(nth + 1):
        start = text.index(needle, start + 1)
    return Source(path, text).span(start, start + len(needle))


def lines_of(diags: list[Diagnostic], texts: dict[str, str] | None = None) -> list[str]:
    return render_text(diags, {PATH: PROGRAM} if texts is None else texts).splitlines()


def caret_col(line: str) -> int:
    """0-based position of the first mark under the gutter (`  | `) of a caret line."""
    body = line.split("| ", 1)[1]
    return len(body) - len(body.lstrip(" "))


# ---------------------------------------------------------------- text


def test_header_source_line_and_caret_under_the_span() -> None:
    diag = make("AK2104", "index `q` is not bound", span_of("q"), hint="did you mean `k`?")
    out = lines_of([diag])
    assert out[0] == "prog.ak:5:36: error[AK2104]: index `q` is not bound"
    assert out[1] == "5 |   return e[m, n] / sum(e[m, k] for q)"
    assert out[2].startswith("  | ")
    assert out[2].endswith("^ did you mean `k`?")
    # the caret sits exactly under `q` of the source line
    assert caret_col(out[2]) == out[1].split("| ", 1)[1].index("q")


def test_underline_covers_the_whole_span() -> None:
    diag = make("AK3004", "shapes do not broadcast", span_of("exp(x[m, n] - mx[m])"))
    out = lines_of([diag])
    src, marks = out[1].split("| ", 1)[1], out[2].split("| ", 1)[1]
    start = src.index("exp(")
    assert marks == " " * start + "^" + "~" * (len("exp(x[m, n] - mx[m])") - 1)


def test_empty_span_gets_one_caret() -> None:
    text = "kernel f(x: f32[N]) -> f32[N] {\n  return x[n] +\n"
    diag = make("AK1003", "the file ends too early", Source(PATH, text).span(len(text) - 1, len(text) - 1))
    out = lines_of([diag], {PATH: text})
    assert out[1] == "2 |   return x[n] +"
    assert out[2].rstrip().endswith("^")
    assert caret_col(out[2]) == len("  return x[n] +")


def test_tabs_keep_the_caret_aligned() -> None:
    text = "kernel f(x: f32[N]) -> f32[N] {\n\treturn y[n]\n}\n"
    diag = make("AK2001", "unknown name `y`", span_of("y", text))
    out = lines_of([diag], {PATH: text})
    shown = out[1].split("| ", 1)[1]
    assert "\t" not in shown
    assert caret_col(out[2]) == shown.index("y")


def test_multi_line_span_marks_first_and_last_line_and_puts_the_hint_last() -> None:
    text = "kernel f(x: f32[N]) -> f32[N] {\n  y[n] = x[n] +\n     2 * x[n]\n  return y\n}\n"
    start = text.index("x[n] +")
    end = text.index("2 * x[n]") + len("2 * x[n]")
    diag = make("AK3004", "shapes do not broadcast", Source(PATH, text).span(start, end), hint="a hint")
    out = lines_of([diag], {PATH: text})
    assert out[1] == "2 |   y[n] = x[n] +"
    assert out[2].split("| ", 1)[1] == " " * len("  y[n] = ") + "^~~~~~"
    assert out[3] == "3 |      2 * x[n]"
    assert out[4].split("| ", 1)[1] == "     ~~~~~~~~ a hint"
    assert "a hint" not in out[2]


def test_long_multi_line_span_elides_the_middle() -> None:
    start = PROGRAM.index("mx[m] =")
    end = PROGRAM.index("for q)") + len("for q)")
    diag = make("AK2203", "statement after return", Source(PATH, PROGRAM).span(start, end))
    out = lines_of([diag])
    assert out[1].startswith("3 |")
    assert out[3].strip() == "..."
    assert out[4].startswith("5 |")


def test_related_information_shows_its_own_source_line() -> None:
    first = span_of("mx[m]")
    again = span_of("e[m, n] =")
    diag = make("AK2003", "`e` is defined twice", again, hint="rename one of them",
                related=[Related(first, "first defined here")])
    out = lines_of([diag])
    note = out.index("prog.ak:3:3: note: first defined here")
    assert out[note + 1] == "3 |   mx[m] = max(x[m, n] for n)"
    assert out[note + 2] == "  |   ^~~~~"


def test_gutter_width_follows_the_widest_line_number() -> None:
    text = "\n" * 9 + "kernel f(x: f32[N]) -> f32[N] {\n  return\n  x[n]\n}\n"
    start = text.index("kernel")
    diag = make("AK1002", "bad", Source(PATH, text).span(start, text.index("return") + 6))
    out = lines_of([diag], {PATH: text})
    assert out[1].startswith("10 | kernel")
    assert out[2].startswith("   | ^")
    assert out[3].startswith("11 |   return")


def test_without_source_text_the_hint_stands_alone() -> None:
    diag = make("AK1004", "cannot read `gone.ak`: No such file or directory", Span("gone.ak", 1, 1, 1, 1),
                hint="check the path and its permissions")
    out = render_text([diag]).splitlines()
    assert out == ["gone.ak:1:1: error[AK1004]: cannot read `gone.ak`: No such file or directory",
                   "  = hint: check the path and its permissions"]


def test_sources_are_read_from_disk_when_not_given(tmp_path: Path) -> None:
    path = tmp_path / "prog.ak"
    path.write_text(PROGRAM, encoding="utf-8")
    diag = make("AK2104", "index `q` is not bound", span_of("q)", path=str(path)))
    assert "5 |   return e[m, n]" in render_text([diag])


def test_control_characters_are_neutralised() -> None:
    text = "kernel f() {\x1b[31m}\n"
    diag = make("AK1001", "unexpected character `\x1b`", Source(PATH, text).span(12, 13))
    out = render_text([diag], {PATH: text})
    assert "\x1b" not in out
    assert "\ufffd" in out


def test_warnings_are_labelled_as_such() -> None:
    diag = make("AK2301", "`e` is defined but never used", span_of("e[m, n] ="))
    assert lines_of([diag])[0].startswith("prog.ak:4:3: warning[AK2301]:")


def test_a_real_syntax_error_renders_with_a_caret() -> None:
    text = "kernel f(x: f32[N]) -> f32[N]\n{\n  return x[n] +\n}\n"
    diags = arke.check(text, path=PATH)
    assert diags and diags[0].code == "AK1002"
    out = render_text(diags, {PATH: text}).splitlines()
    assert out[0].startswith("prog.ak:4:1: error[AK1002]")
    assert out[1:3] == ["4 | }", "  | ^"]


# ---------------------------------------------------------------- colour


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture()
def no_color_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)


def test_no_colour_when_not_a_terminal(no_color_env: None) -> None:
    stream = io.StringIO()
    print_diagnostics([make("AK2104", "x", span_of("q"), hint="h")], {PATH: PROGRAM}, stream)
    assert "\x1b[" not in stream.getvalue()
    assert stream.getvalue() == render_text([make("AK2104", "x", span_of("q"), hint="h")], {PATH: PROGRAM})


def test_colour_on_a_terminal(no_color_env: None) -> None:
    stream = FakeTerminal()
    assert use_color(stream)
    print_diagnostics([make("AK2104", "x", span_of("q"))], {PATH: PROGRAM}, stream)
    assert "\x1b[" in stream.getvalue()
    assert "error[AK2104]" in stream.getvalue()


def test_no_color_wins_over_a_terminal(no_color_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    stream = FakeTerminal()
    print_diagnostics([make("AK2104", "x", span_of("q"))], {PATH: PROGRAM}, stream)
    assert "\x1b[" not in stream.getvalue()


def test_force_color(no_color_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert use_color(io.StringIO())


# ---------------------------------------------------------------- summary


@pytest.mark.parametrize(("codes", "files", "expected"), [
    ((), 3, "ok: 3 files"),
    ((), 1, "ok: 1 file"),
    (("AK2104", "AK1002", "AK2301"), 3, "2 errors, 1 warning in 3 files"),
    (("AK2301",), 1, "1 warning in 1 file"),
    (("AK2104",), 2, "1 error in 2 files"),
])
def test_summary(codes: tuple[str, ...], files: int, expected: str) -> None:
    assert summary([make(c, "m", span_of("q")) for c in codes], files) == expected


# ---------------------------------------------------------------- LSP


def test_lsp_diagnostic_has_zero_based_range_and_lsp_fields(tmp_path: Path) -> None:
    other = str(tmp_path / "lib.ak")
    diag = make("AK2104", "index `q` is not bound", span_of("q"), hint="did you mean `k`?",
                related=[Related(Span(other, 2, 3, 2, 8, 0, 0), "first defined here")], replacement="k")
    obj = to_lsp(diag, {PATH: PROGRAM})
    assert obj["range"] == {"start": {"line": 4, "character": 35}, "end": {"line": 4, "character": 36}}
    assert obj["severity"] == 1
    assert obj["code"] == "AK2104"
    assert obj["source"] == "akc"
    assert obj["message"] == "index `q` is not bound\nhint: did you mean `k`?"
    assert obj["data"] == {"replacement": "k"}
    (rel,) = obj["relatedInformation"]
    assert rel["message"] == "first defined here"
    assert rel["location"]["uri"] == Path(other).as_uri()
    assert rel["location"]["range"] == {"start": {"line": 1, "character": 2}, "end": {"line": 1, "character": 7}}


def test_lsp_optional_fields_are_left_out() -> None:
    obj = to_lsp(make("AK2301", "unused", span_of("mx[m]")))
    assert obj["severity"] == 2
    assert obj["message"] == "unused"
    assert "data" not in obj
    assert "relatedInformation" not in obj


def test_lsp_characters_count_utf16_units() -> None:
    text = "kernel f(x: f32[N]) -> f32[N] { return g(\U0001F600, x) }\n"
    start = text.index("x)")
    obj = to_lsp(make("AK2001", "m", Source(PATH, text).span(start, start + 1)), {PATH: text})
    assert obj["range"]["start"]["character"] == start + 1  # the emoji is two UTF-16 units


def test_lsp_multi_line_range() -> None:
    start = PROGRAM.index("mx[m] =")
    end = PROGRAM.index("for q)") + len("for q)")
    obj = to_lsp(make("AK2203", "m", Source(PATH, PROGRAM).span(start, end)), {PATH: PROGRAM})
    assert obj["range"] == {"start": {"line": 2, "character": 2}, "end": {"line": 4, "character": 37}}


def test_uris(tmp_path: Path) -> None:
    assert uri_for("-") == "-"
    assert uri_for("<input>") == "<input>"
    assert uri_for("examples/rmsnorm.ak") == (Path.cwd() / "examples" / "rmsnorm.ak").as_uri()
    spaced = tmp_path / "my dir" / "a.ak"
    assert uri_for(str(spaced)).startswith("file:///")
    assert "my%20dir" in uri_for(str(spaced))


def test_file_report_shape() -> None:
    report = file_report(PATH, [make("AK2104", "m", span_of("q"))], Sources({PATH: PROGRAM}))
    assert set(report) == {"path", "uri", "diagnostics"}
    assert report["path"] == PATH
    assert report["uri"].startswith("file://")
    assert report["diagnostics"][0]["code"] == "AK2104"
