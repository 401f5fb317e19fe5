"""Every kernel in the language spec's clean examples, compiled, gives the interpreter's answer.

The ```ak blocks of spec/language.md exercise the language corner by corner (literal and
compound dims, named and several outputs, whole-tensor broadcasting, `@`, `transpose`,
index arithmetic, calls with guards, reductions over several indices ...). Each block
without an error header is saved as a file (so imports resolve), each kernel it defines
gets dims that pass its guards and random inputs, and the compiled kernel must either
give the interpreter's result or raise the same kind of GuardError (an example may read
out of range on purpose: spec section 10).
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from codegen_support import RUNNABLE, assert_matches, build, kernel_names, random_inputs, seeded, tolerance

import arke
from arke.ir.shapes import evaluate
from arke.runtime.guards import GuardError, check_call, dim_params

SPEC = Path(__file__).resolve().parents[2] / "spec" / "language.md"
_FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_FILE = re.compile(r"#\s*file\s*:\s*(\S+)")
_ERROR = re.compile(r"#\s*error\s*:")


def blocks() -> list[tuple[int, str]]:
    text = SPEC.read_text(encoding="utf-8")
    return [(text[: m.start()].count("\n") + 1, m.group(2)) for m in _FENCE.finditer(text) if m.group(1) == "ak"]


def file_name(line: int, code: str) -> str:
    """The block's ``# file:`` name (in its leading comments), else one made from its line."""
    for text in code.splitlines():
        if not text.strip().startswith("#"):
            break
        named = _FILE.match(text.strip())
        if named:
            return named.group(1)
    return f"block_{line}.ak"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("spec_examples")
    for line, code in blocks():
        (root / file_name(line, code)).write_text(code, encoding="utf-8")
    return root


CLEAN = [(line, code) for line, code in blocks() if not any(_ERROR.match(x.strip()) for x in code.splitlines()[:3])]
CANDIDATES = (5, 3, 6, 2, 7, 4, 9, 8, 16, 1)


def dims_for(fn: Any) -> dict[str, int] | None:
    """Values of the kernel's dim symbols that pass its run-time checks (None if none is found).

    Distinct values come first, so a kernel that mixes up two dims cannot pass by luck.
    """
    symbols = list(dict.fromkeys(b.dim for b in fn.bindings))
    rng = np.random.default_rng(len(symbols))
    tries = [dict(zip(symbols, rng.permutation(CANDIDATES[:-1])[: len(symbols)].tolist())) for _ in range(30)]
    tries += [dict.fromkeys(symbols, v) for v in CANDIDATES]
    tries += [dict(zip(symbols, combo)) for combo in itertools.islice(
        itertools.product(CANDIDATES, repeat=len(symbols)), 20000)]
    for dims in tries:
        shapes = {p.name: tuple(evaluate(d, dims) for d in p.type.shape) for p in fn.params if p.type.rank}
        try:
            check_call(fn, shapes, dim_args={k: dims[k] for k in dim_params(fn)})
        except (GuardError, ValueError):
            continue
        return dims
    return None


def outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except GuardError as err:
        return f"GuardError/{err.rule}", str(err)


@pytest.mark.parametrize("target", RUNNABLE)
@pytest.mark.parametrize(("line", "code"), CLEAN, ids=[f"line{line}" for line, _ in CLEAN])
def test_spec_example_kernels_match_the_interpreter(folder: Path, line: int, code: str, target: str) -> None:
    module = arke.load(folder / file_name(line, code))
    _compare(module, build(module, target), line)


def _compare(module: Any, library: Any, line: int) -> None:
    for name in kernel_names(module):
        reference = module.kernels[name]
        dims = dims_for(reference.function)
        assert dims is not None, f"no dims pass the checks of `{name}`"
        ints = {p.name: 3 for p in reference.function.params if p.type.rank and p.type.dtype.is_int}
        args = random_inputs(reference, dims, seeded(line, name), ids=ints)
        given = {k: dims[k] for k in dim_params(reference.function)}  # dim parameters (`G: dim`), by name
        want = outcome(lambda: reference(*args, **given))  # noqa: B023 - called at once
        got = outcome(lambda: library.kernels[name](*args, **given))  # noqa: B023
        assert got[0] == want[0], f"`{name}`: compiled {got}, interpreter {want}"
        if want[0] == "ok":
            assert_matches(got[1], want[1], bound=tolerance(reference, args, given),
                           what=f"spec line {line} `{name}`")


def test_some_examples_are_clean() -> None:
    assert len(CLEAN) >= 20
