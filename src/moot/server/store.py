"""The server's debate store: one SQLite file, written as each debate grows.

Tables: ``debates`` (one row per debate: its request, status, and the whole transcript in the
``moot.debate/1`` JSON form, rewritten on every finished turn and round) and ``events`` (the
debate's events with the ids the live stream gave them, all but the token deltas, whose text each
``turn_done`` carries whole). WAL mode; the writes of one moment (every debate's turns and rounds
that ended in one turn of the event loop) are one transaction, committed in the loop's next turn,
and a debate's end at once: a server killed mid-debate loses nothing already written, and at the
next start the debates it was running are marked ``interrupted`` with their partial transcript,
and those still waiting in its queue are queued again. Each debate's part of a transaction is a
savepoint of its own: a write that fails is rolled back alone, its debate marked ``failed`` with
the reason (and stopped by the manager), and no other debate's write or event is lost with it.

Nothing secret is stored: the question, the request, the transcript, the events and the errors pass
through :mod:`moot.secrets` on the way in (the keys in the environment, anything shaped like a key,
and the server's own key), as the server's logs and error bodies do.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from moot.core.types import DebateResult
from moot.files import open_sqlite
from moot.secrets import redact, redact_json

STORE_VERSION = 1

log = logging.getLogger("moot.server")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS debates (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    status TEXT NOT NULL,
    protocol TEXT NOT NULL,
    question TEXT NOT NULL,
    model TEXT NOT NULL,
    created_at TEXT NOT NULL,
    started_at TEXT,
    finished_at TEXT,
    calls INTEGER NOT NULL DEFAULT 0,
    tokens INTEGER NOT NULL DEFAULT 0,
    elapsed_s REAL NOT NULL DEFAULT 0,
    error TEXT,
    request TEXT NOT NULL,
    result TEXT
);
CREATE INDEX IF NOT EXISTS debates_status ON debates (status, seq);
CREATE TABLE IF NOT EXISTS events (
    debate_id TEXT NOT NULL,
    id INTEGER NOT NULL,
    name TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (debate_id, id)
);
"""

INTERRUPTED = "the server stopped while this debate was running; the transcript holds what was finished before"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class StoredDebate(BaseModel):
    """One row of ``debates``."""

    seq: int
    id: str
    status: str
    protocol: str
    question: str
    model: str
    created_at: str
    started_at: str | None = None
    finished_at: str | None = None
    calls: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0
    error: str | None = None
    result: DebateResult | None = None


class StoredEvent(BaseModel):
    id: int
    name: str
    data: str


@dataclass
class Write:
    """What one write of a debate sets: when it started (``started``: the time), its transcript as
    it is now with the events since the last write, and, when it ended, its final status. The
    manager merges a debate's writes of one moment (a turn's and its round's) into one."""

    debate_id: str
    result: DebateResult | None
    events: list[StoredEvent] = field(default_factory=list)
    status: str | None = None
    error: str | None = None
    started: str | None = None


_COLUMNS = (
    "seq, id, status, protocol, question, model, created_at, started_at, finished_at, calls, tokens, elapsed_s, error"
)


