"""The server's store: one interface (:class:`Store`), two backends (SQLite, the default; PostgreSQL).

``--db`` (or ``MOOT_DB_URL``) chooses: a ``postgresql://`` URL is PostgreSQL, anything else a
SQLite file. :func:`open_store` opens it, migrating its schema, and refuses in one line (a
:class:`StoreError`, the URL's password redacted) what cannot be used.

The rest of the server's state lives beside it: the live bus between replicas (:mod:`.bus`), each
debate's numbered event log (:mod:`.events`), the API keys as requests are checked
(:mod:`.keyring`), the debate manager (:mod:`.manager`: the queue, the tasks) and its collaborators
(:mod:`.live`, :mod:`.leases`, :mod:`.writes`: the store writes, :mod:`.recovery`, :mod:`.takeover`,
:mod:`.cancels`), and an ``Idempotency-Key``'s debate, created once (:mod:`.idempotency`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from moot.server.state.base import (
    INTERRUPTED,
    SCHEMA_VERSION,
    Claim,
    LeaseLost,
    SchemaTooNew,
    Store,
    StoreBusy,
    StoredDebate,
    StoredEvent,
    StoreError,
    StoreUnavailable,
    Write,
    WriteFailure,
    now,
    redact_url,
)
from moot.server.state.postgres import is_postgres_url

__all__ = [
    "INTERRUPTED",
    "SCHEMA_VERSION",
    "Claim",
    "LeaseLost",
    "SchemaTooNew",
    "Store",
    "StoreBusy",
    "StoreError",
    "StoreUnavailable",
    "StoredDebate",
    "StoredEvent",
    "Write",
    "WriteFailure",
    "check_db",
    "is_postgres_url",
    "now",
    "open_store",
    "redact_url",
]


def check_db(value: str) -> str:
    """``--db`` as given, refused in one line if it is a URL of an engine moot does not know."""
    if "://" in value and not is_postgres_url(value):
        scheme = value.split("://", 1)[0]
        raise StoreError(
            f"{redact_url(value)}: moot serve keeps its debates in a SQLite file or in PostgreSQL "
            f"(postgresql://user:password@host:port/database), not in {scheme}://"
        )
    return value


def open_store(db: str | Path, secrets: Iterable[str] = (), *, application_name: str = "moot serve") -> Store:
    """The store ``db`` names (a SQLite file's path, or a ``postgresql://`` URL), open and migrated."""
    if isinstance(db, str) and is_postgres_url(check_db(db)):
        from moot.server.state.postgres import PostgresStore

        return PostgresStore(db, secrets, application_name=application_name)
    from moot.server.state.sqlite import SqliteStore

    return SqliteStore(Path(db), secrets)
