"""``torch.compile(model, backend="arke")``: Arke's kernels for the graph's linear layers and attention,
Inductor for the rest.

Registered through the ``torch_dynamo_backends`` entry point (``pyproject.toml``), so no import is
needed. The backend receives Dynamo's FX graph, replaces each node Arke takes with an operator of
:mod:`arke.torch.fx_ops`, and compiles the rewritten graph with Inductor (``compile_fx``), which
sees Arke's operators as opaque calls with exact fake implementations. Sizes stay symbolic: a
decode loop whose cache grows compiles once for every length.

Arke takes (inference, f32 on the CPU):

* ``F.linear(x, w, b)`` with ``x`` of any rank: ``std.nn``'s ``linear``/``linear_bias`` on the rows;
* ``F.scaled_dot_product_attention(q, k, v)`` on ``[B, H, S, D]`` tensors, without a mask, dropout or a
  scale other than ``1/sqrt(D)``, causal or not, grouped-query (``enable_gqa``) or not:
  ``std.attention``'s ``attention``/``causal_attention``.

Arke takes a node only where its kernel is faster than torch's operator here, timed at compile time on
the node's example shape (the weights themselves); the others stay torch's, for Inductor. A node of
those kinds that Arke cannot take stays torch's too; each graph's report (what Arke took, what it left
and why) goes to the ``arke.torch`` logger, and a graph with a node Arke cannot take warns once
(:class:`ArkeFallbackWarning`) with the reasons.
"""

from __future__ import annotations

import collections
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from arke.torch import fx_ops

LOG = logging.getLogger("arke.torch")
_LINEAR = {torch._C._nn.linear, F.linear}
_SDPA = {F.scaled_dot_product_attention, getattr(torch._C._nn, "scaled_dot_product_attention", None)} - {None}


class ArkeFallbackWarning(UserWarning):
    """A graph's linear or attention node runs on torch's operator (Inductor), not Arke's kernel."""


@dataclass
class Report:
    """What the backend did with one graph."""

    mode: str = "measured"  # how the calls choose between Arke's kernel and torch's (fx_ops.MODES)
    taken: collections.Counter[str] = field(default_factory=collections.Counter)
    left: list[tuple[str, str]] = field(default_factory=list)  # (node, reason) of linear/attention nodes
    slower: list[str] = field(default_factory=list)  # nodes whose torch operator was faster at their shape
    others: int = 0  # nodes of other kinds: Inductor's

    def __str__(self) -> str:
        took = ", ".join(f"{n} × {k}" for k, n in sorted(self.taken.items())) or "nothing"
        text = f"arke backend ({self.mode}): Arke took {took}; Inductor compiles the other {self.others} operations"
        if self.slower:
            text += f"; torch's operator measured faster for {', '.join(self.slower)}"
        if self.left:
            text += "; left to torch: " + "; ".join(f"{n} ({why})" for n, why in self.left)
        return text


_REPORTS: collections.deque[Report] = collections.deque(maxlen=64)


def reports() -> list[Report]:
    """The reports of the graphs compiled most recently in this process (oldest first)."""
    return list(_REPORTS)


def _meta(node: Any) -> Any:
    return node.meta.get("example_value") if isinstance(node, fx.Node) else node


def _arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _plain(t: Any, what: str) -> str | None:
    """Why tensor meta ``t`` cannot go to an Arke kernel (None: it can)."""
    if not isinstance(t, torch.Tensor):
        return f"{what} is not a tensor"
    if t.dtype != torch.float32:
        return f"{what} is {str(t.dtype).removeprefix('torch.')} (Arke's linear and attention take f32 here)"
    if t.device.type != "cpu":
        return f"{what} is on {t.device.type}"
    return None


def _linear_reason(node: fx.Node) -> str | None:
    x, w, b = _meta(_arg(node, 0, "input")), _meta(_arg(node, 1, "weight")), _meta(_arg(node, 2, "bias"))
    why = _plain(x, "the input") or _plain(w, "the weight") or (b is not None and _plain(b, "the bias")) or None
    if why:
        return why
    if w.dim() != 2 or x.dim() < 1 or (b is not None and b.dim() != 1):
        return "not a [N, K] weight on [..., K] rows"
    out = _meta(node)
    if isinstance(out, torch.Tensor) and out.requires_grad:
        return "gradients are needed (the backend compiles inference)"
    return None


def _sdpa_reason(node: fx.Node) -> str | None:
    q, k, v = (_meta(_arg(node, i, n)) for i, n in enumerate(("query", "key", "value")))
    why = _plain(q, "q") or _plain(k, "k") or _plain(v, "v")
    if why:
        return why
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "not [B, H, S, D] tensors"
    if _arg(node, 3, "attn_mask") is not None:
        return "an attention mask"
    if _arg(node, 4, "dropout_p", 0.0) not in (0, 0.0):
        return "dropout"
    scale = _arg(node, 6, "scale")
    try:  # a head size is fixed in a model: reading it specialises the graph on it (a guard), never on lengths
        d, dv = int(q.shape[-1]), int(v.shape[-1])
    except (TypeError, ValueError):
        return "a head size without a value"
    if dv != d:
        return "value head size differs from the query's"
    if isinstance(scale, fx.Node):  # a float dynamo made symbolic (dynamic=True): fixed in a model, read it
        try:
            scale = float(_meta(scale))
        except (TypeError, ValueError):
            return "a scale computed in the graph"
    if scale is not None and abs(scale - fx_ops.default_scale(d)) > 1e-6 * abs(scale):
        return f"scale {scale} (std.attention scales by 1/sqrt(D))"
    if q.shape[1] != k.shape[1] and not _arg(node, 7, "enable_gqa", False):
        return "different head counts without enable_gqa"
    out = _meta(node)
    if isinstance(out, torch.Tensor) and out.requires_grad:
        return "gradients are needed (the backend compiles inference)"
    return None


