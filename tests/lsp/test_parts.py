"""The language server's parts, in process: position maps, conversions, the index, hover and completion."""

from __future__ import annotations

import pytest
from lsprotocol import types
from pygls.workspace.position_codec import PositionCodec

from arke.ir.strategy import DECISIONS
from arke.lang.checker import check_text
from arke.lang.exprs import BUILTINS, REDUCTIONS
from arke.lsp.complete import complete
from arke.lsp.convert import Text
from arke.lsp.edits import quick_fixes
from arke.lsp.hover import hover_markdown
from arke.lsp.index import DocumentIndex
from arke.lsp.textmap import TextMap
from arke.lsp.words import builtin_doc, decision_doc, decisions_for, reduction_doc
from arke.targets import base as targets

UTF16 = PositionCodec(types.PositionEncodingKind.Utf16)
UTF8 = PositionCodec(types.PositionEncodingKind.Utf8)


def index_of(text: str, path: str = "<test>") -> DocumentIndex:
    return DocumentIndex(text, path, check_text(text, path))


# ---------------------------------------------------------------- positions


def test_text_positions_count_code_units_of_the_agreed_encoding() -> None:
    text = "# é😋\nx = 1\n"
    after = text.index("\n")
    assert Text(text, UTF16).position(after) == types.Position(0, 5)  # é is 1 unit, 😋 is 2
    assert Text(text, UTF8).position(after) == types.Position(0, 8)  # é is 2 bytes, 😋 is 4
    for codec in (UTF16, UTF8):
        t = Text(text, codec)
        for offset in range(len(text) + 1):
            assert t.offset(t.position(offset)) == offset


def test_text_map_carries_offsets_across_an_insertion() -> None:
    old = "aaa bbb ccc"
    new = "aaa XX bbb ccc"
    change = TextMap.between(old, new)
    assert change.to_new(0) == 0 and change.to_new(old.index("ccc")) == new.index("ccc")
    assert change.to_new(old.index("bbb")) == new.index("bbb")  # a start at the insertion point moves
    assert change.to_new(old.index("aaa") + 3, end=True) == 3  # an end there stays
    assert change.to_old(new.index("XX")) is None
    assert change.to_old(new.index("ccc")) == old.index("ccc")
    assert TextMap.between(old, old).identical


def test_text_map_of_a_replacement() -> None:
    old = "let R = H / G"
    new = "let Q = H / G"
    change = TextMap.between(old, new)
    assert change.to_new(old.index("R")) is None
    assert change.to_new(old.index("H")) == new.index("H")


# ---------------------------------------------------------------- index and hover

PROGRAM = """\
kernel add(x: f32[N], y: f32[K], s: f32 = 0.5) -> z: f32[N]
  where N == K, N % 16 == 0
{
  let half = N / 2
  let scale = s * 2.0
  t[i] = x[i] + y[i] * scale
  z[i] = sum(t[j] for j) + t[(i + half) % N]
}

@strategy(add, target = llvm) {
  parallel i
  pack x
}
"""


def hover_at(index: DocumentIndex, needle: str, nth: int = 0, delta: int = 0) -> str:
    at = -1
    for _ in range(nth + 1):
        at = index.text.index(needle, at + 1)
    occ = index.at(at + delta)
    assert occ is not None, needle
    strategy = index.strategy_at(occ.start)
    text = hover_markdown(index, occ.symbol, strategy.target if strategy else None)
    assert text is not None
    return text


def test_hover_in_process() -> None:
    index = index_of(PROGRAM)
    assert "t: f32[N]" in hover_at(index, "t[i] =")
    assert "z: f32[N]" in hover_at(index, "z[i] =")
    assert "s: f32 = 0.5" in hover_at(index, "s * 2.0")
    assert "scale: f32" in hover_at(index, "* scale", delta=2)
    assert "let half = N//2" in hover_at(index, "+ half", delta=2)
    k_dim = hover_at(index, "K]")
    assert "axis 0 of `y`" in k_dim and "equal to `N`" in k_dim
    assert "j: 0 ≤ j < N" in hover_at(index, "for j", delta=4)
    assert "i: 0 ≤ i < N" in hover_at(index, "parallel i", delta=9)
    assert "x: f32[N]" in hover_at(index, "pack x", delta=5)
    assert "checked when called" in hover_at(index, "add(x")  # N % 16 == 0 is a run-time guard
    assert "rank-1 tensor output of `add`" in hover_at(index, "z[i] =")


