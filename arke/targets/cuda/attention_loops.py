"""The key loops of the CUDA-C attention kernels (:mod:`arke.targets.cuda.attention`): per value
chunk, one pass over the block's key tiles with an online softmax, then the block's results staged
in shared memory for :meth:`~arke.targets.cuda.attention.AttentionKernel.epilogue`.

* :func:`simt_loop`: f32 everywhere. Row ``sr`` of the block is ``lanes`` lanes of warp
  ``sr / (32 / lanes)``; lane ``sl`` of a row owns keys ``sl + lanes * u`` of each tile and value
  features ``sl + lanes * v`` of the chunk (so shared-memory reads are broadcasts or consecutive
  words). ``q`` (every row's features), ``k`` and ``v`` tiles are evaluated into shared memory
  by all threads; scores accumulate over the features in order; row max and sum are reduced
  over a row's lanes with ``__shfl_xor_sync``; ``p`` goes through shared memory to ``o += p v``.
* :func:`tc_loop`: 16-bit ``q``, ``k`` and ``v`` on tensor cores. Warp ``(wm, wk)`` owns rows
  ``16 wm ..`` and keys ``wk * KW ..`` of each tile; a thread holds, per ``m16n8`` tile, rows
  ``g`` and ``g + 8`` (``g = lane / 4``) at two neighbouring columns (``2 t``, ``t = lane % 4``),
  so a row's statistics are reduced over the 4 lanes of a quad. The score fragments of two
  neighbouring key tiles are the ``A`` fragment of ``P V`` (rounded to ``v``'s type), as in
  FlashAttention-2. The ``Q`` tile is loaded once per value chunk (once per key tile when the
  features take several chunks); K/V tiles go through ``stages`` buffers with ``ak_cp_async16``
  when rows are 16-byte aligned (checked at run time), element by element otherwise.

MMA and shuffle counts depend on dims and loop indices only (never on the thread), as the
primitives require: a step past the head dim or past the block's last key is skipped by every
thread alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.plan.attention import FEATURE, KEY, VALUE
from arke.targets.cuda.attention_blocks import NEG_INF

if TYPE_CHECKING:
    from arke.targets.cuda.attention import AttentionKernel

FULL = "0xffffffffu"
_MMA = {DType.BF16: ("ak_mma_bf16", "ak_f32_to_bf16"), DType.F16: ("ak_mma_f16", "ak_f32_to_f16")}


def main_loop(k: AttentionKernel) -> None:
    """The kernel's value-chunk loop: its form's key loop, then the staged results stored."""
    if k.half is not None:
        tc_loop(k)
    else:
        simt_loop(k)


def _zero(k: AttentionKernel, array: str, size: int) -> None:
    k.emit("#pragma unroll")
    k.emit(f"for (int z = 0; z < {size}; ++z) {array}[z] = 0.0f;")


def _reduce(k: AttentionKernel, var: str, op: str, width: int) -> None:
    """``var`` combined over ``width`` neighbouring lanes (a butterfly: every lane gets the result)."""
    off = width // 2
    while off >= 1:
        shuffled = f"__shfl_xor_sync({FULL}, {var}, {off})"
        k.emit(f"{var} = {f'fmaxf({var}, {shuffled})' if op == 'max' else f'{var} + {shuffled}'};")
        off //= 2


def _score(k: AttentionKernel, raw: str, ok: str, at: dict[str, str], key: str, out: str) -> None:
    """``out = f`` at a valid row and key (evaluated only there, as the interpreter raises its
    errors), ``-inf`` elsewhere and outside the block's key range ``[kr_lo, kr_hi)``."""
    p = k.p
    k.emit(f"const float sv = {raw};")
    k.emit(f"float fv = {NEG_INF};")
    with k.block(f"if ({ok} && {key} < {k.dim(p.extent(KEY))})"), k.where(at | {KEY: key}):
        k.values[p.scores] = "sv"
        k.emit(f"fv = {k.x.value(p.score)};")
        del k.values[p.scores]
    k.emit(f"{out} = ({key} >= kr_lo && {key} < kr_hi) ? fv : {NEG_INF};")


# ---------------------------------------------------------------- SIMT


