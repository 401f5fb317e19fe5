"""The shared machinery of the LLVM contraction renderer (:mod:`arke.targets.llvm.gemm`): addressing,
small emitters, the MR×NR micro-kernel and the few-rows (decode) forms: dot products along k, or
the prepacked panels of ``B`` streamed with ``A``'s elements broadcast.

Split from :mod:`arke.targets.llvm.gemm` to keep each file to one job: this one emits the
inner kernels, :mod:`arke.targets.llvm.gemm_pack` the packing, and that one the task loop and
epilogue around them.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, row_major_stride
from arke.plan.contraction import Contraction
from arke.targets.llvm.convert import FLOAT16, widen
from arke.targets.llvm.declarations import masked_load, masked_load_call, prefetch, vector_fma
from arke.targets.llvm.function import LLVMFunction
from arke.targets.llvm.scalar import STORAGE

#: Below this many rows a contraction contiguous along k runs as dot products (no packing).
GEMV_ROWS = 4
PREFETCH_STEPS = 64  # the micro-kernel prefetches its panel this many k steps (8 KB at nr = 32) ahead


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


class GemmBase(LLVMFunction):
    """Addressing, emitters and inner kernels of a contraction dispatch (see :class:`arke.targets.llvm.gemm._Gemm`)."""

    c: Contraction
    blk: Blocking
    plain_a: ir.Load | None
    plain_b: ir.Load | None
    packs_a: bool
    pre: str  # the prepacked panels of B, when they came (see :meth:`arke.targets.llvm.gemm._Gemm.panel_operand`)

    def rows(self) -> Dim:
        return self.extent[self.c.m] if self.c.m is not None else sympy.Integer(1)

    def stride(self, load: ir.Load, axis: str) -> str:
        """Elements between neighbours along ``axis`` (a plain subscript of ``load``)."""
        pos = next(p for p, s in enumerate(load.indices) if s == ir.Idx(axis))
        return self.dim(row_major_stride(self.buffer(load.src).shape, pos))

    def contiguous_k(self, load: ir.Load) -> bool:
        return load.indices[-1] == ir.Idx(self.c.k)

    def base(self, load: ir.Load, zero: tuple[str, ...]) -> str:
        """Address of ``load`` with the axes in ``zero`` at 0 (the batch axes at their current values)."""
        subs = tuple(ir.Const(0, DType.I64) if isinstance(s, ir.Idx) and s.name in zero else s
                     for s in load.indices)
        return self.address(self.buffer(load.src), subs)

    # -- small emitters
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
        name, definition = widen(FLOAT16[dtype], lanes)
        self.declare(definition)
        return self.let(f"call {ty} {name}({src} {raw})")

    def micro_kernel(self) -> str:
        """``c[r][0:nr] += sum over kk of f32(a_r[kk * sak]) * bp[kk][0:nr]`` for the mr rows."""
        blk = self.blk
        a_dtype = self.buffer(self.plain_a.src).dtype if self.plain_a is not None and not self.packs_a else DType.F32
        a_ty = STORAGE[a_dtype]
        vec = f"<{blk.lanes} x float>"
        fma, fma_declaration = vector_fma(blk.lanes)
        self.declare(fma_declaration)
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
        # the panel PREFETCH_STEPS steps ahead: with a few rows (batched decode) each panel row is used
        # once, and the hardware's prefetchers alone leave the micro-kernel waiting on memory
        lines.append(f"  %pfo = add i64 %bo, {PREFETCH_STEPS * blk.nr}")
        for v in range(nv):  # past the panel's end it names the next panel, or nothing (a prefetch never faults)
            lines.append(f"  %pfo{v} = add i64 %pfo, {v * blk.lanes}")
            lines.append(f"  %pfq{v} = getelementptr float, ptr %bp, i64 %pfo{v}")
            call, declaration = prefetch(f"%pfq{v}")
            self.declare(declaration)
            lines.append(f"  {call}")
        lines.append("  %ao = mul i64 %kk, %sak")
        for r in range(mr):
            lines.append(f"  %aq{r} = getelementptr inbounds {a_ty}, ptr %a{r}, i64 %ao")
            lines.append(f"  %ar{r} = load {a_ty}, ptr %aq{r}")
            x = f"%ar{r}"
            if a_dtype is DType.I8:
                lines.append(f"  %af{r} = sitofp i8 {x} to float")
                x = f"%af{r}"
            elif a_dtype is not DType.F32:
                name, definition = widen(FLOAT16[a_dtype])
                self.declare(definition)
                lines.append(f"  %af{r} = call float {name}(i16 {x})")
                x = f"%af{r}"
            lines.append(f"  %ai{r} = insertelement {vec} poison, float {x}, i64 0")
            lines.append(f"  %as{r} = shufflevector {vec} %ai{r}, {vec} poison, <{blk.lanes} x i32> zeroinitializer")
            for v in range(nv):
                lines.append(f"  %n{r}.{v} = call {vec} {fma}({vec} %as{r}, {vec} %b{v}, {vec} %acc{r}.{v})")
        lines += ["  %kk1 = add i64 %kk, 1", "  %more = icmp slt i64 %kk1, %kc"]
        unroll = ""
        if blk.unroll > 1:
            dispatch = int(self.name.rsplit(".d", 1)[1]) if ".d" in self.name else 0
            ident = 100000 * (dispatch + 1) + 99999
            self.declare(f'!{ident} = distinct !{{!{ident}, !{{!"llvm.loop.unroll.count", i32 {blk.unroll}}}}}')
            unroll = f", !llvm.loop !{ident}"
        lines += [f"  br i1 %more, label %loop, label %exit{unroll}", "exit:"]
        for r in range(mr):
            for v in range(nv):
                lines.append(f"  store {vec} %n{r}.{v}, ptr %cp{r}.{v}, align 4")
        lines += ["  ret void", "}"]
        return "\n".join(lines)

    # -- few rows: dot products along k
    def dots(self, pa: ir.Load | None, pb: ir.Load, a0: str, b0: str, n0: str, nc: str, tile: str,
             listed: tuple[str, str] | None = None) -> None:
        """Rows of C as dot products of A's row and eight of B's rows at a time (both contiguous along k):
        eight streams keep enough loads in flight to run at the memory's speed. ``pa`` None: A's
        rows were evaluated (through its prologue) into contiguous f32 rows at ``a0``. ``listed``: a
        routed contraction's row list and count (tile row ``i`` holds the ``i``-th listed row)."""
        c, blk = self.c, self.blk
        lanes, group = blk.lanes, 8
        vec = f"<{lanes} x float>"
        fma, fma_declaration = vector_fma(lanes)
        self.declare(fma_declaration)
        k_ext = self.dim(self.extent[c.k])
        m_ext = listed[1] if listed is not None else self.dim(self.rows())
        n_ext = self.dim(self.extent[c.n])
        if pa is not None:
            sa_m = self.stride(pa, c.m) if c.m is not None else "0"
            a_dtype = self.buffer(pa.src).dtype
        else:
            sa_m, a_dtype = k_ext, DType.F32
        sb_n = self.stride(pb, c.n)
        b_dtype = self.buffer(pb.src).dtype
        full = self.let(f"and i64 {k_ext}, {-lanes}")
        rem = self.let(f"sub i64 {k_ext}, {full}")
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
            self.declare(masked_load(lanes, ty)[1])
            raw = self.let(masked_load_call(lanes, ty, p, mask, 4 if dtype is DType.F32 else 1))
            return self.to_f32(raw, dtype, vec)

        def row(i: str) -> None:
            m = i
            if listed is not None:
                q = self.let(f"getelementptr inbounds i64, ptr {listed[0]}, i64 {i}")
                m = self.let(f"load i64, ptr {q}")
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
                    at = self.let(f"mul i64 {i}, {blk.nc}")
                    at = self.let(f"add i64 {at}, {col}")
                    safe = self.let(f"select i1 {inside}, i64 {at}, i64 0")
                    q = self.let(f"getelementptr inbounds float, ptr {tile}, i64 {safe}")
                    old = self.let(f"load float, ptr {q}")
                    if c.outer:  # a batch-reduce contraction: this step's sums add to the earlier steps'
                        total = self.let(f"fadd float {old}, {total}")
                    self.emit(f"store float {self.let(f'select i1 {inside}, float {total}, float {old}')}, ptr {q}")

            self.counted("cols", "0", nc, columns, step=group)

        self.counted("row", "0", m_ext, row)

    def panel_dots(self, pa: ir.Load | None, a0: str, n0: str, nc: str, tile: str) -> None:
        """``tile[r][col] = sum(A[r, k] * panel[k][col] for k)`` for the (at most three) rows, panel by
        panel: each panel row is loaded once for every row of A, and k runs in order.

        Several panels are streamed side by side (:data:`PANEL_STREAMS`): one sequential stream per
        core leaves this form at about two thirds of the memory's speed (a Xeon VM: 15 against 23 GB/s),
        as each stream has only so many lines in flight. A single row (decode at batch 1) takes four
        panels at once, two or three rows two (their sums fill the registers). The order of each sum
        is the same either way."""
        c = self.c
        k_ext = self.dim(self.extent[c.k])
        m_ext = self.dim(self.rows())
        if pa is not None:
            sa_m = self.stride(pa, c.m) if c.m is not None else "0"
            a_dtype = self.buffer(pa.src).dtype
        else:
            sa_m, a_dtype = k_ext, DType.F32
        a_ty = STORAGE[a_dtype]
        last_row = self.let(f"sub i64 {m_ext}, 1")
        a_rows = []
        for r in range(GEMV_ROWS - 1):
            row = self.smin(str(r), last_row)  # rows past M repeat the last one (never stored)
            off = self.let(f"mul i64 {row}, {sa_m}")
            a_rows.append(self.let(f"getelementptr inbounds {a_ty}, ptr {a0}, i64 {off}"))
        nr = self.blk.nr
        panels = self.let(f"add i64 {nc}, {nr - 1}")
        panels = self.let(f"udiv i64 {panels}, {nr}")
        first = self.let(f"udiv i64 {n0}, {nr}")
        one = self.let(f"icmp eq i64 {m_ext}, 1")
        run = _PanelRun(self, a_rows, a_dtype, first, k_ext, tile)
        self.branch(one, lambda: run.all(1, PANEL_STREAMS[0], panels),
                    lambda: run.all(GEMV_ROWS - 1, PANEL_STREAMS[1], panels))

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


