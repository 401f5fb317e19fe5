"""Executable plans for whole decoder layers: one compiled object per layer and target.

A :class:`CompiledLayer` holds

* the kernels of ``std.decoder`` built for its target, with the attention specialised by
  shape: one new token per sequence (decode) runs ``split_kv``, more (prefill) ``flash``;
* its weights, packed once at load: q, k and v projections fused into one matrix, gate and up
  into another (the kernels read them as two views), optionally as bf16, f16 or int8 (one f32
  scale per output channel) weight-only copies;
* a memory plan per call shape (:mod:`arke.runtime.memory`): the activations between kernels
  and each kernel's temporaries placed in one arena by lifetime, so a decode step allocates
  nothing but its result;
* KV caches (:meth:`CompiledLayer.new_cache`) preallocated to ``max_seq`` slots, contiguous per
  layer (``[batch, kv_heads, max_seq, head_dim]`` for keys and for values).

A call ``layer(x, positions, cache)`` checks everything first (hidden size, positions against
``max_seq``, the cache's batch and room, devices) so a bad call changes nothing, then runs
``attn_in`` (norm, QKV, rotary), appends the T new keys and values to the cache, runs the
attention over the cache, ``attn_out`` and the MLP (``mlp``, or ``moe_route`` → one ``expert``
call per expert on the tokens routed to it → ``moe_combine``), and advances the cache.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from arke.ir import strategy as sir
from arke.models.attend import attend
from arke.models.calls import KernelCall, ReferenceCall
from arke.models.config import KVCache, LayerConfig, by_expert, quantize_int8, resident
from arke.runtime.errors import GuardError
from arke.runtime.memory import MemoryPlan
from arke.runtime.pool import evict_oldest
from arke.runtime.record import recording

WEIGHT_KINDS = ("f32", "bf16", "f16", "int8")
#: std.decoder's weight-reading kernels are generic (language spec §5.6): per weight kind, the suffix of
#: the kernel (``_q``: quantised, with scales) and the dtype its variable is bound to
KERNELS = {"f32": ("", {"W": "f32"}), "bf16": ("", {"W": "bf16"}), "f16": ("", {"W": "f16"}),
           "int8": ("_q", {"Q": "i8"})}

#: The layer's own module: std.decoder, with the attention specialised by shape.
LAYER_SOURCE = """import std.decoder

