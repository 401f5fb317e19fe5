"""The pieces of the CUDA-C rows family (:mod:`arke.targets.cuda.rows`): its C helpers, its expressions,
blocks of C and memory accesses.

:class:`RowsBase` is a :class:`~arke.targets.cuda.render.CudaFunction` for a whole rows dispatch: it
keeps the state of the members (registers, inlined maps, scratch regions, the barrier
bookkeeping) and emits what every member form uses:

* blocks of C whose values are not reused after them (:meth:`RowsBase.open`/``close``), loops
  over a flattened domain strided by thread (:meth:`RowsBase.strided`), whose positions advance
  by carries instead of divisions (:meth:`RowsBase.walk`);
* a member's guard (:meth:`RowsBase.guard`): its loops run only on a domain with elements, and
  what does not move along them is evaluated once before them;
* subscripts checked once per block of C, raising a flag of the member (:meth:`RowsBase.check`);
  results stored to their buffer or their scratch region.

Several choices keep ptxas from spilling (every kernel must assemble without): no error flag is
carried through the whole function, a bool reduction accumulates in an ``int`` (not a predicate
register), 64-bit divisions (a call in SASS) are avoided or made 32-bit where the values allow,
and a declaration before each function asks for 1024 resident threads per SM, so ptxas has 64
registers a thread and no occupancy target of its own to spill for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, ceil_div, equal
from arke.passes.rewrite import map_expr
from arke.plan.dispatch import Buffer, Dispatch, KernelPlan
from arke.plan.exprs import floor_fraction, product
from arke.plan.rows import RowGroup
from arke.targets.artifact import UnsupportedError
from arke.targets.cuda.expr import COMPUTE, STORAGE, CExpr
from arke.targets.cuda.render import CudaFunction

#: Lanes of a warp.
WARP = 32
#: Threads per SM every rows kernel is compiled to keep resident (64 registers a thread).
RESIDENT = 1024
#: Elements of each float dtype in one 16-byte access.
VECTOR = {DType.F32: 4, DType.F16: 8, DType.BF16: 8}
#: The 16-bit floats (stored as bits, computed in f32).
HALF = frozenset({DType.F16, DType.BF16})

#: Put before each rows function (guarded: a kernel may have several): a shuffle for every
#: reduction type (CUDA has none for bool, char or short), Python's 64-bit integer division with one
#: division (32-bit when the operands fit), a 16-byte vector and an alignment test.
HELPERS = r"""
#ifndef AK_ROWS_HELPERS
#define AK_ROWS_HELPERS
template <typename T> static __device__ __forceinline__ T ak_rows_shfl(T v, int m) {
  return __shfl_xor_sync(0xffffffffu, v, m);
}
static __device__ __forceinline__ bool ak_rows_shfl(bool v, int m) {
  return __shfl_xor_sync(0xffffffffu, (int)v, m) != 0;
}
static __device__ __forceinline__ signed char ak_rows_shfl(signed char v, int m) {
  return (signed char)__shfl_xor_sync(0xffffffffu, (int)v, m);
}
static __device__ __forceinline__ unsigned char ak_rows_shfl(unsigned char v, int m) {
  return (unsigned char)__shfl_xor_sync(0xffffffffu, (unsigned)v, m);
}
static __device__ __forceinline__ unsigned short ak_rows_shfl(unsigned short v, int m) {
  return (unsigned short)__shfl_xor_sync(0xffffffffu, (unsigned)v, m);
}
static __device__ __forceinline__ unsigned long long ak_rows_udiv(unsigned long long a, unsigned long long b) {
  /* one division, 32-bit when it can: a 64-bit one is a call in SASS (ptxas spills around calls) */
  return ((a | b) >> 32) == 0ull ? (unsigned long long)((unsigned)a / (unsigned)b) : a / b;
}
static __device__ __forceinline__ long long ak_rows_floordiv(long long a, long long b) { /* b != 0 */
  unsigned long long ua = a < 0 ? 0ull - (unsigned long long)a : (unsigned long long)a;
  unsigned long long ub = b < 0 ? 0ull - (unsigned long long)b : (unsigned long long)b;
  unsigned long long q = ak_rows_udiv(ua, ub);
  if ((a < 0) != (b < 0) && q * ub != ua) q += 1ull; /* a negative quotient with a remainder: floor */
  return (long long)((a < 0) != (b < 0) ? 0ull - q : q); /* MIN / -1 wraps to MIN */
}
static __device__ __forceinline__ long long ak_rows_mod(long long a, long long b) { /* b != 0: the divisor's sign */
  return (long long)((unsigned long long)a - (unsigned long long)ak_rows_floordiv(a, b) * (unsigned long long)b);
}
struct __align__(16) ak_vec16 { unsigned int w[4]; };
static __device__ __forceinline__ bool ak_rows_aligned(const void* p) {
  return ((unsigned long long)p & 15ull) == 0ull;
}
#endif
"""


def inline_map(op: ir.MapOp, subs: Sequence[ir.SExpr]) -> ir.SExpr:
    """An internal map's value at ``subs``: its body with its axes replaced, rounded to its dtype."""
    names = {a.name: s for a, s in zip(op.axes, subs)}
    body = map_expr(op.body, lambda x: names.get(x.name, x) if isinstance(x, ir.Idx) else x)
    if op.dtype in HALF:  # stored, it would have been rounded: round as the interpreter does
        body = ir.Cast(ir.Cast(body, DType.F32), op.dtype)
    return body


