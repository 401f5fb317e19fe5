"""Hover text: what the name under the cursor is, in the language's own notation.

* a tensor, parameter or output: its type and symbolic shape, ``s: f32[B, H, S, T]``;
* an index: its range, ``j: 0 ≤ j < T``, and how it is bound (``reduced by `sum```);
* a dim: which parameter axis gives its value; a ``let``: its dtype, or its value as a dim;
* a kernel: its signature and ``where`` clauses, the comment above it, and its module;
* a decision: its meaning, subject, values and targets (``arke.ir.strategy.DECISIONS``);
* built-ins, reductions, dtypes, targets and modules: a line each.
"""

from __future__ import annotations

from arke.ir import semantic as ir
from arke.ir.dtypes import DTYPES
from arke.ir.shapes import Dim, dim_str
from arke.lang import ast
from arke.lang.checker import stdlib_path
from arke.lang.signatures import Signature
from arke.lsp.index import DocumentIndex, Symbol
from arke.lsp.words import (
    builtin_doc,
    builtin_signature,
    decision_doc,
    dtype_doc,
    reduction_doc,
    target_doc,
)


def type_text(t: ir.TensorType) -> str:
    """``f32[M, N]`` (``f32`` for a scalar)."""
    return str(t.dtype) + (f"[{', '.join(dim_str(d) for d in t.shape)}]" if t.shape else "")


def _code(text: str) -> str:
    return f"```ak\n{text}\n```"


def _text(sig: Signature, node: ast.Expr | ast.TypeExpr | ast.Param) -> str:
    return " ".join(sig.source.text[node.span.start:node.span.end].split())


def kernel_signature(sig: Signature) -> str:
    """The kernel's header as the user would write it on one line, with its ``where`` clauses below."""
    node = sig.node
    params = ", ".join(_text(sig, p) for p in node.params)
    outs = [f"{o.name}: {_text(sig, o.type)}" if o.name else _text(sig, o.type) for o in node.outputs]
    result = outs[0] if len(outs) == 1 and node.outputs[0].name is None else f"({', '.join(outs)})" \
        if len(outs) > 1 else (outs[0] if outs else "")
    head = f"kernel {node.name}({params})" + (f" -> {result}" if result else "")
    if node.where:
        head += "\n  where " + ", ".join(_text(sig, w) for w in node.where)
    return head


def doc_comment(sig: Signature) -> str:
    """The comment lines right above the kernel, without their ``#``."""
    text = sig.source.text
    lines = text[: sig.node.span.start].split("\n")[:-1]
    out: list[str] = []
    for line in reversed(lines):
        stripped = line.strip()
        if not stripped.startswith("#"):
            break
        out.append(stripped.lstrip("#").strip())
    return " ".join(reversed(out)).strip()


def module_of(sig: Signature, index: DocumentIndex) -> str:
    """``std.nn`` for a standard-library kernel, the file's name for another module, '' for this file."""
    if sig.source.path == index.path:
        return ""
    if "." in sig.ir_name:
        return sig.ir_name.rsplit(".", 1)[0]
    return sig.source.path


def kernel_hover(sig: Signature, index: DocumentIndex) -> str:
    parts = [_code(kernel_signature(sig))]
    doc = doc_comment(sig)
    if doc:
        parts.append(doc)
    module = module_of(sig, index)
    if module:
        parts.append(f"from `{module}`" + (" (the standard library)" if module.startswith("std.") else ""))
    if sig.guards:
        parts.append("checked when called: " + ", ".join(f"`{g.text}`" for g in sig.guards))
    if sig.generic is not None:
        parts.append(generic_text(sig))
    return "\n\n".join(parts)


def generic_text(sig: Signature) -> str:
    """What a generic kernel's dtype variables are (language spec §5.6): each set and what binds it."""
    assert sig.generic is not None
    said = "; ".join(f"`{v.name}` in {{{', '.join(map(str, v.members))}}}, bound by `{v.param}`'s dtype"
                     for v in sig.generic.vars)
    return f"generic: {said} ({len(sig.generic.members)} specialisations, each checked and compiled)"


def _range(name: str, extent: Dim) -> str:
    return f"{name}: 0 ≤ {name} < {dim_str(extent)}"


def _index_extent(index: DocumentIndex, symbol: Symbol) -> Dim | None:
    if symbol.kernel is None or symbol.decl is None:
        return None
    facts = index.facts(symbol.kernel) if symbol.kernel in index.own else None
    if facts is not None and symbol.decl.start in facts.extents and symbol.decl.file == index.path:
        return facts.extents[symbol.decl.start][0]
    sig = index.signatures.get(symbol.kernel)  # a strategy naming an index: the checker's index table
    info = index.result.indices.get(sig.ir_name, {}).get(symbol.name) if sig is not None else None
    return info.extent if info is not None else None


def _dim_hover(index: DocumentIndex, symbol: Symbol) -> str:
    sig = index.signatures.get(symbol.kernel or "")
    lines = [_code(f"{symbol.name}: dim")]
    if sig is None:
        return lines[0]
    binding = next((b for b in sig.bindings if b.dim == symbol.name), None)
    if binding is not None and binding.axis < 0:
        lines.append(f"a dim parameter of `{sig.name}`: the positive integer the caller passes, fixed per call")
    elif binding is not None:
        lines.append(f"a dim of `{sig.name}`: the size of axis {binding.axis} of `{binding.param}`, "
                     "a positive integer fixed per call")
    for k, v in sig.subst.items():  # dims a `where` equality makes one
        if str(k) == symbol.name:
            lines.append(f"equal to `{dim_str(v)}` by a `where` clause")
        elif dim_str(v) == symbol.name:
            lines.append(f"equal to `{k}` by a `where` clause")
    return "\n\n".join(lines)


