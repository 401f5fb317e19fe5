"""``akc build --target llvm --bundle DIR``: compile kernels ahead of time into one shared library.

For each kernel, every strategy variant its `when` clauses can select is planned, rendered and
compiled (position-independent object code for the bundle's target machine, entry points renamed
to bundle symbols, everything else made internal); :mod:`.cwrap` renders the C guards and
dispatch of each kernel, and the system C compiler links them with the bundle's run time
(``runtime.c``) into ``libarke_bundle.so``. Beside it: ``arke_bundle.h`` (the C ABI and each
kernel's prototype) and ``manifest.json`` (format version, Arke version, triple, CPU, the ISA
flags a host needs, each kernel's signature and variants, the kernels' SemanticIR for the Python
guards, and the sha256 of every file). :func:`arke.runtime.bundle.load_bundle` loads it without the
compiler.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arke.ir import semantic as S
from arke.ir.serialize import encode_scalar, to_json
from arke.ir.shapes import dim_str
from arke.ir.text import cond_text
from arke.runtime import bundle_files
from arke.runtime.bundle_files import FORMAT, LIBRARY, MANIFEST, VERSION, isa_flags, sha256, staged, stamped
from arke.runtime.outputs import can_fail
from arke.targets.llvm.bundle.cpus import CPUS, LINKERS, TRIPLES, arch_of
from arke.targets.llvm.bundle.cwrap import DTYPE_CODES, Variant, c_name, render_kernel

if TYPE_CHECKING:
    from arke.api import Module

HERE = Path(__file__).parent
HEADER = "arke_bundle.h"


class BundleError(bundle_files.BundleError):
    """A bundle cannot be built as asked: the message says why and what to do."""


@dataclass(frozen=True)
class Machine:
    """The target machine a bundle is compiled for."""

    triple: str
    cpu: str
    features: str  # LLVM's feature string ("" for a named CPU: its own)
    arch: str
    vector_bits: int
    units: frozenset[str]
    flags: frozenset[str]  # what a host needs (cpuinfo names)


def machine(cpu: str | None = None, triple: str | None = None) -> Machine:
    """The host's machine, or the named ``cpu`` (and ``triple``; by default the CPU's architecture's)."""
    import llvmlite.binding as llvm

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    if cpu is None:
        if triple is not None and arch_of(triple) != platform.machine():
            named = [n for n, c in CPUS.items() if c.arch == arch_of(triple)]
            if not named:
                raise BundleError(f"--triple {triple}: Arke builds bundles for "
                                  f"{' and '.join(sorted({c.arch for c in CPUS.values()}))} CPUs, not for "
                                  f"{arch_of(triple)}")
            raise BundleError(f"--triple {triple} is another architecture than this host's: name its CPU with --cpu "
                              f"(one of: {', '.join(named)})")
        from arke.targets.llvm.isa import host_units
        from arke.targets.llvm.jit import host_vector_bits

        return Machine(llvm.get_process_triple(), llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(),
                       platform.machine(), host_vector_bits(), frozenset(host_units()), frozenset(isa_flags()))
    found = CPUS.get(cpu)
    if found is None:
        raise BundleError(f"--cpu {cpu} is not one Arke builds bundles for; it knows: {', '.join(CPUS)}")
    triple = triple or TRIPLES[found.arch]
    if arch_of(triple) != found.arch:
        raise BundleError(f"--cpu {cpu} is an {found.arch} CPU, but --triple {triple} is {arch_of(triple)}")
    return Machine(triple, cpu, "", found.arch, found.vector_bits, found.units, found.flags)


def _target_machine(m: Machine) -> Any:
    import llvmlite.binding as llvm

    try:
        target = llvm.Target.from_triple(m.triple)
    except RuntimeError as err:
        raise BundleError(f"LLVM has no target for --triple {m.triple}: {err}") from None
    return target.create_target_machine(cpu=m.cpu, features=m.features, opt=3, reloc="pic", codemodel="default")


def compile_variant(source: str, entries: dict[str, str], tm: Any) -> bytes:
    """PIC object code of one variant's LLVM IR: ``entries`` (old -> new symbol) renamed and kept
    external, every other definition made internal (bundles link many variants into one library)."""
    import llvmlite.binding as llvm

    module = llvm.parse_assembly(source)
    module.triple = tm.triple
    module.data_layout = str(tm.target_data)
    for fn in module.functions:
        if fn.is_declaration:
            continue
        if fn.name in entries:
            fn.name = entries[fn.name]
        else:
            fn.linkage = llvm.Linkage.internal
    for g in module.global_variables:
        if not g.is_declaration:
            g.linkage = llvm.Linkage.internal
    module.verify()
    options = llvm.create_pipeline_tuning_options(speed_level=3)
    builder = llvm.create_pass_builder(tm, options)
    builder.getModulePassManager().run(module, builder)
    return bytes(tm.emit_object(module))


