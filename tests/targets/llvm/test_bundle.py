"""Bundles (``akc build --target llvm --bundle``): built here, loaded without the compiler, called from
Python and from C, and refused when they cannot run.

The stdlib's conformance cases run on bundles of every stdlib module against the interpreter (the
tolerance rule); std.nn's are bit-identical to ``arke.build``'s kernels. The C guards give the Python
guards' rules and messages; a process where the compiler cannot be imported loads and runs a bundle.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from bundle_support import as_tensors, compile_example, write_case
from codegen_support import LAYER_DTYPES, assert_conforms, kernel_names, random_inputs, same_bits, seeded, std_module

import arke
from arke.lang.checker import stdlib_path
from arke.runtime.bundle import BundleError, load_bundle
from arke.runtime.bundle_files import stamped
from arke.runtime.guards import prepare_args
from arke.runtime.tolerance import results, tolerance
from arke.targets.llvm.bundle.build import BundleError as BuildError
from arke.targets.llvm.bundle.build import build_bundle

ROOT = Path(__file__).resolve().parents[3]


def _tests_of(name: str) -> Any:
    """A test module of tests/targets, by file name, for its tables (the conformance cases, dim parameters)."""
    spec = importlib.util.spec_from_file_location(f"bundle_{name}", ROOT / "tests" / "targets" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules.setdefault(f"bundle_{name}", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


CASES = _tests_of("test_conformance").CASES
#: std.deepseek's kernels run from bundles in tests/models/test_deepseek.py (its model bundle)
MODULES = sorted({c.module for c in CASES} - {"std.deepseek"})

VARIANTS = """
kernel scale(x: f32[M, N], w: f32[N]) -> f32[M, N] where N % 4 == 0 {
  return x[m, n] * w[n] + 1.0
}

kernel pick(x: f32[N], ids: i32[K]) -> f32[K] {
  return x[ids[k]]
}

@strategy(scale, target = llvm, when N % 64 == 0) {
  parallel m
  vectorize n = 16
}

