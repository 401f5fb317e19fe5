"""``akc build --emit cubin`` for both GPU code paths that need no GPU: the LLVM target's NVPTX
flavour (``--target llvm --arch``) and CUDA C through NVRTC (``--target cuda``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_support import GPU_AK, run_cli

from arke.targets.cuda import nvrtc
from arke.targets.nvidia import ptx as nvptx

TARGETS = pytest.mark.parametrize("target", ["llvm", pytest.param("cuda", marks=pytest.mark.skipif(
    not nvrtc.available(), reason="no NVRTC (pip install 'arke[cuda]')"))])


@TARGETS
def test_cli_emits_ptx(target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "k.ak"
    path.write_text(GPU_AK, encoding="utf-8")
    status, out, _ = run_cli(capsys, "build", str(path), "--target", target, "--arch", "sm_80", "--emit", "ptx",
                             "--kernel", "mm")
    assert status == 0 and ".target sm_80" in out and ".entry mm_d0" in out
    status, out, _ = run_cli(capsys, "build", str(path), "--target", target, "--arch", "sm_90", "--emit", "ptx",
                             "-o", str(tmp_path / "ptx"))
    assert status == 0
    assert sorted(p.name for p in (tmp_path / "ptx").iterdir()) == ["add2.sm_90.ptx", "mm.sm_90.ptx"]
    if nvptx.ptxas_path() is not None:
        assert "regs" in out and "spills" in out and "mm_d0" in out


@pytest.mark.skipif(nvptx.ptxas_path() is None, reason="no ptxas (it ships with Triton)")
@TARGETS
def test_cli_emits_cubin_with_a_resource_table(target: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "k.ak"
    path.write_text(GPU_AK, encoding="utf-8")
    out_file = tmp_path / "mm.cubin"
    status, out, _ = run_cli(capsys, "build", str(path), "--target", target, "--arch", "sm_90", "--emit", "cubin",
                             "--kernel", "mm", "-o", str(out_file))
    assert status == 0 and out_file.read_bytes()[:4] == b"\x7fELF"
    assert "mm_d0" in out and "sm_90" in out and "spills" in out