def _linker(m: Machine) -> list[str]:
    """The C compiler that links the bundle: ``$CC`` (or ``cc``) for the host, the cross compiler else."""
    if m.arch == platform.machine():
        found = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        hint = "install a C compiler (Debian: apt-get install gcc) or set CC"
    else:
        found = shutil.which(LINKERS.get(m.arch, f"{m.arch}-linux-gnu-gcc"))
        hint = f"install the cross compiler (Debian: apt-get install gcc-{m.arch.replace('_', '-')}-linux-gnu)"
    if not found:
        raise BundleError(f"linking a bundle for {m.arch} needs a C compiler, and none was found: {hint}")
    return found.split()


def build_bundle(module: Module, out: str | os.PathLike[str], kernels: list[str] | None = None,
                 cpu: str | None = None, triple: str | None = None) -> dict[str, Any]:
    """Build ``module``'s kernels (or those named) into a bundle folder ``out``; returns its manifest.

    Strategy decisions the llvm target cannot honour warn (AK4014) as ``arke.build`` does. A folder
    that exists is replaced only once the new bundle is complete (a failed build leaves it as it was).
    """
    from arke.plan.dispatch import make_plan
    from arke.targets import base as targets
    from arke.targets.downgrades import StrategyDowngradeWarning, unhonoured
    from arke.targets.llvm.render import LLVMRenderer

    m = machine(cpu, triple)
    tm = _target_machine(m)
    renderer = LLVMRenderer(vector_bits=m.vector_bits, units=m.units)
    names = kernels or [n for n in module.names if module.kernel_map.get(n) not in module.generics]
    for n in names:
        if n not in module.kernel_map:
            raise BundleError(f"no kernel `{n}` to bundle; the module has: {', '.join(module.kernel_map)}")
        if module.kernel_map[n] in module.generics:
            raise BundleError(f"kernel `{n}` is generic: bundle a specialisation (akc build --dtypes W=bf16 ...)")
    if not names:
        raise BundleError("the module defines no kernel to bundle")
    owners: dict[str, str] = {"arke_bundle_abi_version": "the bundle's ABI version function"}

    def claim(symbol: str, name: str) -> None:  # every exported C symbol has one owner
        if symbol in owners:
            raise BundleError(f"kernel `{name}` would export the C symbol `{symbol}`, which {owners[symbol]} "
                              "exports too: rename the kernel (nothing was written)")
        owners[symbol] = f"kernel `{name}`"

    for n in names:
        claim(f"arke_{c_name(n)}", n)
        claim(f"arke_{c_name(n)}_result_shape", n)
    backend = targets.get("llvm")
    objects: dict[str, bytes] = {}
    c_parts, records = [], []
    for name in names:
        ir_name = module.kernel_map[name]
        fn = module.semantic.get(ir_name)
        k = c_name(name)
        variants, described = [], []
        for j, (label, strategy) in enumerate(_variants(module, ir_name)):
            plan = make_plan(module.semantic, ir_name, strategy, renderer.families, bounded=True)
            if strategy is not None:
                for found in unhonoured(backend, module.semantic, ir_name, strategy, None, name, plan):
                    warnings.warn(StrategyDowngradeWarning(found), stacklevel=2)
            artifact = renderer.render(plan)
            symbols = {spec.entry: f"arke_e_{k}_{j}_{x}" for x, spec in enumerate(artifact.launches)}
            for symbol in symbols.values():
                claim(symbol, name)
            objects[f"{k}_{j}.o"] = compile_variant(artifact.source, symbols, tm)
            units = [u for u in artifact.meta.get("units", "").split(",") if u]
            variants.append(Variant(plan, artifact, tuple(symbols.values()), strategy.when if strategy else None,
                                    can_fail(plan.function, module.semantic), any("amx" in u for u in units)))
            described.append({"label": label, "when": cond_text(strategy.when) if strategy and strategy.when else None,
                              "dispatches": len(artifact.launches), "units": units})
        c_parts.append(render_kernel(name, fn, variants))
        records.append(_record(name, k, fn, described, any(v.may_fail for v in variants)))
    functions = _closure(module.semantic, [module.kernel_map[n] for n in names])
    return _write(Path(out).absolute(), m, objects, c_parts, records, functions)  # the link runs elsewhere


def _closure(semantic: S.Module, roots: list[str]) -> tuple[S.Function, ...]:
    """The functions ``roots`` name and every function they call (the manifest's SemanticIR)."""
    seen: dict[str, S.Function] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        fn = seen[name] = semantic.get(name)
        todo += [op.callee for op in fn.ops if isinstance(op, S.CallOp)]
    return tuple(seen.values())


def _variants(module: Module, ir_name: str) -> list[tuple[str, Any]]:
    from arke.plan.variants import variants

    return variants(module, ir_name, "llvm")


