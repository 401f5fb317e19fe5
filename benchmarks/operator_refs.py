"""The operators of ``benchmarks/operators.py``: inputs at each shape and what a user writes in eager torch.

Each :class:`Operator` names its kernel in ``benchmarks/operators/operators.ak``, makes its
arguments (tensors in the kernel's parameter order, then scalars by name) from a generator and
the shape's dims, and gives torch's version of the same maths. ``full`` shapes are realistic
(model sizes named in each comment) and sized for a 2-core run; ``quick`` ones are tiny and
ragged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

Args = tuple[tuple[Any, ...], dict[str, Any]]  # tensors (and dim parameters' numbers), scalars


@dataclass(frozen=True)
class Operator:
    name: str
    kernel: str
    make: Callable[..., Args]  # (generator, **dims) -> (tensors, scalars)
    torch_fn: Callable[..., torch.Tensor]
    full: dict[str, int]
    quick: dict[str, int]
    tol: float = 1e-4  # max |arke - torch| / max |torch|
    exact: bool = False  # integer results: equal


def randn(g: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * scale


# ---------------------------------------------------------------- GPT-2 MLP


def gpt2_make(g: torch.Generator, T: int, C: int) -> Args:
    f = 4 * C
    return (randn(g, T, C), randn(g, C, f, scale=C ** -0.5), randn(g, f, scale=0.1), randn(g, f, C, scale=f ** -0.5),
            randn(g, C, scale=0.1)), {}


def gpt2_ref(x: torch.Tensor, w_fc: torch.Tensor, b_fc: torch.Tensor, w_proj: torch.Tensor,
             b_proj: torch.Tensor) -> torch.Tensor:
    return torch.addmm(b_proj, F.gelu(torch.addmm(b_fc, x, w_fc), approximate="tanh"), w_proj)


# ---------------------------------------------------------------- attention variants


def alibi_make(g: torch.Generator, H: int, S: int, D: int) -> Args:
    slope = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)])
    return (randn(g, 1, H, S, D), randn(g, 1, H, S, D), randn(g, 1, H, S, D), slope), {}


def alibi_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slope: torch.Tensor) -> torch.Tensor:
    s, t = q.shape[2], k.shape[2]
    i = torch.arange(s)[:, None] + t - s
    j = torch.arange(t)[None, :]
    bias = slope[:, None, None] * (j - i).float()
    bias = bias.masked_fill(j > i, -math.inf)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias[None])


def window_make(g: torch.Generator, H: int, G: int, S: int, D: int, W: int) -> Args:
    return (randn(g, 1, H, S, D), randn(g, 1, G, S, D), randn(g, 1, G, S, D)), {"window": W, "cap": 50.0}


def window_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, cap: float) -> torch.Tensor:
    r = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(r, 1), v.repeat_interleave(r, 1)
    s, t = q.shape[2], k.shape[2]
    scores = cap * torch.tanh(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) / cap)
    i = torch.arange(s)[:, None] + t - s
    j = torch.arange(t)[None, :]
    scores = scores.masked_fill((j > i) | (j <= i - window), -math.inf)
    return torch.softmax(scores, -1) @ v


def rope_tables(inv_freq: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ang = positions[:, None].float() * inv_freq[None, :]
    ang = torch.cat([ang, ang], -1)
    return ang.cos(), ang.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, -1)
    return torch.cat([-b, a], -1)


def qk_norm_make(g: torch.Generator, H: int, G: int, S: int, D: int) -> Args:
    inv_freq = 1.0 / 1000000.0 ** (torch.arange(0, D, 2).float() / D)
    cos, sin = rope_tables(inv_freq, torch.arange(S))
    return (randn(g, 1, H, S, D), randn(g, 1, G, S, D), randn(g, 1, G, S, D), 1 + randn(g, D, scale=0.1),
            1 + randn(g, D, scale=0.1), cos, sin), {}


def qk_norm_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qw: torch.Tensor, kw: torch.Tensor,
                cos_k: torch.Tensor, sin_k: torch.Tensor) -> torch.Tensor:
    d, s, t = q.shape[-1], q.shape[2], k.shape[2]
    q, k = F.rms_norm(q, (d,), qw, 1e-6), F.rms_norm(k, (d,), kw, 1e-6)
    cos_q, sin_q = cos_k[t - s:], sin_k[t - s:]
    q = q * cos_q + rotate_half(q) * sin_q
    k = k * cos_k + rotate_half(k) * sin_k
    return F.scaled_dot_product_attention(q, k, v, is_causal=s > 1, enable_gqa=True)


# ---------------------------------------------------------------- int4 linear


def int4_make(g: torch.Generator, M: int, K: int, N: int, GS: int) -> Args:
    nibbles = torch.randint(0, 16, (N, K), generator=g, dtype=torch.int32)
    packed = (nibbles[:, 0::2] + 16 * nibbles[:, 1::2]).to(torch.uint8).view(torch.int8)
    scale = torch.rand(N, K // GS, generator=g) / 8 + 0.01
    return (randn(g, M, K), packed, scale), {}


def int4_ref(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    u = w.view(torch.uint8)
    q = torch.stack([u & 15, u >> 4], -1).reshape(w.shape[0], -1).float() - 8
    group = x.shape[1] // scale.shape[1]
    return F.linear(x, q * scale.repeat_interleave(group, 1))


# ---------------------------------------------------------------- rotary, norms, losses


def rotary_make(g: torch.Generator, T: int, H: int, D: int, RD: int) -> Args:
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, RD, 2).float() / RD)
    cos, sin = rope_tables(inv_freq, torch.arange(T))
    return (randn(g, T, H, D), cos, sin), {}


def rotary_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rd = cos.shape[-1]
    rot, rest = x[..., :rd], x[..., rd:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([rot * c + rotate_half(rot) * s, rest], -1)


def group_norm_make(g: torch.Generator, B: int, C: int, G: int, L: int) -> Args:
    # the group count is a number, passed after the tensors (the kernel's `G: dim`)
    return (randn(g, B, C, L), 1 + randn(g, C, scale=0.1), randn(g, C, scale=0.1), G), {}


def group_norm_ref(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, groups: int) -> torch.Tensor:
    return F.group_norm(x, groups, w, bias, 1e-5)


def cross_entropy_make(g: torch.Generator, T: int, V: int) -> Args:
    target = torch.randint(0, V, (T,), generator=g)
    target[::7] = -100  # padding positions
    return (randn(g, T, V, scale=2.0), target), {"smoothing": 0.1, "ignore": -100}


def cross_entropy_ref(logits: torch.Tensor, target: torch.Tensor, smoothing: float, ignore: int) -> torch.Tensor:
    return F.cross_entropy(logits, target, ignore_index=ignore, label_smoothing=smoothing)


def conv_make(g: torch.Generator, B: int, C: int, L: int) -> Args:
    return (randn(g, B, C, L), randn(g, C, 4, scale=0.5), randn(g, C, scale=0.1)), {}


def conv_ref(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    length = x.shape[-1]
    return F.silu(F.conv1d(x, w[:, None, :], bias, padding=w.shape[1] - 1, groups=x.shape[1])[..., :length])


# ---------------------------------------------------------------- mixture of experts, argmax


def moe_make(g: torch.Generator, T: int, D: int, E: int, F_: int) -> Args:
    s = D ** -0.5
    return (randn(g, T, D), randn(g, E, D, scale=s), randn(g, E, F_, D, scale=s), randn(g, E, F_, D, scale=s),
            randn(g, E, D, F_, scale=F_ ** -0.5), randn(g, F_, D, scale=s), randn(g, F_, D, scale=s),
            randn(g, D, F_, scale=F_ ** -0.5)), {"k": 2}


def moe_ref(x: torch.Tensor, router: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, wd: torch.Tensor,
            sg: torch.Tensor, su: torch.Tensor, sd: torch.Tensor, k: int) -> torch.Tensor:
    probs = torch.softmax(x @ router.T, -1)
    top, chosen = probs.topk(k, -1)
    top = top / top.sum(-1, keepdim=True)
    out = F.linear(F.silu(F.linear(x, sg)) * F.linear(x, su), sd)
    for e in range(router.shape[0]):
        rows, slot = torch.where(chosen == e)
        if rows.numel():
            xe = x[rows]
            ye = F.linear(F.silu(F.linear(xe, wg[e])) * F.linear(xe, wu[e]), wd[e])
            out.index_add_(0, rows, ye * top[rows, slot, None])
    return out


def argmax_make(g: torch.Generator, T: int, V: int) -> Args:
    return (randn(g, T, V),), {}


def argmax_ref(logits: torch.Tensor) -> torch.Tensor:
    return torch.argmax(logits, -1)


def mla_make(g: torch.Generator, B: int, H: int, P: int, R: int, T: int, C: int, V: int) -> Args:
    return (randn(g, B, H, P), randn(g, B, H, R), randn(g, B, T, C), randn(g, B, T, R),
            randn(g, H, P, C, scale=P ** -0.5), randn(g, H, C, V, scale=C ** -0.5)), {}


def mla_ref(q_nope: torch.Tensor, q_rope: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor,
            w_uk: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """The absorbed form as DeepSeek-V2's decode writes it in torch: einsums and a softmax."""
    q_lat = torch.einsum("bhp,hpc->bhc", q_nope, w_uk)
    scores = (q_lat @ c_kv.transpose(1, 2) + q_rope @ k_rope.transpose(1, 2)) / math.sqrt(q_nope.shape[-1]
                                                                                         + q_rope.shape[-1])
    o_lat = torch.softmax(scores, -1) @ c_kv
    return torch.einsum("bhc,hcv->bhv", o_lat, w_uv)


