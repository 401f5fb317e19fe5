"""``torch.compile(model, backend="arke")``: the model's ATen graph with Arke's kernels in it, Inductor for
the rest.

Registered through the ``torch_dynamo_backends`` entry point (``pyproject.toml``), so no import is
needed. Dynamo's FX graph goes through Inductor's own front end (``compile_fx``: functionalization,
decomposition to ATen); Arke's inner compiler rewrites the ATen graph, then hands it to Inductor's
(``compile_fx_inner``), which sees Arke's operators as opaque calls with exact fake implementations.
Sizes stay symbolic: a decode loop whose cache grows compiles once for every length.

The rewrite (inference, f32 on the CPU):

* ``mm``/``addmm`` whose second operand is a weight (a graph input, ``w.t()`` or GPT-2's ``[K, N]``) become
  ``std.nn``'s ``linear``/``linear_bias`` (:mod:`arke.torch.fx_ops`: the weight packed once into panels);
* attention (``_scaled_dot_product_flash_attention_for_cpu``, or ``scaled_dot_product_attention``)
  without a mask or dropout, causal or not, grouped-query or not, at any constant scale,
  becomes ``std.attention``'s ``attention``/``causal_attention``;
* regions of elementwise operations, reductions and layout operators become one ``.ak`` kernel each
  (:mod:`arke.torch.regions`, the operators' definitions in :mod:`arke.torch.aten_ak`).

A linear or attention node goes to Arke only where its kernel is faster than torch's operator here,
timed at compile time on the node's example shape (the weights themselves); the others stay torch's,
for Inductor. Each graph's report (what Arke took and fused, what it left and why) goes to the
``arke.torch`` logger, and a graph with a node or region Arke cannot take warns once
(:class:`ArkeFallbackWarning`) with the reasons.
"""

from __future__ import annotations

import collections
import logging
import operator
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from arke.torch import aten_ak, fx_ops, regions
from arke.torch.regions import _call, _layout

LOG = logging.getLogger("arke.torch")
aten = torch.ops.aten
#: attention as ATen graphs have it: (q, k, v, dropout_p, is_causal, *, attn_mask, scale) -> (out, lse, ...)
_SDPA_TUPLE = {aten._scaled_dot_product_flash_attention_for_cpu.default}
#: ... and undecomposed: (q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> out
_SDPA_PLAIN = {aten.scaled_dot_product_attention.default}
_SDPA = _SDPA_TUPLE | _SDPA_PLAIN


class ArkeFallbackWarning(UserWarning):
    """A graph's linear or attention node runs on torch's operator (Inductor), not Arke's kernel."""


@dataclass
class Report:
    """What the backend did with one graph."""

    mode: str = "measured"  # how the calls choose between Arke's kernel and torch's (fx_ops.MODES)
    taken: collections.Counter[str] = field(default_factory=collections.Counter)
    left: list[tuple[str, str]] = field(default_factory=list)  # (node, reason) of linear/attention nodes
    slower: list[str] = field(default_factory=list)  # nodes whose torch operator was faster at their shape
    others: int = 0  # operations left in the graph: Inductor's
    fused: list[int] = field(default_factory=list)  # the operations each fused Arke kernel replaced
    unfused: list[tuple[str, str]] = field(default_factory=list)  # (first node, reason) of regions not built
    small: int = 0  # regions too small to be worth a call (left to Inductor)
    foreign: list[str] = field(default_factory=list)  # the graph's ATen operators without a .ak definition
    untranslated: list[tuple[str, str]] = field(default_factory=list)  # (node, reason): defined, operands ruled out

    def __str__(self) -> str:
        took = ", ".join(f"{n} × {k}" for k, n in sorted(self.taken.items())) or "nothing"
        text = f"arke backend ({self.mode}): Arke took {took}"
        if self.fused:
            text += f"; {len(self.fused)} fused Arke kernels replaced {sum(self.fused)} operations"
        if self.small:
            text += f"; {self.small} regions too small for a kernel call of their own"
        text += f"; Inductor compiles the other {self.others} operations"
        if self.foreign:
            text += f" (without a .ak definition: {', '.join(self.foreign)})"
        if self.untranslated:
            text += "; not translated: " + "; ".join(f"`{n}` ({why})" for n, why in self.untranslated)
        if self.unfused:
            text += "; regions not fused: " + "; ".join(f"at `{n}` ({why})" for n, why in self.unfused)
        if self.slower:
            text += f"; torch's operator measured faster for {', '.join(self.slower)}"
        if self.left:
            text += "; left to torch: " + "; ".join(f"{n} ({why})" for n, why in self.left)
        return text


