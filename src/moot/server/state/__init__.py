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

import re
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


#: ``--db`` values meant for PostgreSQL that are not a ``postgresql://`` URL: a libpq keyword string
#: (``host=... password=...``), a misspelt scheme (``postgresql//``, ``postgresql:/``), or a URL's
#: user and password with no scheme at all. Taken as a SQLite path, each made a private store per
#: replica, named by the password.
_LIBPQ_KEYS = re.compile(r"(?:^|\s)(?:host|hostaddr|port|dbname|user|password|sslmode|service)\s*=", re.IGNORECASE)
_MISSPELT = re.compile(r"postgres(?:ql)?(?::|//)", re.IGNORECASE)
_SCHEMELESS = re.compile(r"^[^\s/:@]+:[^\s@]*@[^\s/@]+")
#: A SQLite file's name: never taken for PostgreSQL, whatever else it holds (``postgres.sqlite``).
_SQLITE_NAME = re.compile(r"\.(?:sqlite3?|db)$", re.IGNORECASE)
_POSTGRES_URL = "postgresql://user:password@host:port/database"


def _hidden(value: str) -> str:
    """``value`` with whatever may be a password in it (``password=...``, ``user:...@``) as ``***``."""
    value = re.sub(r"(password\s*=\s*)(?:'(?:[^'\\]|\\.)*'|\S+)", r"\1***", value, flags=re.IGNORECASE)
    return re.sub(r"([^\s:/@]+:)\S*@", r"\1***@", value)  # (to the last @: a password may hold one)


def check_db(value: str) -> str:
    """``--db`` as given, refused in one line if it is a URL of an engine moot does not know, or
    names PostgreSQL in another form than its URL (its password, if any, shown as ``***``)."""
    if "://" in value and not is_postgres_url(value):
        scheme = value.split("://", 1)[0]
        if not scheme.lower().startswith("postgres"):
            raise StoreError(
                f"{redact_url(value)}: moot serve keeps its debates in a SQLite file or in PostgreSQL "
                f"({_POSTGRES_URL}), not in {scheme}://"
            )
    if is_postgres_url(value) or _SQLITE_NAME.search(value.strip()) or Path(value).exists():
        return value
    meant = None
    if _MISSPELT.match(value.strip()):
        meant = "is not a PostgreSQL URL"
    elif len(_LIBPQ_KEYS.findall(value)) >= 2:
        meant = "is a libpq connection string"
    elif _SCHEMELESS.match(value.strip()):
        meant = "is a URL's user, password and host without its scheme"
    if meant is not None:
        raise StoreError(
            f"{_hidden(value)} {meant}; give PostgreSQL as {_POSTGRES_URL} (a SQLite store is a file's path)"
        )
    return value


def open_store(db: str | Path, secrets: Iterable[str] = (), *, application_name: str = "moot serve") -> Store:
    """The store ``db`` names (a SQLite file's path, or a ``postgresql://`` URL), open and migrated."""
    if isinstance(db, str) and is_postgres_url(check_db(db)):
        from moot.server.state.postgres import PostgresStore

        return PostgresStore(db, secrets, application_name=application_name)
    from moot.server.state.sqlite import SqliteStore

    return SqliteStore(Path(db), secrets)
