"""The SQL schema both backends share, written once (:data:`MIGRATIONS`, in each dialect's types:
:func:`migrations_for`), and :class:`SqlBackend`: what a backend gives the queries (its
transactions, its reads, the clock of the leases, its placeholders) and the schema brought up to
date on it (:meth:`SqlBackend._migrate`), once however many processes start together.
"""

from __future__ import annotations

import json
import os
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from moot._version import __version__
from moot.server.state.base import SCHEMA_VERSION, SchemaTooNew, now

#: A debate's columns as another store's copy of it gives them (``moot serve migrate``): all but
#: ``seq``, which the target numbers in the order of the copy, and the lease.
COPIED = (
    "id",
    "status",
    "protocol",
    "question",
    "model",
    "created_at",
    "started_at",
    "finished_at",
    "calls",
    "tokens",
    "elapsed_s",
    "error",
    "request",
    "result",
    "key_id",
    "counted",
)
#: A key's columns as another store's copy of it gives them (``moot serve migrate``): its hash,
#: never its value, so the same key works on the target.
KEY_COPIED = (
    "id",
    "name",
    "hash",
    "created_at",
    "revoked_at",
    "rate_per_min",
    "concurrency",
    "debates",
    "calls",
    "tokens",
    "usd",
    "unpriced_debates",
)
#: Debates no lease holds any more may be claimed: those waiting, and those running under a lease
#: that expired (the replica that ran them died or stopped renewing).
_UNFINISHED = "status IN ('queued', 'running')"

#: The schema's versions, written once for both backends: the statements that bring a store from
#: the version before to each one (1: the first store; 2: the queue's leases and the ``migrations``
#: table; 3: the API keys; 4: ``cancel_requested``, a cancel sent to any replica; 5: ``turns``, a
#: transcript's finished turns, each written once). The few column types that differ are named in
#: braces and filled in per dialect (:data:`DIALECT_TYPES`).
MIGRATIONS: dict[int, list[str]] = {
    1: [
        """CREATE TABLE IF NOT EXISTS debates (
            seq {serial},
            id TEXT UNIQUE NOT NULL,
            status TEXT NOT NULL,
            protocol TEXT NOT NULL,
            question TEXT NOT NULL,
            model TEXT NOT NULL,
            created_at TEXT NOT NULL,
            started_at TEXT,
            finished_at TEXT,
            calls INTEGER NOT NULL DEFAULT 0,
            tokens {big} NOT NULL DEFAULT 0,
            elapsed_s {real} NOT NULL DEFAULT 0,
            error TEXT,
            request TEXT NOT NULL,
            result TEXT
        )""",
        "CREATE INDEX IF NOT EXISTS debates_status ON debates (status, seq)",
        """CREATE TABLE IF NOT EXISTS events (
            debate_id TEXT NOT NULL,
            id INTEGER NOT NULL,
            name TEXT NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (debate_id, id)
        )""",
    ],
    2: [
        "ALTER TABLE debates ADD COLUMN owner TEXT",
        "ALTER TABLE debates ADD COLUMN lease_until {time}",
        "ALTER TABLE debates ADD COLUMN epoch {big} NOT NULL DEFAULT 0",
    ],
    3: [
        """CREATE TABLE IF NOT EXISTS api_keys (
            id TEXT PRIMARY KEY,
            name TEXT UNIQUE NOT NULL,
            hash TEXT UNIQUE NOT NULL,
            created_at TEXT NOT NULL,
            revoked_at TEXT,
            rate_per_min INTEGER,
            concurrency INTEGER,
            debates {big} NOT NULL DEFAULT 0,
            calls {big} NOT NULL DEFAULT 0,
            tokens {big} NOT NULL DEFAULT 0,
            usd {real} NOT NULL DEFAULT 0,
            unpriced_debates {big} NOT NULL DEFAULT 0
        )""",
        """CREATE TABLE IF NOT EXISTS key_windows (
            key_id TEXT NOT NULL,
            minute BIGINT NOT NULL,
            requests INTEGER NOT NULL,
            PRIMARY KEY (key_id, minute)
        )""",
        "ALTER TABLE debates ADD COLUMN key_id TEXT",
        "ALTER TABLE debates ADD COLUMN counted INTEGER NOT NULL DEFAULT 0",
        "CREATE INDEX IF NOT EXISTS debates_key ON debates (key_id, status)",
    ],
    4: ["ALTER TABLE debates ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0"],
    5: [
        """CREATE TABLE IF NOT EXISTS turns (
            debate_id TEXT NOT NULL,
            n INTEGER NOT NULL,
            place INTEGER NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (debate_id, n)
        )"""
    ],
}


#: Each dialect's column types: ``serial``, the key that numbers the debates; ``big``, a count that
#: may pass 32 bits; ``real``, a float; ``time``, a lease's end (SQLite: a Unix time; PostgreSQL: a
#: ``timestamptz`` on the database's clock, which replicas share).
DIALECT_TYPES: dict[str, dict[str, str]] = {
    "sqlite": {"serial": "INTEGER PRIMARY KEY AUTOINCREMENT", "big": "INTEGER", "real": "REAL", "time": "REAL"},
    "postgresql": {
        "serial": "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
        "big": "BIGINT",
        "real": "DOUBLE PRECISION",
        "time": "TIMESTAMPTZ",
    },
}


