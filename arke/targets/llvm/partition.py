"""Loop partitioning of a pointwise map's vector axis: where a body's conditions and ``%``/``/`` on it change.

A body that indexes its innermost index ``d`` through ``d % RD`` or ``(d + half) % RD``, or selects on
``d < half``, has no single vector form: the remainder wraps, the condition flips. But between its
*breakpoints* (the points where a comparison of ``d`` with a loop-invariant value changes, and where an
affine remainder or quotient of ``d`` by a loop-invariant divisor wraps) every such condition is one
value and every such ``%``/``/`` is affine, ``x % m = x - q·m`` with one ``q``: each piece is then a
vector loop of contiguous loads (Halide's and TVM's loop partitioning).

This module is the analysis, on the IR alone; :mod:`arke.targets.llvm.partition_emit` emits the pieces.
Breakpoints are dims and outer indices, known only when the kernel runs: the emitted code computes,
clamps and sorts them there, and checks each piece before running its vector form (every remainder it
relies on within one period, every load it reads without a check in range); a piece that fails runs
the plain scalar loop, so a result and its errors are always those of the generic code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.passes.rewrite import map_expr

#: At most this many breakpoints (pieces: one more); a body with more keeps the generic loop.
MAX_BREAKPOINTS = 7
#: The largest constant a tracked expression may hold: with dims and indices far below 2**62, ``±d + b`` then
#: never wraps, and the breakpoints, computed exactly, are where the i64 values change.
SMALL = 1 << 31
#: The float dtypes a partitioned map may compute (its vector loads and stores widen and narrow them).
VECTOR_DTYPES = (DType.F32, DType.BF16, DType.F16)
_COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
_FLIP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}
_DIVIDE = ("mod", "div", "floordiv")

Path = tuple[tuple[ir.SExpr, bool], ...]  # the enclosing selects' uniform conditions and the arm taken


@dataclass(frozen=True)
class Wrap:
    """A tracked ``A % m`` or ``A / m``, ``A = a·d + b`` (``a`` = ±1): its quotient changes every ``m`` steps."""

    node: ir.Binary
    a: int
    b: ir.SExpr  # A at d = 0
    m: ir.SExpr


@dataclass
class Partition:
    """What the emitter needs: the tracked comparisons with their breakpoints, the wraps, and the loads
    it reads as contiguous vectors (with every path to each, so it can tell a piece where one is dead)."""

    axis: str
    conditions: dict[ir.SExpr, tuple[sympy.Expr, ...]] = field(default_factory=dict)  # comparison -> breakpoints
    # max/min of the axis and a plain value -> (the comparison that says which, whether it says the axis' side)
    choices: dict[ir.SExpr, tuple[ir.Binary, bool]] = field(default_factory=dict)
    wraps: dict[ir.SExpr, Wrap] = field(default_factory=dict)
    loads: dict[ir.SExpr, list[Path]] = field(default_factory=dict)  # contiguous loads -> where they occur
    wrap_paths: dict[ir.SExpr, list[Path]] = field(default_factory=dict)
    contained: set[ir.SExpr] = field(default_factory=set)  # wraps met only inside contiguous loads' subscripts
    outside: set[ir.SExpr] = field(default_factory=set)  # wraps met elsewhere too

    def breakpoints(self) -> list[sympy.Expr]:
        """The comparisons' breakpoints (in dims and ``%idx.<name>`` for outer indices), deduplicated (a
        wrap's first wrap after the start is another, :mod:`.partition_emit`'s)."""
        out: list[sympy.Expr] = []
        for bps in self.conditions.values():
            out += [b for b in bps if b not in out]
        return out

    def count(self) -> int:
        return len(self.breakpoints()) + len(self.wraps)


def _has(e: ir.SExpr, axis: str) -> bool:
    return any(isinstance(x, ir.Idx) and x.name == axis for x in ir.walk(e))


def plain(e: ir.SExpr, axis: str) -> bool:
    """Whether ``e`` is integer arithmetic of dims, constants and outer indices that cannot fail: the
    emitter computes it once per row (or once per call when it has no index) before any piece runs."""
    if isinstance(e, ir.Const):  # a huge offset could wrap (spec §9.3) where the pieces' exact arithmetic would not
        return e.dtype == DType.I64 and abs(int(e.value)) <= SMALL
    if isinstance(e, ir.DimRef):
        return e.dtype == DType.I64
    if isinstance(e, ir.Idx):
        return e.name != axis
    if isinstance(e, ir.Unary):
        return e.op == "neg" and e.dtype == DType.I64 and plain(e.x, axis)
    if isinstance(e, ir.Binary):
        return e.op in ("add", "sub", "mul", "max", "min") and e.dtype == DType.I64 and \
            plain(e.a, axis) and plain(e.b, axis)
    return False


def symbolic(e: ir.SExpr) -> sympy.Expr:
    """A :func:`plain` expression as a sympy expression: dims as they are, outer index ``i`` as ``%idx.i``
    (equal breakpoints are then found equal, however they were written)."""
    if isinstance(e, ir.Const):
        return sympy.Integer(int(e.value))
    if isinstance(e, ir.DimRef):
        return sympy.sympify(e.dim)
    if isinstance(e, ir.Idx):
        return sympy.Symbol(f"%idx.{e.name}", integer=True)
    if isinstance(e, ir.Unary):
        return -symbolic(e.x)
    assert isinstance(e, ir.Binary)
    a, b = symbolic(e.a), symbolic(e.b)
    return {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
            "max": lambda: sympy.Max(a, b), "min": lambda: sympy.Min(a, b)}[e.op]()


def at_zero(e: ir.SExpr, axis: str) -> ir.SExpr:
    """``e`` with the index ``axis`` replaced by 0."""
    zero = ir.Const(0, DType.I64)
    return map_expr(e, lambda x: zero if isinstance(x, ir.Idx) and x.name == axis else x)


def pure_coefficient(e: ir.SExpr, axis: str) -> int | None:
    """``e``'s coefficient of ``axis`` when ``e`` is ``c·axis + (plain terms)``, else None."""
    if not _has(e, axis):
        return 0 if plain(e, axis) else None
    if isinstance(e, ir.Idx):
        return 1
    if isinstance(e, ir.Unary) and e.op == "neg":
        c = pure_coefficient(e.x, axis)
        return None if c is None else -c
    if isinstance(e, ir.Binary) and e.dtype == DType.I64 and e.op in ("add", "sub", "mul"):
        ca, cb = pure_coefficient(e.a, axis), pure_coefficient(e.b, axis)
        if ca is None or cb is None:
            return None
        if e.op == "add":
            return ca + cb
        if e.op == "sub":
            return ca - cb
        k = e.b if ca else e.a
        return ca * int(k.value) if ca and isinstance(k, ir.Const) else \
            cb * int(k.value) if cb and isinstance(k, ir.Const) else None
    return None


