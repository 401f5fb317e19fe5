"""Walks over `.ak` expressions: a node's children, and the free names used as subscripts.

The checker (``arke.lang.kernels``) and the language server (``arke.lsp``) share these, so
both see the same indices in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import fields

from arke.lang import ast
from arke.lang.source import Span

_FIELDS: dict[type, tuple[str, ...]] = {}


def children(e: ast.Expr) -> Iterator[ast.Expr]:
    """The expressions directly inside ``e``, in field order."""
    names = _FIELDS.get(type(e))
    if names is None:  # `fields()` is slow next to the walk itself: once per node type
        names = _FIELDS[type(e)] = tuple(f.name for f in fields(e))
    for name in names:
        v = getattr(e, name)
        if isinstance(v, ast.Expr):
            yield v
        elif isinstance(v, tuple):
            yield from (x for x in v if isinstance(x, ast.Expr))


def subscript_names(e: ast.Expr, unbound: Callable[[str], bool]) -> list[tuple[str, Span]]:
    """The names used in subscripts of ``e`` (outside the reductions that bind them) for which
    ``unbound`` holds, each with its first use, in the order the checker meets them."""
    out: list[tuple[str, Span]] = []

    def walk(x: ast.Expr, hidden: frozenset[str], in_sub: bool) -> None:
        if isinstance(x, ast.Name):
            if in_sub and x.id not in hidden and all(n != x.id for n, _ in out) and unbound(x.id):
                out.append((x.id, x.span))
        elif isinstance(x, ast.Index):
            for sub in x.indices:
                walk(sub, hidden, True)
        elif isinstance(x, ast.Reduce):
            walk(x.body, hidden | frozenset(x.indices), in_sub)
        else:
            for c in children(x):
                walk(c, hidden, in_sub)

    walk(e, frozenset(), False)
    return out
