"""AK2107 where a whole tensor meets indexed elements: which tensor it is, and its subscript.

``x[m, n] / s`` combines elements of ``x`` with all of ``s``: the diagnostic underlines ``s``
and, when the indices in scope say which subscript it needs (one index per axis with that
axis's extent), offers it as the quick fix (``s[m]``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from arke.lang import ast
from arke.lang.walk import children

if TYPE_CHECKING:
    from arke.lang.kernels import KernelChecker


def whole_among_indexed(self: KernelChecker, e: ast.Expr) -> None:
    """AK2107 for ``e``, which combines indexed elements with a whole tensor: at the tensor's
    name when one is written bare in ``e`` (with its subscript as the fix when the indices in
    scope say it), else at ``e``."""
    bare = _bare_tensor(self, e)
    if bare is None:
        self.error("AK2107", "a whole tensor is combined with indexed elements", e.span,
                   hint="index every tensor in the expression (`x[i, j]`), or none of them")
        return
    shape = self.values[bare.id].type.shape
    scope = {n: d for frame in self.frames for n, d in frame.items()}
    subs: list[str | None] = []
    for d in shape:
        fits = [n for n, x in scope.items() if self.same(x, d)]
        subs.append(fits[0] if len(fits) == 1 else None)
    fix = f"{bare.id}[{', '.join(n or '' for n in subs)}]" if all(subs) else None
    example = fix or f"{bare.id}[{', '.join(['...'] * len(shape))}]"
    self.error("AK2107", f"`{bare.id}` needs its subscript: it is a whole tensor of rank {len(shape)} "
               "combined with indexed elements", bare.span,
               hint=f"write `{example}` so its elements line up with the other terms", replacement=fix)


def _bare_tensor(checker: KernelChecker, e: ast.Expr) -> ast.Name | None:
    """The first tensor of rank > 0 written as a bare name in ``e``. Not searched: subscripts and
    reduction bodies (a whole tensor there is reported where it is), and what takes whole
    tensors (`transpose`, a kernel call, `@`), whose result is the whole tensor, not the name."""
    if isinstance(e, ast.Name):
        v = checker.values.get(e.id)
        if (v is not None and v.type.rank > 0 and checker.lookup_index(e.id) is None
                and e.id not in checker.lets):
            return e
        return None
    if isinstance(e, ast.Index | ast.Reduce) or (isinstance(e, ast.Binary) and e.op == "@"):
        return None
    if isinstance(e, ast.Call) and (e.func == "transpose" or e.func in checker.callables):
        return None
    for c in children(e):
        found = _bare_tensor(checker, c)
        if found is not None:
            return found
    return None
