"""``akc build --explain`` (each dispatch: family, ops, decisions applied and dropped, and what it takes)
and the AK4014 warnings ``akc build`` adds to the check's."""

from __future__ import annotations

from pathlib import Path

import pytest

from arke.cli import app as cli

ROOT = Path(__file__).resolve().parents[2]

MATMUL_ROWS = """\
kernel centred(x: f32[M, K], w: f32[N, K]) -> f32[M, N] {
  y[m, n] = sum(x[m, k] * w[n, k] for k)
  top[m] = max(y[m, n] for n)
  return y[m, n] - top[m]
}

@strategy(centred, target = llvm, when M > 8) {
  tile m = 4, n = 64
  vectorize n = 16
  split k = 4
}

@strategy(centred, when M <= 8) {
  warps = 4
  parallel m
}
"""


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = cli.main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture()
def matmul_rows(tmp_path: Path) -> Path:
    path = tmp_path / "centred.ak"
    path.write_text(MATMUL_ROWS, encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def _plain_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("AKC_DEBUG", raising=False)


def test_explain_a_matmul_with_a_rows_epilogue(matmul_rows: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "build", str(matmul_rows), "--target", "llvm", "--explain")
    assert status == 0
    variants = out.split("centred on llvm, ")[1:]
    assert [v.splitlines()[0] for v in variants] == ["strategy 1 (when M > 8):",
                                                     "strategy 2 (when M <= 8, for every target):", "defaults:"]
    first = variants[0]
    assert "  dispatch 0: contraction — ops: y\n" in first
    assert "  dispatch 1: rows — ops: top, %2 (result)\n" in first
    assert "    applied: tile m = 4, tile n = 64, vectorize n = 16\n" in first  # the contraction
    assert "    dropped: split k = 4 — a contraction's depth is summed whole, in order, by each worker\n" in first
    assert "    applied: vectorize n = 16\n" in first  # the rows dispatch loops over n
    assert "  warning[AK4014]: `split k = 4` reaches no dispatch" in first
    second = variants[1]
    assert "dropped: warps = 4 — a contraction dispatch on `llvm` takes no `warps`" in second
    assert "applied: parallel m" in second  # the rows dispatch's workers split m
    assert "takes: pack w|x, parallel n, threads" in variants[2]  # the defaults: what a strategy could say
    assert "{" not in variants[2].split("threads")[1].split("\n")[0].replace("{1, 2, 4, …, 1024}", "")
    # the check's warning (split k on llvm) is printed once, as by any build
    assert err.count("warning[AK4014]") == 1 and f"{matmul_rows}:10:3" in err


def test_explain_with_dims_lists_legal_values(matmul_rows: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "build", str(matmul_rows), "--target", "llvm", "--explain", "--dims",
                         "M=64,N=32,K=16")
    assert status == 0
    for taken in ("tile m {1, 2, 4, 8, 16}", "tile k {1, 2, 4, 8, 16}", "vectorize n {1, 2, 4, 8, 16, 32}",
                  "parallel m {1, 2, 4, 8, 16, 32, 64}", "threads {1, 2, 4, …, 1024}"):
        assert taken in out
    assert "tile m {1, 2, 4, 8, 16, 32" not in out  # a contraction's register rows: 16 at most


def test_explain_an_attention_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(ROOT / "examples" / "attention.ak")
    status, out, err = run(capsys, "build", path, "--target", "llvm", "--explain")
    assert status == 0 and err == ""
    assert out.startswith("attention on llvm, strategy (when S == 1):\n  dispatch 0: attention — ops: ")
    assert "    applied: algorithm = split_kv, split j = 8\n" in out
    assert "attention on llvm, defaults:" in out and "AK4014" not in out
    status, out, _ = run(capsys, "build", path, "--target", "triton", "--explain")
    assert status == 0  # a pure answer: triton need not be installed
    assert "applied: algorithm = flash, tile i = 64, tile j = 64, warps = 8" in out


def test_explain_the_gpu_flavour_and_one_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(ROOT / "examples" / "rmsnorm.ak")
    status, out, _ = run(capsys, "build", path, "--target", "llvm", "--arch", "sm_90", "--explain",
                         "--kernel", "softmax")
    assert status == 0 and out.startswith("softmax on llvm (sm_90), strategy:")
    assert "GPU flavour" in out and "rmsnorm" not in out
    status, _, err = run(capsys, "build", path, "--target", "llvm", "--explain", "--kernel", "nope")
    assert status == 2 and "has no kernel `nope`" in err


def test_build_adds_the_warnings_only_the_target_shows(matmul_rows: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "build", str(matmul_rows), "--target", "llvm")
    assert status == 0 and out
    lines = [line for line in err.splitlines() if "warning[AK4014]" in line]
    assert len(lines) == 2, err  # split k (the check's) and warps (a strategy for every target, on llvm)
    assert any(f"{matmul_rows}:14:3: warning[AK4014]: `warps = 4` has no effect on kernel `centred` on target "
               "`llvm`" in line for line in lines)
    assert "StrategyDowngradeWarning" not in err  # shown as diagnostics, not as Python warnings


def test_build_source_is_the_strategy_a_call_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``akc build`` writes the variant a call runs without a ``when`` to decide: the file's strategy, not
    the defaults (a 12-row register block here, 8 by default)."""
    path = tmp_path / "mm.ak"
    body = "kernel mm(a: f32[M, K], b: f32[K, N]) -> f32[M, N] {\n  return sum(a[m, k] * b[k, n] for k)\n}\n"
    path.write_text(body + "@strategy(mm, target = llvm) { tile m = 12 }\n", encoding="utf-8")
    status, out, _ = run(capsys, "build", str(path), "--target", "llvm")
    assert status == 0 and "ptr noalias %a11, i64 %sak" in out
    path.write_text(body, encoding="utf-8")
    status, out, _ = run(capsys, "build", str(path), "--target", "llvm")
    assert status == 0 and "ptr noalias %a7, i64 %sak" in out
