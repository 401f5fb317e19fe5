"""The MLIR target: a kernel as one ``func.func`` of linalg ops on tensors (upstream dialects, and
IREE's ``iree_linalg_ext.scan`` for scans: :mod:`arke.targets.mlir.scan`).

Every op of the kernel (after inlining and fusion, :mod:`arke.passes`) becomes one linalg op
(:mod:`arke.targets.mlir.lowering`): ``linalg.matmul``/``batch_matmul`` for plain f32 products,
``linalg.transpose`` for permutations, ``linalg.generic`` with indexing maps otherwise, whose
region is the op's scalar body in ``arith``/``math`` (:mod:`arke.targets.mlir.body`). Attention
is its math: contractions and reductions, grouped-query heads read by indexing maps. MLIR has
no dispatch boundaries to choose, so plans for this target group no families: IREE (or any
MLIR pipeline) fuses.

Dims are dynamic (``?``) and read with ``tensor.dim`` from the parameter they are bound to;
a literal dim, or one a strategy's ``when`` fixes (``when D == 64``), is static. The ABI:
parameters in order, tensors in their storage type (16-bit floats as ``i16`` bits, bools as
``i8``), scalars as 0-d tensors; results in order, then, when some subscript or integer
divisor is checked, a ``tensor<i8>`` that is 1 if one was out of range (the runtime then has
the reference interpreter say exactly what). The strategy becomes a transform-dialect script
and the module's ``arke.schedule`` attribute (:mod:`arke.targets.mlir.schedule`).
"""

from __future__ import annotations

import json
import re

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim, sym
from arke.plan.dispatch import KernelPlan
from arke.targets.artifact import Artifact, LaunchSpec, Renderer, UnsupportedError
from arke.targets.mlir.body import STORAGE
from arke.targets.mlir.lowering import Lowering
from arke.targets.mlir.ops import SPLIT_SUFFIX, Tensor
from arke.targets.mlir.scan import lower_scan


def abi_dtype(dtype: DType) -> str:
    """The element type a tensor of ``dtype`` crosses the function boundary in (MLIR spelling)."""
    return STORAGE[dtype]


def entry_name(kernel: str) -> str:
    """The ``func.func`` symbol of a kernel (letters, digits and ``_``)."""
    return re.sub(r"\W", "_", kernel)


def fixed_dims(cond: ir.Cond | None) -> dict[str, int]:
    """Dims a ``when`` condition pins to one value (``D == 64``, ``D in {64}``, parts of an ``and``)."""
    out: dict[str, int] = {}
    if cond is None:
        return out
    if isinstance(cond, ir.BoolOp) and cond.op == "and":
        for part in cond.parts:
            out.update(fixed_dims(part))
    elif isinstance(cond, ir.Rel) and cond.op == "==":
        lhs, rhs = sympy.sympify(cond.lhs), sympy.sympify(cond.rhs)
        if lhs.is_Symbol and rhs.is_Integer:
            out[str(lhs)] = int(rhs)
        elif rhs.is_Symbol and lhs.is_Integer:
            out[str(rhs)] = int(lhs)
    elif isinstance(cond, ir.InSet) and len(cond.values) == 1:
        x, v = sympy.sympify(cond.x), sympy.sympify(cond.values[0])
        if x.is_Symbol and v.is_Integer:
            out[str(x)] = int(v)
    return out


