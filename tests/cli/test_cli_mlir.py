"""``akc build --target mlir``: MLIR source, transform scripts, IREE's vmfb, and its errors.

No GPU is needed: ``--device cuda`` compiles for sm_80 (IREE 3.13 has no sm_90 target, a clear
usage error). A missing IREE is a usage error naming the ``mlir`` extra, never a traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import arke.library  # noqa: F401  (imported before a test hides IREE: it lists runnable targets at import)
from arke.cli import app as cli
from arke.targets.mlir import kernel as iree

needs_iree = pytest.mark.skipif(not iree.iree_available(), reason="IREE is not installed (pip install 'arke[mlir]')")

KERNELS = """kernel rms(x: f32[M, N], w: f32[N], eps: f32 = 1e-6) -> f32[M, N] {
  inv[m] = rsqrt(mean(x[m, k] * x[m, k] for k) + eps)
  return x[m, n] * inv[m] * w[n]
}

kernel lin(x: f32[M, K], w: f32[N, K]) -> f32[M, N] {
  return sum(x[m, k] * w[n, k] for k)
}

@strategy(lin) {
  parallel m
  warps = 4
}
"""


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run ``akc ARGS`` in process: (exit status, stdout, stderr)."""
    status = cli.main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def kernels(tmp_path: Path) -> Path:
    path = tmp_path / "k.ak"
    path.write_text(KERNELS, encoding="utf-8")
    return path


def _loads(data: bytes) -> list[str]:
    """The functions of a vmfb (loading it needs no device)."""
    import iree.runtime as rt

    return list(rt.VmModule.copy_buffer(rt.VmInstance(), data).function_names)


def test_source_is_mlir_per_kernel(kernels: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "build", str(kernels), "--target", "mlir")
    assert status == 0
    assert "// rms (defaults)" in out and "// lin (strategy)" in out
    assert "func.func @rms(" in out and "func.func @lin(" in out and "linalg." in out
    assert out.count("// -----\n") == 1  # modules apart, as `iree-opt --split-input-file` reads them
    verified = subprocess.run([str(Path(sys.executable).parent / "iree-opt"), "--split-input-file", "-"], input=out,
                              capture_output=True, text=True)
    assert verified.returncode == 0, verified.stderr


