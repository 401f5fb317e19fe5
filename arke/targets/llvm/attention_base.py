"""The attention emitter's base (:mod:`arke.targets.llvm.attention_tiles`): small emitting helpers and
the state every piece of an attention dispatch reads."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, row_major_stride
from arke.plan.attention import KEY, VALUE, Attention
from arke.targets.llvm.function import LLVMFunction
from arke.targets.llvm.scalar import COMPUTE
from arke.targets.llvm.vec import NEG_INF, Vec
from arke.targets.llvm.vexpr import VectorExprMixin


class AttentionBase(VectorExprMixin, LLVMFunction):
    """Helpers and shared state of one attention dispatch's emitter."""

    pat: Attention
    vec: Vec
    w: int  # f32 lanes per vector
    nv: int  # key vectors per tile
    bk: int  # keys per tile
    dq: Dim  # D rounded up to whole 32-feature tile steps (AMX scores)
    algorithm: str  # "flash", "split_kv", "materialized" or "auto"
    convert_bf16: bool  # f32 -> bf16 by VCVTNEPS2BF16 (AVX512-BF16)
    unit: str | None  # the unit scores (and values) run on over bf16 pairs: AMX, AVX512-BF16 or None
    mrp: int  # rows per block of the values
    ne: int  # vectors of dv per block of the values

    # -- small helpers
    def i64(self, op: str, a: str, b: str) -> str:
        return self.let(f"{op} i64 {a}, {b}")

    def imin(self, a: str, b: str) -> str:
        return self.let(f"select i1 {self.let(f'icmp slt i64 {a}, {b}')}, i64 {a}, i64 {b}")

    def imax(self, a: str, b: str) -> str:
        return self.let(f"select i1 {self.let(f'icmp sgt i64 {a}, {b}')}, i64 {a}, i64 {b}")

    def gep(self, base: str, index: str, ty: str = "float") -> str:
        return self.let(f"getelementptr inbounds {ty}, ptr {base}, i64 {index}")

    def var(self, ty: str, init: str) -> str:
        """A mutable local (an alloca that mem2reg turns into registers), set to ``init`` here."""
        self.loops_made += 1
        name = f"%v.{self.loops_made}"
        self.prologue.append(f"  {name} = alloca {ty}")
        self.emit(f"store {ty} {init}, ptr {name}")
        return name

    def get(self, ty: str, at: str) -> str:
        return self.let(f"load {ty}, ptr {at}")

    def put(self, ty: str, value: str, at: str) -> None:
        self.emit(f"store {ty} {value}, ptr {at}")

    def walk_keys(self, name: str, count: str, j0: str, last: str, loads: Sequence[ir.SExpr],
                  body: Callable[[str], None]) -> None:
        """Loop ``name`` over ``[0, count)``, step ``t`` at key ``j0 + min(t, last)``: ``body(key)``.

        A paged cache's rows are read through ``blk[.., j / P]`` at slot ``j % P``: divisions by a
        dim, which LLVM cannot turn into shifts (``P`` is known only when the kernel runs), two per
        key and table. Every ``j / m`` and ``j % m`` in ``loads`` (``m`` a dim, so at least 1; a
        constant divisor is left to LLVM's shifts) is computed once at ``j0`` by the scalar code and then
        carried from key to key: the remainder steps up and wraps to 0 at ``m``, the quotient steps up
        when it wraps; a table entry read only through the quotient is read once per block.
        """
        wraps = _key_wraps(loads)
        if not wraps:
            self.loop(name, "0", count, lambda: body(self.i64("add", j0, self.imin(self.current[name], last))))
            return
        self.current[KEY] = j0
        state = {m: (self.var("i64", self.expr(ir.Binary("floordiv", ir.Idx(KEY), m, DType.I64))),
                     self.var("i64", self.expr(ir.Binary("mod", ir.Idx(KEY), m, DType.I64))), self.expr(m))
                 for m in dict.fromkeys(w.b for w in wraps)}

        quotients = [w for w in wraps if w.op != "mod"]
        blocks = _block_loads(loads, quotients)
        slots = {x: self.var(COMPUTE[x.dtype], "undef") for x in blocks}

        def step() -> None:
            t = self.current[name]
            saved = self.bound
            self.bound = dict(saved)
            for w in wraps:
                q, r, _ = state[w.b]
                self.bound[w] = self.get("i64", r if w.op == "mod" else q)
            if blocks:  # the block table read once per block: at the first key, and where a remainder wrapped
                fresh = self.let(f"icmp eq i64 {t}, 0")
                for _, r, _ in state.values():
                    wrapped = self.let(f"icmp eq i64 {self.get('i64', r)}, 0")
                    fresh = self.let(f"or i1 {fresh}, {wrapped}")

                def read() -> None:
                    for x in blocks:
                        self.put(COMPUTE[x.dtype], self.expr(x), slots[x])

                self.branch(fresh, read)
                for x in blocks:
                    self.bound[x] = self.get(COMPUTE[x.dtype], slots[x])
            body(self.i64("add", j0, self.imin(t, last)))
            self.bound = saved
            on = self.let(f"icmp slt i64 {t}, {last}")  # the next step reads the next key
            for q, r, m in state.values():
                qv, rv = self.get("i64", q), self.get("i64", r)
                r1 = self.i64("add", rv, "1")
                wrap = self.let(f"icmp eq i64 {r1}, {m}")
                r2 = self.let(f"select i1 {wrap}, i64 0, i64 {r1}")
                q2 = self.let(f"select i1 {wrap}, i64 {self.i64('add', qv, '1')}, i64 {qv}")
                self.put("i64", self.let(f"select i1 {on}, i64 {r2}, i64 {rv}"), r)
                self.put("i64", self.let(f"select i1 {on}, i64 {q2}, i64 {qv}"), q)

        self.loop(name, "0", count, step)

    def fexp(self, x: str) -> str:
        """Scalar exp through the vector one (lane 0), so every exp in the kernel is the same function."""
        return self.let(f"extractelement {self.vec.f} {self.vec.exp(self.vec.splat(x))}, i64 0")

    def fmax(self, a: str, b: str) -> str:
        """``a > b ? a : b`` (see :meth:`Vec.max` for why a NaN may be dropped)."""
        return self.let(f"select i1 {self.let(f'fcmp ogt float {a}, {b}')}, float {a}, float {b}")

    def safe(self, m: str) -> str:
        """The running max to subtract: 0 while it is -inf (every term so far is 0, never NaN)."""
        inf = self.let(f"fcmp oeq float {m}, {NEG_INF}")
        return self.let(f"select i1 {inf}, float 0.0, float {m}")

    def offset(self, load: ir.Load, given: dict[str, str]) -> str:
        """The element offset of ``load`` with the roles in ``given`` at those values; the other
        subscripts (batch expressions) are checked: out of range raises the error word, clamped."""
        buf = self.buffer(load.src)
        total = "0"
        for k, (sub, extent) in enumerate(zip(load.indices, buf.shape)):
            if isinstance(sub, ir.Idx) and sub.name in given:
                value = given[sub.name]
            else:
                value = self.subscript(sub, extent, buf, k)
            total = self.i64("add", total, self.i64("mul", value, self.dim(self.stride(buf.shape, k))))
        return total

    @staticmethod
    def stride(shape: tuple[Dim, ...], k: int) -> Dim:
        return row_major_stride(shape, k)

    def value_row(self, j0: str, k: str, e0: str) -> str:
        """Where key ``j0 + k``'s values from ``e0`` on are: at a stride, in the tile's row table
        (flash and split_kv), or looked up here (materialized, whose ``values`` runs over every key)."""
        if not self.pat.v_rows:
            return self.gep(self.vbase, self.i64("add", self.i64("mul", self.i64("add", j0, k), self.vstride), e0),
                            self.vty)
        if self.algorithm != "materialized":
            return self.gep(self.get("ptr", self.gep(self.at["VR"], k, "ptr")), e0, self.vty)
        if self.pat.group is not None:
            self.current[self.pat.group] = self.h0
        self.current[KEY] = self.i64("add", j0, k)
        return self.gep(self.ptr[self.pat.v.src], self.offset(self.pat.v, {VALUE: e0}), self.vty)

    # -- state the algorithms set up (see llvm_attention._Attention.task)
    at: dict[str, str]  # scratch arrays: KT, P, O, OM, M, L, A, MM, LM, QR, KS; row tables QP OP RI RH VA KL KH
    dp: Dim  # D rounded up to whole vectors
    epp: Dim  # dv rounded up to whole value blocks
    tp: Dim  # T rounded up to whole key tiles
    npad: str  # the task's rows rounded up to whole score blocks
    nrows: str
    h0: str  # the group's first head
    kbase: str
    vbase: str
    vty: str  # v's storage type: float, or i16 (bf16/f16 bits)
    kstride: str
    vstride: str