def simt_loop(k: AttentionKernel) -> None:
    """The SIMT key loop (see the module doc)."""
    p, b = k.p, k.b
    L = b.lanes
    KL, EL, QS, PS = b.n // L, b.e // L, b.d + 1, b.n + 1
    T, D, E = (k.dim(p.extent(r)) for r in (KEY, FEATURE, VALUE))
    k.emit(f"float* qs = (float*)ak_smem; float* ks = qs + {b.m * QS}; float* vs = ks + {b.n * QS}; "
           f"float* ps = vs + {b.n * b.e};")
    k.emit(f"float* os_ = (float*)ak_smem; float* ms_ = os_ + {b.m * b.e}; float* ls_ = ms_ + {b.m};")
    k.emit(f"const int sr = warp * {32 // L} + lane / {L}, sl = lane % {L};")
    r_ok, r_at = k.rows("r_", f"kv_rb * {b.m}LL + sr")
    with k.where(k.kv):
        vbase, vstride = k.direct(p.v, (KEY, VALUE))
        k_load = p.k_half if p.k_half is not None else p.k if p.k_direct and isinstance(p.k, ir.Load) else None
        kdirect = k.direct(k_load, (KEY, FEATURE)) if k_load is not None else None
    k.emit(f"const long long nd = {D} > 0 ? ({D} + {b.d - 1}) / {b.d} : 1;")
    with k.block(f"for (long long e0 = 0; e0 < {E}; e0 += {b.e})"):
        k.emit(f"float o[{EL}];")
        _zero(k, "o", EL)
        k.emit(f"float m_run = {NEG_INF}, l_run = 0.0f;")
        with k.block("for (long long it = 0; it < kr_tiles; ++it)"):
            k.emit(f"const long long j0 = kr_start + it * {b.n};")
            k.emit(f"float s[{KL}];")
            _zero(k, "s", KL)
            with k.block("for (long long dc = 0; dc < nd; ++dc)"):
                k.emit(f"const long long d0 = dc * {b.d};")
                k.emit("__syncthreads();")
                with k.block("if (nd > 1 || it == 0)"), \
                        k.serial(f"for (int ix = tid; ix < {b.m * b.d}; ix += {b.threads})"):
                    k.emit(f"const int qr = ix / {b.d}, qd = ix % {b.d};")
                    k.emit("const long long dd = d0 + qd;")
                    ok, at = k.rows("ql_", f"kv_rb * {b.m}LL + qr")
                    k.emit("float qv = 0.0f;")
                    with k.block(f"if ({ok} && dd < {D})"), k.where(at | {FEATURE: "dd"}):
                        k.emit(f"qv = {k.x.value(p.q)};")
                    k.emit(f"qs[qr * {QS} + qd] = qv;")
                with k.serial(f"for (int ix = tid; ix < {b.n * b.d}; ix += {b.threads})"):
                    k.emit(f"const int kc = ix / {b.d}, kd = ix % {b.d};")
                    k.emit("const long long kj = j0 + kc, dd = d0 + kd;")
                    k.emit("float kv = 0.0f;")
                    with k.block(f"if (kj < {T} && dd < {D})"):
                        if kdirect is not None and k_load is not None:
                            base, stride = kdirect
                            raw = f"{k.pointer(k_load.src)}[{base} + kj * {stride[KEY]} + dd * {stride[FEATURE]}]"
                            k.emit(f"kv = {k.widen(raw, k_load.dtype)};")
                        else:
                            with k.where(k.kv | {KEY: "kj", FEATURE: "dd"}):
                                k.emit(f"kv = {k.x.value(p.k)};")
                    k.emit(f"ks[kc * {QS} + kd] = kv;")
                with k.block("if (dc == 0)"), \
                        k.serial(f"for (int ix = tid; ix < {b.n * b.e}; ix += {b.threads})"):
                    k.emit(f"const int vc = ix / {b.e}, ve = ix % {b.e};")
                    k.emit("const long long vj = j0 + vc, vee = e0 + ve;")
                    raw = f"{k.pointer(p.v.src)}[{vbase} + vj * {vstride[KEY]} + vee * {vstride[VALUE]}]"
                    # keys outside the range stay 0 (a skipped key never meets 0 * inf)
                    k.emit(f"vs[ix] = (vj >= kr_lo && vj < kr_hi && vee < {E}) ? {k.widen(raw, p.v.dtype)} : 0.0f;")
                k.emit("__syncthreads();")
                k.emit(f"const long long dn = {D} - d0 < {b.d} ? {D} - d0 : {b.d};")
                with k.block("for (long long d = 0; d < dn; ++d)"):
                    k.emit(f"const float qv = qs[sr * {QS} + d];")
                    k.emit("#pragma unroll")
                    k.emit(f"for (int u = 0; u < {KL}; ++u) s[u] = s[u] + qv * ks[(sl + {L} * u) * {QS} + d];")
            k.emit("#pragma unroll")
            with k.block(f"for (int u = 0; u < {KL}; ++u)"):
                k.emit(f"const long long kj = j0 + sl + {L} * u;")
                _score(k, "s[u]", r_ok, r_at, "kj", "s[u]")
            k.emit("float tm = s[0];")
            k.emit("#pragma unroll")
            k.emit(f"for (int u = 1; u < {KL}; ++u) tm = fmaxf(tm, s[u]);")
            _reduce(k, "tm", "max", L)
            k.emit("const float mn = fmaxf(m_run, tm);")
            k.emit(f"const float ms = mn == {NEG_INF} ? 0.0f : mn;")
            k.emit("const float alpha = expf(m_run - ms);")
            k.emit("float ts = 0.0f;")
            k.emit("#pragma unroll")
            with k.block(f"for (int u = 0; u < {KL}; ++u)"):
                k.emit("s[u] = expf(s[u] - ms);")
                k.emit("ts = ts + s[u];")
                k.emit(f"ps[sr * {PS} + sl + {L} * u] = s[u];")
            _reduce(k, "ts", "sum", L)
            k.emit("l_run = l_run * alpha + ts;")
            k.emit("m_run = mn;")
            k.emit("__syncthreads();")
            k.emit(f"float acc[{EL}];")
            _zero(k, "acc", EL)
            with k.block(f"for (int c = 0; c < {b.n}; ++c)"):
                k.emit(f"const float pv = ps[sr * {PS} + c];")
                k.emit("#pragma unroll")
                k.emit(f"for (int v = 0; v < {EL}; ++v) acc[v] = acc[v] + pv * vs[c * {b.e} + sl + {L} * v];")
            k.emit("#pragma unroll")
            k.emit(f"for (int v = 0; v < {EL}; ++v) o[v] = o[v] * alpha + acc[v];")
        k.emit("__syncthreads(); /* the staged results overwrite the tiles */")
        k.emit("#pragma unroll")
        k.emit(f"for (int v = 0; v < {EL}; ++v) os_[sr * {b.e} + sl + {L} * v] = o[v];")
        k.emit("if (sl == 0) { ms_[sr] = m_run; ls_[sr] = l_run; }")
        k.emit("__syncthreads();")
        k.epilogue("os_", "ms_", "ls_")
        k.emit("__syncthreads();")