class _Function:
    """Builds the ``func.func`` of one plan (the :class:`~arke.targets.mlir.ops.FuncContext`)."""

    def __init__(self, plan: KernelPlan):
        self.plan = plan
        self.fn = plan.function
        self.fixed = {sym(k): sympy.Integer(v) for k, v in fixed_dims(plan.when).items()}
        self.lines: list[str] = []
        self._n = 0
        self.tensors: dict[str, Tensor] = {}
        self.scalars: dict[str, str] = {}
        self._index: dict[sympy.Expr, str] = {}
        self._i64: dict[sympy.Expr, str] = {}
        self._same: dict[tuple[sympy.Expr, sympy.Expr], bool] = {}
        self.args: list[str] = []

    # ------------------------------------------------------------ FuncContext

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)

    def fresh(self, hint: str = "t") -> str:
        self._n += 1
        return f"%{hint}{self._n}"

    def _sub(self, d: Dim) -> sympy.Expr:
        return sympy.sympify(d).xreplace(self.fixed) if self.fixed else sympy.sympify(d)

    def same(self, a: Dim, b: Dim) -> bool:
        key = (sympy.sympify(a), sympy.sympify(b))
        if key not in self._same:
            self._same[key] = bool(sympy.simplify(self._sub(a) - self._sub(b)) == 0)
        return self._same[key]

    def divisible(self, whole: Dim, part: Dim) -> bool:
        w, p = self._sub(whole), self._sub(part)
        if w.is_Integer and p.is_Integer:
            return int(w) % int(p) == 0
        target = sympy.Mod(w, p)
        for g in self.fn.guards:
            c = g.cond
            if isinstance(c, ir.Rel) and c.op == "==" and sympy.sympify(c.rhs) == 0 \
                    and sympy.simplify(self._sub(c.lhs) - target) == 0:
                return True
        return False

    def static(self, d: Dim) -> int | None:
        v = self._sub(d)
        return int(v) if v.is_Integer else None

    def tensor_type(self, shape: tuple[Dim, ...], elem: str) -> str:
        dims = ["?" if (s := self.static(d)) is None else str(s) for d in shape]
        return f"tensor<{'x'.join([*dims, elem])}>"

    def empty(self, shape: tuple[Dim, ...], elem: str) -> str:
        dyn = [self.dim_index(d) for d in shape if self.static(d) is None]
        v = self.fresh("e")
        self.emit(f"{v} = tensor.empty({', '.join(dyn)}) : {self.tensor_type(shape, elem)}")
        return v

    def tensor(self, name: str) -> Tensor:
        return self.tensors[name]

    def scalar(self, name: str) -> str | None:
        return self.scalars.get(name)

    def dim_i64(self, d: Dim) -> str:
        key = self._sub(d)
        if key not in self._i64:
            v = self.fresh("d")
            self.emit(f"{v} = arith.index_cast {self.dim_index(key)} : index to i64")
            self._i64[key] = v
        return self._i64[key]

    def dim_index(self, d: Dim) -> str:
        e = self._sub(d)
        if e not in self._index:
            self._index[e] = self._dim(e)
        return self._index[e]

    def _dim(self, e: sympy.Expr) -> str:
        """An ``index`` value of a dim expression (symbols read from their parameter's shape)."""
        if e.is_Integer:
            return self._let(f"arith.constant {int(e)} : index")
        if e.is_Symbol:
            for b in self.fn.bindings:
                if b.dim == str(e) and b.axis < 0:  # a dim parameter: the scalar argument's value
                    return self._let(f"arith.index_cast {self.scalars[b.param]} : i64 to index")
                if b.dim == str(e):
                    t = self.tensors[b.param]
                    k = self._let(f"arith.constant {b.axis} : index")
                    return self._let(f"tensor.dim {t.ssa}, {k} : {self.tensor_type(t.shape, STORAGE[t.dtype])}")
            raise UnsupportedError(f"mlir: dim `{e}` is bound to no parameter")
        if isinstance(e, sympy.Add):
            terms = sorted(e.args, key=lambda t: bool(t.as_coeff_Mul()[0] < 0))  # a positive term first (a sympy
            # relation is no sort key: Python must compare plain bools)
            out = self.dim_index(terms[0])
            for t in terms[1:]:
                if t.as_coeff_Mul()[0] < 0:
                    out = self._let(f"arith.subi {out}, {self.dim_index(-t)} : index")
                else:
                    out = self._let(f"arith.addi {out}, {self.dim_index(t)} : index")
            return out
        if isinstance(e, sympy.Mul):
            factors = list(e.args)
            out = self.dim_index(factors[0])
            for f in factors[1:]:
                out = self._let(f"arith.muli {out}, {self.dim_index(f)} : index")
            return out
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            base = self.dim_index(e.base)
            out = base
            for _ in range(int(e.exp) - 1):
                out = self._let(f"arith.muli {out}, {base} : index")
            return out
        if isinstance(e, sympy.floor):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            return self._let(f"arith.floordivsi {self.dim_index(num)}, {self.dim_index(den)} : index")
        if isinstance(e, sympy.Mod):
            num, den = self.dim_index(e.args[0]), self.dim_index(e.args[1])
            q = self._let(f"arith.floordivsi {num}, {den} : index")
            m = self._let(f"arith.muli {q}, {den} : index")
            return self._let(f"arith.subi {num}, {m} : index")
        raise UnsupportedError(f"mlir: cannot compute the dim `{e}`")

    def _let(self, rhs: str) -> str:
        v = self.fresh("i")
        self.emit(f"{v} = {rhs}")
        return v

    # ------------------------------------------------------------ the function

    def build(self) -> tuple[str, list[tuple[str, tuple[tuple[str, str], ...]]], bool]:
        """The function text, each linalg op's (tag, loops), and whether it returns an error flag."""
        fn = self.fn
        for k, p in enumerate(fn.params):
            a = f"%a{k}"
            self.args.append(f"{a}: {self.tensor_type(p.type.shape, STORAGE[p.type.dtype])}")
            self.tensors[p.name] = Tensor(a, p.type.dtype, p.type.shape)
            if p.type.rank == 0:
                v = self.fresh("s")
                self.emit(f"{v} = tensor.extract {a}[] : tensor<{STORAGE[p.type.dtype]}>")
                self.scalars[p.name] = v
        ops: list[tuple[str, tuple[tuple[str, str], ...]]] = []
        checks: list[str] = []
        for d in self.plan.dispatches:
            for op in d.members:
                assert not isinstance(op, ir.CallOp)
                if isinstance(op, ir.ScanOp):
                    scan = lower_scan(self, op, fn.guards, op.result)
                    self.tensors[op.result] = Tensor(scan.result, op.dtype, op.type.shape)
                    ops.append((op.result, tuple((lp.name, lp.kind) for lp in scan.loops)))
                    checks += scan.checks
                    continue
                low = Lowering(self, op, fn.guards).lower(op.result)
                self.tensors[op.result] = Tensor(low.result, op.dtype, op.type.shape)
                if not op.axes:
                    v = self.fresh("s")
                    self.emit(f"{v} = tensor.extract {low.result}[] : tensor<{STORAGE[op.dtype]}>")
                    self.scalars[op.result] = v
                ops.append((op.result, tuple((lp.name, lp.kind) for lp in low.loops)))
                if low.check is not None:
                    checks.append(low.check)
        results = [self.tensors[r] for r in fn.results]
        values = [t.ssa for t in results]
        types = [self.tensor_type(t.shape, STORAGE[t.dtype]) for t in results]
        if checks:
            flags = []
            for c in checks:
                v = self.fresh("k")
                self.emit(f"{v} = tensor.extract {c}[] : tensor<i8>")
                flags.append(v)
            acc = flags[0]
            for f in flags[1:]:
                acc = self._let(f"arith.ori {acc}, {f} : i8")
            err = self.fresh("err")
            self.emit(f"{err} = tensor.from_elements {acc} : tensor<i8>")
            values.append(err)
            types.append("tensor<i8>")
        head = f"  func.func @{entry_name(self.plan.name)}({', '.join(self.args)}) -> ({', '.join(types)}) {{"
        ret = f"    return {', '.join(values)} : {', '.join(types)}"
        return "\n".join([head, *self.lines, ret, "  }"]), ops, bool(checks)


class MLIRRenderer(Renderer):
    """Renders a plan as an MLIR module (linalg on tensors) with its strategy as a transform script."""

    name = "mlir"
    capabilities = frozenset({"bf16", "f16", "dynamic-shapes"})
    families: frozenset[str] = frozenset()

    def render(self, plan: KernelPlan) -> Artifact:
        from arke.targets.mlir.schedule import OpLoops, schedule

        func, ops, errors = _Function(plan).build()
        sched = schedule(plan, [OpLoops(tag, loops) for tag, loops in ops])
        name = json.dumps(plan.name)
        source = "\n".join([f"module attributes {{arke.schedule = {{{name} = {sched.attribute}}}}} {{", func, "}", ""])
        entry = entry_name(plan.name)
        notes = [{"decision": n.decision, "subject": n.subject, "message": n.message} for n in sched.notes]
        return Artifact("mlir", source, (LaunchSpec(entry, None),),
                        {"entry": entry, "errors": "1" if errors else "0", "transform": sched.script,
                         "notes": json.dumps(notes)})


RENDERER = MLIRRenderer()

__all__ = ["RENDERER", "SPLIT_SUFFIX", "MLIRRenderer", "abi_dtype", "entry_name", "fixed_dims"]
