"""Every vector width gives the interpreter's answer: the LLVM target's code is rendered for
512-, 256- and 128-bit vectors and compiled for AVX-512 (the host), AVX2 (``haswell``) and
plain SSE2 (``x86-64``) machines, then run here (each is a subset of this host's ISA).

A machine without AVX-512 gets the 256- or 128-bit form from ``host_vector_bits``; these
tests show that form is right without needing such a machine.
"""

from __future__ import annotations

import platform
from typing import Any

import pytest
from codegen_support import assert_conforms, random_inputs, seeded, std_module, text_module

from arke.plan.dispatch import make_plan
from arke.targets.llvm.jit import compile_object, host_vector_bits
from arke.targets.llvm.kernel import CPUKernel
from arke.targets.llvm.render import LLVMRenderer

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                reason="the ISA variants named here are x86-64 CPUs")

# (vector bits, CPU to compile for)
MACHINES = [(512, None), (256, "haswell"), (128, "x86-64")]

CASES: list[tuple[str, str, dict[str, int]]] = [
    ("std.nn", "matmul", {"M": 19, "K": 67, "N": 70}),
    ("std.nn", "linear", {"M": 2, "K": 37, "N": 9}),
    ("std.nn", "linear_int8", {"M": 9, "K": 33, "N": 40}),
    ("std.nn", "linear_bf16", {"M": 1, "K": 45, "N": 17}),
    ("std.nn", "linear_bf16", {"M": 9, "K": 45, "N": 17}),
    ("f16", "softmax_h", {"M": 3, "N": 77}),
    ("std.nn", "softmax", {"M": 5, "N": 77}),
    ("std.nn", "rmsnorm", {"M": 3, "N": 130}),
    ("std.attention", "causal_attention", {"B": 1, "H": 4, "G": 2, "S": 7, "T": 19, "D": 12}),
    ("std.attention", "causal_attention", {"B": 1, "H": 4, "G": 2, "S": 1, "T": 37, "D": 8}),
]


F16 = """
kernel softmax_h(x: f16[M, N]) -> f16[M, N] {
  mx[m] = max(x[m, n] for n)
  e[m, n] = exp(f32(x[m, n]) - f32(mx[m]))
  return f16(e[m, n] / sum(e[m, k] for k))
}
"""


def compiled(module: Any, name: str, bits: int, cpu: str | None) -> CPUKernel:
    ir_name = module.kernel_map.get(name, name)
    plan = make_plan(module.semantic, ir_name)
    artifact = LLVMRenderer(vector_bits=bits).render(plan)
    return CPUKernel(plan, artifact, compile_object(artifact.source, cpu), module.semantic, threads=2)


def test_host_width_is_a_known_one() -> None:
    assert host_vector_bits() in (128, 256, 512)


@pytest.mark.parametrize(("bits", "cpu"), MACHINES, ids=lambda v: str(v))
@pytest.mark.parametrize(("label", "name", "dims"), CASES, ids=lambda v: v if isinstance(v, str) else
                         ",".join(f"{k}={n}" for k, n in v.items()))
def test_every_vector_width_matches_interpreter(bits: int, cpu: str | None, label: str, name: str,
                                               dims: dict[str, int]) -> None:
    if bits == 512 and host_vector_bits() < 512:
        pytest.skip("this host has no AVX-512")
    module = text_module(F16) if label == "f16" else std_module(label)
    reference = module.kernels[name]
    args = random_inputs(reference, dims, seeded(name, dims, bits))
    assert_conforms(compiled(module, name, bits, cpu)(*args), reference, *args, what=f"{name} at {bits} bits")
