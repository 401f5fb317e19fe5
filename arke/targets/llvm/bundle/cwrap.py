"""The C text of one bundled kernel: its guards (the Python guards' rules and messages), the choice of
strategy variant by the `when` clauses, and each variant's dispatches run on the bundle's worker pool.

:func:`render_kernel` turns a kernel's SemanticIR function and its compiled variants (plans and
artifacts, entry points renamed to bundle symbols) into C that calls the entries with the same
dims words, buffers, chunks and scratch as the JIT runtime (:mod:`arke.targets.llvm.kernel`), so a
bundle's results are bit-identical to ``arke.build``'s. Text only: :mod:`.build` compiles it.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from arke.ir import semantic as S
from arke.ir.dtypes import DType
from arke.ir.shapes import dim_str, free_dims
from arke.plan.dispatch import KernelPlan
from arke.runtime.guards import cond_dims, dim_params
from arke.targets.artifact import Artifact
from arke.targets.llvm.bundle.cexpr import c_cond, c_dim, c_string

#: The ABI's dtype codes (arke_bundle.h).
DTYPE_CODES: dict[DType, int] = {DType.BOOL: 0, DType.I8: 1, DType.I32: 2, DType.I64: 3, DType.U8: 4, DType.U16: 5,
                                 DType.U32: 6, DType.F16: 7, DType.BF16: 8, DType.F32: 9}
_BYTES = {DType.BOOL: 1, DType.I8: 1, DType.I32: 4, DType.I64: 8, DType.U8: 1, DType.U16: 2, DType.U32: 4,
          DType.F16: 2, DType.BF16: 2, DType.F32: 4}


@dataclass(frozen=True)
class Variant:
    """One compiled strategy variant: its plan, its artifact, the bundle symbols of its entries (one per
    launch), the condition that selects it (None: always), and whether its results may fail midway."""

    plan: KernelPlan
    artifact: Artifact
    symbols: tuple[str, ...]
    when: S.Cond | None
    may_fail: bool
    amx: bool


def c_name(name: str) -> str:
    """A kernel name as a C identifier (``std.nn.rmsnorm`` -> ``std_nn_rmsnorm``)."""
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)


#: Marks a printf conversion in a message (``f"{P}lld"``); every other ``%`` is the message's own.
P = "\x01"


def _error(code: str, rule: str, param: str | None, kernel: str, text: str, *args: str) -> str:
    """The C expression that fills ``err`` (``text``: the message after "kernel `name`: ", with
    :data:`P` conversions for ``args``) and gives the error code."""
    par = c_string(param) if param else "NULL"
    fmt = c_string(f"kernel `{kernel}`: {text}").replace("\\001", "%")
    return f"ak_fail(err, {code}, \"{rule}\", {par}, {fmt}{''.join(', ' + a for a in args)})"


def _fail(code: str, rule: str, param: str | None, kernel: str, text: str, *args: str) -> str:
    return f"return {_error(code, rule, param, kernel, text, *args)};"


def render_kernel(name: str, fn: S.Function, variants: list[Variant]) -> str:
    """The C wrapper of kernel ``name`` (its public symbol is ``arke_<c_name(name)>``)."""
    k = c_name(name)
    dims = list(dict.fromkeys(b.dim for b in fn.bindings))
    fields = ", ".join(f"d_{d}" for d in dims) or "unused"
    out: list[str] = [f"/* kernel {name} */", f"typedef struct {{ int64_t {fields}; }} dims_{k};", ""]
    out += _entries(k, variants)
    out += _check(k, name, fn, dims)
    for j, v in enumerate(variants):
        out += _runner(k, name, fn, dims, j, v)
    out += _public(k, name, fn, dims, variants)
    return "\n".join(out) + "\n"


def _entries(k: str, variants: list[Variant]) -> list[str]:
    lines = []
    for j, v in enumerate(variants):
        for x, (launch, symbol) in enumerate(zip(v.artifact.launches, v.symbols)):
            ptrs = ", ".join(["void *"] * len(launch.buffers))
            lines.append(f"extern void {symbol}({ptrs}{', ' if ptrs else ''}const int64_t *, int64_t, int64_t, "
                         "int64_t *, void *);")
            args = ", ".join(f"b[{i}]" for i in launch.buffers)
            lines.append(f"static void L_{k}_{j}_{x}(void **b, const int64_t *dims, int64_t lo, int64_t hi, "
                         f"int64_t *error, void *scratch) {{ {symbol}({args}{', ' if args else ''}dims, lo, hi, "
                         "error, scratch); }")
    return [*lines, ""]


def _signature_text(p: S.Param) -> str:
    t = p.type
    return f"{t.dtype}[{', '.join(dim_str(d) for d in t.shape)}]" if t.rank else str(t.dtype)


def _check(k: str, name: str, fn: S.Function, dims: list[str]) -> list[str]:
    """check_<k>: every guard of the Python runtime, in its order, with its message."""
    names = ", ".join(p.name for p in fn.params)
    n = len(fn.params)
    as_dims = dim_params(fn)
    L = [f"static int check_{k}(const arke_tensor *a, int64_t na, dims_{k} *D, arke_error *err) {{",
         "    char sh[256]; int bad = 0; (void)sh; (void)bad;",
         "    if (na > 0 && a == NULL) "
         + _fail("ARKE_ERR_ARGS", "arity", None, name, ("the array of arguments is NULL")),
         f"    if (na != {n}) "
         + _fail("ARKE_ERR_ARGS", "arity", None, name, (f"takes {n} arguments ({names}), but {P}lld were given"),
                 "(long long)na")]
    for i, p in enumerate(fn.params):
        rank = p.type.rank
        want = _signature_text(p)
        # extents are read only where the caller's ndim is below the rank, so its shape array holds them: a
        # larger ndim says nothing of the array's length
        with_shape = _fail("ARKE_ERR_SHAPE", "rank", p.name, name,
                      (f"parameter `{p.name}` is {want}" + f" (rank {rank})" + f", but was given {P}s (rank {P}d)"),
                      f"ak_shape_text(&a[{i}], sh, sizeof sh)", f"(int)a[{i}].ndim")
        plain = _fail("ARKE_ERR_SHAPE", "rank", p.name, name,
                      (f"parameter `{p.name}` is {want}" + f" (rank {rank})" + f", but was given rank {P}d"
                       + (" (or no shape)" if rank else "")), f"(int)a[{i}].ndim")
        L.append(f"    if (a[{i}].ndim != {rank}{f' || a[{i}].shape == NULL' if rank else ''}) {{")
        L.append(f"        if (a[{i}].ndim >= 0 && a[{i}].ndim < {rank} && (a[{i}].ndim == 0 || a[{i}].shape != NULL)) "
                 + with_shape)
        L.append(f"        {plain}")
        L.append("    }")
        # no data is a missing argument, unless an extent is 0 (torch's empty tensors have none): that is the
        # dims' error, below
        empty = " && " + " && ".join(f"a[{i}].shape[{x}] != 0" for x in range(rank)) if rank else ""
        L.append(f"    if (a[{i}].data == NULL{empty}) "
                 + _fail("ARKE_ERR_ARGS", "missing", p.name, name, (f"missing argument `{p.name}`")))
        need = DType.I64 if p.name in as_dims else p.type.dtype
        how = f"convert it to {need}"
        L.append(f"    if (a[{i}].dtype != {DTYPE_CODES[need]}) "
                 + _fail("ARKE_ERR_DTYPE", "dtype", p.name, name,
                         (f"parameter `{p.name}` needs {need}, but was given {P}s; {how}"),
                         f"ak_dtype_name(a[{i}].dtype)"))
        if rank:
            L.append(f"    if (!ak_dense(&a[{i}])) "
                     + _fail("ARKE_ERR_SHAPE", "dim", p.name, name,
                             (f"parameter `{p.name}` must be dense and row-major (strides NULL or row-major); "
                                  "copy it into a contiguous buffer")))
    origin: dict[str, str] = {}
    index = {p.name: i for i, p in enumerate(fn.params)}
    for d in dims:
        L.append(f"    int64_t d_{d} = 0;")
    for b in fn.bindings:
        i = index[b.param]
        if b.axis < 0:
            value, where = f"(*(const int64_t *)a[{i}].data)", f"`{b.param}`"
            low = _fail("ARKE_ERR_SHAPE", "dim", b.param, name,
                        (f"`{b.param}` is a dim: it needs a positive integer, but was given {P}lld"),
                        "(long long)v")
            clash = (f"{b.dim} = {P}lld from {{origin}}, but {where} is {P}lld")
        else:
            value, where = f"a[{i}].shape[{b.axis}]", f"`{b.param}` axis {b.axis}"
            low = _fail("ARKE_ERR_SHAPE", "dim", b.param, name,
                        (f"{b.dim} = {P}lld from {where}: dims must be at least 1"), "(long long)v")
            clash = (f"{b.dim} = {P}lld from {{origin}}, but {where} has {P}lld")
        L.append(f"    {{ int64_t v = {value};")
        if b.dim in origin:
            L.append(f"      if (v != d_{b.dim}) "
                     + _fail("ARKE_ERR_SHAPE", "dim", b.param, name, clash.replace("{origin}", origin[b.dim]),
                             f"(long long)d_{b.dim}", "(long long)v"))
        else:
            origin[b.dim] = where
        L.append(f"      if (v < 1) {low}")
        L.append(f"      d_{b.dim} = v; }}")
    for i, p in enumerate(fn.params):
        for axis, d in enumerate(p.type.shape):
            here = f"`{p.name}` axis {axis} has {P}lld"
            size = f"(long long)a[{i}].shape[{axis}]"
            if isinstance(d, sympy.Symbol):
                msg, args = f"{d.name} = {P}lld from {origin.get(d.name, 'the call')}, but {here}", ["(long long)want"]
            elif isinstance(d, int) or d.is_Integer:
                msg, args = f"`{p.name}` axis {axis} must be {P}lld, but has {P}lld", ["(long long)want"]
            else:
                known = ", ".join(f"{s} = {P}lld from {origin.get(s, 'the call')}" for s in sorted(free_dims(d)))
                msg = f"`{p.name}` axis {axis} must be {dim_str(d)} = {P}lld ({known}), but has {P}lld"
                args = ["(long long)want", *(f"(long long)d_{s}" for s in sorted(free_dims(d)))]
            args.append(size)
            L.append(f"    {{ int64_t want = {c_dim(d)};")
            L.append(f"      if (!bad && want != a[{i}].shape[{axis}]) "
                     + _fail("ARKE_ERR_SHAPE", "dim", p.name, name, msg, *args)
                     + " }")
    for g in fn.guards:
        shown = [s for s in sorted(cond_dims(g.cond)) if s in dims]
        values = ", ".join(f"{s} = {P}lld" for s in shown)
        text = g.text if len(g.text) <= 200 else f"{g.text[:140]} … {g.text[-50:]}"
        shown_args = [f"(long long)d_{s}" for s in shown]
        # its own overflow flag: a clause whose intermediate values pass 64 bits is said as such (the Python
        # guards compute it exactly), not as a dim or size beyond 64 bits
        L.append(f"    if (!bad) {{ int held, wide; {{ int bad = 0; held = {c_cond(g.cond)}; wide = bad; }}")
        L.append("      if (wide) " + _fail("ARKE_ERR_SHAPE", "where", None, name,
                                            f"where clause `{text}` cannot be checked in the bundle's 64-bit "
                                            f"integers at {values}: its values pass 2**63 (arke.build checks it "
                                            "exactly)", *shown_args))
        L.append("      if (!held) " + _fail("ARKE_ERR_SHAPE", "where", None, name,
                                             f"where clause `{text}` does not hold: {values}", *shown_args) + " }")
    for rtype in fn.result_types:
        count = " ".join("ak_mul(" for _ in rtype.shape) + "INT64_C(1)" + "".join(
            f", {c_dim(d)}, &bad)" for d in rtype.shape)
        L.append(f"    (void)({count});")
    L.append("    if (bad) " + _fail("ARKE_ERR_SHAPE", "size", None, name,
                                     ("a dim or a result's element count is beyond the 64-bit sizes kernels "
                                          "compute with (at most 2**63 - 1); call it with smaller dims")))
    L += [f"    D->d_{d} = d_{d};" for d in dims]
    L += ["    return ARKE_OK;", "}", ""]
    return L


def _unpack(k: str, dims: list[str]) -> list[str]:
    return [f"    const int64_t d_{d} = D->d_{d}; (void)d_{d};" for d in dims]


def _runner(k: str, name: str, fn: S.Function, dims: list[str], j: int, v: Variant) -> list[str]:
    """run_<k>_<j>: variant j's buffers, dims words and dispatches; results copied where not written in place."""
    plan, launches = v.plan, v.artifact.launches
    nb, nl = len(plan.buffers), len(launches)
    missing = [d for d in plan.dims if d not in dims]
    if missing:
        raise ValueError(f"kernel `{name}`: the plan's dims {missing} are not bound by its parameters")
    params = {p.name: i for i, p in enumerate(fn.params)}
    results = plan.function.results  # the plan's names for the function's results, position by position
    result_at = [plan.buffer_index(r) for r in results]
    direct = {at: r for r, at in enumerate(result_at)
              if plan.buffers[at].role == "result" and results.count(results[r]) == 1 and not v.may_fail}
    L = [f"static int run_{k}_{j}(const arke_tensor *a, arke_tensor *r, const dims_{k} *D, int32_t threads, "
         "arke_error *err) {", "    int bad = 0; int rc = ARKE_OK;", *_unpack(k, dims),
         f"    void *b[{max(nb, 1)}] = {{0}}; void *own[{max(nb, 1)}] = {{0}};",
         f"    int64_t words[{max(1, len(plan.dims) + nl)}] = {{{', '.join(f'd_{d}' for d in plan.dims) or '0'}}};",
         "    int64_t *errors = NULL;"]
    if v.amx:
        L.append("    if (!ak_amx_permit()) { rc = " + _error("ARKE_ERR_RUNTIME", "cpu", None, name, (
            "this bundle was built for AMX tiles, but Linux refused this process the tile data permission "
            "(arch_prctl ARCH_REQ_XCOMP_PERM); rebuild the bundle with --cpu for a CPU without AMX"))
            + "; goto done; }")
    for i, buf in enumerate(plan.buffers):
        if buf.role == "param":
            L.append(f"    b[{i}] = a[{params[buf.name]}].data;")
        elif i in direct:
            L.append(f"    b[{i}] = r[{direct[i]}].data;")
        else:
            count = " ".join("ak_mul(" for _ in buf.shape) + "INT64_C(1)" + "".join(
                f", {c_dim(d)}, &bad)" for d in buf.shape)
            L.append(f"    {{ int64_t bytes = ak_mul({count}, {_BYTES[buf.dtype]}, &bad);")
            L.append(f"      if (!bad) b[{i}] = own[{i}] = ak_alloc(bytes);")
            L.append(f"      if (bad || !b[{i}]) {{ rc = "
                     + _error("ARKE_ERR_RUNTIME", "memory", None, name, f"cannot allocate buffer `{buf.name}`")
                     + "; goto done; } }")
    extents = [c_dim(x.parallel_extent) if x.parallel_extent else "INT64_C(1)" for x in launches]
    L += _panel_words(name, fn, v, params)
    L.append(f"    int64_t n[{max(1, nl)}] = {{{', '.join(extents) or '1'}}};")
    scratch = [f"ak_mul(8, {c_dim(x.scratch)}, &bad)" if x.scratch else "INT64_C(0)" for x in launches]
    L.append(f"    int64_t scratch[{max(1, nl)}] = {{{', '.join(scratch) or '0'}}};")
    L += ["    if (bad) { rc = " + _error("ARKE_ERR_SHAPE", "size", None, name,
                                   "a buffer's size is beyond the 64-bit sizes kernels compute with; call it with "
                                   "smaller dims") + "; goto done; }",
          "    int64_t t = threads > 0 ? threads : ak_cores(), widest = 1;",
          f"    for (int l = 0; l < {nl}; l++) if (n[l] > widest) widest = n[l];",
          "    if (t > ak_worker_limit()) t = ak_worker_limit();",
          "    if (t > widest) t = widest;",
          "    errors = calloc((size_t)t, sizeof(int64_t));",
          "    if (!errors) { rc = " + _error("ARKE_ERR_RUNTIME", "memory", None, name, "out of memory")
          + "; goto done; }"]
    for x in range(nl):
        L += [f"    rc = ak_run(L_{k}_{j}_{x}, b, words, n[{x}], t, scratch[{x}], errors, err, "
              f"{c_string(name)});",
              "    if (rc) goto done;",
              "    for (int64_t w = 0; w < t; w++) if (errors[w]) { rc = "
              + _error("ARKE_ERR_SHAPE", "index", None, name, "an index or an integer division was out of range")
              + "; goto done; }"]
    for r, at in enumerate(result_at):
        if at in direct and direct[at] == r:
            continue
        rtype = fn.result_types[r]
        count = " ".join("ak_mul(" for _ in rtype.shape) + "INT64_C(1)" + "".join(
            f", {c_dim(d)}, &bad)" for d in rtype.shape)
        L.append(f"    memcpy(r[{r}].data, b[{at}], (size_t)ak_mul({count}, {_BYTES[rtype.dtype]}, &bad));")
    L += ["done:", f"    for (int i = 0; i < {max(nb, 1)}; i++) free(own[i]);", "    free(errors);",
          "    return rc;", "}", ""]
    return L


