"""The state and plumbing of one LLVM function: temporaries, lines, labels, dims and the error flag.

:class:`Emitter` holds what one dispatch's function is being built from (its plan, op, the
buffers it touches and their ``%b<i>`` pointers, the extents of its axes) and the few things
every part of the emitter uses: fresh temporaries (``%tN``), body lines and labels, a branch,
dims computed once in the entry block (``%dims`` words, sums, products, floors, modulo), and
the error flag a checked subscript or an integer division raises. Expressions and memory are
:class:`arke.targets.llvm.scalar.ScalarEmitter`'s; the loop nest and reductions
:class:`arke.targets.llvm.function.LLVMFunction`'s.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy

from arke.ir import semantic as ir
from arke.ir.shapes import Dim, dim_str
from arke.plan.dispatch import Buffer, Dispatch, KernelPlan
from arke.plan.exprs import floor_fraction, loads_in
from arke.targets.artifact import UnsupportedError


class Emitter:
    """One dispatch's LLVM function under construction: its state, temporaries, lines and dims."""

    def __init__(self, plan: KernelPlan, dispatch: Dispatch, name: str, declare: Callable[[str], None],
                 vector_bits: int = 512):
        self.plan, self.d, self.name, self.declare = plan, dispatch, name, declare
        self.vector_bits = vector_bits  # 512: AVX-512 (exp scales by vscalefps)
        self.op = dispatch.op
        self.prologue: list[str] = []  # entry-block code (dims, buffer shapes): dominates everything
        self.body: list[str] = []
        self.n = 0
        self.loops_made = 0
        self.current: dict[str, str] = {}  # axis -> the LLVM value of its innermost enclosing loop
        self.scratch: Dim | None = None  # elements of 8-byte scratch this dispatch needs per worker
        self.parallel_extent: Dim | None = None  # the range [0, n) the workers split
        self.dims: dict[str, str] = {}
        used = sorted({b for b in self._buffers_used()}, key=plan.buffer_index)
        self.args = used
        self.ptr = {b: f"%b{plan.buffer_index(b)}" for b in used}
        self.extent: dict[str, Dim] = {a.name: a.extent for a in self.op.axes}
        if isinstance(self.op, ir.ReduceOp | ir.ContractOp):
            self.extent.update({a.name: a.extent for a in self.op.reduce_axes})

    # -- plumbing
    def tmp(self) -> str:
        self.n += 1
        return f"%t{self.n}"

    def emit(self, line: str) -> None:
        self.body.append("  " + line)

    def let(self, rhs: str) -> str:
        """Emit ``%tN = rhs`` and return ``%tN``."""
        t = self.tmp()
        self.emit(f"{t} = {rhs}")
        return t

    def label(self, name: str) -> None:
        self.body.append(f"{name}:")

    def _buffers_used(self) -> set[str]:
        names = {self.op.result}
        exprs = ([self.op.lhs, self.op.rhs] if isinstance(self.op, ir.ContractOp) else
                 list(self.op.exprs) if isinstance(self.op, ir.ScanOp) else [self.op.body])
        if isinstance(self.op, ir.ReduceOp):
            exprs += [e for _, e in self.op.limits]  # a length reads its tensor (`lens[b]`)
        for e in exprs:
            names |= {x.src for x in loads_in(e)}
        return names

    def buffer(self, name: str) -> Buffer:
        return self.plan.buffers[self.plan.buffer_index(name)]

    # -- dims (computed once, in the entry block)
    def dim(self, d: Dim) -> str:
        d = sympy.sympify(d)
        key = dim_str(d)
        if key in self.dims:
            return self.dims[key]
        value = self._dim(d)
        self.dims[key] = value
        return value

    def _pro(self, text: str) -> str:
        t = self.tmp()
        self.prologue.append(f"  {t} = {text}")
        return t

    def _dim(self, d: sympy.Expr) -> str:
        if d.is_Integer:
            return str(int(d))
        if d.is_Symbol:
            if d.name not in self.plan.dims:
                raise UnsupportedError(f"dim {d.name} is not bound by a parameter of `{self.plan.name}`")
            p = self._pro(f"getelementptr inbounds i64, ptr %dims, i64 {self.plan.dims.index(d.name)}")
            return self._pro(f"load i64, ptr {p}")
        if d.is_Add or d.is_Mul:
            if any(a.is_Rational and not a.is_Integer for a in d.args):
                raise UnsupportedError(f"dim {dim_str(d)} is not an integer expression")
            values = [self.dim(a) for a in d.args]
            out = values[0]
            for v in values[1:]:
                out = self._pro(f"{'add' if d.is_Add else 'mul'} i64 {out}, {v}")
            return out
        if isinstance(d, sympy.floor):
            num, den = floor_fraction(d.args[0])
            return self._floordiv_pro(self.dim(num), self.dim(den))
        if isinstance(d, sympy.Mod):
            a, b = self.dim(d.args[0]), self.dim(d.args[1])
            r = self._pro(f"srem i64 {a}, {b}")
            fix = self._pro(f"icmp slt i64 {r}, 0")
            plus = self._pro(f"add i64 {r}, {b}")
            return self._pro(f"select i1 {fix}, i64 {plus}, i64 {r}")
        if d.is_Pow and d.exp.is_Integer and int(d.exp) > 0:
            base = self.dim(d.base)
            out = base
            for _ in range(int(d.exp) - 1):
                out = self._pro(f"mul i64 {out}, {base}")
            return out
        raise UnsupportedError(f"dim {dim_str(d)} cannot be computed on this target")

    def _floordiv_pro(self, a: str, b: str) -> str:
        # dims are positive; numerators may not be (T - S + ...): floor, not truncation
        q = self._pro(f"sdiv i64 {a}, {b}")
        r = self._pro(f"srem i64 {a}, {b}")
        neg = self._pro(f"icmp slt i64 {r}, 0")
        q1 = self._pro(f"sub i64 {q}, 1")
        return self._pro(f"select i1 {neg}, i64 {q1}, i64 {q}")

    # -- control flow and the error flag
    def start_error_flag(self) -> None:
        """The error flag every checked subscript and integer division may raise (entry block)."""
        self.prologue.append("  %errflag = alloca i1")
        self.prologue.append("  store i1 false, ptr %errflag")

    def counted(self, tag: str, lo: str, hi: str, body: Callable[[str], str | None], step: int | None = 1) -> None:
        """``for (i = lo; i < hi; i += step) body(i)``; with ``step`` None, ``body(i)`` returns the step (a run
        of varying length)."""
        self.loops_made += 1
        tag = f"{tag}.{self.loops_made}"
        counter = f"%{tag}.p"
        self.prologue.append(f"  {counter} = alloca i64")
        self.emit(f"store i64 {lo}, ptr {counter}")
        self.emit(f"br label %h.{tag}")
        self.label(f"h.{tag}")
        i = self.let(f"load i64, ptr {counter}")
        more = self.let(f"icmp slt i64 {i}, {hi}")
        self.emit(f"br i1 {more}, label %b.{tag}, label %e.{tag}")
        self.label(f"b.{tag}")
        advance = body(i)
        nxt = self.let(f"add i64 {i}, {advance if step is None else step}")
        self.emit(f"store i64 {nxt}, ptr {counter}")
        self.emit(f"br label %h.{tag}")
        self.label(f"e.{tag}")

    def branch(self, cond: str, then: Callable[[], None], other: Callable[[], None] | None = None) -> None:
        """``if cond: then() else: other()`` (the two arms rejoin after)."""
        self.loops_made += 1
        tag = self.loops_made
        self.emit(f"br i1 {cond}, label %then.{tag}, label %else.{tag}")
        self.label(f"then.{tag}")
        then()
        self.emit(f"br label %fi.{tag}")
        self.label(f"else.{tag}")
        if other is not None:
            other()
        self.emit(f"br label %fi.{tag}")
        self.label(f"fi.{tag}")

    def flag_unless(self, ok: str) -> None:
        bad = self.let(f"xor i1 {ok}, true")
        old = self.let("load i1, ptr %errflag")
        new = self.let(f"or i1 {old}, {bad}")
        self.emit(f"store i1 {new}, ptr %errflag")
