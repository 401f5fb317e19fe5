"""Regions of an ATen graph translated to ``.ak`` kernels: the ``arke`` backend's fusion.

The backend hands every ATen graph to :func:`fuse`. It walks the graph in order and grows *regions*
of the operators :mod:`arke.torch.aten_ak` translates (elementwise, reductions, softmax; layout
operators are inlined into the region that reads them). A node joins the region of one of its
operands when that cannot make a cycle: every other operand is computed before the region starts.

Each region becomes one ``.ak`` kernel — its outside tensors are the parameters, the values read
after it the outputs — which Arke checks, lowers to SemanticIR, plans and compiles like any other
(a norm's reduction and everything elementwise around it become one rows dispatch), registered as
``torch.ops.arke_gen.<name>`` (:func:`arke.torch.register`: exact fake shapes, symbolic sizes kept
symbolic). The region's nodes are replaced by that call. An output keeps the memory layout the
graph gave it (the kernel writes it in that order, and a permute gives it back its axes), since a
later view may depend on it. A region Arke cannot compile is left as it was, with the reason in the
backend's report.
"""

from __future__ import annotations

import hashlib
import math
import operator
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from arke.torch import aten_ak
from arke.torch.aten_ak import Untranslatable, Value

NAMESPACE = "arke_gen"
_BUILT: dict[str, Any] = {}  # kernel source -> the op (the same region in every layer builds once)
_LOCK = threading.Lock()
#: an expression longer than this is stored as an intermediate rather than inlined again
_INLINE_CHARS = 1500
#: a region whose largest value has fewer elements (at the graph's example sizes) is left to Inductor: a
#: call of an Arke kernel from Python costs some 20 µs here (100 µs right after a large matrix product),
#: more than such work itself; decode's single-token graphs are all of that kind
MIN_ELEMENTS = 1 << 15


@dataclass
class Fused:
    """What :func:`fuse` did with one graph."""

    regions: list[tuple[str, int]] = field(default_factory=list)  # (operator, nodes replaced)
    left: list[tuple[str, str]] = field(default_factory=list)  # (first node, reason) of regions not built
    untranslated: list[tuple[str, str]] = field(default_factory=list)  # (node, reason): its operands rule it out
    small: int = 0  # regions left to Inductor for their size (MIN_ELEMENTS)


class Region:
    """One region being grown: its nodes, parameters and the ``.ak`` statements of its kernel."""

    def __init__(self, pos: float):
        self.pos = pos  # where its call goes: after every node it reads (see _grow)
        self.nodes: list[fx.Node] = []
        self.values: dict[fx.Node, Value] = {}
        self.params: dict[fx.Node, tuple[str, str]] = {}  # outside node -> (name, its .ak type)
        self.statements: list[str] = []
        self.counter = 0

    # -- aten_ak.Context
    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def value(self, arg: Any) -> Value:
        if not isinstance(arg, fx.Node):
            raise Untranslatable(f"an operand {arg!r} that is not a tensor")
        found = self.values.get(arg)
        if found is not None:
            return found
        if aten_ak.is_layout(arg):
            return aten_ak.TABLE[arg.target](self, arg)  # inlined: the layout node stays for other readers
        return self.param(arg)

    def param(self, node: fx.Node) -> Value:
        t = aten_ak.meta(node)
        if not isinstance(t, torch.Tensor) or t.dtype not in aten_ak.AK_DTYPES or t.device.type != "cpu":
            raise Untranslatable(f"`{node.name}` is not a CPU tensor of a dtype regions read")
        if node not in self.params:
            dims = ", ".join(aten_ak.dim_text(s) for s in t.shape) or "1"
            # .ak has no f64: such a tensor is converted to f32 on its way in (everything it meets is f32)
            self.params[node] = (f"x{len(self.params)}", f"{aten_ak.AK_DTYPES[t.dtype]}[{dims}]")
        name = self.params[node][0]
        if t.dim() == 0:  # a 0-d tensor is passed as [1]
            return Value((), lambda idx: f"{name}[0]")
        return Value(tuple(aten_ak.dim_text(s) for s in t.shape), lambda idx: f"{name}[{', '.join(idx)}]")

    def define(self, shape: tuple[str, ...], body: Callable[[Sequence[str]], str], dtype: str = "f32") -> Value:
        name = self.fresh("t")
        idx = [self.fresh("i") for _ in shape]
        self.statements.append(f"  {name}[{', '.join(idx)}]: {dtype}[{', '.join(shape)}] = {body(idx)}")
        return Value(shape, lambda at: f"{name}[{', '.join(at)}]")

    # -- growing
    def add(self, node: fx.Node) -> None:
        """Translate ``node`` into the region (all or nothing: a node that fails leaves no trace)."""
        saved = (dict(self.values), dict(self.params), list(self.statements), self.counter)
        try:
            v = aten_ak.TABLE[node.target](self, node)
            if len(node.users) > 1 or len(v.at([f"i{k}" for k in range(len(v.shape))])) > _INLINE_CHARS:
                v = self.define(v.shape, v.at, aten_ak.value_dtype(node)) if v.shape else v
            self.values[node] = v
            self.nodes.append(node)
        except Exception as err:  # any failure of a definition only keeps this node out of the region
            self.values, self.params, self.statements, self.counter = saved
            if isinstance(err, Untranslatable):
                raise
            raise Untranslatable(f"{type(err).__name__}: {err}") from err


