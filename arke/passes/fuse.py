"""Elementwise fusion: fold a map into the ops that read it, so its values are recomputed, never stored.

A :class:`~arke.ir.semantic.MapOp` producer ``%p = map [a < A, b < B] { body }`` is folded
into a consumer by replacing each load ``%p[s, t]`` with ``body``, where the producer's
``Idx(a)``, ``Idx(b)`` become the subscripts ``s``, ``t`` (cast to the index's dtype when
they differ). The producer then has no reader left and is removed.

**Legal** whenever every consumer is a map, a reduce or a scan: a load reads one element, and the
body computes exactly that element. A :class:`~arke.ir.semantic.ContractOp`'s operands
must stay plain loads (every target lowers a contraction as a matmul of two stored
tensors), and a call's arguments are whole tensors, so a producer read by a contract or a
call stays. A function result stays (it must be stored). A map that *reads* a contract's
result is not folded either: it is the contract's epilogue (bias, activation, gating),
which the codegen recognises and runs on the contract's accumulator tile — unless its one
reader is a map that reads it element for element, which then becomes the epilogue, and the
epilogue is not a *row condition* (``sum(...) if routed[t, e] else 0.0``: a select whose condition
reads no contract nor the last index, one branch reading the contract; the codegen may then skip the
rows where it is false, :mod:`arke.plan.contraction`), which stays where it is. A map that rounds a
product sum to bf16/f16 element for element is not folded into a reader that reads another product sum
(a half-precision SwiGLU's gate): it stays its own sum's epilogue and is stored in its dtype.

**Profitable** (the pass folds only then):

1. the producer is *cheap* — a constant, an index, a ``dim(…)``, a load with plain
   subscripts, or a cast of one of these — whatever the number of consumers: recomputing
   it costs nothing next to storing and reloading it;
2. exactly one op reads it (recomputation inside that op only; a codegen hoists what
   does not depend on the inner axes, as in rmsnorm's ``rsqrt`` per row);
3. at most :data:`MAX_RECOMPUTE` loads read it, each *one to one* — its subscripts are
   distinct indices covering the consumer's whole domain, so each consumer evaluates each
   element once. This is softmax's ``exp``: the row sum and the normalisation each
   compute it once, and the ``[M, N]`` tensor of exponentials is never written.

A fold that would grow a body past :data:`MAX_BODY_NODES` nodes is skipped, so chains
that read a value twice per step cannot blow up exponentially.

**Dtypes.** A map stores its values in its dtype: a ``bf16``/``f16`` map rounds what its
body computes in ``f32``, and a map whose body has a narrower dtype widens it. The fold
keeps that: the substituted body is wrapped in ``Cast(body, producer.dtype)`` whenever the
body's dtype differs from the producer's or the producer is ``bf16``/``f16`` (unless the
body already is an exact value of that dtype: a load, constant or cast). The interpreter
rounds at an explicit cast exactly as it rounds at a store, so the fused kernel computes
bit-identical elements. Reductions may still differ in the last bits: the interpreter
(and any target) is free to sum a reduction's body in another order once its body changes
form (for instance it runs ``sum(a * b)`` as an einsum), so fused reductions agree within
the dtype's reduction tolerance, maps bit for bit.

Folding evaluates the producer only where it is read, so an out-of-range subscript in an
unread element of the producer no longer raises, and a consumer's out-of-range read of the
producer is no longer caught at that load (the producer's own loads still check theirs).
"""

from __future__ import annotations

from dataclasses import replace

from arke.ir import semantic as S
from arke.ir.shapes import equal
from arke.passes.rewrite import map_expr, map_op_exprs, op_exprs, op_uses, walk

#: At most this many one-to-one loads of a multi-consumer producer are folded (rule 3).
MAX_RECOMPUTE = 2
#: A fold that would make a body larger than this many nodes is not done.
MAX_BODY_NODES = 512


