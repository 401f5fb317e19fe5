"""End-to-end tests of ``akc lsp``: a real LSP client drives the server over stdio."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.protocol import default_converter
from pytest_lsp import LanguageClient

from arke.ir.strategy import DECISIONS
from arke.lang.checker import stdlib_path

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROGRAM = """\
from std.nn import softmax

# Grouped-query attention, causal.
kernel attention(q: f32[B, H, S, D], k: f32[B, G, T, D], v: f32[B, G, T, D])
  -> f32[B, H, S, D]
  where H % G == 0, T >= S
{
  let R = H / G
  s[b, h, i, j] = sum(q[b, h, i, d] * k[b, h / R, j, d] for d) / sqrt(f32(D))
  c[b, h, i, j] = s[b, h, i, j] if j <= i + T - S else -inf
  mx[b, h, i] = max(c[b, h, i, j] for j)
  p[b, h, i, j] = exp(c[b, h, i, j] - mx[b, h, i])
  return sum(p[b, h, i, j] * v[b, h / R, j, d] for j) / sum(p[b, h, i, j] for j)
}

kernel probs(x: f32[M, N]) -> f32[M, N] {
  return softmax(x)
}

@strategy(attention, target = triton) {
  tile i = 128, j = 64
  warps = 8
}
"""

CONVERTER = default_converter()
TIMEOUT_S = 60.0  # generous: a loaded 2-core CI machine may take seconds to start and check


# ---------------------------------------------------------------- helpers


async def published(client: LanguageClient, uri: str, version: int) -> types.PublishDiagnosticsParams:
    """Wait for the diagnostics of ``uri`` at ``version``."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        for p in client.published:  # type: ignore[attr-defined]
            if p.uri == uri and p.version == version:
                return p
        await asyncio.sleep(0.01)
    raise AssertionError(f"no diagnostics for {uri} version {version} within {TIMEOUT_S} s")


def where(text: str, needle: str, nth: int = 0, delta: int = 0) -> types.Position:
    """The position of the ``nth`` occurrence of ``needle`` (plus ``delta`` characters), in UTF-16 units."""
    at = -1
    for _ in range(nth + 1):
        at = text.index(needle, at + 1)
    at += delta
    line = text.count("\n", 0, at)
    start = text.rfind("\n", 0, at) + 1
    return types.Position(line, len(text[start:at].encode("utf-16-le")) // 2)


async def open_doc(client: LanguageClient, path: Path, text: str) -> str:
    """Write ``text`` to ``path``, open it, and wait for its first diagnostics."""
    path.write_text(text, encoding="utf-8")
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "arke", 1, text)))
    await published(client, uri, 1)
    return uri


def change(client: LanguageClient, uri: str, version: int, text: str) -> None:
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        [types.TextDocumentContentChangeWholeDocument(text=text)]))


async def hover(client: LanguageClient, uri: str, pos: types.Position) -> str:
    result = await client.text_document_hover_async(types.HoverParams(types.TextDocumentIdentifier(uri), pos))
    assert result is not None, f"no hover at {pos}"
    assert isinstance(result.contents, types.MarkupContent)
    return result.contents.value


async def labels(client: LanguageClient, uri: str, pos: types.Position) -> dict[str, types.CompletionItem]:
    result = await client.text_document_completion_async(
        types.CompletionParams(types.TextDocumentIdentifier(uri), pos))
    assert isinstance(result, types.CompletionList)
    return {item.label: item for item in result.items}


def apply(text: str, edits: list[types.TextEdit]) -> str:
    """Apply LSP edits to ASCII ``text`` (last first, so earlier offsets stay valid)."""
    starts = [0] + [k + 1 for k, ch in enumerate(text) if ch == "\n"]

    def offset(p: types.Position) -> int:
        return starts[p.line] + p.character if p.line < len(starts) else len(text)

    for e in sorted(edits, key=lambda e: (e.range.start.line, e.range.start.character), reverse=True):
        text = text[:offset(e.range.start)] + e.new_text + text[offset(e.range.end):]
    return text


# ---------------------------------------------------------------- diagnostics


