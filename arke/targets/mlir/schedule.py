"""The strategy half of the MLIR target: a kernel's decisions as a transform-dialect script.

The MLIR renderer (:mod:`arke.targets.mlir.render`) writes each op of a kernel as one linalg op
tagged ``arke.value = "3"`` (its SSA value); this module says how to run those ops, in two forms:

* a **module attribute** entry, ``{parallel_dims = ["m"], parallelism = 4}``:
  ``parallel_dims`` is structural (:func:`parallel_dims`: the axes along which the whole
  kernel splits into independent pieces), ``parallelism`` advisory and present only when the
  strategy asks for a worker count;
* a **transform script** (a complete ``transform.with_named_sequence`` module whose
  ``@__transform_main`` applies the strategy to the payload), for
  ``iree-opt --transform-interpreter`` or any MLIR driver with the transform interpreter.

Each op is transformed in levels, outermost first, each level a tiling of the op the level
before produced (so decisions compose: a chunk of a worker is tiled, a tile vectorised):

=============  =======================================================================
``parallel``   ``tile_using_forall``: ``num_threads`` from ``parallel a = N`` or from
               ``threads = T`` (on the outermost such axis), else ``tile_sizes`` from
               ``tile a = X``, else 1. ``threads`` alone splits the first parallel dim.
``split``      ``tile_reduction_using_forall``: ``n`` chunks of the reduced loop, each a
               partial result, merged by one ``linalg.reduce`` in chunk order.
``tile``       ``tile_using_for`` (reduced loops too).
``vectorize``  ``tile_using_for`` with ``W`` along the axis and 1 along every other loop,
               then ``vectorize`` with those (static) sizes; masking covers dynamic dims,
               ``vectorize_nd_extract`` the loads at computed subscripts (gathers).
``unroll``     ``loop.unroll`` of the innermost ``scf.for`` along the axis (a level tiling
               it by 1 is added when nothing else made one).
=============  =======================================================================

A decision applies to the ops that have a loop named after its index (for grouped-query
attention, ``h`` is the outer loop of the pair ``h``/``h.r``) of the right kind (``parallel``
on parallel loops, ``split`` on reduced ones); other ops are left alone. What the script
cannot say is a :class:`Note` (reported as the warning AK4013), never silently dropped:
``algorithm = flash | split_kv``, ``pack``, ``warps``/``stages``, and an index decision that
no op's loop takes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from arke.ir import semantic as ir
from arke.ir import strategy as sir
from arke.lang.diagnostics import Diagnostic, make
from arke.lang.source import Span
from arke.passes.rewrite import op_exprs
from arke.plan.dispatch import KernelPlan

_ANY = "!transform.any_op"
#: the kinds a loop in :attr:`OpLoops.loops` can have (linalg's iterator types)
PARALLEL, REDUCTION = "parallel", "reduction"


@dataclass(frozen=True)
class OpLoops:
    """One linalg op of the payload: its ``arke.value`` tag and its loops, in the op's loop order."""

    value: str
    loops: tuple[tuple[str, str], ...]  # (loop name, "parallel" | "reduction")


@dataclass(frozen=True)
class Note:
    """A decision the target cannot express: ``decision`` its kind, ``subject`` its index or operand."""

    decision: str
    subject: str | None
    message: str


@dataclass(frozen=True)
class Schedule:
    """A kernel's strategy for the MLIR target.

    ``attribute``: the kernel's entry of the module attribute ``arke.schedule``;
    ``script``: a complete transform module applying the strategy; ``notes``: what it could
    not express; ``sequence``: the kernel's own ``transform.named_sequence`` (``script`` is
    this plus an ``@__transform_main`` calling it: :func:`transform_module` joins several).
    """

    attribute: str
    script: str
    notes: tuple[Note, ...]
    sequence: str = field(default="", repr=False)


# ---------------------------------------------------------------- structure


