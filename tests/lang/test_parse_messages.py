"""Diagnostics that once misled (issue 17), beyond the one corpus file per case in tests/lang/errors/.

* Syntax errors never name a grammar terminal (``bad_number``): every terminal of arke.lark has
  words; other languages' operators (``&&``, ``===``) and chained comparisons say what to write.
* A kernel whose body does not parse keeps its header: its signature is still checked, and
  its callers and strategies find it (no follow-on AK2002/AK3008/AK4001).
* What to write instead of `u64` and friends (arke.lang.hints): each example
  is a real kernel, run by the interpreter against torch.
* AK2105 says how the index is used and what gives an index of that kind an extent; AK2107
  underlines the tensor that needs its subscript and offers it.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import arke
from arke.lang.diagnostics import Diagnostic
from arke.lang.hints import NOT_YET, NOT_YET_DTYPES
from arke.lang.lark_parser import _lark
from arke.lang.parse_errors import FOREIGN_OPERATORS, terminal_words


def errors(source: str) -> list[Diagnostic]:
    return [d for d in arke.check(source) if d.is_error]


def covered(source: str, d: Diagnostic) -> str:
    return source[d.span.start:d.span.end]


def fixed(source: str, d: Diagnostic) -> str:
    assert d.replacement is not None and d.span.start is not None and d.span.end is not None
    return source[:d.span.start] + d.replacement + source[d.span.end:]


def kernel(body: str, header: str = "kernel f(x: f32[N], b: bool[N]) -> f32[N]") -> str:
    return f"{header}\n{{\n  {body}\n}}\n"


# ---------------------------------------------------------------- no grammar names in messages


def test_every_terminal_has_words() -> None:
    """A terminal added to arke.lark without words in parse_errors._WORDS would leak its name."""
    words = terminal_words()
    missing = [t.name for t in _lark().terminals if t.name not in words]
    assert not missing, f"terminals without words in arke/lang/parse_errors.py: {missing}"


BROKEN = ["return x[n] >", "return x[n] * (", "return x[n] +", "return 2.5e", "return x[n] 2", "y[n] = = x[n]",
          "return x[n] if b[n]", "return sum(x[n] for)", "let = 3", "return x[n] > > 1", "return (x[n]",
          "return x[n] ** ** 2", "return f32(x[n],)", "return x[n] in {}"]


@pytest.mark.parametrize("body", BROKEN)
def test_syntax_errors_name_no_terminal(body: str) -> None:
    names = {t.name for t in _lark().terminals}
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in names) + r")\b", re.IGNORECASE)
    for d in errors(kernel(body)):
        if not d.code.startswith("AK1"):
            continue
        text = d.message + " " + (d.hint or "")
        found = [m for m in pattern.findall(text) if m.isupper() or "_" in m]
        assert not found, f"{d.code} names grammar terminals {found}: {text}"
        assert "bad_number" not in text


# ---------------------------------------------------------------- operators of other languages


@pytest.mark.parametrize("op", sorted(FOREIGN_OPERATORS))
def test_foreign_operator(op: str) -> None:
    source = kernel(f"return x[n] if b[n] {op} b[n] else 0.0") if op not in "~!" else kernel(
        f"return x[n] if {op}b[n] else 0.0")
    found = errors(source)
    assert [d.code for d in found] in (["AK1001"], ["AK1002"]), [str(d) for d in found]
    d = found[0]
    assert d.message == f"`{op}` is not an operator in Arke" and covered(source, d) == op
    hint, fix = FOREIGN_OPERATORS[op]
    assert d.hint == hint and d.replacement == fix
    if fix is not None:
        assert not any(x.code.startswith("AK1") for x in errors(fixed(source, d)))


# ---------------------------------------------------------------- chained comparisons

CHAINS = [
    ("return x[i] if 0 <= i < 4 else 0.0", "0 <= i < 4", "0 <= i and i < 4"),
    ("return x[i] if 1 < i + 1 <= (N - 1) * 2 else 0.0", "1 < i + 1 <= (N - 1) * 2",
     "1 < i + 1 and i + 1 <= (N - 1) * 2"),
    ("return x[i] if x[i] == x[N - 1 - i] == 0.0 else 1.0", "x[i] == x[N - 1 - i] == 0.0",
     "x[i] == x[N - 1 - i] and x[N - 1 - i] == 0.0"),
]


@pytest.mark.parametrize(("body", "chain", "fix"), CHAINS)
def test_chained_comparison(body: str, chain: str, fix: str) -> None:
    source = kernel(body)
    [d] = errors(source)
    assert d.code == "AK1002" and d.message.startswith("comparisons do not chain")
    assert covered(source, d) == chain and d.replacement == fix and fix in (d.hint or "")
    assert errors(fixed(source, d)) == []


def test_chained_comparison_in_a_where_clause() -> None:
    source = "kernel f(x: f32[N]) -> f32[N]\n  where 1 < N <= 8\n{\n  return x\n}\n"
    [d] = errors(source)
    assert covered(source, d) == "1 < N <= 8" and d.replacement == "1 < N and N <= 8"
    assert errors(fixed(source, d)) == []


# ---------------------------------------------------------------- a broken body keeps its header

BROKEN_BODY = """kernel unpack(w: u64[N]) -> i32[N]
{
  return i32(w[n]) >>> 4
}

