"""The server's debate store: kept importable under this name; it lives in :mod:`moot.server.state`
(one interface, two backends). :class:`DebateStore` is the SQLite backend, the default."""

from __future__ import annotations

from moot.server.state.base import INTERRUPTED, StoredDebate, StoredEvent, Write, WriteFailure, now
from moot.server.state.base import SCHEMA_VERSION as STORE_VERSION
from moot.server.state.sqlite import SqliteStore as DebateStore

__all__ = [
    "INTERRUPTED",
    "STORE_VERSION",
    "DebateStore",
    "StoredDebate",
    "StoredEvent",
    "Write",
    "WriteFailure",
    "now",
]