@strategy(scale, target = llvm) {
  parallel m
}
"""


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {}


def _bundle(cache: dict[str, Path], tmp: pytest.TempPathFactory, module: str) -> Path:
    if module not in cache:
        mod = std_module(module)
        out = tmp.mktemp("bundle") / module
        build_bundle(mod, out, kernel_names(mod, ("f32",) if module == "std.decoder" else LAYER_DTYPES))
        cache[module] = out
    return cache[module]


@pytest.mark.parametrize("module", MODULES)
def test_stdlib_bundle_matches_interpreter(module: str, bundles: dict[str, Path],
                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    lib = load_bundle(_bundle(bundles, tmp_path_factory, module))
    mod = std_module(module)
    ran = 0
    for case in (c for c in CASES if c.module == module):
        if case.member not in lib.kernels:
            continue  # a specialisation outside LAYER_DTYPES
        reference = mod.kernels[case.kernel]
        if case.dtypes:
            reference = reference.specialise(**case.dtypes)
        args = random_inputs(reference, case.dims, seeded(case.id), ids=case.ids, ties=case.ties)
        got = lib.kernels[case.member](*args, **case.scalars)
        assert_conforms(got, reference, *args, what=f"bundle {case.id}", **case.scalars)
        ran += 1
    assert ran, f"no case ran on the bundle of {module}"


def test_bundle_is_bit_identical_to_build(bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    lib = load_bundle(_bundle(bundles, tmp_path_factory, "std.nn"))
    mod = std_module("std.nn")
    jit = arke.build(mod, target="llvm")
    for case in (c for c in CASES if c.module == "std.nn" and not c.dtypes):
        args = random_inputs(mod.kernels[case.kernel], case.dims, seeded(case.id), ids=case.ids, ties=case.ties)
        want = jit.kernels[case.kernel](*args, **case.scalars)
        for threads in (1, 2, 3):
            got = lib.kernels[case.kernel](*args, threads=threads, **case.scalars)
            assert same_bits(got, want), f"{case.id} threads={threads}"


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, arke.Module]:
    mod = arke.loads(VARIANTS, "<variants>")
    out = tmp_path_factory.mktemp("variants") / "b"
    build_bundle(mod, out)
    return out, mod


def test_manifest_records_variants_signature_and_checksums(variants: tuple[Path, arke.Module]) -> None:
    path, _ = variants
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format"] == "arke.bundle" and manifest["version"] == 1 and manifest["arch"] == "x86_64"
    scale = next(k for k in manifest["kernels"] if k["name"] == "scale")
    assert [v["when"] for v in scale["variants"]] == ["N % 64 == 0", None]
    assert scale["where"] == ["N % 4 == 0"]
    assert [p["shape"] for p in scale["params"]] == [["M", "N"], ["N"]]
    assert set(manifest["files"]) == {"libarke_bundle.so", "arke_bundle.h"}
    header = (path / "arke_bundle.h").read_text()
    assert "int arke_scale(const arke_tensor *args" in header and "where N % 4 == 0" in header


@pytest.mark.parametrize("n", [4, 64, 4100])
def test_each_variant_runs(variants: tuple[Path, arke.Module], n: int) -> None:
    path, mod = variants
    lib = load_bundle(path)
    x, w = torch.randn(3, n), torch.randn(n)
    assert_conforms(lib.scale(x, w), mod.kernels["scale"], x, w)


def _error(call: Any) -> arke.GuardError:
    with pytest.raises(arke.GuardError) as info:
        call()
    return info.value


def test_c_guards_give_the_python_rules_and_messages(variants: tuple[Path, arke.Module]) -> None:
    path, mod = variants
    kernel = load_bundle(path).scale
    jit = arke.build(mod, target="llvm").scale
    x, w = torch.randn(3, 8), torch.randn(8)
    bad = [[x, torch.randn(5)], [torch.randn(3, 6), torch.randn(6)], [torch.randn(8), w], [x.half(), w], [x]]
    for args in bad:
        want = _error(lambda args=args: jit(*args))
        # the library's own guards, with the Python guards bypassed (what a C caller meets)
        got = _error(lambda args=args: kernel.run_tensors(list(args), [torch.empty(3, 8)], 1))
        if want.rule in ("missing", "arity"):  # a C call passes every parameter: a count that is not is `arity`
            assert got.rule == "arity" and "takes 2 arguments (x, w), but 1 were given" in str(got)
            continue
        assert (got.rule, got.param, type(got)) == (want.rule, want.param, type(want))
        if want.rule == "dtype":  # dtypes are named, and the advice given, in the caller's language
            assert str(got).split(", but")[0] == str(want).split(", but")[0]
        else:
            assert str(got) == str(want)
    out_bad = _error(lambda: kernel.run_tensors([x, w], [torch.empty(3, 9)], 1))
    assert out_bad.rule == "dim" and out_bad.param == "out"
    overlap = _error(lambda: kernel.run_tensors([x, w], [x], 1))
    assert "overlaps" in str(overlap)


def test_out_and_a_failing_call(variants: tuple[Path, arke.Module]) -> None:
    path, mod = variants
    lib = load_bundle(path)
    x, w = torch.randn(4, 8), torch.randn(8)
    out = torch.empty(4, 8)
    assert lib.scale(x, w, out=out) is out
    assert same_bits(out, arke.build(mod, target="llvm").scale(x, w))
    table = torch.randn(10)
    good = lib.pick(table, torch.tensor([0, 9, 3], dtype=torch.int32))
    assert torch.equal(good, table[[0, 9, 3]])
    target = torch.full((3,), 7.0)
    err = _error(lambda: lib.pick(table, torch.tensor([0, 10, 3], dtype=torch.int32), out=target))
    assert err.rule == "index"
    # the interpreter explains it, as arke.build does (its SemanticIR was looked up as a dict, and never found)
    assert "subscript 0 of `x` is 10, outside its axis 0 of size 10" in str(err), err
    assert torch.equal(target, torch.full((3,), 7.0)), "a failed call wrote its out="
    assert isinstance(lib.scale(x.numpy(), w.numpy()), np.ndarray)


def test_calls_from_several_threads(variants: tuple[Path, arke.Module]) -> None:
    path, mod = variants
    lib = load_bundle(path)
    jit = arke.build(mod, target="llvm").scale
    x, w = torch.randn(64, 256), torch.randn(256)
    want = jit(x, w)
    failures: list[str] = []

    def run() -> None:
        for _ in range(20):
            if not same_bits(lib.scale(x, w, threads=2), want):
                failures.append("differs")

    workers = [threading.Thread(target=run) for _ in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not failures


def _copy(path: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(path, tmp_path / "copy"))


def test_refusals(variants: tuple[Path, arke.Module], tmp_path: Path) -> None:
    path, _ = variants
    with pytest.raises(BundleError, match="not a bundle folder"):
        load_bundle(tmp_path)
    copy = _copy(path, tmp_path)
    lib = copy / "libarke_bundle.so"
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"libarke_bundle\.so does not match its checksum"):
        load_bundle(copy)
    shutil.rmtree(copy)
    for change, message in [({"version": 7}, "format version 7 is unknown"),
                            ({"features": ["avx512f", "avx9000"]}, "this CPU lacks avx9000"),
                            ({"arch": "riscv64"}, "built for riscv64"),
                            ({"format": "zip"}, "not an Arke bundle")]:
        copy = _copy(path, tmp_path)
        manifest = json.loads((copy / "manifest.json").read_text())
        manifest.update(change)  # as a build for another machine (or another Arke) writes it: digest and all
        (copy / "manifest.json").write_text(json.dumps(stamped(manifest)))
        with pytest.raises(BundleError, match=message):
            load_bundle(copy)
        shutil.rmtree(copy)


def test_build_refusals(tmp_path: Path) -> None:
    mod = arke.load(ROOT / "examples" / "rmsnorm.ak")
    with pytest.raises(BuildError, match="--cpu pentium is not one"):
        build_bundle(mod, tmp_path / "b", cpu="pentium")
    with pytest.raises(BuildError, match="no kernel `nope`"):
        build_bundle(mod, tmp_path / "b", ["nope"])
    with pytest.raises(BuildError, match="is an aarch64 CPU"):
        build_bundle(mod, tmp_path / "b", cpu="neoverse-n1", triple="x86_64-linux-gnu")
    # an architecture Arke knows no CPU of: said so (it offered "--cpu (one of: )", and refused every CPU)
    with pytest.raises(BuildError, match="bundles for aarch64 and x86_64 CPUs, not for riscv64"):
        build_bundle(mod, tmp_path / "b", triple="riscv64-linux-gnu")
    assert not (tmp_path / "b").exists()


_BLOCKED = """
import importlib.abc, sys
BLOCKED = ("llvmlite", "lark", "sympy", "arke.lang", "arke.passes", "arke.plan", "arke.targets", "arke.tune",
           "arke.api", "arke.library")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError(f"{name} may not be imported to load a bundle")