def parallel_dims(fn: ir.Function) -> tuple[str, ...]:
    """The kernel's independent axes: names every op has as a (not reduced) axis and every load
    of an op's result subscripts at that axis's position with exactly the same index, so a slice
    along them never reads another slice's intermediate values. In the first op's axis order."""
    ops = [op for op in fn.ops if not isinstance(op, ir.CallOp)]
    if not ops or len(ops) != len(fn.ops):
        return ()  # a call hides its loops: claim nothing
    axes = {op.result: [a.name for a in op.axes] for op in ops}

    def same_slice(op: ir.MapOp | ir.ReduceOp | ir.ContractOp | ir.ScanOp, name: str) -> bool:
        for e in op_exprs(op):
            for x in ir.walk(e):
                if isinstance(x, ir.Load) and x.src in axes:
                    sub = x.indices[axes[x.src].index(name)]
                    if not (isinstance(sub, ir.Idx) and sub.name == name):
                        return False
        return True

    first = axes[ops[0].result]
    return tuple(a for a in first
                 if all(a in axes[op.result] for op in ops) and all(same_slice(op, a) for op in ops))


# ---------------------------------------------------------------- the schedule


@dataclass
class _Decided:
    """The index decisions of a strategy, by kind then subject (in source order)."""

    parallel: dict[str, int | None] = field(default_factory=dict)
    tile: dict[str, int] = field(default_factory=dict)
    vectorize: dict[str, int] = field(default_factory=dict)
    unroll: dict[str, int] = field(default_factory=dict)
    split: dict[str, int] = field(default_factory=dict)
    threads: int | None = None
    default_axis: str | None = None  # `threads` without `parallel`: the axis it splits


def schedule(plan: KernelPlan, ops: Sequence[OpLoops]) -> Schedule:
    """The schedule of ``plan``'s strategy over the payload ops ``ops`` (as the renderer tagged them)."""
    dims = parallel_dims(plan.function)
    d = _Decided()
    notes: list[Note] = []
    for dec in plan.decisions:
        if dec.kind == "threads":
            d.threads = int(dec.value)  # type: ignore[arg-type]
        elif dec.kind == "parallel" and dec.subject is not None:
            d.parallel[dec.subject] = None if dec.value is None else int(dec.value)
        elif dec.kind in ("tile", "vectorize", "unroll", "split") and dec.subject is not None:
            getattr(d, dec.kind)[dec.subject] = int(dec.value)  # type: ignore[arg-type]
        else:
            note = _inexpressible(dec)
            if note is not None:
                notes.append(note)
    if d.threads is not None and not d.parallel and dims:
        d.default_axis = dims[0]
    notes += _unused(d, ops)

    from arke.targets.mlir.render import entry_name  # here: the renderer imports this module

    entry = entry_name(plan.name)
    name = f"arke_{entry}"
    s = _Script()
    # the kernel's function first: value tags (`"0"`) repeat across the kernels of one module
    s.emit(f'%fn = transform.structured.match ops{{["func.func"]}} attributes {{sym_name = "{entry}"}} '
           f"in %root : ({_ANY}) -> {_ANY}")
    for op in ops:
        _schedule_op(s, op, d)
    body = "\n".join("    " + line for line in s.lines)
    sequence = (f"  transform.named_sequence @{name}(%root: {_ANY} {{transform.readonly}}) {{\n"
                f"{body}\n    transform.yield\n  }}")
    attribute = "{parallel_dims = [" + ", ".join(f'"{a}"' for a in dims) + "]"
    workers = _parallelism(d)
    attribute += (f", parallelism = {workers}}}" if workers is not None else "}")
    return Schedule(attribute, transform_module([sequence]), tuple(notes), sequence)


def transform_module(sequences: Sequence[str]) -> str:
    """A transform module holding kernels' sequences (:attr:`Schedule.sequence`) and an
    ``@__transform_main`` that applies each in turn."""
    names = [s.split("@", 1)[1].split("(", 1)[0] for s in sequences]
    calls = "".join(f"    transform.include @{n} failures(propagate) (%root) : ({_ANY}) -> ()\n" for n in names)
    return ("module attributes {transform.with_named_sequence} {\n" + "".join(s + "\n" for s in sequences)
            + f"  transform.named_sequence @__transform_main(%root: {_ANY} {{transform.readonly}}) {{\n"
            + calls + "    transform.yield\n  }\n}\n")


