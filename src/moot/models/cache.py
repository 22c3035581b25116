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

On Ray workers (``moot eval --ray``) the run's cache is in the driver's store, which only the driver
writes: each job carries the entries its item already has (:meth:`SqliteCache.for_item`) in a
:class:`MemoryCache`, and brings back the entries it added (:attr:`MemoryCache.added`), which the
driver stores under the item. An entry is tagged with the item whose job made it
(:data:`CURRENT_ITEM`).
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import sqlite3
import threading
from datetime import UTC, datetime
from typing import Protocol

from pydantic import BaseModel

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


#: The evaluation item whose job is running in this task (entries it adds are tagged with it).
CURRENT_ITEM: contextvars.ContextVar[str | None] = contextvars.ContextVar("moot_cache_item", default=None)


class CacheEntry(BaseModel):
    """One cached reply, as it travels between a Ray worker and the driver."""

    key: str
    model: str
    response: str


class MemoryCache:
    """A request cache in a dict (tests, one process, a job on a Ray worker). ``added`` holds what
    was put into it, for the driver to store."""

    def __init__(self, entries: dict[str, str] | None = None) -> None:
        self.entries: dict[str, str] = dict(entries or {})
        self.added: list[CacheEntry] = []

    def get(self, key: str) -> ChatResponse | None:
        raw = self.entries.get(key)
        return None if raw is None else ChatResponse.model_validate_json(raw)

    def put(self, key: str, model: str, response: ChatResponse) -> None:
        raw = response.model_copy(update={"cache_hit": False}).model_dump_json()
        if key not in self.entries:
            self.added.append(CacheEntry(key=key, model=model, response=raw))
        self.entries[key] = raw


class SqliteCache:
    """A request cache in a table of an SQLite database (an eval run's ``run.sqlite``)."""

    TABLE = "request_cache"

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()
        with self._lock, conn:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {self.TABLE} (key TEXT PRIMARY KEY, model TEXT NOT NULL, "
                "response TEXT NOT NULL, created TEXT NOT NULL, item_id TEXT)"
            )
            columns = {row[1] for row in conn.execute(f"PRAGMA table_info({self.TABLE})")}
            if "item_id" not in columns:  # a run made before entries were tagged with their item
                conn.execute(f"ALTER TABLE {self.TABLE} ADD COLUMN item_id TEXT")
            conn.execute(f"CREATE INDEX IF NOT EXISTS {self.TABLE}_item ON {self.TABLE} (item_id)")

    def get(self, key: str) -> ChatResponse | None:
        with self._lock:
            row = self.conn.execute(f"SELECT response FROM {self.TABLE} WHERE key = ?", (key,)).fetchone()
        return None if row is None else ChatResponse.model_validate_json(row[0])

    def put(self, key: str, model: str, response: ChatResponse) -> None:
        stored = response.model_copy(update={"cache_hit": False})
        # As the model gave it: a replay must be the reply itself (a reply echoing a key keeps it here,
        # in the run's own store; its result and transcript have it as ***).
        self.put_raw(CacheEntry(key=key, model=model, response=stored.model_dump_json()))

    def put_raw(self, entry: CacheEntry, item_id: str | None = None) -> None:
        """Store an entry as it came (from a Ray worker), tagged with ``item_id`` (default: the
        item of the running job, :data:`CURRENT_ITEM`)."""
        with self._lock, self.conn:
            self.conn.execute(
                f"INSERT OR IGNORE INTO {self.TABLE} (key, model, response, created, item_id) VALUES (?, ?, ?, ?, ?)",
                (entry.key, entry.model, entry.response, datetime.now(UTC).isoformat(timespec="seconds"),
                 item_id if item_id is not None else CURRENT_ITEM.get()),
            )  # fmt: skip

    def for_item(self, item_id: str) -> dict[str, str]:
        """The entries jobs of ``item_id`` added (key -> response), for a job that runs elsewhere."""
        with self._lock:
            rows = self.conn.execute(f"SELECT key, response FROM {self.TABLE} WHERE item_id = ?", (item_id,)).fetchall()
        return {key: response for key, response in rows}

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

    def _layer(self, inner: BaseChatModel) -> CachedModel:
        # One cache and one table of calls in flight (keys carry the model's identity, so two
        # models never share an entry).
        layer = CachedModel(inner, self.cache)
        layer._inflight = self._inflight
        return layer

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
