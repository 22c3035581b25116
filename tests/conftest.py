from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from moot.models.registry import clear_cache

# Ray instances the tests start (test_ray.py) listen on loopback only and report no usage
# statistics; both are read when Ray is imported, so they are set before any test imports it.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(autouse=True)
def _fresh_model_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test resolves its own models; no test sees a user's MOOT_MODEL or API key."""
    monkeypatch.delenv("MOOT_MODEL", raising=False)
    clear_cache()
    yield
    clear_cache()