def fuse_elementwise(fn: S.Function) -> S.Function:
    """``fn`` with every map producer folded into its consumers where legal and profitable (see the module doc).

    Producers are visited last to first, so each one sees its final consumers: folding a
    later map into its readers moves its loads of earlier values into those readers. Folded
    producers are removed; op results keep their names (:func:`~arke.passes.dce.dead_code`
    renumbers them).
    """
    ops: list[S.Op | None] = list(fn.ops)
    results = set(fn.results)
    contracts = {op.result for op in fn.ops if isinstance(op, S.ContractOp)}
    for i in reversed(range(len(ops))):
        producer = ops[i]
        if not isinstance(producer, S.MapOp) or producer.result in results:
            continue
        readers = {j: op for j, op in enumerate(ops) if op is not None and producer.result in op_uses(op)}
        # a contract's epilogue: the codegen runs it on the contract's output tile. It moves into
        # its one reader only when that reader is an elementwise map that reads it element for
        # element: the reader then is the epilogue (GPT-2's h = x @ w + b, then g = gelu(h))
        if any(isinstance(n, S.Load) and n.src in contracts for n in walk(producer.body)) and \
                (row_condition(producer, contracts) or not _extends_epilogue(producer, list(readers.values()))):
            continue
        if not should_fold(producer, list(readers.values())) or \
                _gate_of_second_product(producer, list(readers.values()), ops):
            continue
        for j, op in readers.items():
            ops[j] = fold(op, producer)
        ops[i] = None
    return replace(fn, ops=tuple(op for op in ops if op is not None))


def should_fold(producer: S.MapOp, consumers: list[S.Op]) -> bool:
    """Whether folding ``producer`` into all of ``consumers`` (every op that reads it) is legal and profitable."""
    if not consumers or not all(isinstance(c, (S.MapOp, S.ReduceOp, S.ScanOp)) for c in consumers):
        return False
    loads = [(c, n) for c in consumers for n in _loads_of(c, producer.result)]
    size = _size(producer.body)
    if any(sum(map(_size, op_exprs(c))) + size * len(_loads_of(c, producer.result)) > MAX_BODY_NODES
           for c in consumers):
        return False
    if is_cheap(producer.body) or len(consumers) == 1:
        return True
    return len(loads) <= MAX_RECOMPUTE and all(_one_to_one(n, c) for c, n in loads)


def _extends_epilogue(producer: S.MapOp, consumers: list[S.Op]) -> bool:
    """Whether a contract's epilogue ``producer`` can fold into ``consumers``, which then is the epilogue:
    one map over the same domain that reads the producer only at its own element."""
    if len(consumers) != 1 or not isinstance(consumers[0], S.MapOp):
        return False
    consumer = consumers[0]
    if len(consumer.axes) != len(producer.axes) or not all(
            equal(a.extent, b.extent) for a, b in zip(consumer.axes, producer.axes)):
        return False
    same = tuple(S.Idx(a.name) for a in consumer.axes)
    return all(load.indices == same for load in _loads_of(consumer, producer.result))


def _product_sums(ops: list[S.Op | None]) -> dict[str, S.ReduceOp]:
    """The ops that sum a product, ``sum(f(x[..]) * g(w[..]) for k)``: what the planner runs as contractions."""
    return {op.result: op for op in ops if isinstance(op, S.ReduceOp) and op.kind == "sum"
            and isinstance(op.body, S.Binary) and op.body.op == "mul"}


def _gate_of_second_product(producer: S.MapOp, consumers: list[S.Op], ops: list[S.Op | None]) -> bool:
    """Whether ``producer`` rounds a product sum to bf16/f16 element for element and its one reader, a map,
    reads another product sum too (a half-precision SwiGLU: ``g = bf16(x wg)``, ``u = bf16(x wu)``,
    ``silu(g) * u``). The reader becomes the second sum's epilogue; folded, it would read the first
    sum's f32 values from memory and round them there. Left alone, ``producer`` is the first sum's own
    epilogue: it rounds once and stores half the bytes. The values are the same either way."""
    if producer.dtype.compute == producer.dtype or len(consumers) != 1 or not isinstance(consumers[0], S.MapOp):
        return False
    sums = _product_sums(ops)
    own = {n.src for n in walk(producer.body) if isinstance(n, S.Load) and n.src in sums}
    if len(own) != 1:
        return False
    same = tuple(S.Idx(a.name) for a in producer.axes)
    if any(n.indices != same for n in walk(producer.body) if isinstance(n, S.Load) and n.src in own):
        return False
    others = {n.src for e in op_exprs(consumers[0]) for n in walk(e) if isinstance(n, S.Load) and n.src in sums}
    return bool(others - own)


