"""Small target-independent helpers every renderer uses on a plan's expressions, dims and decisions.

* :func:`as_dtype` and :func:`loads_in`: a load read as another dtype, the loads of an expression;
* :func:`floor_fraction` and :func:`product`: dim arithmetic (a floor's numerator and
  denominator, the product of extents);
* :func:`decided`: the integer value of a strategy decision a plan carries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import sympy

from arke.ir import semantic as ir
from arke.ir.dtypes import DType
from arke.ir.shapes import Dim
from arke.plan.families import subexprs

if TYPE_CHECKING:
    from arke.plan.dispatch import KernelPlan


def as_dtype(load: ir.Load, dtype: DType) -> ir.SExpr:
    """``load`` as ``dtype``: itself when it already has it, else cast."""
    return load if load.dtype == dtype else ir.Cast(load, dtype)


def loads_in(e: ir.SExpr) -> list[ir.Load]:
    """Every load in ``e`` (parents first)."""
    return [x for x in subexprs(e) if isinstance(x, ir.Load)]


def floor_fraction(arg: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
    """Numerator and denominator of a floor's argument, both integer expressions."""
    num, den = sympy.fraction(arg)
    if den == 1:
        den = sympy.Integer(math.lcm(*(int(t.as_coeff_Mul()[0].q) for t in sympy.Add.make_args(arg))))
        num = sympy.expand(arg * den)
    if den == 1:
        num, den = sympy.fraction(sympy.together(arg))
    return num, den


def product(extents: Sequence[Dim]) -> Dim:
    """The product of ``extents`` (1 for none)."""
    out: Dim = sympy.Integer(1)
    for e in extents:
        out = out * e
    return out


def decided(plan: KernelPlan, kind: str, subject: str | None) -> int | None:
    """The integer value of the strategy's ``kind`` decision on ``subject``, if it made one."""
    d = plan.decision(kind, subject)
    return int(d.value) if d is not None and isinstance(d.value, int) else None


def attention_modes(plan: KernelPlan, key_index: str) -> list[str]:
    """The attention kernels a GPU renderer writes for a dispatch whose keys run along ``key_index``:
    the strategy's ``algorithm`` (``split_kv`` too when it splits the keys; ``materialized`` is written
    as ``flash``), else both ``flash`` and ``split_kv``, the call's dims choosing between them."""
    choice = plan.decision("algorithm")
    chunks = decided(plan, "split", key_index)
    algorithm = str(choice.value) if choice is not None else "split_kv" if chunks else "auto"
    return {"auto": ["flash", "split_kv"], "split_kv": ["split_kv"]}.get(algorithm, ["flash"])
