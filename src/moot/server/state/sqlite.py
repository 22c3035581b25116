"""The server's debate store in one SQLite file: the default, for one server on one machine.

Tables: ``debates`` (one row per debate: its request, status, and its transcript in the
``moot.debate/1`` JSON form, stored on every finished turn and round, each finished turn once in
``turns`` and the rest of it in ``result``: :mod:`moot.server.state.result_json`; its lease:
``owner``, ``lease_until``, ``epoch``), ``turns``, ``events`` (the debate's events with the ids the
live stream gave them, all but the token deltas, whose text each ``turn_done`` carries whole),
``meta`` (the schema's version) and ``migrations``. WAL mode; the writes of one moment (the event loop's next turn; a
debate's end at once) are one transaction (``BEGIN IMMEDIATE``: SQLite's single writer is the
queue's lock), each debate's failure its own (:meth:`SqlStore.write_all`): a server killed mid-debate loses
nothing already written, and at the next start the debates it was running are marked
``interrupted`` with their partial transcript, and those still waiting in its queue are queued again.

Nothing secret is stored: the question, the request, the transcript, the events and the errors pass
through :mod:`moot.secrets` on the way in (the keys in the environment, anything shaped like a key,
and the server's own key), as the server's logs and error bodies do.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from moot.files import StoreFileError, open_sqlite
from moot.runlock import RunLock, RunLocked
from moot.server.state.base import StoreBusy, StoreError, one_line
from moot.server.state.sql import SqlStore
from moot.server.state.sql_schema import migrations_for

#: How long a write waits for another process's (SQLite's busy timeout), and a new file's preparation
#: retries a lock SQLite refused at once (:meth:`SqliteStore._prepare`).
BUSY_TIMEOUT_S = 30.0


class SqliteStore(SqlStore):
    """One SQLite file; ``secrets``: the values to redact besides those :mod:`moot.secrets` knows
    (the server's key). Used from the server's event loop; a lock keeps each transaction whole if
    another thread reads meanwhile."""

    migrations: ClassVar[dict[int, list[str]]] = migrations_for("sqlite")

    def __init__(self, path: Path, secrets: Iterable[str] = ()) -> None:
        super().__init__(secrets)
        self.path = path
        self._lock = threading.RLock()
        self._server_lock: RunLock | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Read once (moot.files.open_sqlite): a truncated or foreign file is one line naming it.
            self.conn = open_sqlite(
                path, "a moot serve database", fix="give another --db file, or move that one away",
                check_same_thread=False,
            )  # fmt: skip
            # isolation_level None: no implicit transactions; each write begins its own (_tx).
            self.conn.isolation_level = None
            self.conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        except StoreFileError as exc:
            raise StoreError(str(exc)) from None
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"{path}: cannot open it as moot's SQLite store ({one_line(str(exc))})") from None
        try:
            self._prepare()
        except sqlite3.Error as exc:
            self.conn.close()
            raise StoreError(
                f"{path}: cannot open it as moot's SQLite store ({one_line(str(exc))}); give another --db file"
            ) from None
        except StoreError:
            self.conn.close()
            raise

    def _prepare(self) -> None:
        """WAL mode and the schema. Processes opening a new file together: SQLite answers "database is
        locked" at once, without waiting out the busy timeout, to the one of two readers that would
        otherwise wait on the other to write (switching to WAL takes the file whole); it tries again,
        for up to the busy timeout."""
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.execute("PRAGMA synchronous=NORMAL")
                self._migrate()
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(random.uniform(0.02, 0.2))

    def describe(self) -> str:
        return str(self.path)

    def close(self) -> None:
        self.conn.close()
        if self._server_lock is not None:
            self._server_lock.release()
            self._server_lock = None

    def take_server_lock(self) -> None:
        """The file's lock (``DB.lock`` beside it, the file a link names, released when the process
        ends, a ``kill -9`` included): a second server on the same file would mark the first's running
        debates interrupted."""
        if self._server_lock is not None:
            return
        real = self.path.resolve()  # one lock per file, whichever link or relative path names it
        try:
            self._server_lock = RunLock.acquire(
                real.parent,
                f"{real.name}.lock",
                label=f"--db {str(self.path)!r}",
                hint="a SQLite file is one server's: give another --db file, or give replicas one PostgreSQL "
                "database (--db postgresql://... or MOOT_DB_URL)",
            )
        except RunLocked as exc:
            raise StoreBusy(str(exc)) from None

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Cursor]:
        with self._lock:
            cursor = self.conn.cursor()
            cursor.execute("BEGIN IMMEDIATE")  # the write lock first: two claims cannot read the same row
            try:
                yield cursor
            except BaseException:
                if self.conn.in_transaction:  # (an error SQLite rolled back itself leaves none)
                    cursor.execute("ROLLBACK")
                raise
            else:
                cursor.execute("COMMIT")
            finally:
                cursor.close()

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self.conn.execute(sql, params).fetchall()

    def _now(self) -> tuple[str, list[Any]]:
        return "?", [time.time()]

    def _later(self, seconds: float) -> tuple[str, list[Any]]:
        return "?", [time.time() + seconds]
