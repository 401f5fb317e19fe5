"""bf16 and int8 weights packed once into the matrix units' VNNI panels (``pack_vnni_panels``):
read in place by every contraction dispatch that runs on AMX or AVX512-BF16, with the bits the
per-call packing gives (from four rows on; fewer rows run the unit's blocks instead of dot products).

Shapes are ragged: one and three rows, k-blocks with tails, a 4097-column slab tail. Each unit's run
is skipped where the host lacks it (or Linux refuses AMX).
"""

from __future__ import annotations

import platform

import numpy as np
import pytest
import torch
from codegen_support import assert_conforms, same_bits, seeded
from test_llvm_units import _int8_inputs, _kernel

from arke.targets import base as targets
from arke.targets.llvm.gemm_base import GEMV_ROWS
from arke.targets.llvm.isa import AMX, AMX_INT8, DPBF16, VNNI, host_units, missing
from arke.targets.llvm.panels import VNNI_KEY, pack_vnni_panels

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                reason="the matrix units named here are x86-64 ones")

SHAPES = [{"M": 1, "K": 67, "N": 70}, {"M": 3, "K": 100, "N": 33}, {"M": 37, "K": 1100, "N": 4097},
          {"M": 65, "K": 33, "N": 96}]


def _bf16(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.from_numpy(seeded("vnni", seed).standard_normal(shape).astype(np.float32)).bfloat16()


@pytest.mark.parametrize("unit", [AMX, DPBF16])
@pytest.mark.parametrize("dims", SHAPES, ids=lambda d: "-".join(map(str, d.values())))
def test_bf16_panels_are_read_in_place(unit: str, dims: dict[str, int]) -> None:
    why = missing(unit)
    if why is not None:
        pytest.skip(why)
    kernel, module = _kernel("lin", frozenset({unit}))
    assert kernel.artifact.meta["panels.0"] == f"1,{VNNI_KEY}"
    m, k, n = dims["M"], dims["K"], dims["N"]
    x, w = _bf16((m, k), m + k), _bf16((n, k), n)
    packed = pack_vnni_panels(w)
    assert packed.shape == w.shape and packed.dtype == torch.bfloat16
    got = kernel(x, packed)
    assert_conforms(got, module.kernels["lin"], x, w)
    if m >= GEMV_ROWS:  # the same packed values in the same order as the per-call packing
        assert same_bits(got, kernel(x, w))
    assert same_bits(got, kernel(x, packed, threads=1))


@pytest.mark.parametrize("unit", [AMX, DPBF16])
def test_fewer_rows_give_the_rows_of_a_whole_block(unit: str) -> None:
    """A block with 1 to 7 rows inside M runs a micro-kernel of that many rows (1, 2, 4 or the unit's own;
    decode): each row's sums are the bits of the same row computed in a whole block, at any thread count."""
    why = missing(unit)
    if why is not None:
        pytest.skip(why)
    kernel, _ = _kernel("lin", frozenset({unit}))
    x, w = _bf16((9, 1100), 3), _bf16((97, 1100), 4)  # three k-blocks (the last with a tail), a panel tail
    packed = pack_vnni_panels(w)
    whole = kernel(x, packed)
    for rows in range(1, 8):
        assert same_bits(kernel(x[:rows], packed), whole[:rows]), rows
        assert same_bits(kernel(x[:rows], packed, threads=1), whole[:rows]), rows


def test_int8_panels_on_amx_are_exact() -> None:
    why = missing(AMX_INT8)
    if why is not None:
        pytest.skip(why)
    kernel, _ = _kernel("qlin", frozenset({AMX_INT8}))
    for dims in ({"M": 2, "K": 130, "N": 70}, {"M": 40, "K": 300, "N": 97}):
        x, w = _int8_inputs("qlin", dims)
        exact = torch.from_numpy(x).long() @ torch.from_numpy(w).long().T
        got = kernel(torch.from_numpy(x), pack_vnni_panels(torch.from_numpy(w)))
        assert torch.equal(torch.as_tensor(got), exact.int())


def test_a_dispatch_that_cannot_read_panels_refuses_them() -> None:
    """AVX512-VNNI's int8 kernel packs its own panels (it sums each block's columns as it packs): given
    prepacked ones it refuses them rather than read them as [N, K]."""
    why = missing(VNNI)
    if why is not None:
        pytest.skip(why)
    kernel, _ = _kernel("qlin", frozenset({VNNI}))
    assert not any(key.startswith("panels.") for key in kernel.artifact.meta)
    x, w = _int8_inputs("qlin", {"M": 5, "K": 64, "N": 40})
    with pytest.raises(RuntimeError, match="holds prepacked panels \\(layout vnni\\), which dispatch 0 cannot read"):
        kernel(torch.from_numpy(x), pack_vnni_panels(torch.from_numpy(w)))


def test_only_bf16_and_int8_matrices_pack() -> None:
    with pytest.raises(ValueError, match="VNNI panels hold a bf16 or int8 matrix"):
        pack_vnni_panels(torch.ones(4, 4))
    with pytest.raises(ValueError, match="VNNI panels hold a bf16 or int8 matrix"):
        pack_vnni_panels(torch.ones(4, dtype=torch.bfloat16))


def test_the_target_packs_for_the_units_this_host_has() -> None:
    llvm = targets.get("llvm")
    w = torch.ones(40, 70, dtype=torch.bfloat16)
    packed = llvm.pack_weight(w)
    if {AMX, DPBF16} & host_units():
        assert packed is not None and packed.shape == w.shape
    else:
        assert packed is None
    assert llvm.pack_weight(torch.ones(40, 70, dtype=torch.float16)) is None
