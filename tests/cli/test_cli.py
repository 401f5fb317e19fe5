"""``akc``: exit codes, text and JSON output, stdin, folders, bad paths, start-up imports."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import arke
from arke.cli import app as cli
from arke.lang import checker
from arke.lang.checker import CheckResult
from arke.lang.diagnostics import make
from arke.lang.source import Source

ROOT = Path(__file__).resolve().parents[2]

GOOD = """\
kernel rmsnorm(x: f32[M, N], w: f32[N], eps: f32 = 1e-6) -> f32[M, N]
{
  inv[m] = rsqrt(mean(x[m, n] * x[m, n] for n) + eps)
  return x[m, n] * inv[m] * w[n]
}
"""

# A syntax error at line 4, column 1 (the `}`): the parser reports it today.
BAD = """\
kernel f(x: f32[N]) -> f32[N]
{
  return x[n] +
}
"""


def akc(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m arke ARGS`` in a fresh process (what a user's shell does)."""
    base = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "AKC_DEBUG")}
    full_env = {**base, "NO_COLOR": "1", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "arke", *args], input=stdin, capture_output=True,
                          env=full_env, cwd=cwd or ROOT, timeout=60, check=False)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run ``akc ARGS`` in process: (exit status, stdout, stderr)."""
    status = cli.main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture()
def files(tmp_path: Path) -> Path:
    (tmp_path / "good.ak").write_text(GOOD, encoding="utf-8")
    (tmp_path / "bad.ak").write_text(BAD, encoding="utf-8")
    return tmp_path


@pytest.fixture(autouse=True)
def _plain_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("AKC_DEBUG", raising=False)


# ---------------------------------------------------------------- exit codes and text


def test_clean_file_exits_0(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "check", str(files / "good.ak"))
    assert status == 0
    assert out == "ok: 1 file\n"
    assert err == ""


def test_errors_exit_1_with_caret_and_summary(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(files / "bad.ak")
    status, out, _ = run(capsys, "check", path, str(files / "good.ak"))
    assert status == 1
    lines = out.splitlines()
    assert lines[0].startswith(f"{path}:4:1: error[AK1002]: unexpected `}}`")
    assert lines[1:3] == ["4 | }", "  | ^"]
    assert lines[-1] == "1 error in 2 files"
    assert "\x1b[" not in out  # captured output is not a terminal


def test_warnings_alone_exit_0(files: Path, capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    def with_warning(text: str, path: str, lower: bool = False) -> CheckResult:
        start = text.index("inv")
        return CheckResult((make("AK2301", "`inv` is never used", Source(path, text).span(start, start + 3)),))

    monkeypatch.setattr(checker, "check_text", with_warning)
    status, out, _ = run(capsys, "check", str(files / "good.ak"))
    assert status == 0
    assert "warning[AK2301]" in out
    assert out.splitlines()[-1] == "1 warning in 1 file"


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "check")[0] == 2
    assert run(capsys, "check", "--format", "xml", "x.ak")[0] == 2
    assert run(capsys, "frobnicate")[0] == 2
    status, _, err = run(capsys)
    assert status == 2
    assert "check" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "--version")
    assert status == 0
    assert out.strip() == f"akc {arke.__version__}"
    proc = akc("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"akc {arke.__version__}"


# ---------------------------------------------------------------- JSON


def test_json_is_one_document_of_lsp_diagnostics(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad, good = str(files / "bad.ak"), str(files / "good.ak")
    status, out, _ = run(capsys, "check", "--format", "json", bad, good)
    assert status == 1
    doc = json.loads(out)
    assert [f["path"] for f in doc["files"]] == [bad, good]
    assert doc["files"][0]["uri"] == Path(bad).resolve().as_uri()
    assert doc["files"][1]["diagnostics"] == []
    (diag,) = doc["files"][0]["diagnostics"]
    assert diag["range"] == {"start": {"line": 3, "character": 0}, "end": {"line": 3, "character": 1}}
    assert diag["severity"] == 1
    assert diag["code"] == "AK1002"
    assert diag["source"] == "akc"
    assert diag["message"].startswith("unexpected `}`")


# ---------------------------------------------------------------- stdin and folders


def feed_stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    feed_stdin(monkeypatch, BAD.encode())
    status, out, _ = run(capsys, "check", "-")
    assert status == 1
    assert out.startswith("-:4:1: error[AK1002]")
    feed_stdin(monkeypatch, GOOD.encode())
    status, out, _ = run(capsys, "check", "--format", "json", "-")
    assert status == 0
    assert json.loads(out) == {"files": [{"path": "-", "uri": "-", "diagnostics": []}]}


def test_stdin_that_is_not_utf8() -> None:
    proc = akc("check", "-", stdin=b"kernel \xff\xfe")
    assert proc.returncode == 2
    assert "not UTF-8" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_folders_are_searched_recursively(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "a.ak").write_text(GOOD, encoding="utf-8")
    (tmp_path / "sub" / "deeper" / "b.ak").write_text(GOOD, encoding="utf-8")
    (tmp_path / ".hidden" / "c.ak").write_text(BAD, encoding="utf-8")
    (tmp_path / "notes.txt").write_text("not a program", encoding="utf-8")
    status, out, _ = run(capsys, "check", "--format", "json", str(tmp_path))
    assert status == 0
    paths = [Path(f["path"]) for f in json.loads(out)["files"]]
    assert paths == [tmp_path / "a.ak", tmp_path / "sub" / "deeper" / "b.ak"]
    status, out, _ = run(capsys, "check", str(tmp_path))
    assert out == "ok: 2 files\n"


def test_folder_without_programs_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "check", str(tmp_path))
    assert status == 2
    assert err.startswith("akc: error: no .ak files in folder")


def test_examples_check_clean(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "check", str(ROOT / "examples"))
    assert (status, out) == (0, "ok: 3 files\n")


# ---------------------------------------------------------------- bad paths: clear, never a traceback


def test_missing_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.ak")
    proc = akc("check", missing)
    assert proc.returncode == 2
    assert f"{missing}:1:1: error[AK1004]: cannot read `{missing}`: No such file or directory" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_missing_file_among_good_ones_still_checks_the_rest(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "check", str(files / "nope.ak"), str(files / "bad.ak"))
    assert status == 2  # an I/O problem outranks the program's errors
    assert "AK1004" in out
    assert "AK1002" in out


def test_file_that_is_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "latin1.ak"
    path.write_bytes("kernel f() # caf\u00e9\n".encode("latin-1"))
    status, out, err = run(capsys, "check", str(path))
    assert status == 2
    assert f"{path}:1:17: error[AK1004]: `{path}` is not UTF-8 text (byte 16)" in out  # at the bad byte
    assert err == ""
    status, out, _ = run(capsys, "check", "--format", "json", str(path))
    assert status == 2
    assert json.loads(out)["files"][0]["diagnostics"][0]["code"] == "AK1004"


def test_a_folder_given_to_ir_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "ir", str(tmp_path))
    assert status == 2
    assert out == ""
    assert "error[AK1004]" in err


# ---------------------------------------------------------------- internal errors


def _boom(text: str, path: str, lower: bool = False) -> CheckResult:
    raise RuntimeError("boom")


def test_internal_error_exits_3_without_traceback(files: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checker, "check_text", _boom)
    status, _, err = run(capsys, "check", str(files / "good.ak"))
    assert status == 3
    assert err.startswith("akc: internal error: RuntimeError: boom, please report")
    assert "Traceback" not in err


def test_akc_debug_shows_the_traceback(files: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checker, "check_text", _boom)
    monkeypatch.setenv("AKC_DEBUG", "1")
    status, _, err = run(capsys, "check", str(files / "good.ak"))
    assert status == 3
    assert "Traceback" in err
    assert "akc: internal error: RuntimeError: boom" in err


# ---------------------------------------------------------------- akc ir


def test_ir_with_errors_renders_them_and_exits_1(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "ir", str(files / "bad.ak"))
    assert status == 1
    assert out == ""
    assert "error[AK1002]" in err
    assert "4 | }" in err


def test_ir_prints_through_the_ir_modules(files: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The wiring of ``akc ir``: stand-ins for the loader and the IR printers and serialiser."""
    fake = types.SimpleNamespace(semantic="SEM", strategies="STRAT", warnings=())
    monkeypatch.setattr(arke.api, "loads", lambda text, path: fake)
    text_mod: Any = types.ModuleType("arke.ir.text")
    text_mod.print_module = lambda m: f"module {m}"
    text_mod.print_strategies = lambda s: f"strategies {s}\n"
    ser_mod: Any = types.ModuleType("arke.ir.serialize")
    ser_mod.to_json = lambda m, indent=None: json.dumps({"version": 1, "ir": m}, indent=indent)
    ser_mod.strategies_to_json = lambda s, indent=None: json.dumps({"version": 1, "strategies": s}, indent=indent)
    monkeypatch.setitem(sys.modules, "arke.ir.text", text_mod)
    monkeypatch.setitem(sys.modules, "arke.ir.serialize", ser_mod)
    monkeypatch.setattr(arke.ir, "text", text_mod, raising=False)
    monkeypatch.setattr(arke.ir, "serialize", ser_mod, raising=False)
    path = str(files / "good.ak")
    assert run(capsys, "ir", path)[:2] == (0, "module SEM\n")
    assert run(capsys, "ir", path, "--stage", "strategy")[:2] == (0, "strategies STRAT\n")
    status, out, _ = run(capsys, "ir", path, "--stage", "strategy", "--format", "json")
    assert status == 0
    assert json.loads(out) == {"version": 1, "strategies": "STRAT"}
    status, out, _ = run(capsys, "ir", path, "--format", "json")
    assert (status, json.loads(out)) == (0, {"version": 1, "ir": "SEM"})