async def test_diagnostics_match_akc_check_and_clear_when_fixed(client: LanguageClient, workspace: Path) -> None:
    path = workspace / "errors.ak"
    text = ("kernel scale(x: f32[N], eps: f32 = 1e-6) -> f32[N] {\n"
            "  return x[i] * esp   # é is fine in a comment\n"
            "}\n"
            "kernel bad(x: f32[N]) -> f32[N] { return x[i] * 😋 }\n")
    uri = await open_doc(client, path, text)
    got = (await published(client, uri, 1)).diagnostics
    assert [d.code for d in got] == ["AK2001", "AK1001"]
    unknown, char = got
    assert unknown.range == types.Range(where(text, "esp"), where(text, "esp", delta=3))
    assert "did you mean `eps`?" in unknown.message
    # The emoji is one character but two UTF-16 code units: the range says so.
    assert char.range.start == where(text, "😋")
    assert char.range.end.character - char.range.start.character == 2

    from arke.cli.app import main as akc

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert akc(["check", "--format", "json", str(path)]) == 1
    expected = json.loads(out.getvalue())["files"][0]["diagnostics"]
    assert [CONVERTER.unstructure(d) for d in got] == expected

    change(client, uri, 2, text.replace("esp", "eps").replace(" * 😋", ""))
    assert list((await published(client, uri, 2)).diagnostics) == []


def akc_check_json(path: Path, text: str) -> list[dict[str, object]]:
    """What ``akc check --format json`` reports for ``text`` saved at ``path``."""
    from arke.cli.app import main as akc

    path.write_text(text, encoding="utf-8")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        akc(["check", "--format", "json", str(path)])
    diagnostics: list[dict[str, object]] = json.loads(out.getvalue())["files"][0]["diagnostics"]
    return diagnostics


async def test_edits_of_parts_of_the_text_publish_what_akc_check_gives(client: LanguageClient,
                                                                       workspace: Path) -> None:
    path = workspace / "incremental.ak"
    uri = await open_doc(client, path, PROGRAM)
    text = PROGRAM
    steps = [  # (old, new): replace the first `old` by `new`, as an editor sends it (a range and its text)
        ("exp(c[b, h, i, j] - mx[", "exp(c[b, h, i, j] - mxx["),  # an unknown name
        ("from std.nn", "# A header.\n\nfrom std.nn"),  # everything below moves down two lines
        ("kernel probs", "kernel attention2(x: f32[N]) -> f32[N] { return x }\n\nkernel probs"),
        ("return softmax(x)", "return softmax(x"),  # a syntax error
        ("kernel attention2", "kernel attention"),  # defined twice: related information
        ("return softmax(x", "return softmax(x)"),
        ("mxx[", "mx["),
    ]
    for version, (old, new) in enumerate(steps, start=2):
        start = text.index(old)
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            [types.TextDocumentContentChangePartial(
                range=types.Range(where(text, old), where(text, old, delta=len(old))), text=new)]))
        text = text[:start] + new + text[start + len(old):]
        got = (await published(client, uri, version)).diagnostics
        assert [CONVERTER.unstructure(d) for d in got] == akc_check_json(path, text), (old, new)
    codes = [d.code for d in got]
    assert codes == ["AK2003"] and got[0].related_information


async def test_related_information_points_at_the_first_definition(client: LanguageClient, workspace: Path) -> None:
    text = ("kernel f(x: f32[N]) -> f32[N] {\n  y[i] = x[i]\n  y[i] = x[i] * 2.0\n  return y\n}\n")
    uri = await open_doc(client, workspace / "twice.ak", text)
    (d,) = (await published(client, uri, 1)).diagnostics
    assert d.code == "AK2003"
    assert d.range.start == where(text, "y[i]", nth=1)
    (related,) = d.related_information or []
    assert related.location.uri == uri
    assert related.location.range.start == where(text, "y[i]")
    assert related.message == "first defined here"


# ---------------------------------------------------------------- hover


