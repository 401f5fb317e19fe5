"""The incremental check publishes exactly what a full check of the same text gives.

Property-style: random sequences of edits — typing and deleting characters (which breaks
and fixes the syntax), moving, duplicating and deleting lines, renaming kernels, changing
signatures, imports and calls, undoing — are applied to real programs (the standard
library, the examples, the files of ``tests/lang/errors`` and a generated file); after
every edit the diagnostics of one :class:`IncrementalChecker` must equal those of a fresh
``check_text`` of the same text: same codes, messages, spans, hints, related sites and order.
"""

from __future__ import annotations

import importlib.util
import os
import random
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from arke.lang.checker import check_text
from arke.lsp.incremental import INTERNAL_ERROR, TOKEN, IncrementalChecker

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("check_speed", ROOT / "benchmarks" / "check_speed.py")
assert _SPEC is not None and _SPEC.loader is not None
check_speed = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(check_speed)
generate = check_speed.generate  # the benchmark's ~500-line program of realistic kernels

PROGRAMS = {
    **{f"stdlib/{p.name}": p.read_text(encoding="utf-8") for p in sorted((ROOT / "arke" / "stdlib").glob("*.ak"))},
    **{f"examples/{p.name}": p.read_text(encoding="utf-8") for p in sorted((ROOT / "examples").glob("*.ak"))},
    "generated": generate(160),
}
ERRORS = sorted((ROOT / "tests" / "lang" / "errors").glob("*.ak"))

CALLER = "\nkernel caller_{n}(a: f32[M, N]) -> f32[M, N] {{\n  return {callee}(a)\n}}\n"
IMPORTS = ("from std.nn import softmax\n", "import std.nn\n", "from std.nn import rmsnorm, softmaxx\n",
           "import std.nope\n", "from std.attention import attention\n")
WORD = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
SEEDS, STEPS = 2, 40  # walks per program, edits per walk
SYNTAX = frozenset({"AK1001", "AK1002", "AK1003", "AK1005", "AK1006"})
Edit = Callable[[random.Random, str, list[str]], str]


# ---------------------------------------------------------------- edits (each: rng, text, history -> new text)


def type_chars(rng: random.Random, text: str, _: list[str]) -> str:
    at = rng.randrange(len(text) + 1)
    return text[:at] + rng.choice("xxxxx2 \n\n()[]{},@=é#") + text[at:]


def delete_chars(rng: random.Random, text: str, _: list[str]) -> str:
    at = rng.randrange(len(text) + 1)
    return text[:at] + text[at + rng.randint(1, 4):]


def _lines(text: str) -> list[str]:
    return text.split("\n")


def move_line(rng: random.Random, text: str, _: list[str]) -> str:
    lines = _lines(text)
    line = lines.pop(rng.randrange(len(lines)))
    lines.insert(rng.randrange(len(lines) + 1), line)
    return "\n".join(lines)


def duplicate_or_drop_line(rng: random.Random, text: str, _: list[str]) -> str:
    lines = _lines(text)
    k = rng.randrange(len(lines))
    lines[k:k + 1] = [lines[k]] * rng.choice([0, 2])
    return "\n".join(lines)


def shift_everything(rng: random.Random, text: str, _: list[str]) -> str:
    # `; ` without a line break: the first item no longer starts a line (it joins the text before the items)
    return rng.choice(["\n", "# a comment\n", "\n\n\n", ";\n", "; "]) + text


def duplicate_item(rng: random.Random, text: str, _: list[str]) -> str:
    items = [m.start() for m in re.finditer(r"^(?:kernel|@)", text, re.MULTILINE)]
    if not items:
        return text
    k = rng.randrange(len(items))
    end = items[k + 1] if k + 1 < len(items) else len(text)
    return text + "\n" + text[items[k]:end]


def rename_kernel(rng: random.Random, text: str, _: list[str]) -> str:
    names = re.findall(r"kernel (\w+)", text)
    if not names:
        return text
    old = rng.choice(names)
    new = rng.choice([old + "2", old[:-1], "softmax", "rmsnorm", "exp", rng.choice(names)])
    if rng.random() < 0.5:  # the definition only: its callers and strategies now miss it
        return text.replace(f"kernel {old}(", f"kernel {new}(", 1)
    return re.sub(rf"\b{re.escape(old)}\b", new, text)


def change_signature(rng: random.Random, text: str, _: list[str]) -> str:
    change = rng.choice([("f32[", "bf16["), ("bf16[", "f32["), ("(x: ", "(x: f32[Q], y: "), (", eps: f32 = 1e-6", ""),
                         ("-> f32[M, N]", "-> f32[N, M]"), (" where ", " where N % 4 == 0, ")])
    spots = [m.start() for m in re.finditer(re.escape(change[0]), text)]
    if not spots:
        return text
    at = rng.choice(spots)
    return text[:at] + change[1] + text[at + len(change[0]):]


