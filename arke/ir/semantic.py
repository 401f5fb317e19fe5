"""SemanticIR: what a kernel computes, as SSA over tensors with symbolic shapes.

A :class:`Module` holds :class:`Function` s (one per kernel). A function's body is a
straight list of ops, each defining new SSA values:

* :class:`MapOp` — an elementwise expression over a domain of named axes
  (``%2 = map [m < M, n < N] f32 { %x[m, n] * %1[m] }``). Loads may permute, broadcast
  (an axis missing from a load's subscripts), offset or gather (a subscript that reads
  another tensor): index and layout ops are maps whose body is one load.
* :class:`ReduceOp` — a reduction (``sum max min prod``, or the arg-reductions ``argmax
  argmin``, which give an ``i64`` position) of an elementwise body over extra axes.
* :class:`ContractOp` — a sum of products of two loads (matmul, bmm, attention's ``QKᵀ``).
  Equivalent to a ``ReduceOp(sum)`` of ``lhs * rhs``; kept apart because every target
  lowers it differently.
* :class:`ScanOp` — a scan (``cumsum cumprod cummax cummin`` or the linear recurrence
  ``h = a * h + b``) of an elementwise body along one of its axes.
* :class:`CallOp` — a call of another kernel of the module.

Scalar bodies are trees of :class:`SExpr` nodes, each carrying its dtype. Everything is a
frozen dataclass: passes build new IR, never mutate. ``arke.ir.text`` prints and reads
the canonical text form; ``arke.ir.verify`` checks the invariants.

Dtype semantics (the interpreter implements exactly this): arithmetic on ``f16``/``bf16``
runs in ``f32`` and is rounded to the op's dtype when the op's result is stored; sums of
floats accumulate in ``f32``; integer ``div`` is floor division and ``mod`` is Python's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from arke.ir.dtypes import DType
from arke.ir.shapes import Dim

FORMAT_VERSION = 1

# ---------------------------------------------------------------- types


@dataclass(frozen=True)
class TensorType:
    """``f32[M, N]``; a scalar is a tensor of rank 0 (``shape == ()``)."""

    dtype: DType
    shape: tuple[Dim, ...] = ()

    @property
    def rank(self) -> int:
        return len(self.shape)


# ---------------------------------------------------------------- scalar expressions

#: Unary ops: name -> meaning. Math functions take and give floats; ``not`` bools.
UNARY_OPS: dict[str, str] = {
    "neg": "-x",
    "not": "logical not",
    "abs": "|x|",
    "exp": "e**x",
    "log": "natural logarithm",
    "sqrt": "square root",
    "rsqrt": "1 / sqrt(x)",
    "tanh": "hyperbolic tangent",
    "erf": "error function",
    "sigmoid": "1 / (1 + exp(-x))",
    "silu": "x * sigmoid(x)",
    "gelu": "x * (1 + erf(x / sqrt(2))) / 2 (the exact, erf form)",
    "relu": "max(x, 0)",
    "sin": "sine",
    "cos": "cosine",
    "floor": "round toward -inf (stays float)",
    "ceil": "round toward +inf (stays float)",
    "exp2": "2**x",
    "log2": "base-2 logarithm",
    "bitnot": "~x: every bit of an integer flipped",
}

#: Binary ops: name -> meaning. Comparisons give bool; ``and``/``or`` take bools.
BINARY_OPS: dict[str, str] = {
    "add": "a + b",
    "sub": "a - b",
    "mul": "a * b",
    "div": "a / b (floor division on integers)",
    "floordiv": "floor(a / b)",
    "mod": "a - floor(a / b) * b (Python's sign rule)",
    "pow": "a ** b",
    "max": "larger of a and b",
    "min": "smaller of a and b",
    "eq": "a == b",
    "ne": "a != b",
    "lt": "a < b",
    "le": "a <= b",
    "gt": "a > b",
    "ge": "a >= b",
    "and": "a and b",
    "or": "a or b",
    "bitand": "a & b (integers)",
    "bitor": "a | b (integers)",
    "bitxor": "a ^ b (integers)",
    "shl": "a << b: a * 2**b wrapped to a's type; the count b is i64, 0 <= b < a's width (else an error)",
    "shr": "a >> b: floor(a / 2**b), arithmetic on signed and logical on unsigned a; b as for shl",
}

COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
#: Binary ops on integers only; the shifts' count is an ``i64`` whatever the shifted type.
BITWISE = frozenset({"bitand", "bitor", "bitxor", "shl", "shr"})
SHIFTS = frozenset({"shl", "shr"})


@dataclass(frozen=True)
class Const:
    """A literal. Floats may be ``inf``/``-inf``."""

    value: float | int | bool
    dtype: DType


@dataclass(frozen=True)
class Idx:
    """The current position along a named axis of the op's domain (an ``i64``)."""

    name: str
    dtype: DType = DType.I64


