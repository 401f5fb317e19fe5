"""``sin`` and ``cos`` of any f32 argument, reduced exactly in f64: what the MLIR and CUDA-C renderers emit.

An f32 ``|x|`` is ``m · 2**s`` with ``m`` below 2**24. Its angle in turns, ``|x| / 2π`` modulo 1, is
the sum of ``|x| · c_i`` modulo 1 over :data:`CHUNKS`, 1/(2π)'s binary digits cut into 24-bit pieces:
each product has at most 48 significant bits, so it is exact in f64, and so is its fractional part
(``p - floor(p)``; a product at or above 2**52 is a whole number and adds nothing). Summed smallest
first and taken modulo 1 again, the turn is off by a few units of 2**-53, for every finite f32 — where
reducing by a multiple of 2π in f64 loses every digit past |x| ≈ 1e11, and ``sinpi(x / π)`` in f64 past
2**53 (the quotient is then a whole number). The turn is centred on [-1/2, 1/2] and multiplied by
``copysign(1, x)`` for ``sin`` (odd; ``sin(-0) = -0``): ``sin(2π·t)``, ``cos(2π·t)`` on that range are each
renderer's accurate ones. ``±inf`` and NaN give NaN (``inf - floor(inf)``).

Triton's helpers (:mod:`arke.targets.triton.trig`) do Payne–Hanek in 64-bit integers instead; both read
:data:`TWO_OVER_PI`.
"""

from __future__ import annotations

#: The binary digits of 2/π in 32-bit words (the first holds bits 1..32 after the point).
TWO_OVER_PI = (0xA2F9836E, 0x4E441529, 0xFC2757D1, 0xF534DDC0, 0xDB629599, 0x3C439041)
#: Bits of 1/(2π) per chunk: a 24-bit f32 significand times one stays exact in f64 (48 bits).
CHUNK_BITS = 24


def _chunks() -> tuple[float, ...]:
    # 1/(2π) = (2/π) / 4: the words' 192 bits, two places further from the point; cut into 24-bit chunks,
    # each an exact f64 (an integer below 2**24 times a power of two)
    digits = 0
    for w in TWO_OVER_PI:
        digits = (digits << 32) | w
    total = 32 * len(TWO_OVER_PI)
    out = []
    for i in range(total // CHUNK_BITS):
        n = (digits >> (total - CHUNK_BITS * (i + 1))) & ((1 << CHUNK_BITS) - 1)
        out.append(float(n) * 2.0 ** (-2 - CHUNK_BITS * (i + 1)))
    return tuple(out)


#: 1/(2π) as a sum of exact f64 chunks of 24 bits, largest first (192 bits: the last one an f32 reaches
#: at its largest exponent lies 2**-66 turns below the point).
CHUNKS = _chunks()

__all__ = ["CHUNKS", "CHUNK_BITS", "TWO_OVER_PI"]
