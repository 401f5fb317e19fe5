"""Inlining: every kernel call replaced by the callee's body, so a kernel is one straight list of ops.

A :class:`~arke.ir.semantic.CallOp` ``%3, %4 = call @f(%x, %2) dims {M = N, N = M}`` becomes
the ops of ``@f`` (itself inlined first), with

* the callee's op results renamed to fresh caller values, numbered in order after the
  values already defined, so the caller stays densely numbered (``"0"``, ``"1"``, …) and
  every value is defined before it is used;
* the callee's parameters replaced by the call's arguments;
* the callee's dim symbols replaced by the call's dims, all at once (``xreplace``: a
  callee ``[M, N]`` called with ``{M = N, N = M}`` swaps them; sequential ``subs`` would
  chain M -> N -> M);
* the call's results replaced by the callee's results (a callee that returns one of its
  parameters gives the caller's argument back).

Axis names are local to an op, so they need no renaming. The callee's ``where`` clauses
need nothing either: the checker already added them to the caller as call guards (or
proved them). Op ``name`` attributes are kept. Meaning is unchanged: the interpreter runs
a call by running the callee on the same values and dims.
"""

from __future__ import annotations

from dataclasses import replace

from arke.ir import semantic as S
from arke.passes.rewrite import rename_values, substitute_dims


def inline_calls(module: S.Module, name: str) -> S.Function:
    """Kernel ``name`` of ``module`` with every call inlined, recursively (callees first); it calls nothing."""
    return _Inliner(module).function(name)


def inline_all(module: S.Module) -> S.Module:
    """``module`` with every kernel inlined: the same kernels, in the same order, none calling another."""
    inliner = _Inliner(module)
    return replace(module, functions=tuple(inliner.function(f.name) for f in module.functions))


class _Inliner:
    """Inlines the kernels of one module, each once (a callee called from several places is reused)."""

    def __init__(self, module: S.Module):
        self.module = module
        self.done: dict[str, S.Function] = {}
        self.active: list[str] = []  # the kernels being inlined now, to report a cycle rather than recurse forever

    def function(self, name: str) -> S.Function:
        if name in self.done:
            return self.done[name]
        if name in self.active:
            cycle = " -> ".join(f"@{n}" for n in [*self.active[self.active.index(name):], name])
            raise ValueError(f"cannot inline: calls form a cycle: {cycle}")
        if name not in {f.name for f in self.module.functions}:
            caller = f"@{self.active[-1]} calls " if self.active else ""
            raise ValueError(f"cannot inline: {caller}@{name}, which is not in the module")
        self.active.append(name)
        try:
            self.done[name] = self.inline(self.module.get(name))
        finally:
            self.active.pop()
        return self.done[name]

    def inline(self, fn: S.Function) -> S.Function:
        if not any(isinstance(op, S.CallOp) for op in fn.ops):
            return fn
        ops: list[S.MapOp | S.ReduceOp | S.ContractOp | S.ScanOp] = []  # no calls left: one result per op
        names: dict[str, str] = {}  # the caller's values (op results) -> their new names
        for op in fn.ops:
            if not isinstance(op, S.CallOp):
                names[op.result] = str(len(ops))  # before renaming, so the op gets its own new name
                ops.append(_plain(rename_values(op, names)))
                continue
            callee = self.function(op.callee)
            # The callee's values -> caller values: parameters to the (renamed) arguments, op
            # results to fresh names. Parameters are identifiers and op results decimal
            # strings, so the two never collide in one mapping.
            env = {p.name: names.get(a, a) for p, a in zip(callee.params, op.args)}
            dims = dict(op.dims)
            for cop in callee.ops:
                cop = _plain(cop)
                env[cop.result] = str(len(ops))
                new = _plain(substitute_dims(rename_values(cop, env), dims))
                if op.name and new.name is None and len(op.results) == 1 and callee.results[0] == cop.result:
                    new = replace(new, name=op.name)  # the call's name goes to the op that now defines its value
                ops.append(new)
            for r, cr in zip(op.results, callee.results):
                names[r] = env.get(cr, cr)
        return replace(fn, ops=tuple(ops), results=tuple(names.get(r, r) for r in fn.results))


def _plain(op: S.Op) -> S.MapOp | S.ReduceOp | S.ContractOp | S.ScanOp:
    """``op``, known not to be a call (an inlined callee calls nothing)."""
    if isinstance(op, S.CallOp):
        raise AssertionError(f"a call of @{op.callee} is left after inlining")
    return op