def test_index_resolves_reused_index_names_per_statement() -> None:
    text = ("kernel f(a: f32[M, K], b: f32[K]) -> f32[M] {\n"
            "  u[i] = b[i]\n"
            "  v[i] = sum(a[i, k] * u[k] for k)\n"
            "  return v\n}\n")
    index = index_of(text)
    assert "i: 0 ≤ i < K" in hover_at(index, "b[i]", delta=2)
    assert "i: 0 ≤ i < M" in hover_at(index, "a[i", delta=2)
    first, second = (index.at(text.index(n)) for n in ("u[i]", "v[i]"))
    assert first is not None and second is not None


def test_kernels_with_errors_still_resolve_names() -> None:
    text = "kernel f(x: f32[N]) -> f32[N] {\n  y[i] = x[i] + nope\n  return y\n}\n"
    index = index_of(text)
    occ = index.at(text.index("x[i] +"))
    assert occ is not None and occ.symbol.kind == "param"


# ---------------------------------------------------------------- words and completion


def test_every_builtin_reduction_and_decision_is_explained() -> None:
    for name in BUILTINS:
        assert builtin_doc(name) and name not in ("",)
    for name in REDUCTIONS:
        assert "over the listed indices" in reduction_doc(name)
    for name, spec in DECISIONS.items():
        assert spec.meaning in decision_doc(name)
    assert "`materialized`" in decision_doc("algorithm", "mlir") and "flash" not in decision_doc("algorithm", "mlir")
    for target in targets.names():
        got = set(decisions_for(target))
        assert got == {n for n in DECISIONS if n in targets.get(target).honours}
    assert targets.narrowed_choices("algorithm", "mlir") == ("materialized",)


def labels(text: str, cursor: str, index: DocumentIndex | None, delta: int = 0, markdown: bool = True) -> set[str]:
    return {i.label for i in complete(text, text.index(cursor) + delta, index, "<test>", markdown)}


def test_completion_contexts() -> None:
    index = index_of(PROGRAM)
    end = {i.label for i in complete(PROGRAM + "\n", len(PROGRAM) + 1, index, "<test>")}
    assert end == {"kernel", "import", "from", "@strategy"}
    header = labels(PROGRAM, "f32[K]", index)
    assert "bf16" in header and "where" in header and "N" in header
    body = labels(PROGRAM, "z[i] =", index)
    assert {"x", "y", "s", "half", "scale", "t", "N", "K", "sum", "exp", "f32"} <= body
    assert {"parallel", "threads", "pack"} <= labels(PROGRAM, "pack x", index)
    assert "warps" not in labels(PROGRAM, "pack x", index)
    assert labels(PROGRAM, "pack x", index, delta=5) == {"x", "y"}
    assert labels("import ", "import ", None, delta=7) >= {"std.nn", "std.attention", "std.moe"}
    assert {"softmax", "rmsnorm"} <= labels("from std.nn import ", "import", None, delta=7)


def test_completion_as_plain_text_for_clients_without_markdown() -> None:
    index = index_of(PROGRAM)
    items = complete(PROGRAM, PROGRAM.index("z[i] ="), index, "<test>", markdown=False)
    documented = [i for i in items if i.documentation is not None]
    assert documented and all(isinstance(i.documentation, str) for i in documented)


def test_completion_in_a_comment_offers_nothing() -> None:
    text = "# kernel \nkernel f(x: f32[N]) -> f32[N] { return x }\n"
    assert complete(text, text.index("kernel "), index_of(text), "<test>") == []


# ---------------------------------------------------------------- quick fixes


@pytest.mark.parametrize("message, text, expect", [
    ("unknown name `esp`\nhint: did you mean `eps`?", "x + esp", "x + eps"),
    ("module `std.nnn` not found\nhint: did you mean `std.nn`?", "import std.nnn", "import std.nn"),
])
def test_quick_fix_from_the_hint(message: str, text: str, expect: str) -> None:
    start = text.index("esp") if "esp" in text else 0
    end = start + 3 if "esp" in text else len(text)
    t = Text(text, UTF16)
    diag = types.Diagnostic(t.range(start, end), message, code="AK2001", source="akc")
    (action,) = quick_fixes("file:///x.ak", t, [diag])
    assert action.edit is not None and action.edit.changes is not None
    (edit,) = action.edit.changes["file:///x.ak"]
    a, b = t.offset(edit.range.start), t.offset(edit.range.end)
    assert text[:a] + edit.new_text + text[b:] == expect


def test_no_quick_fix_without_a_suggestion() -> None:
    t = Text("x + q", UTF16)
    diag = types.Diagnostic(t.range(4, 5), "unknown name `q`", code="AK2001", source="akc")
    assert quick_fixes("file:///x.ak", t, [diag]) == []
    other = types.Diagnostic(t.range(4, 5), "did you mean `r`?", source="another-linter")
    assert quick_fixes("file:///x.ak", t, [other]) == []