def acc_type(dtype: DType) -> str:
    """The C type a reduction accumulates in: its compute type, but ``int`` for a bool (0 or 1):
    a ``bool`` carried through a loop lives in a predicate register, and ptxas spills those."""
    return "int" if dtype is DType.BOOL else COMPUTE[dtype]


class RowExpr(CExpr):
    """:class:`CExpr` where a load of a per-row value reads its register, checked subscripts are
    kept per block of C like values (``checks``), and an integer division checks its divisor
    itself (raising the member's flag) and divides 64-bit integers with ``ak_rows_floordiv``."""

    def __init__(self, fn: RowsBase):
        super().__init__(fn.emit, lambda a: fn.current[a], lambda r: fn.dim(r.dim), fn.load)
        self.registers, self.fail = fn.registers, fn.fail
        self.checks: list[dict[tuple[str, str], str]] = [{}]

    def reset(self) -> None:
        """Forget every value (a new member: its axis names may mean other axes)."""
        self.scopes, self.checks = [{}], [{}]

    def push(self) -> None:
        super().push()
        self.checks.append({})

    def pop(self) -> None:
        super().pop()
        self.checks.pop()

    def _x_Load(self, e: ir.Load) -> str:
        reg = self.registers.get(e.src)
        return reg if reg is not None else super()._x_Load(e)

    def int_binary(self, op: str, a: str, b: str, dtype: DType) -> str:
        if op not in ("div", "floordiv", "mod"):
            return super().int_binary(op, a, b, dtype)
        ty = COMPUTE[dtype]
        zero = self.let("bool", f"{b} == ({ty})0")
        self.fail(zero)  # a zero divisor divides as 1
        safe = self.let(ty, f"{zero} ? ({ty})1 : {b}")
        if dtype is DType.I64:  # ak_floordiv's 64-bit '/' and '%' are two calls in SASS
            return f"ak_rows_{'mod' if op == 'mod' else 'floordiv'}({a}, {safe})"
        return super().int_binary(op, a, safe, dtype)