@dataclass(frozen=True)
class DimRef:
    """A symbolic dim used as a value, as in ``sqrt(D)`` or ``j <= i + T - S`` (an ``i64``)."""

    dim: Dim
    dtype: DType = DType.I64


@dataclass(frozen=True)
class Load:
    """An element of SSA value ``src`` (``%3`` or a parameter ``%x``) at computed subscripts."""

    src: str
    indices: tuple[SExpr, ...]
    dtype: DType


@dataclass(frozen=True)
class Unary:
    op: str
    x: SExpr
    dtype: DType


@dataclass(frozen=True)
class Binary:
    op: str
    a: SExpr
    b: SExpr
    dtype: DType


@dataclass(frozen=True)
class Select:
    """``a if cond else b``."""

    cond: SExpr
    a: SExpr
    b: SExpr
    dtype: DType


@dataclass(frozen=True)
class Cast:
    x: SExpr
    dtype: DType


SExpr = Const | Idx | DimRef | Load | Unary | Binary | Select | Cast

def children(e: SExpr) -> tuple[SExpr, ...]:
    """The direct sub-expressions of ``e`` (a load's subscripts, an operator's operands)."""
    if isinstance(e, Load):
        return e.indices
    if isinstance(e, Unary | Cast):
        return (e.x,)
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    return ()