async def test_hover_shapes_ranges_signatures_and_decisions(client: LanguageClient, workspace: Path) -> None:
    uri = await open_doc(client, workspace / "attention.ak", PROGRAM)
    assert "s: f32[B, H, S, T]" in await hover(client, uri, where(PROGRAM, "= s[", delta=2))
    reduced = await hover(client, uri, where(PROGRAM, "for j)", delta=4))
    assert "j: 0 ≤ j < T" in reduced and "reduced by `max`" in reduced
    assert "d: 0 ≤ d < D" in await hover(client, uri, where(PROGRAM, "j, d] for j", delta=3))
    assert "mx: f32[B, H, S]" in await hover(client, uri, where(PROGRAM, "mx[b", nth=1))
    assert "q: f32[B, H, S, D]" in await hover(client, uri, where(PROGRAM, "q[b"))
    dim = await hover(client, uri, where(PROGRAM, "T - S", delta=0))
    assert "T: dim" in dim and "axis 2 of `k`" in dim
    assert "R = H//G" in await hover(client, uri, where(PROGRAM, "/ R,", delta=2))

    call = await hover(client, uri, where(PROGRAM, "softmax(x)"))
    assert "kernel softmax(x: f32[M, N]) -> f32[M, N]" in call and "std.nn" in call
    own = await hover(client, uri, where(PROGRAM, "@strategy(attention", delta=11))
    assert "kernel attention(q: f32[B, H, S, D]" in own and "where H % G == 0, T >= S" in own
    assert "Grouped-query attention, causal." in own

    assert DECISIONS["tile"].meaning in await hover(client, uri, where(PROGRAM, "tile i"))
    warps = await hover(client, uri, where(PROGRAM, "warps"))
    assert DECISIONS["warps"].meaning in warps and "`triton`" in warps
    assert "0 ≤ i < S" in await hover(client, uri, where(PROGRAM, "tile i", delta=5))
    assert "square root" in await hover(client, uri, where(PROGRAM, "sqrt"))


# ---------------------------------------------------------------- definition


async def definition(client: LanguageClient, uri: str, pos: types.Position) -> types.Location:
    result = await client.text_document_definition_async(
        types.DefinitionParams(types.TextDocumentIdentifier(uri), pos))
    assert isinstance(result, list) and len(result) == 1, result
    location = result[0]
    assert isinstance(location, types.Location)
    return location


async def test_definition_local_and_into_the_standard_library(client: LanguageClient, workspace: Path) -> None:
    uri = await open_doc(client, workspace / "definitions.ak", PROGRAM)
    tensor = await definition(client, uri, where(PROGRAM, "= s[", delta=2))
    assert tensor.uri == uri and tensor.range.start == where(PROGRAM, "s[b, h, i, j] = sum")
    param = await definition(client, uri, where(PROGRAM, "softmax(x)", delta=8))
    assert param.range.start == where(PROGRAM, "x: f32[M, N]")
    let = await definition(client, uri, where(PROGRAM, "/ R,", delta=2))
    assert let.range.start == where(PROGRAM, "R = H")
    index = await definition(client, uri, where(PROGRAM, "for d)", delta=-3))  # the `d` of `j, d]`
    assert index.range.start == where(PROGRAM, "for d)", delta=4)
    dim = await definition(client, uri, where(PROGRAM, "T >= S"))
    assert dim.range.start == where(PROGRAM, "T, D], v")

    stdlib = await definition(client, uri, where(PROGRAM, "softmax(x)"))
    nn = stdlib_path("std.nn")
    assert stdlib.uri == nn.as_uri()
    nn_text = nn.read_text(encoding="utf-8")
    assert stdlib.range.start == where(nn_text, "softmax(x: f32")
    module = await definition(client, uri, where(PROGRAM, "std.nn", delta=4))
    assert module.uri == nn.as_uri()
    strategy = await definition(client, uri, where(PROGRAM, "@strategy(attention", delta=12))
    assert strategy.range.start == where(PROGRAM, "attention(q")

    # A module next to the file: `import mylib` finds mylib.ak, and its kernels are one jump away.
    lib_text = "# Doubles.\nkernel double(x: f32[N]) -> f32[N] {\n  return x * 2.0\n}\n"
    (workspace / "mylib.ak").write_text(lib_text, encoding="utf-8")
    text = "import mylib\n\nkernel twice(v: f32[N]) -> f32[N] {\n  return double(v)\n}\n"
    uri2 = await open_doc(client, workspace / "uses_mylib.ak", text)
    assert list((await published(client, uri2, 1)).diagnostics) == []
    call = await definition(client, uri2, where(text, "double(v)"))
    assert call.uri == (workspace / "mylib.ak").as_uri() and call.range.start == where(lib_text, "double(x")
    assert "kernel double(x: f32[N]) -> f32[N]" in await hover(client, uri2, where(text, "double(v)"))
    assert (await definition(client, uri2, where(text, "mylib"))).uri == (workspace / "mylib.ak").as_uri()


# ---------------------------------------------------------------- completion


