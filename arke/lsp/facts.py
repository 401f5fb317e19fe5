"""What the checker knows about the names inside one kernel: types, shapes and index extents.

The checker (:class:`arke.lang.kernels.KernelChecker`) computes the type and symbolic
shape of every tensor a kernel defines and the extent of every index while it lowers the
body, but keeps only the IR. For hover, the kernel is checked again — the same checker,
run on the signatures the file's check produced — with one hook that also records each
index binding where it is made. Nothing here infers a type itself.

This runs for one kernel at a time, when the editor first asks about it (a few
milliseconds), and the answer is cached with the document's index.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim
from arke.lang.kernels import KernelChecker
from arke.lang.signatures import Signature
from arke.lang.source import Span

log = logging.getLogger(__name__)


@dataclass
class KernelFacts:
    """Types and extents inside one kernel, as the checker found them.

    ``types``: parameters, defined tensors and named outputs (their declared type when the
    body does not define them successfully). ``lets``: the dtypes of scalar ``let``\\ s;
    ``dim_lets``: the value of ``let``\\ s that are dims. ``extents``: for each index binding
    (keyed by the offset of the binding name: the left side of ``y[i] = ...``, the ``for k``
    of a reduction, or the first use of a free index in ``return``), its extent and whether
    it is reduced there.
    """

    types: dict[str, ir.TensorType] = field(default_factory=dict)
    lets: dict[str, DType] = field(default_factory=dict)
    dim_lets: dict[str, Dim] = field(default_factory=dict)
    extents: dict[int, tuple[Dim, bool]] = field(default_factory=dict)


class _Recording(KernelChecker):
    """The kernel checker, also remembering every index binding it makes."""

    bound: list[tuple[Span, Dim, bool]]

    def note_index(self, name: str, extent: Dim, span: Span, reduced: bool) -> None:
        self.bound.append((span, extent, reduced))
        super().note_index(name, extent, span, reduced)


def kernel_facts(sig: Signature, scope: dict[str, Signature]) -> KernelFacts:
    """Check ``sig``'s body again against ``scope`` (every kernel it may call) and keep what it learns."""
    facts = KernelFacts()
    for name, t in zip(sig.output_names, sig.outputs):
        if name is not None:
            facts.types[name] = t
    for p in sig.params:
        facts.types[p.name] = p.type
    if not sig.ok:  # the checker does not look into a body whose header is wrong
        return facts
    checker = _Recording(sig, scope, [])
    checker.bound = []
    try:
        checker.check()
    except RecursionError:
        return facts  # reported as AK1006 by the file's check; nothing more to learn here
    except Exception:  # an editor feature must not take the server down on a checker bug
        log.exception("checking kernel %s again for hover failed", sig.name)
    for name, value in checker.values.items():
        facts.types[name] = value.type
    for name, scalar in checker.lets.items():
        facts.lets[name] = scalar.dtype
    for name, dim in checker.dims.items():
        if name not in sig.dims:
            facts.dim_lets[name] = dim
    for span, extent, reduced in checker.bound:
        facts.extents[span.start] = (extent, reduced)
    return facts


__all__ = ["KernelFacts", "kernel_facts"]