#: Panels streamed side by side by decode's panel dots: for one row of A, for two or three.
PANEL_STREAMS = (4, 2)


class _PanelRun:
    """Decode's dot products over prepacked panels (:meth:`GemmBase.panel_dots`): groups of panels,
    each group's sums in registers while its panels stream in together."""

    def __init__(self, g: GemmBase, a_rows: list[str], a_dtype: DType, first: str, k_ext: str, tile: str):
        self.g, self.a_rows, self.a_dtype, self.first, self.k_ext, self.tile = g, a_rows, a_dtype, first, k_ext, tile

    def all(self, rows: int, group: int, panels: str) -> None:
        """Every panel of the slab: whole groups of ``group``, then the rest one by one."""
        g = self.g
        groups = g.let(f"udiv i64 {panels}, {group}")
        whole = g.let(f"mul i64 {groups}, {group}")
        g.counted("pg", "0", groups, lambda i: self.block(rows, [g.let(f"mul i64 {i}, {group}")], group))
        g.counted("pp", whole, panels, lambda p: self.block(rows, [p], 1))

    def block(self, rows: int, at: list[str], group: int) -> None:
        """Panels ``at[0] .. at[0] + group - 1`` of the slab, for A's first ``rows`` rows."""
        g, blk = self.g, self.g.blk
        lanes, nr, nv = blk.lanes, blk.nr, blk.nv
        vec = f"<{lanes} x float>"
        fma, fma_declaration = vector_fma(lanes)
        g.declare(fma_declaration)
        a_ty = STORAGE[self.a_dtype]
        span = g.let(f"mul i64 {self.k_ext}, {nr}")
        bases = []
        for j in range(group):
            p = g.let(f"add i64 {at[0]}, {j}")
            q = g.let(f"add i64 {self.first}, {p}")
            q = g.let(f"mul i64 {q}, {span}")
            bases.append(g.let(f"getelementptr inbounds float, ptr {g.pre}, i64 {q}"))
        accs = []
        for j in range(group * rows * nv):
            acc = f"%pacc{j}.{g.loops_made}"
            g.prologue.append(f"  {acc} = alloca {vec}, align 64")
            g.emit(f"store {vec} zeroinitializer, ptr {acc}")
            accs.append(acc)

        def step(k: str) -> None:
            off = g.let(f"mul i64 {k}, {nr}")
            if rows > 1:  # two or three rows: prefetched as the micro-kernel does (one row is as fast without)
                for base in bases:
                    for v in range(nv):
                        q = g.let(f"add i64 {off}, {PREFETCH_STEPS * nr + v * lanes}")
                        call, declaration = prefetch(g.let(f"getelementptr float, ptr {base}, i64 {q}"))
                        g.declare(declaration)
                        g.emit(call)
            ws = []
            for base in bases:
                for v in range(nv):
                    q = g.let(f"add i64 {off}, {v * lanes}")
                    q = g.let(f"getelementptr inbounds float, ptr {base}, i64 {q}")
                    ws.append(g.let(f"load {vec}, ptr {q}, align 4"))
            for r in range(rows):
                q = g.let(f"getelementptr inbounds {a_ty}, ptr {self.a_rows[r]}, i64 {k}")
                x = g.to_f32(g.let(f"load {a_ty}, ptr {q}"), self.a_dtype)
                one = g.let(f"insertelement <1 x float> poison, float {x}, i64 0")
                xs = g.let(f"shufflevector <1 x float> {one}, <1 x float> poison, <{lanes} x i32> zeroinitializer")
                for j in range(group):
                    for v in range(nv):
                        acc = accs[(j * rows + r) * nv + v]
                        old = g.let(f"load {vec}, ptr {acc}")
                        new = g.let(f"call {vec} {fma}({vec} {xs}, {vec} {ws[j * nv + v]}, {vec} {old})")
                        g.emit(f"store {vec} {new}, ptr {acc}")

        g.counted("pk", "0", self.k_ext, step)
        for j in range(group):
            col = g.let(f"add i64 {at[0]}, {j}")
            col = g.let(f"mul i64 {col}, {nr}")
            for r in range(rows):  # the tile has at least GEMV_ROWS - 1 rows (padded_rows): every store is inside
                for v in range(nv):
                    q = g.let(f"add i64 {r * blk.nc}, {col}")
                    q = g.let(f"add i64 {q}, {v * lanes}")
                    q = g.let(f"getelementptr inbounds float, ptr {self.tile}, i64 {q}")
                    total = g.let(f"load {vec}, ptr {accs[(j * rows + r) * nv + v]}")
                    if g.c.outer:  # a batch-reduce contraction: this step's sums add to the earlier steps'
                        total = g.let(f"fadd {vec} {g.let(f'load {vec}, ptr {q}')}, {total}")
                    g.emit(f"store {vec} {total}, ptr {q}")
