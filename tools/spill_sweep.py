"""Compile every kernel the repository writes for the GPU targets and list each launch that spills.

    PYTHONPATH=. python tools/spill_sweep.py [--targets triton,cuda] [--archs sm_80,sm_90] [--no-fit]
        [--jobs 2] [--only SUBSTRING] [--jsonl ROWS.jsonl [--resume]] [--spilled EARLIER.jsonl]

Sources: the standard library (``arke/stdlib``), ``examples/*.ak``, ``benchmarks/operators/operators.ak``
and every string literal of ``tests/`` and ``benchmarks/`` that loads as a module (a ``{t}`` template is
tried with ``f32`` and ``i32``). Each kernel (generic ones in every specialisation) is planned for each of
its strategy variants, rendered, compiled ahead of time (no GPU: Triton's ``triton.compile``; NVRTC and
``ptxas`` for ``cuda``) and each launch's spills read from the cubin. Identical renders are compiled once.
Triton launches go through the target's fit step (:mod:`arke.targets.triton.fit`) unless ``--no-fit``.

``--jsonl`` appends each kernel's rows as it finishes (``--resume`` skips kernels already there);
``--spilled`` sweeps only the kernels with a spilling launch in an earlier run's rows (the fit changes
no launch that does not spill). ``PYTHONPATH`` chooses the arke that compiles (another checkout's, for
a before-and-after count); the sources are always this checkout's. The kernels of
``tests/targets/triton/test_triton_fit.py`` spill on purpose and are left out.

Prints one line per spilling launch and a count per target and architecture; exit status 1 when any
launch spills.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Test files whose kernels spill on purpose (the fit step's own tests).
EXCLUDE = ("tests/targets/triton/test_triton_fit.py",)
os.environ.pop("TRITON_INTERPRET", None)  # compile in this process: Triton's functions stay JIT ones


def ak_files() -> list[Path]:
    """The ``.ak`` files of the standard library, the examples and the operator benchmark."""
    return sorted((ROOT / "arke" / "stdlib").glob("*.ak")) + sorted((ROOT / "examples").glob("*.ak")) + [
        ROOT / "benchmarks" / "operators" / "operators.ak"]


def literals() -> Iterator[tuple[str, str]]:
    """(origin, text) of each string literal in tests/ and benchmarks/ that names a kernel."""
    for folder in ("tests", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if str(path.relative_to(ROOT)) in EXCLUDE:
                continue
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and "kernel " in node.value \
                        and "{" in node.value and "->" in node.value:
                    origin = f"{path.relative_to(ROOT)}:{node.lineno}"
                    if "{t}" in node.value:
                        for t in ("f32", "i32"):
                            try:
                                yield f"{origin}[t={t}]", node.value.format(t=t)
                            except (KeyError, IndexError, ValueError):
                                break
                    else:
                        yield origin, node.value


def modules() -> list[tuple[str, str, str]]:
    """(origin, path for the loader, text) of every source that loads without errors."""
    import arke

    out = [(str(p.relative_to(ROOT)), str(p), p.read_text(encoding="utf-8")) for p in ak_files()]
    seen = {text for _, _, text in out}
    for origin, text in literals():
        if text in seen:
            continue
        seen.add(text)
        try:
            arke.loads(text, "<sweep>")
        except Exception:  # a literal that is no module (an error case, a fragment): not a kernel to sweep
            continue
        out.append((origin, "<sweep>", text))
    return out


_MODULES: dict[str, object] = {}


def _load(path: str, text: str) -> object:
    """The module of a source, every generic kernel in each specialisation (once per process)."""
    import arke
    from arke.cli.build import specialised

    if text not in _MODULES:
        module = arke.load(path) if path != "<sweep>" else arke.loads(text, path)
        _MODULES[text] = specialised(module, {})
    return _MODULES[text]


def kernels(sources: list[tuple[str, str, str]]) -> list[tuple[str, str, str, str]]:
    """(origin, path, text, kernel) of every kernel of every source."""
    return [(o, p, t, name) for o, p, t in sources for name in _load(p, t).names]  # type: ignore[attr-defined]


#: Rows of renders compiled already in this process (the same kernel in several sources), without their origin.
_SEEN: dict[str, list[dict[str, object]]] = {}


def sweep_kernel(task: tuple[str, str, str, str, list[str], list[str], bool]) -> list[dict[str, object]]:
    """Every launch of one kernel (each strategy variant), compiled for each target and arch (a row each)."""
    origin, path, text, name, targets, archs, fit = task
    from arke.plan.variants import variants

    module = _load(path, text)
    ir_name = module.kernel_map[name]  # type: ignore[attr-defined]
    rows: list[dict[str, object]] = []
    for target in targets:
        for label, strategy in variants(module, ir_name, target):  # type: ignore[arg-type]
            where = {"origin": origin, "kernel": name, "variant": label, "target": target}
            try:
                rows += _compile(target, module, ir_name, strategy, archs, fit, where)
            except Exception as err:  # a sweep reports every failure and goes on
                rows.append(dict(where, error=f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"))
    return rows or [{"origin": origin, "kernel": name, "target": "-", "variant": "-"}]


def _compile(target: str, module: object, ir_name: str, strategy: object, archs: list[str], fit: bool,
             where: dict[str, object]) -> list[dict[str, object]]:
    from arke.plan.dispatch import make_plan
    from arke.targets.artifact import UnsupportedError

    if target == "triton":
        from arke.targets.triton import aot
        from arke.targets.triton.render import RENDERER as TRITON

        plan = make_plan(module.semantic, ir_name, strategy, families=TRITON.families)  # type: ignore[attr-defined]
        try:
            artifact = TRITON.render(plan)
        except UnsupportedError:
            return []
        key = "triton" + repr((artifact.source, artifact.launches, archs, fit))
        if key in _SEEN:
            return [dict(where, **r) for r in _SEEN[key]]
        if fit:
            from arke.targets.triton.fit import fit_plan

            entries = fit_plan(plan, archs, check=False).entries
        else:
            entries = aot.compile_artifact_archs(artifact, plan, archs, check=False)
        _SEEN[key] = [{"entry": e.entry, "arch": e.arch, "registers": e.registers, "spills": e.spills,
                       "options": dict(e.options)} for e in entries]
        return [dict(where, **r) for r in _SEEN[key]]
    from arke.targets.cuda import nvrtc
    from arke.targets.cuda.render import RENDERER as CUDA
    from arke.targets.nvidia.ptx import ptx_resources

    plan = make_plan(module.semantic, ir_name, strategy, families=CUDA.families)  # type: ignore[attr-defined]
    try:
        artifact = CUDA.render(plan)
    except UnsupportedError:
        return []
    key = "cuda" + artifact.source
    if key not in _SEEN:
        _SEEN[key] = []
        for arch in archs:
            ptx = nvrtc.compile_ptx(artifact.source, arch, kernel=plan.name, plan=plan)
            _SEEN[key] += [{"entry": r.entry, "arch": arch, "registers": r.registers, "spills": r.spills,
                            "options": {}} for r in ptx_resources(ptx, arch)]
    return [dict(where, **r) for r in _SEEN[key]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="triton,cuda")
    parser.add_argument("--archs", default="sm_80,sm_90")
    parser.add_argument("--no-fit", action="store_true", help="compile Triton launches at their rendered options")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", default="", help="sweep only sources whose origin contains this")
    parser.add_argument("--jsonl", help="append every row (spilling or not) to this file, kernel by kernel")
    parser.add_argument("--resume", action="store_true", help="skip the kernels --jsonl has already")
    parser.add_argument("--spilled", help="sweep only the kernels with a spilling launch in these earlier rows")
    args = parser.parse_args()
    targets, archs = args.targets.split(","), args.archs.split(",")
    done: list[dict[str, object]] = []
    if args.resume and args.jsonl and Path(args.jsonl).exists():
        done = [json.loads(line) for line in Path(args.jsonl).read_text(encoding="utf-8").splitlines() if line]
    skip = {(r["origin"], r["kernel"]) for r in done}
    wanted = None
    if args.spilled:
        earlier = [json.loads(line) for line in Path(args.spilled).read_text(encoding="utf-8").splitlines() if line]
        wanted = {(r["origin"], r["kernel"]) for r in earlier if r.get("spills")}
    tasks = [(o, p, t, k, targets, archs, not args.no_fit) for o, p, t, k in kernels(modules())
             if args.only in o and (o, k) not in skip and (wanted is None or (o, k) in wanted)]
    print(f"{len(tasks)} kernels", file=sys.stderr)
    rows = list(done)
    out = open(args.jsonl, "a", encoding="utf-8") if args.jsonl else None  # noqa: SIM115 - kept open while sweeping
    with Pool(args.jobs) as pool:
        for part in pool.imap(sweep_kernel, tasks):
            rows += part
            if out is not None:
                out.write("".join(json.dumps(r) + "\n" for r in part))
                out.flush()
    if out is not None:
        out.close()
    report(rows)
    return 1 if any(r.get("spills") for r in rows) else 0


def report(rows: list[dict[str, object]]) -> None:
    """Each spilling launch, each failure, and the counts per target and arch."""
    rows = [r for r in rows if r.get("target") != "-"]
    spilling = [r for r in rows if r.get("spills")]
    for r in sorted(spilling, key=lambda r: (str(r["target"]), str(r["origin"]), str(r["kernel"]), str(r["arch"]))):
        print(f"{r['target']:6} {r['arch']} {r['spills']:4} spills {r['registers']:3} regs  {r['origin']} "
              f"{r['kernel']} ({r['variant']}) {r['entry']} {r['options']}")
    for r in rows:
        if "error" in r:
            print(f"{r['target']:6} error  {r['origin']} {r['kernel']} ({r['variant']}): {r['error']}")
    launches = Counter((str(r["target"]), str(r["arch"])) for r in rows if "error" not in r)
    spills = Counter((str(r["target"]), str(r["arch"])) for r in spilling)
    for (target, arch), n in sorted(launches.items()):
        print(f"{target} {arch}: {spills[(target, arch)]} of {n} launches spill")


if __name__ == "__main__":
    sys.exit(main())
