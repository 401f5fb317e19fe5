"""A scan dispatch on the CPU: each row in sequence along the scanned index, rows side by side.

A :class:`~arke.ir.semantic.ScanOp` is a chain along its scanned axis for every point of its
other axes (its *rows*). The workers split the rows (the other axes flattened into one range
``[lo, hi)``); each worker runs :data:`GROUP` rows at once, each with its own accumulator, so
the loop carries ``GROUP`` independent chains and the CPU overlaps their latency (one add every
cycle instead of one every four). Every row still combines its terms in the interpreter's
order, position 0 first, one rounding per operation (``a * h`` then ``+ b``: no fused
multiply-add), so the results are the interpreter's bits whatever the thread count, and linear
in the size. A scan along the last axis reads ``GROUP`` rows' streams at once; along an earlier
axis the rows of a group are adjacent in memory.
"""

from __future__ import annotations

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.targets.llvm.function import LLVMFunction
from arke.targets.llvm.lib import identity
from arke.targets.llvm.scalar import COMPUTE

#: rows one worker scans together (independent accumulator chains)
GROUP = 8


class ScanFunction(LLVMFunction):
    """Emits one scan dispatch's LLVM function (the signature of :mod:`arke.targets.llvm.function`)."""

    def render(self) -> str:
        op = self.op
        assert isinstance(op, ir.ScanOp)
        self.start_error_flag()
        outer = [a.name for a in op.axes if a.name != op.axis]
        if not outer:
            self.parallel_extent = None
            self.rows([{}])
            return self.text()
        total = self.extent[outer[0]]
        for a in outer[1:]:
            total = total * self.extent[a]
        self.parallel_extent = total
        count = self.let("sub i64 %hi, %lo")
        groups = self.let(f"udiv i64 {count}, {GROUP}")

        def group() -> None:
            base = self.let(f"mul i64 {self.current['%grp']}, {GROUP}")
            first = self.let(f"add i64 %lo, {base}")
            flats = [first] + [self.let(f"add i64 {first}, {r}") for r in range(1, GROUP)]
            self.rows([self.unflatten(outer, f) for f in flats])

        self.loop("%grp", "0", groups, group)
        done = self.let(f"mul i64 {groups}, {GROUP}")
        rest = self.let(f"add i64 %lo, {done}")
        self.loop("%one", rest, "%hi", lambda: self.rows([self.unflatten(outer, self.current["%one"])]))
        return self.text()

    def unflatten(self, axes: list[str], flat: str) -> dict[str, str]:
        """The values of ``axes`` at position ``flat`` of their row-major flattening."""
        out: dict[str, str] = {}
        rest = flat
        for a in reversed(axes[1:]):
            n = self.dim(self.extent[a])
            out[a] = self.let(f"urem i64 {rest}, {n}")
            rest = self.let(f"udiv i64 {rest}, {n}")
        out[axes[0]] = rest
        return out

    def rows(self, rows: list[dict[str, str]]) -> None:
        """Scan the given rows (each: the values of the other axes) together, one accumulator each."""
        op = self.op
        assert isinstance(op, ir.ScanOp)
        dtype, ct = op.dtype, COMPUTE[op.dtype]
        accs = []
        for r, at in enumerate(rows):
            self.loops_made += 1
            acc = f"%acc.{self.loops_made}.{r}"
            self.prologue.append(f"  {acc} = alloca {ct}")
            self.current.update(at)
            start = identity(op.kind, dtype) if op.init is None else self.value(op.init, dtype)
            self.emit(f"store {ct} {start}, ptr {acc}")
            accs.append(acc)

        def step() -> None:
            for at, acc in zip(rows, accs):
                self.current.update(at)
                x = self.value(op.body, dtype)
                a = None if op.coeff is None else self.value(op.coeff, dtype)
                old = self.let(f"load {ct}, ptr {acc}")
                if op.exclusive:
                    self.store(self.buffer(op.result), [ir.Idx(ax.name) for ax in op.axes], old, dtype)
                new = self.update(op.kind, dtype, old, x, a)
                self.emit(f"store {ct} {new}, ptr {acc}")
                if not op.exclusive:
                    self.store(self.buffer(op.result), [ir.Idx(ax.name) for ax in op.axes], new, dtype)

        self.loop(op.axis, "0", self.dim(self.extent[op.axis]), step)

    def value(self, e: ir.SExpr, dtype: DType) -> str:
        """``e`` in the scan's compute type."""
        return self.expr(e if e.dtype == dtype else ir.Cast(e, dtype))

    def update(self, kind: str, dtype: DType, h: str, x: str, a: str | None) -> str:
        """One step: ``h op x``, or ``a * h + x`` for the linear recurrence (two roundings)."""
        if kind != "linear":
            return self.combine(kind, dtype, h, x)
        assert a is not None
        ct = COMPUTE[dtype]
        if dtype.is_float:
            p = self.let(f"fmul {ct} {a}, {h}")
            return self.let(f"fadd {ct} {p}, {x}")
        p = self.let(f"mul {ct} {a}, {h}")
        return self.let(f"add {ct} {p}, {x}")
