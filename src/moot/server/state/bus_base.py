"""The bus's interface (:class:`Bus`) and what both buses share: the events they carry
(:class:`BusEvent`), a subscription (:meth:`Bus.subscribe`) with its gaps filled from the store,
and the cancels handed to the handlers registered here (:meth:`Bus.on_cancel`).

**Subscribing** (:meth:`Bus.subscribe`) is the same for both: the events after a given id, in order,
each once, until the debate's ``debate_done``. What the bus no longer holds (older than its
retention, published while Redis was down, or before this process's channel existed) comes from the
store: a gap in the bus's ids is filled from the store's events between them (every event but the
token deltas, whose text each ``turn_done`` carries whole). When the bus cannot be read (Redis
down), the subscription polls the store until it can be again; nothing stored is lost.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from moot.server.state.base import EPHEMERAL, Store, StoreError, patiently

log = logging.getLogger("moot.server")

#: The name of the event that ends a debate's stream.
DONE = "debate_done"
#: The statuses of a debate not yet ended.
UNFINISHED = ("queued", "running")
#: Events of each debate a bus keeps (Redis: ``XADD MAXLEN ~``); older ones come from the store.
RETENTION = 10_000
#: Seconds between two reads of the store by a stream with no live feed (no Redis, or Redis down).
POLL_S = 0.5
#: Seconds a Redis read waits for an event before the subscription checks the store (a debate that
#: ended elsewhere without its end reaching the bus).
WAIT_S = 1.0


class BusError(StoreError):
    """The bus cannot be used as given (a wrong Redis URL at start): one line, the password redacted."""


class Publishable(Protocol):
    """An event as the manager logs it (:class:`~moot.server.state.events.LoggedEvent`)."""

    @property
    def id(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def data(self) -> str: ...


@dataclass(frozen=True, slots=True)
class BusEvent:
    id: int
    name: str
    data: str


class Bus(ABC):
    """Publish a debate's events, subscribe to them from any replica, and send it a cancel."""

    #: For the server's start-up line: ``in-process`` or the Redis URL (its password redacted).
    where: str = "in-process"

    def __init__(self, *, poll_s: float = POLL_S, wait_s: float = WAIT_S) -> None:
        self.poll_s = poll_s
        self.wait_s = wait_s
        self._cancel_handlers: list[Callable[[str], None]] = []

    # -- the interface

    @abstractmethod
    def publish(self, debate_id: str, events: Sequence[Publishable], *, epoch: int | None = None) -> None:
        """Events of a debate this replica runs, in order (never blocks: Redis is written by a task).
        ``epoch``: that of this replica's claim of the debate (:meth:`claim`); None: unclaimed."""

    @abstractmethod
    async def request_cancel(self, debate_id: str) -> bool:
        """Tell the replica running the debate (whichever it is) to cancel it; False if the bus
        could not carry it (the store's flag still does, at the running replica's next poll)."""

    def on_cancel(self, handler: Callable[[str], None]) -> None:
        """Call ``handler(debate_id)`` for every cancel requested on any replica."""
        self._cancel_handlers.append(handler)

    async def start(self) -> None:  # noqa: B027 - the in-process bus has nothing to start
        """Start what the bus runs in the background (Redis: its publisher and its cancel listener)."""

    async def aclose(self) -> None:  # noqa: B027 - nor anything to close
        """Send what is waiting to be published, and stop."""

    async def claim(self, debate_id: str, epoch: int) -> int:
        """A replica that has claimed a debate (a take-over) with ``epoch``: from now on the bus
        refuses the debate's events published under an older epoch (a replica that was stopped past
        its lease and comes back), and returns the highest event id it holds, read at the same
        moment (0: none). The in-process bus: its last id (no other process publishes into it)."""
        return await self.last_id(debate_id)

    @abstractmethod
    async def last_id(self, debate_id: str) -> int:
        """The highest event id the bus holds of the debate (0: none). A replica taking a debate
        over numbers its events above both this and the store's last id, so no id is used twice."""

    @abstractmethod
    async def _read(self, debate_id: str, after: int, wait_s: float) -> list[BusEvent] | None:
        """The events after ``after`` the bus holds, waiting up to ``wait_s`` for one ([] if none
        came); None: the bus has no live feed of this debate now (the subscriber polls the store)."""

    # -- the subscription, the same on every bus

    async def subscribe(
        self, store: Store, debate_id: str, after: int = 0, *, ended: bool = False
    ) -> AsyncIterator[list[BusEvent]]:
        """The debate's events with an id above ``after``, each once and in order, as they come,
        until its ``debate_done`` (or until the store says it ended). The bus's events first; what
        it lacks, from the store (see the module's doc). ``ended``: the debate has ended (the bus is
        read without waiting: what it still holds, then the store; its token deltas are kept from a
        reader arriving after the end, as the store keeps them: never redacted, they were a live
        reader's only)."""
        last = after
        settled = ended
        wait_s = 0.0 if ended else self.wait_s
        while True:
            batch = await self._read(debate_id, last, wait_s)
            if batch is None or not batch:
                # No live feed (or nothing new for wait_s): what the store has, and whether it ended.
                ended = await patiently(lambda: _ended(store, debate_id))
                held = await patiently(functools.partial(store.events, debate_id, last))
                stored = [BusEvent(e.id, e.name, e.data) for e in held]
                if stored:
                    yield stored
                    last = stored[-1].id
                    if any(e.name == DONE for e in stored):
                        return
                if ended:
                    return
                if batch is None:
                    await self._idle(debate_id)
                continue
            batch = [e for e in batch if e.id > last]
            if not batch:
                continue
            batch = await patiently(functools.partial(_filled, store, debate_id, last, batch))
            top = batch[-1].id
            if settled:
                batch = [e for e in batch if e.name not in EPHEMERAL]
            for i, event in enumerate(batch):
                if event.name == DONE:
                    yield batch[: i + 1]
                    return
            if batch:
                yield batch
            last = top

    async def _idle(self, debate_id: str) -> None:
        """Between two reads of the store, when the bus has no live feed of the debate."""
        await asyncio.sleep(self.poll_s)

    def _cancelled(self, debate_id: str) -> None:
        for handler in self._cancel_handlers:
            try:
                handler(debate_id)
            except Exception as exc:  # one handler's bug is not another's
                log.error("a cancel of debate %s failed here: %s: %s", debate_id, type(exc).__name__, exc)


def _filled(store: Store, debate_id: str, last: int, batch: list[BusEvent]) -> list[BusEvent]:
    """A batch read from the bus with any gap in its ids (before its first, or between two) filled
    with the store's events in it: events older than the bus's retention, dropped while it was down,
    or stored by a replica that stopped before it published them, which the replica taking its
    debate over numbers above (so they sit between its predecessor's last and its first on the
    bus). A gap the store cannot fill is token deltas, which it does not keep."""
    top = batch[-1].id
    if top - last == len(batch):  # (ids that only go up, above last: none missing)
        return batch
    have = {e.id for e in batch}
    missing = [BusEvent(e.id, e.name, e.data) for e in store.events(debate_id, last) if e.id < top and e.id not in have]
    return sorted(batch + missing, key=lambda e: e.id) if missing else batch


def _ended(store: Store, debate_id: str) -> bool:
    row = store.get(debate_id, with_result=False)
    return row is None or row.status not in UNFINISHED


# ---------------------------------------------------------------------------------- in process