def _sources(node: fx.Node) -> list[fx.Node]:
    """The nodes a node reads, through the layout operators it would inline."""
    out: list[fx.Node] = []
    stack = list(node.all_input_nodes)
    while stack:
        n = stack.pop()
        if aten_ak.is_layout(n):
            stack.extend(n.all_input_nodes)
        elif n not in out:
            out.append(n)
    return out


def _grow(graph: fx.Graph, skipped: list[tuple[str, str]] | None = None) -> list[Region]:
    """The regions of ``graph``, each with the place its call will go (``pos``): after every node it reads.

    Positions are the nodes' places in the graph, a region's call counting at its ``pos``. A node joins a
    region when the region's call, moved after the node's other operands, still comes before every
    reader of the region's values outside it (so ``silu(gate) * up`` is one region although ``up`` is
    computed after ``silu``); a node with no such region starts one."""
    order = {n: float(i) for i, n in enumerate(graph.nodes)}
    region_of: dict[fx.Node, Region] = {}
    regions: list[Region] = []

    def eff(n: fx.Node) -> float:
        r = region_of.get(n)
        return r.pos if r is not None else order[n]

    for node in graph.nodes:
        if not aten_ak.translatable(node) or node.target in aten_ak.LAYOUT:
            continue
        sources = _sources(node)
        home = None
        # a producer's region, else the latest region (independent work in one kernel: one call fewer)
        candidates = sorted({region_of[s] for s in sources if s in region_of}, key=lambda r: -r.pos)
        if regions and regions[-1] not in candidates:
            candidates.append(regions[-1])
        for r in candidates:
            pos = max([r.pos, *(eff(s) + 1e-6 for s in sources if region_of.get(s) is not r)])
            if pos < _first_use([*r.nodes, node], eff):
                home = r
                break
        if home is not None:
            try:
                home.add(node)
            except Untranslatable:
                pass
            else:
                home.pos = pos
                region_of[node] = home
                continue
        fresh = Region(max([order[node] - 0.5, *(eff(s) + 1e-6 for s in sources)]))
        try:
            fresh.add(node)
        except Untranslatable as why:  # defined in .ak, but not with these operands: said in the report
            if skipped is not None:
                skipped.append((node.name, str(why)))
            continue
        region_of[node] = fresh
        regions.append(fresh)
    return sorted(regions, key=lambda r: r.pos)


