"""Helpers of the bundle tests: the C example's case files, and building the example."""

from __future__ import annotations

import shutil
import struct
import subprocess
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from arke.runtime.guards import TORCH_DTYPES
from arke.targets.llvm.bundle.cwrap import DTYPE_CODES

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "c" / "run_case.c"
_CODE = {TORCH_DTYPES[d]: c for d, c in DTYPE_CODES.items()}


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous().cpu()
    head = struct.pack("<ii", _CODE[t.dtype], t.dim()) + struct.pack(f"<{t.dim()}q", *t.shape)
    raw = t.view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)
    return head + raw.numpy().tobytes()


def write_case(path: Path, args: Sequence[torch.Tensor], want: Sequence[torch.Tensor],
               bounds: Sequence[torch.Tensor | None]) -> Path:
    """A case file of ``examples/c/run_case.c``: the arguments, the expected results and, for float
    results, each element's bound (the tolerance rule's; NaN: must be equal)."""
    data = struct.pack("<q", len(args)) + b"".join(_tensor_bytes(a) for a in args)
    data += struct.pack("<q", len(want))
    for w, b in zip(want, bounds, strict=True):
        data += _tensor_bytes(w)
        if w.is_floating_point():
            bound = b if b is not None else torch.zeros(w.shape, dtype=torch.float64)
            data += np.ascontiguousarray(bound.double().numpy()).tobytes()
    path.write_bytes(data)
    return path


def as_tensors(values: Sequence[object]) -> list[torch.Tensor]:
    return [v if isinstance(v, torch.Tensor) else torch.from_numpy(np.asarray(v)) for v in values]


def compile_example(bundle: Path, out: Path, compiler: str = "cc") -> Path:
    """Build the C example against ``bundle``'s header with ``compiler``."""
    cc = shutil.which(compiler)
    assert cc, f"{compiler} is not installed"
    subprocess.run([cc, "-O2", "-std=gnu11", f"-I{bundle}", "-o", str(out), str(EXAMPLE), "-ldl", "-lm"],
                   check=True, capture_output=True, text=True)
    return out
