"""Bit shifts on the CPU (spec/language.md §8.10): arke's llvm target against torch eager.

A report, not a test: it never fails the build. Each row is timed with the shared helper
(``benchmarks/timing.py``) and prints arke's and torch's medians, their ratio (below 1: arke is
faster), and whether the optimised LLVM IR of arke's kernel shifts whole vectors
(``lshr <16 x i8>`` ...; the count check stays, as a vector compare or-ed into the error flag).

* ``dequant``: int4 unpack of ``[N, K/2]`` u8 to ``[N, K]`` f32 with shifts, against torch's
  ``(w >> 4) & 15`` and ``w & 15`` interleaved;
* ``dequant_divmod``: the same values by ``//`` and ``%`` (the idiom before shifts existed);
* ``shift_var``: ``w >> c`` with a per-element count (each count checked) against ``torch.bitwise_right_shift``;
* ``int4_linear``: the spec's int4 weight-only linear (``M = 8``) against torch's unpack then matmul.

    .venv/bin/python benchmarks/shifts.py [--budget 2] [--threads N]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import format_seconds, measure

import arke
from arke.plan.dispatch import make_plan
from arke.targets.llvm.jit import optimise
from arke.targets.llvm.render import RENDERER

SOURCE = """
kernel dequant(s: f32[N], w: u8[N, KH], kk: f32[K]) -> y: f32[N, K] where K == 2 * KH {
  y[n, k] = (f32((w[n, k / 2] >> (4 * (k % 2))) & 15) - 8.0) * s[n]
}
kernel dequant_divmod(s: f32[N], w: u8[N, KH], kk: f32[K]) -> y: f32[N, K] where K == 2 * KH {
  y[n, k] = (f32((i32(w[n, k / 2]) / (1 + 15 * (k % 2))) % 16) - 8.0) * s[n]
}
kernel shift_var(w: i32[N], c: i32[N]) -> i32[N] { return w[n] >> c[n] }
kernel int4_linear(x: f32[M, K], w: u8[N, KH], scale: f32[N, KG]) -> f32[M, N]
    where K == 2 * KH, K % KG == 0 {
  y[m, n] = sum(x[m, k] * (f32((w[n, k / 2] >> (4 * (k % 2))) & 15) - 8.0) * scale[n, k / (K / KG)]
                for k)
  return y
}
"""


def torch_unpack(s: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    lo, hi = (w & 15).float() - 8.0, (w >> 4).float() - 8.0
    return torch.stack([lo, hi], -1).flatten(1) * s[:, None]


def vector_shifts(module: arke.Module, name: str) -> bool:
    plan = make_plan(module.semantic, module.kernel_map[name], None, families=RENDERER.families)
    return bool(re.search(r"= (shl|lshr|ashr) <\d+ x i(8|16|32)>", str(optimise(str(RENDERER.render(plan).source)))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    torch.manual_seed(0)
    mod = arke.loads(SOURCE, "<shifts>")
    lib = arke.build(mod, target="llvm", threads=a.threads)
    n, kh, m, kg = 4096, 2048, 8, 32
    w = torch.randint(0, 256, (n, kh), dtype=torch.uint8)
    s = torch.rand(n)
    kd = torch.empty(2 * kh)
    x = torch.randn(m, 2 * kh)
    scale = torch.rand(n, kg)
    wi, ci = torch.randint(-2 ** 31, 2 ** 31 - 1, (1 << 22,), dtype=torch.int32), torch.randint(0, 32, (1 << 22,),
                                                                                                dtype=torch.int32)

    def torch_linear() -> torch.Tensor:
        deq = torch_unpack(torch.ones(n), w) * scale.repeat_interleave(2 * kh // kg, 1)
        return x @ deq.T

    rows = [("dequant", lambda: lib.kernels["dequant"](s, w, kd), lambda: torch_unpack(s, w)),
            ("dequant_divmod", lambda: lib.kernels["dequant_divmod"](s, w, kd), lambda: torch_unpack(s, w)),
            ("shift_var", lambda: lib.kernels["shift_var"](wi, ci), lambda: torch.bitwise_right_shift(wi, ci)),
            ("int4_linear", lambda: lib.kernels["int4_linear"](x, w, scale), torch_linear)]
    print(f"{'kernel':16} {'arke':>10} {'torch':>10} {'arke/torch':>10}  vector shifts in arke's IR")
    for name, ours, theirs in rows:
        got, want = ours(), theirs()
        assert torch.allclose(torch.as_tensor(got).float(), want.float(), rtol=1e-4, atol=1e-3), name
        t = measure({"arke": ours, "torch": theirs}, budget_s=a.budget)
        print(f"{name:16} {format_seconds(t['arke'].median):>10} {format_seconds(t['torch'].median):>10} "
              f"{t['arke'].median / t['torch'].median:>9.2f}×  {vector_shifts(mod, name)}")


if __name__ == "__main__":
    main()
