"""What ``moot serve`` needs from its store, whichever engine keeps it (:class:`Store`), and the
values that cross it: a stored debate, an event, a write, a claim of the queue.

Two backends implement it: :class:`~moot.server.state.sqlite.SqliteStore` (one file, the default)
and :class:`~moot.server.state.postgres.PostgresStore` (``--db postgresql://...``). Both run the same
SQL where they can (:class:`~moot.server.state.sql.SqlStore`) and pass the same contract tests
(tests/test_store_contract.py).

**Each debate's write stands or falls alone.** :meth:`Store.write_all` writes several debates'
writes (in one transaction: one commit for all): one that fails (a lost lease, a value the database
refuses) is rolled back alone, and reported, while the others are committed.

**The queue, with leases and fencing.** A debate waits ``queued``; a replica :meth:`~Store.claim`\\ s
it, which makes it the owner for ``lease_s`` seconds and adds one to the debate's ``epoch``. The
replica renews the lease while the debate runs (:meth:`~Store.renew`), and every write of a running
debate carries the epoch of its claim (:attr:`Write.epoch`): once another replica has claimed the
debate (its lease expired, or it was released), the epoch in the store is newer and the old owner's
writes are refused with :class:`LeaseLost`, so a replica that was stopped (SIGSTOP, a partition)
and comes back can no longer write. The turns already recorded stay in the stored transcript.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar, runtime_checkable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import BaseModel

from moot.core.types import DebateResult
from moot.server.schemas import DebateFields
from moot.server.state.keys import ApiKey
from moot.server.state.result_json import ResultJson

#: The version of the store's schema this moot writes. A store at an older version is migrated at
#: start; one at a newer version (written by a newer moot) is refused, naming both.
#: 1: debates, events, meta. 2: the queue's lease columns (owner, lease_until, epoch) and the
#: ``migrations`` table (one row per version applied, with when and by whom). 3: the API keys
#: (``api_keys``: hashed, with their limits and usage; ``key_windows``: their requests per minute),
#: and the key that submitted each debate (``debates.key_id``; ``counted``: its usage is in its key's).
#: 4: ``cancel_requested`` (a cancel sent to any replica, which the replica running the debate acts on:
#: docs/scale-out.md). 5: ``turns`` (a transcript's finished turns, one row each, written once;
#: ``debates.result`` holds the rest of it: :mod:`moot.server.state.result_json`).
SCHEMA_VERSION = 5

INTERRUPTED = "the server stopped while this debate was running; the transcript holds what was finished before"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class StoredDebate(DebateFields):
    """One row of ``debates``: the fields the API shows, its place in the list (``seq``) and its result."""

    seq: int
    result: DebateResult | None = None


#: The events the store does not keep: a turn's token deltas (each ``turn_done`` carries its whole text).
EPHEMERAL = frozenset({"token"})


class StoredEvent(BaseModel):
    id: int
    name: str
    data: str


@dataclass
class Write:
    """What one write of a debate sets: when it started (``started``: the time), its transcript as
    it is now with the events since the last write, and, when it ended, its final status. The
    manager merges a debate's writes of one moment (a turn's and its round's) into one.

    ``events``: their data redacted already, with the store's secrets (the writer redacts each
    event as it logs it, :meth:`moot.server.state.writes.EventWriter.log`, so that the live stream
    and the stored one are the same events).

    ``epoch``: the epoch of the claim the writer holds (:meth:`Store.claim`); the store refuses the
    write (:class:`LeaseLost`) when the debate's epoch is newer. None: an unfenced write, by a
    server that holds the whole store (its start-up recovery, a cancel of a debate never claimed)."""

    debate_id: str
    result: DebateResult | None
    events: list[StoredEvent] = field(default_factory=list)
    status: str | None = None
    error: str | None = None
    started: str | None = None
    epoch: int | None = None
    #: How the result is encoded: a live debate's :class:`ResultJson` (its finished turns encoded
    #: once); None: :meth:`DebateResult.to_json`, the same text.
    encoder: ResultJson | None = None


@dataclass(frozen=True)
class WriteFailure:
    """A debate whose write was refused or failed (rolled back alone): :meth:`Store.write_all`."""

    debate_id: str
    error: Exception
    #: Why, redacted, when the store could not write it (not a lost lease): the debate is then
    #: stored ``failed`` with this reason and stopped.
    reason: str | None = None

    @property
    def retry(self) -> bool:
        """The store could not be reached (:class:`StoreUnavailable`): nothing was written, and the
        write is to be tried again."""
        return isinstance(self.error, StoreUnavailable)


@dataclass(frozen=True)
class Claim:
    """A debate a replica now owns: write it with ``epoch``, renew it before ``lease_s`` pass.
    ``previous_owner``: the replica whose lease had expired (a take-over), else None; ``status``:
    the debate's status when claimed (``running``: it had started, and its recorded turns are in
    its stored transcript)."""

    debate_id: str
    epoch: int
    owner: str
    previous_owner: str | None
    status: str


class StoreError(Exception):
    """The store cannot be used as given: one line naming the problem and the fix (exit 2 at start)."""


class SchemaTooNew(StoreError):
    """The store was written by a newer moot, whose schema this one does not know."""


class StoreUnavailable(StoreError):
    """The store cannot be reached for now (PostgreSQL restarting, a network cut): the connection is
    made again at the next call. Nothing was written; the caller tries the write again later (a
    lease covers the gap)."""

    #: What a client is told (a 503, over HTTP or on a socket).
    TOLD = "the server's store cannot be reached for now; retry shortly"


T = TypeVar("T")

#: Seconds between two tries of a store a stream reads while it cannot be reached (:func:`patiently`).
PATIENCE_S = 0.5


async def patiently(read: Callable[[], T], every_s: float = PATIENCE_S) -> T:
    """``read()`` of the store, tried again every ``every_s`` while the store cannot be reached: a
    stream already open outlives a database restart (its keep-alive comments go on meanwhile), where
    a new request is answered 503. Any other error is raised."""
    while True:
        try:
            return read()
        except StoreUnavailable:
            await asyncio.sleep(every_s)


class StoreBusy(StoreError):
    """Another ``moot serve`` holds this store."""


class LeaseLost(Exception):
    """A write or renewal with an epoch the store no longer holds: another replica has claimed the
    debate since (or it was released). The write was not made."""

    def __init__(self, debate_id: str, epoch: int) -> None:
        super().__init__(
            f"debate {debate_id}: its lease (epoch {epoch}) is no longer this replica's; "
            "another replica has claimed it, so this one does not write it"
        )
        self.debate_id = debate_id
        self.epoch = epoch


@runtime_checkable
class Store(Protocol):
    """What the server needs from its store. Writes redact secrets (the server's key, keys in the
    environment, anything shaped like a key) on the way in, as the server's logs do."""

    #: Values redacted besides those :mod:`moot.secrets` knows (the server's key).
    secrets: list[str]
    #: Whether several ``moot serve`` replicas may share this store (PostgreSQL), each claiming
    #: debates from its queue and taking over those whose lease expired; else one server holds it
    #: (SQLite: :meth:`take_server_lock`).
    shared: bool

    def describe(self) -> str:
        """Where the debates are, for a log line: the file, or the URL with its password redacted."""
        ...

    def schema_version(self) -> int: ...

    def close(self) -> None: ...

    # -- writes

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
        """A new debate, ``queued``; returns its ``created_at``. ``key``: the API key that submits it
        (its usage is counted when it ends), refused with :class:`~moot.server.state.keys.LimitReached`
        when the key has ``key.concurrency`` debates unfinished already; ``capacity``: refused the same
        way when the store holds that many unfinished debates. Both are counted and the debate added
        in one transaction, serialised across replicas. ``claim_for``: (replica, lease_s): the debate
        is added claimed by that replica, epoch 1 (:meth:`claim`'s first), in the same transaction, so
        that no other replica's poller takes it between its creation and its submitter's claim."""
        ...

    def set_request(self, debate_id: str, request: dict[str, Any]) -> bool:
        """Replace the request a debate is stored with (redacted as at :meth:`create`): a stored
        Responses API response keeps its reply there. False: no such debate."""
        ...

    def delete(self, debate_id: str) -> bool:
        """Remove a debate and its events for good (``DELETE /v1/responses/{id}``). False: no such
        debate."""
        ...

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
        """The transcript as it is now, the events since the last write, and (when the debate
        ended) its final status: one transaction."""
        ...

    def finish_without_result(
        self, debate_id: str, status: str, error: str, events: list[StoredEvent], *, epoch: int | None = None
    ) -> None:
        """A debate that ended before it started (cancelled in the queue, refused at a restart)."""
        ...

    def write_one(self, write: Write) -> None:
        """One debate's write, in a transaction of its own; :class:`LeaseLost` if its epoch is stale."""
        ...

    def write_all(self, writes: Iterable[Write]) -> list[WriteFailure]:
        """Several debates' writes: a failure rolls back that debate's write alone, and is returned
        (the others are committed)."""
        ...

    # -- reads

    def unfinished(self) -> list[str]:
        """The debates ``queued`` or ``running``, oldest first."""
        ...

    def get(self, debate_id: str, *, with_result: bool = True) -> StoredDebate | None: ...

    def page(self, *, status: str | None, limit: int, before: int | None) -> list[StoredDebate]:
        """Newest first, those with ``seq`` below ``before``."""
        ...

    def events(self, debate_id: str, after: int = 0) -> list[StoredEvent]: ...

    def request(self, debate_id: str) -> dict[str, Any] | None:
        """The request a debate was created with, as stored (None: no such debate)."""
        ...

    def last_event_id(self, debate_id: str) -> int: ...

    # -- the queue

    def claim(self, replica: str, lease_s: float, *, debate_id: str | None = None) -> Claim | None:
        """The oldest debate no live lease holds (``queued``, or ``running`` under an expired lease:
        a take-over), now ``replica``'s for ``lease_s`` seconds with its epoch one higher; with
        ``debate_id``, that debate only. None: nothing to claim."""
        ...

    def renew(self, debate_id: str, epoch: int, lease_s: float) -> None:
        """Extend the lease by ``lease_s`` from now; :class:`LeaseLost` if ``epoch`` is stale."""
        ...

    def release(self, debate_id: str, epoch: int) -> None:
        """Hand a debate back (a replica stopping): its lease ends, so it is claimable at once, and
        the releaser's epoch is stale (its ``owner`` still names the releaser, the next claim's
        ``previous_owner``); :class:`LeaseLost` if ``epoch`` is stale already."""
        ...

    def expired(self) -> list[str]:
        """The unfinished debates whose owner's lease has expired, oldest first."""
        ...

    def lease(self, debate_id: str) -> tuple[str | None, int]:
        """The debate's owner (None: no one) and its epoch (0: never claimed, or no such debate)."""
        ...

    # -- cancels across replicas

    def request_cancel(self, debate_id: str) -> bool:
        """Mark a queued or running debate to be cancelled by whichever replica runs it; False if it
        has ended (or does not exist)."""
        ...

    def cancel_requested(self, debate_ids: Iterable[str]) -> list[str]:
        """Those of ``debate_ids`` whose cancel was requested (ended since, or not)."""
        ...

    def import_debate(self, debate: dict[str, Any], events: list[tuple[int, str, str]]) -> tuple[bool, int]:
        """A debate copied from another store (``moot serve migrate``), with its events: one
        transaction; whether it was new here, and how many of its events were."""
        ...

    # -- API keys (moot.server.state.keys)

    def add_key(
        self, name: str, hashed: str, *, rate_per_min: int | None = None, concurrency: int | None = None
    ) -> ApiKey:
        """A new key, by the hash of its value; :class:`DuplicateKeyName` if the name is taken."""
        ...

    def keys(self) -> list[ApiKey]:
        """Every key, revoked ones too, oldest first, with its usage."""
        ...

    def key_by_hash(self, hashed: str) -> ApiKey | None:
        """The key (revoked or not) whose value hashes to ``hashed``."""
        ...

    def key(self, key_id: str) -> ApiKey | None: ...

    def revoke_key(self, name_or_id: str) -> tuple[ApiKey, bool]:
        """Revoke a key by id or name; the key, and whether it was revoked now (False: it was
        already); :class:`UnknownKey` if there is none."""
        ...

    def import_key(self, key: dict[str, Any]) -> bool:
        """A key copied from another store (``moot serve migrate``), by its hash; whether it was new here."""
        ...

    def has_keys(self) -> bool:
        """Whether the store holds any key, revoked ones included (a server that needed a key
        once goes on needing one)."""
        ...

    def count_request(self, key_id: str, per_minute: int) -> float | None:
        """Count one request of the key in the current minute (the store's clock) unless it has
        made ``per_minute`` already: None when counted, else the seconds until the minute ends."""
        ...

    def take_server_lock(self) -> None:
        """Hold the store for this process alone, until it closes (:class:`StoreBusy` if another
        holds it): one server per SQLite store; in PostgreSQL, which replicas share, only
        ``moot serve migrate`` takes it (two copies into one database do not run at once)."""
        ...