def cumsum_make(g: torch.Generator, M: int, N: int) -> Args:
    return (randn(g, M, N),), {}


def cumsum_ref(x: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(x, 1)


def paged_make(g: torch.Generator, B: int, H: int, G: int, E: int, P: int, MB: int) -> Args:
    """Ragged lengths (the first one fills its MB blocks), blocks scattered over the cache in a random order."""
    lens = torch.randint(1, MB * P + 1, (B,), generator=g)
    lens[0] = MB * P
    blocks = B * MB
    blk = torch.randperm(blocks, generator=g).to(torch.int32).view(B, MB)
    kc, vc = randn(g, blocks, G, P, E), randn(g, blocks, G, P, E)
    return (randn(g, B, H, E), kc, vc, blk, lens), {}


def paged_ref(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, blk: torch.Tensor,
              lens: torch.Tensor) -> torch.Tensor:
    """A loop over the sequences: gather each one's blocks, then the grouped heads' softmax by matmuls
    (on this CPU 2× faster than ``F.scaled_dot_product_attention(..., enable_gqa=True)`` per sequence)."""
    P, G, E = kc.shape[2], kc.shape[1], kc.shape[3]
    R = q.shape[1] // G
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        n = int(lens[b])
        used = blk[b, : (n + P - 1) // P].long()
        k = kc[used].permute(1, 0, 2, 3).reshape(G, -1, E)[:, :n]
        v = vc[used].permute(1, 0, 2, 3).reshape(G, -1, E)[:, :n]
        s = q[b].view(G, R, E) @ k.transpose(1, 2) / math.sqrt(E)
        out[b] = (torch.softmax(s, -1) @ v).reshape(-1, E)
    return out


OPERATORS: tuple[Operator, ...] = (
    # GPT-2 small: C = 768, a 256-token prompt
    Operator("gpt2 mlp", "gpt2_mlp", gpt2_make, gpt2_ref, {"T": 256, "C": 768}, {"T": 3, "C": 17}),
    # BLOOM-style ALiBi, 16 heads of 64, 512 tokens
    Operator("alibi attention", "alibi_attention", alibi_make, alibi_ref, {"H": 16, "S": 512, "D": 64},
             {"H": 2, "S": 17, "D": 8}),
    # Gemma-2-style: sliding window 256, softcap 50, GQA 8/4, 1024 tokens
    Operator("window softcap attention", "window_softcap_attention", window_make, window_ref,
             {"H": 8, "G": 4, "S": 1024, "D": 64, "W": 256}, {"H": 4, "G": 2, "S": 33, "D": 8, "W": 5}),
    # decode through a 4096 × 4096 int4 projection, groups of 128
    Operator("int4 linear (decode)", "linear_int4", int4_make, int4_ref, {"M": 1, "K": 4096, "N": 4096, "GS": 128},
             {"M": 3, "K": 64, "N": 17, "GS": 16}),
    # Phi-2 style: 32 heads of 80, rotary on the first 32 dims, 1024 tokens
    Operator("partial rotary", "partial_rotary", rotary_make, rotary_ref, {"T": 1024, "H": 32, "D": 80, "RD": 32},
             {"T": 3, "H": 2, "D": 10, "RD": 4}),
    # a Stable-Diffusion UNet block: 320 channels in 32 groups over 64 × 64
    Operator("group norm", "group_norm", group_norm_make, group_norm_ref, {"B": 2, "C": 320, "G": 32, "L": 4096},
             {"B": 2, "C": 6, "G": 3, "L": 17}),
    # a 32k vocabulary, 512 positions (every 7th is padding)
    Operator("cross-entropy smoothed", "cross_entropy_smooth", cross_entropy_make, cross_entropy_ref,
             {"T": 512, "V": 32000}, {"T": 17, "V": 33}),
    # Mamba-130m: 1536 inner channels, 1024 tokens, batch 2
    Operator("causal conv1d", "causal_conv1d", conv_make, conv_ref, {"B": 2, "C": 1536, "L": 1024},
             {"B": 2, "C": 3, "L": 17}),
    # Qwen3-style: 16 query heads over 8 KV heads of 128, 512 tokens
    Operator("qk-norm rope attention", "qk_norm_attention", qk_norm_make, qk_norm_ref,
             {"H": 16, "G": 8, "S": 512, "D": 128}, {"H": 4, "G": 2, "S": 17, "D": 8}),
    # 8 experts, top 2, plus a shared one, 64 tokens of 512
    Operator("moe top-2 + shared", "moe_shared", moe_make, moe_ref, {"T": 64, "D": 512, "E": 8, "F_": 1024},
             {"T": 5, "D": 17, "E": 4, "F_": 9}),
    # the same, each expert run on its routed tokens only (row conditions)
    Operator("moe routed + shared", "moe_routed", moe_make, moe_ref, {"T": 64, "D": 512, "E": 8, "F_": 1024},
             {"T": 5, "D": 17, "E": 4, "F_": 9}),
    # greedy decoding over a 32k vocabulary, a batch of 16
    Operator("greedy argmax", "greedy_argmax", argmax_make, argmax_ref, {"T": 16, "V": 32000}, {"T": 3, "V": 33},
             exact=True),
    # DeepSeek-V2-Lite decode: 16 heads, 128 no-rope + 64 rope dims, a 512 latent, 4 sequences at 2048
    Operator("mla decode (absorbed)", "mla_decode", mla_make, mla_ref,
             {"B": 4, "H": 16, "P": 128, "R": 64, "T": 2048, "C": 512, "V": 128},
             {"B": 2, "H": 3, "P": 5, "R": 4, "T": 33, "C": 17, "V": 6}),
    # cumulative sums over 64 rows of 4097 and a 32k vocabulary row (top-p's cumulative probabilities)
    Operator("cumsum", "cumsum_rows", cumsum_make, cumsum_ref, {"M": 64, "N": 32000}, {"M": 3, "N": 4097},
             tol=1e-3),
    # Llama-3-8B decode over a paged cache: 32 query heads on 8 KV heads of 128, blocks of 16,
    # 8 sequences of ragged lengths up to 2048
    Operator("paged decode attention", "paged_decode", paged_make, paged_ref,
             {"B": 8, "H": 32, "G": 8, "E": 128, "P": 16, "MB": 128},
             {"B": 3, "H": 4, "G": 2, "E": 8, "P": 4, "MB": 5}),
)