def coefficient(e: ir.SExpr, p: Partition) -> int | None:
    """``e``'s coefficient of the axis when it is affine within every piece (tracked wraps are), else None."""
    axis = p.axis
    if not _has(e, axis):
        return 0
    if isinstance(e, ir.Idx):
        return 1
    if e in p.wraps:
        assert isinstance(e, ir.Binary)
        return 0 if e.op != "mod" else coefficient(e.a, p)
    if e in p.choices:
        assert isinstance(e, ir.Binary)
        return coefficient(e.a if p.choices[e][1] else e.b, p)
    if isinstance(e, ir.Select) and e.dtype == DType.I64 and uniform(e.cond, p):
        ca, cb = coefficient(e.a, p), coefficient(e.b, p)  # one arm per piece: affine where both agree
        return ca if ca == cb else None
    if isinstance(e, ir.Cast) and e.dtype == DType.I64 and e.x.dtype == DType.I64:
        return coefficient(e.x, p)
    if isinstance(e, ir.Unary) and e.op == "neg" and e.dtype == DType.I64:
        c = coefficient(e.x, p)
        return None if c is None else -c
    if isinstance(e, ir.Binary) and e.dtype == DType.I64 and e.op in ("add", "sub", "mul"):
        ca, cb = coefficient(e.a, p), coefficient(e.b, p)
        if ca is None or cb is None:
            return None
        if e.op != "mul":
            return ca + cb if e.op == "add" else ca - cb
        if ca and cb:
            return None
        k = e.b if ca else e.a
        return (ca or cb) * int(k.value) if isinstance(k, ir.Const) else None
    return None


def _condition(e: ir.Binary, axis: str) -> tuple[sympy.Expr, ...] | None:
    """The breakpoints of ``L op R`` when ``L - R`` is ``±axis + plain``: where its value may change."""
    if e.a.dtype != DType.I64 or e.b.dtype != DType.I64:
        return None
    ca, cb = pure_coefficient(e.a, axis), pure_coefficient(e.b, axis)
    if ca is None or cb is None or ca - cb not in (1, -1):
        return None
    l0, r0 = symbolic(at_zero(e.a, axis)), symbolic(at_zero(e.b, axis))
    # L - R = a·d + (l0 - r0): `d op t` with t = r0 - l0 (a = 1), or `d flip(op) t` with t = l0 - r0
    op, t = (e.op, sympy.expand(r0 - l0)) if ca - cb == 1 else (_FLIP[e.op], sympy.expand(l0 - r0))
    after = t + 1
    return {"lt": (t,), "ge": (t,), "le": (after,), "gt": (after,)}.get(op, (t, after))


