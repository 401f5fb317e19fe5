"""Bundles and names: a relative folder, C symbols two kernels (or a kernel and the ABI) would share, a
generic kernel called by its own name, a manifest that is plain JSON with infinite defaults and names each
kernel once, another tool's manifest.json left alone, a folder with the umask's mode, and a header C++
includes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import arke
from arke.runtime.bundle import BundleError, load_bundle
from arke.runtime.bundle_files import stamped
from arke.targets.llvm.bundle.build import BundleError as BuildError
from arke.targets.llvm.bundle.build import build_bundle

CLAMP = "kernel clampish(x: f32[N], lo: f32 = -inf, hi: f32 = inf) -> f32[N] { return max(min(x[n], hi), lo) }\n"


def test_a_relative_folder_is_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    build_bundle(arke.loads(CLAMP, "<clamp>"), "out/clamp")
    assert load_bundle(tmp_path / "out" / "clamp").clampish(np.array([-5.0, 5.0], np.float32), hi=1.0).tolist() == \
        [-5.0, 1.0]


@pytest.mark.parametrize("source", [
    "kernel bundle_abi_version(x: f32[N]) -> f32[N] { return x }\n",
    "kernel foo(x: f32[N]) -> f32[N] { return x }\nkernel foo_result_shape(x: f32[N]) -> f32[N] { return x }\n",
])
def test_kernels_whose_c_symbols_collide_are_refused_by_name(source: str, tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="would export the C symbol"):
        build_bundle(arke.loads(source, "<names>"), tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_a_generic_kernel_is_called_by_its_name(tmp_path: Path) -> None:
    src = "kernel scaled(w: W[N], s: f32) -> W[N] where W in {f32, f16} { return W(f32(w[n]) * s) }\n"
    mod = arke.loads(src, "<scaled>")
    build_bundle(mod, tmp_path / "b", kernels=[n for n in mod.kernel_map if n.startswith("scaled__")])
    lib = load_bundle(tmp_path / "b")
    assert lib.scaled(np.ones(3, np.float32), 2.0).dtype == np.float32
    half = lib.scaled(np.ones(3, np.float16), 2.0)
    assert half.dtype == np.float16 and half.tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(arke.GuardError, match="no specialisation"):
        lib.scaled(np.ones(3, np.int32), 2.0)


def test_infinite_defaults_keep_the_manifest_plain_json(tmp_path: Path) -> None:
    build_bundle(arke.loads(CLAMP, "<clamp>"), tmp_path / "b")
    text = (tmp_path / "b" / "manifest.json").read_text()
    manifest = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert [p["default"] for p in manifest["kernels"][0]["params"][1:]] == ["-inf", "inf"]
    assert load_bundle(tmp_path / "b").clampish(np.array([-5.0, 5.0], np.float32)).tolist() == [-5.0, 5.0]


def test_a_kernel_listed_twice_in_the_manifest_is_refused(tmp_path: Path) -> None:
    build_bundle(arke.loads(CLAMP + CLAMP.replace("clampish", "other"), "<two>"), tmp_path / "b")
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    manifest["kernels"][1]["name"] = manifest["kernels"][0]["name"]
    (tmp_path / "b" / "manifest.json").write_text(json.dumps(stamped(manifest)))
    with pytest.raises(BundleError, match="listed twice"):
        load_bundle(tmp_path / "b")


def test_another_tools_manifest_is_not_replaced(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "manifest.json").write_text(json.dumps({"name": "web-app", "files": {"precious.dat": "x"}}))
    (app / "precious.dat").write_text("keep me")
    with pytest.raises(BundleError, match="not an Arke bundle's"):
        build_bundle(arke.loads(CLAMP, "<clamp>"), app)
    assert (app / "precious.dat").read_text() == "keep me"


def test_the_folder_has_the_umask_mode(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        build_bundle(arke.loads(CLAMP, "<clamp>"), tmp_path / "b")
    finally:
        os.umask(old)
    assert (tmp_path / "b").stat().st_mode & 0o777 == 0o755


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler (g++) to include the header from C++")
def test_the_header_links_from_cpp(tmp_path: Path) -> None:
    build_bundle(arke.loads(CLAMP, "<clamp>"), tmp_path / "b")
    main = tmp_path / "main.cpp"
    main.write_text('#include "arke_bundle.h"\n#include <cstdio>\n'
                    'int main() { std::printf("%d\\n", (int)arke_bundle_abi_version()); return 0; }\n')
    done = subprocess.run(["g++", "-I", str(tmp_path / "b"), str(main), "-o", str(tmp_path / "m"), "-L",
                           str(tmp_path / "b"), "-larke_bundle", f"-Wl,-rpath,{tmp_path / 'b'}"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert subprocess.run([str(tmp_path / "m")], capture_output=True, text=True, check=True).stdout.strip() == "1"


TWO = ("kernel f(x: f32[N]) -> f32[N] { return x[n] + 1.0 }\n"
       "kernel g(x: f32[N], s: f32 = 10.0) -> f32[N] { return x[n] * s }\n")


@pytest.mark.parametrize("edit", ["symbols", "default", "semantic", "digest"])
def test_a_manifest_edited_after_the_build_is_refused(tmp_path: Path, edit: str) -> None:
    """The checksums cover the library, the digest the manifest itself: kernels' symbols swapped, a default
    changed or the SemanticIR removed would run (wrongly, or fail later with a raw error)."""
    build_bundle(arke.loads(TWO, "<two>"), tmp_path / "b")
    path = tmp_path / "b" / "manifest.json"
    manifest = json.loads(path.read_text())
    assert load_bundle(tmp_path / "b").f(np.ones(2, np.float32)).tolist() == [2.0, 2.0]
    f, g = manifest["kernels"]
    if edit == "symbols":
        f["symbol"], g["symbol"] = g["symbol"], f["symbol"]
    elif edit == "default":
        g["params"][1]["default"] = 100.0
    elif edit == "semantic":
        del manifest["semantic"]
    else:
        del manifest["digest"]
    path.write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"manifest\.json: it (was edited after the build|has no digest)"):
        load_bundle(tmp_path / "b")


def test_staged_files_get_the_umask_modes_and_saves_at_once_take_turns(tmp_path: Path) -> None:
    """A writer's private file (safetensors writes 0600) is shipped with the umask's mode; saves into one folder
    from several threads at once each land whole, one after the other."""
    import stat
    import threading

    from arke.runtime.bundle_files import _umask, staged

    out = tmp_path / "b"
    with staged(out, "manifest.json") as stage:
        (stage / "manifest.json").write_text(json.dumps({"format": "arke.test", "files": {"w.bin": "x"}}))
        private = stage / "w.bin"
        private.write_bytes(b"w")
        private.chmod(0o600)
    assert stat.S_IMODE((out / "w.bin").stat().st_mode) == 0o666 & ~_umask()
    errors: list[BaseException] = []

    def save(k: int) -> None:
        try:
            for j in range(15):
                with staged(out, "manifest.json") as stage:
                    (stage / "manifest.json").write_text(json.dumps({"format": "arke.test", "files": {},
                                                                     "by": [k, j]}))
        except BaseException as err:  # collected for the assertion below
            errors.append(err)

    threads = [threading.Thread(target=save, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert json.loads((out / "manifest.json").read_text())["by"][1] == 14


def test_two_dtype_variables_are_read_back_and_refusals_name_them(tmp_path: Path) -> None:
    src = ("kernel mix(a: A[N], b: B[N]) -> f32[N] where A in {f32, f16}, B in {i8, u8} "
           "{ return f32(a[n]) + f32(b[n]) }\n")
    mod = arke.loads(src, "<mix>")
    build_bundle(mod, tmp_path / "b", kernels=[n for n in mod.kernel_map if n.startswith("mix__")])
    lib = load_bundle(tmp_path / "b")
    assert lib.mix(np.ones(3, np.float16), np.full(3, 2, np.uint8)).tolist() == [3.0] * 3
    with pytest.raises(arke.GuardError, match=r"dtypes \(float64, i8\); it has A = f32, B = i8; A = f32, B = u8"):
        lib.mix(np.ones(3), np.ones(3, np.int8))
    with pytest.raises(arke.GuardError, match="missing tensor `b`"):
        lib.mix(np.ones(3, np.float32))


def test_a_where_clause_past_64_bits_is_said_as_such(tmp_path: Path) -> None:
    """The bundle's guards compute in 64 bits; a clause whose values pass that (N**5 at N = 7000) was refused
    as "a dim or a result's element count is beyond the 64-bit sizes", though N and the result are small."""
    from arke.runtime.errors import ShapeError

    src = "kernel w5(x: f32[N]) -> f32[N] where N * N * N * N * N > 9223372036854775806 { return x[n] * 2.0 }\n"
    build_bundle(arke.loads(src, "<w5>"), tmp_path / "b")
    with pytest.raises(ShapeError, match=r"where clause .* cannot be checked in the bundle's 64-bit integers at "
                                         r"N = 7000") as caught:
        load_bundle(tmp_path / "b").w5(np.ones(7000, np.float32))
    assert caught.value.rule == "where"
    with pytest.raises(ShapeError, match="does not hold: N = 5"):
        load_bundle(tmp_path / "b").w5(np.ones(5, np.float32))