class DebateStore:
    """A single writer (the server's event loop) over one SQLite file; ``secrets``: the values to
    redact besides those :mod:`moot.secrets` knows (the server's key)."""

    def __init__(self, path: Path, secrets: Iterable[str] = ()) -> None:
        self.path = path
        self.secrets = [s for s in secrets if s]
        path.parent.mkdir(parents=True, exist_ok=True)
        # A truncated or foreign file is a StoreFileError naming it (moot serve: before its banner).
        self.conn = open_sqlite(
            path, "a moot serve database", fix="give another --db file, or move that one away", check_same_thread=False
        )
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(_SCHEMA)
        with self.conn:
            self.conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('store_version', ?)", (json.dumps(STORE_VERSION),)
            )

    def close(self) -> None:
        self.conn.close()

    # ------------------------------------------------------------------------------- writes

    def create(self, debate_id: str, *, protocol: str, question: str, model: str, request: dict[str, Any]) -> str:
        created = now()
        with self.conn:
            self.conn.execute(
                "INSERT INTO debates (id, status, protocol, question, model, created_at, request) "
                "VALUES (?, 'queued', ?, ?, ?, ?, ?)",
                (
                    debate_id,
                    redact(protocol, self.secrets),  # an inline protocol's name is the caller's text
                    redact(question, self.secrets),
                    model,
                    created,
                    redact_json(json.dumps(request), self.secrets),
                ),
            )
        return created

    def write(
        self,
        debate_id: str,
        result: DebateResult,
        events: list[StoredEvent],
        *,
        status: str | None = None,
        error: str | None = None,
    ) -> None:
        """The transcript as it is now, the events since the last write, and (when the debate
        ended) its final status: one transaction (:meth:`write_all`)."""
        self.write_all([Write(debate_id, result, events, status=status, error=error)])

    def finish_without_result(self, debate_id: str, status: str, error: str, events: list[StoredEvent]) -> None:
        """A debate that ended before it started (cancelled in the queue)."""
        self.write_all([Write(debate_id, None, events, status=status, error=error)])

    def write_all(self, writes: Iterable[Write]) -> dict[str, str]:
        """Several debates' writes (:class:`Write`) in one transaction, each in its own savepoint: a
        write that fails (a transcript that cannot be encoded, a value SQLite refuses) is rolled back
        alone, and its debate is marked ``failed`` with the reason, its events kept when they can be
        (the transcript stays as last stored); every other debate's write is committed as it is.
        Returns the reasons of the debates whose write failed, by id (redacted)."""
        failed: dict[str, str] = {}
        with self.conn:
            self.conn.execute("BEGIN")
            for w in writes:
                self.conn.execute("SAVEPOINT debate_write")
                try:
                    self._apply(w)
                except Exception as exc:  # this debate's write only: the others' must not go with it
                    self.conn.execute("ROLLBACK TO debate_write")
                    reason = redact(
                        f"the server could not store this debate ({type(exc).__name__}: {exc}); it was stopped",
                        self.secrets,
                    )
                    failed[w.debate_id] = reason
                    log.error("debate %s: %s", w.debate_id, reason)
                    self._mark_failed(w, reason)
                self.conn.execute("RELEASE debate_write")
        return failed

    def _apply(self, w: Write) -> None:
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
            fields += ["status = ?", "finished_at = ?", "error = ?"]
            values += [w.status, now(), None if w.error is None else redact(w.error, self.secrets)]
        if fields:
            self.conn.execute(f"UPDATE debates SET {', '.join(fields)} WHERE id = ?", (*values, w.debate_id))
        self.conn.executemany(
            "INSERT OR IGNORE INTO events (debate_id, id, name, data) VALUES (?, ?, ?, ?)",
            [(w.debate_id, e.id, e.name, redact_json(e.data, self.secrets)) for e in w.events],
        )

    def _mark_failed(self, w: Write, reason: str) -> None:
        """A debate whose write failed: ``failed`` with the reason, with the write's events if they
        can be stored, else without them."""
        for events in (w.events, []):
            self.conn.execute("SAVEPOINT debate_failed")
            try:
                self._apply(Write(w.debate_id, None, events, status="failed", error=reason))
            except Exception:
                self.conn.execute("ROLLBACK TO debate_failed")
                self.conn.execute("RELEASE debate_failed")
                continue
            self.conn.execute("RELEASE debate_failed")
            return
        log.error("debate %s: not even its failure could be stored", w.debate_id)

    def unfinished(self) -> list[str]:
        rows = self.conn.execute("SELECT id FROM debates WHERE status IN ('queued', 'running') ORDER BY seq")
        return [r[0] for r in rows]

    # -------------------------------------------------------------------------------- reads

    def get(self, debate_id: str, *, with_result: bool = True) -> StoredDebate | None:
        cols = _COLUMNS + (", result" if with_result else "")
        row = self.conn.execute(f"SELECT {cols} FROM debates WHERE id = ?", (debate_id,)).fetchone()
        return None if row is None else _row(row, with_result)

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
        rows = self.conn.execute(sql, (*args, limit)).fetchall()
        return [_row(r, False) for r in rows]

    def events(self, debate_id: str, after: int = 0) -> list[StoredEvent]:
        rows = self.conn.execute(
            "SELECT id, name, data FROM events WHERE debate_id = ? AND id > ? ORDER BY id", (debate_id, after)
        )
        return [StoredEvent(id=i, name=n, data=d) for i, n, d in rows]

    def request(self, debate_id: str) -> dict[str, Any] | None:
        """The request a debate was created with, as stored (None: no such debate)."""
        row = self.conn.execute("SELECT request FROM debates WHERE id = ?", (debate_id,)).fetchone()
        if row is None:
            return None
        value: dict[str, Any] = json.loads(row[0])
        return value

    def last_event_id(self, debate_id: str) -> int:
        row = self.conn.execute("SELECT MAX(id) FROM events WHERE debate_id = ?", (debate_id,)).fetchone()
        return int(row[0] or 0)


def _row(row: tuple[Any, ...], with_result: bool) -> StoredDebate:
    keys = [c.strip() for c in _COLUMNS.split(",")]
    data = dict(zip(keys, row, strict=False))
    if with_result and row[-1] is not None:
        data["result"] = DebateResult.model_validate_json(row[-1])
    return StoredDebate.model_validate(data)