def _first_use(nodes: list[fx.Node], eff: Callable[[fx.Node], float]) -> float:
    """The earliest position at which something outside ``nodes`` reads one of them (through layout nodes,
    which move with the region's call)."""
    inside, seen = set(nodes), set()
    best, stack = math.inf, list(nodes)
    while stack:
        for u in stack.pop().users:
            if u in inside or u in seen:
                continue
            seen.add(u)
            if aten_ak.is_layout(u):
                stack.append(u)
            else:
                best = min(best, eff(u))
    return best


def _read_outside(node: fx.Node, inside: set[fx.Node]) -> bool:
    """Whether ``node``'s value is read by anything but the region's own nodes (through layout nodes)."""
    for u in node.users:
        if u in inside:
            continue
        if aten_ak.is_layout(u):
            if _read_outside(u, inside):
                return True
            continue
        return True
    return False


def _layout(t: torch.Tensor) -> list[int] | None:
    """The axes of ``t`` from outermost to innermost in memory, if it is dense (None: it is not).

    Symbolic strides are compared as expressions and ordered by their hints: reading a SymInt's value
    would guard on it, and specialise the graph to one length."""
    from torch.fx.experimental.symbolic_shapes import optimization_hint

    sizes, strides = [aten_ak._sym(s) for s in t.shape], [aten_ak._sym(s) for s in t.stride()]
    perm = sorted(range(t.dim()), key=lambda k: (-optimization_hint(t.stride()[k], fallback=1), k))
    expect: Any = 1
    for k in reversed(perm):
        if sizes[k] != 1 and (strides[k] - expect).expand() != 0:
            return None
        expect = expect * sizes[k]
    return perm


def _symbols(region: Region) -> set[Any]:
    """The size symbols in the shapes the region's kernel text names: its nodes', its parameters', and those
    of the layout nodes it inlines."""
    found: set[Any] = set()
    seen: set[fx.Node] = set()
    inside = set(region.nodes)
    stack = list(region.nodes)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        t = n.meta.get("val")
        for size in t.shape if isinstance(t, torch.Tensor) else ():
            if isinstance(size, torch.SymInt):
                found |= size.node.expr.free_symbols
        if n in inside or aten_ak.is_layout(n):
            stack.extend(n.all_input_nodes)
    return found


def _sizes_of_one_or_more(region: Region, fake_mode: Any) -> None:
    """Untranslatable where a size of the region may be 0 as it runs (a data-dependent size from a boolean
    mask, ``nonzero`` or ``.item()``, or any size under ``backed_size_oblivious``): a kernel's dims are 1 or
    more, and torch's ops give an empty result, or a reduction's identity, there."""
    env = getattr(fake_mode, "shape_env", None)
    if env is None:
        return
    for sym in sorted(_symbols(region), key=str):
        found = env.var_to_range.get(sym)
        if found is not None and found.lower < 1:
            raise Untranslatable(f"size {sym} may be 0 as it runs, and a kernel's dims are 1 or more")


def _dim_sources(graph: fx.Graph, region: Region) -> list[tuple[str, fx.Node, int | None]]:
    """The sizes the kernel cannot read from its tensors' axes (a parameter ``[(S33 * S50), 128]`` whose
    result is ``[S33, S50, 128]``): each a dim parameter, named as in the text, with where the graph has its
    value (a size input of the graph, or an axis of an input tensor: (node, axis))."""
    given = set()
    for node in region.params:
        t = aten_ak.meta(node)
        given |= {s.node.expr for s in t.shape if isinstance(s, torch.SymInt) and s.node.expr.is_Symbol}
    missing = sorted(_symbols(region) - given, key=str)
    if not missing:
        return []
    found: dict[Any, tuple[Any, fx.Node, int | None]] = {}  # size -> (its SymInt, node, axis or None)
    places = [n for n in graph.nodes if n.op == "placeholder"]
    for ph in places:  # a size input of the graph first ...
        v = ph.meta.get("val")
        if isinstance(v, torch.SymInt):
            found.setdefault(v.node.expr, (v, ph, None))
    for ph in places:  # ... else the first input tensor's axis of that size
        v = ph.meta.get("val")
        for k, size in enumerate(v.shape if isinstance(v, torch.Tensor) else ()):
            if isinstance(size, torch.SymInt):
                found.setdefault(size.node.expr, (size, ph, k))
    out: list[tuple[str, fx.Node, int | None]] = []
    for sym in missing:
        if sym not in found:
            raise Untranslatable(f"size {sym} is no input of the graph nor an axis of one")
        size, node, axis = found[sym]
        out.append((aten_ak.dim_text(size), node, axis))
    return out


