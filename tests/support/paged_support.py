"""The paged-attention decode kernel the length tests share (spec/language.md §8.11): B sequences of
``lens[b]`` tokens whose keys and values sit in blocks of P slots listed in ``blk``."""

PAGED_DECODE = """
kernel {name}(q: f32[B, H, E], kc: f32[NB, G, P, E], vc: f32[NB, G, P, E], blk: i32[B, MB],
             lens: i64[B]) -> f32[B, H, E]
  where H % G == 0
{{
  let R = H / G
  s[b, h, j] = sum(q[b, h, e] * kc[blk[b, j / P], h / R, j % P, e] for e) / sqrt(f32(E))
  mx[b, h] = max(s[b, h, j] for j < lens[b])
  p[b, h, j] = exp(s[b, h, j] - mx[b, h])
  return sum(p[b, h, j] * vc[blk[b, j / P], h / R, j % P, e] for j < lens[b]) / sum(p[b, h, j] for j < lens[b])
}}
"""


def paged_decode(name: str = "paged_decode") -> str:
    """The kernel's source under ``name``."""
    return PAGED_DECODE.format(name=name)
