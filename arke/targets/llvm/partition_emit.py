"""A pointwise map whose vector axis is partitioned (:mod:`arke.targets.llvm.partition`): pieces of vector code.

Per row (or once per call, when no breakpoint reads an outer index) the breakpoints are computed,
clamped to the row's range and sorted; each remainder's first wrap after the start is one of them. Each
non-empty piece then gets, from its first point: the value of every tracked comparison (one per piece
by construction), the quotient of every tracked ``%``/``/`` and whether it holds to the piece's end
(a piece past a divisor's second period does not). The piece runs as vector code when that suffices:

* every divisor is positive;
* each tracked ``%``/``/`` keeps one quotient over the piece, or the piece never uses its value (every
  select above it takes the other arm here, and it only forms the subscripts of contiguous loads,
  which that piece then masks off: they read nothing);
* every contiguous load it reads without a per-element check is in range at every point of the piece
  (affine subscripts: checked at the piece's ends; a remainder that wraps is within ``[0, m)``).

Otherwise the piece runs the generic scalar loop, whose checks raise the error word exactly where the
interpreter stops. Vector code is :class:`arke.targets.llvm.vec.VectorExprMixin`'s: lanes along the axis,
a comparison bound to its piece's scalar, ``x % m`` as ``x - q·m``, masked loads and stores.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, equal
from arke.plan.dispatch import Dispatch, KernelPlan
from arke.targets.artifact import UnsupportedError
from arke.targets.llvm.function import LLVMFunction
from arke.targets.llvm.partition import Partition, Wrap, analyse
from arke.targets.llvm.scalar import STORAGE
from arke.targets.llvm.vec import Vec
from arke.targets.llvm.vexpr import VectorExprMixin


def partitioned_function(plan: KernelPlan, dispatch: Dispatch, name: str, declare: Callable[[str], None],
                         vector_bits: int) -> LLVMFunction | None:
    """The emitter of a single-op map whose innermost index is worth partitioning, else None."""
    op = dispatch.op
    if not isinstance(op, ir.MapOp) or not op.axes:
        return None
    axis = op.axes[-1].name
    if dispatch.parallel == axis and len(op.axes) > 1:
        return None  # the workers split it (outermost): the innermost loop is another index
    if plan.decision("vectorize", axis) is not None or plan.decision("unroll", axis) is not None:
        return None  # the strategy's loop hints apply to the generic loop
    part = analyse(op, max(4, vector_bits // 32))
    return None if part is None else PartitionFunction(plan, dispatch, name, declare, vector_bits, part)


class _Setup:
    """A row's pieces: their bounds, each wrap's quotient at the start and first wraps, the divisors' sign."""

    def __init__(self) -> None:
        self.bounds: list[str] = []
        self.wraps: dict[ir.SExpr, tuple[str, str, str, str]] = {}  # node -> (q0, first wrap, second, m)
        self.positive = "true"


