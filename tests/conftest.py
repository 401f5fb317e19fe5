"""Settings for the whole test suite."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Helpers shared by several test folders (the tolerance rule, host CUDA, GPU build checks) live in
# tests/support/ and are imported by module name from any test.
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

# The triton target runs in Triton's CPU interpreter in the tests (set before triton is imported).
os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True, scope="session")
def _private_kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Compiled kernels go to a cache of the test run's own, never the user's ~/.cache/arke; tuning records too."""
    directory = tmp_path_factory.mktemp("arke-cache")
    patch = pytest.MonkeyPatch()
    patch.setenv("ARKE_CACHE_DIR", str(directory))
    # ... and builds never consult the user's tuning database (a test that tunes names its own)
    patch.setenv("ARKE_TUNING_DB", str(directory / "tuning.db"))
    yield directory
    patch.undo()


@pytest.fixture
def no_iree(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``iree.compiler`` and ``iree.runtime`` look uninstalled."""
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        if name == "iree" or name.startswith("iree."):
            return None
        return real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
