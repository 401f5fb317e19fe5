"""The Triton target under Triton's CPU interpreter (``TRITON_INTERPRET=1``, set in tests/conftest.py).

The generated module is plain Python built only from mangled names (no `.ak` identifier ever
reaches it); every generic family (pointwise, layout, gather, reduction, rows) matches the
reference interpreter on ragged shapes; strategies change blocks and launch options; bad
gathers and integer divisions by zero raise the interpreter's exact GuardError.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import numpy as np
import pytest
import torch
from codegen_support import assert_conforms, build, random_inputs, seeded, text_module

from arke.runtime.guards import GuardError
from arke.targets.triton import kernel as gpu

pytestmark = pytest.mark.skipif(not gpu.runnable(), reason="triton cannot run here (no triton, no GPU, no interpreter)")

SOURCE = """
kernel scale(x: f32[M, N], w: f32[N]) -> f32[M, N] { return x[m, n] * w[n] + 1.0 }
kernel flip(x: f32[M, N]) -> f32[N, M] {
  t[n, m] = x[m, n]
  return t[n, m]
}
kernel gather(ids: i64[T], table: f32[V, D]) -> f32[T, D] { return table[ids[t], d] }
kernel rowsum(x: f32[M, N]) -> f32[M] { return sum(x[m, n] for n) }
kernel colmax(x: f32[M, N]) -> f32[N] { return max(x[m, n] for m) }
kernel norm(x: f32[M, N]) -> f32[M, N] {
  s[m] = sum(x[m, n] * x[m, n] for n)
  return x[m, n] * rsqrt(s[m] / f32(N) + 1e-6)
}
kernel idiv(a: i32[N], b: i32[N]) -> i32[N] { return a[n] / b[n] }
kernel imod(a: i32[N], b: i32[N]) -> i32[N] { return a[n] % b[n] }
kernel half(x: bf16[M, N], y: f16[M, N]) -> bf16[M, N] { return x[m, n] * f32(y[m, n]) + 0.1 }

@strategy(scale, target = triton) { vectorize n = 64; warps = 8; stages = 3 }
"""

SHAPES = [{"M": 1, "N": 1}, {"M": 3, "N": 17}, {"M": 33, "N": 5}]


def _lib() -> Any:
    return build(text_module(SOURCE), "triton")


@pytest.mark.parametrize("name", ["scale", "flip", "rowsum", "colmax", "norm", "half"])
@pytest.mark.parametrize("dims", SHAPES, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_family_matches_interpreter(name: str, dims: dict[str, int]) -> None:
    module = text_module(SOURCE)
    args = random_inputs(module.kernels[name], dims, seeded("triton", name, dims))
    assert_conforms(_lib().kernels[name](*args), module.kernels[name], *args, what=name)


def test_gather_matches_interpreter() -> None:
    module = text_module(SOURCE)
    dims = {"T": 17, "V": 5, "D": 33}
    args = random_inputs(module.kernels["gather"], dims, seeded("gather"), ids={"ids": "V"})
    assert_conforms(_lib().gather(*args), module.kernels["gather"], *args, what="gather")


def test_nan_wins_max_reductions() -> None:
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    x[2, 1] = np.nan
    got = _lib().colmax(x)
    assert np.isnan(got[1]) and got[0] == 9.0 and got[2] == 11.0


def test_integer_division_floors_like_python() -> None:
    a = np.array([7, -7, 7, -7, 0, 5], dtype=np.int32)
    b = np.array([2, 2, -2, -2, 3, -3], dtype=np.int32)
    assert _lib().idiv(a, b).tolist() == (a // b).tolist()
    assert _lib().imod(a, b).tolist() == (a % b).tolist()


def test_errors_are_the_interpreters() -> None:
    module = text_module(SOURCE)
    ids = np.array([0, 7, 1], dtype=np.int64)
    table = np.ones((5, 3), dtype=np.float32)
    with pytest.raises(GuardError) as want:
        module.kernels["gather"](ids, table)
    with pytest.raises(GuardError) as got:
        _lib().gather(ids, table)
    assert str(got.value) == str(want.value)
    with pytest.raises(GuardError, match="by zero"):
        _lib().idiv(np.array([1, 2], dtype=np.int32), np.array([1, 0], dtype=np.int32))


def test_source_is_python_of_mangled_names() -> None:
    allowed = re.compile(r"^(triton|tl|ws|float|range|[bdx]\d+|k\d+_d\d+|BLOCK(_[A-Z]+)?|_ak_\w+|[a-z])$")
    for name in ("scale", "norm", "gather", "half"):
        source = _lib().kernels[name].source()
        tree = ast.parse(source)
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        names |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) for a in n.args.args}
        helpers = {"whole", "odd", "lg", "acc"}
        assert not {n for n in names if not allowed.match(n)} - helpers, name


def test_no_ak_identifier_reaches_the_source() -> None:
    text = """