def _record(name: str, k: str, fn: S.Function, variants: list[dict[str, Any]], may_fail: bool) -> dict[str, Any]:
    from arke.runtime.guards import dim_params

    as_dims = dim_params(fn)
    return {
        "name": name, "function": fn.name, "symbol": f"arke_{k}",
        "params": [{"name": p.name, "dtype": str(p.type.dtype), "shape": [dim_str(d) for d in p.type.shape],
                    "dim": p.name in as_dims, "default": None if p.default is None else encode_scalar(p.default)}
                   for p in fn.params],
        "results": [{"dtype": str(t.dtype), "shape": [dim_str(d) for d in t.shape]} for t in fn.result_types],
        "where": [g.text for g in fn.guards], "variants": variants, "may_fail": may_fail,
    }


def _header(records: list[dict[str, Any]]) -> str:
    lines = [(HERE / HEADER).read_text(), "", "/* ---- the kernels of this bundle ---- */", "",
             "#ifndef ARKE_BUNDLE_KERNELS_H", "#define ARKE_BUNDLE_KERNELS_H", "#ifdef __cplusplus",
             'extern "C" {  /* C linkage from C++ */', "#endif", "", "int32_t arke_bundle_abi_version(void);", ""]
    codes = {str(d): c for d, c in DTYPE_CODES.items()}
    for r in records:
        params = ", ".join(f"{p['name']}: {'dim' if p['dim'] else p['dtype']}"
                           + (f"[{', '.join(p['shape'])}]" if p["shape"] else "") for p in r["params"])
        results = ", ".join(f"{x['dtype']}[{', '.join(x['shape'])}]" if x["shape"] else x["dtype"]
                            for x in r["results"])
        lines.append(f"/* kernel {r['name']}({params}) -> {results}")
        for w in r["where"]:
            lines.append(f" *   where {w.replace('*/', '* /')}")
        lines.append(" *   args: " + ", ".join(
            f"{p['name']} ({'ARKE_I64' if p['dim'] else 'ARKE_' + p['dtype'].upper()} = "
            f"{codes['i64' if p['dim'] else p['dtype']]}, rank {len(p['shape'])})" for p in r["params"]))
        lines.append(" *   results: " + ", ".join(f"ARKE_{x['dtype'].upper()} rank {len(x['shape'])}"
                                                   for x in r["results"]) + " */")
        lines.append(f"int {r['symbol']}(const arke_tensor *args, int64_t n_args, arke_tensor *results, "
                     "int64_t n_results, int32_t threads, arke_error *err);")
        lines.append(f"int {r['symbol']}_result_shape(const arke_tensor *args, int64_t n_args, int64_t result, "
                     "int64_t *shape, arke_error *err);")
        lines.append("")
    lines += ["#ifdef __cplusplus", "}", "#endif", "#endif", ""]
    return "\n".join(lines)


def _write(out: Path, m: Machine, objects: dict[str, bytes], c_parts: list[str], records: list[dict[str, Any]],
           functions: tuple[S.Function, ...]) -> dict[str, Any]:
    import llvmlite

    import arke

    with staged(out, MANIFEST) as stage, tempfile.TemporaryDirectory(prefix="arke-bundle-") as work_dir:
        work = Path(work_dir)
        for f in ("runtime.c", "runtime.h", HEADER):
            shutil.copy(HERE / f, work / f)
        (work / "kernels.c").write_text('#include <stdlib.h>\n#include <string.h>\n#include "runtime.h"\n\n'
                                        + "\n".join(c_parts))
        for f, data in objects.items():
            (work / f).write_bytes(data)
        command = [*_linker(m), "-O2", "-std=gnu11", "-fPIC", "-shared", "-pthread", "-o", str(stage / LIBRARY),
                   "runtime.c", "kernels.c", *objects, "-lm"]
        done = subprocess.run(command, cwd=work, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BundleError(f"linking the bundle failed ({' '.join(command[:1])} exited {done.returncode}):\n"
                              f"{done.stderr[-4000:]}")
        (stage / HEADER).write_text(_header(records))
        manifest = {
            "format": FORMAT, "version": VERSION, "abi": 1, "arke": arke.__version__,
            "llvmlite": llvmlite.__version__, "triple": m.triple, "arch": m.arch, "cpu": m.cpu,
            "features": sorted(m.flags), "vector_bits": m.vector_bits, "units": sorted(m.units),
            "library": LIBRARY, "header": HEADER, "kernels": records,
            "semantic": json.loads(to_json(S.Module(functions))),
            "files": {f: sha256(stage / f) for f in (LIBRARY, HEADER)},
        }
        (stage / MANIFEST).write_text(json.dumps(stamped(manifest), indent=1, allow_nan=False) + "\n")  # plain JSON
    return manifest