def depth(e: SExpr) -> int:
    """How deeply ``e`` nests (a leaf: 1), counted without recursion (a chain of thousands of ``+`` is one)."""
    deepest, stack = 0, [(e, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((c, d + 1) for c in children(node))
    return deepest


def walk(e: SExpr) -> Iterator[SExpr]:
    """Every node of ``e``, parents before children."""
    yield e
    for c in children(e):
        yield from walk(c)


# ---------------------------------------------------------------- ops


@dataclass(frozen=True)
class Axis:
    """A named axis of an op's domain: ``name`` runs over ``0 <= name < extent``."""

    name: str
    extent: Dim


@dataclass(frozen=True)
class MapOp:
    """``result[axes] = body``."""

    result: str
    dtype: DType
    axes: tuple[Axis, ...]
    body: SExpr
    name: str | None = None  # the source tensor's name, for messages and readable IR

    @property
    def type(self) -> TensorType:
        return TensorType(self.dtype, tuple(a.extent for a in self.axes))


REDUCE_KINDS = ("sum", "max", "min", "prod")
#: The arg-reductions: an ``i64`` position along the one reduce axis (the first largest /
#: smallest value; a NaN beats every number, the first NaN wins; 0 over an empty axis).
ARG_KINDS = ("argmax", "argmin")
#: The top-k selections (spec/language.md §8.3): the op's *last* axis is the rank ``j < K``, which
#: the body does not use; ``topk``/``bottomk`` give the ``j``-th largest / smallest value (the
#: body's dtype), ``argtopk``/``argbottomk`` its ``i64`` position along the one reduce axis. NaN
#: is larger than every number; ties go to the lower position.
TOPK_KINDS = ("topk", "bottomk", "argtopk", "argbottomk")
#: Every kind a :class:`ReduceOp` may have.
ALL_REDUCE_KINDS = REDUCE_KINDS + ARG_KINDS + TOPK_KINDS


@dataclass(frozen=True)
class ReduceOp:
    """``result[axes] = kind(body for reduce_axes)``, in a fixed order; empty ranges give the identity.

    ``limits`` bound some reduce axes by a length (spec/language.md §8.11): ``(axis, n)``, an
    integer expression over ``axes`` only, says the axis runs over ``0 <= axis < min(max(n, 0),
    extent)``; the body is not evaluated past it.
    """

    result: str
    dtype: DType
    kind: str
    axes: tuple[Axis, ...]
    reduce_axes: tuple[Axis, ...]
    body: SExpr
    name: str | None = None
    limits: tuple[tuple[str, SExpr], ...] = ()

    def limit(self, axis: str) -> SExpr | None:
        """The length bounding reduce axis ``axis``, if it has one."""
        return dict(self.limits).get(axis)

    @property
    def type(self) -> TensorType:
        return TensorType(self.dtype, tuple(a.extent for a in self.axes))


@dataclass(frozen=True)
class ContractOp:
    """``result[axes] = sum(lhs * rhs for reduce_axes)``: matmul and friends, accumulated in f32 for floats."""

    result: str
    dtype: DType
    axes: tuple[Axis, ...]
    reduce_axes: tuple[Axis, ...]
    lhs: Load
    rhs: Load
    name: str | None = None

    @property
    def type(self) -> TensorType:
        return TensorType(self.dtype, tuple(a.extent for a in self.axes))


SCAN_KINDS = ("sum", "prod", "max", "min", "linear")


@dataclass(frozen=True)
class ScanOp:
    """``result[axes]``: the scan of ``body`` along ``axis`` (one of ``axes``), the other axes fixed.

    ``sum prod max min``: ``r[.., n, ..] = body[.., 0, ..] op … op body[.., n, ..]``; ``linear``:
    ``h[n] = coeff[n] * h[n - 1] + body[n]`` with ``h[-1] = init`` (which does not use ``axis``).
    ``exclusive``: position ``n`` holds the value before step ``n`` (the identity, or ``init``, at 0).
    Computed in sequence, floats in f32 and integers in i64 (spec/language.md §8.9).
    """

    result: str
    dtype: DType
    kind: str
    axes: tuple[Axis, ...]
    axis: str
    body: SExpr
    coeff: SExpr | None = None
    init: SExpr | None = None
    exclusive: bool = False
    name: str | None = None

    @property
    def type(self) -> TensorType:
        return TensorType(self.dtype, tuple(a.extent for a in self.axes))

    @property
    def exprs(self) -> tuple[SExpr, ...]:
        """The op's expressions as printed: ``(coeff, body, init)`` for ``linear``, else ``(body,)``."""
        if self.coeff is not None and self.init is not None:
            return (self.coeff, self.body, self.init)
        return (self.body,)

    @property
    def reduce_axes(self) -> tuple[Axis, ...]:
        """None: a scan's domain is its result's axes (code that walks ``axes + reduce_axes`` sees just those)."""
        return ()

    @property
    def scan_axis(self) -> Axis:
        return next(a for a in self.axes if a.name == self.axis)


@dataclass(frozen=True)
class CallOp:
    """``results = callee(args)``; ``dims`` binds each callee dim symbol to a caller dim."""

    results: tuple[str, ...]
    types: tuple[TensorType, ...]
    callee: str
    args: tuple[str, ...]
    dims: tuple[tuple[str, Dim], ...] = ()
    name: str | None = None


Op = MapOp | ReduceOp | ContractOp | ScanOp | CallOp


def op_exprs(op: Op) -> tuple[SExpr, ...]:
    """The scalar expressions of an op: a map's or reduce's body, a scan's, a contract's two loads, none for a call."""
    if isinstance(op, ContractOp):
        return (op.lhs, op.rhs)
    if isinstance(op, CallOp):
        return ()
    if isinstance(op, ScanOp):
        return op.exprs
    if isinstance(op, ReduceOp) and op.limits:
        return (op.body, *(e for _, e in op.limits))
    return (op.body,)


def op_results(op: Op) -> tuple[tuple[str, TensorType], ...]:
    """The values an op defines, with their types."""
    if isinstance(op, CallOp):
        return tuple(zip(op.results, op.types))
    return ((op.result, op.type),)


# ---------------------------------------------------------------- conditions over dims


@dataclass(frozen=True)
class Rel:
    """``lhs op rhs`` over dims; op one of ``== != < <= > >=``."""

    op: str
    lhs: Dim
    rhs: Dim


@dataclass(frozen=True)
class InSet:
    """``x in {64, 128}``."""

    x: Dim
    values: tuple[Dim, ...]


@dataclass(frozen=True)
class BoolOp:
    """``and`` / ``or`` of conditions, or ``not`` of one."""

    op: str
    parts: tuple[Cond, ...]


Cond = Rel | InSet | BoolOp


@dataclass(frozen=True)
class Guard:
    """A `where` clause that could not be proved at compile time: checked before every run.

    ``text`` is the clause as the user wrote it, for the message when it fails.
    """

    cond: Cond
    text: str


# ---------------------------------------------------------------- functions and modules


@dataclass(frozen=True)
class Param:
    """A kernel parameter ``%name``; scalars have rank 0 and may carry a default."""

    name: str
    type: TensorType
    default: float | int | bool | None = None


@dataclass(frozen=True)
class DimBinding:
    """Where a dim symbol's value comes from at run time: ``param``'s axis ``axis``."""

    dim: str
    param: str
    axis: int


@dataclass(frozen=True)
class Function:
    """One kernel: parameters, dim bindings, guards, ops, and the values it returns."""

    name: str
    params: tuple[Param, ...]
    bindings: tuple[DimBinding, ...]
    guards: tuple[Guard, ...]
    ops: tuple[Op, ...]
    results: tuple[str, ...]
    result_types: tuple[TensorType, ...]
    output_names: tuple[str | None, ...] = ()
    #: a generic kernel's specialisation (language spec §5.6): each dtype variable and the dtype it
    #: stands for here, in declaration order; empty for a kernel that is not generic
    specialisation: tuple[tuple[str, DType], ...] = ()

    def value_types(self) -> dict[str, TensorType]:
        """Every SSA value's type: parameters first, then op results in order."""
        types = {p.name: p.type for p in self.params}
        for op in self.ops:
            types.update(op_results(op))
        return types


@dataclass(frozen=True)
class Module:
    """The kernels of one `.ak` file and of everything it imports (callees included)."""

    functions: tuple[Function, ...]
    version: int = field(default=FORMAT_VERSION)

    def get(self, name: str) -> Function:
        for f in self.functions:
            if f.name == name:
                return f
        raise KeyError(name)