def _parallelism(d: _Decided) -> int | None:
    """The advisory worker count: ``threads`` (it is one), else the product of the chunk counts."""
    if d.threads is not None:
        return d.threads
    counts = [v for v in d.parallel.values() if v is not None]
    if not counts:
        return None
    total = 1
    for v in counts:
        total *= v
    return total


def _inexpressible(dec: sir.Decision) -> Note | None:
    """The note for a whole-kernel or operand decision (None: nothing to do, as for `materialized`)."""
    if dec.kind == "algorithm":
        if dec.value == "materialized":
            return None  # linalg ops over whole tensors are the materialized algorithm
        return Note("algorithm", None, f"`algorithm = {dec.value}` has no upstream transform: the attention core "
                                       "stays materialized (scores and probabilities as whole tensors)")
    if dec.kind == "pack":
        return Note("pack", dec.subject, f"`pack {dec.subject}` is not expressed: no upstream transform packs "
                                         "one operand of the linalg op into panels")
    if dec.kind in ("warps", "stages"):
        return Note(dec.kind, None, f"`{dec.kind}` is a GPU decision: the MLIR target runs on CPU loops")
    return Note(dec.kind, dec.subject, f"`{dec.kind}` has no meaning on the MLIR target")


def _unused(d: _Decided, ops: Sequence[OpLoops]) -> list[Note]:
    """Notes for index decisions that no op's loop takes (so none is silently dropped)."""
    kinds: dict[str, set[str]] = {}
    for op in ops:
        for loop, kind in op.loops:
            kinds.setdefault(loop, set()).add(kind)
    out = []
    for kind, wanted in (("parallel", PARALLEL), ("split", REDUCTION), ("tile", None), ("vectorize", None),
                         ("unroll", None)):
        for subject in getattr(d, kind):
            have = kinds.get(subject, set())
            if not have or (wanted is not None and wanted not in have):
                what = "no loop" if not have else f"no {wanted} loop"
                out.append(Note(kind, subject, f"`{kind} {subject}`: the kernel has {what} over `{subject}` "
                                               "for the MLIR target to apply it to"))
    return out