def redact_url(url: str) -> str:
    """A database or Redis URL with its password (in the user part, or a ``password=`` parameter)
    replaced by ``***``, for a log line or an error."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        userinfo, at, hosts = netloc.rpartition("@")
        if at and ":" in userinfo:
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:***@{hosts}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            query = urlencode([(k, "***" if "password" in k.lower() else v) for k, v in pairs], safe="*")
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def url_password(url: str) -> str | None:
    """The password a URL carries, if any (to redact it from a driver's messages too)."""
    try:
        password = urlsplit(url).password
    except ValueError:
        return None
    return password or None


class Outage:
    """A warning of something out of reach for now (the store), said when it starts and then at most
    every ``every_s`` seconds while it goes on, with how often it recurred meanwhile: a retry every
    half second would otherwise say it 200 times in a 100 s outage."""

    def __init__(self, log: logging.Logger, every_s: float = 30.0) -> None:
        self.log = log
        self.every_s = every_s
        self._said_at: float | None = None
        self._since = 0
        #: Since when it has been reached without a failure (None: it is failing, or was never said).
        self._ok_since: float | None = None

    def warn(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        self._ok_since = None
        if self._said_at is not None and now - self._said_at < self.every_s:
            self._since += 1
            return
        if self._since:
            message += f" (again {self._since} times since the last such line)"
        self.log.warning(message, *args)
        self._said_at, self._since = now, 0

    def over(self) -> None:
        """It was reached: once it has been for ``every_s`` on end, the outage is over (how often it
        recurred since its last line is said) and the next one is said when it starts. A store that
        fails every other moment stays one outage, said every ``every_s``."""
        if self._said_at is None:
            return
        now = time.monotonic()
        if self._ok_since is None:
            self._ok_since = now
        if now - self._ok_since < self.every_s:
            return
        if self._since:
            self.log.warning("... and %d times more before it was reached again", self._since)
        self._said_at, self._since, self._ok_since = None, 0, None


def one_line(text: str) -> str:
    return " ".join(str(text).split())