_REPORTS: collections.deque[Report] = collections.deque(maxlen=64)


def reports() -> list[Report]:
    """The reports of the graphs compiled most recently in this process (oldest first)."""
    return list(_REPORTS)


def _tensors(node: fx.Node) -> bool:
    """Whether ``node`` makes tensors (not a size computed from symbolic sizes)."""
    value = aten_ak.meta(node)
    values = value if isinstance(value, tuple | list) else (value,)
    return any(isinstance(v, torch.Tensor) for v in values)


def _meta(node: Any) -> Any:
    return aten_ak.meta(node)


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


def _weight(b: Any) -> tuple[fx.Node | None, bool]:
    """The weight of a matrix product's ``B`` operand, where it is a graph input (a parameter: packed once into
    panels): ``w [N, K]`` of ``B = w.t()``, or ``B`` itself stored ``[K, N]`` (GPT-2's Conv1D; second: True)."""
    if not isinstance(b, fx.Node):
        return None, False
    if b.op == "placeholder":
        return b, True
    if b.op == "call_function" and (b.target is aten.t.default
                                    or (b.target is aten.permute.default and list(aten_ak._a(b)[1]) == [1, 0])):
        w = b.args[0]
        return (w if isinstance(w, fx.Node) and w.op == "placeholder" else None), False
    return None, False


def _linear_parts(node: fx.Node) -> tuple[Any, Any, Any, bool, str | None]:
    """(rows, weight, bias, weight stored [K, N], why not) of an ATen ``mm``/``addmm`` node."""
    if node.target is aten.mm.default:
        a, b, bias = node.args[0], node.args[1], None
    else:
        bias, a, b = node.args[0], node.args[1], node.args[2]
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return a, None, bias, False, "a scaled addmm"
    w, kn = _weight(b)
    why = _plain(_meta(a), "the input") or _plain(_meta(b), "the weight")
    if why is None and bias is not None:
        bt, bm = _meta(bias), _meta(b)
        # a bias of one element broadcast over N columns (torch allows it; N = 1 is the same either way):
        # only the static 1 is possible besides N, so no symbolic size is compared (no guard is added)
        broadcast = bt.dim() == 1 and type(bt.shape[0]) is int and bt.shape[0] == 1 and \
            not (bm is not None and bm.dim() == 2 and type(bm.shape[1]) is int and bm.shape[1] == 1)
        why = _plain(bt, "the bias") or ("a bias of more than one axis" if bt.dim() != 1 else
                                          "a bias of one element broadcast over the columns" if broadcast else None)
    if why is None and w is None:
        why = "the second operand is not a weight (an input of the graph)"
    return a, w, bias, kn, why


def _sdpa_args(node: fx.Node) -> dict[str, Any]:
    """An attention node's arguments by name, for either ATen form."""
    if node.target in _SDPA_TUPLE:
        return {"q": node.args[0], "k": node.args[1], "v": node.args[2], "dropout": _arg(node, 3, "dropout_p", 0.0),
                "causal": _arg(node, 4, "is_causal", False), "mask": node.kwargs.get("attn_mask"),
                "scale": node.kwargs.get("scale")}
    return {"q": node.args[0], "k": node.args[1], "v": node.args[2], "mask": _arg(node, 3, "attn_mask"),
            "dropout": _arg(node, 4, "dropout_p", 0.0), "causal": _arg(node, 5, "is_causal", False),
            "scale": _arg(node, 6, "scale"), "gqa": _arg(node, 7, "enable_gqa", False)}


def _sdpa_reason(node: fx.Node) -> str | None:
    a = _sdpa_args(node)
    q, k, v = _meta(a["q"]), _meta(a["k"]), _meta(a["v"])
    why = _plain(q, "q") or _plain(k, "k") or _plain(v, "v")
    if why:
        return why
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "not [B, H, S, D] tensors"
    if a["mask"] is not None:
        return "an attention mask"
    if a["dropout"] not in (0, 0.0):
        return "dropout"
    if node.target in _SDPA_TUPLE and any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users):
        return "its log-sum-exp is used"
    if node.target in _SDPA_TUPLE and not node.users:
        return "its result is not used"
    try:  # a head size is fixed in a model: reading it specialises the graph on it (a guard), never on lengths
        d, dv = int(q.shape[-1]), int(v.shape[-1])
    except (TypeError, ValueError):
        return "a head size without a value"
    if dv != d:
        return "value head size differs from the query's"
    scale = a["scale"]
    if isinstance(scale, fx.Node):
        return "a scale computed in the graph"
    if q.shape[1] != k.shape[1] and node.target in _SDPA_PLAIN and not a.get("gqa"):
        return "different head counts without enable_gqa"
    if q.shape[1] % k.shape[1]:
        return "query heads not a multiple of the key heads"
    return None


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
    return meta