def _samples(gm: fx.GraphModule, example_inputs: list[Any] | None) -> dict[fx.Node, Any]:
    """The example inputs by placeholder (real tensors: the weights themselves)."""
    if example_inputs is None:
        return {}
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return dict(zip(places, example_inputs)) if len(places) == len(example_inputs) else {}


def _sample(value: Any, reals: dict[fx.Node, Any]) -> Any:
    """A real tensor for a node's value: the example input itself, else random data of its (hinted) shape."""
    from torch.fx.experimental.symbolic_shapes import optimization_hint

    if not isinstance(value, fx.Node):
        return value
    found = reals.get(value)
    if isinstance(found, torch.Tensor):
        return found
    meta = _meta(value)
    if isinstance(meta, torch.Tensor):
        return torch.randn([optimization_hint(d, fallback=64) for d in meta.shape], dtype=meta.dtype)
    if isinstance(meta, torch.SymInt):
        return optimization_hint(meta, fallback=64)
    if isinstance(meta, torch.SymFloat):  # a scale dynamo made symbolic
        hint = meta.node.hint
        return float(hint) if hint is not None else None
    return meta


def _arke_is_faster(node: fx.Node, args: tuple[Any, ...], reals: dict[fx.Node, Any]) -> bool:
    """Time Arke's kernel and torch's operator on the node's example shape (the choice the calls of that shape
    then keep): a node whose torch operator is faster stays torch's, and Inductor compiles it."""
    real = tuple(_sample(a, reals) for a in args)
    if node.target in _LINEAR:
        key = fx_ops.linear_key(*real[:3])
        torch.ops.arke_fx.linear.default(*real)
    else:
        key = fx_ops.sdpa_key(real[0], real[1], real[3])
        torch.ops.arke_fx.sdpa.default(*real)
    return fx_ops.decisions().get(key, "arke") == "arke"


def rewrite(gm: fx.GraphModule, mode: str = "measured", example_inputs: list[Any] | None = None) -> Report:
    """Replace the linear and attention nodes Arke takes with ``torch.ops.arke_fx`` calls (in place); ``mode``:
    how each call chooses between Arke's kernel and torch's operator (:data:`arke.torch.fx_ops.MODES`). With
    ``example_inputs`` (the graph's), a measured node whose torch operator is faster at its example shape is
    left to torch and Inductor."""
    fx_ops.define()
    report = Report(mode)
    reals = _samples(gm, example_inputs)
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in _LINEAR:
            kind, why = "linear", _linear_reason(node)
            args: tuple[Any, ...] = (_arg(node, 0, "input"), _arg(node, 1, "weight"), _arg(node, 2, "bias"), mode)
            target = torch.ops.arke_fx.linear.default
        elif node.target in _SDPA:
            kind, why = "attention", _sdpa_reason(node)
            args = (*(_arg(node, i, n) for i, n in enumerate(("query", "key", "value"))),
                    bool(_arg(node, 5, "is_causal", False)), _arg(node, 6, "scale"), mode)
            target = torch.ops.arke_fx.sdpa.default
        else:
            report.others += 1
            continue
        if why is not None:
            report.left.append((f"{kind} `{node.name}`", why))
            continue
        if mode == "measured" and example_inputs is not None:
            with torch.no_grad():
                faster = _arke_is_faster(node, args, reals)
            if not faster:
                report.slower.append(f"{kind} `{node.name}`")
                continue
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(target, args)
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        report.taken[kind] += 1
    gm.graph.lint()
    gm.recompile()
    return report


def arke_backend(gm: fx.GraphModule, example_inputs: list[Any], options: dict[str, Any] | None = None) -> Any:
    """The ``arke`` torch.compile backend: rewrite (:func:`rewrite`), then Inductor compiles the graph.

    ``torch.compile(..., options={...})``: ``"arke.rest": "eager"`` runs the rest of the graph as torch
    operations instead of compiling it with Inductor (quick to compile: tests of the rewrite);
    ``"arke.kernels"``: ``"measured"`` (default: per shape, the faster of Arke's kernel and torch's
    operator, see :mod:`arke.torch.fx_ops`), ``"arke"`` or ``"torch"``; every other key is an Inductor
    config patch.
    """
    patches = dict(options or {})
    rest = patches.pop("arke.rest", "inductor")
    if rest not in ("inductor", "eager"):
        raise ValueError(f"options['arke.rest'] is 'inductor' (default) or 'eager', not {rest!r}")
    kernels = patches.pop("arke.kernels", "measured")
    if kernels not in fx_ops.MODES:
        raise ValueError(f"options['arke.kernels'] is 'measured' (default), 'arke' or 'torch', not {kernels!r}")
    report = rewrite(gm, kernels, example_inputs)
    _REPORTS.append(report)
    LOG.info("%s", report)
    if report.left:
        warnings.warn(ArkeFallbackWarning(str(report)), stacklevel=2)
    if rest == "eager":
        return gm.forward
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs, config_patches=patches) if patches else compile_fx(gm, example_inputs)