def test_transform_scripts_per_kernel(kernels: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "t.mlir"
    status, out, _ = run(capsys, "build", str(kernels), "--target", "mlir", "--kernel", "lin", "--emit", "transform",
                         "-o", str(target))
    text = target.read_text(encoding="utf-8")
    assert status == 0 and out == ""
    assert "// lin (strategy)" in text and "@__transform_main" in text and "tile_using_forall" in text


def test_a_decision_mlir_cannot_express_is_AK4013_at_it(kernels: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "build", str(kernels), "--target", "mlir", "--kernel", "lin")
    assert status == 0
    assert "warning[AK4013]" in err and f"{kernels}:12:3" in err and "warps" in err  # the `warps = 4` line
    status, _, err = run(capsys, "build", str(kernels), "--target", "mlir", "--kernel", "rms")
    assert status == 0 and "AK4013" not in err


@pytest.mark.usefixtures("no_iree")
def test_source_needs_no_iree(kernels: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "build", str(kernels), "--target", "mlir", "--kernel", "rms")
    assert status == 0 and "func.func @rms(" in out


@needs_iree
def test_vmfb_of_one_kernel_is_a_file(kernels: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "rms.vmfb"
    status, _, err = run(capsys, "build", str(kernels), "--target", "mlir", "--kernel", "rms", "--emit", "vmfb",
                         "-o", str(target))
    assert status == 0, err
    assert "rms" in _loads(target.read_bytes())


@needs_iree
def test_vmfb_of_several_kernels_is_a_folder(kernels: Path, capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    folder = tmp_path / "out"
    status, _, err = run(capsys, "build", str(kernels), "--target", "mlir", "--emit", "vmfb", "-o", str(folder))
    assert status == 0, err
    assert sorted(p.name for p in folder.iterdir()) == ["lin.strategy.cpu.vmfb", "rms.defaults.cpu.vmfb"]
    assert "lin" in _loads((folder / "lin.strategy.cpu.vmfb").read_bytes())


@needs_iree
def test_vmfb_for_cuda_defaults_to_sm80_and_needs_no_gpu(kernels: Path, capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    folder = tmp_path / "cuda"
    status, _, err = run(capsys, "build", str(kernels), "--target", "mlir", "--kernel", "rms", "--emit", "vmfb",
                         "--device", "cuda", "-o", str(folder) + "/")
    assert status == 0, err
    (built,) = folder.iterdir()
    assert built.name == "rms.defaults.sm_80.vmfb" and "rms" in _loads(built.read_bytes())
    target = tmp_path / "rms86.vmfb"
    status, _, err = run(capsys, "build", str(kernels), "--target", "mlir", "--kernel", "rms", "--emit", "vmfb",
                         "--device", "cuda", "--arch", "sm_86", "-o", str(target))
    assert status == 0 and target.exists(), err


@needs_iree
def test_sm90_is_a_clear_usage_error(kernels: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, out, err = run(capsys, "build", str(kernels), "--target", "mlir", "--emit", "vmfb", "--device", "cuda",
                           "--arch", "sm_90", "-o", str(tmp_path / "x.vmfb"))
    assert status == cli.EXIT_USAGE and out == ""
    assert "sm_80" in err and "PTX" in err and "Traceback" not in err and "internal error" not in err
    assert not (tmp_path / "x.vmfb").exists()


@pytest.mark.usefixtures("no_iree")
def test_vmfb_without_iree_names_the_extra(kernels: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, _, err = run(capsys, "build", str(kernels), "--target", "mlir", "--emit", "vmfb", "-o",
                         str(tmp_path / "x"))
    assert status == cli.EXIT_USAGE and "pip install 'arke[mlir]'" in err and "Traceback" not in err
    status, _, err = run(capsys, "run", str(kernels), "rms", "--target", "mlir", "--dims", "M=2,N=8")
    assert status == cli.EXIT_USAGE and "pip install 'arke[mlir]'" in err


@pytest.mark.parametrize(("extra", "message"), [
    (("--emit", "vmfb"), "-o PATH"),
    (("--emit", "asm"), "--emit asm is for --target llvm; the mlir target emits source, transform, vmfb"),
    (("--arch", "sm_80"), "--arch sm_80 is for --device cuda"),
])
def test_mlir_usage_errors(kernels: Path, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...],
                           message: str) -> None:
    if "vmfb" in extra and not iree.iree_available():
        pytest.skip("IREE is not installed")
    status, _, err = run(capsys, "build", str(kernels), "--target", "mlir", *extra)
    assert status == cli.EXIT_USAGE and message in err


def test_other_targets_refuse_device_and_mlir_emits(kernels: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "build", str(kernels), "--device", "cuda")
    assert status == cli.EXIT_USAGE and "--device cuda is for --target mlir" in err
    status, _, err = run(capsys, "build", str(kernels), "--emit", "vmfb")
    assert status == cli.EXIT_USAGE and "--emit vmfb is for --target mlir; the llvm target emits" in err


@needs_iree
def test_run_on_the_mlir_target(kernels: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "run", str(kernels), "rms", "--target", "mlir", "--dims", "M=3,N=16",
                           "--repeat", "2")
    assert status == 0, err
    assert "rms on mlir" in out and "max |mlir - interpreter|" in out


@needs_iree
@pytest.mark.parametrize(("body", "says"), [
    ("kernel am(x: f32[M, N]) -> i64[M] { return argmax(x[m, n] for n) }", "reduction of positions"),
    ("kernel top(x: f32[M, N]) -> v: f32[M, 2] { v[m, j] = topk(x[m, n] for n, j) }", "top-k"),
])
def test_what_iree_cannot_distribute_for_cuda_is_refused_before_compiling(body: str, says: str, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "k.ak"
    path.write_text(body + "\n", encoding="utf-8")
    status, _, err = run(capsys, "build", str(path), "--target", "mlir", "--emit", "vmfb", "--device", "cuda",
                         "-o", str(tmp_path / "out") + "/")
    assert status == 1 and says in err and "please report it" not in err, err
