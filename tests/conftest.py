from __future__ import annotations

from collections.abc import Iterator

import pytest

from moot.models.registry import clear_cache


@pytest.fixture(autouse=True)
def _fresh_model_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test resolves its own models; no test sees a user's MOOT_MODEL or API key."""
    monkeypatch.delenv("MOOT_MODEL", raising=False)
    clear_cache()
    yield
    clear_cache()
