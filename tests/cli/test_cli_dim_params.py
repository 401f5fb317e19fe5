"""``akc`` on dim parameters (spec §5.5): ``check`` and ``fmt`` keep them and declared shapes, ``run``
takes their values with ``--dims`` (or their defaults) and says which one is missing, ``build
--explain --dims`` lists the legal values for those dims."""

from __future__ import annotations

from pathlib import Path

import pytest

from arke.cli import app as cli

SOURCE = """\
kernel group_norm(x: f32[B, C, L], w: f32[C], b: f32[C], G: dim = 2, eps: f32 = 1e-5)
    -> f32[B, C, L]
  where C % G == 0
{
  let cg = C / G
  xg[n, g, c, l]: f32[B, G, cg, L] = x[n, g * cg + c, l]
  mu[n, g] = mean(xg[n, g, c, l] for c, l)
  return x[n, ch, l] - mu[n, ch / cg]
}

kernel grid(S: dim, K: dim) -> y: i64[S, K] {
  y[s, k] = s * K + k
}
"""


def akc(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = cli.main(list(args))
    out = capsys.readouterr()
    return status, out.out + out.err


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "dims.ak"
    path.write_text(SOURCE, encoding="utf-8")
    return path


def test_check_and_fmt_keep_dim_parameters_and_declared_shapes(capsys: pytest.CaptureFixture[str],
                                                               program: Path) -> None:
    assert akc(capsys, "check", str(program))[0] == 0
    assert akc(capsys, "fmt", "--check", str(program))[0] == 0  # already in the formatter's layout


def test_run_takes_dim_parameters_from_dims(capsys: pytest.CaptureFixture[str], program: Path) -> None:
    status, text = akc(capsys, "run", str(program), "group_norm", "--dims", "B=3,C=6,L=17,G=3")
    assert status == 0 and "max |llvm - interpreter|" in text, text
    status, text = akc(capsys, "run", str(program), "group_norm", "--dims", "B=3,C=6,L=17")  # G = 2 by default
    assert status == 0, text
    status, text = akc(capsys, "run", str(program), "grid", "--dims", "S=3")
    assert status == 2 and "give every dim of `grid` (missing: K)" in text, text
    for dims, says in (("B=3,C=6,L=17,Z=1", "has no dim Z"), ("B=3,C=6,L=17,B=4", "gives B twice"),
                       ("B=3,C=7,L=17", "does not hold")):  # C % G == 0 with G = 2
        status, text = akc(capsys, "run", str(program), "group_norm", "--dims", dims)
        assert status == 2 and says in text, text


def test_explain_lists_values_for_a_dim_parameter(capsys: pytest.CaptureFixture[str], program: Path) -> None:
    status, text = akc(capsys, "build", str(program), "--target", "llvm", "--explain", "--kernel", "group_norm",
                       "--dims", "B=2,C=8,L=5,G=4")
    assert status == 0 and "group_norm" in text, text


@pytest.mark.parametrize("dims", ["M=3000000,N=3000000,K=3000000", "M=9223372036854775807,N=1,K=1"])
def test_akc_run_with_dims_too_big_for_memory_is_a_usage_error(capsys: pytest.CaptureFixture[str], dims: str
                                                               ) -> None:
    from pathlib import Path as _Path

    matmul = _Path(__file__).resolve().parents[2] / "examples" / "matmul.ak"
    status, text = akc(capsys, "run", str(matmul), "mm", "--dims", dims)
    assert status == 2 and "do not fit in this machine's memory" in text and "internal error" not in text, text


def test_akc_run_with_a_when_clause_dividing_by_zero_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path
                                                              ) -> None:
    path = tmp_path / "w.ak"
    path.write_text("kernel mm(a: f32[M, K], b: f32[K, N]) -> f32[M, N] {\n  return sum(a[m, k] * b[k, n] for k)\n}\n"
                    "@strategy(mm, target = llvm, when M % (N - 1) == 0) { tile m = 2 }\n")
    status, text = akc(capsys, "run", str(path), "mm", "--dims", "M=4,N=1,K=3")
    assert status == 1 and "divides by zero at M = 4, N = 1" in text and "internal error" not in text, text