# ---------------------------------------------------------------- tensor cores


def tc_loop(k: AttentionKernel) -> None:
    """The tensor-core key loop (see the module doc)."""
    p, b = k.p, k.b
    assert k.half is not None and p.q_half is not None and p.k_half is not None
    DS, ES, KW = b.d + 8, b.e + 8, b.n // b.wn
    NT, NE = KW // 8, b.e // 8
    D, E = (k.dim(p.extent(r)) for r in (FEATURE, VALUE))
    k.emit(f"unsigned short* qs = (unsigned short*)ak_smem; unsigned short* ks = qs + {b.m * DS}; "
           f"unsigned short* vs = ks + {b.stages * b.n * DS};")
    k.emit(f"float* os_ = (float*)ak_smem; float* ms_ = os_ + {b.wn * b.m * b.e}; float* ls_ = ms_ + {b.wn * b.m};")
    k.emit(f"const int wm = warp / {b.wn}, wk = warp % {b.wn}, g = lane / 4, tq = lane % 4;")
    a_ok, a_at = k.rows("ra_", f"kv_rb * {b.m}LL + wm * 16 + g")
    b_ok, b_at = k.rows("rb_", "ra_rho + 8")
    with k.where(k.kv):
        kbase, kstride = k.direct(p.k_half, (KEY, FEATURE))
        vbase, vstride = k.direct(p.v, (KEY, VALUE))
    kb, vb = k.pointer(p.k_half.src), k.pointer(p.v.src)
    k.emit(f"const bool vec = {kstride[KEY]} % 8 == 0 && {kbase} % 8 == 0 && {vstride[KEY]} % 8 == 0 && "
           f"{vbase} % 8 == 0 && (unsigned long long){kb} % 16 == 0 && (unsigned long long){vb} % 16 == 0;")
    k.emit(f"const long long nd = {D} > 0 ? ({D} + {b.d - 1}) / {b.d} : 1;")
    mma, rnd = _MMA[k.half]

    def load_q(d0: str) -> None:
        with k.serial(f"for (int ix = tid; ix < {b.m * b.d}; ix += {b.threads})"):
            k.emit(f"const int qr = ix / {b.d}, qd = ix % {b.d};")
            k.emit(f"const long long dd = {d0} + qd;")
            ok, at = k.rows("ql_", f"kv_rb * {b.m}LL + qr")
            k.emit("unsigned short qv = 0;")
            with k.block(f"if ({ok} && dd < {D})"), k.where(at | {FEATURE: "dd"}):
                assert p.q_half is not None
                k.emit(f"qv = {k.load(p.q_half)};")
            k.emit(f"qs[qr * {DS} + qd] = qv;")

    def load_kv(it: str, stage: str, d0: str, with_v: str) -> None:
        """K (and V) rows of key tile ``it`` into buffer ``stage``: keys outside [kr_lo, kr_hi) read as 0."""
        with k.block(""):
            k.emit(f"const long long j0 = kr_start + ({it}) * {b.n};")
            k.emit(f"unsigned short* kst = ks + ({stage}) * {b.n * DS}; unsigned short* vst = vs + ({stage}) * "
                   f"{b.n * ES};")
            with k.block("if (vec)"):
                for name, width, ext, start, base, stride, ptr, dst, S in (
                        ("k", b.d, D, d0, kbase, kstride[KEY], kb, "kst", DS),
                        ("v", b.e, E, "e0", vbase, vstride[KEY], vb, "vst", ES)):
                    with k.block(f"if ({'true' if name == 'k' else with_v})"), \
                            k.serial(f"for (int ix = tid; ix < {b.n * width // 8}; ix += {b.threads})"):
                        k.emit(f"const int c = ix / {width // 8}, sg = ix % {width // 8};")
                        k.emit(f"const long long j = j0 + c, x = {start} + sg * 8;")
                        k.emit(f"const long long nb = (j >= kr_lo && j < kr_hi && x < {ext}) ? "
                               f"({ext} - x < 8 ? {ext} - x : 8) : 0;")
                        k.emit(f"ak_cp_async16({dst} + c * {S} + sg * 8, nb > 0 ? (const void*)({ptr} + {base} + "
                               f"j * {stride} + x) : (const void*){ptr}, (int)(2 * nb));")
            with k.block("else"):
                for name, width, ext, start, base, strides, ptr, dst, S, role in (
                        ("k", b.d, D, d0, kbase, kstride, kb, "kst", DS, FEATURE),
                        ("v", b.e, E, "e0", vbase, vstride, vb, "vst", ES, VALUE)):
                    with k.block(f"if ({'true' if name == 'k' else with_v})"), \
                            k.serial(f"for (int ix = tid; ix < {b.n * width}; ix += {b.threads})"):
                        k.emit(f"const int c = ix / {width}, y = ix % {width};")
                        k.emit(f"const long long j = j0 + c, x = {start} + y;")
                        k.emit(f"{dst}[c * {S} + y] = (j >= kr_lo && j < kr_hi && x < {ext}) ? "
                               f"{ptr}[{base} + j * {strides[KEY]} + x * {strides[role]}] : (unsigned short)0;")

    def qk(kst: str, d0: str) -> None:
        """``s += Q Kᵀ`` over feature chunk ``d0`` (steps past D, and key tiles past the block's last key, skipped)."""
        k.emit("#pragma unroll")
        with k.block(f"for (int kk = 0; kk < {b.d // 16}; ++kk)"), k.block(f"if ({d0} + kk * 16 < {D})"):
            k.emit(f"const unsigned short* qa_p = qs + (wm * 16 + g) * {DS} + kk * 16 + 2 * tq;")
            k.emit("unsigned qa[4];")
            k.emit(f"qa[0] = *(const unsigned*)qa_p; qa[1] = *(const unsigned*)(qa_p + {8 * DS});")
            k.emit(f"qa[2] = *(const unsigned*)(qa_p + 8); qa[3] = *(const unsigned*)(qa_p + {8 * DS + 8});")
            k.emit("#pragma unroll")
            with k.block(f"for (int nt = 0; nt < {NT}; ++nt)"), k.block("if (j0 + nt * 8 < kr_hi)"):
                k.emit(f"const unsigned short* kb_p = {kst} + (wk * {KW} + nt * 8 + g) * {DS} + kk * 16 + 2 * tq;")
                k.emit("unsigned kf[2];")
                k.emit("kf[0] = *(const unsigned*)kb_p; kf[1] = *(const unsigned*)(kb_p + 8);")
                k.emit(f"{mma}(s[nt], qa, kf);")

    with k.block(f"for (long long e0 = 0; e0 < {E}; e0 += {b.e})"):
        k.emit(f"float o[{NE}][4];")
        k.emit("#pragma unroll")
        k.emit(f"for (int z = 0; z < {NE}; ++z) {{ o[z][0] = 0.0f; o[z][1] = 0.0f; o[z][2] = 0.0f; o[z][3] = 0.0f; }}")
        k.emit(f"float m_a = {NEG_INF}, m_b = {NEG_INF}, l_a = 0.0f, l_b = 0.0f;")
        with k.block("if (nd == 1)"):
            load_q("0LL")
            for st in range(b.stages - 1):  # the first tiles in flight before the loop
                k.emit(f"if ({st} < kr_tiles)")
                load_kv(str(st), str(st), "0LL", "true")
                k.emit("ak_cp_async_commit();")
        with k.block("for (long long it = 0; it < kr_tiles; ++it)"):
            k.emit(f"const long long j0 = kr_start + it * {b.n};")
            k.emit(f"float s[{NT}][4];")
            k.emit("#pragma unroll")
            k.emit(f"for (int z = 0; z < {NT}; ++z) {{ s[z][0] = 0.0f; s[z][1] = 0.0f; s[z][2] = 0.0f; "
                   "s[z][3] = 0.0f; }")
            k.emit("int cur = 0;")
            with k.block("if (nd == 1)"):
                k.emit(f"const long long nx = it + {b.stages - 1};")
                k.emit("if (nx < kr_tiles)")
                load_kv("nx", f"(int)(nx % {b.stages})", "0LL", "true")
                k.emit("ak_cp_async_commit();")
                k.emit(f"ak_cp_async_wait<{b.stages - 1}>();")
                k.emit("__syncthreads();")
                k.emit(f"cur = (int)(it % {b.stages});")
                qk(f"(ks + cur * {b.n * DS})", "0LL")
            with k.block("else"), k.block("for (long long dc = 0; dc < nd; ++dc)"):
                k.emit("__syncthreads();")
                load_q(f"dc * {b.d}")
                load_kv("it", "0", f"dc * {b.d}", "dc == 0")
                k.emit("ak_cp_async_commit();")
                k.emit("ak_cp_async_wait<0>();")
                k.emit("__syncthreads();")
                qk("ks", f"dc * {b.d}")
            # the score expression at each fragment element: q < 2 row g, else row g + 8
            k.emit("#pragma unroll")
            with k.block(f"for (int nt = 0; nt < {NT}; ++nt)"):
                k.emit("#pragma unroll")
                with k.block("for (int q = 0; q < 4; ++q)"):
                    k.emit(f"const long long kj = j0 + wk * {KW} + nt * 8 + 2 * tq + (q & 1);")
                    k.emit(f"const bool sok = q < 2 ? {a_ok} : {b_ok};")
                    at = {}
                    for role, va in a_at.items():
                        vb_ = b_at[role]
                        if va == vb_:
                            at[role] = va
                        else:
                            k.emit(f"const long long s_{role} = q < 2 ? {va} : {vb_};")
                            at[role] = f"s_{role}"
                    _score(k, "s[nt][q]", "sok", at, "kj", "s[nt][q]")
            k.emit(f"float mx_a = {NEG_INF}, mx_b = {NEG_INF};")
            k.emit("#pragma unroll")
            k.emit(f"for (int nt = 0; nt < {NT}; ++nt) {{ mx_a = fmaxf(mx_a, fmaxf(s[nt][0], s[nt][1])); "
                   "mx_b = fmaxf(mx_b, fmaxf(s[nt][2], s[nt][3])); }")
            for h in "ab":
                _reduce(k, f"mx_{h}", "max", 4)
                k.emit(f"const float mn_{h} = fmaxf(m_{h}, mx_{h});")
                k.emit(f"const float ms_{h} = mn_{h} == {NEG_INF} ? 0.0f : mn_{h};")
                k.emit(f"const float al_{h} = expf(m_{h} - ms_{h});")
                k.emit(f"float su_{h} = 0.0f;")
            k.emit("#pragma unroll")
            with k.block(f"for (int nt = 0; nt < {NT}; ++nt)"):
                for q, h in enumerate("aabb"):
                    k.emit(f"s[nt][{q}] = expf(s[nt][{q}] - ms_{h}); su_{h} = su_{h} + s[nt][{q}];")
            for h in "ab":
                _reduce(k, f"su_{h}", "sum", 4)
                k.emit(f"l_{h} = l_{h} * al_{h} + su_{h};")
                k.emit(f"m_{h} = mn_{h};")
            k.emit("#pragma unroll")
            k.emit(f"for (int z = 0; z < {NE}; ++z) {{ o[z][0] *= al_a; o[z][1] *= al_a; o[z][2] *= al_b; "
                   "o[z][3] *= al_b; }")
            # o += p v: p rounded to v's type (the A fragment), v's B fragment gathered from its tile
            k.emit(f"const unsigned short* vst = vs + cur * {b.n * ES};")
            k.emit("#pragma unroll")
            with k.block(f"for (int kk = 0; kk < {KW // 16}; ++kk)"), k.block("if (j0 + kk * 16 < kr_hi)"):
                k.emit("unsigned pa[4];")
                for r, (tile, c0) in enumerate(((0, 0), (0, 2), (1, 0), (1, 2))):
                    k.emit(f"pa[{r}] = ak_pack({rnd}(s[2 * kk + {tile}][{c0}]), {rnd}(s[2 * kk + {tile}][{c0 + 1}]));")
                k.emit(f"const unsigned short* vb_p = vst + (wk * {KW} + kk * 16 + 2 * tq) * {ES} + g;")
                k.emit("#pragma unroll")
                with k.block(f"for (int ne = 0; ne < {NE}; ++ne)"), k.block(f"if (e0 + ne * 8 < {E})"):
                    k.emit("unsigned vf[2];")
                    k.emit(f"vf[0] = ak_pack(vb_p[ne * 8], vb_p[{ES} + ne * 8]);")
                    k.emit(f"vf[1] = ak_pack(vb_p[{8 * ES} + ne * 8], vb_p[{9 * ES} + ne * 8]);")
                    k.emit(f"{mma}(o[ne], pa, vf);")
            k.emit("__syncthreads(); /* every warp is done with this buffer before it is refilled */")
        k.emit("ak_cp_async_wait<0>();")
        k.emit("__syncthreads(); /* the staged results overwrite the tiles */")
        k.emit("#pragma unroll")
        with k.block(f"for (int ne = 0; ne < {NE}; ++ne)"):
            k.emit("#pragma unroll")
            k.emit(f"for (int q = 0; q < 4; ++q) os_[(wk * {b.m} + wm * 16 + g + 8 * (q / 2)) * {b.e} + ne * 8 + "
                   "2 * tq + (q & 1)] = o[ne][q];")
        with k.block("if (tq == 0)"):
            k.emit(f"ms_[wk * {b.m} + wm * 16 + g] = m_a; ms_[wk * {b.m} + wm * 16 + g + 8] = m_b;")
            k.emit(f"ls_[wk * {b.m} + wm * 16 + g] = l_a; ls_[wk * {b.m} + wm * 16 + g + 8] = l_b;")
        k.emit("__syncthreads();")
        k.epilogue("os_", "ms_", "ls_")
        k.emit("__syncthreads();")
