"""The Triton target: a Python module of ``@triton.jit`` functions, one per dispatch.

Each dispatch becomes ``k<n>_d<k>(b<i>..., [ws], d<j>..., BLOCK...: tl.constexpr)``: one pointer
per plan buffer it touches (plan order), the error word ``ws`` when a subscript or an integer
division is checked, every plan dim as an integer, then its block sizes. Every identifier is
generated (:mod:`arke.targets.triton.expr` emits the expressions), so no ``.ak`` name reaches
the text. Forms:

* pointwise / layout / gather maps: the map's domain flattened, ``BLOCK`` lanes per program,
  a masked tail; gathers check their subscripts (a bad one reads element 0 and raises ``ws``);
* scans: one program per row, the scanned axis in blocks (:mod:`arke.targets.triton.scan`);
* reductions and generic contractions: ``BLOCK_O`` outputs per program, the reduce domain
  flattened and walked in ``BLOCK_R`` chunks (a fixed order), accumulated in f32 (i64 for
  integers), lanes folded by ``tl.reduce`` (NaN-propagating max/min);
* rows: one program per row; members run in order, per-row statistics kept in registers,
  internal maps recomputed where they are read, the row re-read for each member.

Strategy decisions: ``tile``/``vectorize`` on an axis set the block of the loop over it,
``warps`` sets ``num_warps`` and ``stages`` ``num_stages``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, ceil_div, dim_str
from arke.passes.rewrite import map_expr, op_exprs
from arke.plan.dispatch import Buffer, Dispatch, KernelPlan, PlanOp
from arke.plan.exprs import product
from arke.targets.artifact import Artifact, LaunchSpec, Renderer, UnsupportedError
from arke.targets.space import rounded_up
from arke.targets.triton.blocks import MAX_LINE, capped, two_wide
from arke.targets.triton.expr import COMPUTE, HELPERS, STORAGE, Emitter, Source, accumulator, fold, identity
from arke.targets.triton.trig import TRIG_HELPERS

BLOCK = 1024  # lanes of a map program
BLOCK_O, BLOCK_R = 16, 128  # outputs per reduction program, reduce chunk
ROW_BLOCK = 256  # lanes per step of a rows member (map)
ROW_BLOCK_R = 64  # reduce chunk of a rows member


def _term(op: ir.ReduceOp | ir.ContractOp) -> ir.SExpr:
    """A reduction's term in the op's dtype (a contraction's product of its two loads)."""
    if isinstance(op, ir.ContractOp):
        def cast(x: ir.SExpr) -> ir.SExpr:
            return x if x.dtype == op.dtype else ir.Cast(x, op.dtype)
        return ir.Binary("mul", cast(op.lhs), cast(op.rhs), op.dtype)
    return op.body if op.body.dtype == op.dtype else ir.Cast(op.body, op.dtype)


def _kind(op: ir.ReduceOp | ir.ContractOp) -> str:
    return op.kind if isinstance(op, ir.ReduceOp) else "sum"


class _Dispatch:
    """Emits one dispatch's ``@triton.jit`` function."""

    def __init__(self, plan: KernelPlan, dispatch: Dispatch, entry: str):
        self.plan, self.d, self.entry = plan, dispatch, entry
        self.src = Source(plan)
        self.constexprs: dict[str, int] = {}
        self.fixed: list[str] = []  # the options a strategy decision set
        self.grid: Dim = sympy.Integer(1)
        self.workspace: Dim = sympy.Integer(0)  # 8-byte words after the error word (wide internal values)

    # -- strategy
    def block_for(self, axes: Sequence[str], default: int, name: str) -> str:
        """The constexpr ``name`` set to the strategy's tile/vectorize of one of ``axes``, else to what
        the fit step chose (spec/codegen.md §9.5), else ``default``."""
        value: int | None = None
        for a in axes:
            for kind in ("tile", "vectorize"):
                dec = self.plan.decision(kind, a)
                if dec is not None and isinstance(dec.value, int):
                    value = capped(dec.value, MAX_LINE)
        if value is not None:
            self.fixed.append(name)
        self.constexprs[name] = rounded_up(value or self.plan.fitted_option(self.entry, name) or default, 1)
        return name

    def two_wide(self, outer: str, inner: str) -> None:
        """Blocks ``outer`` × ``inner`` of one tensor, within Triton's 2**20 elements (blocks.two_wide)."""
        self.constexprs[outer], self.constexprs[inner] = two_wide(self.constexprs[outer], self.constexprs[inner],
                                                                  inner in self.fixed)

    def launch_options(self) -> tuple[tuple[str, int], ...]:
        opts = list(self.constexprs.items())
        for kind, key, default in (("warps", "num_warps", 4), ("stages", "num_stages", 2)):
            dec = self.plan.decision(kind)
            if dec is not None and isinstance(dec.value, int):
                self.fixed.append(key)
                opts.append((key, int(dec.value)))
            else:
                opts.append((key, self.plan.fitted_option(self.entry, key) or default))
        return tuple(opts)

    # -- shared pieces
    def decompose(self, flat: str, axes: Sequence[ir.Axis], depth: int) -> dict[str, str]:
        """Axis positions of a row-major flat index over ``axes``."""
        out: dict[str, str] = {}
        rest = flat
        for k, a in enumerate(reversed(axes)):
            n = self.src.dim(a.extent)
            name = self.src.fresh()
            if k == len(axes) - 1:
                self.src.line(f"{name} = {rest}", depth)
            else:
                self.src.line(f"{name} = {rest} % {n}", depth)
                nxt = self.src.fresh()
                self.src.line(f"{nxt} = {rest} // {n}", depth)
                rest = nxt
            out[a.name] = name
        return out

    def emitter(self, shape: str, index: dict[str, str], mask: str | None, depth: int,
                op: PlanOp, env: _Env) -> Emitter:
        e = Emitter(self.src, shape, index, mask, depth, env.inline)
        e.registers = env.registers
        e.extent = {a.name: a.extent for a in op.axes}
        if isinstance(op, ir.ReduceOp | ir.ContractOp):
            e.extent.update({a.name: a.extent for a in op.reduce_axes})
        return e

    # -- forms
    def render(self) -> str:
        d = self.d
        if d.family == "rows":
            self.rows()
        elif isinstance(d.op, ir.ScanOp):
            from arke.targets.triton.scan import scan_program

            scan_program(self, d.op)
        elif isinstance(d.op, ir.MapOp):
            self.map_program(d.op)
        else:
            self.reduce_program(d.op)
        return self.text()

    def map_program(self, op: ir.MapOp) -> None:
        blk = self.block_for([a.name for a in op.axes[-1:]], BLOCK, "BLOCK")
        total = product([a.extent for a in op.axes])
        self.grid = ceil_div(total, self.constexprs[blk])
        n = self.src.dim(total)
        pid, offs, mask = self.src.fresh(), self.src.fresh(), self.src.fresh()
        self.src.line(f"{pid} = tl.program_id(0).to(tl.int64)", 1)
        self.src.line(f"{offs} = {pid} * {blk} + tl.arange(0, {blk}).to(tl.int64)", 1)
        self.src.line(f"{mask} = {offs} < {n}", 1)
        index = self.decompose(offs, op.axes, 1)
        e = self.emitter(f"[{blk}]", index, mask, 1, op, _Env())
        value = e.expr(op.body)
        e.store(self.src.buffer(op.result), [ir.Idx(a.name) for a in op.axes], value, op.dtype)

    def reduce_program(self, op: ir.ReduceOp | ir.ContractOp) -> None:
        bo = self.block_for([a.name for a in op.axes[-1:]], BLOCK_O, "BLOCK_O")
        br = self.block_for([a.name for a in op.reduce_axes[-1:]], BLOCK_R, "BLOCK_R")
        self.two_wide(bo, br)
        self.grid = ceil_div(product([a.extent for a in op.axes]), self.constexprs[bo])
        pid, o = self.src.fresh(), self.src.fresh()
        self.src.line(f"{pid} = tl.program_id(0).to(tl.int64)", 1)
        self.src.line(f"{o} = ({pid} * {bo} + tl.arange(0, {bo}).to(tl.int64))[:, None]", 1)
        self.reduction(op, o, bo, br, {}, 1, _Env(), None)

    def reduction(self, op: ir.ReduceOp | ir.ContractOp, o: str, bo: str, br: str, fixed: dict[str, str],
                  depth: int, env: _Env, keep: str | None) -> None:
        """Outputs ``o`` (a ``[bo, 1]`` flat index over the free axes) of a reduction, its reduce domain
        walked in ``br`` chunks. ``keep``: hold the ``[1]`` result in this register instead of storing."""
        free = [a for a in op.axes if a.name not in fixed]
        src = self.src
        omask = src.fresh()
        src.line(f"{omask} = {o} < {src.dim(product([a.extent for a in free]))}", depth)
        index = {**fixed, **self.decompose(o, free, depth)}
        kind, acc_ty = _kind(op), accumulator(op.dtype, _kind(op))
        ident = identity(kind, op.dtype)
        acc, rb = src.fresh(), src.fresh()
        src.line(f"{acc} = tl.full([{bo}, {br}], {ident}, {acc_ty})", depth)
        src.line(f"for {rb} in range(0, {src.dim(product([a.extent for a in op.reduce_axes]))}, {br}):", depth)
        r, mask = src.fresh(), src.fresh()
        src.line(f"{r} = {rb} + tl.arange(0, {br}).to(tl.int64)[None, :]", depth + 1)
        total_r = src.dim(product([a.extent for a in op.reduce_axes]))
        src.line(f"{mask} = ({omask}) & ({r} < {total_r})", depth + 1)
        rindex = {**index, **self.decompose(r, op.reduce_axes, depth + 1)}
        e = self.emitter(f"[{bo}, {br}]", rindex, mask, depth + 1, op, env)
        v = e.expr(_term(op))
        v = e.let(f"tl.where({mask}, {v}.to({acc_ty}), tl.full([{bo}, {br}], {ident}, {acc_ty}))")
        nxt = e.combine(kind, acc, v, op.dtype)
        src.line(f"{acc} = {nxt}", depth + 1)
        res = src.fresh()
        src.line(f"{res} = ({fold(kind, op.dtype, acc, 1)})[:, None]", depth)
        out = self.emitter(f"[{bo}, 1]", index, omask, depth, op, env)
        value = res
        if op.dtype.is_bool:
            value = out.let(f"{res} != 0")
        elif not op.dtype.is_float:
            value = out.let(f"{res}.to({COMPUTE[op.dtype]})")
        if keep is not None:
            rounded = value
            if op.dtype in (DType.F16, DType.BF16):
                rounded = out.rounded(value, op.dtype)
            src.line(f"{keep} = tl.reshape({rounded}, [1])", depth)
            return
        out.store(src.buffer(op.result), [ir.Idx(a.name) for a in op.axes], value, op.dtype)

    # -- rows
    def rows(self) -> None:
        group = self.d.pattern
        r = getattr(group, "rows", None)
        if not isinstance(r, int):
            raise UnsupportedError(f"{self.entry}: a rows dispatch needs its RowGroup pattern")
        members = self.d.members
        first = members[0]
        self.grid = product([a.extent for a in first.axes[:r]])
        pid = self.src.fresh()
        self.src.line(f"{pid} = tl.program_id(0).to(tl.int64)", 1)
        rows = [ir.Axis(f"row{k}", a.extent) for k, a in enumerate(first.axes[:r])]
        at = self.decompose(pid, rows, 1)
        row_vars = [at[a.name] for a in rows]
        internal = set(self.d.internal)
        env = _Env()
        blk = self.block_for([a.name for m in members for a in m.axes[r:]], ROW_BLOCK, "BLOCK")
        bo = self.block_for([], BLOCK_O, "BLOCK_O")
        br = self.block_for([a.name for m in members if not isinstance(m, ir.MapOp) for a in m.reduce_axes],
                            ROW_BLOCK_R, "BLOCK_R")
        self.two_wide(bo, br)
        for op in members:
            assert not isinstance(op, ir.ScanOp), "a scan is never a rows member (plan/rows.py)"
            fixed = {a.name: v for a, v in zip(op.axes[:r], row_vars)}
            free = op.axes[r:]
            if isinstance(op, ir.MapOp):
                if op.result in internal and free:
                    env.inline[op.result] = _inliner(op)
                elif op.result in internal:
                    reg = self.src.fresh()
                    e = self.emitter("[1]", fixed, None, 1, op, env)
                    v = e.expr(op.body)
                    if op.dtype in (DType.F16, DType.BF16):
                        v = e.rounded(v, op.dtype)
                    self.src.line(f"{reg} = {v}", 1)
                    env.registers[op.result] = reg
                else:
                    self.row_map(op, fixed, blk, env)
            elif op.result in internal and free:
                self.keep_in_workspace(op)
                self.row_reduction(op, fixed, bo, br, env)
            elif op.result in internal:
                reg = self.src.fresh()
                zero = self.src.fresh()
                self.src.line(f"{zero} = tl.full([1, 1], 0, tl.int64)", 1)
                self.reduction(op, zero, "1", br, fixed, 1, env, reg)
                env.registers[op.result] = reg
            else:
                self.row_reduction(op, fixed, bo, br, env)

    def row_map(self, op: ir.MapOp, fixed: dict[str, str], blk: str, env: _Env) -> None:
        """A member map over one row: its free axes walked in ``blk`` chunks."""
        src = self.src
        free = op.axes[len(fixed):]
        base, offs, mask = src.fresh(), src.fresh(), src.fresh()
        src.line(f"for {base} in range(0, {src.dim(product([a.extent for a in free]))}, {blk}):", 1)
        src.line(f"{offs} = {base} + tl.arange(0, {blk}).to(tl.int64)", 2)
        src.line(f"{mask} = {offs} < {src.dim(product([a.extent for a in free]))}", 2)
        index = {**fixed, **self.decompose(offs, free, 2)}
        e = self.emitter(f"[{blk}]", index, mask, 2, op, env)
        value = e.expr(op.body)
        e.store(src.buffer(op.result), [ir.Idx(a.name) for a in op.axes], value, op.dtype)

    def keep_in_workspace(self, op: PlanOp) -> None:
        """Give an internal value a region of the workspace (one 8-byte word per element, every row)."""
        ws = self.src.needs_err()
        start = self.src.dim(1 + self.workspace)
        ptr = self.src.fresh()
        self.src.header.append(f"    {ptr} = ({ws} + {start}).to(tl.pointer_type({STORAGE[op.dtype]}))")
        self.src.local[op.result] = (ptr, Buffer(op.result, op.dtype, op.type.shape, "temp"))
        self.workspace = self.workspace + product(op.type.shape)

    def row_reduction(self, op: ir.ReduceOp | ir.ContractOp, fixed: dict[str, str], bo: str, br: str,
                      env: _Env) -> None:
        """A member reduction stored to memory: its free outputs ``bo`` at a time, reduce axes in chunks."""
        src = self.src
        free = op.axes[len(fixed):]
        ob = src.fresh()
        src.line(f"for {ob} in range(0, {src.dim(product([a.extent for a in free]))}, {bo}):", 1)
        o = src.fresh()
        src.line(f"{o} = ({ob} + tl.arange(0, {bo}).to(tl.int64))[:, None]", 2)
        self.reduction(op, o, bo, br, fixed, 2, env, None)

    # -- text
    def text(self) -> str:
        params = [f"b{i}" for i in self.buffers()]
        if self.src.err is not None:
            params.append("ws")
        params += [f"d{j}" for j in range(len(self.plan.dims))]
        params += [f"{k}: tl.constexpr" for k in self.constexprs]
        body = self.src.header + self.src.lines
        return "\n".join(["@triton.jit", f"def {self.entry}({', '.join(params)}):", *body]) + "\n"

    def buffers(self) -> list[int]:
        names = set()
        for op in self.d.members:
            names.add(op.result)
            names |= {x.src for e in op_exprs(op) for x in ir.walk(e) if isinstance(x, ir.Load)}
        names -= set(self.d.internal)
        return sorted(self.plan.buffer_index(n) for n in names)

    def launch(self) -> LaunchSpec:
        scratch = dim_str(1 + self.workspace) if self.src.err is not None else None
        options = self.launch_options()
        return LaunchSpec(self.entry, None, tuple(self.buffers()), scratch,
                          (dim_str(self.grid),), options, fixed=tuple(dict.fromkeys(self.fixed)))


class _Env:
    """Values of a rows dispatch that never reach memory: registers (``[1]`` tensors) and inlined maps."""

    def __init__(self) -> None:
        self.registers: dict[str, str] = {}
        self.inline: dict[str, Callable[[Sequence[ir.SExpr]], ir.SExpr]] = {}


def _inliner(op: ir.MapOp) -> Callable[[Sequence[ir.SExpr]], ir.SExpr]:
    """A map's value at given subscripts: its body with its axes replaced (rounded to its dtype)."""
    def at(subs: Sequence[ir.SExpr]) -> ir.SExpr:
        names = {a.name: s for a, s in zip(op.axes, subs)}
        body = map_expr(op.body, lambda x: names.get(x.name, x) if isinstance(x, ir.Idx) else x)
        if op.dtype in (DType.F16, DType.BF16):
            body = ir.Cast(ir.Cast(body, DType.F32), op.dtype)
        return body
    return at


class TritonRenderer(Renderer):
    """Renders a kernel plan to a Triton module (see the module doc)."""

    name = "triton"
    capabilities = frozenset({"f32", "f16", "bf16", "i8", "i32", "i64", "u8", "u16", "u32", "bool"})
    families = frozenset({"rows", "contraction", "attention"})

    def render(self, plan: KernelPlan) -> Artifact:
        functions: list[str] = []
        launches: list[LaunchSpec] = []
        ordinal = 0
        for k, d in enumerate(plan.dispatches):
            entry = f"k{ordinal}_d{k}"
            # a fused contraction/attention dispatch (the plan grouped it: its family module renders
            # it, even where this renderer's ``families`` do not ask plans for it yet)
            special = _special(d.family) if d.pattern is not None else None
            if special is not None:
                text, made = special(plan, d, entry, Source)
                functions.append(text)
                launches.extend(made if isinstance(made, list) else [made])
                continue
            if d.family != "rows" and len(d.members) > 1:
                raise UnsupportedError(f"{plan.name}: the triton target cannot render a fused {d.family} "
                                       "dispatch yet")
            fn = _Dispatch(plan, d, entry)
            functions.append(fn.render())
            launches.append(fn.launch())
        helpers = [HELPERS.strip() + "\n"]
        if any(isinstance(d.op, ir.ScanOp) for d in plan.dispatches):
            from arke.targets.triton.scan import SCAN_HELPERS

            helpers.append(SCAN_HELPERS.strip() + "\n")
        if any("_ak_sin(" in f or "_ak_cos(" in f for f in functions):
            helpers.append(TRIG_HELPERS.strip() + "\n")  # sin and cos without local memory (trig.py)
        source = "\n\n".join(["import triton\nimport triton.language as tl\n", *helpers, *functions])
        return Artifact("triton", source, tuple(launches), {})


def _special(family: str) -> Callable[..., tuple[str, LaunchSpec]] | None:
    """The renderer of a fused family in its own module (contraction, attention), if it exists."""
    module = {"contraction": ("arke.targets.triton.gemm", "render_contraction"),
              "attention": ("arke.targets.triton.attention", "render_attention")}.get(family)
    if module is None or importlib.util.find_spec(module[0]) is None:
        return None
    found: Callable[..., tuple[str, LaunchSpec]] = getattr(importlib.import_module(module[0]), module[1])
    return found


RENDERER = TritonRenderer()