def _source(region: Region, outputs: list[fx.Node], name: str, dims: Sequence[str] = ()
            ) -> tuple[str, list[list[int]]]:
    """The region's kernel: parameters (``dims``: the dim parameters, last), statements, one named output per
    value read outside."""
    results, perms = [], []
    body = list(region.statements)
    for k, node in enumerate(outputs):
        v = region.values[node]
        t = aten_ak.meta(node)
        perm = _layout(t) if t.dim() else []
        if perm is None:
            raise Untranslatable(f"`{node.name}` has a strided layout")
        shape = [v.shape[p] for p in perm] or ["1"]
        idx = [f"o{k}_{q}" for q in range(len(perm))] or ["o0_"]
        results.append(f"y{k}: {aten_ak.value_dtype(node)}[{', '.join(shape)}]")
        src = [""] * len(perm)
        for q, p in enumerate(perm):
            src[p] = idx[q]
        body.append(f"  y{k}[{', '.join(idx)}] = {v.at(src)}")
        perms.append(perm)
    params = ", ".join([*(f"{n}: {ty}" for n, ty in region.params.values()), *(f"{d}: dim" for d in dims)])
    rets = results[0] if len(results) == 1 else "(" + ", ".join(results) + ")"
    return f"kernel {name}({params}) -> {rets} {{\n" + "\n".join(body) + "\n}\n", perms


def _built(source: str, name: str) -> Any:
    """The ``arke_gen`` operator of a region's kernel source (built and registered once per process)."""
    import arke
    from arke.torch.ops import register

    with _LOCK:
        op = _BUILT.get(source)
        if op is None:
            lib = arke.build(arke.loads(source, path=f"<graph region {name}>"))
            op = getattr(register(lib, NAMESPACE, [name]), name)
            _BUILT[source] = op
        return op


def _elements(node: fx.Node) -> int:
    """A node's element count at the graph's example sizes (no guard is added)."""
    from torch.fx.experimental.symbolic_shapes import optimization_hint

    count = 1
    for s in aten_ak.meta(node).shape:
        count *= optimization_hint(s, fallback=4096)
    return count


def fuse(gm: fx.GraphModule, fake_mode: Any, min_elements: int = MIN_ELEMENTS) -> Fused:
    """Replace each region of ``gm``'s graph by one Arke kernel (in place); what was done. A region whose
    values all have fewer than ``min_elements`` elements is left as it is (:data:`MIN_ELEMENTS`)."""
    graph = gm.graph
    done = Fused()
    renamed: dict[fx.Node, fx.Node] = {}  # a region's output -> what replaced it (a later region's parameter)
    for region in _grow(graph, done.untranslated):
        inside = set(region.nodes)
        outputs = [n for n in region.nodes if _read_outside(n, inside)]
        if not outputs:
            continue
        if max(_elements(n) for n in region.nodes) < min_elements:
            done.small += 1
            continue
        try:
            _sizes_of_one_or_more(region, fake_mode)
            dims = _dim_sources(graph, region)
            text, perms = _source(region, outputs, "r", [d for d, _, _ in dims])  # named by a digest of its
            # text: equal regions share it
            name = f"r{hashlib.sha1(text.encode()).hexdigest()[:12]}"
            source = text.replace("kernel r(", f"kernel {name}(", 1)
            op = _built(source, name)
        except Exception as err:  # a region Arke cannot check or compile stays as it was
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            done.left.append((region.nodes[0].name, reason[:300]))
            continue
        _replace(graph, region, outputs, perms, op, fake_mode, renamed, [(n, a) for _, n, a in dims])
        done.regions.append((name, len(region.nodes)))
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()
    return done


