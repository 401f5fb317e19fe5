"""int8 contractions on AVX512-VNNI (``VPDPBUSD``), where the CPU has no AMX (AMD Zen 4/5, older Xeons).

``VPDPBUSD`` adds to each of 16 i32 lanes the four products of an *unsigned* byte of one operand and
a *signed* byte of the other. Both sides of ``sum(i32(x[m, k]) * i32(w[n, k]) for k)`` are signed,
so ``x``'s bytes are fed with their sign bit flipped — ``x + 128``, unsigned — and the sum picks up
``128 · Σ_k w[n, k]``, which is taken off each column when it is finished:

    Σ (x + 128) · w  −  128 · Σ w  =  Σ x · w        (exactly, in i32: every term is an integer)

The column sums come from the same instruction (unsigned ones times the packed weights), once per
k-block as ``B`` is packed, into a row of ``nc`` i32 in the worker's scratch. The micro-kernel holds
an 8 × 32 block of sums in sixteen ``<16 x i32>`` registers; per four k it broadcasts each row's
four bytes (one 32-bit word, sign bits flipped) and multiplies them into the two vectors of the
panel's row. ``B``'s VNNI panels and ``A``'s blocks are :mod:`arke.targets.llvm.gemm_bf16`'s.
"""

from __future__ import annotations

from arke.targets.llvm.gemm_pack import GemmPacking

#: Columns of a VNNI panel of B (:mod:`arke.targets.llvm.gemm_bf16` packs them for every unit).
PANEL = 32
UNIT_NR = PANEL

DPBUSD = "@llvm.x86.avx512.vpdpbusd.512"
_DECLARATION = f"declare <16 x i32> {DPBUSD}(<16 x i32>, <64 x i8>, <64 x i8>)"
#: Rows of the smaller micro-kernels a block with that few rows inside M calls (decode at batch 1 to 4):
#: the 8-row form would spend up to eight times the products, which bound a step once B streams fast.
FEW_ROWS = (1, 2, 4)
#: 0x80808080 as an i32: the sign bit of each of a word's four bytes.
FLIP = -2139062144
#: What the sum of a column gains from the flipped sign bits: 128 times the column's weights.
BIAS = 128


