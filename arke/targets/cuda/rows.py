"""The CUDA-C target's rows family: one thread block per row, reductions by warp shuffles.

A rows dispatch (:mod:`arke.plan.rows`) is a run of ops that share their leading row axes:
a norm's or a softmax's statistics and the map that uses them. It becomes one ``__global__``
function on a 1-D grid of one block per row (the row axes flattened: ``blockIdx.x``, so up to
2**31 - 1 rows), and the block runs every member on its row, in order:

* a reduction to one value per row (a softmax's ``max`` and ``sum``, a norm's ``sum(x * x)``)
  is a *block reduction*: thread ``t`` of ``T`` accumulates elements ``t, t + T, t + 2T ...``
  of the reduce domain (flattened row-major) in that order, a butterfly of ``__shfl_xor_sync``
  folds each warp so that every lane holds the warp's value, lane 0 of each warp writes it to
  ``__shared__`` memory and, after one ``__syncthreads``, *every* warp folds the warps' values
  with a second butterfly. Every thread ends with the row's value in a register, no collective
  is ever inside a branch that depends on the thread, and the order of the additions depends on
  ``T`` only (fixed by the plan), never on timing. A butterfly leaves the same bits in every
  lane: each step adds the same two values, only in the other order;
* a reduction with free axes after the rows (attention's scores ``s[i, j]``, a matrix-vector
  product) gives each output to one thread, its reduce axes looped in order, when neighbouring
  outputs are neighbours in memory (``p[j] * v[j, d]`` over ``d``: threads read consecutive
  ``d``); otherwise each output goes to one warp whose lanes stride the reduce domain and meet
  in a butterfly (``q[d] * k[j, d]``: lanes read consecutive ``d``), the warps taking outputs
  ``w, w + W ...`` in a loop that every warp runs the same number of times;
* a map is elementwise over its free axes, thread ``t`` taking elements ``t, t + T ...``.

Values that never leave the dispatch (its ``internal`` ones): a value per row lives in a
register of every thread, rounded to its dtype as the interpreter stores it (a 16-bit float
through f32); an internal map with free axes is inlined where it is read (its body, rounded
likewise); an internal reduction with free axes is stored in the launch's scratch (words
``1..`` of ``err``: one 8-byte word per element of the whole tensor, so every block owns the
region of its row). A member that reads what an earlier one wrote to memory (scratch or a
result buffer) first waits at a ``__syncthreads``: another thread wrote it. Values per row
that the kernel returns are stored once, by thread 0.

Each member's loops run inside a guard, ``if (its domain is not empty)``, that first evaluates
once what does not move along them (a row's ``rsqrt(var + eps)``, a head's ``h / R``, the
check of a subscript that does not move): only where the interpreter evaluates the body.

Vector accesses: a member that runs over one axis ``a`` of extent ``L`` (a map's only free
axis, a row statistic's only reduce axis) reads f32/f16/bf16 rows whose last subscript is
``a`` 16 bytes at a time (``V`` elements: 4 floats, or 8 halves when one is 16-bit) when
``L % V == 0`` and those tensors' base addresses are 16-byte aligned (checked at run time;
every row is then aligned too), and a map with such loads stores its result row likewise. A
reduction takes its elements in chunks of ``V`` (thread ``t`` the chunks ``t, t + T ...``) on
both paths, so the vector path and the scalar one (a ragged ``L``, an unaligned view) add in
the same order and give the same bits.

Strategy: ``warps = n`` (a power of two, 1 to 32) runs ``T = 32n`` threads per block
(default 4 warps; any other value is an :class:`~arke.targets.artifact.UnsupportedError`); a
rows block has no tiles or pipeline, so ``tile``, ``vectorize`` and ``stages`` do not apply
to it. Expressions and 16-bit conversions are :mod:`arke.targets.cuda.expr`'s; a bad
subscript or a zero integer divisor reads element 0 (divides by 1) and raises the error word.
The pieces every form uses (C helpers, checks, loops, and what keeps ptxas from spilling)
are in :mod:`arke.targets.cuda.rows_base`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import dim_str, equal
from arke.passes.rewrite import map_expr
from arke.plan.dispatch import Buffer, Dispatch, KernelPlan
from arke.plan.exprs import product
from arke.targets.artifact import LaunchSpec, UnsupportedError
from arke.targets.cuda.expr import STORAGE, identity
from arke.targets.cuda.rows_base import HELPERS, VECTOR, WARP, RowsBase, acc_type, inline_map

#: Warps per block when the strategy says nothing.
DEFAULT_WARPS = 4


def render_rows(plan: KernelPlan, dispatch: Dispatch, entry: str) -> tuple[str, LaunchSpec]:
    """A rows dispatch as CUDA C (see the module doc): its function's text and its launch."""
    fn = RowsFunction(plan, dispatch, entry, warps(plan))
    text = fn.render()
    return HELPERS.strip() + "\n\n" + text, fn.launch()