def change_imports(rng: random.Random, text: str, _: list[str]) -> str:
    lines = _lines(text)
    imports = [k for k, line in enumerate(lines) if line.startswith(("import ", "from "))]
    if imports and rng.random() < 0.4:
        del lines[rng.choice(imports)]
    else:
        lines.insert(rng.choice(imports) if imports else 0, rng.choice(IMPORTS).rstrip("\n"))
    return "\n".join(lines)


def add_call(rng: random.Random, text: str, _: list[str]) -> str:
    names = [*re.findall(r"kernel (\w+)", text), "softmax", "rmsnorm", "missing_kernel"]
    return text + CALLER.format(n=rng.randrange(1000), callee=rng.choice(names))


def swap_word(rng: random.Random, text: str, _: list[str]) -> str:
    words = list(WORD.finditer(text))
    if not words:
        return text
    w = rng.choice(words)
    return text[:w.start()] + rng.choice(words).group() + text[w.end():]


def undo(rng: random.Random, text: str, history: list[str]) -> str:
    return rng.choice(history[-4:] + history[:1]) if history else text


EDITS: list[tuple[Edit, int]] = [(type_chars, 6), (delete_chars, 4), (move_line, 2), (duplicate_or_drop_line, 2),
                                 (shift_everything, 1), (duplicate_item, 1), (rename_kernel, 2),
                                 (change_signature, 3), (change_imports, 2), (add_call, 2), (swap_word, 3), (undo, 6)]


def _assert_same(checker: IncrementalChecker, text: str, path: str, what: str) -> None:
    outcome = checker.check(text)
    expected = check_text(text, path).diagnostics
    assert outcome.full != INTERNAL_ERROR
    assert outcome.result.diagnostics == expected, f"after {what}:\n{text}"
    assert all(not d.span.file.startswith(TOKEN) for d in outcome.result.diagnostics)


def _walk(name: str, text: str, seed: int, steps: int, path: str) -> tuple[int, int]:
    """Edit ``text`` ``steps`` times; compare after each edit. Returns (incremental checks, full checks)."""
    rng = random.Random(f"{name}/{seed}")
    checker = IncrementalChecker(path)
    _assert_same(checker, text, path, "opening")
    history: list[str] = []
    counts = [0, 0]
    clean, broken_for = text, 0
    for step in range(steps):
        edit = rng.choices([e for e, _ in EDITS], weights=[w for _, w in EDITS])[0]
        history.append(text)
        text = edit(rng, text, history)
        if rng.random() < 0.15:  # sometimes a burst: the checker sees only its last text
            text = edit(rng, text, history)
        if broken_for >= 3:  # the syntax fixed again: back to the last text that parsed
            text, broken_for = clean, 0
        outcome = checker.check(text)
        assert outcome.full != INTERNAL_ERROR
        counts[outcome.full is not None] += 1
        expected = check_text(text, path).diagnostics
        assert outcome.result.diagnostics == expected, f"{name}, seed {seed}, step {step} ({edit.__name__}):\n{text}"
        if any(d.code in SYNTAX for d in expected):
            broken_for += 1
        else:
            clean, broken_for = text, 0
    return counts[0], counts[1]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_random_edits_publish_what_a_full_check_gives(name: str) -> None:
    incremental = full = 0
    for seed in range(SEEDS):
        a, b = _walk(name, PROGRAMS[name], seed, STEPS, f"<{name}>")
        incremental, full = incremental + a, full + b
    assert incremental > full  # most edits were checked incrementally: this test tested that path


def test_random_edits_of_the_error_files() -> None:
    rng = random.Random(8)
    for path in ERRORS:
        text = path.read_bytes().decode("utf-8", "replace")
        _walk(path.name, text, rng.randrange(1000), 8, str(path))


def test_imports_next_to_the_file_and_their_changes(tmp_path: Path) -> None:
    lib = tmp_path / "mylib.ak"
    lib.write_text("kernel double(x: f32[N]) -> f32[N] {\n  return x * 2.0\n}\n", encoding="utf-8")
    path = tmp_path / "main.ak"
    text = "import mylib\n\nkernel twice(v: f32[N]) -> f32[N] {\n  return double(v)\n}\n"
    path.write_text(text, encoding="utf-8")
    checker = IncrementalChecker(str(path))
    _assert_same(checker, text, str(path), "opening")
    # The imported file changes on disk (a new mtime): the caller is checked against its new signature.
    lib.write_text("kernel double(x: f32[N, N]) -> f32[N] {\n  return x[n, n] * 2.0\n}\n", encoding="utf-8")
    os.utime(lib, (1, 1))
    _assert_same(checker, text, str(path), "a change of the imported file")
    assert [d.code for d in check_text(text, str(path)).diagnostics] == ["AK3009"]
    _assert_same(checker, text.replace("import mylib", "import mylibb"), str(path), "a broken import")
    _assert_same(checker, text, str(path), "the import fixed")


