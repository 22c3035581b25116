"""The SQL both backends run: written once with ``?`` placeholders (PostgreSQL's driver gets ``%s``),
with the few differences (the clock of the leases, row locks, how a transaction begins, the
schema's types) left to each backend.
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
from moot.core.types import DebateResult
from moot.secrets import redact, redact_json
from moot.server.state.base import (
    SCHEMA_VERSION,
    Claim,
    LeaseLost,
    SchemaTooNew,
    StoredDebate,
    StoredEvent,
    StoreUnavailable,
    Write,
    WriteFailure,
    now,
)
from moot.server.state.keys import (
    ApiKey,
    DuplicateKeyName,
    KeyUsage,
    LimitReached,
    UnknownKey,
    new_key_id,
    same_hash,
)

_COLUMNS = (
    "seq, id, status, protocol, question, model, created_at, started_at, finished_at, calls, tokens, elapsed_s, error"
)
_KEYS = [c.strip() for c in _COLUMNS.split(",")]
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
#: table; 3: the API keys; 4: ``cancel_requested``, a cancel sent to any replica). The few column
#: types that differ are named in braces and filled in per dialect (:data:`DIALECT_TYPES`).
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


class SqlStore(ABC):
    """:class:`~moot.server.state.base.Store` over a DB-API connection; a backend gives it the
    transactions, the reads, the clock of the leases and the schema's migrations."""

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
        in one transaction, under the backend's lock. A schema newer than this moot's is refused."""
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

    def create(
        self,
        debate_id: str,
        *,
        protocol: str,
        question: str,
        model: str,
        request: dict[str, Any],
        key: ApiKey | None = None,
        capacity: int | None = None,
        claim_for: tuple[str, float] | None = None,
    ) -> str:
        created = now()
        owner: str | None = None
        lease_sql, lease_args, epoch = "NULL", list[Any](), 0
        if claim_for is not None:
            owner, (lease_sql, lease_args), epoch = claim_for[0], self._later(claim_for[1]), 1
        with self._tx() as c:
            limited = key is not None and key.concurrency is not None
            if capacity is not None or limited:
                # Counted and added under one lock, so that replicas admitting at once cannot both pass.
                self._lock_admission(c)
            if capacity is not None:
                unfinished = c.execute(self._q(f"SELECT COUNT(*) FROM debates WHERE {_UNFINISHED}")).fetchone()[0]
                if int(unfinished) >= capacity:
                    raise LimitReached("capacity", capacity)
            if key is not None and key.concurrency is not None:
                mine = c.execute(
                    self._q(f"SELECT COUNT(*) FROM debates WHERE key_id = ? AND {_UNFINISHED}"), (key.id,)
                ).fetchone()[0]
                if int(mine) >= key.concurrency:
                    raise LimitReached("key_concurrency", key.concurrency, key.name)
            c.execute(
                self._q(
                    "INSERT INTO debates (id, status, protocol, question, model, created_at, request, key_id, "
                    f"owner, lease_until, epoch) VALUES (?, 'queued', ?, ?, ?, ?, ?, ?, ?, {lease_sql}, ?)"
                ),
                (
                    debate_id,
                    redact(protocol, self.secrets),  # an inline protocol's name is the caller's text
                    redact(question, self.secrets),
                    model,
                    created,
                    redact_json(json.dumps(request), self.secrets),
                    None if key is None else key.id,
                    owner,
                    *lease_args,
                    epoch,
                ),
            )
        return created

    def set_request(self, debate_id: str, request: dict[str, Any]) -> bool:
        with self._tx() as c:
            c.execute(
                self._q("UPDATE debates SET request = ? WHERE id = ?"),
                (redact_json(json.dumps(request), self.secrets), debate_id),
            )
            return bool(c.rowcount)

    def delete(self, debate_id: str) -> bool:
        with self._tx() as c:
            c.execute(self._q("DELETE FROM events WHERE debate_id = ?"), (debate_id,))
            c.execute(self._q("DELETE FROM debates WHERE id = ?"), (debate_id,))
            return bool(c.rowcount)

    def write(
        self,
        debate_id: str,
        result: DebateResult,
        events: list[StoredEvent],
        *,
        status: str | None = None,
        error: str | None = None,
        epoch: int | None = None,
    ) -> None:
        self.write_one(Write(debate_id, result, events, status=status, error=error, epoch=epoch))

    def finish_without_result(
        self, debate_id: str, status: str, error: str, events: list[StoredEvent], *, epoch: int | None = None
    ) -> None:
        self.write_one(Write(debate_id, None, events, status=status, error=error, epoch=epoch))

    def write_one(self, write: Write) -> None:
        w = write
        fields: list[str] = []
        values: list[Any] = []
        if w.started:
            fields += ["status = 'running'", "started_at = ?"]
            values.append(w.started)
        if w.result is not None:
            r = w.result
            fields += ["result = ?", "calls = ?", "tokens = ?", "elapsed_s = ?"]
            values += [r.to_json(indent=None, secrets=self.secrets), r.llm_calls, r.usage.total_tokens, r.elapsed_s]
        if w.status is not None:
            # A debate that ended is no one's: its lease ends with it.
            fields += ["status = ?", "finished_at = ?", "error = ?", "owner = NULL", "lease_until = NULL"]
            values += [w.status, now(), None if w.error is None else redact(w.error, self.secrets)]
        where = "id = ?"
        if w.epoch is not None:
            where += " AND epoch = ?"
            fields = fields or ["epoch = epoch"]  # the fence is checked even for events alone
        with self._tx() as c:
            if fields:
                changed = c.execute(
                    self._q(f"UPDATE debates SET {', '.join(fields)} WHERE {where}"),
                    (*values, w.debate_id, *(() if w.epoch is None else (w.epoch,))),
                ).rowcount
                if w.epoch is not None and changed == 0:
                    raise LeaseLost(w.debate_id, w.epoch)
                if w.status is not None and w.status not in ("queued", "running") and changed:
                    self._count_usage(c, w)
            if w.events:
                # Built inside the transaction: an event that cannot be written rolls the update back.
                rows = [(w.debate_id, e.id, e.name, redact_json(e.data, self.secrets)) for e in w.events]
                c.executemany(
                    self._q(
                        "INSERT INTO events (debate_id, id, name, data) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"
                    ),
                    rows,
                )

    def write_all(self, writes: Iterable[Write]) -> list[WriteFailure]:
        """Each debate's write in its own transaction: one that fails is rolled back alone, and no
        other debate's write or event goes with it. A lost lease is reported (the debate is another
        replica's now); any other failure (a transcript that cannot be encoded, a value the database
        refuses) also marks its debate ``failed`` with the reason, its events kept when they can be,
        but a store that cannot be reached (:class:`StoreUnavailable`): that write is to be tried again."""
        failures: list[WriteFailure] = []
        for w in writes:
            try:
                self.write_one(w)
            except (LeaseLost, StoreUnavailable) as exc:
                failures.append(WriteFailure(w.debate_id, exc))
            except Exception as exc:  # this debate's write alone is rolled back: the caller is told which
                reason = redact(
                    f"the server could not store this debate ({type(exc).__name__}: {exc}); it was stopped",
                    self.secrets,
                )
                self._mark_failed(w, reason)
                failures.append(WriteFailure(w.debate_id, exc, reason))
        return failures

    def _count_usage(self, c: Any, w: Write) -> None:
        """A debate that ended: its calls, tokens and cost added to its key's usage, once (``counted``),
        in the transaction of its end."""
        row = c.execute(self._q("SELECT key_id, calls, tokens, counted FROM debates WHERE id = ?"), (w.debate_id,))
        found = row.fetchone()
        if found is None or found[0] is None or found[3]:
            return
        key_id, calls, tokens, _ = found
        cost = w.result.cost if w.result is not None else None
        usd = cost.usd if cost is not None else None
        c.execute(
            self._q(
                "UPDATE api_keys SET debates = debates + 1, calls = calls + ?, tokens = tokens + ?, usd = usd + ?, "
                "unpriced_debates = unpriced_debates + ? WHERE id = ?"
            ),
            (int(calls), int(tokens), float(usd or 0.0), 1 if usd is None and int(calls) > 0 else 0, key_id),
        )
        c.execute(self._q("UPDATE debates SET counted = 1 WHERE id = ?"), (w.debate_id,))

    def _mark_failed(self, w: Write, reason: str) -> None:
        """A debate whose write failed: ``failed`` with the reason, with the write's events if they
        can be stored, else without them (the transcript stays as last stored)."""
        for events in (w.events, []):
            try:
                self.write_one(Write(w.debate_id, None, events, status="failed", error=reason, epoch=w.epoch))
                return
            except Exception:
                continue

    def import_debate(self, debate: dict[str, Any], events: list[tuple[int, str, str]]) -> tuple[bool, int]:
        """A debate copied from another store as it was there (its columns but ``seq``: see
        :data:`COPIED`; no lease), with its events ``(id, name, data)``, in one transaction. Returns
        whether it was new here, and how many of its events were."""
        unknown = set(debate) - set(COPIED)
        if unknown or "id" not in debate:
            raise ValueError(f"not a debate's columns: {sorted(unknown) or 'no id'}")
        cols = [c for c in COPIED if c in debate]
        with self._tx() as c:
            inserted = c.execute(
                self._q(
                    f"INSERT INTO debates ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)}) "
                    "ON CONFLICT (id) DO NOTHING"
                ),
                [debate[k] for k in cols],
            ).rowcount
            count = self._q("SELECT COUNT(*) FROM events WHERE debate_id = ?")
            before = int(c.execute(count, (debate["id"],)).fetchone()[0])
            if events:
                c.executemany(
                    self._q(
                        "INSERT INTO events (debate_id, id, name, data) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"
                    ),
                    [(debate["id"], i, n, d) for i, n, d in events],
                )
            after = int(c.execute(count, (debate["id"],)).fetchone()[0])
        return inserted == 1, after - before

    # ----------------------------------------------------------------------------- reads

    def unfinished(self) -> list[str]:
        rows = self._read(self._q(f"SELECT id FROM debates WHERE {_UNFINISHED} ORDER BY seq"))
        return [r[0] for r in rows]

    def get(self, debate_id: str, *, with_result: bool = True) -> StoredDebate | None:
        cols = _COLUMNS + (", result" if with_result else "")
        rows = self._read(self._q(f"SELECT {cols} FROM debates WHERE id = ?"), (debate_id,))
        return _row(rows[0], with_result) if rows else None

    def page(self, *, status: str | None, limit: int, before: int | None) -> list[StoredDebate]:
        where: list[str] = []
        args: list[str | int] = []
        if status is not None:
            where.append("status = ?")
            args.append(status)
        if before is not None:
            where.append("seq < ?")
            args.append(before)
        sql = f"SELECT {_COLUMNS} FROM debates"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY seq DESC LIMIT ?"
        return [_row(r, False) for r in self._read(self._q(sql), (*args, limit))]

    def events(self, debate_id: str, after: int = 0) -> list[StoredEvent]:
        rows = self._read(
            self._q("SELECT id, name, data FROM events WHERE debate_id = ? AND id > ? ORDER BY id"), (debate_id, after)
        )
        return [StoredEvent(id=i, name=n, data=d) for i, n, d in rows]

    def request(self, debate_id: str) -> dict[str, Any] | None:
        rows = self._read(self._q("SELECT request FROM debates WHERE id = ?"), (debate_id,))
        if not rows:
            return None
        value: dict[str, Any] = json.loads(rows[0][0])
        return value

    def last_event_id(self, debate_id: str) -> int:
        rows = self._read(self._q("SELECT MAX(id) FROM events WHERE debate_id = ?"), (debate_id,))
        return int(rows[0][0] or 0)

    # ----------------------------------------------------------------------------- queue

    def claim(self, replica: str, lease_s: float, *, debate_id: str | None = None) -> Claim | None:
        now_sql, now_args = self._now()
        later_sql, later_args = self._later(lease_s)
        where = f"{_UNFINISHED} AND (lease_until IS NULL OR lease_until < {now_sql})"
        args: list[Any] = list(now_args)
        if debate_id is not None:
            where += " AND id = ?"
            args.append(debate_id)
        with self._tx() as c:
            row = c.execute(
                self._q(f"SELECT id, owner, status FROM debates WHERE {where} ORDER BY seq LIMIT 1{self.lock_rows}"),
                args,
            ).fetchone()
            if row is None:
                return None
            claimed, previous, status = row
            epoch = c.execute(
                self._q(
                    f"UPDATE debates SET owner = ?, lease_until = {later_sql}, epoch = epoch + 1 "
                    "WHERE id = ? RETURNING epoch"
                ),
                (replica, *later_args, claimed),
            ).fetchone()[0]
        return Claim(claimed, int(epoch), replica, previous, status)

    def renew(self, debate_id: str, epoch: int, lease_s: float) -> None:
        later_sql, later_args = self._later(lease_s)
        with self._tx() as c:
            changed = c.execute(
                self._q(f"UPDATE debates SET lease_until = {later_sql} WHERE id = ? AND epoch = ? AND {_UNFINISHED}"),
                (*later_args, debate_id, epoch),
            ).rowcount
            if changed == 0:
                raise LeaseLost(debate_id, epoch)

    def release(self, debate_id: str, epoch: int) -> None:
        with self._tx() as c:
            changed = c.execute(
                self._q("UPDATE debates SET lease_until = NULL, epoch = epoch + 1 WHERE id = ? AND epoch = ?"),
                (debate_id, epoch),
            ).rowcount
            if changed == 0:
                raise LeaseLost(debate_id, epoch)

    def expired(self) -> list[str]:
        now_sql, now_args = self._now()
        rows = self._read(
            self._q(
                f"SELECT id FROM debates WHERE {_UNFINISHED} AND owner IS NOT NULL AND lease_until < {now_sql} "
                "ORDER BY seq"
            ),
            now_args,
        )
        return [r[0] for r in rows]

    # ------------------------------------------------------------------- cancels

    def request_cancel(self, debate_id: str) -> bool:
        with self._tx() as c:
            changed = c.execute(
                self._q(f"UPDATE debates SET cancel_requested = 1 WHERE id = ? AND {_UNFINISHED}"), (debate_id,)
            ).rowcount
        return bool(changed)

    def cancel_requested(self, debate_ids: Iterable[str]) -> list[str]:
        ids = list(debate_ids)
        if not ids:
            return []
        marks = ", ".join("?" for _ in ids)
        rows = self._read(self._q(f"SELECT id FROM debates WHERE cancel_requested = 1 AND id IN ({marks})"), ids)
        return [r[0] for r in rows]

    def lease(self, debate_id: str) -> tuple[str | None, int]:
        """The debate's owner and epoch (for the tests and the logs)."""
        rows = self._read(self._q("SELECT owner, epoch FROM debates WHERE id = ?"), (debate_id,))
        if not rows:
            return None, 0
        return rows[0][0], int(rows[0][1])

    # ----------------------------------------------------------------------------- API keys

    def add_key(
        self, name: str, hashed: str, *, rate_per_min: int | None = None, concurrency: int | None = None
    ) -> ApiKey:
        key = ApiKey(id=new_key_id(), name=name, created_at=now(), rate_per_min=rate_per_min, concurrency=concurrency)
        with self._tx() as c:
            taken = c.execute(self._q("SELECT revoked_at FROM api_keys WHERE name = ?"), (name,)).fetchone()
            if taken is not None:
                state = f"revoked at {taken[0]}" if taken[0] else "in use"
                raise DuplicateKeyName(f"a key named {name!r} exists already ({state}); give another --name")
            c.execute(
                self._q(
                    "INSERT INTO api_keys (id, name, hash, created_at, rate_per_min, concurrency) "
                    "VALUES (?, ?, ?, ?, ?, ?)"
                ),
                (key.id, name, hashed, key.created_at, rate_per_min, concurrency),
            )
        return key

    def keys(self) -> list[ApiKey]:
        return [_key(r) for r in self._read(self._q(f"SELECT {_KEY_COLUMNS} FROM api_keys ORDER BY created_at, id"))]

    def key_by_hash(self, hashed: str) -> ApiKey | None:
        rows = self._read(self._q(f"SELECT {_KEY_COLUMNS}, hash FROM api_keys WHERE hash = ?"), (hashed,))
        if not rows or not same_hash(str(rows[0][-1]), hashed):
            return None
        return _key(rows[0][:-1])

    def key(self, key_id: str) -> ApiKey | None:
        rows = self._read(self._q(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = ?"), (key_id,))
        return _key(rows[0]) if rows else None

    def revoke_key(self, name_or_id: str) -> tuple[ApiKey, bool]:
        with self._tx() as c:
            row = c.execute(
                self._q(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = ? OR name = ?"), (name_or_id, name_or_id)
            ).fetchone()
            if row is None:
                raise UnknownKey(f"no key named or with id {name_or_id!r}; list them with moot serve keys list")
            key = _key(row)
            if key.revoked_at is not None:
                return key, False
            key.revoked_at = now()
            c.execute(self._q("UPDATE api_keys SET revoked_at = ? WHERE id = ?"), (key.revoked_at, key.id))
        return key, True

    def import_key(self, key: dict[str, Any]) -> bool:
        """A key copied from another store as it was there (:data:`KEY_COPIED`: its hash, limits and
        usage); whether it was new here (a key of that id, or a name taken, is left as it is)."""
        unknown = set(key) - set(KEY_COPIED)
        if unknown or not {"id", "name", "hash", "created_at"} <= set(key):
            raise ValueError(f"not a key's columns: {sorted(unknown) or 'id, name, hash, created_at missing'}")
        cols = [c for c in KEY_COPIED if c in key]
        with self._tx() as c:
            taken = c.execute(
                self._q("SELECT 1 FROM api_keys WHERE id = ? OR name = ? OR hash = ?"),
                (key["id"], key["name"], key["hash"]),
            ).fetchone()
            if taken is not None:
                return False
            c.execute(
                self._q(f"INSERT INTO api_keys ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})"),
                [key[k] for k in cols],
            )
        return True

    def has_keys(self) -> bool:
        return bool(self._read(self._q("SELECT 1 FROM api_keys LIMIT 1")))

    def count_request(self, key_id: str, per_minute: int) -> float | None:
        minute_sql, minute_args = self._minute()
        # One statement, committed on its own: one round trip for each request of a limited key.
        counted = self._statement(
            self._q(
                f"INSERT INTO key_windows (key_id, minute, requests) VALUES (?, {minute_sql}, 1) "
                "ON CONFLICT (key_id, minute) DO UPDATE SET requests = key_windows.requests + 1 "
                "WHERE key_windows.requests < ? RETURNING requests, minute"
            ),
            (key_id, *minute_args, per_minute),
        )
        if not counted:
            return 60.0 - self._seconds() % 60
        requests, minute = counted[0]
        if int(requests) == 1:  # the key's first request of a minute: its older windows go
            with self._tx() as c:
                c.execute(self._q("DELETE FROM key_windows WHERE key_id = ? AND minute < ?"), (key_id, minute))
        return None


_KEY_COLUMNS = (
    "id, name, created_at, revoked_at, rate_per_min, concurrency, debates, calls, tokens, usd, unpriced_debates"
)


def _key(row: Sequence[Any]) -> ApiKey:
    key_id, name, created, revoked, rate, concurrency, debates, calls, tokens, usd, unpriced = row[:11]
    usage = KeyUsage(
        debates=int(debates), calls=int(calls), tokens=int(tokens), usd=float(usd), unpriced_debates=int(unpriced)
    )
    return ApiKey(
        id=key_id,
        name=name,
        created_at=created,
        revoked_at=revoked,
        rate_per_min=rate,
        concurrency=concurrency,
        usage=usage,
    )


def _row(row: Sequence[Any], with_result: bool) -> StoredDebate:
    data = dict(zip(_KEYS, row, strict=False))
    if with_result and row[-1] is not None:
        data["result"] = DebateResult.model_validate_json(row[-1])
    return StoredDebate.model_validate(data)