class PartitionMixin(VectorExprMixin):
    """The pieces of a map's innermost loop (``part``'s axis), for a function emitter that runs maps: a
    single-op map's (:class:`PartitionFunction`) or a rows dispatch's members
    (:class:`~arke.targets.llvm.rows_partition.PartitionedRowsFunction`). Not ``partitioned``: plain loops."""

    part: Partition
    partitioned: bool = False  # whether the loops being emitted are ``part``'s
    _none = ir.Load("%none", (), DType.F32)  # no load is the vector mixin's "leaf"

    def start_pieces(self, part: Partition | None) -> None:
        """The partition the next loops are emitted for (None: none), and its per-piece state cleared."""
        self.part, self.partitioned = (part, True) if part is not None else (Partition(""), False)
        self.bound = {}
        self.lane_index = self.part.axis
        self.jvec = self.svec = ""
        self._qm: dict[ir.SExpr, str] = {}  # per piece: a remainder's q·m
        self._live: dict[ir.SExpr, str] = {}  # per piece: whether a contiguous load's value is used
        self._q: dict[ir.SExpr, str] = {}  # per piece: each wrap's quotient at its start ...
        self._uni: dict[ir.SExpr, str] = {}  # ... whether it holds to the end ...
        self._m: dict[ir.SExpr, str] = {}  # ... and the divisor (1 where it is not positive)
        self._main: dict[ir.SExpr, str] = {}  # per piece: whether a max/min is its axis' side

    def leaf(self) -> ir.Load:
        return self._none

    # -- the loop nest: the innermost loop over the axis becomes the pieces
    def loops(self, order: list[str], depth: int, inner: Callable[[], None]) -> None:
        if self.partitioned and depth == len(order) - 1 and order[depth] == self.part.axis:
            parallel = depth == 0 and order[depth] == self.d.parallel
            lo, hi = ("%lo", "%hi") if parallel else ("0", self.dim(self.extent[self.part.axis]))
            self.pieces(lo, hi)
            return
        super().loops(order, depth, inner)

    def flat_loop(self, axes: list[str], inner: Callable[[], None]) -> Dim:
        if self.partitioned and axes == [self.part.axis]:  # a map of one index: the pieces of the worker's range
            self.pieces("%lo", "%hi")
            return self.extent[self.part.axis]
        return super().flat_loop(axes, inner)

    def pieces(self, lo: str, hi: str) -> None:
        p = self.part
        exprs = [x for w in p.wraps.values() for x in (w.b, w.m)]
        per_call = not any(isinstance(x, ir.Idx) for e in exprs for x in ir.walk(e)) and \
            not any(str(s).startswith("%idx.") for b in p.breakpoints() for s in b.free_symbols)
        if per_call:  # dims only: once per call, in the entry block
            saved, self.body = self.body, []
            setup = self.setup(lo, hi)
            self.prologue.extend(self.body)
            self.body = saved
        else:
            setup = self.setup(lo, hi)
        # the pieces in a loop over a table of bounds: one copy of the vector body and of the generic one
        n = len(setup.bounds)
        self.loops_made += 1
        table = f"%pieces.{self.loops_made}"
        self.prologue.append(f"  {table} = alloca [{n} x i64]")
        lines = self.prologue if per_call else self.body
        for k, b in enumerate(setup.bounds):
            self.n += 1
            lines.append(f"  %t{self.n} = getelementptr inbounds i64, ptr {table}, i64 {k}")
            lines.append(f"  store i64 {b}, ptr %t{self.n}")

        def one() -> None:
            k = self.current["%piece"]
            lo = self.let(f"load i64, ptr {self.let(f'getelementptr inbounds i64, ptr {table}, i64 {k}')}")
            k1 = self.let(f"add i64 {k}, 1")
            hi = self.let(f"load i64, ptr {self.let(f'getelementptr inbounds i64, ptr {table}, i64 {k1}')}")
            self.branch(self.let(f"icmp slt i64 {lo}, {hi}"), functools.partial(self.piece, lo, hi, setup))

        self.loop("%piece", "0", str(n - 1), one)

    def setup(self, lo: str, hi: str) -> _Setup:
        """The pieces' bounds and each wrap's quotient at ``lo`` (straight-line code that cannot fail)."""
        s = _Setup()
        points = [self.symbolic(b) for b in self.part.breakpoints()]
        for node, w in self.part.wraps.items():
            m = self.expr(w.m)
            pos = self.let(f"icmp sgt i64 {m}, 0")
            s.positive = self.let(f"and i1 {s.positive}, {pos}")
            m = self.let(f"select i1 {pos}, i64 {m}, i64 1")
            at = self.let(f"{'add' if w.a == 1 else 'sub'} i64 {self.expr(w.b)}, {lo}")  # A at lo
            q0, r0 = self.floor_divide(at, m)
            # rising: the quotient grows after m - r0 steps; falling: it drops after r0 + 1
            first = self.let(f"sub i64 {m}, {r0}") if w.a == 1 else self.let(f"add i64 {r0}, 1")
            w0 = self.let(f"add i64 {lo}, {first}")
            s.wraps[node] = (q0, w0, self.let(f"add i64 {w0}, {m}"), m)
            points.append(w0)
        points = [self.imax(lo, self.imin(x, hi)) for x in points]
        for i in range(len(points)):  # a sorting network: every compare-exchange fixed
            for j in range(len(points) - 1 - i):
                points[j], points[j + 1] = self.imin(points[j], points[j + 1]), self.imax(points[j], points[j + 1])
        s.bounds = [lo, *points, hi]
        return s

    def symbolic(self, e: sympy.Expr) -> str:
        """A breakpoint's value: outer indices ``%idx.<name>`` from the loops, the rest as dims."""
        if not any(str(s).startswith("%idx.") for s in e.free_symbols) and not e.has(sympy.Max, sympy.Min):
            return self.dim(e)
        if isinstance(e, sympy.Symbol):
            return self.current[str(e)[len("%idx."):]]
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:  # i * i
            e = sympy.Mul(*[e.base] * int(e.exp), evaluate=False)
        if type(e) not in (sympy.Add, sympy.Mul, sympy.Max, sympy.Min):  # plain() makes no other
            raise UnsupportedError(f"breakpoint {e} cannot be computed on this target")
        kind = {sympy.Add: "add", sympy.Mul: "mul", sympy.Max: "max", sympy.Min: "min"}[type(e)]
        values = [self.symbolic(a) for a in e.args]
        out = values[0]
        for v in values[1:]:
            out = self.imax(out, v) if kind == "max" else self.imin(out, v) if kind == "min" else \
                self.let(f"{kind} i64 {out}, {v}")
        return out

    def floor_divide(self, a: str, m: str) -> tuple[str, str]:
        """Python's ``a // m`` and ``a % m`` for ``m > 0``."""
        q, r = self.let(f"sdiv i64 {a}, {m}"), self.let(f"srem i64 {a}, {m}")
        neg = self.let(f"icmp slt i64 {r}, 0")
        return (self.let(f"select i1 {neg}, i64 {self.let(f'sub i64 {q}, 1')}, i64 {q}"),
                self.let(f"select i1 {neg}, i64 {self.let(f'add i64 {r}, {m}')}, i64 {r}"))

    def imin(self, a: str, b: str) -> str:
        return self.let(f"select i1 {self.let(f'icmp slt i64 {a}, {b}')}, i64 {a}, i64 {b}")

    def imax(self, a: str, b: str) -> str:
        return self.let(f"select i1 {self.let(f'icmp sgt i64 {a}, {b}')}, i64 {a}, i64 {b}")

    # -- one piece
    def piece(self, lo: str, hi: str, s: _Setup) -> None:
        p, axis = self.part, self.part.axis
        self.current[axis] = lo
        self.bound = {c: self.expr(c) for c in p.conditions}  # one value over the piece
        fast, uni, q = s.positive, {}, {}
        for node, w in p.wraps.items():
            q0, w0, w1, _ = s.wraps[node]
            crossed = self.let(f"zext i1 {self.let(f'icmp sge i64 {lo}, {w0}')} to i64")
            q[node] = self.let(f"{'add' if w.a == 1 else 'sub'} i64 {q0}, {crossed}")
            uni[node] = self.let(f"icmp sle i64 {hi}, {w1}")
        self._q, self._uni, self._m = q, uni, {n: s.wraps[n][3] for n in p.wraps}
        self._qm = {n: self.let(f"mul i64 {q[n]}, {self._m[n]}") for n, w in p.wraps.items() if _is_mod(w)}
        for node, w in p.wraps.items():
            if not _is_mod(w):
                self.bound[node] = q[node]
            ok = uni[node]
            if node in p.contained and _is_mod(w):  # unused here: its loads are masked off (their check:
                # the remainder is in [0, m); a quotient has no such bound)
                dead = self.let(f"xor i1 {self.live(p.wrap_paths[node])}, true")
                ok = self.let(f"or i1 {ok}, {dead}")
            fast = self.let(f"and i1 {fast}, {ok}")
        self._live = {e: self.live(paths) for e, paths in p.loads.items()}
        self._main = {c: (self.bound[which] if on_a else self.let(f"xor i1 {self.bound[which]}, true"))
                      for c, (which, on_a) in p.choices.items()}
        last = self.let(f"sub i64 {hi}, 1")
        for e in p.loads:
            assert isinstance(e, ir.Load)
            buf = self.buffer(e.src)
            sub = e.indices[-1]
            sides = [self._main[x] for x in ir.walk(sub) if x in p.choices]
            if sides:  # read along the axis only where each max/min is its axis' side, else unused here
                along = self._live[e]
                for side in sides:
                    along = self.let(f"and i1 {along}, {side}")
                fast = self.let(f"and i1 {fast}, {self.let(f'icmp eq i1 {along}, {self._live[e]}')}")
            if sub == ir.Idx(axis) and equal(buf.shape[-1], self.extent[axis]) is True:
                continue  # the axis itself: in range
            mn, mx = self.interval(sub, lo, last)
            ok = self.let(f"and i1 {self.let(f'icmp sge i64 {mn}, 0')}, "
                          f"{self.let(f'icmp slt i64 {mx}, {self.dim(buf.shape[-1])}')}")
            fast = self.let(f"and i1 {fast}, {ok}")
        scalars = self.bound

        def vector() -> None:
            self.bound = dict(scalars)
            self.vector_loop(lo, hi)

        def generic() -> None:
            self.bound = {}
            self.loop(axis, lo, hi, self.element)

        self.branch(fast, vector, generic)
        self.bound = {}

    def live(self, paths: list[tuple[tuple[ir.SExpr, bool], ...]]) -> str:
        """Whether some occurrence is used in this piece: every uniform select above it takes its arm."""
        if any(not path for path in paths):
            return "true"
        out = "false"
        for path in paths:
            here = "true"
            for cond, arm in path:
                v = self.expr(cond)
                if not arm:
                    v = self.let(f"xor i1 {v}, true")
                here = self.let(f"and i1 {here}, {v}")
            out = self.let(f"or i1 {out}, {here}")
        return out

    def interval(self, e: ir.SExpr, lo: str, last: str) -> tuple[str, str]:
        """The least and greatest value of integer ``e`` over the piece ``[lo, last]`` (true values: a
        remainder that wraps in the piece is somewhere in ``[0, m)``)."""
        axis = self.part.axis
        if not any(isinstance(x, ir.Idx) and x.name == axis for x in ir.walk(e)):
            v = self.expr(e)
            return v, v
        if isinstance(e, ir.Idx):
            return lo, last
        w = self.part.wraps.get(e)
        if w is not None:
            if not _is_mod(w):
                return self._q[e], self._q[e]  # used only where one quotient holds
            amn, amx = self.interval(w.node.a, lo, last)
            u, qm, top = self._uni[e], self._qm[e], self.let(f"sub i64 {self._m[e]}, 1")
            return (self.let(f"select i1 {u}, i64 {self.let(f'sub i64 {amn}, {qm}')}, i64 0"),
                    self.let(f"select i1 {u}, i64 {self.let(f'sub i64 {amx}, {qm}')}, i64 {top}"))
        if e in self.part.choices:
            assert isinstance(e, ir.Binary)
            on_a = self.part.choices[e][1]
            mn, mx = self.interval(e.a if on_a else e.b, lo, last)
            v, side = self.expr(e.b if on_a else e.a), self._main[e]
            return (self.let(f"select i1 {side}, i64 {mn}, i64 {v}"), self.let(f"select i1 {side}, i64 {mx}, i64 {v}"))
        if isinstance(e, ir.Select):  # a uniform condition: one arm over the piece
            (amn, amx), (bmn, bmx) = self.interval(e.a, lo, last), self.interval(e.b, lo, last)
            c = self.expr(e.cond)
            return (self.let(f"select i1 {c}, i64 {amn}, i64 {bmn}"), self.let(f"select i1 {c}, i64 {amx}, i64 {bmx}"))
        if isinstance(e, ir.Cast):
            return self.interval(e.x, lo, last)
        if isinstance(e, ir.Unary):  # neg
            mn, mx = self.interval(e.x, lo, last)
            return self.let(f"sub i64 0, {mx}"), self.let(f"sub i64 0, {mn}")
        assert isinstance(e, ir.Binary)
        if e.op == "mul":
            k, x = (e.a, e.b) if isinstance(e.a, ir.Const) else (e.b, e.a)
            assert isinstance(k, ir.Const)
            mn, mx = self.interval(x, lo, last)
            if int(k.value) < 0:
                mn, mx = mx, mn
            return self.let(f"mul i64 {mn}, {int(k.value)}"), self.let(f"mul i64 {mx}, {int(k.value)}")
        amn, amx = self.interval(e.a, lo, last)
        bmn, bmx = self.interval(e.b, lo, last)
        if e.op == "add":
            return self.let(f"add i64 {amn}, {bmn}"), self.let(f"add i64 {amx}, {bmx}")
        return self.let(f"sub i64 {amn}, {bmx}"), self.let(f"sub i64 {amx}, {bmn}")

    def offset(self, e: ir.SExpr) -> str:
        """``e - axis`` in this piece, for a subscript of coefficient 1 (:func:`partition.coefficient`)."""
        return self.affine(e)[1]

    def affine(self, e: ir.SExpr) -> tuple[int, str]:
        axis = self.part.axis
        if not any(isinstance(x, ir.Idx) and x.name == axis for x in ir.walk(e)):
            return 0, self.expr(e)
        if isinstance(e, ir.Idx):
            return 1, "0"
        w = self.part.wraps.get(e)
        if w is not None:
            if not _is_mod(w):
                return 0, self._q[e]
            c, o = self.affine(w.node.a)
            return c, self.let(f"sub i64 {o}, {self._qm[e]}")
        if e in self.part.choices:  # its axis' side (elsewhere the load is masked off)
            assert isinstance(e, ir.Binary)
            return self.affine(e.a if self.part.choices[e][1] else e.b)
        if isinstance(e, ir.Select):  # a uniform condition, both arms of one coefficient
            (c, oa), (_, ob) = self.affine(e.a), self.affine(e.b)
            return c, self.let(f"select i1 {self.expr(e.cond)}, i64 {oa}, i64 {ob}")
        if isinstance(e, ir.Cast):
            return self.affine(e.x)
        if isinstance(e, ir.Unary):
            c, o = self.affine(e.x)
            return -c, self.let(f"sub i64 0, {o}")
        assert isinstance(e, ir.Binary)
        if e.op == "mul":
            k, x = (e.a, e.b) if isinstance(e.a, ir.Const) else (e.b, e.a)
            assert isinstance(k, ir.Const)
            c, o = self.affine(x)
            return c * int(k.value), self.let(f"mul i64 {o}, {int(k.value)}")
        (ca, oa), (cb, ob) = self.affine(e.a), self.affine(e.b)
        if e.op == "add":
            return ca + cb, self.let(f"add i64 {oa}, {ob}")
        return ca - cb, self.let(f"sub i64 {oa}, {ob}")

    # -- the piece's vector loop
    def vector_loop(self, lo: str, hi: str) -> None:
        op = self.op
        assert isinstance(op, ir.MapOp)
        self.counted("vec", lo, hi, lambda j: self.vector_step(op, j, hi), step=self.vec.w)
        self.lane_start = self.lane_mask = None

    def vector_step(self, op: ir.MapOp, j: str, hi: str) -> None:
        """The lanes ``[j, j + w)`` of the piece (those before ``hi``)."""
        self.current[self.part.axis] = j
        self.lane_start, self.lane_mask = j, self.vec.lanes_below(j, hi)
        # lanes past the piece's end repeat its last point: computed lane by lane, they are checked too
        t = self.vec.ty("i64")
        lanes = self.let(f"add {t} {self.vec.splat(j, 'i64')}, {self.vec.iota('i64')}")
        end = self.vec.splat(self.let(f"sub i64 {hi}, 1"), "i64")
        inside = self.let(f"icmp slt {t} {lanes}, {end}")
        self.jvec = self.let(f"select {self.vec.ty('i1')} {inside}, {t} {lanes}, {t} {end}")
        value = self.vector(op.body)
        out = self.buffer(op.result)
        at = self.let(f"add i64 {self.row_offset(out, [ir.Idx(a.name) for a in op.axes[:-1]])}, {j}")
        ptr = self.let(f"getelementptr inbounds {STORAGE[op.dtype]}, ptr {self.ptr[out.name]}, i64 {at}")
        self.emit(self.vec.masked_store_as(value, ptr, self.lane_mask, op.dtype))

    # -- vector expressions under the piece's facts
    def varying(self, e: ir.SExpr) -> bool:
        if e in self.bound:
            return False
        if isinstance(e, ir.Idx):
            return e.name == self.lane_index
        return any(self.varying(c) for c in ir.children(e))

    def vexpr(self, e: ir.SExpr) -> tuple[str, bool]:
        qm = self._qm.get(e) if self.lane_start is not None else None
        if qm is not None and self.varying(e):
            assert isinstance(e, ir.Binary)
            t = self.vec.ty("i64")
            return self.let(f"sub {t} {self.vector(e.a)}, {self.vec.splat(qm, 'i64')}"), True
        return super().vexpr(e)

    def _v_Load(self, e: ir.Load) -> str | None:
        if e not in self.part.loads or self.lane_start is None or self.lane_mask is None:
            return None  # lane by lane, each subscript checked
        buf = self.buffer(e.src)
        at = self.let(f"add i64 {self.row_offset(buf, e.indices[:-1])}, {self.lane_start}")
        at = self.let(f"add i64 {at}, {self.offset(e.indices[-1])}")
        ptr = self.let(f"getelementptr inbounds {STORAGE[buf.dtype]}, ptr {self.ptr[buf.name]}, i64 {at}")
        mask = self.lane_mask
        live = self._live.get(e, "true")
        if live != "true":  # a piece that does not use it reads nothing (its address may be anywhere)
            mask = self.let(f"select i1 {live}, {self.vec.ty('i1')} {mask}, {self.vec.ty('i1')} zeroinitializer")
        return self.vec.load_as_float(ptr, buf.dtype, mask)


class PartitionFunction(PartitionMixin, LLVMFunction):
    """A single-op map's function whose innermost loop is a run of pieces, each vector code or the generic
    loop."""

    def __init__(self, plan: KernelPlan, dispatch: Dispatch, name: str, declare: Callable[[str], None],
                 vector_bits: int, part: Partition):
        super().__init__(plan, dispatch, name, declare, vector_bits)
        self.vec = Vec(max(4, vector_bits // 32), self.let, declare)
        self.start_pieces(part)


def _is_mod(w: Wrap) -> bool:
    return w.node.op == "mod"