class RowsBase(CudaFunction):
    """One rows dispatch's function: the state of its members and the pieces every member form uses."""

    x: RowExpr

    def __init__(self, plan: KernelPlan, dispatch: Dispatch, name: str, warps: int):
        if not isinstance(dispatch.pattern, RowGroup):
            raise UnsupportedError(f"{name}: a rows dispatch needs its RowGroup pattern")
        # CudaFunction's own __init__ takes the buffers of one op (some would be internal here):
        # the state its helpers (dim, offset, load, nest) use is set up here instead
        self.plan, self.d, self.name, self.op = plan, dispatch, name, dispatch.op
        self.lines: list[str] = []
        self.prologue: list[str] = []
        self.depth = 1
        self.dims: dict[str, str] = {}
        self.current: dict[str, str] = {}
        self.extent: dict[str, Dim] = {}
        self.parallel_extent: Dim = sympy.Integer(1)
        self.r = dispatch.pattern.rows
        self.warps, self.threads = warps, warps * WARP
        self.members = dispatch.members
        self.internal = set(dispatch.internal)
        self.results = {op.result for op in self.members}
        self.registers: dict[str, str] = {}  # a value per row -> the C variable every thread holds it in
        self.inlined: dict[str, ir.MapOp] = {}  # an internal map with free axes (its body inlined already)
        self.local: dict[str, tuple[str, Buffer]] = {}  # an internal reduction in scratch -> (pointer, layout)
        self.scratch_words: Dim = sympy.Integer(0)
        self.written: set[str] = set()  # values in memory that threads wrote since the last barrier
        self.shared: list[str] = []  # ``__shared__`` declarations
        self.flag: str | None = None  # the error flag of the member's loops
        self.names = 0
        used = set(self.results)
        for op in self.members:
            if isinstance(op, ir.ContractOp):  # the matcher leaves contractions to their family
                raise UnsupportedError(f"{name}: a contraction cannot be a member of a rows dispatch")
            used |= {x.src for x in ir.walk(op.body) if isinstance(x, ir.Load)}
        self.args = sorted(used - self.internal, key=plan.buffer_index)
        self.x = RowExpr(self)

    def fresh(self, stem: str) -> str:
        self.names += 1
        return f"ak_{stem}{self.names}"

    # -- blocks of C
    def open(self, head: str) -> None:
        """``head {``: a C block, whose values are not reused after it."""
        self.emit(f"{head} {{")
        self.depth += 1
        self.x.push()

    def close(self) -> None:
        self.x.pop()
        self.depth -= 1
        self.emit("}")

    def narrow_digits(self, flat: str, axes: Sequence[ir.Axis]) -> list[str]:
        """The row-major positions over ``axes`` of ``flat``, a value under 2**31 (a block or thread
        index, a step): 32-bit division is exact for it (an extent past 2**32 - 1 divides as
        2**32 - 1, which is past ``flat`` too), and a 64-bit one is a call in SASS, around which
        ptxas spills."""
        out: list[str] = []
        rest = flat
        for a in reversed(axes[1:]):
            n = self.x.let("unsigned", f"{self.dim(a.extent)} < 4294967295LL ? (unsigned){self.dim(a.extent)} "
                                       ": 4294967295u")
            out.append(self.x.let("long long", f"(long long)((unsigned)({rest}) % {n})"))
            rest = self.x.let("long long", f"(long long)((unsigned)({rest}) / {n})")
        return [rest, *reversed(out)] if axes else []

    def walk(self, axes: Sequence[ir.Axis], start: str, step: int) -> tuple[Callable[[str], None], Callable[[], None]]:
        """The positions of ``axes`` at flat indices ``start, start + step ...`` with no division in
        the loop: ``(enter, advance)``. Before the loop, the digits of ``start`` and ``step``; at the
        top of the body ``enter(flat)`` sets the current positions (``flat``: the loop's index, all
        one axis needs); at its end ``advance()`` adds the step's digits, carrying once per axis
        (each digit and position is under its extent, so one subtraction suffices)."""
        if len(axes) < 2:
            def one(flat: str) -> None:
                for a in axes:
                    self.current[a.name] = flat
            return one, lambda: None
        pos = [self.fresh("p") for _ in axes]
        for p, v in zip(pos, self.narrow_digits(start, axes)):
            self.emit(f"long long {p} = {v};")
        digits = self.narrow_digits(str(step) + "LL", axes)

        def enter(flat: str) -> None:
            for a, p in zip(axes, pos):
                self.current[a.name] = self.x.let("long long", p)

        def advance() -> None:
            for p, d in zip(pos, digits):
                self.emit(f"{p} += {d};")
            for k in range(len(axes) - 1, 0, -1):
                n = self.dim(axes[k].extent)
                self.emit(f"if ({pos[k]} >= {n}) {{ {pos[k]} -= {n}; {pos[k - 1]} += 1; }}")

        return enter, advance

    def strided(self, axes: Sequence[ir.Axis], inner: Callable[[], None], start: str = "ak_tid",
                step: int | None = None) -> None:
        """``inner`` at elements ``start, start + step ...`` of the flattened domain of ``axes``."""
        step = step or self.threads
        enter, advance = self.walk(axes, start, step)
        f = self.fresh("f")
        self.open(f"for (long long {f} = {start}; {f} < {self.dim(product([a.extent for a in axes]))}; "
                  f"{f} += {step}LL)")
        enter(f)
        inner()
        advance()
        self.close()

    # -- memory
    def offset(self, buf: Buffer, subs: Sequence[ir.SExpr]) -> str:
        """:meth:`CudaFunction.offset`, its checks written out (see :meth:`check`)."""
        offset = "0LL"
        for k, (s, extent) in enumerate(zip(subs, buf.shape)):
            v = self.x.value(s, DType.I64)
            if self.checked(s, extent):
                v = self.check(v, extent)
            offset = v if k == 0 else self.x.let("long long", f"{offset} * {self.dim(extent)} + {v}")
        return offset

    def checked(self, s: ir.SExpr, extent: Dim) -> bool:
        """Whether subscript ``s`` of an axis of ``extent`` needs a check (it is not plainly in range)."""
        if isinstance(s, ir.Idx) and s.name in self.extent and equal(self.extent[s.name], extent) is True:
            return False
        return not (isinstance(s, ir.Const) and int(s.value) == 0)  # 0: a broadcast axis

    def check(self, v: str, extent: Dim) -> str:
        """``v`` if it is in ``[0, extent)``, else 0 with the error word raised; once per block of C.

        The error is raised by :meth:`fail`."""
        n = self.dim(extent)
        for scope in reversed(self.x.checks):
            if (v, n) in scope:
                return scope[v, n]
        bad = self.x.let("bool", f"{v} < 0LL || {v} >= {n}")
        self.fail(bad)
        safe = self.x.let("long long", f"{bad} ? 0LL : {v}")  # clamped: never a wild read
        self.x.checks[-1][v, n] = safe
        return safe

    def _dim(self, d: sympy.Expr) -> str:
        if isinstance(d, sympy.floor):  # as CudaFunction's, with no 64-bit division (a call in SASS)
            num, den = floor_fraction(d.args[0])
            return f"ak_rows_floordiv({self.dim(num)}, {self.dim(den)})"
        if isinstance(d, sympy.Mod):
            return f"ak_rows_mod({self.dim(d.args[0])}, {self.dim(d.args[1])})"
        return super()._dim(d)

    def load(self, e: ir.Load) -> str:
        if e.src in self.local:
            ptr, buf = self.local[e.src]
            return self.x.let(STORAGE[buf.dtype], f"{ptr}[{self.offset(buf, e.indices)}]")
        return super().load(e)

    def target(self, name: str) -> tuple[str, Buffer]:
        """Where a member's result goes: its scratch region, or its buffer."""
        if name in self.local:
            return self.local[name]
        return f"b{self.plan.buffer_index(name)}", self.buffer(name)

    def store(self, op: ir.MapOp | ir.ReduceOp, value: str) -> None:
        """Store ``value`` (compute type) as ``op``'s element at the current positions."""
        ptr, buf = self.target(op.result)
        where = self.offset(buf, tuple(ir.Idx(a.name) for a in op.axes))
        self.emit(f"{ptr}[{where}] = {self.x.narrow(value, op.dtype)};")

    def place_scratch(self, op: ir.ReduceOp) -> None:
        """Give an internal reduction a region of the scratch: every row's elements, packed in
        8-byte words (each block writes its row's part)."""
        ptr, ty = self.fresh("s"), STORAGE[op.dtype]
        start = self.dim(1 + self.scratch_words)
        self.prologue.append(f"  {ty}* const {ptr} = ({ty}*)(err + {start});")
        self.local[op.result] = (ptr, Buffer(op.result, op.dtype, op.type.shape, "temp"))
        per_word = 8 // max(1, op.dtype.bits // 8)  # elements of the storage type (a bool: a byte)
        self.scratch_words = sympy.expand(self.scratch_words + ceil_div(product(op.type.shape), per_word))

    def guard(self, axes: Sequence[ir.Axis], body: ir.SExpr) -> None:
        """Open ``if (the domain of axes is not empty)`` and evaluate there, once, the parts of ``body``
        that do not move along ``axes`` (a row's statistic, ``h / R``: the loops below reuse them, and
        no 64-bit division or slow-path call is left in a loop). Only a domain with elements evaluates
        them, as in the interpreter; the condition is the same in every thread (collectives may follow)."""
        self.open(f"if ({self.dim(product([a.extent for a in axes]))} > 0LL)")
        self.flag = self.fresh("bad")
        self.emit(f"bool {self.flag} = false; /* a bad subscript or a zero divisor in this member */")
        self.hoist(body, {a.name for a in axes})

    def unguard(self) -> None:
        """Close :meth:`guard`'s block: store the error word if the member raised its flag."""
        self.emit(f"if ({self.flag}) *err = 1LL; /* every failing thread stores the same value: no atomic */")
        self.flag = None
        self.close()

    def fail(self, bad: str) -> None:
        """Raise the error where ``bad`` holds: the member's flag inside its loops, else the error word.

        Not a flag of the whole function, as ``ak_check``'s: one carried through every loop is
        what ptxas spills."""
        self.emit(f"{self.flag} |= {bad};" if self.flag else f"if ({bad}) *err = 1LL;")

    def hoist(self, e: ir.SExpr, moving: set[str]) -> None:
        """Evaluate the largest parts of ``e`` that read no axis of ``moving`` (kept in the current
        scope), and check the subscripts of the loads that move which do not move themselves."""
        def still(x: ir.SExpr) -> bool:
            return not any(isinstance(y, ir.Idx) and y.name in moving for y in ir.walk(x))

        if isinstance(e, ir.Const | ir.Idx | ir.DimRef):
            return
        if still(e):
            self.x.value(e)
            return
        if isinstance(e, ir.Load) and e.src not in self.registers:
            buf = self.local[e.src][1] if e.src in self.local else self.buffer(e.src)
            for sub, extent in zip(e.indices, buf.shape):
                if still(sub) and self.checked(sub, extent):
                    self.check(self.x.value(sub, DType.I64), extent)
        for c in ir.children(e):
            self.hoist(c, moving)

    # -- the text
    def text(self) -> str:
        params = []
        for b in self.args:
            buf = self.buffer(b)
            const = "" if b in self.results else "const "
            params.append(f"{const}{STORAGE[buf.dtype]}* __restrict__ b{self.plan.buffer_index(b)}")
        params += ["const long long* __restrict__ dims", "long long* __restrict__ err"]
        # given the threads alone, ptxas aims at an occupancy of its own and spills a register or
        # two to reach it; a declaration first asks for the blocks of 1024 threads per SM (at most
        # 64 registers a thread), which every rows kernel fits without spilling
        blocks = max(1, RESIDENT // self.threads)
        declaration = (f'extern "C" __global__ __launch_bounds__({self.threads}, {blocks}) void '
                       f'{self.name}({", ".join(params)}); /* not an entry head: heads are matched on `void` */')
        head = (f'extern "C" __global__ void __launch_bounds__({self.threads}) '
                f'{self.name}({", ".join(params)}) {{')
        # ``ak_err``: the flag of cuda_expr's helpers (an integer power); the checks raise their own
        tail = ["  if (ak_err) *err = 1; /* every failing thread stores the same value: no atomic */", "}"]
        shared = [f"  {s}" for s in self.shared]
        return "\n".join([declaration, head, *shared, "  bool ak_err = false;", *self.prologue, *self.lines, *tail])
