"""The LLVM target's own 16-bit float conversions (``arke.targets.llvm.convert``) are exact:
every half and bfloat widens to the float torch gives, and floats (random, near every
rounding boundary, subnormal, huge, infinite, NaN) round to the half/bfloat torch gives."""

from __future__ import annotations

import ctypes
import platform
from collections.abc import Callable
from functools import cache

import numpy as np
import pytest
import torch

from arke.targets.llvm.convert import narrow, widen
from arke.targets.llvm.jit import Loaded as _Loaded
from arke.targets.llvm.jit import compile_object

KINDS = {"bfloat": torch.bfloat16, "half": torch.float16}


@cache
def converter(kind: str, widening: bool, lanes: int = 1) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """A JIT'd loop ``out[i:i+lanes] = convert(in[i:i+lanes])`` through the function under test."""
    fn, definition = (widen if widening else narrow)(kind, lanes)
    src_t, dst_t = ("i16", "float") if widening else ("float", "i16")  # 16-bit floats travel as their bits
    if lanes > 1:
        src_t, dst_t = f"<{lanes} x {src_t}>", f"<{lanes} x {dst_t}>"
    source = f"""{definition}
define void @run(ptr %src, ptr %dst, i64 %n) {{
entry:
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i1, %loop ]
  %p = getelementptr {src_t.split(" x ")[-1].rstrip(">")}, ptr %src, i64 %i
  %x = load {src_t}, ptr %p
  %y = call {dst_t} {fn}({src_t} %x)
  %q = getelementptr {dst_t.split(" x ")[-1].rstrip(">")}, ptr %dst, i64 %i
  store {dst_t} %y, ptr %q
  %i1 = add i64 %i, {lanes}
  %more = icmp slt i64 %i1, %n
  br i1 %more, label %loop, label %done
done:
  ret void
}}
"""
    # compiled for baseline x86-64 (no F16C, no AVX512-BF16) where that is the host's ISA: the
    # machines these functions exist for
    loaded = _Loaded(compile_object(source, "x86-64" if platform.machine() in ("x86_64", "AMD64") else None))
    address = loaded.engine.get_function_address("run")
    call = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(address)

    def run(src: torch.Tensor, dst: torch.Tensor) -> None:
        call(src.data_ptr(), dst.data_ptr(), src.numel())

    run.loaded = loaded  # type: ignore[attr-defined]  # keep the engine alive
    return run


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns, except that any NaN matches any NaN."""
    width = {2: torch.int16, 4: torch.int32}[a.element_size()]
    nan = torch.isnan(a.float()) & torch.isnan(b.float())
    return bool(((a.view(width) == b.view(width)) | nan).all())


@pytest.mark.parametrize("lanes", [1, 16])
@pytest.mark.parametrize("kind", KINDS)
def test_every_16_bit_value_widens_exactly(kind: str, lanes: int) -> None:
    values = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(KINDS[kind])
    out = torch.empty(values.shape, dtype=torch.float32)
    converter(kind, True, lanes)(values, out)
    assert same_bits(out, values.float())


def floats() -> torch.Tensor:
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    # every 16-bit pattern as the top half, with the low half at each rounding boundary
    top = np.arange(2**16, dtype=np.uint32) << 16
    halves = [top | low for low in (0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF)]
    # every half's neighbourhood: f16 mantissas end 13 bits into f32's
    h = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    hb = h.view(torch.int32).numpy().astype(np.uint32)
    near = [hb + d for d in (0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF)] + [hb - 1]
    specials = np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001, 0, 0x80000000, 1, 0x477FF000,
                         0x477FEFFF, 0x47800000, 0x33000000, 0x33000001, 0x387FC000], dtype=np.uint32)
    return torch.from_numpy(np.concatenate([bits, *halves, *near, specials]).view(np.float32).copy())


@pytest.mark.parametrize("lanes", [1, 8])
@pytest.mark.parametrize("kind", KINDS)
def test_floats_round_to_nearest_even(kind: str, lanes: int) -> None:
    x = floats()
    x = x[: len(x) // lanes * lanes]
    out = torch.empty(x.shape, dtype=KINDS[kind])
    converter(kind, False, lanes)(x, out)
    assert same_bits(out, x.to(KINDS[kind]))