def _arke_is_faster(target: Any, args: tuple[Any, ...], reals: dict[fx.Node, Any]) -> bool:
    """Time Arke's kernel and torch's operator on the node's example shape (the choice the calls of that shape
    then keep): a node whose torch operator is faster stays torch's, and Inductor compiles it."""
    real = tuple(_sample(a, reals) for a in args)
    if target is torch.ops.arke_fx.linear.default:
        key = fx_ops.linear_key(real[0], real[1].t() if real[4] else real[1], real[2])
    else:
        key = fx_ops.sdpa_key(real[0], real[1], real[3], real[4])
    target(*real)
    return fx_ops.decisions().get(key, "arke") == "arke"


def _reals(gm: fx.GraphModule, real_inputs: list[Any] | None) -> dict[fx.Node, Any]:
    """The graph's placeholders with the real example inputs (the weights themselves), where they line up."""
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if real_inputs is None or len(places) != len(real_inputs):
        return {}
    out = {}
    for p, r in zip(places, real_inputs):
        m = _meta(p)
        if isinstance(r, torch.Tensor) and isinstance(m, torch.Tensor) and m.dim() == r.dim():
            out[p] = r
    return out


def _like(graph: fx.Graph, out: fx.Node, want: Any, fake_mode: Any) -> fx.Node:
    """``out`` (contiguous) laid out in memory as ``want`` is (a later view may depend on its strides)."""
    perm = _layout(want) if isinstance(want, torch.Tensor) else None
    if perm is None or perm == list(range(len(perm))):
        return out
    moved = _call(graph, aten.permute.default, (out, perm), fake_mode)
    dense = _call(graph, aten.clone.default, (moved,), fake_mode, {"memory_format": torch.contiguous_format})
    graph_node = _call(graph, aten.permute.default, (dense, [perm.index(q) for q in range(len(perm))]), fake_mode)
    return graph_node


def rewrite(gm: fx.GraphModule, mode: str = "measured", real_inputs: list[Any] | None = None,
            fake_mode: Any = None, fuse: bool | str = True) -> Report:
    """Rewrite an ATen graph in place: matrix products with a weight become ``torch.ops.arke_fx.linear``,
    attention ``torch.ops.arke_fx.sdpa`` (``mode``: how each call chooses between Arke's kernel and torch's
    operator, :data:`arke.torch.fx_ops.MODES`; with ``real_inputs``, a measured node whose torch operator is
    faster at its example shape is left to Inductor), and with ``fuse`` the regions of elementwise
    operations and reductions become Arke kernels (:mod:`arke.torch.regions`; ``"all"``: the small ones too)."""
    fx_ops.define()
    report = Report(mode)
    reals = _reals(gm, real_inputs)
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in (aten.mm.default, aten.addmm.default):
            kind = "linear"
            a, w, bias, kn, why = _linear_parts(node)
            args: tuple[Any, ...] = (a, w, bias, mode, kn)
            target = torch.ops.arke_fx.linear.default
            replaced = node
        elif node.target in _SDPA:
            kind, why = "attention", _sdpa_reason(node)
            a = _sdpa_args(node)
            args = (a["q"], a["k"], a["v"], bool(a["causal"]), a["scale"], mode)
            target = torch.ops.arke_fx.sdpa.default
            replaced = next(iter(node.users)) if node.target in _SDPA_TUPLE and node.users else node
        else:
            continue
        if why is not None:
            report.left.append((f"{kind} `{node.name}`", why))
            continue
        if mode == "measured" and reals:
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            with torch.no_grad(), unset_fake_temporarily():  # real tensors, timed (inside Inductor's fake mode)
                faster = _arke_is_faster(target, args, reals)
            if not faster:
                report.slower.append(f"{kind} `{node.name}`")
                continue
        with graph.inserting_before(node):
            new = _like(graph, _call(graph, target, args, fake_mode), _meta(replaced), fake_mode)
        replaced.replace_all_uses_with(new)
        if replaced is not node:
            graph.erase_node(replaced)
        graph.erase_node(node)
        report.taken[kind] += 1
    graph.eliminate_dead_code()
    gm.recompile()
    if fuse:
        from arke.torch.regions import fuse as fuse_regions

        done = fuse_regions(gm, fake_mode, 1 if fuse == "all" else regions.MIN_ELEMENTS)
        report.fused = [n for _, n in done.regions]
        report.unfused, report.small, report.untranslated = done.left, done.small, done.untranslated
    rest = [n for n in graph.nodes if n.op == "call_function" and n.target is not operator.getitem
            and not str(n.target).startswith(("arke_fx.", "arke_gen."))]
    report.others = len(rest)
    report.foreign = sorted({str(n.target) for n in rest if n.target not in aten_ak.TABLE and _tensors(n)})
    return report


