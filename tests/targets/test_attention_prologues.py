"""Attention whose k is computed (QK-norm, rotary, a scale): the key prologue is hoisted into a map
of its own (``arke.plan.prologue``), evaluated once per key instead of once per task and key tile.

The plan each target renders, and every runnable target against the interpreter by the one
tolerance rule on ragged shapes: GQA (H / G = 2) and MHA, causal with T > S, decode (S = 1),
rotary computed in the kernel or read from cos/sin tables.
"""

from __future__ import annotations

import numpy as np
import pytest
from codegen_support import RUNNABLE, TARGETS, assert_conforms, build, seeded, text_module

from arke.ir import semantic as S
from arke.plan.attention import Attention
from arke.plan.prologue import PREFIX
from arke.targets import base as targets

SOURCE = """
kernel qk_norm(q: f32[B, H, S, D], k: f32[B, G, T, D], v: f32[B, G, T, D], qw: f32[D], kw: f32[D],
               cos: f32[T, D], sin: f32[T, D]) -> f32[B, H, S, D]
  where H % G == 0, T >= S, D % 2 == 0
{
  let R = H / G
  let half = D / 2
  qi[b, h, i] = rsqrt(mean(q[b, h, i, d] * q[b, h, i, d] for d) + 1e-6)
  ki[b, g, j] = rsqrt(mean(k[b, g, j, d] * k[b, g, j, d] for d) + 1e-6)
  qn[b, h, i, d] = q[b, h, i, d] * qi[b, h, i] * qw[d]
  kn[b, g, j, d] = k[b, g, j, d] * ki[b, g, j] * kw[d]
  qr[b, h, i, d] = qn[b, h, i, d] * cos[i + T - S, d]
      + (-1.0 if d < half else 1.0) * qn[b, h, i, (d + half) % D] * sin[i + T - S, d]
  kr[b, g, j, d] = kn[b, g, j, d] * cos[j, d] + (-1.0 if d < half else 1.0) * kn[b, g, j, (d + half) % D] * sin[j, d]
  s[b, h, i, j] = sum(qr[b, h, i, d] * kr[b, h / R, j, d] for d) / sqrt(f32(D))
  c[b, h, i, j] = s[b, h, i, j] if j <= i + T - S else -inf
  mx[b, h, i] = max(c[b, h, i, j] for j)
  p[b, h, i, j] = exp(c[b, h, i, j] - mx[b, h, i])
  return sum(p[b, h, i, j] * v[b, h / R, j, d] for j) / sum(p[b, h, i, j] for j)
}

kernel rope_inside(q: f32[H, S, D], k: f32[H, T, D], v: f32[H, T, D], inv_freq: f32[HD]) -> f32[H, S, D]
  where T >= S, D == 2 * HD
{
  kr[h, j, d] = k[h, j, d] * cos(f32(j) * inv_freq[d % HD])
      + (-1.0 if d < HD else 1.0) * k[h, j, (d + HD) % D] * sin(f32(j) * inv_freq[d % HD])
  s[h, i, j] = sum(q[h, i, d] * kr[h, j, d] for d) * 0.125
  mx[h, i] = max(s[h, i, j] for j)
  p[h, i, j] = exp(s[h, i, j] - mx[h, i])
  return sum(p[h, i, j] * v[h, j, d] for j) / sum(p[h, i, j] for j)
}
"""

SHAPES = [{"B": 1, "H": 1, "G": 1, "S": 1, "T": 1, "D": 2}, {"B": 2, "H": 4, "G": 2, "S": 3, "T": 17, "D": 8},
          {"B": 1, "H": 2, "G": 2, "S": 1, "T": 33, "D": 6}, {"B": 1, "H": 4, "G": 1, "S": 17, "T": 17, "D": 16}]


def _attention_families(target: str) -> bool:
    return "attention" in targets.get(target).fused_families()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["qk_norm", "rope_inside"])
def test_key_prologue_is_its_own_map_and_the_core_reads_it(target: str, name: str) -> None:
    plan = targets.get(target).plan(text_module(SOURCE).semantic, name, None)
    cores = [d for d in plan.dispatches if d.family == "attention"]
    if not _attention_families(target):
        assert not cores and not any(b.name.startswith(PREFIX) for b in plan.buffers)
        return
    assert len(cores) == 1
    pattern = cores[0].pattern
    assert isinstance(pattern, Attention) and pattern.k_direct and isinstance(pattern.k, S.Load)
    if name == "rope_inside":
        return  # the rotary map is read by the scores alone, yet stays stored: k is direct either way
    assert pattern.k.src.startswith(PREFIX)
    hoisted = [op for op in plan.function.ops if isinstance(op, S.MapOp) and op.result == pattern.k.src]
    assert len(hoisted) == 1
    if name == "qk_norm":  # one row per KV group: the heads of a group share it (GQA)
        assert pattern.group is not None
        assert [str(a.extent) for a in hoisted[0].axes][1:] == ["floor(H/floor(H/G))", "T", "D"]


def _inputs(name: str, dims: dict[str, int]) -> list[np.ndarray]:
    rng = seeded("prologue", name, sorted(dims.items()))
    b, h, g, s, t, d = (dims[x] for x in "BHGSTD")

    def f(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    if name == "rope_inside":
        inv = (1.0 / 10000.0 ** (np.arange(0, d, 2) / d)).astype(np.float32)
        return [f(h, s, d), f(h, t, d), f(h, t, d), inv]
    ang = np.arange(t)[:, None] * (1.0 / 10000.0 ** (np.arange(0, d, 2) / d))[None, :]
    ang = np.concatenate([ang, ang], -1)
    return [f(b, h, s, d), f(b, g, t, d), f(b, g, t, d), 1 + f(d) / 10, 1 + f(d) / 10,
            np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)]


@pytest.mark.parametrize("target", RUNNABLE)
@pytest.mark.parametrize("name", ["qk_norm", "rope_inside"])
@pytest.mark.parametrize("dims", SHAPES, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_hoisted_prologue_conforms(target: str, name: str, dims: dict[str, int]) -> None:
    args = _inputs(name, dims)
    got = build(text_module(SOURCE), target).kernels[name](*args)
    assert_conforms(got, text_module(SOURCE).kernels[name], *args, what=f"{target} {name} {dims}")