sys.meta_path.insert(0, Block())
import numpy as np, torch, arke
lib = arke.load_bundle(sys.argv[1])
x, w = torch.from_numpy(np.load(sys.argv[2])), torch.from_numpy(np.load(sys.argv[3]))
got = lib.scale(x, w)
assert torch.equal(got, torch.from_numpy(np.load(sys.argv[4]))), "differs from arke.build"
try:
    lib.scale(x, w[:4])
except arke.ShapeError as err:
    print(err)
print("loaded without", [m for m in sys.modules if m.startswith(BLOCKED)])
"""


def test_loads_and_runs_without_the_compiler(variants: tuple[Path, arke.Module], tmp_path: Path) -> None:
    path, mod = variants
    x, w = torch.randn(5, 64), torch.randn(64)
    for name, value in [("x", x), ("w", w), ("want", arke.build(mod, target="llvm").scale(x, w))]:
        np.save(tmp_path / f"{name}.npy", value.numpy())
    done = subprocess.run([sys.executable, "-c", _BLOCKED, str(path), *(str(tmp_path / f"{n}.npy")
                                                                        for n in ("x", "w", "want"))],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "N = 64 from `x` axis 1, but `w` axis 0 has 4" in done.stdout
    assert "loaded without []" in done.stdout


def _case_file(mod: arke.Module, name: str, dims: dict[str, int], at: Path, **scalars: Any) -> Path:
    kernel = mod.kernels[name]
    args = random_inputs(kernel, dims, seeded("c", name, dims))
    prepared, _, _ = prepare_args(kernel.function, args, scalars)
    want = as_tensors(results(kernel(*args, **scalars)))
    return write_case(at, list(prepared.values()), want, tolerance(kernel, args, scalars))


C_CASES = [("examples/rmsnorm.ak", "rmsnorm", {"M": 3, "N": 4097}), ("examples/matmul.ak", "mm", {"M": 3, "K": 33,
                                                                                                    "N": 17})]


def _run_c(cases: list[tuple[str, str, dict[str, int]]], tmp_path: Path, cpu: str | None, compiler: str,
           runner: list[str]) -> None:
    for source, name, dims in cases:
        mod = arke.load(ROOT / source)
        bundle = tmp_path / f"{name}-bundle"
        build_bundle(mod, bundle, [name], cpu=cpu)
        exe = compile_example(bundle, tmp_path / f"run_{name}", compiler)
        case = _case_file(mod, name, dims, tmp_path / f"{name}.case")
        for threads in ("1", "2"):
            done = subprocess.run([*runner, str(exe), str(bundle), name, str(case), threads], capture_output=True,
                                  text=True, timeout=300)
            assert done.returncode == 0 and done.stdout.startswith("ok"), done.stdout + done.stderr


def test_c_example_runs_a_bundle(tmp_path: Path) -> None:
    if not shutil.which("cc"):
        pytest.skip("no C compiler (cc) here")
    _run_c(C_CASES, tmp_path, None, "cc", [])
    # a bad call from C: the Python guards' rule and message
    mod = arke.load(ROOT / "examples" / "rmsnorm.ak")
    bundle = tmp_path / "rmsnorm-bundle"
    x, w, eps = torch.randn(3, 8), torch.randn(5), torch.tensor(1e-6)
    case = write_case(tmp_path / "bad.case", [x, w, eps], [torch.empty(3, 8)], [None])
    done = subprocess.run([str(tmp_path / "run_rmsnorm"), str(bundle), "rmsnorm", str(case)], capture_output=True,
                          text=True, timeout=60)
    want = _error(lambda: arke.build(mod, target="llvm").rmsnorm(x, w))
    assert done.returncode == 3 and done.stdout.strip() == f"error 2 dim: {want}"


QEMU_CASES = [*C_CASES, (str(stdlib_path("std.nn")), "softmax", {"M": 5, "N": 33}),
              (str(stdlib_path("std.nn")), "gelu", {"M": 3, "N": 4097}),
              (str(stdlib_path("std.nn")), "linear", {"M": 2, "K": 129, "N": 33})]


@pytest.mark.parametrize("cpu", ["neoverse-n1", "neoverse-v1"])
def test_aarch64_bundle_runs_under_qemu(cpu: str, tmp_path: Path) -> None:
    missing = [t for t in ("qemu-aarch64", "aarch64-linux-gnu-gcc") if not shutil.which(t)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (Debian: qemu-user, gcc-aarch64-linux-gnu; "
                    "make setup installs them where it may)")
    _run_c(QEMU_CASES, tmp_path, cpu, "aarch64-linux-gnu-gcc", ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"])


DIM_PARAMS = _tests_of("test_dim_params_targets").DIMS  # group_norm, last_k and grid: dim parameters


def test_dim_parameters_and_scalars(tmp_path: Path) -> None:
    mod = arke.loads(DIM_PARAMS, "<dims>")
    build_bundle(mod, tmp_path / "b")
    lib, jit = load_bundle(tmp_path / "b"), arke.build(mod, target="llvm")
    x, w, b = torch.randn(3, 64, 17), torch.randn(64), torch.randn(64)
    for groups in (1, 4, 32):
        assert same_bits(lib.group_norm(x, w, b, groups), jit.group_norm(x, w, b, groups))
    assert same_bits(lib.group_norm(x, w, b, eps=0.5), jit.group_norm(x, w, b, eps=0.5))
    t = torch.randn(4, 4097)
    assert same_bits(lib.last_k(t, 5), jit.last_k(t, 5))
    assert torch.equal(torch.as_tensor(lib.grid(4, K=torch.tensor(2))), torch.as_tensor(jit.grid(4, K=2)))
    bad = [lambda k: k.group_norm(x, w, b, 0), lambda k: k.group_norm(x, w, b, 5),
           lambda k: k.group_norm(x, w, b, eps="big"), lambda k: k.group_norm(x, w, b, 4, True),
           lambda k: k.last_k(t, 5000), lambda k: k.group_norm(x, w), lambda k: k.group_norm(x, w, b, G=2, g=3),
           lambda k: k.grid(2.5), lambda k: k.group_norm(x.numpy().astype(np.float64), w, b)]
    for call in bad:
        want, got = _error(lambda call=call: call(jit)), _error(lambda call=call: call(lib))
        assert (type(got), got.rule, got.param, str(got)) == (type(want), want.rule, want.param, str(want))


def test_prepacked_panels(bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    from arke.runtime.panels import pack_panels
    from arke.targets.llvm.jit import host_panel_width

    lib = load_bundle(_bundle(bundles, tmp_path_factory, "std.nn"))
    jit = arke.build(std_module("std.nn"), target="llvm")
    x, w = torch.randn(37, 129), torch.randn(4097, 129)
    packed = pack_panels(w, host_panel_width())
    want = jit.linear(x, w)
    assert same_bits(lib.linear(x, packed), jit.linear(x, packed))
    assert same_bits(lib.linear(x, packed), want) or torch.allclose(lib.linear(x, packed), want, atol=1e-4)
    err = _error(lambda: lib.add(packed, packed[0]))
    assert err.rule == "dim" and "holds prepacked panels" in str(err)


def test_a_bundle_rebuilt_in_place_loads_its_new_code(tmp_path: Path) -> None:
    first = arke.loads("kernel f(x: f32[N]) -> f32[N] { return x[n] + 1.0 }", "<one>")
    second = arke.loads("kernel f(x: f32[N]) -> f32[N] { return x[n] * 2.0 }", "<two>")
    x = torch.arange(4.0)
    build_bundle(first, tmp_path / "b")
    assert torch.equal(load_bundle(tmp_path / "b").f(x), x + 1)
    build_bundle(second, tmp_path / "b")
    assert torch.equal(load_bundle(tmp_path / "b").f(x), x * 2)


def test_a_bundle_never_replaces_what_is_not_a_bundle(tmp_path: Path) -> None:
    """A file, a folder of the user's, or a bundle folder holding a file of the user's is refused before
    anything is written; an empty folder and a bundle are replaced."""
    mod = arke.loads("kernel f(x: f32[N]) -> f32[N] { return x[n] + 1.0 }", "<one>")
    (tmp_path / "file.txt").write_text("keep")
    with pytest.raises(BundleError, match="not a folder"):
        build_bundle(mod, tmp_path / "file.txt")
    assert (tmp_path / "file.txt").read_text() == "keep"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("keep")
    with pytest.raises(BundleError, match="not a bundle"):
        build_bundle(mod, tmp_path / "mine")
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["thesis.tex"]
    (tmp_path / "empty").mkdir()
    build_bundle(mod, tmp_path / "empty")
    (tmp_path / "empty" / "notes.md").write_text("keep")
    with pytest.raises(BundleError, match=r"did not write \(notes\.md\)"):
        build_bundle(mod, tmp_path / "empty")
    assert (tmp_path / "empty" / "notes.md").read_text() == "keep"
    (tmp_path / "empty" / "notes.md").unlink()
    build_bundle(mod, tmp_path / "empty")
    assert torch.equal(load_bundle(tmp_path / "empty").f(torch.zeros(2)), torch.ones(2))


def test_the_c_abi_refuses_null_arrays_and_reads_no_extent_past_the_rank(tmp_path: Path) -> None:
    """NULL argument, result and shape arrays are errors with their own words (one crashed), an ndim above
    the rank is reported without reading the caller's shape array, and an empty tensor (no data) is the dims'
    error, not a missing argument."""
    import ctypes

    from arke.runtime import bundle as rt

    mod = arke.load(ROOT / "examples" / "rmsnorm.ak")
    build_bundle(mod, tmp_path / "b", ["rmsnorm"])
    lib = ctypes.CDLL(str(tmp_path / "b" / "libarke_bundle.so"))
    x, w, eps = torch.randn(3, 8), torch.randn(8), torch.tensor(1e-6)
    keep: list[object] = []
    args = (rt._Tensor * 3)(*(rt._tensor(t, keep) for t in (x, w, eps)))
    err = rt._Error()
    assert lib.arke_rmsnorm_result_shape(args, ctypes.c_int64(3), ctypes.c_int64(0), None, ctypes.byref(err)) == 1
    assert b"shape is NULL" in err.message
    out = (rt._Tensor * 1)(rt._tensor(torch.empty(3, 8), keep))
    assert lib.arke_rmsnorm(None, ctypes.c_int64(3), out, ctypes.c_int64(1), 1, ctypes.byref(err)) == 1
    assert b"the array of arguments is NULL" in err.message
    assert lib.arke_rmsnorm(args, ctypes.c_int64(3), None, ctypes.c_int64(1), 1, ctypes.byref(err)) == 1
    assert b"the array of results is NULL" in err.message
    args[0].ndim = 1000  # the shape array holds 2: nothing past it is read
    assert lib.arke_rmsnorm(args, ctypes.c_int64(3), out, ctypes.c_int64(1), 1, ctypes.byref(err)) == 2
    assert err.message.decode().endswith("but was given rank 1000 (or no shape)")
    lib_py = load_bundle(tmp_path / "b")
    with pytest.raises(arke.GuardError, match="M = 0 from `x` axis 0: dims must be at least 1"):
        lib_py.rmsnorm(torch.empty(0, 8), w)


@pytest.mark.parametrize("edit", ["features", "dim", "dtype", "kernels"])
def test_a_manifest_edited_out_of_shape_is_a_bundle_error(variants: tuple[Path, arke.Module], tmp_path: Path,
                                                          edit: str) -> None:
    """A field of the wrong kind, even in a manifest whose digest was stamped again by hand, is a BundleError at
    load, never a raw TypeError or KeyError at a call."""
    path, _ = variants
    copy = Path(shutil.copytree(path, tmp_path / "b"))
    manifest = json.loads((copy / "manifest.json").read_text())
    if edit == "features":
        manifest["features"] = None
    elif edit == "kernels":
        manifest["kernels"] = {}
    else:
        param = manifest["kernels"][0]["params"][0]
        if edit == "dim":
            del param["dim"]
        else:
            param["dtype"] = "f64"
    (copy / "manifest.json").write_text(json.dumps(stamped(manifest)))
    with pytest.raises(BundleError, match=r"manifest\.json is malformed"):
        load_bundle(copy)


def test_a_result_rank_edited_lower_is_caught_before_it_is_used(variants: tuple[Path, arke.Module],
                                                                 tmp_path: Path) -> None:
    """The library writes a result's whole shape: a manifest that says fewer axes must not let it write past
    the buffer unnoticed."""
    path, _ = variants
    copy = Path(shutil.copytree(path, tmp_path / "b"))
    manifest = json.loads((copy / "manifest.json").read_text())
    record = next(k for k in manifest["kernels"] if k["name"].startswith("scale"))
    record["results"][0]["shape"] = record["results"][0]["shape"][:1]
    (copy / "manifest.json").write_text(json.dumps(stamped(manifest)))  # stamped again: the library's own check
    with pytest.raises(BundleError, match="the manifest was changed"):
        load_bundle(copy).kernels[record["name"]](torch.randn(3, 8), torch.randn(8))


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_a_manifest_that_is_no_regular_file_is_refused_without_reading_it(
        variants: tuple[Path, arke.Module], tmp_path: Path, kind: str) -> None:
    """A FIFO would block the load, /dev/zero would be read until memory runs out, a sparse file of 2**40
    bytes likewise: each is a BundleError (in a child process, so a regression hangs nothing but it)."""
    import os

    path, _ = variants
    copy = Path(shutil.copytree(path, tmp_path / "b"))
    (copy / "manifest.json").unlink()
    if kind == "fifo":
        os.mkfifo(copy / "manifest.json")
    elif kind == "device":
        (copy / "manifest.json").symlink_to("/dev/zero")
    else:
        with open(copy / "manifest.json", "wb") as f:
            f.truncate(1 << 40)
    code = (f"import arke\ntry:\n    arke.load_bundle({str(copy)!r})\n"
            "except arke.runtime.bundle.BundleError as e:\n    print('refused:', e)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "refused:" in run.stdout, run.stdout + run.stderr
    assert "not a regular file" in run.stdout or "more than" in run.stdout, run.stdout


def test_a_dim_parameter_sets_the_result_shape_at_every_call(tmp_path: Path) -> None:
    mod = arke.loads("kernel tile(x: f32[M], G: dim) -> y: f32[M, G] {\n  y[m, g] = x[m] + f32(g)\n}", "<tile>")
    build_bundle(mod, tmp_path / "b")
    lib = load_bundle(tmp_path / "b")
    x = torch.arange(4.0)
    for g in (2, 3, 2, 5):
        assert torch.equal(lib.tile(x, g), x[:, None] + torch.arange(float(g)))


def test_akc_build_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from arke.cli import app

    def akc(*args: str) -> tuple[int, str, str]:
        status = app.main(list(args))
        out, err = capsys.readouterr()
        return status, out, err

    rmsnorm = str(ROOT / "examples" / "rmsnorm.ak")
    status, out, _ = akc("build", rmsnorm, "--bundle", str(tmp_path / "b"), "--kernel", "rmsnorm", "--kernel",
                         "softmax", "--cpu", "x86-64-v3")
    assert status == 0 and "arke_rmsnorm: 1 variant" in out and "CPU x86-64-v3" in out
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["vector_bits"] == 256 and "avx2" in manifest["features"]
    x = torch.randn(3, 17)
    assert torch.allclose(load_bundle(tmp_path / "b").softmax(x), torch.softmax(x, 1), atol=1e-6)
    for args, message in [(("--bundle", str(tmp_path / "c"), "--target", "triton"), "llvm target"),
                          (("--cpu", "znver4"), "--cpu and --triple are for bundles"),
                          (("--bundle", str(tmp_path / "c"), "--cpu", "486"), "--cpu 486 is not one"),
                          (("--kernel", "rmsnorm", "--kernel", "softmax"), "one kernel, except with --bundle"),
                          (("--bundle", str(tmp_path / "c"), "--emit", "asm"), "leave out --emit")]:
        status, _, err = akc("build", rmsnorm, *args)
        assert status == 2 and message in err, err
    assert not (tmp_path / "c").exists()