def row_condition(producer: S.MapOp, contracts: set[str]) -> bool:
    """Whether ``producer`` is ``a if c else b`` with exactly one of ``a``, ``b`` reading a contract, and
    ``c`` reading none and not the last index: a contract's epilogue that says which rows need their sums."""
    body = producer.body
    if not isinstance(body, S.Select) or not producer.axes:
        return False

    def reads(e: S.SExpr) -> bool:
        return any(isinstance(n, S.Load) and n.src in contracts for n in walk(e))

    last = producer.axes[-1].name
    return (not any(isinstance(n, S.Idx) and n.name == last for n in walk(body.cond))
            and reads(body.a) != reads(body.b) and not reads(body.cond))


def is_cheap(e: S.SExpr) -> bool:
    """A constant, index or ``dim(…)``; a load whose subscripts are such leaves; or a cast of a cheap expression."""
    if isinstance(e, (S.Const, S.Idx, S.DimRef)):
        return True
    if isinstance(e, S.Load):
        return all(isinstance(i, (S.Const, S.Idx, S.DimRef)) for i in e.indices)
    return isinstance(e, S.Cast) and is_cheap(e.x)


def fold(consumer: S.Op, producer: S.MapOp) -> S.Op:
    """``consumer`` with every load of ``producer`` replaced by the producer's body at the load's subscripts."""
    def substitute(e: S.SExpr) -> S.SExpr:
        if isinstance(e, S.Load) and e.src == producer.result:
            return instantiate(producer, e.indices)  # subscripts already rewritten: map_expr goes bottom-up
        return e

    if isinstance(consumer, (S.ContractOp, S.CallOp)):
        raise ValueError(f"cannot fold %{producer.result} into a {type(consumer).__name__}: its operands stay loads")
    return map_op_exprs(consumer, substitute)


def instantiate(producer: S.MapOp, subscripts: tuple[S.SExpr, ...]) -> S.SExpr:
    """The element ``producer[subscripts]`` as an expression: its body with its axes replaced, rounded as stored."""
    at = {a.name: s for a, s in zip(producer.axes, subscripts)}

    def place(e: S.SExpr) -> S.SExpr:
        if isinstance(e, S.Idx):
            s = at[e.name]
            return s if s.dtype == e.dtype else S.Cast(s, e.dtype)
        return e

    body = map_expr(producer.body, place)  # the subscripts put in are not walked again: no capture
    exact = isinstance(body, (S.Load, S.Const, S.Cast)) and body.dtype == producer.dtype
    if body.dtype != producer.dtype or (producer.dtype.compute != producer.dtype and not exact):
        body = S.Cast(body, producer.dtype)  # the store's rounding (bf16/f16) or widening, made explicit
    return body


def _loads_of(op: S.Op, value: str) -> list[S.Load]:
    if not isinstance(op, (S.MapOp, S.ReduceOp, S.ScanOp)):
        raise TypeError(f"{type(op).__name__} has no body")
    return [n for e in op_exprs(op) for n in walk(e) if isinstance(n, S.Load) and n.src == value]


def _size(e: S.SExpr) -> int:
    return sum(1 for _ in walk(e))


def _one_to_one(load: S.Load, consumer: S.Op) -> bool:
    """Whether ``load`` reads each element once over the consumer's domain: distinct indices naming every axis."""
    if not isinstance(consumer, (S.MapOp, S.ReduceOp)):
        return False
    domain = {a.name for a in consumer.axes} | ({a.name for a in consumer.reduce_axes}
                                                if isinstance(consumer, S.ReduceOp) else set())
    names = [i.name for i in load.indices if isinstance(i, S.Idx)]
    return len(names) == len(load.indices) == len(domain) and set(names) == domain