def migrations_for(dialect: str) -> dict[int, list[str]]:
    """:data:`MIGRATIONS` in ``dialect``'s types (``sqlite``, ``postgresql``)."""
    types = DIALECT_TYPES[dialect]
    return {version: [s.format(**types) for s in steps] for version, steps in MIGRATIONS.items()}


def applied_by() -> str:
    """Who applied a migration (the ``migrations`` table): this moot, on this host, in this process."""
    return f"moot {__version__} on {socket.gethostname()} pid {os.getpid()}"


class SqlBackend(ABC):
    """A DB-API connection as the queries use it (:class:`~moot.server.state.sql.SqlStore`); a
    backend gives it the transactions, the reads, the clock of the leases and the schema's migrations."""

    #: Appended to the claim's SELECT: PostgreSQL's ``FOR UPDATE SKIP LOCKED`` (SQLite has a single
    #: writer: its claim's transaction takes the write lock before it reads).
    lock_rows = ""
    #: Each schema version's statements in the backend's types (:func:`migrations_for`), applied in
    #: order to reach it.
    migrations: ClassVar[dict[int, list[str]]] = {}
    #: Replicas may share it (PostgreSQL); SQLite is one server's.
    shared: bool = False

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = [s for s in secrets if s]

    # ------------------------------------------------------------------- the backend's part

    @abstractmethod
    def describe(self) -> str: ...

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def take_server_lock(self) -> None: ...

    @abstractmethod
    def _tx(self) -> AbstractContextManager[Any]:
        """A write transaction, yielding a cursor (``execute``, ``executemany``, ``rowcount``); it
        commits at the end of the block and rolls back on an exception."""

    @abstractmethod
    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    @abstractmethod
    def _now(self) -> tuple[str, list[Any]]:
        """The current time of the leases, as an SQL expression and its parameters."""

    @abstractmethod
    def _later(self, seconds: float) -> tuple[str, list[Any]]:
        """The time ``seconds`` from now, as an SQL expression and its parameters."""

    def _lock_migrations(self, cursor: Any) -> None:  # noqa: B027 - SQLite's transaction is its lock
        """Serialise the migrations of processes starting together (PostgreSQL: an advisory lock)."""

    def _lock_admission(self, cursor: Any) -> None:  # noqa: B027 - SQLite's transaction is its lock
        """Serialise the debates admitted under a limit across replicas (PostgreSQL: an advisory lock)."""

    def _seconds(self) -> float:
        """The store's time, as a Unix time (PostgreSQL: the database's clock, which replicas share)."""
        return time.time()

    def _minute(self) -> tuple[str, list[Any]]:
        """The current minute of the store's time (its Unix time // 60), as SQL and its parameters."""
        return "?", [int(time.time() // 60)]

    def _statement(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """One statement that returns rows (``RETURNING``), committed on its own (outside :meth:`_tx`
        the connection autocommits)."""
        return self._read(sql, params)

    def _q(self, sql: str) -> str:
        """The SQL in the driver's placeholders."""
        return sql

    # ---------------------------------------------------------------------------- schema

    def _migrate(self) -> None:
        """Bring the schema to :data:`SCHEMA_VERSION`, once however many processes start together:
        in one transaction, under the backend's lock. A schema newer than this moot's is refused. A
        store already at this version is left as it is, without a statement that needs the right to
        create tables (a user granted only reads and writes on moot's tables runs it)."""
        try:
            rows = self._read(self._q("SELECT value FROM meta WHERE key = 'store_version'"))
        except Exception:  # (no meta table yet, or no right to read it: the transaction below says which)
            rows = []
        if rows and int(json.loads(rows[0][0])) == SCHEMA_VERSION:
            return
        with self._tx() as c:
            self._lock_migrations(c)
            c.execute(self._q("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"))
            row = c.execute(self._q("SELECT value FROM meta WHERE key = 'store_version'")).fetchone()
            current = int(json.loads(row[0])) if row is not None else 0
            if current > SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"{self.describe()} holds moot serve's schema version {current}, written by a newer moot; "
                    f"this moot ({__version__}) knows versions up to {SCHEMA_VERSION}: upgrade moot "
                    "(pip install -U moot), or give another --db"
                )
            if current == SCHEMA_VERSION:
                return
            c.execute(
                self._q(
                    "CREATE TABLE IF NOT EXISTS migrations "
                    "(version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL, applied_by TEXT NOT NULL)"
                )
            )
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for statement in self.migrations[version]:
                    c.execute(self._q(statement))
                c.execute(
                    self._q("INSERT INTO migrations (version, applied_at, applied_by) VALUES (?, ?, ?)"),
                    (version, now(), applied_by()),
                )
            c.execute(
                self._q(
                    "INSERT INTO meta (key, value) VALUES ('store_version', ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
                ),
                (json.dumps(SCHEMA_VERSION),),
            )

    def schema_version(self) -> int:
        rows = self._read(self._q("SELECT value FROM meta WHERE key = 'store_version'"))
        return int(json.loads(rows[0][0])) if rows else 0

    def applied_migrations(self) -> list[tuple[int, str]]:
        """Each version applied, with who applied it (the tests check each ran once)."""
        rows = self._read(self._q("SELECT version, applied_by FROM migrations ORDER BY version"))
        return [(int(v), str(b)) for v, b in rows]

    # ---------------------------------------------------------------------------- writes