class GemmVnni(GemmPacking):
    """The VNNI micro-kernel and its column correction (see the module's docstring)."""

    corr: str  # the task's row of nc i32 column sums of B (VNNI only)

    def column_sums(self, kcp: str, panels: str, packed: str) -> None:
        """``corr[col] += Σ over the packed k-block of B[k, col]`` (zero padding adds nothing)."""
        self.declare(_DECLARATION)
        ones = "<" + ", ".join(["i8 1"] * 64) + ">"
        quads = self.let(f"udiv i64 {kcp}, 4")

        def panel(p: str) -> None:
            for v in range(2):
                col = self.let(f"mul i64 {p}, {UNIT_NR}")
                col = self.let(f"add i64 {col}, {16 * v}")
                q = self.let(f"getelementptr inbounds i32, ptr {self.corr}, i64 {col}")

                def row(kq: str, v: int = v, q: str = q) -> None:
                    at = self.let(f"mul i64 {p}, {quads}")
                    at = self.let(f"add i64 {at}, {kq}")
                    at = self.let(f"mul i64 {at}, {UNIT_NR}")
                    at = self.let(f"add i64 {at}, {16 * v}")
                    src = self.let(f"getelementptr inbounds i32, ptr {packed}, i64 {at}")
                    b = self.let(f"load <64 x i8>, ptr {src}")
                    old = self.let(f"load <16 x i32>, ptr {q}, align 4")
                    new = self.let(f"call <16 x i32> {DPBUSD}(<16 x i32> {old}, <64 x i8> {ones}, <64 x i8> {b})")
                    self.emit(f"store <16 x i32> {new}, ptr {q}, align 4")

                self.counted("cs", "0", quads, row)

        self.counted("csp", "0", panels, panel)

    def corrected(self, total: str, col: str) -> str:
        """A finished column's sum less what the flipped sign bits added (``BIAS`` times its weights)."""
        q = self.let(f"getelementptr inbounds i32, ptr {self.corr}, i64 {col}")
        extra = self.let(f"mul i32 {self.let(f'load i32, ptr {q}')}, {BIAS}")
        return self.let(f"sub i32 {total}, {extra}")

    def vnni_kernel(self) -> str:
        """``c[r][0:32] += Σ over k of A[r][k] · panel[k][0:32]`` for 8 rows (and the fewer rows of
        :data:`FEW_ROWS`), k a multiple of 64."""
        self.declare(_DECLARATION)
        return self.register_blocks("<16 x i32>", "<64 x i8>", DPBUSD, per_word=4, flip=FLIP)

    def register_blocks(self, vec: str, operand: str, dot: str, per_word: int, flip: int | None = None) -> str:
        """:meth:`register_block` for the unit's rows (``.unit``) and for each of :data:`FEW_ROWS` (``.unit<r>``)."""
        return "\n\n".join(self.register_block(vec, operand, dot, per_word, flip, rows)
                           for rows in (self.blk.mr, *self.few_rows))

    @property
    def few_rows(self) -> tuple[int, ...]:
        """The rows of the smaller micro-kernels (:data:`FEW_ROWS` below the unit's own)."""
        return tuple(r for r in FEW_ROWS if r < self.blk.mr)

    def register_block(self, vec: str, operand: str, dot: str, per_word: int, flip: int | None = None,
                       rows: int | None = None) -> str:
        """The vector micro-kernel of a dot-product unit (``VDPBF16PS``, ``VPDPBUSD``): an ``mr × 32`` block of
        sums in ``2·mr`` registers of 16 lanes; per ``per_word`` k each row's word of A (its bits xor-ed
        with ``flip`` first, if given) is broadcast and ``dot(acc, word, panel row)`` runs on both vectors.
        ``rows`` below the unit's ``mr``: the same for the block's first ``rows`` rows only (``.unit<rows>``),
        for a block with no more rows inside M (decode), whose other rows' products would be wasted."""
        nc = self.blk.nc
        mr = self.blk.mr if rows is None else rows
        name = f"{self.name}.unit" + ("" if mr == self.blk.mr else str(mr))
        lane = vec.split(" x ")[1].rstrip(">")
        lines = [f"define internal void @\"{name}\"(ptr noalias %a, i64 %sa, i64 %ka, i64 %a16, "
                 "ptr noalias %bp, i64 %kc, ptr noalias %c) nounwind {", "entry:"]
        for r in range(mr):
            lines.append(f"  %ro{r} = mul i64 %sa, {r}")
            lines.append(f"  %a{r} = getelementptr i8, ptr %a, i64 %ro{r}")
            for v in range(2):
                lines.append(f"  %cp{r}.{v} = getelementptr inbounds {lane}, ptr %c, i64 {r * nc + 16 * v}")
                lines.append(f"  %c{r}.{v} = load {vec}, ptr %cp{r}.{v}, align 4")
        lines += ["  br label %loop", "loop:", "  %kk = phi i64 [ 0, %entry ], [ %kk1, %loop ]"]
        lines += [f"  %acc{r}.{v} = phi {vec} [ %c{r}.{v}, %entry ], [ %n{r}.{v}, %loop ]"
                  for r in range(mr) for v in range(2)]
        lines.append(f"  %bo = mul i64 %kk, {4 * PANEL // per_word}")  # panel row kk / per_word: 32 words
        for v in range(2):
            lines.append(f"  %bq{v} = getelementptr inbounds i8, ptr %bp, i64 %bo")
            lines.append(f"  %bv{v} = getelementptr inbounds i8, ptr %bq{v}, i64 {64 * v}")
            lines.append(f"  %b{v} = load {operand}, ptr %bv{v}, align 4")
        lines.append(f"  %ao = mul i64 %kk, {4 // per_word}")  # bytes of A per k
        for r in range(mr):
            lines.append(f"  %aq{r} = getelementptr i8, ptr %a{r}, i64 %ao")
            lines.append(f"  %aw{r} = load i32, ptr %aq{r}, align 1")
            word = f"%aw{r}"
            if flip is not None:
                # on the scalar word: on the broadcast vector, LLVM 22's instruction selection spends
                # minutes on the kernel (an xor of a splat feeding VPDPBUSD's <64 x i8> operand)
                lines.append(f"  %au{r} = xor i32 %aw{r}, {flip}")
                word = f"%au{r}"
            lines.append(f"  %ai{r} = insertelement <16 x i32> poison, i32 {word}, i64 0")
            lines.append(f"  %as{r} = shufflevector <16 x i32> %ai{r}, <16 x i32> poison, <16 x i32> zeroinitializer")
            lines.append(f"  %ab{r} = bitcast <16 x i32> %as{r} to {operand}")
            for v in range(2):
                lines.append(f"  %n{r}.{v} = call {vec} {dot}({vec} %acc{r}.{v}, {operand} %ab{r}, {operand} %b{v})")
        lines += [f"  %kk1 = add i64 %kk, {per_word}", "  %more = icmp slt i64 %kk1, %kc",
                  "  br i1 %more, label %loop, label %exit", "exit:"]
        for r in range(mr):
            for v in range(2):
                lines.append(f"  store {vec} %n{r}.{v}, ptr %cp{r}.{v}, align 4")
        lines += ["  ret void", "}"]
        return "\n".join(lines)


__all__ = ["BIAS", "FEW_ROWS", "PANEL", "GemmVnni"]
