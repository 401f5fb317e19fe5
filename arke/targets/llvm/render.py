"""The LLVM target: LLVM IR text for the host CPU, one function per dispatch.

Each dispatch becomes ``void @<kernel>.d<k>(ptr noalias %b0, ..., ptr noalias %dims, i64 %lo,
i64 %hi, ptr noalias %err)``: the buffers it touches (in plan order), the kernel's dim values,
the range ``[lo, hi)`` of its parallel axis (the runtime's workers each take a static chunk),
and an error word. The loop nest is the op's domain with the parallel axis outermost and
reduce axes innermost; reductions run in a fixed order (float ones in vector lanes of
accumulators whose order the IR spells out: :mod:`arke.targets.llvm.lanes`), so a result never
depends on how the parallel axis was split, nor on how LLVM vectorised. A rows dispatch (a
norm's statistics and the map that uses them) is one function that runs its members row by
row (:mod:`arke.targets.llvm.rows`). Subscripts that are not plain, in-range indices are checked: a bad
one is clamped (no wild read) and raises the error word, and the runtime then reports the
exact problem. Loop counters and accumulators live in allocas that LLVM's mem2reg and loop
vectorizer turn into vector code at O3.

This generic form handles every kernel correctly; the tiled, packed and attention-specific
forms that make it fast build on the same plan (see the issue tracker).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, dim_str
from arke.plan.dispatch import Buffer, Dispatch, KernelPlan
from arke.targets.artifact import Artifact, LaunchSpec, Renderer, UnsupportedError
from arke.targets.llvm.convert import FLOAT16, narrow, widen
from arke.targets.llvm.lanes import LaneSum, lane_loops
from arke.targets.llvm.lib import INT_BITS, expf, float_const, identity, ipow

# ---------------------------------------------------------------- type tables

# 16-bit floats are stored as their raw bits (i16) and converted by arke.targets.llvm.convert
STORAGE = {DType.F32: "float", DType.F16: "i16", DType.BF16: "i16", DType.I64: "i64", DType.I32: "i32",
           DType.I8: "i8", DType.BOOL: "i8"}
COMPUTE = {DType.F32: "float", DType.F16: "float", DType.BF16: "float", DType.I64: "i64", DType.I32: "i32",
           DType.I8: "i8", DType.BOOL: "i1"}

FLOAT_BINARY = {"add": "fadd", "sub": "fsub", "mul": "fmul", "div": "fdiv"}
INT_BINARY = {"add": "add", "sub": "sub", "mul": "mul"}
FLOAT_COMPARE = {"eq": "oeq", "ne": "une", "lt": "olt", "le": "ole", "gt": "ogt", "ge": "oge"}
INT_COMPARE = {"eq": "eq", "ne": "ne", "lt": "slt", "le": "sle", "gt": "sgt", "ge": "sge"}
# Float math with an LLVM intrinsic (NaN-propagating maximum/minimum, as torch does).
FLOAT_INTRINSIC = {"log": "llvm.log", "sqrt": "llvm.sqrt", "sin": "llvm.sin",
                   "cos": "llvm.cos", "floor": "llvm.floor", "ceil": "llvm.ceil", "exp2": "llvm.exp2",
                   "log2": "llvm.log2", "abs": "llvm.fabs"}
LIBM = {"tanh": "tanhf", "erf": "erff"}


# ---------------------------------------------------------------- one function


class _Function:
    """Emits one dispatch's LLVM function."""

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
        if not isinstance(self.op, ir.MapOp):
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
        exprs = [self.op.lhs, self.op.rhs] if isinstance(self.op, ir.ContractOp) else [self.op.body]
        for e in exprs:
            names |= {x.src for x in _loads(e)}
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
            num, den = _fraction(d.args[0])
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

    def start_error_flag(self) -> None:
        """The error flag every checked subscript and integer division may raise (entry block)."""
        self.prologue.append("  %errflag = alloca i1")
        self.prologue.append("  store i1 false, ptr %errflag")

    def flat_loop(self, axes: list[str], inner: Callable[[], None]) -> Dim:
        """One loop over ``[lo, hi)`` of the flattened ``axes`` (row-major); returns the flat extent."""
        total: Dim = sympy.Integer(1)
        for a in axes:
            total = total * self.extent[a]

        def body() -> None:
            rest = self.current["%flat"]
            for a in reversed(axes[1:]):
                n = self.dim(self.extent[a])
                self.current[a] = self.let(f"urem i64 {rest}, {n}")
                rest = self.let(f"udiv i64 {rest}, {n}")
            self.current[axes[0]] = rest
            inner()

        self.loop("%flat", "%lo", "%hi", body)
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
        if isinstance(op, ir.MapOp) or not op.axes:
            return None
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
            body: ir.SExpr = (ir.Binary("mul", _as(op.lhs, dtype), _as(op.rhs, dtype), dtype)
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
        self.loop(axes[0], "0", self.dim(self.extent[axes[0]]), lambda: self.nest(axes[1:], inner))

    def loop(self, axis: str, lo: str, hi: str, inner: Callable[[], None]) -> None:
        self.loops_made += 1
        tag = f"{axis.lstrip('%')}.{self.loops_made}"  # an axis may be looped over more than once (rows form)
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
        self.emit(f"br label %{head}{self.loop_hints(axis)}")
        self.label(done)

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

    def loop_hints(self, axis: str) -> str:
        """The strategy's ``vectorize``/``unroll`` of ``axis`` as LLVM loop metadata (``""`` if none)."""
        hints = []
        for kind, key, ty in (("vectorize", "llvm.loop.vectorize.width", "i32"),
                              ("unroll", "llvm.loop.unroll.count", "i32")):
            d = self.plan.decision(kind, axis)
            if d is not None and isinstance(d.value, int):
                hints.append(f'!{{!"{key}", {ty} {d.value}}}')
                if kind == "vectorize":
                    hints.append('!{!"llvm.loop.vectorize.enable", i1 true}')
        if not hints:
            return ""
        # numbered per dispatch (entry ``<kernel>.d<k>``) so ids are unique in the module
        dispatch = int(self.name.rsplit(".d", 1)[1]) if ".d" in self.name else 0
        ident = 100000 * (dispatch + 1) + self.loops_made
        self.declare(f"!{ident} = distinct !{{!{ident}, {', '.join(hints)}}}")
        return f", !llvm.loop !{ident}"

    def element(self) -> None:
        """The innermost body: compute (or reduce) one element of the result and store it."""
        op = self.op
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
        body: ir.SExpr = (ir.Binary("mul", _as(op.lhs, dtype), _as(op.rhs, dtype), dtype)
                          if isinstance(op, ir.ContractOp) else op.body)

        def term() -> str:
            value = self.expr(body)
            self.reduced(op, value)
            return value if body.dtype == dtype else self.convert(value, body.dtype, dtype)

        if self.in_lanes(dtype, names):
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
            c = self.let(f"icmp {'sgt' if kind == 'max' else 'slt'} {ct} {a}, {b}")
            self.emit(f"{t} = select i1 {c}, {ct} {a}, {ct} {b}")
        return t

    # -- memory
    def address(self, buf: Buffer, subs: Sequence[ir.SExpr]) -> str:
        offset = "0"
        for k, (s, d) in enumerate(zip(subs, buf.shape)):
            v = self.subscript(s, d, buf, k)
            if k == 0:
                offset = v
            else:
                m = self.let(f"mul i64 {offset}, {self.dim(d)}")
                offset = self.let(f"add i64 {m}, {v}")
        p = self.let(f"getelementptr inbounds {STORAGE[buf.dtype]}, ptr {self.ptr[buf.name]}, i64 {offset}")
        return p

    def subscript(self, s: ir.SExpr, extent: Dim, buf: Buffer, k: int) -> str:
        """The subscript's value, checked against the axis when it is not a plain in-range index."""
        v = self.expr(ir.Cast(s, DType.I64) if s.dtype != DType.I64 else s)
        if isinstance(s, ir.Idx) and s.name in self.extent and sympy.sympify(self.extent[s.name]) == \
                sympy.sympify(extent):
            return v
        if isinstance(s, ir.Const) and int(s.value) == 0:  # a broadcast axis: every dim is at least 1
            return v
        n = self.dim(extent)
        ge = self.let(f"icmp sge i64 {v}, 0")
        lt = self.let(f"icmp slt i64 {v}, {n}")
        ok = self.let(f"and i1 {ge}, {lt}")
        self.flag_unless(ok)
        safe = self.let(f"select i1 {ok}, i64 {v}, i64 0")
        return safe

    def flag_unless(self, ok: str) -> None:
        bad = self.let(f"xor i1 {ok}, true")
        old = self.let("load i1, ptr %errflag")
        new = self.let(f"or i1 {old}, {bad}")
        self.emit(f"store i1 {new}, ptr %errflag")

    def load(self, e: ir.Load) -> str:
        buf = self.buffer(e.src)
        p = self.address(buf, e.indices)
        raw = self.let(f"load {STORAGE[buf.dtype]}, ptr {p}")
        return self.widen(raw, buf.dtype)

    def widen(self, raw: str, dtype: DType) -> str:
        """A stored value in its compute type (16-bit floats to float, bool bytes to i1)."""
        if dtype in (DType.F16, DType.BF16):
            return self.widen_16(raw, dtype)
        if dtype is DType.BOOL:
            t = self.let(f"icmp ne i8 {raw}, 0")
            return t
        return raw

    # 16-bit floats convert in plain integer code (llvm_convert): fpext/fptrunc would become
    # compiler-rt calls a JIT cannot resolve on CPUs without F16C or AVX512-BF16
    def widen_16(self, raw: str, dtype: DType) -> str:
        name, definition = widen(FLOAT16[dtype])
        self.declare(definition)
        return self.let(f"call float {name}(i16 {raw})")

    def narrow_16(self, value: str, dtype: DType) -> str:
        name, definition = narrow(FLOAT16[dtype])
        self.declare(definition)
        return self.let(f"call i16 {name}(float {value})")

    def store(self, buf: Buffer, subs: Sequence[ir.SExpr], value: str, dtype: DType) -> None:
        p = self.address(buf, subs)
        stored = value
        if dtype in (DType.F16, DType.BF16):
            stored = self.narrow_16(value, dtype)
        elif dtype is DType.BOOL:
            stored = self.let(f"zext i1 {value} to i8")
        self.emit(f"store {STORAGE[dtype]} {stored}, ptr {p}")

    # -- scalar expressions
    def expr(self, e: ir.SExpr) -> str:
        method: Callable[[ir.SExpr], str] = getattr(self, "_x_" + type(e).__name__)
        return method(e)

    def _x_Const(self, e: ir.Const) -> str:
        if e.dtype.is_float:
            return float_const(float(e.value), e.dtype)
        if e.dtype.is_bool:
            return "true" if e.value else "false"
        return str(int(e.value))

    def _x_Idx(self, e: ir.Idx) -> str:
        return self.current[e.name]

    def _x_DimRef(self, e: ir.DimRef) -> str:
        return self.dim(e.dim)

    def _x_Load(self, e: ir.Load) -> str:
        return self.load(e)

    def _x_Cast(self, e: ir.Cast) -> str:
        return self.convert(self.expr(e.x), e.x.dtype, e.dtype)

    def convert(self, v: str, src: DType, dst: DType) -> str:
        """``v`` (in ``src``'s compute type) as ``dst`` (in its compute type, rounded to ``dst``)."""
        if src == dst:
            return v
        t = self.tmp()
        if dst.is_bool:
            self.emit(f"{t} = fcmp une float {v}, 0.0" if src.is_float else f"{t} = icmp ne {COMPUTE[src]} {v}, 0")
            return t
        if src.is_bool:
            self.emit(f"{t} = {'uitofp' if dst.is_float else 'zext'} i1 {v} to {COMPUTE[dst]}")
            return self._round_to(t, dst)
        if src.is_float and dst.is_float:
            return self._round_to(v, dst)
        if src.is_float:
            self.emit(f"{t} = fptosi float {v} to {COMPUTE[dst]}")
            return t
        if dst.is_float:
            self.emit(f"{t} = sitofp {COMPUTE[src]} {v} to float")
            return self._round_to(t, dst)
        a, b = INT_BITS[src], INT_BITS[dst]
        self.emit(f"{t} = {'sext' if b > a else 'trunc'} {COMPUTE[src]} {v} to {COMPUTE[dst]}")
        return t

    def _round_to(self, v: str, dst: DType) -> str:
        if dst not in (DType.F16, DType.BF16):
            return v
        n = self.narrow_16(v, dst)
        w = self.widen_16(n, dst)
        return w

    def _x_Select(self, e: ir.Select) -> str:
        c, a, b = self.expr(e.cond), self.expr(e.a), self.expr(e.b)
        t = self.let(f"select i1 {c}, {COMPUTE[e.dtype]} {a}, {COMPUTE[e.dtype]} {b}")
        return t

    def _x_Unary(self, e: ir.Unary) -> str:
        x = self.expr(e.x)
        ct = COMPUTE[e.dtype]
        t = self.tmp()
        op = e.op
        if op == "not":
            self.emit(f"{t} = xor i1 {x}, true")
            return t
        if not e.dtype.is_float:
            if op == "neg":
                self.emit(f"{t} = sub {ct} 0, {x}")
            elif op == "abs":
                self.declare(f"declare {ct} @llvm.abs.{ct}({ct}, i1)")
                self.emit(f"{t} = call {ct} @llvm.abs.{ct}({ct} {x}, i1 false)")
            elif op == "relu":
                c = self.let(f"icmp sgt {ct} {x}, 0")
                self.emit(f"{t} = select i1 {c}, {ct} {x}, {ct} 0")
            else:
                raise UnsupportedError(f"unimplemented integer `{op}` in LLVM lowering")
            return t
        if op == "neg":
            self.emit(f"{t} = fneg float {x}")
        elif op == "exp":
            return self.expr_f("exp", x)
        elif op in FLOAT_INTRINSIC:
            fn = FLOAT_INTRINSIC[op] + ".f32"
            self.declare(f"declare float @{fn}(float)")
            self.emit(f"{t} = call float @{fn}(float {x})")
        elif op in LIBM:
            self.declare(f"declare float @{LIBM[op]}(float)")
            self.emit(f"{t} = call float @{LIBM[op]}(float {x})")
        elif op == "rsqrt":
            s = self.expr_f("sqrt", x)
            self.emit(f"{t} = fdiv float 1.0, {s}")
        elif op == "relu":
            self.declare("declare float @llvm.maximum.f32(float, float)")
            self.emit(f"{t} = call float @llvm.maximum.f32(float {x}, float 0.0)")
        elif op in ("sigmoid", "silu"):
            n = self.let(f"fneg float {x}")
            ex = self.expr_f("exp", n)
            d = self.let(f"fadd float 1.0, {ex}")
            if op == "sigmoid":
                self.emit(f"{t} = fdiv float 1.0, {d}")
            else:
                self.emit(f"{t} = fdiv float {x}, {d}")
        elif op == "gelu":
            s = self.let(f"fmul float {x}, {float_const(math.sqrt(0.5))}")
            self.declare("declare float @erff(float)")
            er = self.let(f"call float @erff(float {s})")
            one = self.let(f"fadd float 1.0, {er}")
            h = self.let(f"fmul float {x}, 0x3FE0000000000000")
            self.emit(f"{t} = fmul float {h}, {one}")
        else:
            raise UnsupportedError(f"unimplemented primitive in llvm lowering: {op}")
        return t

    def expr_f(self, op: str, x: str) -> str:
        t = self.tmp()
        if op == "exp":
            fn, needs = expf(scalef=self.vector_bits >= 512)
            for d in needs:
                self.declare(d)
            self.emit(f"{t} = call float @{fn}(float {x})")
            return t
        fn = FLOAT_INTRINSIC[op] + ".f32"
        self.declare(f"declare float @{fn}(float)")
        self.emit(f"{t} = call float @{fn}(float {x})")
        return t

    def _x_Binary(self, e: ir.Binary) -> str:
        a, b = self.expr(e.a), self.expr(e.b)
        op = e.op
        if op in ("and", "or"):
            t = self.let(f"{op} i1 {a}, {b}")
            return t
        operand = e.a.dtype
        if op in FLOAT_COMPARE:
            t = self.tmp()
            if operand.is_float:
                self.emit(f"{t} = fcmp {FLOAT_COMPARE[op]} float {a}, {b}")
            else:
                self.emit(f"{t} = icmp {INT_COMPARE[op]} {COMPUTE[operand]} {a}, {b}")
            return t
        if e.dtype.is_float:  # f16/bf16 arithmetic runs in f32: rounded only when stored or cast
            return self.float_binary(op, a, b)
        return self.int_binary(op, a, b, COMPUTE[e.dtype])

    def float_binary(self, op: str, a: str, b: str) -> str:
        t = self.tmp()
        if op in FLOAT_BINARY:
            self.emit(f"{t} = {FLOAT_BINARY[op]} float {a}, {b}")
        elif op in ("max", "min", "pow"):
            fn = {"max": "llvm.maximum.f32", "min": "llvm.minimum.f32", "pow": "llvm.pow.f32"}[op]
            self.declare(f"declare float @{fn}(float, float)")
            self.emit(f"{t} = call float @{fn}(float {a}, float {b})")
        elif op == "floordiv":
            q = self.let(f"fdiv float {a}, {b}")
            return self.expr_f("floor", q)
        elif op == "mod":  # Python's sign rule: the result takes the divisor's sign
            r = self.let(f"frem float {a}, {b}")
            nz = self.let(f"fcmp une float {r}, 0.0")
            rn, bn = self.tmp(), self.tmp()
            self.emit(f"{rn} = fcmp olt float {r}, 0.0")
            self.emit(f"{bn} = fcmp olt float {b}, 0.0")
            diff, fix, plus = self.tmp(), self.tmp(), self.tmp()
            self.emit(f"{diff} = xor i1 {rn}, {bn}")
            self.emit(f"{fix} = and i1 {nz}, {diff}")
            self.emit(f"{plus} = fadd float {r}, {b}")
            self.emit(f"{t} = select i1 {fix}, float {plus}, float {r}")
        else:
            raise UnsupportedError(f"unimplemented primitive in llvm lowering: {op}")
        return t

    def int_binary(self, op: str, a: str, b: str, ct: str) -> str:
        t = self.tmp()
        if op in INT_BINARY:
            self.emit(f"{t} = {INT_BINARY[op]} {ct} {a}, {b}")
            return t
        if op in ("max", "min"):
            c = self.let(f"icmp {'sgt' if op == 'max' else 'slt'} {ct} {a}, {b}")
            self.emit(f"{t} = select i1 {c}, {ct} {a}, {ct} {b}")
            return t
        if op in ("div", "floordiv", "mod"):
            return self.int_divide(op, a, b, ct)
        if op == "pow":
            fn = f"arke.ipow.{ct}"
            self.declare(ipow(ct))
            self.emit(f"{t} = call {ct} @\"{fn}\"({ct} {a}, {ct} {b}, ptr %errflag)")
            return t
        raise UnsupportedError(f"unimplemented integer `{op}` in llvm lowering")

    def int_divide(self, op: str, a: str, b: str, ct: str) -> str:
        """Python's floor division and modulo; a zero divisor raises the error word, never traps."""
        zero = self.let(f"icmp eq {ct} {b}, 0")
        ok = self.let(f"xor i1 {zero}, true")
        self.flag_unless(ok)
        b1, m1, b2 = self.tmp(), self.tmp(), self.tmp()
        self.emit(f"{b1} = select i1 {zero}, {ct} 1, {ct} {b}")
        self.emit(f"{m1} = icmp eq {ct} {b1}, -1")  # MIN / -1 traps on x86: use negation instead
        self.emit(f"{b2} = select i1 {m1}, {ct} 1, {ct} {b1}")
        q0, r0 = self.tmp(), self.tmp()
        self.emit(f"{q0} = sdiv {ct} {a}, {b2}")
        self.emit(f"{r0} = srem {ct} {a}, {b2}")
        neg = self.let(f"sub {ct} 0, {a}")
        q, r = self.tmp(), self.tmp()
        self.emit(f"{q} = select i1 {m1}, {ct} {neg}, {ct} {q0}")
        self.emit(f"{r} = select i1 {m1}, {ct} 0, {ct} {r0}")
        nz, rn, bn, diff, fix = (self.tmp() for _ in range(5))
        self.emit(f"{nz} = icmp ne {ct} {r}, 0")
        self.emit(f"{rn} = icmp slt {ct} {r}, 0")
        self.emit(f"{bn} = icmp slt {ct} {b1}, 0")
        self.emit(f"{diff} = xor i1 {rn}, {bn}")
        self.emit(f"{fix} = and i1 {nz}, {diff}")
        out = self.tmp()
        if op == "mod":
            plus = self.let(f"add {ct} {r}, {b1}")
            self.emit(f"{out} = select i1 {fix}, {ct} {plus}, {ct} {r}")
        else:
            less = self.let(f"sub {ct} {q}, 1")
            self.emit(f"{out} = select i1 {fix}, {ct} {less}, {ct} {q}")
        return out


def function_for(plan: KernelPlan, dispatch: Dispatch, name: str, declare: Callable[[str], None],
                 vector_bits: int = 512) -> _Function:
    """The emitter of one generic-form dispatch: a rows group's own subclass, else the single-op one."""
    if dispatch.family == "rows":
        from arke.targets.llvm.rows import RowsFunction

        return RowsFunction(plan, dispatch, name, declare, vector_bits)
    return _Function(plan, dispatch, name, declare, vector_bits)


def _as(load: ir.Load, dtype: DType) -> ir.SExpr:
    return load if load.dtype == dtype else ir.Cast(load, dtype)


def _loads(e: ir.SExpr) -> list[ir.Load]:
    from arke.plan.families import subexprs

    return [x for x in subexprs(e) if isinstance(x, ir.Load)]


def _fraction(arg: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
    """Numerator and denominator of a floor's argument, both integer expressions."""
    num, den = sympy.fraction(arg)
    if den == 1:
        den = sympy.Integer(math.lcm(*(int(t.as_coeff_Mul()[0].q) for t in sympy.Add.make_args(arg))))
        num = sympy.expand(arg * den)
    if den == 1:
        num, den = sympy.fraction(sympy.together(arg))
    return num, den


# ---------------------------------------------------------------- the renderer


class LLVMRenderer(Renderer):
    """Renders a kernel plan to an LLVM IR module for the host CPU.

    ``vector_bits`` is the width of the explicit vector code (contraction micro-kernels,
    attention tiles): 512 on AVX-512, 256 on AVX2, 128 elsewhere. The IR is correct on any
    machine (LLVM legalises wider vectors); the width only decides how fast it runs.
    """

    name = "llvm"
    capabilities = frozenset({"f32", "f16", "bf16", "i8", "i32", "i64", "bool", "parallel"})

    def __init__(self, vector_bits: int = 512):
        self.vector_bits = vector_bits

    def render(self, plan: KernelPlan) -> Artifact:
        declarations: dict[str, None] = {}

        def declare(text: str) -> None:
            declarations.setdefault(text, None)

        functions, launches = [], []
        meta = {"vector_bits": str(self.vector_bits)}
        for k, d in enumerate(plan.dispatches):
            entry = f"{plan.name}.d{k}"
            if d.family == "attention":
                from arke.targets.llvm.attention import render_attention

                text, launch = render_attention(plan, d, entry, declare, self.vector_bits)
            elif d.family == "contraction" and d.pattern is not None:
                from arke.targets.llvm.gemm import render_contraction

                # dims word len(dims) + k may carry the address of B's prepacked panels (runtime.cpu)
                text, launch, panel = render_contraction(plan, d, entry, declare, self.vector_bits,
                                                         panel_slot=len(plan.dims) + k)
                if panel is not None:
                    meta[f"panels.{k}"] = panel
            else:
                fn = function_for(plan, d, entry, declare, self.vector_bits)
                text = fn.render()
                extent = dim_str(fn.parallel_extent) if fn.parallel_extent is not None else None
                scratch = dim_str(fn.scratch) if fn.scratch is not None else None
                launch = LaunchSpec(entry, extent, tuple(plan.buffer_index(b) for b in fn.args), scratch)
            functions.append(text)
            launches.append(launch)
        source = "\n\n".join([f"; arke kernel {plan.name}", *declarations, *functions]) + "\n"
        return Artifact("llvm", source, tuple(launches), meta)


RENDERER = LLVMRenderer()
