"""The server's debate store in PostgreSQL (``moot serve --db postgresql://...`` or ``MOOT_DB_URL``;
the ``postgres`` extra: ``pip install 'moot[postgres]'``).

The same tables as the SQLite store (:mod:`moot.server.state.sqlite`), in PostgreSQL's types;
``lease_until`` is a ``timestamptz`` on the database's clock, so replicas on machines whose clocks
differ agree on when a lease expires. The queue's claim locks its row with ``SELECT ... FOR UPDATE
SKIP LOCKED``: replicas claiming at once each get another debate, none waits on another's.

The driver is psycopg 3, not asyncpg: the store's interface is synchronous (the server calls it from
the event loop's callbacks and the engine's event hook, as it calls SQLite), psycopg has the same
DB-API shape as :mod:`sqlite3` (so both backends run one SQL), and it also has an async API and
LISTEN/NOTIFY, which the live bus across replicas may use later; asyncpg is async only, so every
call site would have to become a coroutine first.

The schema is migrated at start in one transaction under a transaction-level advisory lock
(``pg_advisory_xact_lock``), so N replicas starting together migrate it once.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

from moot.secrets import redact
from moot.server.state.base import StoreBusy, StoreError, StoreUnavailable, one_line, redact_url, url_password
from moot.server.state.sql import SqlStore
from moot.server.state.sql_schema import migrations_for

#: The first key of moot's advisory locks ("moot" in ASCII); the second: 1, the migrations; 2, a
#: process that holds the database alone (``moot serve migrate``: replicas share it and take none);
#: 3, the admission of a debate under a limit (the deployment's capacity, a key's concurrency).
LOCK_NAMESPACE = 0x6D6F6F74
_MIGRATION_LOCK = 1
_SERVER_LOCK = 2
_ADMISSION_LOCK = 3

#: Seconds a server waits for the advisory lock of a server that has just stopped (its session ends
#: a moment after its process), before it says that another holds the database.
SERVER_LOCK_WAIT_S = 3.0
#: Seconds a connection attempt may take before the start is refused (unless the URL sets its own).
CONNECT_TIMEOUT_S = 10
#: A transaction idle this long (its process stopped mid-write) is ended by PostgreSQL: its locks go.
IDLE_IN_TRANSACTION_MS = 5000


def _connect_fix(said: str) -> str:
    """What to do about a refused connection, by what PostgreSQL (or the network) said."""
    lowered = said.lower()
    if "password authentication failed" in lowered or "no password supplied" in lowered:
        return "give the user's right password in the URL (postgresql://user:password@host:port/database)"
    if "does not exist" in lowered and "database" in lowered:
        return "create that database (createdb, or CREATE DATABASE) or name one that exists in the URL"
    if "does not exist" in lowered and "role" in lowered:
        return "create that user (CREATE ROLE ... LOGIN PASSWORD ...) or name one that exists in the URL"
    return (
        "check that PostgreSQL runs at the URL's host and port (from a checkout of moot, tools/services.sh up "
        "starts one), or fix the URL"
    )


def is_postgres_url(value: str) -> bool:
    return value.startswith(("postgresql://", "postgres://"))


class PostgresStore(SqlStore):
    """One connection to PostgreSQL (autocommit; each write an explicit transaction), used from
    the server's event loop; a lock keeps each transaction whole if another thread reads meanwhile.
    Any failure to connect or to set the schema up is a :class:`StoreError` of one line, with the
    URL's password redacted.

    **Reconnection.** A connection that breaks (PostgreSQL restarted, a network cut) is made again
    at the next call: a read is tried once more at once; a write (whose transaction was rolled
    back) raises :class:`StoreUnavailable`, and the server tries it again a moment later, under the
    lease that covers the gap. A replica thus outlives a restart of its database."""

    lock_rows = " FOR UPDATE SKIP LOCKED"
    shared = True
    migrations: ClassVar[dict[int, list[str]]] = migrations_for("postgresql")

    def __init__(self, url: str, secrets: Iterable[str] = (), *, application_name: str = "moot serve") -> None:
        password = url_password(url)
        super().__init__([*secrets, *([password] if password else [])])
        self.url = url
        self.where = redact_url(url)
        self._password = password
        self._lock = threading.RLock()
        try:
            import psycopg
            from psycopg import conninfo
        except ImportError:
            raise StoreError(
                f"{self.where}: PostgreSQL needs the postgres extra (psycopg): pip install 'moot[postgres]'"
            ) from None
        self._psycopg = psycopg
        try:
            given = conninfo.conninfo_to_dict(url)
        except psycopg.Error as exc:
            raise StoreError(f"{self.where}: not a valid PostgreSQL URL ({self._clean(exc)}); fix --db") from None
        self._options: dict[str, Any] = {
            "application_name": f"{application_name} on {socket.gethostname()} pid {os.getpid()}"
        }
        if "connect_timeout" not in given:
            self._options["connect_timeout"] = CONNECT_TIMEOUT_S
        if "options" not in given:
            # A replica stopped (SIGSTOP, a stalled VM) inside a write holds its debate's row lock,
            # and the queue's claim skips locked rows: no other replica could ever take the debate
            # over. PostgreSQL ends a transaction left idle this long, and its locks go with it.
            self._options["options"] = f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}"
        try:
            self.conn = psycopg.connect(url, autocommit=True, **self._options)
        except psycopg.Error as exc:
            said = self._clean(exc)
            raise StoreError(f"{self.where}: cannot connect to PostgreSQL ({said}); {_connect_fix(said)}") from None
        try:
            self._migrate()
        except StoreError:
            self.conn.close()
            raise
        except psycopg.Error as exc:
            self.conn.close()
            raise StoreError(
                f"{self.where}: cannot set moot's tables up in this database ({self._clean(exc)}); give a database "
                "whose user may create tables"
            ) from None

    def _clean(self, exc: BaseException) -> str:
        """A driver's message on one line, with the URL's password and any key redacted."""
        # (its first line: PostgreSQL's "LINE 1: CREATE TABLE ..." and the caret under it say nothing more)
        text = one_line(str(exc).split("\nLINE ")[0]) or type(exc).__name__
        if self._password and len(self._password) >= 3:
            text = text.replace(self._password, "***")
        return redact(text.replace(self.url, self.where), self.secrets)

    def describe(self) -> str:
        return self.where

    def _connected(self) -> Any:
        """The connection, made again if it broke; :class:`StoreUnavailable` if it cannot be now."""
        if self.conn.closed or self.conn.broken:
            try:
                self.conn = self._psycopg.connect(self.url, autocommit=True, **self._options)
            except self._psycopg.Error as exc:
                raise StoreUnavailable(f"{self.where}: PostgreSQL cannot be reached ({self._clean(exc)})") from None
        return self.conn

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        return StoreUnavailable(f"{self.where}: the connection to PostgreSQL broke ({self._clean(exc)})")

    def close(self) -> None:
        self.conn.close()  # the server's advisory lock, a session lock, ends with it

    def take_server_lock(self) -> None:
        """A session-level advisory lock, held until the connection closes (the process ending, a
        ``kill -9`` included): a second server on the same database is refused, naming the first."""
        deadline = time.monotonic() + SERVER_LOCK_WAIT_S
        with self._lock:
            while True:
                row = self.conn.execute(
                    "SELECT pg_try_advisory_lock(%s, %s)", (LOCK_NAMESPACE, _SERVER_LOCK)
                ).fetchone()
                if row is not None and row[0]:
                    return
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            holder = self.conn.execute(
                "SELECT a.application_name, host(a.client_addr) FROM pg_locks l "
                "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                "AND l.classid::int8 = %s AND l.objid::int8 = %s AND l.objsubid = 2",
                (LOCK_NAMESPACE, _SERVER_LOCK),
            ).fetchone()
        who = (
            "another moot serve"
            if holder is None
            else f"{holder[0] or 'another moot serve'} from {holder[1] or 'a local socket'}"
        )
        raise StoreBusy(
            f"--db {self.where} is in use by {who}, which holds it alone (moot serve migrate copying into it); "
            "wait for it to end, or give another database"
        )

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        psycopg = self._psycopg
        with self._lock:
            conn = self._connected()
            try:
                with conn.transaction():
                    cursor = conn.cursor()
                    try:
                        yield cursor
                    finally:
                        cursor.close()
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                if not (conn.closed or conn.broken):
                    raise  # a statement the database refused, on a sound connection
                raise self._unavailable(exc) from None

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        psycopg = self._psycopg
        with self._lock:
            for attempt in (1, 2):  # a broken connection is made again, and the read tried once more
                conn = self._connected()
                try:
                    rows: list[tuple[Any, ...]] = conn.execute(sql, params).fetchall()
                    return rows
                except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                    if not (conn.closed or conn.broken):
                        raise
                    if attempt == 2:
                        raise self._unavailable(exc) from None
        raise AssertionError("unreachable")

    def _lock_migrations(self, cursor: Any) -> None:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_NAMESPACE, _MIGRATION_LOCK))

    def _lock_admission(self, cursor: Any) -> None:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_NAMESPACE, _ADMISSION_LOCK))

    def _seconds(self) -> float:
        return float(self._read("SELECT extract(epoch from now())")[0][0])

    def _minute(self) -> tuple[str, list[Any]]:
        return "CAST(floor(extract(epoch from now()) / 60) AS BIGINT)", []

    def _q(self, sql: str) -> str:
        return sql.replace("?", "%s")

    def _now(self) -> tuple[str, list[Any]]:
        return "now()", []

    def _later(self, seconds: float) -> tuple[str, list[Any]]:
        return "now() + make_interval(secs => ?)", [float(seconds)]
