"""The attention family: scaled dot-product attention recognised from plain math.

Attention is written as ordinary ops (``arke/stdlib/attention.ak``); after inlining and
fusion a kernel's ops contain, in order,

* the *scores* ``s[a.., i, j] = sum(q * k for d)`` (a :class:`~arke.ir.semantic.ContractOp`
  or a ``reduce.sum`` of a product), where the factor ``q`` depends on ``i`` and not ``j``, ``k``
  on ``j`` and not ``i``, and ``a..`` are batch axes (batch, heads) that may appear anywhere,
  through any subscript expression (GQA reads ``k[b, h / R, j, d]``). ``q`` and ``k`` are
  usually loads, but may be any expressions (a norm or rotary embedding the fusion pass
  folded in): the renderer then computes their rows instead of reading them in place;
* the row maximum ``mx[a.., i] = max(f for j)`` of an elementwise *score expression* ``f``
  of ``s[a.., i, j]``, the indices and dims (a scale, a causal or any other mask written
  ``select(cond, x, -inf)``, softcapping ...);
* ``p = exp(f - mx)``, as a map of its own or already folded into its two readers;
* ``o[a.., i, e] = sum(p * v[.., j, e] for j)`` (a reduction or a contraction of ``p`` and
  ``v``) and ``l[a.., i] = sum(p for j)``, in either order;
* the result ``o / l`` (or ``o * (1 / l)``), stored as f32 or rounded to a 16-bit float
  (``bf16(o / l)``).

``q``, ``k`` and ``v`` may be 16-bit loads widened to f32 (``f32(k[..])``): the sums stay
f32, as the interpreter computes them; a renderer may feed the 16-bit blocks to its matrix
units (exact products, f32 accumulation).

Maps between the scores and the result are inlined into their readers before matching, so
the match is on the math, never on names or the way the source split it into statements.
Every axis is renamed to a *role* (``A0 A1 ..`` batch, ``I`` query, ``J`` key, ``D`` the
contracted feature, ``E`` the value feature), and the pieces must agree exactly after
renaming. Intermediates that another op reads or that the kernel returns stop the match
(the generic path keeps them), and so does anything the attention renderer could not
address directly (a non-f32 value, ``v`` not a load with its feature axis innermost).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from arke.ir import semantic as ir
from arke.ir import strategy as sir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, equal, floordiv
from arke.passes.fuse import fold
from arke.passes.rewrite import map_expr
from arke.plan.attention_bounds import KeyBound, _bounds, unmasked
from arke.plan.dispatch import Dispatch, PlanOp, parallel_axis
from arke.plan.paged import masked_score, row_addressed, shared_limit

QUERY, KEY, FEATURE, VALUE = "I", "J", "D", "E"  # attention_bounds.KEY is this KEY
F32 = DType.F32
HALF = (DType.BF16, DType.F16)
#: The longest run of ops an attention core can span (scores, maps, three reductions, result).
MAX_OPS = 12


@dataclass(frozen=True)
class Attention:
    """A matched attention core, every axis renamed to its role (see the module doc).

    ``score`` is ``f``: its leaf ``Load(scores, (A.., I, J))`` stands for the raw score;
    ``q`` and ``k`` the two factors of the scores' sum over ``D``.
    ``group``/``group_size``: the batch role whose runs of ``group_size`` consecutive values
    read the same ``k``/``v`` (GQA's heads, ``R``), or None. ``bounds`` are the key ranges the
    mask allows (empty: no tile is ever skipped). ``out_axes``: the roles of the result's axes.
    """

    batch: tuple[str, ...]
    score_axes: tuple[str, ...]  # the roles of the scores' axes, in order
    extents: tuple[tuple[str, Dim], ...]
    q: ir.SExpr  # over (A.., I, D): a load, or any expression (a fused norm, rotary embedding ...)
    k: ir.SExpr  # over (A.., J, D)
    v: ir.Load
    q_direct: bool  # q is a plain load the scores can read in place (else rows are computed per task)
    k_direct: bool  # k is a plain load with D innermost (else each key row is computed as it is packed)
    scores: str
    score: ir.SExpr
    group: str | None
    group_size: Dim | None
    bounds: tuple[KeyBound, ...]
    out: str
    out_axes: tuple[str, ...]
    recip: bool
    key_index: str  # the kernel's name of the key index (a `split j = n` decision names it)
    out_dtype: DType = F32  # the result's storage: f32, or bf16/f16 (rounded from the f32 ``o / l``)
    q_half: ir.Load | None = None  # q is ``f32(q_half)``, a directly addressed 16-bit load
    k_half: ir.Load | None = None  # k likewise (D innermost)
    k_rows: bool = False  # k is row-addressed (through a block table: :mod:`arke.plan.paged`), read in place
    v_rows: bool = False  # v likewise

    @property
    def inner(self) -> ir.SExpr | None:
        """``score`` at a key inside every one of its row's :attr:`bounds`: the masks they came from
        taken away (``select(j <= i + c, x, -inf)`` is ``x`` there), or None when no mask is only bounds.
        A tile whose keys are inside every row's bounds needs no mask test (``unmasked``)."""
        return unmasked(self.score, self.bounds) if self.bounds else None

    @property
    def v_dtype(self) -> DType:
        """The storage dtype of ``v`` (f32, bf16 or f16; widened to f32 as it is read)."""
        return self.v.dtype

    def extent(self, role: str) -> Dim:
        return dict(self.extents)[role]

    @property
    def score_load(self) -> ir.Load:
        return ir.Load(self.scores, tuple(ir.Idx(r) for r in self.score_axes), F32)


class _NoMatch(Exception):
    """Raised anywhere inside the matcher: this window is not an attention core."""


def _need(cond: bool) -> None:
    if not cond:
        raise _NoMatch


def match_attention(fn: ir.Function, ops: list[PlanOp], start: int, strategy: sir.Strategy | None,
                    paged: bool = False) -> Dispatch | None:
    """The attention core that starts at ``ops[start]``, or None (the generic path then runs it).
    ``paged``: the renderer reads k/v through a block table and honours lengths (:mod:`.paged`)."""
    if _score_parts(ops[start]) is None:
        return None
    for end in range(start + 4, min(len(ops), start + MAX_OPS) + 1):
        if not isinstance(ops[end - 1], ir.MapOp):
            continue
        try:
            pattern = _match_window(fn, ops, start, end, paged)
        except _NoMatch:
            continue
        window = tuple(ops[start:end])
        last = window[-1]
        return Dispatch(op=last, family="attention", parallel=parallel_axis(last, strategy), ops=window,
                        pattern=pattern, internal=tuple(op.result for op in window[:-1]))
    return None


def _score_parts(op: PlanOp) -> tuple[ir.SExpr, ir.SExpr] | None:
    """The two factors of a sum of products over one axis, with at least two result axes."""
    if len(op.axes) < 2 or isinstance(op, ir.MapOp) or len(op.reduce_axes) != 1 or op.dtype != F32:
        return None
    if isinstance(op, ir.ContractOp):
        return op.lhs, op.rhs
    if op.kind != "sum" or not isinstance(op.body, ir.Binary) or op.body.op != "mul":
        return None
    return op.body.a, op.body.b


def _match_window(fn: ir.Function, ops: list[PlanOp], start: int, end: int, paged: bool = False) -> Attention:
    window = ops[start:end]
    inside = {op.result for op in window[:-1]}
    _need(not inside & set(fn.results))
    _need(all(not _reads(op, inside) for op in ops[end:]))
    _need(all(op.dtype == F32 for op in window[:-1]) and window[-1].dtype in (F32, *HALF))
    score_op = window[0]
    parts = _score_parts(score_op)
    _need(parts is not None)
    assert parts is not None and not isinstance(score_op, ir.MapOp)
    _need(not isinstance(score_op, ir.ReduceOp) or not score_op.limits)
    # Inline the window's maps into their readers (last first: a fold moves loads of earlier maps).
    rest: list[PlanOp] = [_as_reduce(op) for op in window[1:]]  # o may come as a contraction of p and v
    gone: set[int] = set()
    for at in reversed(range(len(rest) - 1)):
        producer = rest[at]
        if isinstance(producer, ir.MapOp):
            readers = [n for n, op in enumerate(rest) if n > at and _reads(op, {producer.result})]
            for n in readers:
                folded = fold(rest[n], producer)
                assert isinstance(folded, ir.MapOp | ir.ReduceOp)
                rest[n] = folded
            gone.add(at)
    out_op = rest[-1]
    reduces = [op for n, op in enumerate(rest[:-1]) if n not in gone]
    _need(isinstance(out_op, ir.MapOp) and len(reduces) == 3 and all(isinstance(op, ir.ReduceOp) for op in reduces))
    assert isinstance(out_op, ir.MapOp)
    maxes = [op for op in reduces if isinstance(op, ir.ReduceOp) and op.kind == "max"]
    sums = [op for op in reduces if isinstance(op, ir.ReduceOp) and op.kind == "sum"]
    _need(len(maxes) == 1 and len(sums) == 2)

    # The key axis is the one the row max reduces; the query axis the other one only one operand names.
    names = [a.name for a in score_op.axes]
    mx = maxes[0]
    j_name = _key_axis(mx, score_op.result, names)
    used = [{x.name for x in ir.walk(load) if isinstance(x, ir.Idx)} for load in parts]
    only = {n for n in names if (n in used[0]) != (n in used[1])}
    # decode without a query axis (q[b, h, e]): on paged targets the query role has extent 1
    _need((len(only) == 2 or (paged and len(only) == 1)) and j_name in only)
    i_name = (only - {j_name}).pop() if len(only) == 2 else ""
    batch_names = [n for n in names if n not in (i_name, j_name)]
    batch = tuple(f"A{n}" for n in range(len(batch_names)))
    smap = dict(zip(batch_names, batch)) | {i_name: QUERY, j_name: KEY, score_op.reduce_axes[0].name: FEATURE}
    roles = tuple(smap[n] for n in names)
    extents: dict[str, Dim] = {smap[a.name]: a.extent for a in score_op.axes}
    extents[FEATURE] = score_op.reduce_axes[0].extent
    extents.setdefault(QUERY, sympy.Integer(1))
    q_plain = {QUERY, FEATURE} if i_name else {FEATURE}
    q, k = (_rename(x, smap) for x in parts)
    if _uses(q, KEY) or _uses(k, QUERY):
        q, k = k, q
    _need(not _uses(q, KEY) and not _uses(k, QUERY))
    _factor(q, inside)
    _factor(k, inside)
    q_direct = _direct(fn, q, q_plain, extents)
    k_direct = _direct(fn, k, {KEY, FEATURE}, extents, last=FEATURE)
    q_half = _widened(q) if _direct(fn, _widened(q), q_plain, extents) else None
    k_half = _widened(k) if _direct(fn, _widened(k), {KEY, FEATURE}, extents, last=FEATURE) else None

    mmap = _map_from(mx, score_op.result, [*roles])
    _need(mmap.get(mx.reduce_axes[0].name) == KEY and sorted(mmap.values()) == sorted(roles))
    _same_extents(mx, mmap, extents)
    score = _rename(mx.body, mmap)
    _need(score.dtype == F32)
    canon_s = ir.Load(score_op.result, tuple(ir.Idx(r) for r in roles), F32)
    for x in ir.walk(score):
        if isinstance(x, ir.Load) and x.src == score_op.result:
            _need(x == canon_s)
        elif isinstance(x, ir.Load):
            _need(x.src not in inside and not _uses(x, FEATURE))
    mx_roles = [mmap[a.name] for a in mx.axes]
    canon_m = ir.Load(mx.result, tuple(ir.Idx(r) for r in mx_roles), F32)
    p = ir.Unary("exp", ir.Binary("sub", score, canon_m, F32), F32)
    limits = [_rename(lim, mmap) if (lim := mx.limit(mx.reduce_axes[0].name)) is not None else None]

    o_op = l_op = v = None
    for op in sums:
        xmap = _map_from(op, mx.result, mx_roles)
        _need(op.reduce_axes[0].name not in xmap)
        xmap[op.reduce_axes[0].name] = KEY
        free = [a for a in op.axes if a.name not in xmap]
        _need(len(free) <= 1)
        if free:
            xmap[free[0].name] = VALUE
            extents[VALUE] = free[0].extent
        _need(sorted(xmap.values()) == sorted([*roles, VALUE] if free else roles))
        _same_extents(op, xmap, extents)
        limits.append(_rename(lim, xmap) if (lim := op.limit(op.reduce_axes[0].name)) is not None else None)
        body = _rename(op.body, xmap)
        if not free and body == p:
            l_op = (op, xmap)
        elif free and isinstance(body, ir.Binary) and body.op == "mul" and p in (body.a, body.b):
            v = body.b if body.a == p else body.a
            if _widened(v) is not None:
                v = _widened(v)
            _need(isinstance(v, ir.Load))
            o_op = (op, xmap)
    _need(o_op is not None and l_op is not None and v is not None)
    assert o_op is not None and l_op is not None and isinstance(v, ir.Load)
    limit = shared_limit(limits)
    _need(limit != () and (limit is None or paged))
    v_rows = paged and not _direct(fn, v, {KEY, VALUE}, extents, last=VALUE) and row_addressed(
        fn, v, VALUE, extents, (QUERY, FEATURE))
    k_rows = paged and not k_direct and row_addressed(fn, k, FEATURE, extents, (QUERY, VALUE)) and k.dtype == F32
    _need(v.src not in inside and (v_rows or _direct(fn, v, {KEY, VALUE}, extents, last=VALUE)))
    out_axes, recip, out_dtype = _result(out_op, o_op, l_op)
    _need(out_axes[-1] == VALUE and out_op.result not in inside)
    _same_extents(out_op, {a.name: r for a, r in zip(out_op.axes, out_axes)}, extents)
    group, size = _group(fn, batch, k, v, extents)
    bounds = _bounds(score, score_op.result) if _skippable(fn, k, extents) else ()
    if limit is not None and not isinstance(limit, tuple):  # keys past the length: masked, tiles skipped
        score, bounds = masked_score(score, limit, KEY), (*bounds, KeyBound(True, limit))
    return Attention(batch, roles, tuple(extents.items()), q, k, v, q_direct, k_direct, score_op.result, score,
                     group, size, bounds, out_op.result, out_axes, recip, j_name, out_dtype, q_half, k_half,
                     k_rows, v_rows)


# ---------------------------------------------------------------- pieces


def _as_reduce(op: PlanOp) -> PlanOp:
    """A contraction as the ``reduce.sum`` of the product it means (the maps before it can then be inlined)."""
    if not isinstance(op, ir.ContractOp):
        return op
    return ir.ReduceOp(op.result, op.dtype, "sum", op.axes, op.reduce_axes, ir.Binary("mul", op.lhs, op.rhs, op.dtype),
                       op.name)


def _reads(op: PlanOp, values: set[str]) -> bool:
    exprs = (op.lhs, op.rhs) if isinstance(op, ir.ContractOp) else (op.body,)
    return any(isinstance(x, ir.Load) and x.src in values for e in exprs for x in ir.walk(e))


def _uses(e: ir.SExpr, role: str) -> bool:
    return any(isinstance(x, ir.Idx) and x.name == role for x in ir.walk(e))


def _rename(e: ir.SExpr, names: dict[str, str]) -> ir.SExpr:
    def swap(x: ir.SExpr) -> ir.SExpr:
        if isinstance(x, ir.Idx):
            _need(x.name in names)
            return ir.Idx(names[x.name], x.dtype)
        return x

    return map_expr(e, swap)


def _key_axis(mx: ir.ReduceOp, scores: str, names: list[str]) -> str:
    """The scores' axis that the row max reduces (read off its loads of the scores)."""
    for x in ir.walk(mx.body):
        if isinstance(x, ir.Load) and x.src == scores and ir.Idx(mx.reduce_axes[0].name) in x.indices:
            _need(len(x.indices) == len(names))
            return names[x.indices.index(ir.Idx(mx.reduce_axes[0].name))]
    raise _NoMatch


def _map_from(op: PlanOp, src: str, roles: list[str]) -> dict[str, str]:
    """Op axis -> role, read off the op's loads of ``src`` (whose k-th axis has role ``roles[k]``).

    Every such load must subscript with plain, distinct indices, and all of them agree."""
    assert not isinstance(op, ir.ContractOp)
    found: dict[str, str] | None = None
    for x in ir.walk(op.body):
        if isinstance(x, ir.Load) and x.src == src:
            _need(len(x.indices) == len(roles) and all(isinstance(s, ir.Idx) for s in x.indices))
            names = [s.name for s in x.indices if isinstance(s, ir.Idx)]
            _need(len(set(names)) == len(names))
            here = dict(zip(names, roles))
            _need(found is None or found == here)
            found = here
    _need(found is not None)
    assert found is not None
    return dict(found)


def _same_extents(op: PlanOp, names: dict[str, str], extents: dict[str, Dim]) -> None:
    axes = op.axes if isinstance(op, ir.MapOp) else (*op.axes, *op.reduce_axes)
    for a in axes:
        _need(a.name in names and equal(a.extent, extents[names[a.name]]) is True)


def _factor(e: ir.SExpr, inside: set[str]) -> None:
    """q or k: an f32 expression of loads of values computed before the core, never of ``E``."""
    _need(e.dtype == F32 and not _uses(e, VALUE))
    _need(all(x.src not in inside for x in ir.walk(e) if isinstance(x, ir.Load)))


def _widened(e: ir.SExpr) -> ir.Load | None:
    """The 16-bit load ``x`` when ``e`` is ``f32(x)``."""
    if isinstance(e, ir.Cast) and e.dtype == F32 and isinstance(e.x, ir.Load) and e.x.dtype in HALF:
        return e.x
    return None


def _direct(fn: ir.Function, e: ir.SExpr | None, plain: set[str], extents: dict[str, Dim],
            last: str | None = None) -> bool:
    """Whether ``e`` is one load addressed directly (f32, or 16-bit when it is the operand of a
    widening): each role of ``plain`` a whole subscript, in range (``last`` the innermost), the
    other subscripts using batch roles only (checked as they run)."""
    if not isinstance(e, ir.Load) or e.dtype not in (F32, *HALF):
        return False
    shape = fn.value_types()[e.src].shape
    if len(shape) != len(e.indices) or (last is not None and e.indices[-1] != ir.Idx(last)):
        return False
    seen: list[str] = []
    for sub, extent in zip(e.indices, shape):
        if isinstance(sub, ir.Idx) and sub.name in plain:
            if equal(extent, extents[sub.name]) is not True:
                return False
            seen.append(sub.name)
        elif any(_uses(sub, r) for r in (QUERY, KEY, FEATURE, VALUE)) or any(
                isinstance(x, ir.Load) for x in ir.walk(sub)):
            return False
    return sorted(seen) == sorted(plain)


def _skippable(fn: ir.Function, k: ir.SExpr, extents: dict[str, Dim]) -> bool:
    """Whether k can be left unevaluated at skipped keys: at the key it reads only whole, in-range
    subscripts (nothing there could raise an error the interpreter would report)."""
    types = fn.value_types()
    for x in ir.walk(k):
        if isinstance(x, ir.Binary) and x.op in ("div", "floordiv", "mod", "pow") and _uses(x, KEY) \
                and not x.dtype.is_float:
            return False
        if isinstance(x, ir.Load):
            for sub, extent in zip(x.indices, types[x.src].shape):
                if _uses(sub, KEY) and not (sub == ir.Idx(KEY) and equal(extent, extents[KEY]) is True):
                    return False
    return True


def _result(out: ir.MapOp, o: tuple[ir.ReduceOp, dict[str, str]], l_: tuple[ir.ReduceOp, dict[str, str]]
            ) -> tuple[tuple[str, ...], bool, DType]:
    """The roles of the result's axes, whether it is written ``o * (1 / l)`` rather than ``o / l``,
    and its storage dtype (f32, or a 16-bit float the f32 quotient is rounded to)."""
    o_op, omap = o
    l_op, lmap = l_
    body = out.body
    if out.dtype in HALF:
        _need(isinstance(body, ir.Cast) and body.dtype == out.dtype and body.x.dtype == F32)
        assert isinstance(body, ir.Cast)
        body = body.x
    _need(isinstance(body, ir.Binary) and body.op in ("div", "mul"))
    assert isinstance(body, ir.Binary)
    recip = body.op == "mul"
    o_load, l_load = body.a, body.b
    if recip:
        if not (isinstance(o_load, ir.Load) and o_load.src == o_op.result):
            o_load, l_load = l_load, o_load
        _need(isinstance(l_load, ir.Binary) and l_load.op == "div" and l_load.a == ir.Const(1.0, F32))
        assert isinstance(l_load, ir.Binary)
        l_load = l_load.b
    _need(isinstance(o_load, ir.Load) and o_load.src == o_op.result)
    _need(isinstance(l_load, ir.Load) and l_load.src == l_op.result)
    assert isinstance(o_load, ir.Load) and isinstance(l_load, ir.Load)
    _need(all(isinstance(s, ir.Idx) for s in o_load.indices))
    names = {s.name: omap[a.name] for s, a in zip(o_load.indices, o_op.axes) if isinstance(s, ir.Idx)}
    _need(len(names) == len(out.axes) and all(a.name in names for a in out.axes))
    want = tuple(ir.Idx(lmap[a.name]) for a in l_op.axes)
    renamed = _rename(l_load, names)
    _need(isinstance(renamed, ir.Load) and renamed.indices == want)
    return tuple(names[a.name] for a in out.axes), recip, out.dtype


def _group(fn: ir.Function, batch: tuple[str, ...], k: ir.SExpr, v: ir.Load, extents: dict[str, Dim]
           ) -> tuple[str | None, Dim | None]:
    """The innermost batch role whose consecutive runs share k and v (GQA's heads), and the run length.

    A role that k and v never mention shares them all (run = its extent); one they mention
    only as ``role / X`` shares runs of ``X``, when ``X`` is a dim known to be at least 1 (a
    product of dims, or ``H // G`` under a ``where H % G == 0``)."""
    exprs = (k, v)
    for role in reversed(batch):
        uses = sum(1 for e in exprs for x in ir.walk(e) if x == ir.Idx(role))
        if not uses:
            return role, extents[role]
        divisors = {x.b for e in exprs for x in ir.walk(e) if isinstance(x, ir.Binary) and x.op == "div"
                    and x.a == ir.Idx(role)}
        if len(divisors) != 1 or uses != sum(_count_div(e, role) for e in exprs):
            continue
        size = _as_dim(divisors.pop())
        if size is not None and _positive(fn, size):
            return role, size
    return None, None


def _positive(fn: ir.Function, d: Dim) -> bool:
    d = sympy.sympify(d)
    if d.is_positive:
        return True
    if isinstance(d, sympy.floor):
        num, den = sympy.fraction(d.args[0])
        return any(isinstance(g.cond, ir.Rel) and g.cond.op == "==" and sympy.sympify(g.cond.rhs) == 0
                   and sympy.sympify(g.cond.lhs) == sympy.Mod(num, den) for g in fn.guards)
    return False


def _count_div(e: ir.SExpr, role: str) -> int:
    return sum(1 for x in ir.walk(e) if isinstance(x, ir.Binary) and x.op == "div" and x.a == ir.Idx(role))


def _as_dim(e: ir.SExpr) -> Dim | None:
    """An integer expression of dims and constants as a dim (None if it is anything else)."""
    if isinstance(e, ir.DimRef):
        return sympy.sympify(e.dim)
    if isinstance(e, ir.Const) and not e.dtype.is_float and not e.dtype.is_bool and int(e.value) > 0:
        return sympy.Integer(int(e.value))
    if isinstance(e, ir.Cast) and not e.dtype.is_float:
        return _as_dim(e.x)
    if isinstance(e, ir.Binary) and e.op in ("add", "mul", "div"):
        a, b = _as_dim(e.a), _as_dim(e.b)
        if a is None or b is None:
            return None
        return a + b if e.op == "add" else a * b if e.op == "mul" else floordiv(a, b)
    return None


