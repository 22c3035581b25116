"""``moot serve migrate --from run.sqlite --to postgresql://...``: a SQLite deployment's debates and
their events, and its API keys (their hashes, limits and usage), copied into another store
(PostgreSQL, to run past one machine).

The source is read as it is (read-only: its schema is not migrated, nothing in it changes) under
its server lock, so no ``moot serve`` writes it meanwhile; the target is opened (migrated) under its
own. Each debate is copied with its events in a transaction of its own: one the target refuses is
named in one line and the others are copied. Copying again is safe: a debate already in the target
is kept as it is there, and only the events it lacks are added. Debates still ``queued`` or
``running`` are copied as they are, with no lease: the next server on the target queues the first
again and marks the second interrupted, as a restart on the SQLite file would.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moot.server.state.base import SCHEMA_VERSION, SchemaTooNew, Store, StoreError, one_line
from moot.server.state.result_json import assemble
from moot.server.state.sql_schema import COPIED, KEY_COPIED


@dataclass
class CopyReport:
    copied: int = 0
    #: The source's API keys (``moot serve keys``) new in the target, by their hashes.
    keys: int = 0
    #: Debates already in the target (their missing events added, if any).
    present: int = 0
    events: int = 0
    problems: int = 0


def open_source(path: Path) -> sqlite3.Connection:
    """The SQLite store to copy from, read-only; a file that is not one (or is newer than this moot)
    is a :class:`StoreError` of one line."""
    if not path.is_file():
        raise StoreError(f"{path}: no such file; give the SQLite file moot serve --db used")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as exc:
        raise StoreError(f"{path}: not a SQLite file moot can read ({one_line(str(exc))})") from None
    if not {"debates", "events", "meta"} <= tables:
        conn.close()
        raise StoreError(f"{path}: not a moot serve store (it has no debates and events tables)")
    row = conn.execute("SELECT value FROM meta WHERE key = 'store_version'").fetchone()
    version = int(json.loads(row[0])) if row is not None else 0
    if version > SCHEMA_VERSION:
        conn.close()
        raise SchemaTooNew(
            f"{path} holds moot serve's schema version {version}, written by a newer moot; this moot knows "
            f"versions up to {SCHEMA_VERSION}: upgrade moot (pip install -U moot) to copy it"
        )
    return conn


def _columns(source: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in source.execute(f"PRAGMA table_info({table})")}


def _debates(source: sqlite3.Connection) -> Iterator[dict[str, Any]]:
    # A source older than the API keys (schema 3) has no key columns: copied without them.
    present = _columns(source, "debates")
    columns = [c for c in COPIED if c in present]
    cursor = source.execute(f"SELECT {', '.join(columns)} FROM debates ORDER BY seq")
    for row in cursor:
        yield dict(zip(columns, row, strict=True))


def _whole(source: sqlite3.Connection, debate: dict[str, Any]) -> None:
    """A transcript stored in rows (schema 5: its frame in ``result``, its turns in ``turns``) made
    whole in ``debate``: the target reads one stored whole as one stored in rows."""
    if debate.get("result") is None:
        return
    rows = source.execute("SELECT place, data FROM turns WHERE debate_id = ? ORDER BY n", (debate["id"],))
    turns = [(int(place), str(data)) for place, data in rows]
    if turns:
        debate["result"] = assemble(debate["result"], turns).to_json(indent=None)


def _keys(source: sqlite3.Connection) -> list[dict[str, Any]]:
    if not _columns(source, "api_keys"):
        return []
    rows = source.execute(f"SELECT {', '.join(KEY_COPIED)} FROM api_keys ORDER BY created_at, id").fetchall()
    return [dict(zip(KEY_COPIED, row, strict=True)) for row in rows]


def copy_debates(
    source: sqlite3.Connection, target: Store, problem: Callable[[str], None] = lambda _: None
) -> CopyReport:
    """Every debate of ``source`` and its events into ``target``; ``problem`` is told each debate
    that could not be copied (one line), and the copy goes on."""
    report = CopyReport()
    # The keys first: the debates name them (their hashes only: the keys themselves are nowhere).
    for key in _keys(source):
        try:
            report.keys += target.import_key(key)
        except Exception as exc:  # this key alone is not copied: say which and why, go on
            report.problems += 1
            problem(f"key {key['name']!r} ({key['id']}): not copied ({type(exc).__name__}: {one_line(str(exc))})")
    split = bool(_columns(source, "turns"))  # (schema 5: transcripts in rows)
    for debate in _debates(source):
        events = source.execute(
            "SELECT id, name, data FROM events WHERE debate_id = ? ORDER BY id", (debate["id"],)
        ).fetchall()
        try:
            if split:
                _whole(source, debate)
            new, added = target.import_debate(debate, [(int(i), str(n), str(d)) for i, n, d in events])
        except Exception as exc:  # this debate alone is not copied: say which and why, go on
            report.problems += 1
            problem(f"debate {debate['id']}: not copied ({type(exc).__name__}: {one_line(str(exc))})")
            continue
        report.copied += new
        report.present += not new
        report.events += added
    return report
