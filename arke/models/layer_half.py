"""Decoder layers whose activations are bf16 or f16 end to end (``std.decoder``'s ``_h`` kernels).

A :class:`HalfLayer` is a :class:`~arke.models.layer.CompiledLayer` whose activations between
kernels, KV cache, weights, norm weights and biases are all one half dtype ``A`` (bf16 or
f16), rounded where transformers rounds when the layer runs in that dtype; each kernel keeps
its sums, norm statistics and softmax in f32. A call runs::

    norm_h (input norm) → attn_in_h (QKV + bias, rotary) → append k, v to the cache
    → attn_cached_h / attn_window_h → proj_add_h (output projection + residual)
    → norm_h (post norm) → swiglu_h (gate, up, silu × up) → proj_add_h (down projection + residual)

The norms are kernels of their own, so every projection reads plain ``A`` rows: on a CPU with
bf16 matrix units the products run there (spec/codegen.md §5), and on GPUs they are
tensor-core contractions. Mixture-of-experts layers keep f32 activations.
"""

from __future__ import annotations

from typing import Any

import torch

from arke.models.calls import KernelCall, ReferenceCall
from arke.models.config import KVCache, LayerConfig, resident
from arke.models.layer import CompiledLayer, Step, _Shape
from arke.runtime.memory import MemoryPlan

#: The half dtypes a layer's activations may have, by the name of the kernels' dtype variable's value.
HALF = {torch.bfloat16: "bf16", torch.float16: "f16"}