async def test_completion_names_kernels_builtins_and_decisions(client: LanguageClient, workspace: Path) -> None:
    uri = await open_doc(client, workspace / "complete.ak", PROGRAM)
    body = await labels(client, uri, where(PROGRAM, "p[b, h, i, j] = exp"))
    for name in ("q", "k", "v", "R", "s", "c", "mx", "B", "T", "softmax", "probs", "exp", "sqrt", "sum", "let",
                 "f32"):
        assert name in body, name
    assert "p" not in body  # defined on this line, not above it
    assert body["s"].detail == "s: f32[B, H, S, T]"
    rms = body["rmsnorm"]  # not imported: completing it adds the import
    assert rms.detail and "std.nn" in rms.detail and "eps: f32 = 1e-6" in rms.detail
    (edit,) = rms.additional_text_edits or []
    assert edit.new_text == "from std.nn import rmsnorm\n" and edit.range.start.line == 1

    triton = await labels(client, uri, where(PROGRAM, "warps = 8"))
    assert {"tile", "warps", "stages", "algorithm"} <= set(triton) and "threads" not in triton
    assert triton["warps"].detail == DECISIONS["warps"].meaning
    indices = await labels(client, uri, where(PROGRAM, "tile i", delta=5))
    assert {"b", "h", "i", "j", "d"} <= set(indices)

    text = ("kernel mm(a: f32[M, K], b: f32[K, N]) -> f32[M, N] {\n"
            "  return sum(a[m, k] * b[k, n] for k)\n}\n\n"
            "@strategy(mm, target = mlir) {\n  algorithm = materialized\n}\n\n"
            "@strategy(mm, target = llvm) {\n  threads = 4\n}\n")
    uri2 = await open_doc(client, workspace / "targets.ak", text)
    assert set(await labels(client, uri2, where(text, "materialized"))) == {"materialized"}
    llvm = await labels(client, uri2, where(text, "threads"))
    assert "threads" in llvm and "warps" not in llvm
    assert {"llvm", "triton", "cuda", "mlir"} == set(await labels(client, uri2, where(text, "mlir")))


# ---------------------------------------------------------------- symbols, formatting, quick fixes


async def test_document_symbols(client: LanguageClient, workspace: Path) -> None:
    uri = await open_doc(client, workspace / "symbols.ak", PROGRAM)
    result = await client.text_document_document_symbol_async(
        types.DocumentSymbolParams(types.TextDocumentIdentifier(uri)))
    assert result is not None
    names = [s.name for s in result]
    assert names == ["std.nn", "attention", "probs", "@strategy(attention, target = triton)"]
    attention = result[1]
    assert isinstance(attention, types.DocumentSymbol) and attention.kind == types.SymbolKind.Function
    assert [c.name for c in attention.children or []] == ["q", "k", "v", "R", "s", "c", "mx", "p"]
    strategy = result[3]
    assert isinstance(strategy, types.DocumentSymbol)
    assert [c.name for c in strategy.children or []] == ["tile", "warps"]


async def test_formatting_uses_the_formatter(client: LanguageClient, workspace: Path) -> None:
    from arke.lang.fmt import format_source

    text = "kernel f(x:f32[N])->f32[N]{y[i]=x[i]*2.0\nreturn y}\n"
    uri = await open_doc(client, workspace / "messy.ak", text)
    edits = await client.text_document_formatting_async(types.DocumentFormattingParams(
        types.TextDocumentIdentifier(uri), types.FormattingOptions(tab_size=2, insert_spaces=True)))
    assert edits
    assert apply(text, list(edits)) == format_source(text)
    assert apply(text, list(edits)) != text


async def test_a_file_with_bare_cr_line_ends_is_served_line_by_line(client: LanguageClient, workspace: Path) -> None:
    """A bare CR ends a line to LSP as to the checker: formatting edits, hover and the diagnostics of every item
    are where the client has them (a server counting only LF put the whole file on line 0)."""
    from arke.lang.fmt import format_source

    text = "kernel f(x: f32[N]) -> f32[N] {\r  y[i] = x[i] + 1.0\r  return  y[i]+1.0\r}\r"
    uri = await open_doc(client, workspace / "mac.ak", text)
    edits = await client.text_document_formatting_async(types.DocumentFormattingParams(
        types.TextDocumentIdentifier(uri), types.FormattingOptions(tab_size=2, insert_spaces=True)))
    assert edits
    lf = text.replace("\r", "\n")  # the same lines and characters, as the client counts them
    assert apply(lf, list(edits)) == format_source(lf)
    assert "x: f32[N]" in await hover(client, uri, types.Position(1, 9))
    broken = ("kernel f(x: f32[N]) -> f32[N] {\r  return x[i] $\r}\r"
              "kernel g(x: f32[N]) -> f32[N] {\r  return q[i]\r}\r")
    uri = await open_doc(client, workspace / "mac2.ak", broken)
    got = (await published(client, uri, 1)).diagnostics
    assert [(d.code, d.range.start.line) for d in got] == [("AK1001", 1), ("AK2001", 4)]