@strategy(unpack, target = llvm) {
  parallel n
}

kernel caller(w: i8[N]) -> i32[N]
{
  return unpack(w) + 1
}

kernel other(x: f32[N]) -> f32[N]
  where N in {1, 2}
{
  return x[n] $ 1
}

kernel typo(x: f32[N]) -> f32[N]
{
  return x[n] * esp
}
"""


def test_a_broken_body_keeps_its_header() -> None:
    got = [(d.code, d.span.line, covered(BROKEN_BODY, d)) for d in errors(BROKEN_BODY)]
    assert got == [("AK3001", 1, "u64"), ("AK1002", 3, ">>>"), ("AK1001", 18, "$"), ("AK2001", 23, "esp")], got


def test_header_of_a_broken_body_types_its_callers() -> None:
    """A call of a kernel whose body does not parse is checked against its header."""
    source = BROKEN_BODY.replace("u64[N]", "i8[N]").replace("return unpack(w) + 1", "return unpack(w, w) + 1")
    got = [(d.code, d.span.line) for d in errors(source)]
    assert ("AK3008", 12) in got and ("AK3001", 1) not in got, got


def test_a_call_of_a_kernel_with_a_bad_header_is_not_reported_again() -> None:
    source = ("kernel f(w: u64[N]) -> i32[N]\n{\n  return i32(w)\n}\n"
              "kernel g(w: i8[N]) -> i32[N]\n{\n  return f(w) + esp\n}\n")
    assert [(d.code, d.span.line) for d in errors(source)] == [("AK3001", 1), ("AK2001", 7)]


# ---------------------------------------------------------------- what to write instead


def _body_lines(example: str) -> list[str]:
    return [line.strip() for line in example.split("{", 1)[1].rsplit("}", 1)[0].splitlines() if line.strip()]


@pytest.mark.parametrize("name", sorted(NOT_YET))
def test_not_yet_hint_quotes_its_example(name: str) -> None:
    instead = NOT_YET[name]
    for line in _body_lines(instead.example):
        assert f"`{line}`" in instead.hint, (name, line, instead.hint)
    assert errors(instead.example) == [], [str(d) for d in errors(instead.example)]


def _torch_reference(name: str, x: torch.Tensor, k: int) -> torch.Tensor:
    return getattr(torch, name)(x, dim=1).values


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 4097)], ids=str)
@pytest.mark.parametrize("name", sorted(NOT_YET))
def test_not_yet_example_computes_it(name: str, shape: tuple[int, int]) -> None:
    """Each example, run by the interpreter, equals torch's operator (distinct values: no ties)."""
    m = arke.loads(NOT_YET[name].example)
    rng = np.random.default_rng(sum(map(ord, name)) + shape[1])
    x = (rng.permutation(shape[0] * shape[1]).reshape(shape) / shape[1] - 0.3).astype(np.float32)
    got = torch.as_tensor(m.kernels[m.names[0]](x))
    want = _torch_reference(name, torch.from_numpy(x), 2)
    if got.dtype.is_floating_point:
        torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-4, atol=1e-4 * shape[1])
    else:
        assert torch.equal(got.to(want.dtype), want)


