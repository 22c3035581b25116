"""An exact request cache: an identical request is computed once and its reply shared.

Inside one evaluation run many protocols send the very same request: the first round of a Society
of Minds debate is exactly a vote's first samples when the prompts, the sampling parameters and
the seeds match. :class:`CachedModel` answers such a request from the cache instead of calling
the model again. A hit is exact or it is a miss:

- the key is a SHA-256 of the model's identity (:meth:`BaseChatModel.identity`: backend, name, and
  the endpoint or the weights' hash) and the *whole* request (every message, every sampling
  parameter, the schema, the log-probabilities asked for);
- a sampled request is cached only when it names its seed: the seed is the replicate index, so
  sample k of a vote and agent k of a debate's first round share an entry on purpose, and two
  unseeded samples never do;
- policy (retries, timeouts) is not in the key, and a failed call is never stored.

A hit returns the stored response, usage included, marked ``cache_hit=True``: the cost a protocol
reports stays what it would have paid alone, and the calls saved are counted apart. Requests that
are identical and in flight at the same time are made once (the later ones wait for the first).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import threading
from datetime import UTC, datetime
from typing import Protocol

from moot.models.base import (
    BaseChatModel,
    ChatRequest,
    ChatResponse,
    RetryCallback,
    TokenCallback,
    WrappedModel,
    emit_token,
)


class RequestCache(Protocol):
    """Where cached replies are kept (the eval run's SQLite store, or memory)."""

    def get(self, key: str) -> ChatResponse | None: ...

    def put(self, key: str, model: str, response: ChatResponse) -> None: ...


def cacheable(request: ChatRequest) -> bool:
    """Greedy requests are deterministic by intent; a sampled one only with an explicit seed."""
    return request.temperature == 0 or request.seed is not None


def request_key(model: BaseChatModel, request: ChatRequest) -> str | None:
    """The cache key of ``request`` sent to ``model``, or None when it must not be cached."""
    if not cacheable(request):
        return None
    payload = {"model": model.identity(), "request": request.model_dump(mode="json")}
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class MemoryCache:
    """A request cache in a dict (tests, one process)."""

    def __init__(self) -> None:
        self.entries: dict[str, str] = {}

    def get(self, key: str) -> ChatResponse | None:
        raw = self.entries.get(key)
        return None if raw is None else ChatResponse.model_validate_json(raw)

    def put(self, key: str, model: str, response: ChatResponse) -> None:
        self.entries[key] = response.model_dump_json()


class SqliteCache:
    """A request cache in a table of an SQLite database (an eval run's ``run.sqlite``)."""

    TABLE = "request_cache"

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()
        with self._lock, conn:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {self.TABLE} (key TEXT PRIMARY KEY, model TEXT NOT NULL, "
                "response TEXT NOT NULL, created TEXT NOT NULL)"
            )

    def get(self, key: str) -> ChatResponse | None:
        with self._lock:
            row = self.conn.execute(f"SELECT response FROM {self.TABLE} WHERE key = ?", (key,)).fetchone()
        return None if row is None else ChatResponse.model_validate_json(row[0])

    def put(self, key: str, model: str, response: ChatResponse) -> None:
        stored = response.model_copy(update={"cache_hit": False})
        with self._lock, self.conn:
            self.conn.execute(
                f"INSERT OR IGNORE INTO {self.TABLE} (key, model, response, created) VALUES (?, ?, ?, ?)",
                (key, model, stored.model_dump_json(), datetime.now(UTC).isoformat(timespec="seconds")),
            )

    def __len__(self) -> int:
        with self._lock:
            row = self.conn.execute(f"SELECT COUNT(*) FROM {self.TABLE}").fetchone()
        return int(row[0])


class CachedModel(WrappedModel):
    """``inner`` behind an exact request cache. Counts hits and misses."""

    def __init__(self, inner: BaseChatModel, cache: RequestCache) -> None:
        super().__init__(inner)
        self.cache = cache
        self.hits = 0
        self.misses = 0
        self._inflight: dict[str, asyncio.Future[ChatResponse | None]] = {}

    async def complete(
        self, request: ChatRequest, on_token: TokenCallback | None = None, on_retry: RetryCallback | None = None
    ) -> ChatResponse:
        key = request_key(self.inner, request)
        if key is None:
            self.misses += 1
            return await self.inner.complete(request, on_token, on_retry)
        stored = self.cache.get(key)
        waiting = self._inflight.get(key)
        if stored is None and waiting is not None:
            # The same request is being made now: wait for it. If it fails, make the call here.
            stored = await asyncio.shield(waiting)
        if stored is not None:
            self.hits += 1
            await emit_token(on_token, stored.text)
            return stored.model_copy(update={"cache_hit": True, "latency_s": 0.0})
        self.misses += 1
        future: asyncio.Future[ChatResponse | None] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        response: ChatResponse | None = None
        try:
            response = await self.inner.complete(request, on_token, on_retry)
            self.cache.put(key, self.inner.name, response)
        finally:
            # A failed or cancelled call is not an answer: waiters get None and call themselves.
            self._inflight.pop(key, None)
            future.set_result(response)
        return response
