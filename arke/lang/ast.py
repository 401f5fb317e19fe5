"""The abstract syntax tree of a `.ak` file: frozen dataclasses, each with its source span.

The parser (``arke.lang.parser``) builds these from the Lark tree; the checker reads them.
Nothing here knows about types or shapes: that is the checker's job.
"""

from __future__ import annotations

from dataclasses import dataclass

from arke.lang.source import Span

# ---------------------------------------------------------------- expressions


@dataclass(frozen=True)
class Expr:
    span: Span


@dataclass(frozen=True)
class Name(Expr):
    """A bare name: a tensor, scalar, dim, index or `let` binding (resolved by the checker)."""

    id: str


@dataclass(frozen=True)
class Num(Expr):
    """A numeric literal. ``is_int`` is true for `3`, false for `3.0`, `1e-6` and `inf`.

    ``text`` is the literal as written (with a folded sign), for messages. An integer of more
    than :data:`MAX_INT_DIGITS` digits is never converted: its ``value`` is ``±10**MAX_INT_DIGITS``,
    which no dtype holds, so the checker reports it (quoting ``text``) wherever it is used.
    """

    value: float | int
    is_int: bool
    text: str = ""


# No integer type holds more than 19 digits; longer literals keep a stand-in value (see Num).
MAX_INT_DIGITS = 40


def int_value(digits: str) -> int:
    """The value of a decimal integer literal, or ``10**MAX_INT_DIGITS`` when it is longer than that.

    Never ``int()`` of an unbounded digit string: Python refuses more than 4300 digits, and the
    conversion is quadratic.
    """
    significant = digits.lstrip("0") or "0"
    return int(significant) if len(significant) <= MAX_INT_DIGITS else 10**MAX_INT_DIGITS


def shown(text: str, limit: int = 24) -> str:
    """A literal's text for a message: itself when short, else its ends and its length."""
    if len(text) <= limit:
        return text
    return f"{text[:10]}…{text[-6:]} ({len(text)} characters)"


@dataclass(frozen=True)
class Index(Expr):
    """``name[e0, e1, ...]``: an element of a tensor; indices may be expressions or gathers."""

    name: str
    name_span: Span
    indices: tuple[Expr, ...]


@dataclass(frozen=True)
class Call(Expr):
    """``f(a, b)``: a math function, a cast (`f32(x)`), `transpose`, or a kernel call.

    ``func`` may be qualified (``std.nn.rmsnorm``).
    """

    func: str
    func_span: Span
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Option(Expr):
    """``name = value`` after the indices of a scan: an option (``exclusive = true``) or the carry (``h = 0.0``)."""

    name: str
    name_span: Span
    value: Expr


@dataclass(frozen=True)
class Bound(Expr):
    """``j < n`` after ``for``: a length bounding the reduction index ``j`` (spec §8.11); ``op``
    is the comparison written (only ``<`` is valid, the checker says so)."""

    name: str
    name_span: Span
    op: str
    value: Expr


#: The names that make ``name(body for i, ...)`` a :class:`Scan` rather than a :class:`Reduce`.
SCANS = ("cumsum", "cumprod", "cummax", "cummin", "scan")


@dataclass(frozen=True)
class Reduce(Expr):
    """``op(body for i, j)``: a reduction (sum, max, min, mean, prod) over the named indices.

    ``options`` are ``name = value`` items after the indices, which no reduction takes (the checker says so).
    """

    op: str
    op_span: Span
    body: Expr
    indices: tuple[str, ...]
    index_spans: tuple[Span, ...]
    options: tuple[Option, ...] = ()
    bounds: tuple[Bound, ...] = ()  # lengths of some of the indices (spec §8.11)


@dataclass(frozen=True)
class Scan(Expr):
    """``op(body for n, options)``: a scan (``cumsum cumprod cummax cummin scan``, spec §8.9) along ``n``.

    Unlike a reduction it binds nothing: ``n`` is an index bound around it, which its value keeps.
    """

    op: str
    op_span: Span
    body: Expr
    indices: tuple[str, ...]
    index_spans: tuple[Span, ...]
    options: tuple[Option, ...] = ()
    bounds: tuple[Bound, ...] = ()  # scans take none (AK2114); kept to say so