def _key_wraps(loads: Sequence[ir.SExpr]) -> list[ir.Binary]:
    """The ``j / m`` and ``j % m`` (``j`` the key index, ``m`` a dim) in ``loads``."""
    out: list[ir.Binary] = []
    for load in loads:
        for x in ir.walk(load):
            if isinstance(x, ir.Binary) and x.op in ("div", "floordiv", "mod") and x.dtype == DType.I64 \
                    and x.a == ir.Idx(KEY) and isinstance(x.b, ir.DimRef) and x not in out:
                out.append(x)
    return out


def _block_loads(loads: Sequence[ir.SExpr], quotients: Sequence[ir.Binary]) -> list[ir.Load]:
    """The loads within ``loads``' subscripts that read the key only through ``quotients`` (``blk[s, j / P]``):
    one value per block of keys. The outermost such loads only (an inner one is read as part of them)."""
    found: list[ir.Load] = []

    def visit(e: ir.SExpr, top: bool) -> None:
        if isinstance(e, ir.Load) and not top and _only_through(e, quotients):
            if e not in found:
                found.append(e)
            return
        for c in ir.children(e):
            visit(c, False)

    for load in loads:
        visit(load, True)
    return found


def _only_through(e: ir.SExpr, quotients: Sequence[ir.Binary]) -> bool:
    """Whether ``e`` reads the key index at all, and only inside ``quotients``."""
    def uses(x: ir.SExpr) -> tuple[bool, bool]:  # (reads the key, reads it outside the quotients)
        if x in quotients:
            return True, False
        if isinstance(x, ir.Idx):
            return x.name == KEY, x.name == KEY
        flags = [uses(c) for c in ir.children(x)]
        return any(a for a, _ in flags), any(b for _, b in flags)

    key, outside = uses(e)
    return key and not outside
