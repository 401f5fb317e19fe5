"""The LLVM form of a top-k dispatch (:mod:`arke.plan.topk`): one pass over each row, a sorted buffer of K.

The function has the generic signature (:mod:`arke.targets.llvm.function`); its workers split the
indices the selection keeps, flattened into one range ``[lo, hi)``, and each row is selected whole
by one worker. Per row:

1. the first ``K`` elements are inserted into a buffer of ``K`` (key, position) pairs kept sorted
   in the selection's order (spec/language.md §8.3), which then holds the best ``K`` so far; its
   last entry is the *threshold*, the one a later element must beat to get in;
2. the rest of the row is read in blocks of four vectors (64 floats on AVX-512), then of one, then
   one element at a time: one compare per vector against the threshold's value, and a block in
   which no lane may beat it is done. The
   compare is a superset test (``ugt``/``ult``: a NaN lane, or a NaN threshold, passes), so it
   never rejects a winner; each lane that passes is tested exactly, in position order, against
   the threshold as it is then, and a winner is inserted (the last entry drops out). On random
   rows only about ``K·ln(N/K)`` elements get in, so nearly every block costs one load and one
   compare per vector;
3. the positions (and the values, the body read at each position: the element's own bits, ``-0.0``
   stays ``-0.0``) are stored from the buffer, in order.

**Keys.** The exact test and the buffer compare one ``i32`` key per element, larger first: the
float's bits made order-preserving (a negative float's magnitude bits flipped), after ``x + 0.0``
(so ``-0.0`` and ``+0.0`` get one key: equal) and with every NaN mapped to the largest key; for a
``bottomk`` the key is complemented (the smallest value first, NaN last). Equal keys keep the
lower position first: elements arrive in position order and an element only gets in with a
*strictly* larger key than the threshold's, and is inserted after every entry of an equal key.
That is the selection's total order, so the result is the interpreter's for any thread count.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.plan.dispatch import Dispatch, KernelPlan
from arke.plan.exprs import loads_in
from arke.plan.topk import TopK, row_load
from arke.targets.llvm.function import LLVMFunction
from arke.targets.llvm.scalar import STORAGE
from arke.targets.llvm.vec import Vec

_INT_MAX = 2**31 - 1
_CTTZ = "declare i64 @llvm.cttz.i64(i64, i1)"


class TopKFunction(LLVMFunction):
    """Emits one top-k dispatch (see the module doc)."""

    def __init__(self, plan: KernelPlan, dispatch: Dispatch, name: str, declare: Callable[[str], None],
                 vector_bits: int = 512):
        if not isinstance(dispatch.pattern, TopK):
            raise TypeError(f"{name}: a top-k dispatch needs its TopK pattern")
        super().__init__(plan, dispatch, name, declare, vector_bits)
        self.top = dispatch.pattern
        op = self.op
        assert isinstance(op, ir.ReduceOp)
        load = row_load(op)
        assert load is not None, "the topk pass keeps only selections of the native form"
        self.row_op, self.row = op, load
        self.lanes_w = max(4, vector_bits // 32)
        self.unroll = min(4, 64 // self.lanes_w)  # the block's lane bits fit one i64

    def _buffers_used(self) -> set[str]:
        op = self.d.op
        assert isinstance(op, ir.ReduceOp)
        return {m.result for m in self.d.members} | {x.src for x in loads_in(op.body)}

    # -- the function
    def render(self) -> str:
        self.start_error_flag()
        k = self.top.k
        self.keys = self._pro(f"alloca [{k} x i32]")
        self.pos = self._pro(f"alloca [{k} x i64]")
        self.thr_key = self._pro("alloca i32")
        self.thr_val = self._pro("alloca float")
        keep = [a.name for a in self.op.axes[:-1]]
        if keep:
            self.parallel_extent = self.flat_loop(keep, self.select_row)
        else:  # a selection along a tensor's only axis: one row, one task
            self.loop("%flat", "%lo", "%hi", self.select_row)
            self.parallel_extent = sympy.Integer(1)
        return self.text()

    def select_row(self) -> None:
        """Steps 1-3 of the module doc on the current row."""
        op, k = self.row_op, self.top.k
        axis = op.reduce_axes[0]
        self.current[axis.name] = "0"
        buf = self.buffer(self.row.src)
        self.base = self.address(buf, self.row.indices)  # x[row.., 0]: the row is contiguous from here
        self.storage, self.dtype = STORAGE[buf.dtype], buf.dtype
        n = self.dim(axis.extent)

        def fill() -> None:
            c = self.current["%fill"]
            self.insert(c, self.key(self.element_at(c)), c)

        self.loop("%fill", "0", str(k), fill)
        self.set_threshold()
        # blocks of four vectors, then of one (a short row: routing's 64 experts), then one at a time
        start = str(k)
        for vectors in dict.fromkeys((self.unroll, 1)):
            block = vectors * self.lanes_w
            rest = self.let(f"sub i64 {n}, {start}")
            blocks = self.let(f"udiv i64 {rest}, {block}")
            self.loop("%blk", "0", blocks, partial(self.scan_block, start, vectors, block))
            start = self.let(f"add i64 {start}, {self.let(f'mul i64 {blocks}, {block}')}")
        self.loop("%tail", start, n, lambda: self.candidate(self.current["%tail"]))
        self.loop(self.op.axes[-1].name, "0", str(k), self.store_rank)

    def scan_block(self, first: str, vectors: int, block: int) -> None:
        """One block of ``vectors`` vectors from position ``first + blk·block``: the superset test on
        every vector, the exact test on the lanes that pass."""
        offset = self.let(f"mul i64 {self.current['%blk']}, {block}")
        start = self.let(f"add i64 {first}, {offset}")
        vec = Vec(self.lanes_w, self.let, self.declare)
        w = self.lanes_w
        thr = vec.splat(self.let(f"load float, ptr {self.thr_val}"))
        pred = "ugt" if self.top.largest else "ult"
        bits = "0"
        for u in range(vectors):
            at = self.let(f"add i64 {start}, {u * w}") if u else start
            p = self.let(f"getelementptr inbounds {self.storage}, ptr {self.base}, i64 {at}")
            v = vec.load_as_float(p, self.dtype)
            m = self.let(f"fcmp {pred} {vec.f} {v}, {thr}")
            mask = self.let(f"bitcast {vec.ty('i1')} {m} to i{w}")
            lane = self.let(f"zext i{w} {mask} to i64")
            if u:
                lane = self.let(f"shl i64 {lane}, {u * w}")
                bits = self.let(f"or i64 {bits}, {lane}")
            else:
                bits = lane
        some = self.let(f"icmp ne i64 {bits}, 0")
        self.likely_not(some, lambda: self.winners(bits, start))

    def winners(self, bits: str, start: str) -> None:
        """Each lane set in ``bits`` (lane ``t`` is position ``start + t``), lowest first: the exact test."""
        self.declare(_CTTZ)
        left = self._pro("alloca i64")
        self.emit(f"store i64 {bits}, ptr {left}")

        def cond() -> str:
            self.cur_bits = self.let(f"load i64, ptr {left}")
            return self.let(f"icmp ne i64 {self.cur_bits}, 0")

        def body() -> None:
            b = self.cur_bits
            t = self.let(f"call i64 @llvm.cttz.i64(i64 {b}, i1 true)")
            self.candidate(self.let(f"add i64 {start}, {t}"))
            low = self.let(f"sub i64 {b}, 1")
            self.emit(f"store i64 {self.let(f'and i64 {b}, {low}')}, ptr {left}")

        self.while_loop(cond, body)

    def candidate(self, at: str) -> None:
        """The element at position ``at``: inserted when its key beats the threshold's."""
        key = self.key(self.element_at(at))
        beats = self.let(f"icmp sgt i32 {key}, {self.let(f'load i32, ptr {self.thr_key}')}")

        def admit() -> None:
            self.insert(str(self.top.k - 1), key, at)
            self.set_threshold()

        self.likely_not(beats, admit)

    # -- the buffer
    def insert(self, slot: str, key: str, at: str) -> None:
        """Put (``key``, ``at``) into the sorted buffer, starting from entry ``slot`` (the first free one,
        or the last, which drops out) and moving every entry of a smaller key one place down."""
        i = self._pro("alloca i64")
        self.emit(f"store i64 {slot}, ptr {i}")

        def cond() -> str:
            here = self.let(f"load i64, ptr {i}")
            room = self.let(f"icmp sgt i64 {here}, 0")
            above = self.let(f"select i1 {room}, i64 {self.let(f'sub i64 {here}, 1')}, i64 0")
            smaller = self.let(f"icmp slt i32 {self.entry('i32', self.keys, above)}, {key}")
            self.moving = (here, above)
            return self.let(f"and i1 {room}, {smaller}")

        def body() -> None:
            here, above = self.moving
            for ty, arr in (("i32", self.keys), ("i64", self.pos)):
                self.emit(f"store {ty} {self.entry(ty, arr, above)}, ptr {self.slot(ty, arr, here)}")
            self.emit(f"store i64 {above}, ptr {i}")

        self.while_loop(cond, body)
        here = self.let(f"load i64, ptr {i}")
        self.emit(f"store i32 {key}, ptr {self.slot('i32', self.keys, here)}")
        self.emit(f"store i64 {at}, ptr {self.slot('i64', self.pos, here)}")

    def set_threshold(self) -> None:
        """The last entry's key (the exact test) and its element's value (the vector test)."""
        last = str(self.top.k - 1)
        self.emit(f"store i32 {self.entry('i32', self.keys, last)}, ptr {self.thr_key}")
        self.emit(f"store float {self.element_at(self.entry('i64', self.pos, last))}, ptr {self.thr_val}")

    def slot(self, ty: str, arr: str, at: str) -> str:
        return self.let(f"getelementptr inbounds {ty}, ptr {arr}, i64 {at}")

    def entry(self, ty: str, arr: str, at: str) -> str:
        return self.let(f"load {ty}, ptr {self.slot(ty, arr, at)}")

    # -- elements and keys
    def element_at(self, at: str) -> str:
        """The row's element at position ``at`` as a float (16-bit floats widened exactly)."""
        p = self.let(f"getelementptr inbounds {self.storage}, ptr {self.base}, i64 {at}")
        return self.widen(self.let(f"load {self.storage}, ptr {p}"), self.dtype)

    def key(self, x: str) -> str:
        """The order-preserving ``i32`` key of float ``x`` (module doc): larger is selected first."""
        z = self.let(f"fadd float {x}, 0.0")  # -0.0 + 0.0 is +0.0: the zeros get one key
        b = self.let(f"bitcast float {z} to i32")
        flip = self.let(f"lshr i32 {self.let(f'ashr i32 {b}, 31')}, 1")
        key = self.let(f"xor i32 {b}, {flip}")
        key = self.let(f"select i1 {self.let(f'fcmp uno float {x}, 0.0')}, i32 {_INT_MAX}, i32 {key}")
        return key if self.top.largest else self.let(f"xor i32 {key}, -1")

    def store_rank(self) -> None:
        """Entry ``j`` of the buffer to the results: its position, and the body read there."""
        op, j = self.row_op, self.current[self.op.axes[-1].name]
        at = self.entry("i64", self.pos, j)
        subs = [ir.Idx(a.name) for a in op.axes]
        if self.top.positions is not None:
            self.store(self.buffer(self.top.positions), subs, at, DType.I64)
        if self.top.values is not None:
            self.current[op.reduce_axes[0].name] = at
            value = self.expr(op.body)
            values = next(m for m in self.d.members if m.result == self.top.values)
            if op.body.dtype != values.dtype:
                value = self.convert(value, op.body.dtype, values.dtype)
            self.store(self.buffer(self.top.values), subs, value, values.dtype)

    # -- control flow
    def while_loop(self, cond: Callable[[], str], body: Callable[[], None]) -> None:
        """``while cond(): body()`` (``cond`` emits its test in the loop's head)."""
        self.loops_made += 1
        tag = f"w.{self.loops_made}"
        self.emit(f"br label %h.{tag}")
        self.label(f"h.{tag}")
        self.emit(f"br i1 {cond()}, label %b.{tag}, label %e.{tag}")
        self.label(f"b.{tag}")
        body()
        self.emit(f"br label %h.{tag}")
        self.label(f"e.{tag}")

    def likely_not(self, cond: str, then: Callable[[], None]) -> None:
        """``if cond: then()``, the branch weighted as rarely taken (winners are rare)."""
        self.loops_made += 1
        tag = self.loops_made
        dispatch = int(self.name.rsplit(".d", 1)[1]) if ".d" in self.name else 0
        weights = f"!{100000 * (dispatch + 1) + 90000}"
        self.declare(f'{weights} = !{{!"branch_weights", i32 1, i32 1000}}')
        self.emit(f"br i1 {cond}, label %then.{tag}, label %fi.{tag}, !prof {weights}")
        self.label(f"then.{tag}")
        then()
        self.emit(f"br label %fi.{tag}")
        self.label(f"fi.{tag}")
