"""The store's API keys as the server checks them: each request's bearer looked up by its hash, with a
short cache (``settings.key_cache_s``), so that a key added or revoked on any replica (``moot serve
keys``) holds on every replica within that time; the key of the request being served
(:data:`REQUEST_KEY`), which the manager records on the debates it submits; and the per-key rate.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from contextvars import ContextVar
from typing import Literal

from pydantic import BaseModel

from moot.server.state import Store
from moot.server.state.keys import KEY_PREFIX, ApiKey, KeyUsage, key_hash

#: The store's key that authenticated the request being served (None: the server's own
#: ``--api-key-env`` key, a viewer session of it, or no key on an open loopback server).
REQUEST_KEY: ContextVar[ApiKey | None] = ContextVar("moot_request_key", default=None)

#: Lookups remembered at most (the oldest forgotten first): random bearers cannot grow the cache.
CACHE_ENTRIES = 4096


class KeyRing:
    """The store's keys, cached ``ttl_s`` seconds (found and not found alike). ``required``: the server
    has its own key or listens beyond loopback; otherwise it needs a key once the store holds one
    (checked every ``ttl_s``), and from then on for good: revoking every key never opens it."""

    def __init__(self, ttl_s: float, *, required: bool) -> None:
        self.ttl_s = ttl_s
        self.store: Store | None = None
        self._required = required
        self._checked = -float("inf")
        self._by_hash: OrderedDict[str, tuple[float, ApiKey | None]] = OrderedDict()
        self._by_id: OrderedDict[str, tuple[float, ApiKey | None]] = OrderedDict()

    def bind(self, store: Store) -> None:
        self.store = store

    def required(self) -> bool:
        if self._required or self.store is None:
            return self._required
        now = time.monotonic()
        if now - self._checked >= self.ttl_s:
            self._checked = now
            self._required = self.store.has_keys()
        return self._required

    def _cached(self, cache: OrderedDict[str, tuple[float, ApiKey | None]], name: str) -> tuple[bool, ApiKey | None]:
        hit = cache.get(name)
        if hit is not None and hit[0] > time.monotonic():
            return True, hit[1]
        return False, None

    def _remember(self, cache: OrderedDict[str, tuple[float, ApiKey | None]], name: str, key: ApiKey | None) -> None:
        cache[name] = (time.monotonic() + self.ttl_s, key)
        cache.move_to_end(name)
        while len(cache) > CACHE_ENTRIES:
            cache.popitem(last=False)
        if key is not None:
            self._required = True

    def lookup(self, bearer: str) -> ApiKey | None:
        """The live (not revoked) key whose value is ``bearer``, else None."""
        if self.store is None or not bearer.startswith(KEY_PREFIX):
            return None
        hashed = key_hash(bearer)
        known, key = self._cached(self._by_hash, hashed)
        if not known:
            key = self.store.key_by_hash(hashed)
            self._remember(self._by_hash, hashed, key)
        return key if key is not None and not key.revoked else None

    def by_id(self, key_id: str) -> ApiKey | None:
        """The live key of that id (a viewer session opened with it), else None."""
        if self.store is None:
            return None
        known, key = self._cached(self._by_id, key_id)
        if not known:
            key = self.store.key(key_id)
            self._remember(self._by_id, key_id, key)
        return key if key is not None and not key.revoked else None

    def over_rate(self, key: ApiKey) -> float | None:
        """Count a request of ``key`` in its minute: None if within its rate, else the seconds to wait."""
        if key.rate_per_min is None or self.store is None:
            return None
        return self.store.count_request(key.id, key.rate_per_min)


def rate_refusal(key: ApiKey, wait: float) -> tuple[str, int]:
    """What a request of ``key`` over its rate is told, and the whole seconds it should wait."""
    retry = max(1, math.ceil(wait))
    message = (
        f"the API key {key.name!r} has made {key.rate_per_min} requests this minute, its rate limit; "
        f"retry after {retry} s"
    )
    return message, retry


class UsageReport(BaseModel):
    """``GET /v1/usage``: what the calling key's finished debates used, for the whole deployment."""

    object: Literal["usage"] = "usage"
    key_id: str
    name: str
    created_at: str
    rate_per_min: int | None
    concurrency: int | None
    usage: KeyUsage


def usage_report(key: ApiKey) -> UsageReport:
    return UsageReport(
        key_id=key.id,
        name=key.name,
        created_at=key.created_at,
        rate_per_min=key.rate_per_min,
        concurrency=key.concurrency,
        usage=key.usage,
    )