@strategy(attn_cached, when T == 1) { algorithm = split_kv }
@strategy(attn_cached) { algorithm = flash }
@strategy(attn_window, when T == 1) { algorithm = split_kv }
@strategy(attn_window) { algorithm = flash }
@strategy(attn_cached_h, when T == 1) { algorithm = split_kv }
@strategy(attn_cached_h) { algorithm = flash }
@strategy(attn_window_h, when T == 1) { algorithm = split_kv }
@strategy(attn_window_h) { algorithm = flash }
"""


@dataclass
class _Shape:
    """What one call shape (batch, tokens) needs: its memory plan and arena."""

    memory: MemoryPlan
    arena: torch.Tensor
    views: dict[str, torch.Tensor]
    temps: dict[str, dict[int, torch.Tensor]]  # kernel step -> its temporaries (CPU only)


#: one step of a layer call: its tag, the kernel (None: the runtime's own KV append), probe tensors, scalars
Step = tuple[str, KernelCall | ReferenceCall | None, list[torch.Tensor], dict[str, Any]]

#: ``target=REFERENCE`` runs a layer's plan with every kernel on the reference interpreter (the oracle)
REFERENCE = "reference"


def _layer_target(name: str) -> Any:
    """The registered target ``name``, if decoder layers run on it (a ValueError naming those that do)."""
    from arke.targets import base as targets

    found = targets.get(name)
    if not found.runs_layers:
        takers = [t.name for t in targets.all_targets() if t.runs_layers]
        raise ValueError(f"decoder layers run on the {', '.join(takers)} targets or {REFERENCE!r}, not {name!r}")
    return found


class CompiledLayer:
    """A decoder layer compiled for one target: ``y = layer(x, positions, cache)``.

    ``x``: float ``[B, T, hidden]``; ``positions``: int64 ``[B, T]`` (the rotary positions);
    ``cache``: from :meth:`new_cache` with the same ``B``. The call appends its T tokens to the
    cache and returns ``y`` like ``x`` (its dtype, its device).

    ``target="reference"`` runs the same plan with every kernel on the reference interpreter:
    the oracle a compiled layer is checked against.

    Calls from several threads are serialised: each call shape has one arena, and a call checks
    the cache under the same lock (two threads filling one cache past ``max_seq``: the second
    gets a :class:`~arke.runtime.errors.GuardError`, and the cache holds the first's tokens).
    """

    def __init__(self, config: LayerConfig, weights: dict[str, torch.Tensor], *, target: str = "llvm",
                 max_seq: int = 4096, weights_dtype: str = "f32", name: str = "decoder layer",
                 threads: int | None = None, plan: str | Path | Sequence[sir.Strategy] | None = None,
                 tuning: str = "on"):
        import arke

        if weights_dtype not in WEIGHT_KINDS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHT_KINDS)}, not {weights_dtype!r}")
        if max_seq < 1:
            raise ValueError(f"max_seq must be at least 1, not {max_seq}")
        self.config, self.target, self.max_seq, self.kind, self.name = config, target, max_seq, weights_dtype, name
        self.backend = None if target == REFERENCE else _layer_target(target)
        self.device = torch.device("cpu") if self.backend is None else self.backend.layer_device()
        if tuning not in ("on", "off"):
            raise ValueError(f"tuning is 'on' (use arke.models.tune's plans) or 'off', not {tuning!r}")
        self.threads = threads
        module = arke.loads(self.source, "<decoder layer>")
        #: the plan's strategies (spec/tuning.md §6): given, else this machine's tuned plan, before the defaults
        self.plan: tuple[sir.Strategy, ...] = ()
        if self.backend is not None:
            from arke.models import plans

            found = plans.resolve(plan) if plan is not None else (
                plans.tuned(config, weights_dtype, str(self.act_dtype), target, self.device.type)
                if tuning == "on" else ())
            self.plan = tuple(s for s in found if s.target in (None, target))
            if self.plan:
                module = dataclasses.replace(module, strategies=sir.StrategySet((*self.plan,
                                                                                 *module.strategies.strategies)))
        self.module: Any = module
        if self.backend is None:
            kernels = module.kernels

            def call(name: str, **dtypes: str) -> KernelCall | ReferenceCall:
                k = kernels[name]
                return ReferenceCall(k.specialise(**dtypes) if dtypes else k)
        else:
            built = arke.build(module, target=target, threads=threads, tuning=tuning)
            compiled = built.kernels
            on_device = not built.on_host

            def call(name: str, **dtypes: str) -> KernelCall | ReferenceCall:
                k = compiled[name]
                return KernelCall(k.specialise(**dtypes) if dtypes else k, on_device)
        # weights are packed once into the panels the target's contraction kernels read (0: not packed)
        self.nr = 0 if self.backend is None else self.backend.panel_width(weights_dtype)
        self.packed_weights = False  # whether some weights are held in a contraction's prepacked panels
        self.weights = self._pack(weights)
        self._start(call)

    def _start(self, call: Any) -> None:
        self._bind(call)
        self._shapes: dict[tuple[int, int], _Shape] = {}
        self._lock = threading.Lock()
        self._calling = threading.Lock()

    @classmethod
    def restore(cls, config: LayerConfig, weights: dict[str, torch.Tensor], call: Any, *, target: str, max_seq: int,
                weights_dtype: str, name: str, nr: int, act_dtype: torch.dtype | None = None) -> CompiledLayer:
        """A layer of a model bundle (:mod:`arke.models.bundle`): ``call(name, **dtypes)`` gives each kernel, and
        ``weights`` are as :meth:`_pack` left them (panels registered). Nothing is compiled or packed."""
        from arke.runtime.panels import panels_of

        self = cls.__new__(cls)
        if act_dtype is not None:
            self.act_dtype = act_dtype
        self.config, self.target, self.max_seq, self.kind, self.name = config, target, max_seq, weights_dtype, name
        self.backend, self.device, self.threads, self.plan, self.module = None, torch.device("cpu"), None, (), None
        self.nr, self.weights, self.packed_weights = nr, weights, any(panels_of(w) for w in weights.values())
        self._start(call)
        return self

    #: the dtype of the activations between kernels and of the KV cache
    act_dtype = torch.float32
    #: the module of the layer's kernels (a subclass for another architecture adds its own), and its config's type
    source, config_type = LAYER_SOURCE, LayerConfig

    def _bind(self, call: Any) -> None:
        """The layer's kernel calls (``call(name, **dtypes)``: a kernel of :data:`LAYER_SOURCE`)."""
        s, dtypes = KERNELS[self.kind]
        self._attn_in = call("attn_in" + s, **dtypes)
        self._attn = call("attn_window" if self.config.window else "attn_cached")
        self._paged = call("attn_paged_window" if self.config.window else "attn_paged")
        self._attn_out = call("attn_out" + s, **dtypes)
        if self.config.experts:
            self._route = call("moe_route")
            self._expert = call("expert" + s, **dtypes)
            self._combine = call("moe_combine")
        else:
            self._mlp = call("mlp" + s, **dtypes)

    def __repr__(self) -> str:
        c = self.config
        mlp = f"{c.experts} experts (top {c.top_k})" if c.experts else f"MLP {c.intermediate}"
        return (f"<{self.name} on {self.target}: hidden {c.hidden}, {c.heads} heads / {c.kv_heads} KV heads of "
                f"{c.head_dim}, {mlp}, {self.kind} weights, max_seq {self.max_seq}>")

    # -- weights
    def _weight(self, w: torch.Tensor, into: dict[str, torch.Tensor], name: str) -> None:
        """``into[name]`` (and ``name + "_s"``, the int8 scales) in this layer's weight kind."""
        w = w.detach().float().contiguous()
        if self.kind in ("bf16", "f16"):
            into[name] = resident(w, self.device, torch.bfloat16 if self.kind == "bf16" else torch.float16)
        elif self.kind == "int8":
            q, scale = quantize_int8(w)
            into[name], into[name + "_s"] = resident(q, self.device), resident(scale, self.device)
        elif self.nr:  # f32 on the CPU: packed into the contraction kernels' panels, once
            from arke.runtime.panels import pack_panels

            into[name] = pack_panels(w, self.nr)
            self.packed_weights = True
        else:
            into[name] = resident(w, self.device)

    def _split(self, into: dict[str, torch.Tensor], tag: str, dense: torch.Tensor) -> None:
        """The gate and up halves of a fused ``[2F, D]`` matrix, as ``tag.g`` and ``tag.u`` (int8: their
        scales as ``tag.g_s``, ``tag.u_s``): views of one tensor. Panels whose halves do not fall on a
        panel boundary (F not a multiple of nr) are packed half by half from ``dense`` instead."""
        f = self.config.intermediate
        whole = into.pop(tag)
        into[tag + ".g"], into[tag + ".u"] = whole[:f], whole[f:]
        if self.kind == "int8":
            scales = into.pop(tag + "_s")
            into[tag + ".g_s"], into[tag + ".u_s"] = scales[:f], scales[f:]
        if self.nr:
            from arke.runtime.panels import pack_panels, register_panels

            if f % self.nr:
                into[tag + ".g"], into[tag + ".u"] = pack_panels(dense[:f], self.nr), pack_panels(dense[f:], self.nr)
            else:  # the halves start at panels 0 and f / nr of the packed matrix
                register_panels(into[tag + ".g"], self.nr)
                register_panels(into[tag + ".u"], self.nr)

    def _check_raw(self, raw: dict[str, torch.Tensor]) -> LayerConfig:
        """Every weight the layer needs is there, of its shape (a ValueError naming the first that is not)."""
        c = self.config
        need = ["input_norm", "q", "k", "v", "o", "post_norm"]
        need += ["router", "experts_gate_up", "experts_down"] if c.experts else ["gate", "up", "down"]
        missing = [n for n in need if n not in raw]
        if missing:
            raise ValueError(f"{self.name}: missing weights {', '.join(missing)}")
        d, e = c.hidden, c.head_dim
        want = {"input_norm": (d,), "post_norm": (d,), "q": (c.heads * e, d), "k": (c.kv_heads * e, d),
                "v": (c.kv_heads * e, d), "o": (d, c.heads * e)}
        if c.experts:
            want |= {"router": (c.experts, d), "experts_gate_up": (c.experts, 2 * c.intermediate, d),
                     "experts_down": (c.experts, d, c.intermediate)}
        else:
            want |= {"gate": (c.intermediate, d), "up": (c.intermediate, d), "down": (d, c.intermediate)}
        for part, heads in (("q", c.heads), ("k", c.kv_heads), ("v", c.kv_heads)):
            if part + "_bias" in raw:
                want[part + "_bias"] = (heads * e,)
        for n, shape in want.items():
            if tuple(raw[n].shape) != shape:
                raise ValueError(f"{self.name}: weight {n!r} has shape {list(raw[n].shape)}, expected {list(shape)}")
        for n, t in raw.items():  # a weight is a float; an integer or bool tensor would be converted silently
            if not t.dtype.is_floating_point or t.dtype.itemsize < 2:
                raise ValueError(f"{self.name}: weight {n!r} is {str(t.dtype).removeprefix('torch.')}; the layer "
                                 "reads float32, float16 or bfloat16 weights (quantize with weights='int8')")
        return c

    def _pack(self, raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Fused and converted weights: ``qkv`` [(H + 2G) E, D], ``gu`` [2F, D] (gate rows, then up)."""
        c = self._check_raw(raw)
        e = c.head_dim
        out: dict[str, torch.Tensor] = {}
        dev, f32 = self.device, torch.float32
        out["wn1"] = raw["input_norm"].detach().to(dev, f32).contiguous()
        out["wn2"] = raw["post_norm"].detach().to(dev, f32).contiguous()
        out["inv_freq"] = torch.tensor(c.inv_freq, dtype=f32, device=dev)
        self._weight(torch.cat([raw["q"], raw["k"], raw["v"]]), out, "qkv")
        for part, heads in (("q", c.heads), ("k", c.kv_heads), ("v", c.kv_heads)):
            bias = raw.get(part + "_bias")
            out["b" + part] = (bias.detach().to(dev, f32).reshape(heads, e).contiguous() if bias is not None
                               else torch.zeros(heads, e, dtype=f32, device=dev))
        self._weight(raw["o"], out, "o")
        self._pack_mlp(raw, out)
        return out

    def _pack_mlp(self, raw: dict[str, torch.Tensor], out: dict[str, torch.Tensor]) -> None:
        """The MLP's weights: ``gu``/``down`` (dense), or the router and each expert's ``gu{x}``/``down{x}``."""
        if self.config.experts:
            out["router"] = raw["router"].detach().to(self.device, torch.float32).contiguous()
            for x in range(self.config.experts):
                dense = raw["experts_gate_up"][x].detach().float()
                self._weight(dense, out, f"gu{x}")
                self._split(out, f"gu{x}", dense)
                self._weight(raw["experts_down"][x], out, f"down{x}")
            return
        dense = torch.cat([raw["gate"], raw["up"]]).detach().float()
        self._weight(dense, out, "gu")
        self._split(out, "gu", dense)
        self._weight(raw["down"], out, "down")

    def _gate_up(self, tag: str) -> list[torch.Tensor]:
        """The gate and up weights (views of the fused matrix; int8: each followed by its scales)."""
        w = self.weights
        if self.kind == "int8":
            return [w[tag + ".g"], w[tag + ".g_s"], w[tag + ".u"], w[tag + ".u_s"]]
        return [w[tag + ".g"], w[tag + ".u"]]

    def _scaled(self, tag: str) -> list[torch.Tensor]:
        return [self.weights[tag], self.weights[tag + "_s"]] if self.kind == "int8" else [self.weights[tag]]

    @property
    def weight_bytes(self) -> int:
        """Bytes of every weight the layer reads (what bounds a decode step from below)."""
        return sum(t.numel() * t.element_size() for t in self.weights.values())

    # -- caches and calls
    def new_cache(self, batch: int = 1) -> KVCache:
        """An empty KV cache for ``batch`` sequences, ``max_seq`` slots each."""
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive integer, not {batch!r}")
        return KVCache(self, batch)

    def _error(self, message: str, rule: str, param: str) -> GuardError:
        return GuardError(self.name, message, rule=rule, param=param)

    def _check(self, x: Any, positions: Any, cache: Any) -> tuple[int, int]:
        """Every check a call needs, before anything runs or changes: ``(B, T)``."""
        c = self.config
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise self._error(f"x must be a float torch tensor, not {type(x).__name__}"
                              + (f" of {x.dtype}" if isinstance(x, torch.Tensor) else ""), "type", "x")
        if not isinstance(positions, torch.Tensor) or positions.dtype not in (torch.int64, torch.int32):
            raise self._error("positions must be an int64 torch tensor [batch, tokens]", "type", "positions")
        for name, v in (("x", x), ("positions", positions)):  # before any value is read
            if v.layout != torch.strided:
                raise self._error(f"{name} is a {str(v.layout).removeprefix('torch.')} tensor; pass a dense one "
                                  "(`.to_dense()`)", "type", name)
            if v.device.type != self.device.type:
                raise self._error(f"{name} is on {v.device}, but this layer runs on {self.device}; move it there "
                                  f"(`.to({str(self.device.type)!r})`)", "device", name)
        if x.dim() != 3 or x.shape[2] != c.hidden:
            raise self._error(f"x must be [batch, tokens, {c.hidden}], but has shape {list(x.shape)}", "dim", "x")
        b, t = int(x.shape[0]), int(x.shape[1])
        if t < 1 or b < 1:
            raise self._error(f"x has shape {list(x.shape)}: at least one sequence of one token is needed", "dim", "x")
        if tuple(positions.shape) != (b, t):
            raise self._error(f"positions has shape {list(positions.shape)}, but x needs [{b}, {t}]", "dim",
                              "positions")
        if not isinstance(cache, KVCache) or cache.owner is not self:
            raise self._error("cache must come from this layer's new_cache()", "type", "cache")
        if cache.batch != b:
            raise self._error(f"the cache holds {cache.batch} sequences, but x has {b}", "dim", "cache")
        if cache.length + t > self.max_seq:
            raise self._error(f"the cache has {self.max_seq - cache.length} free slots of {self.max_seq} (max_seq), "
                              f"but {t} tokens were given", "dim", "cache")
        lo, hi = int(positions.min()), int(positions.max())
        if lo < 0 or hi >= self.max_seq:
            raise self._error(f"positions must lie in [0, {self.max_seq}) (max_seq), but range over [{lo}, {hi}]",
                              "dim", "positions")
        return b, t

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache) -> torch.Tensor:
        with self._calling:  # the shape's arena is shared by every call of that shape
            # checked under the lock: another thread's call may have filled the cache meanwhile
            b, t = self._check(x, positions, cache)
            return self._run(x, positions, cache, b, t)

    def _inputs(self, x: torch.Tensor, b: int, t: int) -> tuple[int, dict[str, torch.Tensor],
                                                                   dict[str, dict[int, torch.Tensor]], torch.Tensor]:
        """A call's row count, its shape's activations and temporaries (views of the arena), and ``x`` as f32
        rows ``[B * T, hidden]``."""
        shape, xf = self._shape(b, t), x.detach().reshape(b * t, self.config.hidden).to(torch.float32).contiguous()
        if (rec := recording()) is not None:  # a recorded decode step may copy nothing outside its kernels
            rec.check(xf.data_ptr() == x.data_ptr() and x.dtype == torch.float32, f"{self.name}: x is copied")
        return b * t, shape.views, shape.temps, xf

    def _run(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, b: int, t: int) -> torch.Tensor:
        c, w = self.config, self.weights
        n, v, temps, xf = self._inputs(x, b, t)
        pos = positions.detach().reshape(n).to(torch.int64).contiguous()
        if (rec := recording()) is not None:
            rec.check(pos.data_ptr() == positions.data_ptr(), f"{self.name}: the positions are copied")
        qkv_args = [xf, w["wn1"], *self._scaled("qkv"), w["bq"], w["bk"], w["bv"], w["inv_freq"], pos]
        self._attn_in(qkv_args, {"eps": c.eps, "scale": c.rope_scale}, (v["q"], v["k"], v["v"]),
                      temps.get("attn_in"))
        start = self._attend(v, temps, cache, b, t)
        self._attn_out([v["o"].view(n, c.heads * c.head_dim), *self._scaled("o"), xf], {}, v["h"],
                       temps.get("attn_out"))
        y = torch.empty(n, c.hidden, dtype=torch.float32, device=self.device)
        if c.experts:
            self._moe(v, y, temps)
        else:
            self._mlp([v["h"], w["wn2"], *self._gate_up("gu"), *self._scaled("down")], {"eps": c.eps}, y,
                      temps.get("mlp"))
        cache.length = start + t
        return y.view(b, t, c.hidden).to(x.dtype)

    def _attend(self, v: dict[str, torch.Tensor], temps: dict[str, dict[int, torch.Tensor]], cache: KVCache,
                b: int, t: int) -> int:
        """Append the call's keys and values (``v["k"]``, ``v["v"]``) to the cache at its length, then the
        attention of ``v["q"]`` over it into ``v["o"]``; the length before the call (the cache is not advanced)."""
        return attend(self, v, temps, cache, b, t)

    def _moe(self, v: dict[str, torch.Tensor], y: torch.Tensor, temps: dict[str, dict[int, torch.Tensor]]) -> None:
        """Route, run each expert on the rows routed to it (nothing else), combine with the residual."""
        c, w = self.config, self.weights
        self._route([v["h"], w["wn2"], w["router"]], {"eps": c.eps, "k": c.top_k}, (v["hn"], v["route"]),
                    temps.get("moe_route"))
        weight, expert = torch.topk(v["route"], c.top_k, dim=1)  # each token's k experts (weights renormalised)
        rows, counts, slot = by_expert(expert, c.experts)  # the (token, s) pairs grouped by expert
        at = 0
        for x, count in enumerate(counts):
            if count:  # an expert no token chose is not run at all
                args = [v["hn"], rows[at:at + count].contiguous(), *self._gate_up(f"gu{x}"), *self._scaled(f"down{x}")]
                self._expert(args, {}, v["ys"][at:at + count])
            at += count
        self._combine([v["h"], v["ys"], slot, weight.contiguous()], {}, y,
                      temps.get("moe_combine"))

    # -- memory
    def _shape(self, b: int, t: int) -> _Shape:
        with self._lock:
            found = self._shapes.get((b, t))
            if found is None:
                if len(self._shapes) >= 8:
                    evict_oldest(self._shapes)
                found = self._plan(b, t)
                self._shapes[(b, t)] = found
            return found

    def memory(self, batch: int, tokens: int) -> MemoryPlan:
        """The memory plan of a call with this many sequences and tokens each."""
        return self._shape(batch, tokens).memory

    def _plan(self, b: int, t: int) -> _Shape:
        c, n = self.config, b * t
        e, f32 = c.head_dim, torch.float32
        plan = MemoryPlan()
        # activations between kernels; steps: 0 attn_in, 1 append, 2 attention, 3 attn_out, 4.. the MLP
        plan.add("q", (n, c.heads, e), f32, 0, 2)
        plan.add("k", (n, c.kv_heads, e), f32, 0, 1)
        plan.add("v", (n, c.kv_heads, e), f32, 0, 1)
        plan.add("o", (b, t, c.heads, e), f32, 2, 3)
        plan.add("h", (n, c.hidden), f32, 3, 6 if c.experts else 4)
        if c.experts:
            plan.add("hn", (n, c.hidden), f32, 4, 5)
            plan.add("route", (n, c.experts), f32, 4, 5)
            plan.add("ys", (n * c.top_k, c.hidden), f32, 5, 6)
        return self._placed(plan, b, t)

    def _placed(self, plan: MemoryPlan, b: int, t: int) -> _Shape:
        """``plan`` (the activations between kernels) with each step's kernel temporaries, placed in one arena."""
        steps = self._temp_steps(b, t)
        for step, (tag, temps) in enumerate(steps):
            for index, (shape, dtype) in temps.items():
                plan.add(f"{tag}.{index}", shape, dtype, step, step)
        plan.place()
        arena = torch.empty(max(1, plan.arena_bytes), dtype=torch.uint8, device=self.device)
        views = plan.bind(arena)
        bound = {tag: {i: views[f"{tag}.{i}"] for i in temps} for tag, temps in steps if temps}
        return _Shape(plan, arena, views, bound)

    def _steps(self, b: int, t: int) -> list[Step]:
        """The steps of a call with ``b`` sequences of ``t`` tokens: each kernel with probe tensors of its
        arguments' shapes and its scalars (``append``, the runtime's own step, has no kernel)."""
        c, w, n, probe = self.config, self.weights, b * t, self._probe
        xf, pos = probe(n, c.hidden), probe(n, dtype=torch.int64)
        q, kc = probe(b, t, c.heads, c.head_dim), probe(b, c.kv_heads, self.max_seq, c.head_dim)
        attn: dict[str, Any] = {"n": t} | ({"window": c.window} if c.window else {})
        steps: list[tuple[str, KernelCall | ReferenceCall | None, list[torch.Tensor], dict[str, Any]]] = [
            ("attn_in", self._attn_in, [xf, w["wn1"], *self._scaled("qkv"), w["bq"], w["bk"], w["bv"], w["inv_freq"],
                                        pos], {}),
            ("append", None, [], {}),
            ("attn", self._attn, [q, kc, kc], attn),
            ("attn_out", self._attn_out, [probe(n, c.heads * c.head_dim), *self._scaled("o"), xf], {})]
        if c.experts:
            slot = probe(n, c.top_k, dtype=torch.int64)
            steps += [("moe_route", self._route, [xf, w["wn2"], w["router"]], {}),
                      ("experts", self._expert, [xf, pos[:1], *self._gate_up("gu0"), *self._scaled("down0")], {}),
                      ("moe_combine", self._combine, [xf, probe(n * c.top_k, c.hidden), slot, probe(n, c.top_k)], {})]
        else:
            steps.append(("mlp", self._mlp, [xf, w["wn2"], *self._gate_up("gu"), *self._scaled("down")], {}))
        return steps

    def _temp_steps(self, b: int, t: int) -> list[tuple[str, dict[int, tuple[tuple[int, ...], torch.dtype]]]]:
        """Per step, the temporaries of its kernel (CPU kernels lend theirs to the plan; others keep their own).
        The experts' row counts change with every call: their kernels keep their own buffers."""
        if self.backend is None or not self.backend.lends_temporaries:
            return []
        out = []
        for tag, call, tensors, scalars in self._steps(b, t):
            temps = {}
            if call is not None and tag != "experts":
                dims, variant = call.resolve(tensors, scalars)
                temps = variant.temp_buffers(dims)
            out.append((tag, temps))
        return out

    def _probe(self, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A tensor of this shape and dtype that owns one element (enough to resolve a call's dims)."""
        return torch.zeros((), dtype=dtype, device=self.device).expand(shape)

    def dispatches(self, batch: int, tokens: int) -> list[str]:
        """The kernels a call of this shape runs, each with its fused dispatches (after fusion)."""
        if self.module is None:
            return ["every kernel from a bundle (its own plans: akc build --bundle)"]
        if self.backend is None:
            return ["every kernel on the reference interpreter"]
        lines = []
        for _, call, tensors, scalars in self._steps(batch, tokens):
            if call is None:
                continue
            _, variant = call.resolve(tensors, scalars)
            plan = variant.plan
            parts = []
            for d in plan.dispatches:
                algorithm = plan.decision("algorithm")
                extra = f" ({algorithm.value})" if d.family == "attention" and algorithm is not None else ""
                parts.append(d.family + extra)
            lines.append(f"{call.kernel.name}: {', '.join(parts)}")
        return lines
