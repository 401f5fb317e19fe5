"""Every example in spec/language.md stays true.

Each fenced ```ak block of the spec is checked with :func:`arke.check`. A block is clean
(no diagnostic at all, warnings included) unless its leading comment lines say otherwise:

* ``# error: AK2104`` (or ``# warning: AK4009``): exactly these codes are reported,
  several separated by commas; nothing else.
* ``# file: mylib.ak``: the block is saved under that name next to the other blocks, so
  a later block can ``import mylib``. Every block is a file in one shared folder.

The ```lark block must be the grammar of ``arke/grammar/arke.lark`` (comments and layout
aside), and the few run-time claims the spec makes are run on the reference interpreter.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

import arke
from arke.runtime.guards import GuardError

SPEC = Path(__file__).resolve().parents[2] / "spec" / "language.md"
_FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_HEADER = re.compile(r"#\s*(error|warning|file)\s*:\s*(.+?)\s*$")


def _blocks(lang: str) -> list[tuple[int, str]]:
    """(line number, text) of every fenced block of ``lang`` in the spec."""
    text = SPEC.read_text(encoding="utf-8")
    return [(text[: m.start()].count("\n") + 1, m.group(2)) for m in _FENCE.finditer(text) if m.group(1) == lang]


def _headers(code: str) -> dict[str, list[str]]:
    """The ``# error:``/``# warning:``/``# file:`` comments at the top of a block."""
    found: dict[str, list[str]] = {"error": [], "warning": [], "file": []}
    for line in code.splitlines():
        m = _HEADER.fullmatch(line.strip())
        if not m:
            break
        found[m.group(1)] += [part.strip() for part in m.group(2).split(",") if part.strip()]
    return found


AK_BLOCKS = _blocks("ak")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder holding every block as a file (named blocks under their name)."""
    root = tmp_path_factory.mktemp("spec_examples")
    for line, code in AK_BLOCKS:
        names = _headers(code)["file"]
        (root / (names[0] if names else f"block_{line}.ak")).write_text(code, encoding="utf-8")
    return root


def test_spec_has_examples() -> None:
    assert len(AK_BLOCKS) >= 40


@pytest.mark.parametrize(("line", "code"), AK_BLOCKS, ids=[f"line{line}" for line, _ in AK_BLOCKS])
def test_example(folder: Path, line: int, code: str) -> None:
    headers = _headers(code)
    path = folder / (headers["file"][0] if headers["file"] else f"block_{line}.ak")
    diags = arke.check(path)
    got_errors = sorted({d.code for d in diags if d.is_error})
    got_warnings = sorted({d.code for d in diags if not d.is_error})
    shown = "\n".join(str(d) for d in diags)
    assert got_errors == sorted(set(headers["error"])), f"spec line {line}: errors differ\n{shown}"
    assert got_warnings == sorted(set(headers["warning"])), f"spec line {line}: warnings differ\n{shown}"


def _grammar_tokens(text: str) -> list[str]:
    """The grammar's words, comments and layout aside."""
    return " ".join(re.sub(r"^\s*//.*$", "", line) for line in text.splitlines()).split()


def test_grammar_is_the_implemented_one() -> None:
    blocks = _blocks("lark")
    assert len(blocks) == 1, "the spec quotes the grammar once, in a ```lark block"
    actual = resources.files("arke.grammar").joinpath("arke.lark").read_text(encoding="utf-8")
    assert _grammar_tokens(blocks[0][1]) == _grammar_tokens(actual)


# ---------------------------------------------------------------- run-time claims of the spec


def _kernel(src: str, name: str = "f") -> arke.Kernel:
    return arke.loads(src).kernels[name]


def test_integer_division_and_modulo() -> None:
    f = _kernel("kernel f(x: i32[N]) -> (q: i32[N], r: i32[N]) { q = x / 2; r = x % 3 }")
    q, r = f(np.array([-7, 7], dtype=np.int32))
    assert q.tolist() == [-4, 3] and r.tolist() == [2, 1]


def test_both_branches_are_loaded() -> None:
    f = _kernel("kernel f(x: f32[N]) -> y: f32[N] { y[i] = x[i - 1] if i > 0 else 0.0 }")
    with pytest.raises(GuardError, match="outside its axis") as err:
        f(np.ones(4, dtype=np.float32))
    assert err.value.rule == "index"
    g = _kernel("kernel f(x: f32[N]) -> y: f32[N] { y[i] = x[(i + N - 1) % N] if i > 0 else 0.0 }")
    assert g(np.arange(1, 5, dtype=np.float32)).tolist() == [0, 1, 2, 3]


def test_where_guard_runs_before_the_kernel() -> None:
    f = _kernel("kernel f(x: f32[N]) -> f32[N] where N % 2 == 0 { return x }")
    with pytest.raises(GuardError, match="N % 2 == 0") as err:
        f(np.ones(3, dtype=np.float32))
    assert err.value.rule == "where"


def test_f16_rounds_at_each_stored_tensor() -> None:
    x = np.array([1.0, 2.0**-11], dtype=np.float16)
    fused = _kernel("kernel f(x: f16[N]) -> f32 { return x[0] + x[1] - x[1] }")
    stored = _kernel("kernel f(x: f16[N]) -> f32 { y[i] = x[i] + x[1]\n return y[0] - x[1] }")
    assert float(fused(x)) == 1.0  # computed in f32
    assert float(stored(x)) == 1.0 - 2.0**-11  # y[0] = 1 + 2^-11 rounds to 1.0 in f16


def test_result_kinds() -> None:
    torch = pytest.importorskip("torch")
    f = _kernel("kernel f(x: f32[N]) -> (a: f32[N], b: bf16[N]) { a = x * 2.0; b = x }")
    a, b = f(np.ones(2, dtype=np.float32))
    assert isinstance(a, np.ndarray) and isinstance(b, torch.Tensor) and b.dtype == torch.bfloat16
    (c, _) = f(torch.ones(2))
    assert isinstance(c, torch.Tensor)