def arke_backend(gm: fx.GraphModule, example_inputs: list[Any], options: dict[str, Any] | None = None) -> Any:
    """The ``arke`` torch.compile backend: Inductor's ATen graph, rewritten (:func:`rewrite`), then compiled.

    Dynamo's graph goes through Inductor's own front end (``compile_fx``: functionalization and its
    decompositions to ATen), and its ATen graph is rewritten before Inductor lowers it.

    ``torch.compile(..., options={...})``: ``"arke.rest": "eager"`` runs the rest of the graph as ATen
    operations instead of compiling it with Inductor (quick to compile: tests of the rewrite);
    ``"arke.kernels"``: ``"measured"`` (default: per shape, the faster of Arke's kernel and torch's
    operator, see :mod:`arke.torch.fx_ops`), ``"arke"`` or ``"torch"``; ``"arke.fuse"``: ``True`` (default:
    the regions with at least :data:`arke.torch.regions.MIN_ELEMENTS` elements), ``"all"``, or ``False``
    (the elementwise operations and reductions stay Inductor's); every other key is an Inductor config patch.
    """
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    patches = dict(options or {})
    rest = patches.pop("arke.rest", "inductor")
    if rest not in ("inductor", "eager"):
        raise ValueError(f"options['arke.rest'] is 'inductor' (default) or 'eager', not {rest!r}")
    kernels = patches.pop("arke.kernels", "measured")
    if kernels not in fx_ops.MODES:
        raise ValueError(f"options['arke.kernels'] is 'measured' (default), 'arke' or 'torch', not {kernels!r}")
    fuse = patches.pop("arke.fuse", True)
    if fuse not in (True, False, "all"):
        raise ValueError(f"options['arke.fuse'] is True (default: regions large enough to be worth a call), "
                         f"'all' or False, not {fuse!r}")
    training = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                               for t in example_inputs)
    reals = list(example_inputs)

    def inner(aten_gm: fx.GraphModule, aten_inputs: list[Any], **kwargs: Any) -> Any:
        if kwargs.get("is_backward"):  # the forward graph's report said why: Inductor compiles the backward
            return compile_fx_inner(aten_gm, aten_inputs, **kwargs) if rest == "inductor" else _eager(aten_gm)
        if training:  # gradients are needed: Arke's operators have no derivatives
            report = Report(kernels, left=[("the graph", "gradients are needed (the backend compiles inference)")],
                            others=sum(1 for n in aten_gm.graph.nodes if n.op == "call_function"))
        else:
            from torch._guards import detect_fake_mode

            work = _copy(aten_gm)
            try:
                report = rewrite(work, kernels, reals, detect_fake_mode(aten_inputs), fuse)
            except Exception as err:  # a bug of the rewrite must not cost the user the model: torch runs it all
                LOG.exception("arke backend: the rewrite failed; the graph runs as torch's")
                report = Report(kernels, left=[("the graph", f"the rewrite failed ({type(err).__name__}: {err}); "
                                                             "please report it")])
            else:
                aten_gm = work
        _REPORTS.append(report)
        LOG.info("%s", report)
        if report.left or report.unfused:
            warnings.warn(ArkeFallbackWarning(str(report)), stacklevel=2)
        if rest == "eager":
            return _eager(aten_gm)
        return compile_fx_inner(aten_gm, aten_inputs, **kwargs)

    # AOTAutograd's cache would skip `inner` on a hit, and with it the definition of the operators the cached
    # code calls (they live in this process only): the ATen graph is rewritten every time
    with torch._functorch.config.patch(enable_autograd_cache=False):
        return compile_fx(gm, example_inputs, inner_compile=inner, config_patches=patches or None)


def _copy(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` to rewrite (its nodes' metadata shared, not copied)."""
    graph = fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    done = graph.output(out)
    done.meta.update(next(n for n in reversed(gm.graph.nodes) if n.op == "output").meta)
    return fx.GraphModule(gm, graph)


def _eager(gm: fx.GraphModule) -> Any:
    """The ATen graph run op by op (inner compilers take and return a list of arguments)."""
    def run(args: list[Any]) -> Any:
        out = gm(*args)
        args.clear()
        return out

    run._boxed_call = True  # type: ignore[attr-defined]
    return run
