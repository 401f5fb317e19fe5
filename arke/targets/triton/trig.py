"""``sin`` and ``cos`` for the Triton target without local memory (spec/codegen.md §9.5).

Triton's ``tl.sin``/``tl.cos`` are libdevice's ``sinf``/``cosf``, whose Payne–Hanek slow path
writes its partial products to a local-memory array indexed by the exponent: every kernel that
calls them gets a stack frame (what ptxas and Triton count as spills), whatever its block. The
helpers here are written out instead, all in registers:

* ``|x| < 2**17`` (:data:`FAST_LIMIT`): Cody–Waite reduction, ``k = round(|x| · 2/π)`` and
  ``r = |x| - k·π/2`` with π/2 in three f32 parts, each step one fused multiply-add;
* larger finite ``|x|``: Payne–Hanek in 64-bit integers: the 24-bit significand times the 64
  bits of 2/π that matter at its exponent (three of :data:`TWO_OVER_PI`'s 32-bit words, picked
  by ``tl.where`` chains, so no table is indexed), whose low 64 bits are the quadrant and the
  fraction of ``x · 2/π``; this branch runs only in a program where some lane needs it;
* Cephes' minimax polynomials for ``sin`` and ``cos`` on ``[-π/4, π/4]``, picked and signed by the
  quadrant; ``±0`` gives ``sin(±0) = ±0``, ``±inf`` and NaN give NaN.

The absolute error is within a few units of 2**-24 for every f32 argument, the bound
``arke/runtime/error_bound.py`` allows ``sin``/``cos`` (ulps of 1).
"""

from __future__ import annotations

from arke.targets.turns import TWO_OVER_PI  # the digits of 2/π (the MLIR and CUDA-C reductions read them too)

#: Below this ``|x|`` the three-part Cody–Waite reduction is accurate to a few ulps of 1.
FAST_LIMIT = 131072.0
#: π/2 in three f32 parts (``C1`` is π/2 rounded to f32, each next part what the previous ones miss).
PIO2 = (1.5707963705062866, -4.371138828673793e-08, -1.7151245100058819e-15)


def _word_select(name: str, index: str, words: tuple[int, ...]) -> list[str]:
    """Lines setting ``name`` (uint64) to ``words[index]`` by a ``tl.where`` chain (no indexed table)."""
    expr = f"tl.full({index}.shape, {words[-1]}, tl.uint64)"
    for k in range(len(words) - 2, -1, -1):
        expr = f"tl.where({index} == {k}, tl.full({index}.shape, {words[k]}, tl.uint64), {expr})"
    return [f"    {name} = {expr}"]


def _helpers() -> str:
    # the window of 2/π a significand needs starts at bit e - 24 (e its exponent, at least 17 here):
    # with a zero word in front, at bit offset e + 7 of the padded string, words j, j + 1, j + 2
    words = (0, *TWO_OVER_PI)
    select = [*_word_select("w0", "j", words[:5]), *_word_select("w1", "j", words[1:6]),
              *_word_select("w2", "j", words[2:7])]
    c1, c2, c3 = PIO2
    return "\n".join([
        "@triton.jit",
        "def _ak_trig_big(ax):",
        "    # Payne-Hanek: ax = m * 2**(e - 23); the low 64 bits of m * (64 bits of 2/pi at e) are",
        "    # x * 2/pi mod 4 with 62 bits of fraction",
        "    bits = ax.to(tl.uint32, bitcast=True)",
        "    e = ((bits >> 23) & 255).to(tl.int32) - 127",
        "    m = ((bits & 8388607) | 8388608).to(tl.uint64)",
        "    o = e + 7",
        "    j = o >> 5",
        "    s = (o & 31).to(tl.uint64)",
        *select,
        "    p = (w0 << (s + 32)) | (w1 << s) | (w2 >> (32 - s))",
        "    y = m * p",
        "    t = (y << 2).to(tl.int64, bitcast=True)",
        "    q = (y >> 62).to(tl.int32) + (t < 0).to(tl.int32)",
        "    r = t.to(tl.float32) * 8.515303950216386e-20",
        "    return r, q",
        "",
        "",
        "@triton.jit",
        "def _ak_trig(x, cosine: tl.constexpr):",
        "    ax = tl.abs(x)",
        "    k = tl.floor(ax * 0.6366197723675814 + 0.5)",
        f"    r = tl.fma(-k, {c1!r}, ax)",
        f"    r = tl.fma(-k, {c2!r}, r)",
        f"    r = tl.fma(-k, {c3!r}, r)",
        f"    big = (ax >= {FAST_LIMIT!r}) & (ax < float(\"inf\"))",
        f"    q = tl.where(ax < {FAST_LIMIT!r}, k, 0.0).to(tl.int32)",  # 0 where big, inf or NaN
        "    if tl.max(big.to(tl.int32)) > 0:",
        "        rb, qb = _ak_trig_big(tl.where(big, ax, 131072.0))",
        "        r = tl.where(big, rb, r)",
        "        q = tl.where(big, qb, q)",
        "    z = r * r",
        "    sn = r + r * z * (-0.16666654611 + z * (0.0083321608736 + z * -0.00019515295891))",
        "    cs = 1.0 - 0.5 * z + z * z * (0.041666645683 + z * (-0.0013887316255 + z * 0.000024433157118))",
        "    if cosine:",
        "        q = q + 1",
        "    v = tl.where((q & 1) == 0, sn, cs)",
        "    v = tl.where((q & 2) == 0, v, -v)",
        "    if not cosine:",
        "        v = tl.where(x < 0, -v, v)",
        "        v = tl.where(ax == 0, x, v)",
        "    return v",
        "",
        "",
        "@triton.jit",
        "def _ak_sin(x):",
        "    return _ak_trig(x, False)",
        "",
        "",
        "@triton.jit",
        "def _ak_cos(x):",
        "    return _ak_trig(x, True)",
    ]) + "\n"


#: The module-level ``@triton.jit`` helpers (``_ak_sin``, ``_ak_cos``): added to a module that calls them.
TRIG_HELPERS = _helpers()

__all__ = ["FAST_LIMIT", "PIO2", "TRIG_HELPERS", "TWO_OVER_PI"]