def _layout_code(key: str) -> int:
    return -1 if key == "vnni" else int(key)


def _panel_words(name: str, fn: S.Function, v: Variant, params: dict[str, int]) -> list[str]:
    """Prepacked panels (a parameter whose ``layout`` is not 0): each dispatch that can read them gets their
    address in its dims word (as the JIT runtime passes them); one that cannot is refused the call."""
    plan, base = v.plan, len(v.plan.dims)
    reads = {int(key.split(".")[1]): value.split(",") for key, value in v.artifact.meta.items()
             if key.startswith("panels.")}
    lines = []
    for i, buf in enumerate(plan.buffers):
        if buf.role != "param" or len(buf.shape) != 2:
            if buf.role == "param":
                lines.append(f"    if (a[{params[buf.name]}].layout != 0) {{ rc = " + _error(
                    "ARKE_ERR_SHAPE", "dim", buf.name, name, f"`{buf.name}` holds prepacked panels, which no dispatch "
                    "of this kernel reads; pass it row-major (layout 0)") + "; goto done; }")
            continue
        p = params[buf.name]
        for x, launch in enumerate(v.artifact.launches):
            if i not in launch.buffers:
                continue
            found = reads.get(x)
            if found is not None and int(found[0]) == i:
                lines.append(f"    if (a[{p}].layout == {_layout_code(found[1])}) words[{base + x}] = "
                             f"(int64_t)(intptr_t)a[{p}].data;")
                lines.append(f"    else if (a[{p}].layout != 0) {{ rc = " + _error(
                    "ARKE_ERR_SHAPE", "dim", buf.name, name, f"`{buf.name}` holds prepacked panels (layout {P}d), "
                    f"which dispatch {x} cannot read (it reads layout {found[1]})", f"(int)a[{p}].layout")
                    + "; goto done; }")
            else:
                lines.append(f"    if (a[{p}].layout != 0) {{ rc = " + _error(
                    "ARKE_ERR_SHAPE", "dim", buf.name, name, f"`{buf.name}` holds prepacked panels (layout {P}d), "
                    f"which dispatch {x} cannot read", f"(int)a[{p}].layout") + "; goto done; }")
    return lines