def warps(plan: KernelPlan) -> int:
    """The warps per block: the strategy's ``warps`` decision, else :data:`DEFAULT_WARPS`."""
    d = plan.decision("warps")
    if d is None:
        return DEFAULT_WARPS
    n = d.value
    if not isinstance(n, int) or not 1 <= n <= WARP or n & (n - 1):
        raise UnsupportedError(f"{plan.name}: `warps = {n}` cannot run a rows dispatch on the cuda target: "
                               "it takes 1, 2, 4, 8, 16 or 32 warps (32 to 1024 threads per block)", code="AK4004")
    return n


class RowsFunction(RowsBase):
    """Emits one rows dispatch: one block per row, every member in order (see the module doc)."""

    # -- the function
    def render(self) -> str:
        self.emit("const long long ak_tid = (long long)threadIdx.x;")
        self.emit("const int ak_lane = (int)(threadIdx.x % 32u), ak_warp = (int)(threadIdx.x / 32u);")
        rows = self.op.axes[:self.r]
        at = self.narrow_digits(self.x.let("long long", "(long long)blockIdx.x"), rows)
        for op in self.members:
            assert not isinstance(op, ir.ContractOp | ir.ScanOp)
            self.member(op, at)
        return self.text()

    def member(self, op: ir.MapOp | ir.ReduceOp, at: list[str]) -> None:
        """One member on the block's row."""
        self.op = op
        self.x.reset()  # an axis name may mean another axis in this member: reuse nothing
        self.extent = {a.name: a.extent for a in op.axes}
        if isinstance(op, ir.ReduceOp):
            self.extent.update({a.name: a.extent for a in op.reduce_axes})
        for a, v in zip(op.axes, at):
            self.current[a.name] = v
        body = map_expr(op.body, lambda x: inline_map(self.inlined[x.src], x.indices)
                        if isinstance(x, ir.Load) and x.src in self.inlined else x)
        if self.written & {x.src for x in ir.walk(body) if isinstance(x, ir.Load)}:
            self.emit("__syncthreads(); /* other threads wrote what this member reads */")
            self.written.clear()
        free = list(op.axes[self.r:])
        internal = op.result in self.internal
        if isinstance(op, ir.MapOp):
            if free and internal:
                self.inlined[op.result] = replace(op, body=body)
                return
            if free:
                self.guard(free, body)
                self.map_member(op, body, free[0] if len(free) == 1 else None)
                self.unguard()
                self.written.add(op.result)
                return
            value = self.x.value(body, op.dtype)
        elif free:
            if internal:
                self.place_scratch(op)
            self.guard([*free, *op.reduce_axes], body)
            if self.by_warp(op, body):
                self.warp_reduction(op, body, free)
            else:
                self.thread_reduction(op, body, free)
            self.unguard()
            self.written.add(op.result)
            return
        else:
            value = self.block_reduction(op, body)
        if op.dtype is DType.BOOL:
            value = self.x.let("bool", f"{value} != 0")
        self.registers[op.result] = self.x.round_to(value, op.dtype)
        if not internal:
            self.open("if (ak_tid == 0)")
            self.store(op, value)
            self.close()

    # -- maps
    def map_member(self, op: ir.MapOp, body: ir.SExpr, axis: ir.Axis | None) -> None:
        """A stored map over the row: 16 bytes at a time where it can, else element by element."""
        free = list(op.axes[self.r:])

        def element() -> None:
            self.store(op, self.x.value(body, op.dtype))

        ptr, buf = self.target(op.result)
        out = (ptr, buf) if buf.dtype in VECTOR else None
        plan = self.vector_plan(body, axis, out) if axis is not None else None
        if plan is None:
            self.strided(free, element)
            return
        assert axis is not None
        width, loads = plan

        def chunk(base: str) -> None:
            values = self.vector_elements(body, axis, base, width, loads, op.dtype)
            if out is not None:
                self.vector_store(out, op, axis, base, [self.x.narrow(v, op.dtype) for v in values])
            else:
                for j, v in enumerate(values):
                    self.x.push()
                    self.current[axis.name] = self.x.let("long long", f"{base} + {j}LL")
                    self.store(op, v)
                    self.x.pop()

        self.vector_paths(axis, width, loads, out, chunk, lambda: self.strided(free, element))

    # -- reductions
    def block_reduction(self, op: ir.ReduceOp, body: ir.SExpr) -> str:
        """A reduction of the whole row: its value, in a register of every thread."""
        kind, dtype = op.kind, op.dtype
        ty = acc_type(dtype)
        acc = self.fresh("acc")
        self.emit(f"{ty} {acc} = {identity(kind, dtype)};")

        def step(term: str) -> None:
            self.emit(f"{acc} = {self.x.combine(kind, dtype, acc, term)};")

        axes = list(op.reduce_axes)
        plan = self.vector_plan(body, axes[0], None) if len(axes) == 1 else None
        self.guard(axes, body)
        if plan is None:
            self.strided(axes, lambda: step(self.x.value(body, dtype)))
        else:
            self.chunked(axes[0], body, dtype, plan, step)
        self.unguard()
        self.butterfly(acc, kind, dtype, WARP // 2)
        if self.warps > 1:
            part = self.fresh("part")
            self.shared.append(f"__shared__ {ty} {part}[{self.warps}];")
            self.emit(f"if (ak_lane == 0) {part}[ak_warp] = {acc};")
            self.emit("__syncthreads();")
            # every lane reads a warp's value (lane l the value of warp l % W): each group of W lanes
            # folds all of them in the same order, so every thread of the block gets the same bits
            self.emit(f"{acc} = {part}[ak_lane % {self.warps}];")
            self.butterfly(acc, kind, dtype, self.warps // 2)
            self.written.clear()
        return acc

    def chunked(self, axis: ir.Axis, body: ir.SExpr, dtype: DType, plan: tuple[int, list[ir.Load]],
                step: Callable[[str], None]) -> None:
        """The terms of a one-axis reduction in chunks of ``V`` (thread ``t``: chunks ``t, t + T ...``),
        loaded 16 bytes at a time when aligned; the scalar path takes the same elements in the same order."""
        width, loads = plan
        n = self.dim(axis.extent)

        def vector(base: str) -> None:
            for v in self.vector_elements(body, axis, base, width, loads, dtype):
                step(v)

        def scalar() -> None:
            c, j = self.fresh("c"), self.fresh("j")
            self.open(f"for (long long {c} = ak_tid; {c} < ({n} + {width - 1}LL) / {width}LL; {c} += {self.threads}LL)")
            self.open(f"for (long long {j} = {c} * {width}LL; {j} < {c} * {width}LL + {width}LL && {j} < {n}; ++{j})")
            self.current[axis.name] = j
            step(self.x.value(body, dtype))
            self.close()
            self.close()

        self.vector_paths(axis, width, loads, None, vector, scalar)

    def butterfly(self, acc: str, kind: str, dtype: DType, start: int) -> None:
        """Fold ``acc`` across lanes ``xor start, start / 2 ... 1``: every lane gets the fold."""
        if start < 1:
            return
        m, other = self.fresh("m"), self.fresh("o")
        self.emit("#pragma unroll")
        self.emit(f"for (int {m} = {start}; {m} > 0; {m} >>= 1) {{")
        # the shuffle is its own statement: a combine may name its operands twice (integer max)
        self.emit(f"  const {acc_type(dtype)} {other} = ak_rows_shfl({acc}, {m});")
        self.emit(f"  {acc} = {self.x.combine(kind, dtype, acc, other)};")
        self.emit("}")

    def by_warp(self, op: ir.ReduceOp, body: ir.SExpr) -> bool:
        """Whether a reduction with free axes gives each output a warp (no load has the last free
        axis as its last subscript, so neighbouring outputs are not neighbours in memory)."""
        last = ir.Idx(op.axes[-1].name)
        return not any(isinstance(x, ir.Load) and x.indices and x.indices[-1] == last for x in ir.walk(body))

    def thread_reduction(self, op: ir.ReduceOp, body: ir.SExpr, free: list[ir.Axis]) -> None:
        """Each output of the row to one thread, its reduce axes looped in order."""
        kind, dtype = op.kind, op.dtype

        def output() -> None:
            acc = self.fresh("acc")
            self.emit(f"{acc_type(dtype)} {acc} = {identity(kind, dtype)};")

            def step() -> None:
                self.emit(f"{acc} = {self.x.combine(kind, dtype, acc, self.x.value(body, dtype))};")

            self.hoist(body, {a.name for a in op.reduce_axes})  # what this output's terms share
            self.nest([a.name for a in op.reduce_axes], step)
            self.store(op, acc)

        self.strided(free, output)

    def warp_reduction(self, op: ir.ReduceOp, body: ir.SExpr, free: list[ir.Axis]) -> None:
        """Each output of the row to one warp: lanes stride the reduce domain, then a butterfly."""
        kind, dtype = op.kind, op.dtype
        size = self.dim(product([a.extent for a in free]))
        first = self.fresh("w")
        enter, advance = self.walk(free, "ak_warp", self.warps)
        # every warp runs the loop the same number of times: its butterflies are reached by all
        self.open(f"for (long long {first} = 0; {first} < {size}; {first} += {self.warps}LL)")
        o = self.x.let("long long", f"{first} + ak_warp")
        live = self.x.let("bool", f"{o} < {size}")
        enter(o)
        acc = self.fresh("acc")
        self.emit(f"{acc_type(dtype)} {acc} = {identity(kind, dtype)};")
        self.open(f"if ({live})")
        self.hoist(body, {a.name for a in op.reduce_axes})  # what this output's terms share
        self.strided(op.reduce_axes, lambda: self.emit(
            f"{acc} = {self.x.combine(kind, dtype, acc, self.x.value(body, dtype))};"), "ak_lane", WARP)
        self.close()
        self.butterfly(acc, kind, dtype, WARP // 2)
        self.open(f"if ({live} && ak_lane == 0)")
        self.store(op, acc)
        self.close()
        advance()
        self.close()

    # -- 16-byte accesses
    def vector_plan(self, body: ir.SExpr, axis: ir.Axis, out: tuple[str, Buffer] | None
                    ) -> tuple[int, list[ir.Load]] | None:
        """``(V, loads)``: the loads of ``body`` that read a contiguous row along ``axis`` (their last
        subscript), and the elements per chunk (16 bytes of the narrowest of them and ``out``); None
        when no load is a row."""
        loads: list[ir.Load] = []
        for x in ir.walk(body):
            if isinstance(x, ir.Load) and x not in loads and self.contiguous(x, axis):
                loads.append(x)
        dtypes = [self.buffer(x.src).dtype for x in loads] + ([out[1].dtype] if out is not None else [])
        if not loads:  # a store alone is not worth V unrolled elements (their live values may spill)
            return None
        return max(VECTOR[d] for d in dtypes), loads

    def contiguous(self, e: ir.Load, axis: ir.Axis) -> bool:
        """Whether a load reads a row of a float buffer along ``axis`` (no other subscript moves with it)."""
        if e.src in self.registers or e.src in self.local or not e.indices or e.indices[-1] != ir.Idx(axis.name):
            return False
        buf = self.buffer(e.src)
        if buf.dtype not in VECTOR or equal(buf.shape[-1], axis.extent) is not True:
            return False
        return not any(isinstance(y, ir.Load) or y == ir.Idx(axis.name) for s in e.indices[:-1] for y in ir.walk(s))

    def vector_paths(self, axis: ir.Axis, width: int, loads: list[ir.Load], out: tuple[str, Buffer] | None,
                     vector: Callable[[str], None], scalar: Callable[[], None]) -> None:
        """``vector(base)`` on each chunk ``[base, base + V)`` of thread ``t``'s chunks ``t, t + T ...``
        when the row splits into aligned chunks, else ``scalar()``."""
        n = self.dim(axis.extent)
        pointers = sorted({f"b{self.plan.buffer_index(x.src)}" for x in loads} | ({out[0]} if out else set()))
        cond = " && ".join([f"{n} % {width}LL == 0", *(f"ak_rows_aligned({p})" for p in pointers)])
        self.open(f"if ({cond})")
        c = self.fresh("c")
        self.open(f"for (long long {c} = ak_tid; {c} < {n} / {width}LL; {c} += {self.threads}LL)")
        vector(self.x.let("long long", f"{c} * {width}LL"))
        self.close()
        self.close()
        self.open("else")
        scalar()
        self.close()

    def row_offset(self, buf: Buffer, subs: Sequence[ir.SExpr], axis: ir.Axis, base: str) -> str:
        """The offset of ``subs`` with ``axis`` at ``base`` (its values not kept for the elements)."""
        self.x.push()
        self.current[axis.name] = base
        where = self.offset(buf, subs)
        self.x.pop()
        return where

    def vector_elements(self, body: ir.SExpr, axis: ir.Axis, base: str, width: int, loads: list[ir.Load],
                        dtype: DType) -> list[str]:
        """``body`` (in ``dtype``'s compute type) at ``base + j`` for ``j < V``, its row loads read
        16 bytes at a time."""
        raw: dict[ir.Load, list[str]] = {}
        for e in loads:
            buf = self.buffer(e.src)
            ptr, per = f"b{self.plan.buffer_index(e.src)}", VECTOR[buf.dtype]
            where = self.row_offset(buf, e.indices, axis, base)
            words = []
            for k in range(width // per):
                q = self.fresh("q")
                self.emit(f"const ak_vec16 {q} = *(const ak_vec16*)({ptr} + {where} + {k * per}LL);")
                words.append(q)
            if buf.dtype is DType.F32:
                raw[e] = [f"ak_float({words[i // 4]}.w[{i % 4}])" for i in range(width)]
            else:
                raw[e] = [f"(unsigned short)({words[i // 8]}.w[{i % 8 // 2}]{' >> 16' if i % 2 else ''})"
                          for i in range(width)]
        self.hoist(body, {axis.name})
        values = []
        for j in range(width):
            self.x.push()
            self.current[axis.name] = self.x.let("long long", f"{base} + {j}LL")
            for e, elements in raw.items():  # the load's value is this element of its vector
                self.x.scopes[-1][e] = self.x.widen(self.x.let(STORAGE[e.dtype], elements[j]), e.dtype)
            values.append(self.x.value(body, dtype))
            self.x.pop()
        return values

    def vector_store(self, out: tuple[str, Buffer], op: ir.MapOp, axis: ir.Axis, base: str,
                     stored: list[str]) -> None:
        """Store a chunk of ``op``'s row (``stored``: storage-type values) 16 bytes at a time."""
        ptr, buf = out
        per = VECTOR[buf.dtype]
        where = self.row_offset(buf, tuple(ir.Idx(a.name) for a in op.axes), axis, base)
        for k in range(len(stored) // per):
            part = stored[k * per:(k + 1) * per]
            if buf.dtype is DType.F32:
                words = [f"ak_bits({v})" for v in part]
            else:
                words = [f"(unsigned)({lo}) | ((unsigned)({hi}) << 16)" for lo, hi in zip(part[::2], part[1::2])]
            self.emit(f"*(ak_vec16*)({ptr} + {where} + {k * per}LL) = ak_vec16{{{{{', '.join(words)}}}}};")

    def launch(self) -> LaunchSpec:
        """One block of ``T`` threads per row; the scratch (when an internal reduction needs one)."""
        rows = product([a.extent for a in self.members[-1].axes[:self.r]])
        scratch = dim_str(1 + self.scratch_words) if self.local else None
        return LaunchSpec(self.name, None, tuple(self.plan.buffer_index(b) for b in self.args), scratch,
                          (dim_str(rows),), (("block", self.threads),))