def _value_hover(index: DocumentIndex, symbol: Symbol) -> str | None:
    kernel = symbol.kernel or ""
    facts = index.facts(kernel)
    sig = index.signatures.get(kernel)
    what = {"param": "parameter", "output": "output", "tensor": "tensor"}[symbol.kind]
    if facts is None or symbol.name not in facts.types:
        if sig is not None and symbol.kind == "param" and sig.param(symbol.name):
            param = sig.param(symbol.name)
            assert param is not None
            return _code(f"{symbol.name}: {type_text(param.type)}") + f"\n\n{what} of `{kernel}`"
        return _code(symbol.name) + f"\n\n{what} of `{kernel}` (its type is not known: the kernel has an error)"
    t = facts.types[symbol.name]
    head = f"{symbol.name}: {type_text(t)}"
    node = next((p for p in sig.node.params if p.name == symbol.name), None) if sig is not None else None
    if sig is not None and sig.generic is not None:  # a generic kernel: the type as written, with the variables
        written = node.type if node is not None else next((o.type for o in sig.node.outputs
                                                           if o.name == symbol.name), None)
        names = {v.name for v in sig.generic.vars}
        if written is not None and written.dtype in names:
            return _code(f"{symbol.name}: {_text(sig, written)}") + f"\n\n{what} of `{kernel}`\n\n" + generic_text(sig)
        if symbol.kind == "tensor":
            head += f"  (when {', '.join(f'{v.name} = {v.members[0]}' for v in sig.generic.vars)})"
    if sig is not None and node is not None and node.default is not None and symbol.kind == "param":
        head += f" = {_text(sig, node.default)}"  # as written: `1e-6`, not `1e-06`
    kind = "scalar" if not t.shape else f"rank-{len(t.shape)} tensor"
    noun = kind if t.shape and what == "tensor" else f"{kind} {what}"  # "rank-1 tensor", not "... tensor tensor"
    return _code(head) + f"\n\n{noun} of `{kernel}`"


def _let_hover(index: DocumentIndex, symbol: Symbol) -> str:
    facts = index.facts(symbol.kernel or "")
    if facts is not None and symbol.name in facts.dim_lets:
        return _code(f"let {symbol.name} = {dim_str(facts.dim_lets[symbol.name])}") + \
            "\n\na dim (a `let` computed from dims), usable wherever a dim is"
    if facts is not None and symbol.name in facts.lets:
        return _code(f"{symbol.name}: {facts.lets[symbol.name]}") + \
            f"\n\na scalar `let` of `{symbol.kernel}`, inlined where it is used"
    return _code(f"let {symbol.name}") + f"\n\na `let` of `{symbol.kernel}`"


def hover_markdown(index: DocumentIndex, symbol: Symbol, target: str | None = None) -> str | None:
    """Markdown for ``symbol`` (``target``: the strategy's target, for decisions); None when there is nothing to say."""
    kind = symbol.kind
    if kind in ("param", "output", "tensor"):
        return _value_hover(index, symbol)
    if kind == "index":
        extent = _index_extent(index, symbol)
        head = _code(_range(symbol.name, extent)) if extent is not None else _code(f"{symbol.name}: index")
        return head + (f"\n\n{symbol.detail}" if symbol.detail else "")
    if kind == "dim":
        return _dim_hover(index, symbol)
    if kind == "let":
        return _let_hover(index, symbol)
    if kind == "kernel":
        sig = index.signatures.get(symbol.name)
        return kernel_hover(sig, index) if sig is not None else None
    if kind == "decision":
        return decision_doc(symbol.name, target)
    if kind == "builtin":
        return _code(builtin_signature(symbol.name)) + f"\n\nbuilt-in: {builtin_doc(symbol.name)}"
    if kind == "reduction":
        return _code(f"{symbol.name}(e for i, ...)") + f"\n\nreduction: {reduction_doc(symbol.name)}"
    if kind == "dtype" and symbol.name == "dim":
        return _code("dim") + "\n\na dim parameter: the caller passes a positive integer that binds this dim"
    if kind == "dtype":
        return _code(symbol.name) + f"\n\ndtype: {dtype_doc(symbol.name)}" if symbol.name in DTYPES else None
    if kind == "target":
        return _code(f"target = {symbol.name}") + f"\n\n{target_doc(symbol.name)}"
    if kind == "module":
        return _module_hover(index, symbol)
    return None


def _module_hover(index: DocumentIndex, symbol: Symbol) -> str:
    names = sorted(n for n, s in index.signatures.items() if s.ir_name.startswith(symbol.name + "."))
    where = str(stdlib_path(symbol.name)) if symbol.name.startswith("std.") else (
        symbol.decl.file if symbol.decl else "not found")
    text = _code(f"import {symbol.name}") + f"\n\nmodule `{where}`"
    if names:
        text += "\n\nkernels: " + ", ".join(f"`{n}`" for n in names)
    return text


__all__ = ["doc_comment", "hover_markdown", "kernel_hover", "kernel_signature", "type_text"]
