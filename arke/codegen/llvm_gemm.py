"""LLVM rendering of the contraction family, the way BLIS does it.

One dispatch runs ``C[batch.., m, n] = epilogue(sum(A[.., m, k] * B[.., k, n] for k))``:

* The workers split (batch × column slabs of ``nc`` columns): each task owns whole columns,
  so every element's sum runs over k in the same order whatever the thread count.
* Per ``kc``-deep block of k, the task packs its slab of ``B`` into ``nr``-wide panels
  (``[panel][k][nr]``, converted to f32, zero beyond N) in its scratch memory. ``A`` is not
  packed: the micro-kernel broadcasts its elements straight from each row (a row block of
  ``A`` stays in L1 while the panels of ``B`` stream from L2).
* The micro-kernel keeps an ``mr × nr`` block of sums in vector registers (``mr × nr/lanes``
  accumulators of ``<lanes x float>``), one ``llvm.fma`` per accumulator per k step. Rows past
  M read the last row again (valid memory) and are never stored, so there are no edge cases
  in the hot loop.
* Sums collect in an f32 scratch tile ``[rows][nc]``; after the last k block the epilogue
  (bias, activation, residual, per-channel scale ...) is applied to each finished element and
  the result stored in its dtype.
* Few rows (M below :data:`GEMV_ROWS`: decode) with both operands contiguous along k, as in
  ``linear``: no packing; each output is a dot product along k with vector accumulators,
  four columns at a time, folded in a fixed order — this form is bound by reading ``B`` once.

Blocking comes from the strategy: ``tile m`` sets ``mr`` (register rows), ``tile n`` the slab
width ``nc``, ``tile k`` the depth ``kc``, ``vectorize n`` the lanes and ``unroll k`` the
micro-kernel's unrolling; the defaults suit AVX-512 (and shrink with ``vector_bits``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy

from arke.codegen.base import LaunchSpec
from arke.codegen.contraction import Contraction
from arke.codegen.llvm import STORAGE, _Function
from arke.codegen.llvm_convert import widen
from arke.codegen.plan import Dispatch, KernelPlan
from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, dim_str

#: Below this many rows a contraction contiguous along k runs as dot products (no packing).
GEMV_ROWS = 4


@dataclass(frozen=True)
class Blocking:
    """Register and cache blocking of one contraction."""

    lanes: int  # floats per vector
    mr: int  # rows of the register block
    nv: int  # vectors per register-block row (nr = nv * lanes)
    kc: int  # depth of a packed block of B
    nc: int  # columns per task (a multiple of nr)
    unroll: int  # unrolling of the micro-kernel's k loop

    @property
    def nr(self) -> int:
        return self.nv * self.lanes


def blocking(plan: KernelPlan, c: Contraction, vector_bits: int) -> Blocking:
    """The blocking for ``c``: the strategy's tiles where it gave them, else defaults for the width."""

    def value(kind: str, axis: str | None) -> int | None:
        d = plan.decision(kind, axis) if axis is not None else None
        return int(d.value) if d is not None and isinstance(d.value, int) else None

    lanes = value("vectorize", c.n) or max(4, vector_bits // 32)
    registers = 32 if vector_bits >= 512 else 16  # zmm0-31 with AVX-512, else 16 vector registers
    nv = 2
    mr = value("tile", c.m) or max(1, min(8 if registers == 32 else 6, (registers - nv - 2) // nv))
    mr = max(1, min(mr, 16))
    nr = nv * lanes
    nc = value("tile", c.n) or 256
    nc = max(nr, -(-nc // nr) * nr)
    kc = max(1, value("tile", c.k) or 512)
    return Blocking(lanes, mr, nv, kc, nc, max(1, value("unroll", c.k) or 1))


def render_contraction(plan: KernelPlan, d: Dispatch, entry: str, declare: Callable[[str], None],
                       vector_bits: int) -> tuple[str, LaunchSpec]:
    """The LLVM functions of one contraction dispatch and how to launch them."""
    assert isinstance(d.pattern, Contraction)
    g = _Gemm(plan, d, entry, declare, blocking(plan, d.pattern, vector_bits))
    text = g.render()
    extent = dim_str(g.parallel_extent) if g.parallel_extent is not None else None
    launch = LaunchSpec(entry, extent, tuple(plan.buffer_index(b) for b in g.args), dim_str(g.scratch_words()))
    return text, launch


class _Gemm(_Function):
    """Emits a contraction dispatch: the task loop, packing, micro-kernel calls and epilogue."""

    def __init__(self, plan: KernelPlan, d: Dispatch, name: str, declare: Callable[[str], None], blk: Blocking):
        assert isinstance(d.pattern, Contraction)
        self.c, self.blk = d.pattern, blk
        self.contract = d.members[0]
        self.accumulated: str | None = None  # the finished sum while the epilogue is rendered
        super().__init__(plan, d, name, declare)
        for op in d.members:
            self.extent.update({a.name: a.extent for a in op.axes})
        self.extent.update({a.name: a.extent for a in self.contract.reduce_axes})  # type: ignore[union-attr]

    def _buffers_used(self) -> set[str]:
        c = self.c
        names = {c.a.src, c.b.src}
        if c.epilogue is not None:
            names.add(c.epilogue.result)
            names |= {x.src for x in ir.walk(c.epilogue.body) if isinstance(x, ir.Load) and x.src != c.result}
        else:
            names.add(c.result)
        return names

    def _x_Load(self, e: ir.Load) -> str:
        if e.src == self.c.result and self.accumulated is not None:
            return self.accumulated
        return self.load(e)

    # -- sizes
    def rows(self) -> Dim:
        return self.extent[self.c.m] if self.c.m is not None else sympy.Integer(1)

    def padded_rows(self) -> Dim:
        mr = self.blk.mr
        return mr * sympy.floor((self.rows() + mr - 1) / mr)

    def scratch_words(self) -> Dim:
        """8-byte words of scratch per worker: packed B block, f32 sum tile, alignment slack."""
        floats = self.blk.kc * self.blk.nc + self.padded_rows() * self.blk.nc + 32
        return sympy.floor((floats + 1) / 2)

    def stride(self, load: ir.Load, axis: str) -> str:
        """Elements between neighbours along ``axis`` (a plain subscript of ``load``)."""
        shape = self.buffer(load.src).shape
        pos = next(p for p, s in enumerate(load.indices) if s == ir.Idx(axis))
        out: Dim = sympy.Integer(1)
        for extent in shape[pos + 1:]:
            out = out * extent
        return self.dim(out)

    def contiguous_k(self, load: ir.Load) -> bool:
        return load.indices[-1] == ir.Idx(self.c.k)

    def base(self, load: ir.Load, zero: tuple[str, ...]) -> str:
        """Address of ``load`` with the axes in ``zero`` at 0 (the batch axes at their current values)."""
        subs = tuple(ir.Const(0, DType.I64) if isinstance(s, ir.Idx) and s.name in zero else s
                     for s in load.indices)
        return self.address(self.buffer(load.src), subs)

    # -- small emitters
    def counted(self, tag: str, lo: str, hi: str, body: Callable[[str], None], step: int = 1) -> None:
        """``for (i = lo; i < hi; i += step) body(i)``."""
        self.loops_made += 1
        tag = f"{tag}.{self.loops_made}"
        counter = f"%{tag}.p"
        self.prologue.append(f"  {counter} = alloca i64")
        self.emit(f"store i64 {lo}, ptr {counter}")
        self.emit(f"br label %h.{tag}")
        self.label(f"h.{tag}")
        i = self.let(f"load i64, ptr {counter}")
        more = self.let(f"icmp slt i64 {i}, {hi}")
        self.emit(f"br i1 {more}, label %b.{tag}, label %e.{tag}")
        self.label(f"b.{tag}")
        body(i)
        nxt = self.let(f"add i64 {i}, {step}")
        self.emit(f"store i64 {nxt}, ptr {counter}")
        self.emit(f"br label %h.{tag}")
        self.label(f"e.{tag}")

    def branch(self, cond: str, then: Callable[[], None], other: Callable[[], None]) -> None:
        self.loops_made += 1
        tag = self.loops_made
        self.emit(f"br i1 {cond}, label %then.{tag}, label %else.{tag}")
        self.label(f"then.{tag}")
        then()
        self.emit(f"br label %join.{tag}")
        self.label(f"else.{tag}")
        other()
        self.emit(f"br label %join.{tag}")
        self.label(f"join.{tag}")

    def smin(self, a: str, b: str) -> str:
        lt = self.let(f"icmp slt i64 {a}, {b}")
        return self.let(f"select i1 {lt}, i64 {a}, i64 {b}")

    def to_f32(self, raw: str, dtype: DType, ty: str = "float") -> str:
        """A loaded scalar or vector (``ty`` is its float type) of storage ``dtype`` as f32."""
        src = ty.replace("float", STORAGE[dtype])
        if dtype is DType.F32:
            return raw
        if dtype is DType.I8:
            return self.let(f"sitofp {src} {raw} to {ty}")
        # 16-bit floats: exact conversions in plain integer code (no compiler-rt calls, any CPU)
        lanes = int(ty[1:].split(" x ")[0]) if ty.startswith("<") else 1
        name, definition = widen(STORAGE[dtype], lanes)
        self.declare(definition)
        return self.let(f"call {ty} {name}({src} {raw})")

    # -- the function
    def render(self) -> str:
        c, blk = self.c, self.blk
        self.prologue.append("  %errflag = alloca i1")
        self.prologue.append("  store i1 false, ptr %errflag")
        n_ext = self.dim(self.extent[c.n])
        tiles: Dim = sympy.floor((self.extent[c.n] + blk.nc - 1) / blk.nc)
        total: Dim = tiles
        for axis in c.batch:
            total = total * self.extent[axis]
        self.parallel_extent = total
        ntiles = self.dim(tiles)
        aligned = self.let("ptrtoint ptr %scratch to i64")
        aligned = self.let(f"add i64 {aligned}, 63")
        aligned = self.let(f"and i64 {aligned}, -64")
        packed = self.let(f"inttoptr i64 {aligned} to ptr")
        tile = self.let(f"getelementptr inbounds float, ptr {packed}, i64 {blk.kc * blk.nc}")

        def task(flat: str) -> None:
            jc = self.let(f"urem i64 {flat}, {ntiles}")
            rest = self.let(f"udiv i64 {flat}, {ntiles}")
            for axis in reversed(c.batch[1:]):
                e = self.dim(self.extent[axis])
                self.current[axis] = self.let(f"urem i64 {rest}, {e}")
                rest = self.let(f"udiv i64 {rest}, {e}")
            if c.batch:
                self.current[c.batch[0]] = rest
            n0 = self.let(f"mul i64 {jc}, {blk.nc}")
            left = self.let(f"sub i64 {n_ext}, {n0}")
            nc = self.smin(left, str(blk.nc))
            self.slab(n0, nc, packed, tile)

        self.counted("task", "%lo", "%hi", task)
        self.declare("declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)")
        self.declare(f"declare <{blk.lanes} x float> @llvm.fma.v{blk.lanes}f32(<{blk.lanes} x float>, "
                     f"<{blk.lanes} x float>, <{blk.lanes} x float>)")
        params = ", ".join(f"ptr noalias {self.ptr[b]}" for b in self.args)
        head = (f"define void @\"{self.name}\"({params}, ptr noalias %dims, i64 %lo, i64 %hi, ptr noalias %err, "
                "ptr noalias %scratch) {")
        tail = ["  %ef = load i1, ptr %errflag", "  %ez = zext i1 %ef to i64", "  %eo = load i64, ptr %err",
                "  %en = or i64 %eo, %ez", "  store i64 %en, ptr %err", "  ret void", "}"]
        main = "\n".join([head, "entry:", *self.prologue, "  br label %start", "start:", *self.body, *tail])
        return "\n\n".join([self.micro_kernel(), main])

    def slab(self, n0: str, nc: str, packed: str, tile: str) -> None:
        """One task: columns [n0, n0 + nc) of every row, for the current batch entry."""
        c, blk = self.c, self.blk
        m_ext = self.dim(self.rows())
        rows_pad = self.dim(self.padded_rows())
        zero = (c.k, c.n) + ((c.m,) if c.m is not None else ())
        a0 = self.base(c.a, zero)
        b0 = self.base(c.b, zero)
        bytes_ = self.let(f"mul i64 {rows_pad}, {4 * blk.nc}")
        self.emit(f"call void @llvm.memset.p0.i64(ptr align 64 {tile}, i8 0, i64 {bytes_}, i1 false)")
        if self.contiguous_k(c.a) and self.contiguous_k(c.b):
            few = self.let(f"icmp slt i64 {m_ext}, {GEMV_ROWS}")
            self.branch(few, lambda: self.dots(a0, b0, n0, nc, tile),
                        lambda: self.blocks(a0, b0, n0, nc, packed, tile))
        else:
            self.blocks(a0, b0, n0, nc, packed, tile)
        self.finish(n0, nc, tile)

    # -- packed blocks and micro-kernel calls
    def blocks(self, a0: str, b0: str, n0: str, nc: str, packed: str, tile: str) -> None:
        c, blk = self.c, self.blk
        k_ext = self.dim(self.extent[c.k])
        m_ext = self.dim(self.rows())
        sa_m = self.stride(c.a, c.m) if c.m is not None else "0"
        sa_k, sb_k, sb_n = self.stride(c.a, c.k), self.stride(c.b, c.k), self.stride(c.b, c.n)
        a_ty, b_ty = STORAGE[self.buffer(c.a.src).dtype], STORAGE[self.buffer(c.b.src).dtype]
        panels = self.let(f"add i64 {nc}, {blk.nr - 1}")
        panels = self.let(f"udiv i64 {panels}, {blk.nr}")
        last_row = self.let(f"sub i64 {m_ext}, 1")

        def depth(pc: str) -> None:
            left = self.let(f"sub i64 {k_ext}, {pc}")
            kc = self.smin(left, str(blk.kc))
            self.pack(b0, b_ty, n0, nc, pc, kc, sb_k, sb_n, panels, packed)
            a_pc = self.let(f"mul i64 {pc}, {sa_k}")

            def row_block(ir_: str) -> None:
                rows = []
                for r in range(blk.mr):
                    row = self.smin(self.let(f"add i64 {ir_}, {r}"), last_row)
                    off = self.let(f"mul i64 {row}, {sa_m}")
                    off = self.let(f"add i64 {off}, {a_pc}")
                    rows.append(self.let(f"getelementptr inbounds {a_ty}, ptr {a0}, i64 {off}"))
                c_row = self.let(f"mul i64 {ir_}, {blk.nc}")

                def panel(jr: str) -> None:
                    bp_off = self.let(f"mul i64 {jr}, {kc}")
                    bp = self.let(f"getelementptr inbounds float, ptr {packed}, i64 {bp_off}")
                    ct = self.let(f"add i64 {c_row}, {jr}")
                    cp = self.let(f"getelementptr inbounds float, ptr {tile}, i64 {ct}")
                    args = ", ".join(f"ptr {r}" for r in rows)
                    self.emit(f"call void @\"{self.name}.micro\"({args}, i64 {sa_k}, ptr {bp}, i64 {kc}, ptr {cp})")

                nr_cols = self.let(f"mul i64 {panels}, {blk.nr}")
                self.counted("jr", "0", nr_cols, panel, step=blk.nr)

            self.counted("ir", "0", m_ext, row_block, step=blk.mr)

        self.counted("pc", "0", k_ext, depth, step=blk.kc)

    def pack(self, b0: str, b_ty: str, n0: str, nc: str, pc: str, kc: str, sb_k: str, sb_n: str,
             panels: str, packed: str) -> None:
        """``packed[panel][kk][l] = f32(B[pc + kk, n0 + panel*nr + l])``, 0 past the slab's columns.

        When B is contiguous along n, whole panels are copied a row of ``nr`` at a time (vector
        loads along n); otherwise each column is read down k, the order B is stored in.
        """
        blk, b_dtype = self.blk, self.buffer(self.c.b.src).dtype
        if self.c.b.indices[-1] == ir.Idx(self.c.n):
            full = self.let(f"udiv i64 {nc}, {blk.nr}")
            vec, raw = f"<{blk.nr} x float>", f"<{blk.nr} x {b_ty}>"

            def row(kk: str) -> None:
                k = self.let(f"add i64 {pc}, {kk}")
                src = self.let(f"mul i64 {k}, {sb_k}")
                src = self.let(f"add i64 {src}, {n0}")

                def whole(p: str) -> None:
                    col = self.let(f"mul i64 {p}, {blk.nr}")
                    at = self.let(f"add i64 {src}, {col}")
                    ptr = self.let(f"getelementptr inbounds {b_ty}, ptr {b0}, i64 {at}")
                    v = self.to_f32(self.let(f"load {raw}, ptr {ptr}, align 1"), b_dtype, vec)
                    o = self.let(f"mul i64 {p}, {kc}")
                    o = self.let(f"add i64 {o}, {kk}")
                    o = self.let(f"mul i64 {o}, {blk.nr}")
                    q = self.let(f"getelementptr inbounds float, ptr {packed}, i64 {o}")
                    self.emit(f"store {vec} {v}, ptr {q}, align 4")

                self.counted("whole", "0", full, whole)
            self.counted("prow", "0", kc, row)
            self.pack_columns(b0, b_ty, n0, nc, pc, kc, sb_k, sb_n, full, panels, packed)
        else:
            self.pack_columns(b0, b_ty, n0, nc, pc, kc, sb_k, sb_n, "0", panels, packed)

    def pack_columns(self, b0: str, b_ty: str, n0: str, nc: str, pc: str, kc: str, sb_k: str, sb_n: str,
                     first: str, panels: str, packed: str) -> None:
        """Panels ``first`` to ``panels`` packed a column at a time (reading down k)."""
        blk, b_dtype = self.blk, self.buffer(self.c.b.src).dtype

        def panel(p: str) -> None:
            col0 = self.let(f"mul i64 {p}, {blk.nr}")
            dst0 = self.let(f"mul i64 {p}, {kc}")
            dst0 = self.let(f"mul i64 {dst0}, {blk.nr}")

            def column(lane: str) -> None:
                col = self.let(f"add i64 {col0}, {lane}")
                inside = self.let(f"icmp slt i64 {col}, {nc}")
                safe = self.let(f"select i1 {inside}, i64 {col}, i64 0")
                n = self.let(f"add i64 {n0}, {safe}")
                src = self.let(f"mul i64 {n}, {sb_n}")
                kb = self.let(f"mul i64 {pc}, {sb_k}")
                src = self.let(f"add i64 {src}, {kb}")
                dst = self.let(f"add i64 {dst0}, {lane}")

                def step(kk: str) -> None:
                    s = self.let(f"mul i64 {kk}, {sb_k}")
                    s = self.let(f"add i64 {src}, {s}")
                    ptr = self.let(f"getelementptr inbounds {b_ty}, ptr {b0}, i64 {s}")
                    v = self.to_f32(self.let(f"load {b_ty}, ptr {ptr}"), b_dtype)
                    v = self.let(f"select i1 {inside}, float {v}, float 0.0")
                    o = self.let(f"mul i64 {kk}, {blk.nr}")
                    o = self.let(f"add i64 {dst}, {o}")
                    q = self.let(f"getelementptr inbounds float, ptr {packed}, i64 {o}")
                    self.emit(f"store float {v}, ptr {q}")

                self.counted("kk", "0", kc, step)

            self.counted("lane", "0", str(blk.nr), column)

        self.counted("panel", first, panels, panel)

    def micro_kernel(self) -> str:
        """``c[r][0:nr] += sum over kk of f32(a_r[kk * sak]) * bp[kk][0:nr]`` for the mr rows."""
        blk, a_dtype = self.blk, self.buffer(self.c.a.src).dtype
        a_ty = STORAGE[a_dtype]
        vec = f"<{blk.lanes} x float>"
        fma = f"@llvm.fma.v{blk.lanes}f32"
        mr, nv = blk.mr, blk.nv
        lines = [f"define internal void @\"{self.name}.micro\"("
                 + ", ".join(f"ptr noalias %a{r}" for r in range(mr))
                 + ", i64 %sak, ptr noalias %bp, i64 %kc, ptr noalias %c) nounwind {", "entry:"]
        for r in range(mr):
            for v in range(nv):
                lines.append(f"  %cp{r}.{v} = getelementptr inbounds float, ptr %c, i64 {r * blk.nc + v * blk.lanes}")
                lines.append(f"  %c{r}.{v} = load {vec}, ptr %cp{r}.{v}, align 4")
        lines += ["  br label %loop", "loop:", "  %kk = phi i64 [ 0, %entry ], [ %kk1, %loop ]"]
        lines += [f"  %acc{r}.{v} = phi {vec} [ %c{r}.{v}, %entry ], [ %n{r}.{v}, %loop ]"
                  for r in range(mr) for v in range(nv)]
        lines.append(f"  %bo = mul i64 %kk, {blk.nr}")
        for v in range(nv):
            lines.append(f"  %bo{v} = add i64 %bo, {v * blk.lanes}")
            lines.append(f"  %bq{v} = getelementptr inbounds float, ptr %bp, i64 %bo{v}")
            lines.append(f"  %b{v} = load {vec}, ptr %bq{v}, align 4")
        lines.append("  %ao = mul i64 %kk, %sak")
        for r in range(mr):
            lines.append(f"  %aq{r} = getelementptr inbounds {a_ty}, ptr %a{r}, i64 %ao")
            lines.append(f"  %ar{r} = load {a_ty}, ptr %aq{r}")
            x = f"%ar{r}"
            if a_dtype is DType.I8:
                lines.append(f"  %af{r} = sitofp i8 {x} to float")
                x = f"%af{r}"
            elif a_dtype is not DType.F32:
                name, definition = widen(a_ty)
                self.declare(definition)
                lines.append(f"  %af{r} = call float {name}({a_ty} {x})")
                x = f"%af{r}"
            lines.append(f"  %ai{r} = insertelement {vec} poison, float {x}, i64 0")
            lines.append(f"  %as{r} = shufflevector {vec} %ai{r}, {vec} poison, <{blk.lanes} x i32> zeroinitializer")
            for v in range(nv):
                lines.append(f"  %n{r}.{v} = call {vec} {fma}({vec} %as{r}, {vec} %b{v}, {vec} %acc{r}.{v})")
        lines += ["  %kk1 = add i64 %kk, 1", "  %more = icmp slt i64 %kk1, %kc"]
        unroll = f", !llvm.loop !{{!\"llvm.loop.unroll.count\", i32 {blk.unroll}}}" if blk.unroll > 1 else ""
        lines += [f"  br i1 %more, label %loop, label %exit{unroll}", "exit:"]
        for r in range(mr):
            for v in range(nv):
                lines.append(f"  store {vec} %n{r}.{v}, ptr %cp{r}.{v}, align 4")
        lines += ["  ret void", "}"]
        return "\n".join(lines)

    # -- few rows: dot products along k
    def dots(self, a0: str, b0: str, n0: str, nc: str, tile: str) -> None:
        """Rows of C as dot products of A's row and four of B's rows at a time (both contiguous along k)."""
        c, blk = self.c, self.blk
        lanes, group = blk.lanes, 4
        vec = f"<{lanes} x float>"
        fma = f"@llvm.fma.v{lanes}f32"
        k_ext = self.dim(self.extent[c.k])
        m_ext = self.dim(self.rows())
        n_ext = self.dim(self.extent[c.n])
        sa_m = self.stride(c.a, c.m) if c.m is not None else "0"
        sb_n = self.stride(c.b, c.n)
        a_dtype, b_dtype = self.buffer(c.a.src).dtype, self.buffer(c.b.src).dtype
        full = self.let(f"and i64 {k_ext}, {-lanes}")
        rem = self.let(f"sub i64 {k_ext}, {full}")
        self.declare(f"declare {vec} @llvm.masked.load.v{lanes}f32.p0(ptr, i32, <{lanes} x i1>, {vec})")
        last_n = self.let(f"sub i64 {n_ext}, 1")
        lane_ids = "<" + ", ".join(f"i64 {i}" for i in range(lanes)) + ">"
        rem_ins = self.let(f"insertelement <{lanes} x i64> poison, i64 {rem}, i64 0")
        rem_v = self.let(f"shufflevector <{lanes} x i64> {rem_ins}, <{lanes} x i64> poison, "
                         f"<{lanes} x i32> zeroinitializer")
        mask = self.let(f"icmp slt <{lanes} x i64> {lane_ids}, {rem_v}")

        def vload(base: str, dtype: DType, at: str, masked: bool) -> str:
            ty = STORAGE[dtype]
            p = self.let(f"getelementptr inbounds {ty}, ptr {base}, i64 {at}")
            if not masked:
                return self.to_f32(self.let(f"load <{lanes} x {ty}>, ptr {p}, align 1"), dtype, vec)
            if dtype is DType.F32:
                return self.let(f"call {vec} @llvm.masked.load.v{lanes}f32.p0(ptr {p}, i32 4, <{lanes} x i1> "
                                f"{mask}, {vec} zeroinitializer)")
            vt = f"<{lanes} x {ty}>"
            suffix = {DType.BF16: "bf16", DType.F16: "f16", DType.I8: "i8"}[dtype]
            self.declare(f"declare {vt} @llvm.masked.load.v{lanes}{suffix}.p0(ptr, i32, <{lanes} x i1>, {vt})")
            raw = self.let(f"call {vt} @llvm.masked.load.v{lanes}{suffix}.p0(ptr {p}, i32 1, <{lanes} x i1> "
                           f"{mask}, {vt} zeroinitializer)")
            return self.to_f32(raw, dtype, vec)

        def row(m: str) -> None:
            a_off = self.let(f"mul i64 {m}, {sa_m}")
            a_row = self.let(f"getelementptr inbounds {STORAGE[a_dtype]}, ptr {a0}, i64 {a_off}")

            def columns(l0: str) -> None:
                b_rows = []
                for j in range(group):
                    n = self.let(f"add i64 {n0}, {l0}")
                    n = self.smin(self.let(f"add i64 {n}, {j}"), last_n)
                    off = self.let(f"mul i64 {n}, {sb_n}")
                    b_rows.append(self.let(f"getelementptr inbounds {STORAGE[b_dtype]}, ptr {b0}, i64 {off}"))
                accs = []
                for j in range(group):
                    p = f"%dot{j}.{self.loops_made}.{m[1:]}"
                    self.prologue.append(f"  {p} = alloca {vec}, align 64")
                    self.emit(f"store {vec} zeroinitializer, ptr {p}")
                    accs.append(p)

                def step(kk: str, masked: bool = False) -> None:
                    x = vload(a_row, a_dtype, kk, masked)
                    for j in range(group):
                        w = vload(b_rows[j], b_dtype, kk, masked)
                        acc = self.let(f"load {vec}, ptr {accs[j]}")
                        self.emit(f"store {vec} {self.let(f'call {vec} {fma}({vec} {x}, {vec} {w}, {vec} {acc})')}, "
                                  f"ptr {accs[j]}")

                self.counted("kv", "0", full, step, step=lanes)
                has_tail = self.let(f"icmp sgt i64 {rem}, 0")
                self.branch(has_tail, lambda: step(full, masked=True), lambda: None)
                for j in range(group):
                    total = self.hsum(self.let(f"load {vec}, ptr {accs[j]}"), lanes)
                    col = self.let(f"add i64 {l0}, {j}")
                    inside = self.let(f"icmp slt i64 {col}, {nc}")
                    at = self.let(f"mul i64 {m}, {blk.nc}")
                    at = self.let(f"add i64 {at}, {col}")
                    safe = self.let(f"select i1 {inside}, i64 {at}, i64 0")
                    q = self.let(f"getelementptr inbounds float, ptr {tile}, i64 {safe}")
                    old = self.let(f"load float, ptr {q}")
                    self.emit(f"store float {self.let(f'select i1 {inside}, float {total}, float {old}')}, ptr {q}")

            self.counted("cols", "0", nc, columns, step=group)

        self.counted("row", "0", m_ext, row)

    def hsum(self, v: str, lanes: int) -> str:
        """The lanes of ``v`` added pairwise, halves first: a fixed order."""
        while lanes > 1:
            half = lanes // 2
            lo = "<" + ", ".join(f"i32 {i}" for i in range(half)) + ">"
            hi = "<" + ", ".join(f"i32 {i + half}" for i in range(half)) + ">"
            a = self.let(f"shufflevector <{lanes} x float> {v}, <{lanes} x float> poison, <{half} x i32> {lo}")
            b = self.let(f"shufflevector <{lanes} x float> {v}, <{lanes} x float> poison, <{half} x i32> {hi}")
            v = self.let(f"fadd <{half} x float> {a}, {b}")
            lanes = half
        return self.let(f"extractelement <1 x float> {v}, i64 0")

    # -- the finished sums: epilogue and store
    def finish(self, n0: str, nc: str, tile: str) -> None:
        c, blk = self.c, self.blk
        m_ext = self.dim(self.rows())
        contract = self.contract
        out_op = c.epilogue if c.epilogue is not None else contract

        def row(m: str) -> None:
            if c.m is not None:
                self.current[c.m] = m
            base = self.let(f"mul i64 {m}, {blk.nc}")

            def column(col: str) -> None:
                self.current[c.n] = self.let(f"add i64 {n0}, {col}")
                at = self.let(f"add i64 {base}, {col}")
                q = self.let(f"getelementptr inbounds float, ptr {tile}, i64 {at}")
                total = self.let(f"load float, ptr {q}")
                if c.epilogue is None:
                    value = self.convert(total, DType.F32, contract.dtype)
                    self.store(self.buffer(c.result), [ir.Idx(a.name) for a in contract.axes], value, contract.dtype)
                    return
                for mine, theirs in zip(c.epilogue.axes, contract.axes):
                    self.current[mine.name] = self.current[theirs.name]
                # the sum is rounded to the contraction's dtype first, as the interpreter stores it
                self.accumulated = self.convert(total, DType.F32, contract.dtype)
                value = self.expr(c.epilogue.body)
                self.accumulated = None
                self.store(self.buffer(out_op.result), [ir.Idx(a.name) for a in out_op.axes], value, out_op.dtype)

            self.counted("col", "0", nc, column)

        self.counted("out", "0", m_ext, row)