def _wrap(e: ir.Binary, axis: str, lanes: int) -> Wrap | None:
    if e.dtype != DType.I64 or not plain(e.b, axis):
        return None
    if isinstance(e.b, ir.Const) and int(e.b.value) < 2 * lanes:
        return None  # a short constant period: LLVM's own vector code divides by it cheaply
    a = pure_coefficient(e.a, axis)
    return Wrap(e, a, at_zero(e.a, axis), e.b) if a in (1, -1) else None


def _choice(e: ir.Binary, p: Partition) -> None:
    """``max(A, B)`` (``min``) with one side ``±axis + plain`` and the other plain: one side per piece."""
    if e.dtype != DType.I64 or sum(_has(s, p.axis) for s in (e.a, e.b)) != 1:
        return
    main, other = (e.a, e.b) if _has(e.a, p.axis) else (e.b, e.a)
    if pure_coefficient(main, p.axis) not in (1, -1) or not plain(other, p.axis):
        return
    which = ir.Binary("ge" if e.op == "max" else "le", e.a, e.b, DType.BOOL)  # true: A is the value
    bps = _condition(which, p.axis)
    if bps is not None:
        p.conditions[which] = bps
        p.choices[e] = (which, main is e.a)


def uniform(e: ir.SExpr, p: Partition) -> bool:
    """Whether condition ``e`` has one value in every piece (its index enters only through tracked comparisons)."""
    if e in p.conditions or not _has(e, p.axis):
        return True
    if isinstance(e, ir.Binary) and e.op in ("and", "or"):
        return uniform(e.a, p) and uniform(e.b, p)
    return isinstance(e, ir.Unary) and e.op == "not" and uniform(e.x, p)


def contiguous(e: ir.Load, p: Partition) -> bool:
    """A load the pieces read as one vector: its last subscript the axis plus a per-piece offset, the others
    free of the axis, a float type (widened in vector code)."""
    if not e.indices or e.dtype not in VECTOR_DTYPES or any(_has(s, p.axis) for s in e.indices[:-1]):
        return False
    return coefficient(e.indices[-1], p) == 1


def analyse(op: ir.MapOp, lanes: int) -> Partition | None:
    """The partition of ``op``'s last index, or None when there is nothing to gain (or too much to split)."""
    if not op.axes or op.dtype not in VECTOR_DTYPES:
        return None
    axis = op.axes[-1].name
    p = Partition(axis)
    for x in ir.walk(op.body):
        if isinstance(x, ir.Binary) and x.op in _COMPARE and _has(x, axis) and x not in p.conditions:
            bps = _condition(x, axis)
            if bps is not None:
                p.conditions[x] = bps
        elif isinstance(x, ir.Binary) and x.op in _DIVIDE and _has(x.a, axis) and x not in p.wraps:
            w = _wrap(x, axis, lanes)
            if w is not None:
                p.wraps[x] = w
        elif isinstance(x, ir.Binary) and x.op in ("max", "min") and _has(x, axis) and x not in p.choices:
            _choice(x, p)
    if not (p.conditions or p.wraps):
        return None
    if p.count() > MAX_BREAKPOINTS:
        return None
    _occurrences(op.body, p, (), False)
    p.contained -= p.outside
    return p


def _occurrences(e: ir.SExpr, p: Partition, path: Path, in_load: bool) -> None:
    """Record where each contiguous load and each wrap occurs: the uniform conditions above it."""
    if isinstance(e, ir.Load) and contiguous(e, p):
        p.loads.setdefault(e, []).append(path)
        for s in e.indices:
            _occurrences(s, p, path, True)
        return
    if e in p.wraps:
        p.wrap_paths.setdefault(e, []).append(path)
        (p.contained if in_load else p.outside).add(e)
    if isinstance(e, ir.Select) and uniform(e.cond, p):
        _occurrences(e.cond, p, path, in_load)
        _occurrences(e.a, p, (*path, (e.cond, True)), in_load)
        _occurrences(e.b, p, (*path, (e.cond, False)), in_load)
        return
    for c in ir.children(e):
        _occurrences(c, p, path, in_load and not isinstance(e, ir.Load))