async def test_quick_fix_replaces_with_the_suggestion(client: LanguageClient, workspace: Path) -> None:
    text = "kernel f(x: f32[M, N], eps: f32 = 1e-6) -> f32[M, N] {\n  return x[m, n] + esp\n}\n"
    uri = await open_doc(client, workspace / "typo.ak", text)
    (d,) = (await published(client, uri, 1)).diagnostics
    actions = await client.text_document_code_action_async(types.CodeActionParams(
        types.TextDocumentIdentifier(uri), d.range, types.CodeActionContext(diagnostics=[d])))
    assert actions is not None
    (action,) = actions
    assert isinstance(action, types.CodeAction) and action.kind == types.CodeActionKind.QuickFix
    assert action.edit is not None and action.edit.changes is not None
    fixed = apply(text, list(action.edit.changes[uri]))
    assert fixed == text.replace("esp", "eps")
    change(client, uri, 2, fixed)
    assert list((await published(client, uri, 2)).diagnostics) == []

    text2 = "import std.nnn\n"
    uri2 = await open_doc(client, workspace / "module_typo.ak", text2)
    (d2,) = (await published(client, uri2, 1)).diagnostics
    actions2 = await client.text_document_code_action_async(types.CodeActionParams(
        types.TextDocumentIdentifier(uri2), d2.range, types.CodeActionContext(diagnostics=[d2])))
    assert actions2 is not None and len(actions2) == 1
    edit = actions2[0]
    assert isinstance(edit, types.CodeAction) and edit.edit and edit.edit.changes
    assert apply(text2, list(edit.edit.changes[uri2])) == "import std.nn\n"


# ---------------------------------------------------------------- typing through a syntax error


async def test_a_broken_file_keeps_its_last_good_symbols(client: LanguageClient, workspace: Path) -> None:
    uri = await open_doc(client, workspace / "typing.ak", PROGRAM)
    broken = PROGRAM.replace("  let R = H / G\n", "  let R = H / G\n  t[b, h, i, j] = q[b, h, i, \n")
    change(client, uri, 2, broken)
    diagnostics = (await published(client, uri, 2)).diagnostics
    assert any(d.code.startswith("AK100") for d in diagnostics if isinstance(d.code, str))
    # Below the break, everything has moved down a line; hover still knows the shapes.
    assert "s: f32[B, H, S, T]" in await hover(client, uri, where(broken, "= s[", delta=2))
    assert "mx: f32[B, H, S]" in await hover(client, uri, where(broken, "mx[b", nth=1))
    # In the broken line itself: the parameter it reads, and completion of names in scope.
    assert "q: f32[B, H, S, D]" in await hover(client, uri, where(broken, "q[b, h, i, \n"))
    here = await labels(client, uri, where(broken, "q[b, h, i, \n", delta=11))
    assert {"q", "k", "v", "R", "b", "h", "i", "j"} <= set(here)
    location = await definition(client, uri, where(broken, "= s[", delta=2))
    assert location.range.start == where(broken, "s[b, h, i, j] = sum")
    # Fixing the line brings the new symbols in.
    fixed = broken.replace("q[b, h, i, \n", "q[b, h, i, j] * 2.0\n")
    change(client, uri, 3, fixed)
    await published(client, uri, 3)
    assert "t: f32[B, H, S, D]" in await hover(client, uri, where(fixed, "t[b"))


# ---------------------------------------------------------------- debounce


async def test_a_burst_of_changes_is_checked_once(slow_client: LanguageClient, workspace: Path) -> None:
    text = "kernel f(x: f32[N]) -> f32[N] {\n  return x[i] * 2.0\n}\n"
    uri = await open_doc(slow_client, workspace / "burst.ak", text)
    # Four changes sent together, well within the server's 1 s debounce: only the last is checked.
    for version, typo in ((2, "x[q]"), (3, "x[qq]"), (4, "x[qqq]"), (5, "y[i]")):
        change(slow_client, uri, version, text.replace("x[i]", typo))
    last = await published(slow_client, uri, 5)
    assert [d.code for d in last.diagnostics] == ["AK2001"]
    assert "`y`" in last.diagnostics[0].message
    versions = [p.version for p in slow_client.published if p.uri == uri]  # type: ignore[attr-defined]
    assert versions == [1, 5]