class _Script:
    """The lines of a named sequence, with fresh handle names."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.count = 0

    def fresh(self, stem: str) -> str:
        self.count += 1
        return f"%{stem}{self.count}"

    def emit(self, line: str) -> None:
        self.lines.append(line)

    def tile_for(self, handle: str, sizes: list[int]) -> tuple[str, list[str | None]]:
        """``tile_using_for``: the tiled op and, per loop position, its new loop (None where untiled)."""
        tiled = self.fresh("tiled")
        loops: list[str | None] = [self.fresh("loop") if x else None for x in sizes]
        made = [h for h in loops if h is not None]
        types = ", ".join([_ANY] * (1 + len(made)))
        self.emit(f"{', '.join([tiled, *made])} = transform.structured.tile_using_for {handle} "
                  f"tile_sizes {sizes} : ({_ANY}) -> ({types})")
        return tiled, loops

    def tile_forall(self, handle: str, how: str, sizes: list[int]) -> str:
        """``tile_using_forall`` by ``num_threads`` or ``tile_sizes``: the tiled op."""
        tiled, forall = self.fresh("tiled"), self.fresh("forall")
        self.emit(f"{tiled}, {forall} = transform.structured.tile_using_forall {handle} {how} {sizes} "
                  f": ({_ANY}) -> ({_ANY}, {_ANY})")
        return tiled


def _in_order(names: list[str], chosen: dict[str, int | None]) -> Iterator[tuple[str, int | None]]:
    for n in names:
        if n in chosen:
            yield n, chosen[n]


def _schedule_op(s: _Script, op: OpLoops, d: _Decided) -> None:
    """The levels of one op (see the module docstring); nothing for an op no decision concerns."""
    names = [n for n, _ in op.loops]
    kind = dict(op.loops)
    parallel = {a: v for a, v in d.parallel.items() if kind.get(a) == PARALLEL}
    if not parallel and d.default_axis is not None and kind.get(d.default_axis) == PARALLEL:
        parallel = {d.default_axis: None}
    split = {a: v for a, v in d.split.items() if kind.get(a) == REDUCTION}
    vector = {a: v for a, v in d.vectorize.items() if a in kind}
    unroll = {a: v for a, v in d.unroll.items() if a in kind and v > 1}
    counts: dict[str, int] = {}
    chunks: dict[str, int] = {}
    threads = d.threads
    for a, v in _in_order(names, parallel):
        if v is not None:
            counts[a] = v
        elif threads is not None:
            counts[a], threads = threads, None  # the workers go to the outermost axis without a count
        else:
            chunks[a] = d.tile.get(a, 1)
    tile = {a: v for a, v in d.tile.items() if a in kind and a not in chunks}
    if not (counts or chunks or split or tile or vector or unroll):
        return
    handle = s.fresh("op")
    s.emit(f'{handle} = transform.structured.match attributes {{arke.value = "{op.value}"}} in %fn '
           f": ({_ANY}) -> {_ANY}")
    if counts:
        handle = s.tile_forall(handle, "num_threads", [counts.get(n, 0) for n in names])
    if chunks:
        handle = s.tile_forall(handle, "tile_sizes", [chunks.get(n, 0) for n in names])
    if split:
        fill, part, merge, forall = (s.fresh(x) for x in ("fill", "partial", "merge", "forall"))
        s.emit(f"{fill}, {part}, {merge}, {forall} = transform.structured.tile_reduction_using_forall {handle} "
               f"by num_threads = {[split.get(n, 0) for n in names]} : ({_ANY}) -> ({', '.join([_ANY] * 4)})")
        handle = part
    loops: list[tuple[str, str]] = []  # (axis, scf.for handle), outer to inner
    if tile:
        handle, made = s.tile_for(handle, [tile.get(n, 0) for n in names])
        loops += [(n, h) for n, h in zip(names, made) if h is not None]
    if unroll and not vector:
        need = [a for a in unroll if all(a != n for n, _ in loops)]
        if need:
            handle, made = s.tile_for(handle, [1 if n in need else 0 for n in names])
            loops += [(n, h) for n, h in zip(names, made) if h is not None]
    if vector:
        sizes = [vector.get(n, 1) for n in names]
        handle, made = s.tile_for(handle, sizes)
        loops += [(n, h) for n, h in zip(names, made) if h is not None]
        # without vectorize_nd_extract an op whose region reads with tensor.extract fails to vectorize
        s.emit(f"transform.structured.vectorize {handle} vector_sizes {sizes} vectorize_nd_extract : {_ANY}")
    # unroll inner loops first: unrolling an outer loop clones (and so invalidates) the inner ones
    innermost = {a: (k, h) for k, (a, h) in enumerate(loops)}
    for k, h in sorted((innermost[a] for a in unroll), reverse=True):
        s.emit(f"transform.loop.unroll {h} factor = {unroll[loops[k][0]]} : {_ANY}")


# ---------------------------------------------------------------- diagnostics


def note_diagnostics(notes: Sequence[Note], kernel: str, path: str, text: str) -> list[Diagnostic]:
    """The AK4013 warnings of ``notes``, each at its decision in the kernel's strategy for `mlir`
    (or for every target), else at the strategy block, else at the kernel's name."""
    from arke.lang.parser import parse

    tree, _ = parse(text, path)
    blocks = [b for b in tree.strategies if b.kernel == kernel and b.target in ("mlir", None)]
    fallback = next((b.kernel_span for b in blocks), None) or next(
        (k.name_span for k in tree.kernels if k.name == kernel), Span(path, 1, 1, 1, 1, 0, 0))
    out = []
    for note in notes:
        span = fallback
        for b in blocks:
            found = next((d for d in b.decisions if d.name == note.decision
                          and (note.subject is None or any(i.name == note.subject for i in d.items))), None)
            if found is not None:
                item = next((i for i in found.items if i.name == note.subject), None)
                span = item.span if item is not None else found.span
                break
        out.append(make("AK4013", note.message, span,
                        hint="the MLIR target runs the kernel without it; results are the same"))
    return out