@pytest.mark.parametrize("name", sorted(NOT_YET))
def test_not_yet_names_say_what_to_write(name: str) -> None:
    for source in (kernel(f"return {name}(x[n] for n)", "kernel f(x: f32[N]) -> f32"),
                   kernel(f"return {name}(x)", "kernel f(x: f32[N]) -> f32[N]")):
        [d] = errors(source)
        assert d.code == "AK2002" and covered(source, d) == name
        assert d.hint == NOT_YET[name].hint and d.replacement is None, d.hint


@pytest.mark.parametrize("name", sorted(NOT_YET_DTYPES))
def test_unsigned_dtypes_say_what_to_write(name: str) -> None:
    source = kernel("return x", f"kernel f(x: {name}[N]) -> f32[N]")
    [d] = errors(source)
    assert d.code == "AK3001" and d.hint == NOT_YET_DTYPES[name] and d.replacement is None


# ---------------------------------------------------------------- AK2105 and AK2107 in the user's terms

EXTENTS = [
    # (kernel, the message's reason, a phrase of the hint)
    ("kernel f(x: f32[B, L]) -> f32[B, L]\n{\n  y[b, l] = x[b, l + 1]\n  return y[b, l] + x[b, l]\n}\n",
     "it appears only inside the subscript `l + 1` of `x`", "or from a declared shape: write `t[...]: f32[...]"),
    ("kernel f(x: f32[L]) -> f32[L]\n{\n  y[l] = f32(l)\n  return y[l] + x[l]\n}\n",
     "it is used only as a value, in `f32(l)`", "compute the value inline where `l` already has an extent"),
    ("kernel f(x: f32[L]) -> f32[L]\n{\n  y[l] = 1.0\n  return y[l] + x[l]\n}\n",
     "it is not used on the right of `=`", "a dim parameter `K: dim` gives a dim no tensor has"),
    ("kernel f(x: f32[B, L]) -> f32[B, L]\n{\n  return x[b + 0, l + 1] * 2.0\n}\n",
     "inside the subscript `b + 0` of `x`", "gives the declared output's axis left only to one such index"),
    ("kernel f(x: f32[L]) -> f32\n{\n  return sum(x[l + 1] for l)\n}\n",
     "inside the subscript `l + 1` of `x`", "as in `x[l]`"),
]


@pytest.mark.parametrize(("source", "reason", "hint"), EXTENTS)
def test_extent_messages_say_how_the_index_is_used(source: str, reason: str, hint: str) -> None:
    d, *more = errors(source)  # two indices without an extent in one return: one error each
    assert all(m.code == "AK2105" for m in more)
    assert d.code == "AK2105" and reason in d.message and hint in (d.hint or ""), (d.message, d.hint)
    if "return" in source.split("{", 1)[1].split("\n")[1]:
        assert "intermediate" not in (d.hint or "")


def test_the_named_output_the_hint_offers_works() -> None:
    source = "kernel f(x: f32[B, L]) -> y: f32[B, L]\n{\n  y[b, l] = x[b, l + 1] if l + 1 < L else 0.0\n}\n"
    assert errors(source) == []


WHOLE = [
    ("kernel f(x: f32[M, N], s: f32[M]) -> f32[M, N]\n{\n  return x[m, n] / exp(s) + 1.0\n}\n", "s", "s[m]"),
    ("kernel f(x: f32[M, N], s: f32[N]) -> f32[M, N]\n{\n  y[m, n] = -s * x[m, n]\n  return y\n}\n", "s", "s[n]"),
    ("kernel f(x: f32[N, N], s: f32[N]) -> f32[N, N]\n{\n  return x[m, n] / s\n}\n", "s", None),  # m or n?
]


@pytest.mark.parametrize(("source", "name", "fix"), WHOLE)
def test_whole_tensor_is_underlined_with_its_subscript(source: str, name: str, fix: str | None) -> None:
    [d] = errors(source)
    assert d.code == "AK2107" and covered(source, d) == name and d.message.startswith(f"`{name}` needs its subscript")
    assert d.replacement == fix
    if fix is not None:
        assert errors(fixed(source, d)) == []


def test_whole_result_of_transpose_is_not_blamed_on_its_argument() -> None:
    source = "kernel f(x: f32[N, N]) -> f32[N, N]\n{\n  return x[m, n] + transpose(x)\n}\n"
    [d] = errors(source)
    assert d.code == "AK2107" and covered(source, d) == "x[m, n] + transpose(x)"