def test_ir_of_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(ROOT / "examples" / "rmsnorm.ak")
    status, out, _ = run(capsys, "ir", path)
    assert status == 0
    assert "kernel @rmsnorm" in out
    status, out, _ = run(capsys, "ir", path, "--stage", "strategy", "--format", "json")
    assert status == 0
    assert json.loads(out)["format"] == "arke.strategy"


# ---------------------------------------------------------------- start-up cost and colour


def test_check_imports_no_torch_triton_or_llvmlite(files: Path) -> None:
    code = (
        "import sys\n"
        "from arke.cli.app import main\n"
        f"status = main(['check', {str(files / 'good.ak')!r}, {str(files / 'bad.ak')!r}])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'llvmlite', 'rich'))\n"
        "print('STATUS', status, 'HEAVY', heavy)\n"
    )
    env = {**os.environ, "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                          check=False)
    assert proc.stdout.splitlines()[-1] == "STATUS 1 HEAVY []", proc.stderr


def test_colour_follows_the_environment(files: Path) -> None:
    bad = str(files / "bad.ak")
    forced = akc("check", bad, env={"FORCE_COLOR": "1", "NO_COLOR": ""})
    assert "\x1b[" in forced.stdout
    assert forced.returncode == 1


# ---------------------------------------------------------------- akc demo


def _numpy_kernel(name: str, *arrays: Any) -> Any:
    """The demo's kernels in explicit NumPy (float64): a stand-in for the interpreter."""
    import numpy as np

    xs = [np.asarray(a, dtype=np.float64) for a in arrays]
    if name == "rmsnorm":
        x, w = xs
        return (x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w).astype(np.float32)
    if name == "softmax":
        e = np.exp(xs[0] - xs[0].max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)).astype(np.float32)
    q, k, v = xs
    _, heads, s, d = q.shape
    groups, t = k.shape[1], k.shape[2]
    k = np.repeat(k, heads // groups, axis=1)
    v = np.repeat(v, heads // groups, axis=1)
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(d)
    scores = np.where(np.arange(t)[None, :] <= np.arange(s)[:, None] + t - s, scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return ((p @ v) / p.sum(-1, keepdims=True)).astype(np.float32)


def test_demo_finds_the_examples() -> None:
    """``akc demo`` reads the repository's examples/ (the stand-ins below never touch the files)."""
    from arke.cli import demo

    assert (demo.EXAMPLES / "rmsnorm.ak").is_file() and (demo.EXAMPLES / "attention.ak").is_file()


@pytest.mark.parametrize("wrong", [False, True])
def test_demo_compares_the_interpreter_with_torch(wrong: bool, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``akc demo`` with the loader, interpreter and compiler stood in for: agreement exits 0, a wrong answer 1."""
    pytest.importorskip("torch")

    def load(path: Any) -> Any:
        names = ("rmsnorm", "softmax") if "rmsnorm" in str(path) else ("attention",)
        kernels = {n: types.SimpleNamespace(name=n) for n in names}
        return types.SimpleNamespace(names=names, kernels=kernels, strategies=types.SimpleNamespace(strategies=()))

    def interpret(kernel: Any, *arrays: Any) -> Any:
        out = _numpy_kernel(kernel.name, *arrays)
        return out * 1.01 if wrong and kernel.name == "attention" else out

    def build(module: Any, target: str = "llvm") -> Any:
        kernels = {n: (lambda *a, n=n: interpret(types.SimpleNamespace(name=n), *a)) for n in module.names}
        return types.SimpleNamespace(target=target, kernels=kernels)

    monkeypatch.setattr(arke, "load", load)
    monkeypatch.setattr(arke, "interpret", interpret)
    monkeypatch.setattr(arke, "build", build)
    status, out, _ = run(capsys, "demo", "--kernels")
    assert status == (1 if wrong else 0)
    assert out.count(" ok ") == (8 if wrong else 12)  # each case on the interpreter and compiled
    assert ("4 of 12 cases disagree" if wrong else "all 12 cases agree with torch") in out



def test_layer_demo_checks_and_times_a_small_layer(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's decoder layer, shrunk: built, checked against the interpreter and transformers, timed."""
    pytest.importorskip("transformers")
    from arke.cli.demo_layer import DemoShape, run_layer_demo

    status = run_layer_demo(shape=DemoShape(hidden=64, mlp=96, heads=4, kv_heads=2, head_dim=16, prefill=7, steps=3))
    out = capsys.readouterr().out
    assert status == 0, out
    assert "prefill 7" in out and "decode step" in out and out.count("agrees") == 2


def test_model_demo_generates_and_checks_a_small_model(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's whole model, shrunk: saved, loaded with from_pretrained, generating transformers' tokens, timed."""
    pytest.importorskip("transformers")
    from arke.cli.demo_model import ModelShape, run_model_demo

    shape = ModelShape(layers=1, vocab=300, hidden=64, mlp=96, heads=4, kv_heads=2, head_dim=16, prompt=5, new=6)
    status = run_model_demo(shape=shape, compiled=False)
    out = capsys.readouterr().out
    assert status == 0, out
    assert "identical" in out and "torch eager" in out and "tokens/s" in out


# ---------------------------------------------------------------- akc build --target triton (no GPU needed)

_TRITON_ADD = '''import triton
import triton.language as tl


@triton.jit
def k_0(b0, b1, b2, d0, BLOCK_N: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = offs < d0
    tl.store(b2 + offs, tl.load(b0 + offs, mask=m) + tl.load(b1 + offs, mask=m), mask=m)
'''
_TRITON_MM = '''import triton
import triton.language as tl


@triton.jit
def k_0(b0, b1, b2, d0, d1, d2, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(d1, BLOCK_K)):
        kk = k * BLOCK_K + rk
        a = tl.load(b0 + rm[:, None] * d1 + kk[None, :], mask=(rm[:, None] < d0) & (kk[None, :] < d1), other=0.0)
        b = tl.load(b1 + kk[:, None] * d2 + rn[None, :], mask=(kk[:, None] < d1) & (rn[None, :] < d2), other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(b2 + rm[:, None] * d2 + rn[None, :], acc, mask=(rm[:, None] < d0) & (rn[None, :] < d2))
'''
_TRITON_AK = """\
kernel add2(x: f32[N], y: f32[N]) -> f32[N] {
  return x[n] + y[n]
}

kernel mm(a: bf16[M, K], b: bf16[K, N]) -> f32[M, N] {
  return sum(f32(a[m, k]) * f32(b[k, n]) for k)
}

@strategy(mm, target = triton) {
  tile m = 128, n = 128, k = 128
  stages = 5
  warps = 8
}
"""


class _FakeTritonRenderer:
    """Stands in for arke.targets.triton.render: hand-written artifacts that follow the target's contract."""

    name = "triton"
    families = frozenset({"attention", "contraction", "rows"})

    def render(self, plan: Any) -> Any:
        from arke.targets.artifact import Artifact, LaunchSpec

        if len(plan.dims) == 1:
            opts: tuple[tuple[str, int], ...] = (("BLOCK_N", 1024), ("num_warps", 4), ("num_stages", 1))
            launch = LaunchSpec("k_0", None, (0, 1, 2), None, ("cdiv(N, 1024)",), opts)
            return Artifact("triton", _TRITON_ADD, (launch,))
        tiles = {d.subject: int(d.value) for d in plan.decisions if d.kind == "tile"}
        stages = next((int(d.value) for d in plan.decisions if d.kind == "stages"), 3)
        opts = (("BLOCK_M", tiles.get("m", 64)), ("BLOCK_N", tiles.get("n", 64)), ("BLOCK_K", tiles.get("k", 32)),
                ("num_warps", 8), ("num_stages", stages))
        return Artifact("triton", _TRITON_MM, (LaunchSpec("k_0", None, (0, 1, 2), None, ("1",), opts),))


@pytest.fixture()
def fake_triton(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A .ak file with a pointwise kernel and a matmul, and a stand-in Triton renderer."""
    pytest.importorskip("triton")
    import arke.targets.triton

    fake = types.ModuleType("arke.targets.triton.render")
    fake.RENDERER = _FakeTritonRenderer()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "arke.targets.triton.render", fake)
    monkeypatch.setattr(arke.targets.triton, "render", fake, raising=False)
    path = tmp_path / "gpu.ak"
    path.write_text(_TRITON_AK, encoding="utf-8")
    return path


def test_build_triton_ptx_and_cubin_with_a_resource_table(fake_triton: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "add.ptx"
    status, stdout, stderr = run(capsys, "build", str(fake_triton), "--target", "triton", "--kernel", "add2",
                                 "--arch", "sm_80", "--emit", "ptx", "-o", str(out))
    assert status == 0, stderr
    assert ".target sm_80" in out.read_text() and ".entry k_0" in out.read_text()
    header, row = stdout.splitlines()[:2]
    assert header.split() == ["kernel", "entry", "arch", "warps", "stages", "regs", "spills", "shared"]
    assert row.split()[:5] == ["add2", "k_0", "sm_80", "4", "1"]
    folder = tmp_path / "bins"
    status, stdout, stderr = run(capsys, "build", str(fake_triton), "--target", "triton", "--kernel", "add2",
                                 "--emit", "cubin", "-o", str(folder) + os.sep)
    assert status == 0, stderr
    [cubin] = folder.iterdir()
    assert cubin.name == "add2.k_0.sm_90.cubin" and cubin.read_bytes()[:4] == b"\x7fELF"


def test_build_triton_source(fake_triton: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, stdout, _ = run(capsys, "build", str(fake_triton), "--target", "triton", "--kernel", "add2")
    assert status == 0 and "@triton.jit" in stdout and "# ---- add2" in stdout


def test_build_triton_tiles_too_big_is_AK4012_at_the_decision(fake_triton: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    status, _, stderr = run(capsys, "build", str(fake_triton), "--target", "triton", "--kernel", "mm",
                            "--arch", "sm_80", "--emit", "ptx", "-o", str(tmp_path / "mm.ptx"))
    code = "AK4012"  # a build-time code: tests/lang/test_errors.py's BUILD_TIME points here
    assert status == 1
    assert f"error[{code}]" in stderr and "shared memory" in stderr and "sm_80" in stderr
    assert f"{fake_triton}:10:" in stderr  # the `tile` line of the strategy


def test_build_triton_usage_errors(fake_triton: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from arke.targets.nvidia import cubin
    from arke.targets.triton import aot as triton_aot

    status, _, stderr = run(capsys, "build", str(fake_triton), "--target", "triton", "--arch", "sm_70",
                            "--emit", "ptx")
    assert status == 2 and "sm_90" in stderr
    status, _, stderr = run(capsys, "build", str(fake_triton), "--target", "llvm", "--emit", "ptx")
    assert status == 2 and "--target triton" in stderr

    def missing() -> None:
        raise cubin.TritonMissingError("the triton target needs Triton: pip install triton")

    monkeypatch.setattr(triton_aot, "require_triton", missing)
    status, _, stderr = run(capsys, "build", str(fake_triton), "--target", "triton", "--emit", "ptx")
    assert status == 2 and "pip install triton" in stderr


def test_fmt_and_lsp_are_akc_commands(tmp_path: Path) -> None:
    """`akc fmt` and `akc lsp` are reachable through the real entry point (not only their modules)."""
    messy = tmp_path / "messy.ak"
    messy.write_text("kernel f(x: f32[N]) -> f32[N] {  return x[n]*2 }\n", encoding="utf-8")
    done = akc("fmt", "--check", str(messy))
    assert done.returncode == 1 and "messy.ak" in done.stdout
    assert akc("fmt", str(messy)).returncode == 0
    assert messy.read_text(encoding="utf-8") == "kernel f(x: f32[N]) -> f32[N] {\n  return x[n] * 2\n}\n"
    helped = akc("lsp", "--help")
    assert helped.returncode == 0 and "language server" in helped.stdout


GENERIC_AND_SCALAR = """kernel sc(x: W[N]) -> W[N] where W in {f32, bf16} {
  return W(f32(x[n]) * 2.0)
}
kernel s0(x: f32) -> f32 { return x * 2.0 }
"""


def test_a_generic_kernel_named_by_kernel_builds_each_specialisation(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`akc build --kernel sc` on a generic kernel was an internal error (exit 3) on every target: it builds each
    specialisation, as the file without --kernel does; `akc run` asks for --dtypes; a kernel of scalars alone
    runs (its NumPy result was an internal error)."""
    path = tmp_path / "g.ak"
    path.write_text(GENERIC_AND_SCALAR)
    assert cli.main(["build", str(path), "--kernel", "sc"]) == 0
    out = capsys.readouterr().out
    assert "sc__W_f32" in out and "sc__W_bf16" in out
    assert cli.main(["build", str(path), "--target", "cuda", "--kernel", "sc", "--emit", "source"]) == 0
    assert "kernel sc__W_bf16" in capsys.readouterr().out
    assert cli.main(["run", str(path), "sc", "--dims", "N=8"]) == 2
    assert "pick its dtypes with --dtypes" in capsys.readouterr().err
    assert cli.main(["run", str(path), "sc", "--dims", "N=8", "--dtypes", "W=bf16"]) == 0
    assert cli.main(["run", str(path), "s0"]) == 0
    assert "max |llvm - interpreter| = 0" in capsys.readouterr().out
