"""The tree's own rules (ARCHITECTURE.md): one folder per target behind the registry, no target-name
comparisons elsewhere, no import circle between packages, small modules.

These read the source (``ast``), so they hold for code paths no other test runs.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from arke.targets import base as targets

ROOT = Path(__file__).resolve().parent.parent / "arke"
TARGETS_DIR = ROOT / "targets"
#: folders under arke/targets that support several targets without being one
SUPPORT = {"nvidia"}
MAX_LINES = 520


def modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def dotted(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, *, module_level_only: bool) -> list[str]:
    """The arke modules ``path`` imports (module level only: not inside functions or ``if TYPE_CHECKING``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = dotted(path)
    package = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
    found: list[str] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                if not module_level_only:
                    visit(child, False)
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.extend(a.name for a in child.names if a.name.startswith("arke"))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - child.level + 1] +
                                    ([base] if base else []))
                if base.startswith("arke"):
                    found.extend(f"{base}.{a.name}" for a in child.names)
            visit(child, top)

    visit(tree, True)
    return found


def package_of(module: str) -> str:
    """``arke.targets.llvm.gemm`` -> ``arke.targets.llvm``; ``arke.lang.parser`` -> ``arke.lang``; a top-level
    module (``arke.api``) is its own node."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] == "targets" and (TARGETS_DIR / parts[2]).is_dir():
        return ".".join(parts[:3])
    if len(parts) >= 2 and (ROOT / parts[1]).is_dir():
        return ".".join(parts[:2])
    return ".".join(parts[:2]) if len(parts) >= 2 else module


def test_every_target_folder_is_registered_and_every_registered_target_is_a_folder() -> None:
    folders = {p.name for p in TARGETS_DIR.iterdir() if (p / "__init__.py").exists()} - SUPPORT
    assert folders == set(targets.REGISTRY)
    for name, package in targets.REGISTRY.items():
        assert package == f"arke.targets.{name}"
        target = importlib.import_module(package).TARGET
        assert isinstance(target, targets.Target) and target.name == name
        assert target.description and target.honours and "source" in target.emits


def test_no_target_name_is_compared_outside_the_targets() -> None:
    names = "|".join(targets.REGISTRY)
    compare = re.compile(rf"""(==|!=|\bin|\bis)\s*[(\[{{]?\s*["']({names})["']|["']({names})["']\s*(==|!=|\bin\b)""")
    found = []
    for path in modules():
        if TARGETS_DIR in path.parents:
            continue
        for k, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if compare.search(code):
                found.append(f"{path.relative_to(ROOT.parent)}:{k}: {line.strip()}")
    assert not found, "target names compared outside arke/targets (ask the registry instead):\n" + "\n".join(found)


def test_no_target_folder_imports_another() -> None:
    found = []
    for path in modules():
        if TARGETS_DIR not in path.parents:
            continue
        mine = package_of(dotted(path))
        for imported in imports(path, module_level_only=False):
            theirs = package_of(imported)
            if theirs.startswith("arke.targets.") and theirs != mine and mine.startswith("arke.targets."):
                if theirs.split(".")[2] in SUPPORT:
                    continue
                found.append(f"{path.relative_to(ROOT.parent)} imports {imported}")
    assert not found, "a target is one folder: shared pieces belong in arke/plan or a support folder:\n" + \
        "\n".join(found)


def test_support_folders_import_no_target() -> None:
    for name in SUPPORT:
        for path in (TARGETS_DIR / name).rglob("*.py"):
            bad = [i for i in imports(path, module_level_only=False)
                   if package_of(i).startswith("arke.targets.") and package_of(i).split(".")[2] in targets.REGISTRY]
            assert not bad, f"{path.relative_to(ROOT.parent)} imports {bad}"


def test_packages_import_each_other_without_a_circle() -> None:
    graph: dict[str, set[str]] = {}
    for path in modules():
        mine = package_of(dotted(path))
        for imported in imports(path, module_level_only=True):
            theirs = package_of(imported)
            if theirs != mine and theirs != "arke":
                graph.setdefault(mine, set()).add(theirs)

    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        seen[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if seen.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in seen and (circle := walk(nxt)) is not None:
                return circle
        stack.pop()
        seen[node] = 2
        return None

    for node in sorted(graph):
        if node not in seen:
            circle = walk(node)
            assert circle is None, "an import circle between packages: " + " -> ".join(circle)


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_modules_stay_small(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{lines} lines: split it by responsibility (about 500 at most)"


TESTS = Path(__file__).resolve().parent
# Test folders that mirror no package of arke/: shared helpers and the spec's own examples.
NOT_A_PACKAGE = {"support": "helpers several test folders share", "spec": "the examples of spec/"}


def test_the_tests_mirror_the_package() -> None:
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    stray = sorted(name for name in folders - set(NOT_A_PACKAGE) if not (ROOT / name).is_dir())
    assert not stray, f"test folders with no arke/ package of that name: {stray}"
    target_tests = {p.name for p in (TESTS / "targets").iterdir() if p.is_dir() and not p.name.startswith("__")}
    missing = sorted(set(targets.names()) - target_tests)
    assert not missing, f"targets without a tests/targets/<name>/ folder: {missing}"
    assert not sorted(target_tests - {p.name for p in (ROOT / "targets").iterdir() if p.is_dir()})
