"""A fixture shared by the target and plan tests: each test module builds into its own cache."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Each test module builds into its own cache directory, never the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ARKE_CACHE_DIR", str(tmp_path_factory.mktemp("arke-cache")))
        mp.delenv("ARKE_NO_CACHE", raising=False)
        yield
