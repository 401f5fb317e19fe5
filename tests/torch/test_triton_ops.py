"""The Triton target's kernels as ``torch.library.triton_op``: eager calls are the kernel's, and under
``torch.compile`` the graph holds the Triton kernels themselves (``wrap_triton``), sizes symbolic.

Without a GPU the kernels run in Triton's interpreter and the compiled graph is inspected, not run (there
is nothing Inductor could compile); with one, the compiled function is checked against eager."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import torch

import arke
import arke.torch
from arke.runtime.errors import GuardError
from arke.targets.triton.kernel import missing

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))
ON_GPU = torch.cuda.is_available()
KERNELS = ("rmsnorm", "softmax", "embedding", "linear", "quantize_rows", "layernorm")


@cache
def library() -> arke.Library:
    return arke.build(arke.loads("import std.nn\n"), target="triton")


@cache
def ops() -> arke.torch.Ops:
    return arke.torch.register(library(), namespace="arke_triton_test", kernels=list(KERNELS), traceable=True)


def _device() -> str:
    return "cuda" if ON_GPU else "cpu"


def sample(name: str, rows: int = 5) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(rows)
    d = _device()
    x = torch.randn(rows, 16, generator=g)
    made = {
        "rmsnorm": (x, torch.randn(16, generator=g)),
        "layernorm": (x, torch.randn(16, generator=g), torch.randn(16, generator=g)),
        "softmax": (x,),
        "quantize_rows": (x,),
        "embedding": (torch.randint(0, 11, (rows,), generator=g), torch.randn(11, 16, generator=g)),
        "linear": (x, torch.randn(7, 16, generator=g)),
    }[name]
    return tuple(t.to(d) for t in made)


class _Traced(Exception):
    """Raised instead of running a graph the test only inspects."""


def _graph(f: Any, *args: Any) -> torch.fx.GraphModule:
    """The ATen graph AOTAutograd hands a backend for ``f`` (dynamic sizes)."""
    from torch._dynamo.backends.common import aot_autograd

    seen: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, example: Any) -> Any:
        seen.append(gm)

        def run(*_: Any) -> Any:
            raise _Traced

        return run

    torch._dynamo.reset()
    compiled = torch.compile(f, backend=aot_autograd(fw_compiler=record), fullgraph=True, dynamic=True)
    with pytest.raises(_Traced):
        compiled(*args)
    return seen[0]


@pytest.mark.parametrize("name", KERNELS)
def test_eager_call_is_the_kernels_and_the_fake_matches(name: str) -> None:
    args = sample(name)
    op = getattr(ops(), name)
    got, want = op(*args), getattr(library(), name)(*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    torch.library.opcheck(op.default, args, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("name", ["rmsnorm", "embedding", "linear"])
def test_compiled_graph_holds_the_triton_kernels_with_symbolic_sizes(name: str) -> None:
    op = getattr(ops(), name)
    gm = _graph(lambda *a: op(*a), *sample(name, rows=9))
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    launches = [n for n in calls if "triton_kernel_wrapper" in str(n.target)]
    assert launches, gm.code
    assert not any("arke_triton_test" in str(n.target) for n in calls)  # decomposed, not opaque
    grid = launches[0].kwargs["grid"][0]
    assert any(isinstance(g, torch.fx.Node) for g in grid) or "sym_size" in gm.code, gm.code  # rows symbolic


def test_out_of_range_ids_raise_eagerly_and_are_asserted_in_the_graph() -> None:
    ids, table = sample("embedding")
    bad = ids.clone()
    bad[2] = 11
    with pytest.raises(GuardError):
        ops().embedding(bad, table)
    op = ops().embedding
    gm = _graph(lambda a, b: op(a, b), ids, table)
    assert "_assert_async" in gm.code  # an error word set on the device fails the compiled call


def test_out_overload_writes_in_place() -> None:
    x, w = sample("rmsnorm")
    y = torch.zeros_like(x)
    ops()
    assert torch.ops.arke_triton_test.rmsnorm.out(x, w, out=y) is None
    torch.testing.assert_close(y, library().rmsnorm(x, w), rtol=0, atol=0)


def test_traceable_is_for_the_triton_target() -> None:
    cpu = arke.build(arke.loads("import std.nn\n"))
    with pytest.raises(ValueError, match="triton target"):
        arke.torch.register(cpu, namespace="arke_triton_bad", kernels=["relu"], traceable=True)


@pytest.mark.skipif(not ON_GPU, reason="Inductor compiles the Triton kernels only for a CUDA device")
@pytest.mark.parametrize("name", ["rmsnorm", "softmax", "linear"])
def test_inductor_runs_the_kernels_on_the_gpu(name: str) -> None:
    op = getattr(ops(), name)
    compiled = torch.compile(lambda *a: op(*a), fullgraph=True, dynamic=True)
    for rows in (3, 17, 4097):
        args = sample(name, rows)
        want = getattr(library(), name)(*args)
        torch.testing.assert_close(compiled(*args), want, rtol=1e-5, atol=1e-5)
