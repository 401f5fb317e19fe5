"""DeepSeek-V2's decoder layer (``std.deepseek``): multi-head latent attention over a latent KV cache, and
a dense SwiGLU (the first ``first_k_dense_replace`` layers) or shared plus routed experts.

The layer keeps :class:`~arke.models.layer.CompiledLayer`'s surface (calls, checks, memory plans, model
bundles): ``y = layer(x, positions, cache)``. Its cache holds one normalised latent row (``kv_lora_rank``
wide) and one shared rope key per token, not per-head keys and values: :class:`LatentCache`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from arke.models.config import KVCache, by_expert, cache_zeros, check_weights, resident
from arke.models.layer import KERNELS, LAYER_SOURCE, CompiledLayer, Step, _Shape
from arke.runtime.memory import MemoryPlan


@dataclass(frozen=True)
class MlaConfig:
    """A DeepSeek-V2 layer: sizes, latent ranks, rope, and its MLP (dense, or shared plus routed experts)."""

    hidden: int
    heads: int
    q_lora: int  # 0: the query is one projection
    kv_lora: int  # C: the latent row
    nope: int  # P: each head's query/key dims without rope
    rope: int  # R: with rope (shared by the heads' keys)
    v_dim: int  # V: each head's value dims
    intermediate: int  # the dense MLP's, or each expert's
    eps: float
    inv_freq: tuple[float, ...]  # R / 2 rotary frequencies
    rope_scale: float  # the rope type's attention scaling of cos and sin
    softmax_scale: float  # (P + R) ** -0.5, with YaRN's mscale where the rope type has one
    experts: int = 0  # 0: a dense SwiGLU MLP
    shared: int = 0  # the shared experts' summed intermediate width
    top_k: int = 2
    routed_scale: float = 1.0
    topk_method: str = "greedy"
    groups: int = 1
    topk_groups: int = 1

    # what CompiledLayer's checks and KV caches read
    @property
    def kv_heads(self) -> int:
        return 1

    @property
    def head_dim(self) -> int:
        return self.kv_lora

    @property
    def window(self) -> None:
        return None


class LatentCache(KVCache):
    """The latent rows ``c [B, max_seq, C]`` and rope keys ``kr [B, max_seq, R]`` of every token seen."""

    def __init__(self, owner: CompiledLayer, batch: int):
        c: Any = owner.config
        self.owner, self.batch, self.length = owner, batch, 0
        self.c = cache_zeros((batch, owner.max_seq, c.kv_lora), torch.float32, "cpu")
        self.kr = cache_zeros((batch, owner.max_seq, c.rope), torch.float32, "cpu")
        self.k, self.v = self.c, self.kr

    @property
    def nbytes(self) -> int:
        return (self.c.numel() + self.kr.numel()) * 4

    def __repr__(self) -> str:
        return f"<latent KV cache: batch {self.batch}, {self.length} of {self.owner.max_seq} slots>"


class DeepseekLayer(CompiledLayer):
    """A DeepSeek-V2 decoder layer compiled for one target (f32 activations; f32 or bf16 weights)."""

    source = LAYER_SOURCE + "import std.deepseek\n"
    config_type = MlaConfig  # type: ignore[assignment]

    def __init__(self, config: MlaConfig, weights: dict[str, torch.Tensor], **options: Any):
        if options.get("weights_dtype", "f32") not in ("f32", "bf16"):
            raise ValueError("DeepSeek-V2 layers take f32 or bf16 weights (its checkpoints are bf16)")
        options.setdefault("name", "DeepseekV2DecoderLayer")
        super().__init__(config, weights, **options)  # type: ignore[arg-type]

    def _bind(self, call: Any) -> None:
        _, dtypes = KERNELS[self.kind]
        c: Any = self.config
        self._attn_in = call("mla_in_lora" if c.q_lora else "mla_in", **dtypes)
        self._attn = call("mla_attn", **dtypes)
        self._paged = call("mla_paged", **dtypes)
        self._attn_out = call("attn_out", **dtypes)
        if c.experts:
            self._route = call("moe_scores")
            self._expert = call("expert", **dtypes)
            self._combine = call("moe_combine")
            self._shared = call("shared_add", **dtypes)
        else:
            self._mlp = call("mlp", **dtypes)

    def new_cache(self, batch: int = 1) -> KVCache:
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive integer, not {batch!r}")
        return LatentCache(self, batch)

    def page_shapes(self, blocks: int, block_size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """A paged cache's pools for this layer: latent rows ``[NB, 1, P, C]`` and rope keys ``[NB, 1, P, R]``."""
        c: Any = self.config
        return (blocks, 1, block_size, c.kv_lora), (blocks, 1, block_size, c.rope)

    def attend_rows(self, rows: Any, v: dict[str, torch.Tensor]) -> int:
        """A running batch's rows (:class:`arke.models.paged.Rows`): each row's latent row and rope key into its
        slot of this layer's pools, then its attention over its sequence into ``v["o"]``."""
        c: Any = self.config
        cc, kr = rows.cache.k[rows.layer_index], rows.cache.v[rows.layer_index]
        n = rows.seq.numel()
        cc[rows.block, 0, rows.offset] = v["c"]
        kr[rows.block, 0, rows.offset] = v["k_r"]
        self._paged([v["q_lat"], v["q_r"], cc, kr, self.weights["uv"], rows.blk, rows.seq, rows.pos],
                    {"sm": c.softmax_scale}, v["o"].view(n, c.heads, c.v_dim), None)
        return 0

    def _pack(self, raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The query split into its no-rope and rope rows per head, the KV down-projection into its latent and
        rope rows, the KV up-projection into each head's key ``[H, P, C]`` and value ``[H, C, V]`` parts."""
        c: Any = self.config
        h, p, r, v, lat, d = c.heads, c.nope, c.rope, c.v_dim, c.kv_lora, c.hidden
        want = {"input_norm": (d,), "post_norm": (d,), "kv_a": (lat + r, d), "kv_norm": (lat,),
                "kv_b": (h * (p + v), lat), "o": (d, h * v)}
        want |= ({"q_a": (c.q_lora, d), "q_norm": (c.q_lora,), "q_b": (h * (p + r), c.q_lora)} if c.q_lora
                 else {"q": (h * (p + r), d)})
        if c.experts:
            want |= {"router": (c.experts, d), "experts_gate_up": (c.experts, 2 * c.intermediate, d),
                     "experts_down": (c.experts, d, c.intermediate), "shared_gate": (c.shared, d),
                     "shared_up": (c.shared, d), "shared_down": (d, c.shared)}
        else:
            want |= {"gate": (c.intermediate, d), "up": (c.intermediate, d), "down": (d, c.intermediate)}
        check_weights(self.name, raw, want)
        f32, out = torch.float32, {}
        for k in ("input_norm", "post_norm", "kv_norm", *(("q_norm",) if c.q_lora else ())):
            out[k] = raw[k].detach().to(f32).contiguous()
        out["inv_freq"] = torch.tensor(c.inv_freq, dtype=f32)
        q = raw["q_b" if c.q_lora else "q"].detach().float()
        q = q.view(h, p + r, -1)
        self._plain(q[:, :p], out, "qn")
        self._plain(q[:, p:], out, "qr")
        if c.q_lora:
            self._plain(raw["q_a"], out, "qa")
        kv_a = raw["kv_a"].detach().float()
        self._plain(kv_a[:lat], out, "kc")
        self._plain(kv_a[lat:], out, "kr")
        kv_b = raw["kv_b"].detach().float().view(h, p + v, lat)
        self._plain(kv_b[:, :p], out, "uk")  # [H, P, C]
        self._plain(kv_b[:, p:].transpose(1, 2), out, "uv")  # [H, C, V]
        self._weight(raw["o"], out, "o")
        self._pack_mlp(raw, out)
        if c.experts:
            for k in ("gate", "up", "down"):
                self._weight(raw[f"shared_{k}"], out, f"shared_{k}")
        return out

    def _plain(self, w: torch.Tensor, into: dict[str, torch.Tensor], name: str) -> None:
        """A weight of more than two axes (or read by no packed contraction): converted, never packed."""
        dtype = {"bf16": torch.bfloat16, "f16": torch.float16}.get(self.kind, torch.float32)
        into[name] = resident(w, self.device, dtype)

    def _attn_args(self, xf: torch.Tensor, pos: torch.Tensor) -> list[torch.Tensor]:
        c: Any = self.config
        w = self.weights
        q = [w["qa"], w["q_norm"], w["qn"], w["qr"]] if c.q_lora else [w["qn"], w["qr"]]
        return [xf, w["input_norm"], *q, w["kc"], w["kr"], w["kv_norm"], w["uk"], w["inv_freq"], pos]

    def _run(self, x: torch.Tensor, positions: torch.Tensor, cache: Any, b: int, t: int) -> torch.Tensor:
        c: Any = self.config
        w = self.weights
        n, v, temps, xf = self._inputs(x, b, t)
        pos = positions.detach().reshape(n).to(torch.int64).contiguous()
        self._attn_in(self._attn_args(xf, pos), {"eps": c.eps, "scale": c.rope_scale},
                      (v["q_lat"], v["q_r"], v["c"], v["k_r"]), temps.get("attn_in"))
        if isinstance(cache, LatentCache):
            start = cache.length
            cache.c[:, start:start + t].copy_(v["c"].view(b, t, c.kv_lora))
            cache.kr[:, start:start + t].copy_(v["k_r"].view(b, t, c.rope))
            self._attn([v["q_lat"].view(b, t, c.heads, c.kv_lora), v["q_r"].view(b, t, c.heads, c.rope), cache.c,
                        cache.kr, w["uv"]], {"n": start + t, "sm": c.softmax_scale}, v["o"], temps.get("attn"))
        else:  # the rows of a running batch over a paged cache (arke.models.paged)
            start = int(cache.attend(self, v))
        self._attn_out([v["o"].view(n, c.heads * c.v_dim), w["o"], xf], {}, v["h"], temps.get("attn_out"))
        y = torch.empty(n, c.hidden, dtype=torch.float32, device=self.device)
        if c.experts:
            self._moe(v, y, temps)
        else:
            self._mlp([v["h"], w["post_norm"], *self._gate_up("gu"), w["down"]], {"eps": c.eps}, y,
                      temps.get("mlp"))
        cache.length = start + t
        return y.view(b, t, c.hidden).to(x.dtype)

    def _moe(self, v: dict[str, torch.Tensor], y: torch.Tensor, temps: dict[str, dict[int, torch.Tensor]]) -> None:
        """Scores, each token's k experts (greedy, or within its best groups), the experts on their rows, the
        weighted combine with the residual, then the shared experts."""
        c: Any = self.config
        w = self.weights
        self._route([v["h"], w["post_norm"], w["router"]], {"eps": c.eps}, (v["hn"], v["route"]),
                    temps.get("moe_route"))
        scores = v["route"]
        if c.topk_method == "group_limited_greedy":
            n = scores.shape[0]
            best = scores.view(n, c.groups, -1).amax(dim=-1)
            keep = torch.zeros_like(best).scatter_(1, torch.topk(best, c.topk_groups, dim=-1).indices, 1.0)
            scores = scores * keep.repeat_interleave(c.experts // c.groups, dim=1)
        weight, expert = torch.topk(scores, c.top_k, dim=1)
        weight = weight * c.routed_scale
        rows, counts, slot = by_expert(expert, c.experts)
        at = 0
        for x, count in enumerate(counts):
            if count:
                self._expert([v["hn"], rows[at:at + count].contiguous(), *self._gate_up(f"gu{x}"), w[f"down{x}"]], {},
                             v["ys"][at:at + count])
            at += count
        self._combine([v["h"], v["ys"], slot, weight.contiguous()], {}, v["routed"],
                      temps.get("moe_combine"))
        self._shared([v["hn"], w["shared_gate"], w["shared_up"], w["shared_down"], v["routed"]], {}, y,
                     temps.get("shared"))

    def _plan(self, b: int, t: int) -> _Shape:
        c: Any = self.config
        n, f32 = b * t, torch.float32
        plan = MemoryPlan()
        plan.add("q_lat", (n, c.heads, c.kv_lora), f32, 0, 2)
        plan.add("q_r", (n, c.heads, c.rope), f32, 0, 2)
        plan.add("c", (n, c.kv_lora), f32, 0, 1)
        plan.add("k_r", (n, c.rope), f32, 0, 1)
        plan.add("o", (b, t, c.heads, c.v_dim), f32, 2, 3)
        plan.add("h", (n, c.hidden), f32, 3, 6 if c.experts else 4)
        if c.experts:
            plan.add("hn", (n, c.hidden), f32, 4, 7)
            plan.add("route", (n, c.experts), f32, 4, 5)
            plan.add("ys", (n * c.top_k, c.hidden), f32, 5, 6)
            plan.add("routed", (n, c.hidden), f32, 6, 7)
        return self._placed(plan, b, t)

    def _steps(self, b: int, t: int) -> list[Step]:
        c: Any = self.config
        w, n, probe = self.weights, b * t, self._probe
        xf, pos = probe(n, c.hidden), probe(n, dtype=torch.int64)
        steps: list[Step] = [
            ("attn_in", self._attn_in, self._attn_args(xf, pos), {}),
            ("append", None, [], {}),
            ("attn", self._attn, [probe(b, t, c.heads, c.kv_lora), probe(b, t, c.heads, c.rope),
                                  probe(b, self.max_seq, c.kv_lora), probe(b, self.max_seq, c.rope), w["uv"]],
             {"n": t, "sm": c.softmax_scale}),
            ("attn_out", self._attn_out, [probe(n, c.heads * c.v_dim), w["o"], xf], {})]
        if c.experts:
            slot = probe(n, c.top_k, dtype=torch.int64)
            steps += [("moe_route", self._route, [xf, w["post_norm"], w["router"]], {}),
                      ("experts", self._expert, [xf, pos[:1], *self._gate_up("gu0"), w["down0"]], {}),
                      ("moe_combine", self._combine, [xf, probe(n * c.top_k, c.hidden), slot, probe(n, c.top_k)], {}),
                      ("shared", self._shared, [xf, w["shared_gate"], w["shared_up"], w["shared_down"], xf], {})]
        else:
            steps.append(("mlp", self._mlp, [xf, w["post_norm"], *self._gate_up("gu"), w["down"]], {}))
        return steps
