"""Fixtures of the runtime tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from arke import knobs


@pytest.fixture
def cache_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache directory of the test's own and the default knobs (no ARKE_* variable set)."""
    for name in knobs.KNOBS:
        monkeypatch.delenv(name, raising=False)
    directory = tmp_path / "cache"
    monkeypatch.setenv("ARKE_CACHE_DIR", str(directory))
    return directory