def _public(k: str, name: str, fn: S.Function, dims: list[str], variants: list[Variant]) -> list[str]:
    nres = len(fn.results)
    L = [f"int arke_{k}_result_shape(const arke_tensor *a, int64_t na, int64_t result, int64_t *shape, "
         "arke_error *err) {",
         f"    ak_clear(err); dims_{k} DV, *D = &DV; int bad = 0;",
         f"    int rc = check_{k}(a, na, D, err); if (rc) return rc;", *_unpack(k, dims),
         "    if (shape == NULL) "
         + _fail("ARKE_ERR_ARGS", "arity", None, name, ("shape is NULL: pass an array of the result's rank"))]
    for r, rtype in enumerate(fn.result_types):
        sets = " ".join(f"shape[{x}] = {c_dim(d)};" for x, d in enumerate(rtype.shape))
        L.append(f"    if (result == {r}) {{ {sets} return ARKE_OK; }}")
    L += ["    (void)bad; (void)shape;",
          "    " + _fail("ARKE_ERR_ARGS", "arity", None, name, (f"has {nres} results; result {P}lld does not exist"),
                         "(long long)result"), "}", "",
          f"int arke_{k}(const arke_tensor *a, int64_t na, arke_tensor *r, int64_t nr, int32_t threads, "
          "arke_error *err) {",
          f"    ak_clear(err); dims_{k} DV, *D = &DV; int bad = 0;",
          f"    int rc = check_{k}(a, na, D, err); if (rc) return rc;", *_unpack(k, dims),
          "    if (nr > 0 && r == NULL) "
          + _fail("ARKE_ERR_ARGS", "arity", "out", name, ("the array of results is NULL")),
          f"    if (nr != {nres}) "
          + _fail("ARKE_ERR_ARGS", "arity", "out", name,
                  (f"out= needs {nres} tensor{'s' if nres > 1 else ''}, one per result, but {P}lld were given"),
                  "(long long)nr"),
          "    if (threads < 0 || threads > 1024) "
          + _fail("ARKE_ERR_RUNTIME", "threads", "threads", name,
                  (f"threads must be a whole number from 1 to 1024 (or 0: one per core), not {P}d"),
                  "(int)threads")]
    for r, rtype in enumerate(fn.result_types):
        what = f"out[{r}]" if nres > 1 else "out"
        L.append(f"    if (r[{r}].data == NULL) " + _fail("ARKE_ERR_ARGS", "missing", "out", name,
                                                          (f"{what} has no data")))
        L.append(f"    if (r[{r}].dtype != {DTYPE_CODES[rtype.dtype]}) "
                 + _fail("ARKE_ERR_DTYPE", "dtype", "out", name, (f"{what} is {P}s, but the result is {rtype.dtype}"),
                         f"ak_dtype_name(r[{r}].dtype)"))
        sizes = " || ".join(f"r[{r}].shape[{x}] != {c_dim(d)}" for x, d in enumerate(rtype.shape))
        null = f" || r[{r}].shape == NULL" if rtype.rank else ""
        L.append(f"    if (r[{r}].ndim != {rtype.rank}{null}{' || ' + sizes if sizes else ''} || !ak_dense(&r[{r}])) "
                 + _fail("ARKE_ERR_SHAPE", "dim", "out", name,
                         (f"{what} must be a dense row-major tensor of the result's shape "
                              f"[{', '.join(dim_str(d) for d in rtype.shape)}]")))
    L += [f"    for (int64_t x = 0; x < {nres}; x++) {{",
          "        const char *lo = r[x].data, *hi = lo + ak_nbytes(&r[x]);",
          f"        for (int64_t y = 0; y < {len(fn.params)} + {nres}; y++) {{",
          f"            const arke_tensor *o = y < {len(fn.params)} ? &a[y] : &r[y - {len(fn.params)}];",
          "            if (o == &r[x]) continue;",
          "            const char *olo = o->data, *ohi = olo + ak_nbytes(o);",
          "            if (lo < ohi && olo < hi) "
          + _fail("ARKE_ERR_SHAPE", "dim", "out", name, ("out overlaps an argument or another output")),
          "        }", "    }", "    (void)bad;"]
    for j, v in enumerate(variants):
        test = "1" if v.when is None else f"(bad = 0, {c_cond(v.when)} && !bad)"
        L.append(f"    if ({test}) return run_{k}_{j}(a, r, D, threads, err);")
    L += ["    return ARKE_OK;", "}", ""]
    return L