@dataclass(frozen=True)
class Unary(Expr):
    """``-x``, ``+x``, ``~x`` or ``not x``."""

    op: str
    operand: Expr


@dataclass(frozen=True)
class Binary(Expr):
    """Arithmetic (``+ - * / // % ** @``), bitwise (``& | ^ << >>``), comparisons and ``and``/``or``."""

    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Ternary(Expr):
    """``a if cond else b``."""

    cond: Expr
    then: Expr
    other: Expr


@dataclass(frozen=True)
class InSet(Expr):
    """``x in {64, 128}`` (in `where` clauses and strategy conditions)."""

    operand: Expr
    values: tuple[Expr, ...]


# ---------------------------------------------------------------- declarations


@dataclass(frozen=True)
class TypeExpr:
    """``f32[M, N]`` (``dims`` a tuple) or ``f32`` (a scalar: ``dims`` is None)."""

    dtype: str
    dtype_span: Span
    dims: tuple[Expr, ...] | None
    span: Span


@dataclass(frozen=True)
class Param:
    name: str
    type: TypeExpr
    default: Expr | None
    span: Span


@dataclass(frozen=True)
class Output:
    name: str | None
    type: TypeExpr
    span: Span


@dataclass(frozen=True)
class Stmt:
    span: Span


@dataclass(frozen=True)
class Let(Stmt):
    """``let R = H / G``: a name for a dim expression or a scalar value."""

    name: str
    name_span: Span
    value: Expr


@dataclass(frozen=True)
class Define(Stmt):
    """``y[i, j] = expr``: defines every element of a new tensor ``y``."""

    name: str
    name_span: Span
    indices: tuple[str, ...]
    index_spans: tuple[Span, ...]
    value: Expr
    type: TypeExpr | None = None  # a declared shape, ``t[i, j]: f32[M, N] = ...`` (spec §7.3)


@dataclass(frozen=True)
class Assign(Stmt):
    """``h = expr``: a whole-tensor (or scalar) definition."""

    name: str
    name_span: Span
    value: Expr


@dataclass(frozen=True)
class MultiAssign(Stmt):
    """``a, b = f(x)``: the outputs of a kernel with several results."""

    names: tuple[str, ...]
    name_spans: tuple[Span, ...]
    value: Expr


@dataclass(frozen=True)
class Return(Stmt):
    values: tuple[Expr, ...]


@dataclass(frozen=True)
class Kernel:
    name: str
    name_span: Span
    params: tuple[Param, ...]
    outputs: tuple[Output, ...]
    where: tuple[Expr, ...]
    body: tuple[Stmt, ...]
    span: Span
    #: the body has a syntax error: only the header (read up to the body's `{`) is here, so
    #: the signature is still checked and callers still see it, but not the body
    body_broken: bool = False


# ---------------------------------------------------------------- strategies


@dataclass(frozen=True)
class DecisionItem:
    """``i = 128`` inside ``tile i = 128, j = 64``; ``value`` is None in ``parallel m``."""

    name: str
    value: int | str | tuple[int, ...] | None
    span: Span


@dataclass(frozen=True)
class Decision:
    """One line of a strategy: ``warps = 8`` (``value``) or ``tile i = 128, j = 64`` (``items``)."""

    name: str
    name_span: Span
    value: int | str | tuple[int, ...] | None
    items: tuple[DecisionItem, ...]
    span: Span


@dataclass(frozen=True)
class Strategy:
    kernel: str
    kernel_span: Span
    target: str | None
    target_span: Span | None
    when: Expr | None
    decisions: tuple[Decision, ...]
    span: Span


@dataclass(frozen=True)
class Import:
    """``import std.nn`` (``names`` None: everything) or ``from std.nn import rmsnorm``."""

    module: str
    names: tuple[str, ...] | None
    span: Span


@dataclass(frozen=True)
class Module:
    path: str
    imports: tuple[Import, ...]
    kernels: tuple[Kernel, ...]
    strategies: tuple[Strategy, ...]
