"""The Triton target's own ``sin`` and ``cos`` (arke/targets/triton/trig.py, spec/codegen.md §9.5):
within the tolerance rule of every f32 argument under Triton's interpreter (against numpy in f64
and against the reference interpreter), special values exact; compiled, they need no local memory
(test_triton_dim_params.py's rotary map)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from codegen_support import assert_conforms, build, text_module

from arke.targets.triton import kernel as gpu
from arke.targets.triton.trig import FAST_LIMIT

pytestmark = pytest.mark.skipif(not gpu.runnable(), reason="triton cannot run here (no triton, no GPU, no interpreter)")

SOURCE = """
kernel sine(x: f32[N]) -> f32[N] { return sin(x[n]) }
kernel cosine(x: f32[N]) -> f32[N] { return cos(x[n]) }
"""
#: The tolerance rule's allowance for sin and cos of an exact argument (arke/runtime/error_bound.py:
#: 2 · LIBM_ULPS ulps of 1), in units of 2**-24.
ALLOWED = 32
SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, FAST_LIMIT, np.nextafter(FAST_LIMIT, 0), 3.4028235e38,
                    -3.4028235e38, 1e-40, -1e-45, np.pi / 2, np.pi, 1.5707964, 102906.0, 16367173 * 2.0 ** 72,
                    8388608.0, 2.0 ** 24 + 2, 1e30, -7.0e22], dtype=np.float32)


def arguments() -> np.ndarray:
    """Small, mid-range and huge arguments of both signs, random f32 bit patterns and the special ones."""
    rng = np.random.default_rng(7)
    huge = np.exp(rng.uniform(0.0, 88.0, 1024)) * rng.choice([-1.0, 1.0], 1024)
    bits = rng.integers(0, 2 ** 32, 1024, dtype=np.uint64).astype(np.uint32).view(np.float32)
    bits = bits[np.isfinite(bits)]
    return np.concatenate([rng.uniform(-10, 10, 512), rng.uniform(-2 * FAST_LIMIT, 2 * FAST_LIMIT, 512), huge,
                           bits, SPECIAL]).astype(np.float32)


@pytest.mark.parametrize(("name", "exact"), [("sine", np.sin), ("cosine", np.cos)])
def test_trig_within_the_tolerance_rule_on_every_f32(name: str, exact: np.ufunc) -> None:
    x = arguments()
    got = build(text_module(SOURCE), "triton").kernels[name](torch.from_numpy(x)).numpy()
    finite = np.isfinite(x)
    err = np.abs(got[finite].astype(np.float64) - exact(x[finite].astype(np.float64))) * 2.0 ** 24
    assert err.max() <= ALLOWED / 4, f"{name}({x[finite][err.argmax()]!r}) is off by {err.max():.1f} ulps of 1"
    assert np.isnan(got[~finite]).all()  # sin and cos of ±inf and NaN
    assert_conforms(torch.from_numpy(got), text_module(SOURCE).kernels[name], torch.from_numpy(x))


def test_trig_special_values() -> None:
    x = torch.tensor([0.0, -0.0, np.pi / 2, FAST_LIMIT], dtype=torch.float32)
    lib = build(text_module(SOURCE), "triton")
    s, c = lib.sine(x), lib.cosine(x)
    assert s[0].item() == 0.0 and not torch.signbit(s[0]) and torch.signbit(s[1])  # sin(±0) = ±0
    assert c[0].item() == 1.0 and c[1].item() == 1.0
    assert abs(c[2].item()) < 1e-7 and abs(s[2].item() - 1.0) < 1e-7
    assert abs(s[3].item() - float(np.sin(np.float64(FAST_LIMIT)))) < 2e-7  # the first argument of the slow path


def test_trig_module_calls_no_libdevice() -> None:
    from arke.plan.dispatch import make_plan
    from arke.targets.triton.render import RENDERER

    mod = text_module(SOURCE)
    plan = make_plan(mod.semantic, mod.kernel_map["sine"], None, families=RENDERER.families)
    source = RENDERER.render(plan).source
    assert "_ak_sin(" in source and "def _ak_trig_big(" in source
    assert "tl.sin(" not in source and "tl.cos(" not in source
