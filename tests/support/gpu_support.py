"""Shared pieces of the GPU targets' build tests (test_llvm_nvptx.py, test_cuda.py): a small
`.ak` file with a pointwise kernel and a bf16 contraction, and running ``akc`` in-process."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from codegen_support import LAYER_DTYPES, STDLIB, kernel_names, std_module

from arke.cli import app as cli
from arke.plan.dispatch import make_plan

#: the architectures every GPU artifact is built for
ARCHS = ("sm_80", "sm_90")
#: (module, kernel) of every stdlib kernel
KERNELS = [(m, k) for m in STDLIB for k in kernel_names(std_module(m), LAYER_DTYPES)]


@cache
def stdlib_source(renderer: Any, module: str, kernel: str) -> str:
    """A stdlib kernel rendered by ``renderer`` (its default plan), once per process."""
    m = std_module(module)
    plan = make_plan(m.semantic, m.kernel_map[kernel], None, families=renderer.families)
    return str(renderer.render(plan).source)

GPU_AK = """\
kernel add2(x: f32[N], y: f32[N]) -> f32[N] {
  return x[n] + y[n]
}

kernel mm(a: bf16[M, K], b: bf16[K, N]) -> f32[M, N] {
  return sum(f32(a[m, k]) * f32(b[k, n]) for k)
}
"""


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``akc ARGS``: (exit status, stdout, stderr)."""
    status = cli.main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def assert_assembles_without_spills(ptx: str, arch: str) -> None:
    """ptxas assembles ``ptx`` for ``arch``, every entry with no spills and a legal register count."""
    from arke.targets.nvidia import ptx as nvptx

    cubin, entries = nvptx.assemble(ptx, arch)
    assert cubin and entries
    for e in entries:
        assert e.spills == 0, f"{e.entry} spills {e.spills} words on {arch}"
        assert 0 < e.registers <= 255
