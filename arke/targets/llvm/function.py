"""One dispatch of the generic form as an LLVM function: the loop nest, reductions and stores.

Each dispatch becomes ``void @<kernel>.d<k>(ptr noalias %b0, ..., ptr noalias %dims, i64 %lo,
i64 %hi, ptr noalias %err, ptr noalias %scratch)``. The loop nest is the op's domain with the
parallel axis outermost (the leading axes flattened into one range ``[lo, hi)`` the workers
split) and reduce axes innermost; a reduction whose last output axis runs along an operand's
rows keeps a row of accumulators in the worker's scratch. Float reductions run in vector lanes
of accumulators in an order the IR spells out (:mod:`arke.targets.llvm.lanes`), so a result
never depends on the split nor on how LLVM vectorised. Loop counters and accumulators live in
allocas that mem2reg and the loop vectorizer turn into vector code at O3.

:class:`LLVMFunction` adds this to :class:`arke.targets.llvm.scalar.ScalarEmitter` (expressions,
memory); a rows group's function is :class:`arke.targets.llvm.rows.RowsFunction`
(:func:`function_for` picks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim
from arke.plan.dispatch import Dispatch, KernelPlan
from arke.plan.exprs import as_dtype
from arke.targets.llvm.lanes import LaneSum, lane_loops
from arke.targets.llvm.lib import identity
from arke.targets.llvm.scalar import COMPUTE, ScalarEmitter


class LLVMFunction(ScalarEmitter):
    """Emits one dispatch's LLVM function."""

    # -- the function
    def render(self) -> str:
        op = self.op
        order = [a.name for a in op.axes]
        if self.d.parallel is not None:
            order.remove(self.d.parallel)
            order.insert(0, self.d.parallel)
        self.start_error_flag()
        row = self.rows_axis()
        outer = [a for a in order if a != row]
        inner: Callable[[], None] = (lambda: self.contract_rows(row)) if row is not None else self.element
        if self.d.parallel is not None and op.axes and self.d.parallel == op.axes[0].name:
            # The workers split the leading axes together (b, h, i ... as one flat range), so a
            # batch of 1 still keeps every core busy; the innermost loop stays whole for vectors.
            flat = outer if row is not None or len(outer) == 1 else outer[:-1]
            self.parallel_extent = self.flat_loop(flat, lambda: self.loops(outer[len(flat):], 0, inner))
        else:
            self.parallel_extent = self.extent[self.d.parallel] if self.d.parallel is not None else None
            self.loops(outer, 0, inner)
        return self.text()

    def text(self) -> str:
        """The whole function, once the body is emitted."""
        params = ", ".join(f"ptr noalias {self.ptr[b]}" for b in self.args)
        head = (f"define void @\"{self.name}\"({params}, ptr noalias %dims, i64 %lo, i64 %hi, ptr noalias %err, "
                "ptr noalias %scratch) {")
        tail = ["  %ef = load i1, ptr %errflag", "  %ez = zext i1 %ef to i64", "  %eo = load i64, ptr %err",
                "  %en = or i64 %eo, %ez", "  store i64 %en, ptr %err", "  ret void", "}"]
        return "\n".join([head, "entry:", *self.prologue, "  br label %start", "start:", *self.body, *tail])

    def flat_loop(self, axes: list[str], inner: Callable[[], None]) -> Dim:
        """One loop over ``[lo, hi)`` of the flattened ``axes`` (row-major); returns the flat extent.

        Over several axes the range is walked a run of the last axis at a time: the other axes'
        positions are divided out once per run, and the last axis gets a counted loop of its own
        (the division per element cost more than most bodies, and kept LLVM from vectorising)."""
        total: Dim = sympy.Integer(1)
        for a in axes:
            total = total * self.extent[a]
        if len(axes) == 1:
            def one() -> None:
                self.current[axes[0]] = self.current["%flat"]
                inner()

            self.loop("%flat", "%lo", "%hi", one)
            return total

        def run(at: str) -> str:
            width = self.dim(self.extent[axes[-1]])
            first = self.let(f"urem i64 {at}, {width}")
            rest = self.let(f"udiv i64 {at}, {width}")
            for a in reversed(axes[1:-1]):
                n = self.dim(self.extent[a])
                self.current[a] = self.let(f"urem i64 {rest}, {n}")
                rest = self.let(f"udiv i64 {rest}, {n}")
            self.current[axes[0]] = rest
            room = self.let(f"sub i64 {width}, {first}")
            left = self.let(f"sub i64 %hi, {at}")
            length = self.let(f"select i1 {self.let(f'icmp slt i64 {room}, {left}')}, i64 {room}, i64 {left}")
            self.loop(axes[-1], first, self.let(f"add i64 {first}, {length}"), inner, hints=False)
            return length

        self.counted("run", "%lo", "%hi", run, step=None)
        return total

    def loops(self, order: list[str], depth: int, inner: Callable[[], None]) -> None:
        """Loops over the axes in ``order`` (the parallel one over ``[lo, hi)``), ``inner`` innermost."""
        if depth == len(order):
            inner()
            return
        axis = order[depth]
        lo, hi = ("%lo", "%hi") if (depth == 0 and axis == self.d.parallel) else ("0", self.dim(self.extent[axis]))
        self.loop(axis, lo, hi, lambda: self.loops(order, depth + 1, inner))

    def rows_axis(self) -> str | None:
        """For a reduction whose last output axis runs along some operand's rows (``a @ b``'s n, or
        attention's ``sum(p[.., j] * v[.., j, d] for j)``'s d), that axis: it becomes the innermost
        loop, each reduction step a vector update of a row of accumulators. Every element still
        combines its terms in order."""
        op = self.op
        if isinstance(op, ir.MapOp) or not op.axes or (isinstance(op, ir.ReduceOp) and op.limits):
            return None  # a length bounds each element's own loop (spec/language.md §8.11)
        n = op.axes[-1].name
        exprs = (op.lhs, op.rhs) if isinstance(op, ir.ContractOp) else (op.body,)
        rows = any(isinstance(x, ir.Load) and x.indices and x.indices[-1] == ir.Idx(n)
                   for e in exprs for x in ir.walk(e))
        return n if rows and n != self.d.parallel else None

    def contract_rows(self, n: str) -> None:
        """One row of a reduction: set the accumulators, combine every step, store the row."""
        op = self.op
        assert isinstance(op, ir.ContractOp | ir.ReduceOp)
        kind = op.kind if isinstance(op, ir.ReduceOp) else "sum"
        dtype, ct = op.dtype, COMPUTE[op.dtype]
        extent = self.dim(self.extent[n])
        row = self.scratch_row(self.extent[n])  # per-worker scratch: a wide row would overflow the stack

        def slot() -> str:
            return self.let(f"getelementptr inbounds {ct}, ptr {row}, i64 {self.current[n]}")

        def start() -> None:
            self.emit(f"store {ct} {identity(kind, dtype)}, ptr {slot()}")

        def update() -> None:
            body: ir.SExpr = (ir.Binary("mul", as_dtype(op.lhs, dtype), as_dtype(op.rhs, dtype), dtype)
                              if isinstance(op, ir.ContractOp) else op.body)
            v = self.expr(body if body.dtype == dtype else ir.Cast(body, dtype))
            p = slot()
            a = self.let(f"load {ct}, ptr {p}")
            self.emit(f"store {ct} {self.combine(kind, dtype, a, v)}, ptr {p}")

        def store() -> None:
            a = self.let(f"load {ct}, ptr {slot()}")
            self.store(self.buffer(op.result), [ir.Idx(x.name) for x in op.axes], a, dtype)

        self.loop(n, "0", extent, start)
        self.nest([a.name for a in op.reduce_axes], lambda: self.loop(n, "0", extent, update))
        self.loop(n, "0", extent, store)

    def scratch_row(self, elements: Dim) -> str:
        """A pointer to ``elements`` 8-byte slots of the runtime's per-worker scratch memory."""
        self.scratch = elements
        return "%scratch"

    def nest(self, axes: list[str], inner: Callable[[], None]) -> None:
        """Plain loops over the whole extent of each of ``axes`` (outermost first), ``inner`` innermost."""
        if not axes:
            inner()
            return
        lo, hi = self.span(axes[0]) or ("0", self.dim(self.extent[axes[0]]))
        limit = self.op.limit(axes[0]) if isinstance(self.op, ir.ReduceOp) else None
        if limit is not None:  # a length (spec/language.md §8.11): the loop stops there
            n = self.expr(limit)
            hi = self.let(f"select i1 {self.let(f'icmp slt i64 {n}, {hi}')}, i64 {n}, i64 {hi}")
        self.loop(axes[0], lo, hi, lambda: self.nest(axes[1:], inner))

    def span(self, axis: str) -> tuple[str, str] | None:
        """The range ``nest`` loops ``axis`` over, when it is not the whole extent (a rows group's chunk)."""
        return None

    def loop(self, axis: str, lo: str, hi: str, inner: Callable[[], None], hints: bool = True) -> None:
        """``for axis in [lo, hi): inner()``; ``hints``: the strategy's vectorize/unroll of ``axis`` as loop
        metadata (not on a flattened range's runs: the strategy was told those axes have no loop)."""
        self.loops_made += 1
        number = self.loops_made  # inner loops count on: the hints below name this loop by its own number
        tag = f"{axis.lstrip('%')}.{number}"  # an axis may be looped over more than once (rows form)
        counter = f"%ix.{tag}.p"
        self.prologue.append(f"  {counter} = alloca i64")
        head, body, done = f"h.{tag}", f"b.{tag}", f"e.{tag}"
        self.emit(f"store i64 {lo}, ptr {counter}")
        self.emit(f"br label %{head}")
        self.label(head)
        i = f"%ix.{tag}"
        self.current[axis] = i
        self.emit(f"{i} = load i64, ptr {counter}")
        c = self.let(f"icmp slt i64 {i}, {hi}")
        self.emit(f"br i1 {c}, label %{body}, label %{done}")
        self.label(body)
        inner()
        nxt = self.let(f"add i64 {i}, 1")
        self.emit(f"store i64 {nxt}, ptr {counter}")
        self.emit(f"br label %{head}{self.loop_hints(axis, number) if hints else ''}")
        self.label(done)

    def loop_hints(self, axis: str, number: int) -> str:
        """The strategy's ``vectorize``/``unroll`` of ``axis`` as LLVM loop metadata (``""`` if none), for
        the function's ``number``-th loop."""
        from arke.targets import base as targets

        hints = []
        for kind, key, ty in (("vectorize", "llvm.loop.vectorize.width", "i32"),
                              ("unroll", "llvm.loop.unroll.count", "i32")):
            d = self.plan.decision(kind, axis)
            # a decision this dispatch drops (AK4014: a scan's recurrence) is not handed to LLVM either, whose
            # own "loop not vectorized" warning would only repeat it, raw, on stderr
            if d is not None and isinstance(d.value, int) and targets.get("llvm").honoured(d, self.d) is None:
                hints.append(f'!{{!"{key}", {ty} {d.value}}}')
                if kind == "vectorize":
                    hints.append('!{!"llvm.loop.vectorize.enable", i1 true}')
        if not hints:
            return ""
        # numbered per dispatch (entry ``<kernel>.d<k>``) so ids are unique in the module
        dispatch = int(self.name.rsplit(".d", 1)[1]) if ".d" in self.name else 0
        ident = 100000 * (dispatch + 1) + number
        self.declare(f"!{ident} = distinct !{{!{ident}, {', '.join(hints)}}}")
        return f", !llvm.loop !{ident}"

    def element(self) -> None:
        """The innermost body: compute (or reduce) one element of the result and store it."""
        op = self.op
        assert not isinstance(op, ir.ScanOp), "a scan is scan.py's ScanFunction"
        dtype = op.dtype
        value = self.expr(op.body) if isinstance(op, ir.MapOp) else self.reduction(op)
        out = self.buffer(op.result)
        self.store(out, [ir.Idx(a.name) for a in op.axes], value, dtype)

    def reduction(self, op: ir.ReduceOp | ir.ContractOp) -> str:
        """One element of a reduction, its terms combined in an order fixed by this IR alone."""
        dtype = op.dtype
        ct = COMPUTE[dtype]
        kind = op.kind if isinstance(op, ir.ReduceOp) else "sum"
        names = [a.name for a in op.reduce_axes]
        body: ir.SExpr = (ir.Binary("mul", as_dtype(op.lhs, dtype), as_dtype(op.rhs, dtype), dtype)
                          if isinstance(op, ir.ContractOp) else op.body)

        def term() -> str:
            value = self.expr(body)
            self.reduced(op, value)
            return value if body.dtype == dtype else self.convert(value, body.dtype, dtype)

        if self.in_lanes(dtype, names) and not (isinstance(op, ir.ReduceOp) and op.limits):
            return self.lane_loops(names, [LaneSum(op.result, kind, dtype, term)])[0]
        # Integers and booleans are exact in any order (LLVM vectorises them freely); a short
        # float reduction runs in sequence.
        acc = f"%acc.{op.result}"
        self.prologue.append(f"  {acc} = alloca {ct}")
        self.emit(f"store {ct} {identity(kind, dtype)}, ptr {acc}")

        def step() -> None:
            v = term()
            a = self.let(f"load {ct}, ptr {acc}")
            self.emit(f"store {ct} {self.combine(kind, dtype, a, v)}, ptr {acc}")

        self.nest(names, step)
        result = self.let(f"load {ct}, ptr {acc}")
        return result

    @property
    def lanes(self) -> int:
        """Accumulators of a float reduction: four vectors' worth, so the adds never wait on each other."""
        return 4 * max(4, self.vector_bits // 32)

    def in_lanes(self, dtype: DType, names: Sequence[str]) -> bool:
        """Whether a reduction over ``names`` runs in lanes: floats, unless the innermost extent is a
        constant shorter than the lanes (a few terms, added in sequence)."""
        if not dtype.is_float or not names:
            return False
        extent = sympy.sympify(self.extent[names[-1]])
        return not (extent.is_Integer and int(extent) < self.lanes)

    def lane_loops(self, names: Sequence[str], sums: Sequence[LaneSum]) -> list[str]:
        """Float reductions over ``names`` in a fixed order with vector accumulators (see
        :func:`arke.targets.llvm.lanes.lane_loops`); their values."""
        return lane_loops(self, names, sums)

    def reduced(self, op: ir.ReduceOp | ir.ContractOp, term: str) -> None:
        """Called with each term of a scalar reduction as it is computed (a hook for subclasses)."""

    def combine(self, kind: str, dtype: DType, a: str, b: str, ty: str = "") -> str:
        """``a`` and ``b`` combined by reduction ``kind``; ``ty``: a vector of floats instead of one."""
        ct = COMPUTE[dtype]
        t = self.tmp()
        if dtype.is_float:
            ty = ty or "float"
            if kind in ("sum", "prod"):
                self.emit(f"{t} = {'fadd' if kind == 'sum' else 'fmul'} {ty} {a}, {b}")
            else:
                # NaN wins, from either side (as in the interpreter); between +0 and -0 the term
                # does. `a if a > b else b` keeps b's NaN (one vmaxps on x86) and the second select
                # a's: four instructions where llvm.maximum takes six.
                flags = "i1" if ty == "float" else ty.replace("float", "i1")
                zero = "0.0" if ty == "float" else "zeroinitializer"
                wins = self.let(f"fcmp {'ogt' if kind == 'max' else 'olt'} {ty} {a}, {b}")
                best = self.let(f"select {flags} {wins}, {ty} {a}, {ty} {b}")
                nan = self.let(f"fcmp uno {ty} {a}, {zero}")
                self.emit(f"{t} = select {flags} {nan}, {ty} {a}, {ty} {best}")
        elif dtype.is_bool:
            self.emit(f"{t} = {'or' if kind in ('max', 'sum') else 'and'} i1 {a}, {b}")
        elif kind in ("sum", "prod"):
            self.emit(f"{t} = {'add' if kind == 'sum' else 'mul'} {ct} {a}, {b}")
        else:
            pred = ("u" if dtype.is_unsigned else "s") + ("gt" if kind == "max" else "lt")
            c = self.let(f"icmp {pred} {ct} {a}, {b}")
            self.emit(f"{t} = select i1 {c}, {ct} {a}, {ct} {b}")
        return t


def function_for(plan: KernelPlan, dispatch: Dispatch, name: str, declare: Callable[[str], None],
                 vector_bits: int = 512) -> LLVMFunction:
    """The emitter of one generic-form dispatch: a rows group's own subclass, else the single-op one."""
    if dispatch.family == "rows":
        from arke.targets.llvm.rows_partition import PartitionedRowsFunction

        return PartitionedRowsFunction(plan, dispatch, name, declare, vector_bits)
    if dispatch.family == "topk":
        from arke.targets.llvm.topk import TopKFunction

        return TopKFunction(plan, dispatch, name, declare, vector_bits)
    if dispatch.family == "scan":
        from arke.targets.llvm.scan import ScanFunction

        return ScanFunction(plan, dispatch, name, declare, vector_bits)
    from arke.targets.llvm.partition_emit import partitioned_function

    # a map indexing its vector axis through `%`, `/` or comparisons: pieces of vector code
    return partitioned_function(plan, dispatch, name, declare, vector_bits) or \
        LLVMFunction(plan, dispatch, name, declare, vector_bits)