def test_only_the_edited_kernel_is_parsed_and_checked_again() -> None:
    text = generate(300)
    checker = IncrementalChecker("<generated>")
    first = checker.check(text)
    assert first.full is None and first.checked > 10
    edited = text.replace("inv[m] = rsqrt(mean(x[m, n]", "inv[m] = rsqrt(mean(xx[m, n]", 1)
    second = checker.check(edited)
    assert (second.full, second.parsed, second.checked) == (None, 1, 1)
    assert [d.code for d in second.result.diagnostics] == ["AK2001"]
    # Lines added above every kernel: nothing is parsed or checked again, only moved.
    third = checker.check("# a comment\n\n" + edited)
    assert (third.full, third.parsed, third.checked) == (None, 1, 0)
    (d,) = third.result.diagnostics
    assert d.span.line == second.result.diagnostics[0].span.line + 2
    assert third.result.diagnostics == check_text("# a comment\n\n" + edited, "<generated>").diagnostics


def test_a_syntax_error_is_checked_incrementally_unless_a_cut_may_be_wrong() -> None:
    text = PROGRAMS["examples/attention.ak"]
    checker = IncrementalChecker("<a>")
    checker.check(text)
    broken = text.replace("return", "return (", 1)
    outcome = checker.check(broken)
    assert outcome.full is None
    assert any(d.code == "AK1003" or d.code == "AK1002" for d in outcome.result.diagnostics)
    assert outcome.result.diagnostics == check_text(broken, "<a>").diagnostics
    # A matrix product continued on a line that starts with `@`: the cut there is inside the kernel.
    matmul = "kernel mm(a: f32[M, K], b: f32[K, N]) -> f32[M, N] {\n  return a\n    @ b\n}\n"
    outcome = checker.check(matmul)
    assert outcome.full is not None and outcome.result.diagnostics == check_text(matmul, "<a>").diagnostics == ()
    # Text before the first item that ends unfinished: in the whole text, it goes on into the next line.
    unfinished = "; import\n" + text
    outcome = checker.check(unfinished)
    assert outcome.full is not None and outcome.result.diagnostics == check_text(unfinished, "<a>").diagnostics
    # Text before the first item that is wrong by itself: the item by item answer holds.
    wrong = "; 42\n" + broken
    outcome = checker.check(wrong)
    assert outcome.full is None and outcome.result.diagnostics == check_text(wrong, "<a>").diagnostics


def test_the_index_sees_the_document_coordinates() -> None:
    text = PROGRAMS["examples/attention.ak"]
    checker = IncrementalChecker("<a>")
    first = text.index("kernel")
    # Moved down, moved again (the moved chunks are kept per place), an edit above some of them.
    for version in (text, "\n\n" + text, "\n\n" + text, "\n" + text, text[:first] + "\n# more\n" + text[first:]):
        outcome = checker.check(version)
        assert outcome.full is None
        moved = outcome.document_result()
        full = check_text(version, "<a>")
        assert moved.ast == full.ast
        assert moved.diagnostics == full.diagnostics
        assert moved.kernel_names == full.kernel_names and moved.kernel_map == full.kernel_map
        for name in full.kernel_names:
            assert moved.signatures[name].node == full.signatures[name].node
            assert moved.signatures[name].source.text == version
        assert moved.indices == full.indices


def test_a_kernel_is_checked_again_when_what_it_reads_of_others_changes() -> None:
    # Every step leaves the caller's text (its chunk) as it was: only what it reads of the others changes.
    callee = "kernel scale(x: f32[N]) -> f32[N] {\n  return x * 2.0\n}\n"
    caller = "\nkernel user(v: f32[N]) -> f32[N] {\n  return scale(v) + sofmax(v)\n}\n"
    steps = [
        callee + caller,  # `sofmax`: unknown, and nothing in scope is close
        "kernel sofmaxx(x: f32[N]) -> f32[N] {\n  return x\n}\n" + callee + caller,  # now the hint names it
        callee.replace("f32[N]) -> f32[N]", "bf16[N]) -> bf16[N]") + caller,  # the callee's signature changed
        callee.replace("x * 2.0", "x * 3.0") + caller,  # its body only
        caller,  # the callee is gone
        "import std.nope\n" + caller,  # an import fails: unknown calls are no longer reported
    ]
    checker = IncrementalChecker("<calls>")
    for k, text in enumerate(steps):
        _assert_same(checker, text, "<calls>", f"step {k}")
    codes = [[d.code for d in check_text(text, "<calls>").diagnostics] for text in steps]
    assert codes[0] == codes[3] == ["AK2002"] and "sofmaxx" in check_text(steps[1], "<calls>").diagnostics[0].hint
    assert "AK3010" in codes[2] and codes[4] == ["AK2002", "AK2002"] and codes[5] == ["AK2004"]