kernel exec(system: f32[N], eval: f32[N]) -> f32[N] {
  import_[n] = system[n] * eval[n]
  return import_[n] + 1.0
}
kernel __builtins__x(os: f32[M, N]) -> f32[M] { return sum(os[m, n] for n) }
"""
    try:
        module = text_module(text)
    except Exception:  # the language may reject some of these names; a plainer set then
        pytest.skip("these identifiers are not valid .ak")
    lib = build(module, "triton")
    for name, words in (("exec", ("exec", "system", "eval", "import_")), ("__builtins__x", ("builtins", "os["))):
        source = lib.kernels[name].source()
        for w in words:
            assert w not in source, (name, w)
    x = np.arange(4, dtype=np.float32)
    assert lib.kernels["exec"](x, x).tolist() == (x * x + 1).tolist()


def test_strategy_sets_blocks_and_launch_options() -> None:
    lib = _lib()
    tuned = dict(lib.kernels["scale"].variant(0).artifact.launches[0].options)
    plain = dict(lib.kernels["scale"].variant(-1).artifact.launches[0].options)
    assert tuned["BLOCK"] == 64 and tuned["num_warps"] == 8 and tuned["num_stages"] == 3
    assert plain["BLOCK"] != 64 and plain["num_warps"] == 4
    module = text_module(SOURCE)
    args = random_inputs(module.kernels["scale"], {"M": 3, "N": 130}, seeded("tuned"))
    assert_conforms(lib.scale(*args), module.kernels["scale"], *args, what="scale (tuned)")


def test_torch_tensors_stay_torch_and_launch_spec_shape() -> None:
    x = torch.randn(3, 17)
    out = _lib().rowsum(x)
    assert isinstance(out, torch.Tensor) and out.shape == (3,)
    spec = _lib().kernels["rowsum"].variant(-1).artifact.launches[0]
    assert spec.parallel_extent is None and len(spec.grid) == 1 and spec.entry.startswith("k")


def test_missing_triton_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import arke

    monkeypatch.setattr(gpu, "triton_available", lambda: False)
    with pytest.raises(ValueError, match="pip install triton"):
        arke.build(text_module(SOURCE), target="triton")


def test_tensors_on_two_devices_are_refused_before_launch() -> None:
    # A meta tensor stands in for a second device: the guard fires before anything is copied or launched (and says
    # what a meta tensor is: one without values)
    x, w = torch.randn(3, 4), torch.empty(4, device="meta")
    with pytest.raises(GuardError, match="`w` is on the meta device, which holds no values") as err:
        _lib().scale(x, w)
    assert err.value.rule == "device" and err.value.param == "w"


def test_out_on_another_device_is_refused() -> None:
    x, w = torch.randn(3, 4), torch.randn(4)
    with pytest.raises(GuardError, match="out is on meta, but the kernel runs on cpu") as err:
        _lib().scale(x, w, out=torch.empty(3, 4, device="meta"))
    assert err.value.rule == "device"
    out = torch.empty(3, 4)
    assert _lib().scale(x, w, out=out) is out
    assert_conforms(out, text_module(SOURCE).kernels["scale"], x, w, what="scale into out=")


@pytest.mark.skipif(not torch.cuda.is_available() or gpu.interpreting(), reason="needs a CUDA GPU")
def test_cuda_tensors_stay_on_the_gpu() -> None:
    x, w = torch.randn(33, 130, device="cuda"), torch.randn(130, device="cuda")
    lib = _lib()
    for _ in range(2):  # the second call takes the signature fast path
        out = lib.scale(x, w)
        assert out.device == x.device
        assert_conforms(out, text_module(SOURCE).kernels["scale"], x, w, what="scale on the GPU")
    host = lib.scale(x.cpu(), w.cpu())  # CPU tensors go to the GPU and come back
    assert host.device.type == "cpu"
    assert_conforms(host, text_module(SOURCE).kernels["scale"], x.cpu(), w.cpu(), what="scale, back from the GPU")
