"""The passes on random valid IR (tests/ir/gen.py): every pass keeps every invariant of the verifier.

The random modules use every node kind and dtype, odd axis names, results numbered from
anywhere, calls with compound dim bindings, and producers read by every kind of op. They
are not runnable (subscripts may leave their axes), so meaning is tested on real kernels
elsewhere; here the pipeline must only never produce invalid IR.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from arke.ir import semantic as S
from arke.ir.verify import verify
from arke.passes import dead_code, fuse_elementwise, inline_all, run_passes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ir"))
import gen  # tests/ir/gen.py: the random-IR generator of the IR tests


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gen.modules())
def test_pipeline_keeps_random_ir_valid(module: S.Module) -> None:
    inlined = inline_all(module)
    verify(inlined)
    for f in module.functions:
        fn = run_passes(module, f.name, verify_each=True)
        verify(S.Module((fn,)))
        assert [op for op in fn.ops if isinstance(op, S.CallOp)] == []
        assert dead_code(fn) == fn  # the pipeline ends dead-code free and densely numbered
        fused = fuse_elementwise(inlined.get(f.name))
        verify(S.Module((fused,)))
        assert len(fused.ops) <= len(inlined.get(f.name).ops)
