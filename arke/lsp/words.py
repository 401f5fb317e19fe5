"""The language's own words, explained for hover and completion.

The *lists* come from the implementation (built-ins and reductions from
:mod:`arke.lang.exprs`, dtypes from :mod:`arke.ir.dtypes`, decisions from :mod:`arke.ir.strategy`,
targets and where each decision has an effect from the registry in :mod:`arke.targets.base`); only
the one-line explanations are written here, taken from ``spec/language.md``. A test checks that every built-in has one.
"""

from __future__ import annotations

from arke.ir.dtypes import DTYPES
from arke.ir.strategy import DECISIONS, DecisionSpec
from arke.lang.exprs import BUILTINS, MATH_BINARY, MATH_UNARY, REDUCTIONS
from arke.targets import base as targets

#: Keywords (reserved everywhere, spec §2).
KEYWORDS = ("kernel", "let", "return", "if", "else", "for", "and", "or", "not", "in", "import", "from", "where",
            "when")

_MATH: dict[str, str] = {
    "exp": "e to the power x", "log": "natural logarithm", "sqrt": "square root", "rsqrt": "1 / sqrt(x)",
    "tanh": "hyperbolic tangent", "erf": "the error function", "sigmoid": "1 / (1 + exp(-x))",
    "silu": "x · sigmoid(x)", "gelu": "x · Φ(x), the exact (erf) form", "sin": "sine", "cos": "cosine",
    "exp2": "2 to the power x", "log2": "base-2 logarithm", "floor": "round toward −∞",
    "ceil": "round toward +∞", "abs": "absolute value", "relu": "max(x, 0)",
    "max": "the larger of a and b, elementwise (NaN propagates)", "min": "the smaller of a and b, elementwise",
    "pow": "a to the power b, elementwise",
}


def builtin_signature(name: str) -> str:
    """How a built-in is called: ``exp(x)``, ``max(a, b)``, ``f32(x)``, ``transpose(x[, a, b])``."""
    if name in MATH_BINARY:
        return f"{name}(a, b)"
    if name == "transpose":
        return "transpose(x) · transpose(x, a, b)"
    return f"{name}(x)"


def builtin_doc(name: str) -> str:
    """What a built-in function computes and the dtype it gives (spec §8.4, §8.6)."""
    if name in DTYPES:
        return (f"cast to `{name}`: float → integer truncates toward zero, anything → `bool` is `x != 0`, "
                "`bool` → number is 0 or 1; elementwise on whole tensors")
    if name == "transpose":
        return ("swap the last two axes of a whole tensor of rank ≥ 2; `transpose(x, a, b)` swaps axes "
                "`a` and `b` (integer literals)")
    what = _MATH.get(name, name)
    if name in MATH_BINARY:
        return f"{what}; the common type of a and b" + ("; `max(e for i)` is the reduction" if name != "pow" else "")
    floats = MATH_UNARY[name][1]
    dtype = "a float (integers become `f32`)" if floats else "the argument's dtype"
    return f"{what}; gives {dtype}; elementwise on whole tensors"


def reduction_doc(name: str) -> str:
    """What ``name(e for i, ...)`` computes (spec §8.3)."""
    if name in ("argmax", "argmin"):
        which = "largest" if name == "argmax" else "smallest"
        return (f"the first position of `e`'s {which} value over the listed indices (exactly one; a NaN beats "
                "every number: the first NaN wins), as torch's `" + name + "`; gives `i64`")
    if name in ("topk", "bottomk", "argtopk", "argbottomk"):
        which = "largest" if "top" in name else "smallest"
        what = "position along `n` (`i64`)" if name.startswith("arg") else "value (`e`'s dtype)"
        return (f"`{name}(e for n, j)`: the `j`-th {which} {what} of `e` over the listed indices (`n`, then "
                "the rank `j`), sorted as torch.topk (NaN largest; ties by lower position); `j` is bound around "
                "it and runs over the values kept")
    what = {"sum": "the sum", "max": "the maximum", "min": "the minimum", "mean": "the mean",
            "prod": "the product"}[name]
    extra = {"mean": "; `f32` for integers and booleans", "sum": "; `i64` for booleans",
             "prod": "; `i64` for booleans"}.get(name, "")
    return f"{what} of `e` over the listed indices (in a fixed order); the dtype is `e`'s{extra}"


def dtype_doc(name: str) -> str:
    """One line on a dtype."""
    return {"bool": "boolean", "i8": "8-bit signed integer", "i32": "32-bit signed integer",
            "i64": "64-bit signed integer (the type of indices and dims)", "u8": "8-bit unsigned integer",
            "u16": "16-bit unsigned integer", "u32": "32-bit unsigned integer",
            "f16": "IEEE half precision float (computes in f32, rounds when stored)",
            "bf16": "bfloat16 (computes in f32, rounds when stored)", "f32": "IEEE single precision float"}[name]


def target_doc(name: str) -> str:
    """One line on a strategy target."""
    return targets.get(name).description if name in targets.names() else name


def decision_values(spec: DecisionSpec, target: str | None = None) -> str:
    """The legal values of a decision in words (for ``target``, where it restricts them)."""
    if spec.values == "enum":
        choices = targets.narrowed_choices(spec.name, target) or spec.choices
        return "one of " + ", ".join(f"`{c}`" for c in choices)
    if spec.values == "none":
        return "no value"
    words = {"pos": "an integer ≥ 1", "pow2": "a power of two", "split": "an integer ≥ 2"}[spec.values]
    if spec.maximum is not None:
        words += f" up to {spec.maximum}"
    if not spec.value_required:
        words = "optionally " + words
    return words


def decision_subject(spec: DecisionSpec) -> str:
    return {"index": "indices of the kernel", "operand": "tensor parameters",
            "none": "the whole kernel"}[spec.subject]


def decision_targets(spec: DecisionSpec) -> str:
    honouring = targets.honouring(spec.name)
    if honouring == targets.names():
        return "every target"
    return ", ".join(f"`{t}`" for t in honouring)


def decision_doc(name: str, target: str | None = None) -> str:
    """Markdown: what a decision means, what it applies to, its values and targets."""
    spec = DECISIONS[name]
    example = {"index": f"{name} i = 64", "operand": f"{name} w", "none": f"{name} = 4"}[spec.subject]
    if spec.values == "enum":
        example = f"{name} = {spec.choices[0]}"
    elif spec.subject == "index" and not spec.value_required:
        example = f"{name} i"
    return (f"```ak\n{example}\n```\n**{name}**: {spec.meaning}.\n\n"
            f"- applies to: {decision_subject(spec)}\n- value: {decision_values(spec, target)}\n"
            f"- has an effect on: {decision_targets(spec)}")


def decisions_for(target: str | None) -> list[str]:
    """The decisions that have an effect on ``target`` (all of them when the strategy has no target)."""
    return [n for n in DECISIONS if target is None or target in targets.honouring(n)]


__all__ = [
    "BUILTINS", "KEYWORDS", "REDUCTIONS", "builtin_doc", "builtin_signature", "decision_doc", "decision_values",
    "decisions_for", "dtype_doc", "reduction_doc", "target_doc",
]