class HalfLayer(CompiledLayer):
    """A dense decoder layer on bf16 or f16 activations: ``y = layer(x, positions, cache)``.

    Built by :func:`arke.models.from_transformers` or :func:`arke.models.layer_from_pretrained` with
    ``dtype=torch.bfloat16`` (or ``torch.float16``); ``x`` of any float dtype is rounded to the
    layer's dtype first and ``y`` comes back in ``x``'s dtype.
    """

    def __init__(self, config: LayerConfig, weights: dict[str, torch.Tensor], *, dtype: torch.dtype,
                 target: str = "llvm", max_seq: int = 4096, name: str = "decoder layer",
                 threads: int | None = None, plan: Any = None, tuning: str = "on"):
        if dtype not in HALF:
            raise ValueError(f"half-precision activations are bf16 or f16, not {dtype}")
        if config.experts:
            raise ValueError(f"{name}: {HALF[dtype]} activations run dense layers; a mixture of experts runs "
                             "with f32 activations (dtype=torch.float32, weights='bf16' for bf16 weights)")
        self.act_dtype = dtype
        super().__init__(config, weights, target=target, max_seq=max_seq, weights_dtype=HALF[dtype], name=name,
                         threads=threads, plan=plan, tuning=tuning)

    def __repr__(self) -> str:
        return super().__repr__().replace(f"{self.kind} weights", f"{self.kind} activations and weights")

    def _bind(self, call: Any) -> None:
        a = {"A": self.kind}
        self._norm = call("norm_h", **a)
        self._attn_in = call("attn_in_h", **a)
        self._attn = call("attn_window_h" if self.config.window else "attn_cached_h", **a)
        self._attn_out = call("proj_add_h", **a)
        self._swiglu = call("swiglu_h", **a)

    def _pack(self, raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every tensor in the layer's dtype: ``qkv`` [(H + 2G) E, D] fused, gate and up as views of ``gu``."""
        c, dev, a = self.config, self.device, self.act_dtype
        self._check_raw(raw)
        out: dict[str, torch.Tensor] = {}

        def put(name: str, w: torch.Tensor, pack: bool = False) -> None:
            out[name] = resident(w, dev, a)
            if pack and self.backend is not None:  # a projection's matrix: in the kernels' panels, once
                packed = self.backend.pack_weight(out[name])
                out[name] = out[name] if packed is None else packed
                self.packed_weights |= packed is not None

        put("wn1", raw["input_norm"])
        put("wn2", raw["post_norm"])
        out["inv_freq"] = torch.tensor(c.inv_freq, dtype=torch.float32, device=dev)
        put("qkv", torch.cat([raw["q"], raw["k"], raw["v"]]), pack=True)
        for part, heads in (("q", c.heads), ("k", c.kv_heads), ("v", c.kv_heads)):
            bias = raw.get(part + "_bias")
            put("b" + part, bias.reshape(heads, c.head_dim) if bias is not None
                else torch.zeros(heads, c.head_dim))
        put("o", raw["o"], pack=True)
        put("gu.g", raw["gate"], pack=True)
        put("gu.u", raw["up"], pack=True)
        put("down", raw["down"], pack=True)
        return out

    # -- calls
    def _run(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, b: int, t: int) -> torch.Tensor:
        c, w = self.config, self.weights
        n = b * t
        v, temps = self._shape(b, t).views, self._shape(b, t).temps
        xa = x.detach().reshape(n, c.hidden).to(self.act_dtype).contiguous()
        pos = positions.detach().reshape(n).to(torch.int64).contiguous()
        self._norm([xa, w["wn1"]], {"eps": c.eps}, v["hn"], temps.get("norm1"))
        self._attn_in([v["hn"], w["qkv"], w["bq"], w["bk"], w["bv"], w["inv_freq"], pos], {"scale": c.rope_scale},
                      (v["q"], v["k"], v["v"]), temps.get("attn_in"))
        start = self._attend(v, temps, cache, b, t)
        self._attn_out([v["o"].view(n, c.heads * c.head_dim), w["o"], xa], {}, v["h"], temps.get("attn_out"))
        self._norm([v["h"], w["wn2"]], {"eps": c.eps}, v["hn2"], temps.get("norm2"))
        self._swiglu([v["hn2"], w["gu.g"], w["gu.u"]], {}, v["a"], temps.get("swiglu"))
        y = torch.empty(n, c.hidden, dtype=self.act_dtype, device=self.device)
        self._attn_out([v["a"], w["down"], v["h"]], {}, y, temps.get("down"))
        cache.length = start + t
        return y.view(b, t, c.hidden).to(x.dtype)

    # -- memory
    def _plan(self, b: int, t: int) -> _Shape:
        c, n, a = self.config, b * t, self.act_dtype
        e = c.head_dim
        plan = MemoryPlan()
        # steps: 0 norm1, 1 attn_in, 2 append, 3 attention, 4 attn_out, 5 norm2, 6 swiglu, 7 down
        plan.add("hn", (n, c.hidden), a, 0, 1)
        plan.add("q", (n, c.heads, e), a, 1, 3)
        plan.add("k", (n, c.kv_heads, e), a, 1, 2)
        plan.add("v", (n, c.kv_heads, e), a, 1, 2)
        plan.add("o", (b, t, c.heads, e), a, 3, 4)
        plan.add("h", (n, c.hidden), a, 4, 7)
        plan.add("hn2", (n, c.hidden), a, 5, 6)
        plan.add("a", (n, c.intermediate), a, 6, 7)
        return self._placed(plan, b, t)

    def _steps(self, b: int, t: int) -> list[Step]:
        c, w, n, a = self.config, self.weights, b * t, self.act_dtype

        def probe(*shape: int, dtype: torch.dtype = a) -> torch.Tensor:
            return self._probe(*shape, dtype=dtype)

        rows = probe(n, c.hidden)
        q, kc = probe(b, t, c.heads, c.head_dim), probe(b, c.kv_heads, self.max_seq, c.head_dim)
        attn: dict[str, Any] = {"n": t} | ({"window": c.window} if c.window else {})
        calls: list[tuple[str, KernelCall | ReferenceCall | None, list[torch.Tensor], dict[str, Any]]] = [
            ("norm1", self._norm, [rows, w["wn1"]], {}),
            ("attn_in", self._attn_in, [rows, w["qkv"], w["bq"], w["bk"], w["bv"], w["inv_freq"],
                                        probe(n, dtype=torch.int64)], {}),
            ("append", None, [], {}),
            ("attn", self._attn, [q, kc, kc], attn),
            ("attn_out", self._attn_out, [probe(n, c.heads * c.head_dim), w["o"], rows], {}),
            ("norm2", self._norm, [rows, w["wn2"]], {}),
            ("swiglu", self._swiglu, [rows, w["gu.g"], w["gu.u"]], {}),
            ("down", self._attn_out, [probe(n, c.intermediate), w["down"], rows], {})]
        return calls

    def memory(self, batch: int, tokens: int) -> MemoryPlan:
        return self._shape(batch, tokens).memory