def _replace(graph: fx.Graph, region: Region, outputs: list[fx.Node], perms: list[list[int]], op: Any,
             fake_mode: Any, renamed: dict[fx.Node, fx.Node], dims: Sequence[tuple[fx.Node, int | None]] = ()
             ) -> None:
    aten = torch.ops.aten
    places = {n: i for i, n in enumerate(graph.nodes)}
    sources = [renamed.get(n, n) for n in region.params]
    last = max([n for n in graph.nodes if n.op == "placeholder"][-1:] + sources, key=lambda n: places[n])
    anchor = last.next  # new nodes go before it, in the order they are made
    with graph.inserting_before(anchor):
        args = []
        for node in region.params:
            node = renamed.get(node, node)
            if aten_ak.meta(node).dtype == torch.float64:
                node = _call(graph, torch.ops.prims.convert_element_type.default, (node, torch.float32), fake_mode)
            if aten_ak.meta(node).dim() == 0:
                node = _call(graph, aten.view.default, (node, [1]), fake_mode)
            args.append(node)
        for node, axis in dims:  # a size input of the graph, or an input tensor's axis
            args.append(node if axis is None else _call(graph, aten.sym_size.int, (node, axis), fake_mode))
        call = _call(graph, op.default, tuple(args), fake_mode)
        for k, (node, perm) in enumerate(zip(outputs, perms)):
            out = call if len(outputs) == 1 else _call(graph, operator.getitem, (call, k), fake_mode)
            t = aten_ak.meta(node)
            if t.dim() == 0:
                out = _call(graph, aten.view.default, (out, []), fake_mode)
            elif perm != list(range(len(perm))):
                inverse = [perm.index(q) for q in range(len(perm))]
                out = _call(graph, aten.permute.default, (out, inverse), fake_mode)
            node.replace_all_uses_with(out)
            renamed[node] = out
    _after(graph, call, anchor.prev)
    for node in reversed(region.nodes):
        if not node.users:
            graph.erase_node(node)


def _after(graph: fx.Graph, call: fx.Node, tail: fx.Node) -> None:
    """Move the layout nodes that read the call's results (directly or through each other) but stand before
    it to just after ``tail`` (the last node unpacking the results), in their order: _grow made sure that
    nothing else reads them that early."""
    places = {n: i for i, n in enumerate(graph.nodes)}
    here, end = places[call], places[tail]
    early: set[fx.Node] = set()
    stack = [call]
    while stack:
        for u in stack.pop().users:
            if places[u] < here and u not in early:
                early.add(u)
                stack.append(u)
            elif here < places[u] <= end:  # the getitems, views and permutes unpacking the results
                stack.append(u)
    for node in sorted(early, key=lambda n: places[n]):
        tail.append(node)
        tail = node


def _call(graph: fx.Graph, target: Any, args: tuple[Any, ...], fake_mode: Any,
          kwargs: dict[str, Any] | None = None) -> fx.Node:
    """A new node with its example value (what Inductor and later passes read)."""
    node = graph.call_function(target, args, kwargs or {})
    vals = tuple(a.meta.get("val") if isinstance(a, fx.Node) else a for a in args)
    if fake_mode is not None:
        with fake_mode:
            node.meta["val"] = target(*vals, **(kwargs or {}))
    return node
