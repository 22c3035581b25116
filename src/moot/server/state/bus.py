"""The live bus: a debate's events from the replica that runs it to a stream opened on any replica,
and a cancel from any replica to the one that runs the debate.

Two implementations of one interface (:class:`Bus`):

- :class:`InProcessBus`, the default (no Redis): what one process needs. The replica running a
  debate publishes into a channel in its own memory; a stream in another process cannot read it, so
  there it polls the store every ``poll_s`` (0.5 s): the stored events only, no token deltas.
- :class:`RedisBus` (``moot serve --redis redis://...`` or ``MOOT_REDIS_URL``): one Redis Stream per
  debate (``moot:events:<debate id>``), whose entry ids are moot's own event ids (``<id>-0``), so a
  subscriber resumes after any id (``Last-Event-ID`` means the same on every replica), token deltas
  included. ``XADD ... MAXLEN ~ retention`` keeps the newest events of each debate, and the key
  expires ``ttl_s`` after its last event. Cancels go out on the pub/sub channel ``moot:cancel``.
  A claimed debate's events are added by a script that refuses them once a newer claim holds the
  stream (``moot:epoch:<debate id>``, set by :meth:`Bus.claim` when a replica takes the debate
  over): a replica stopped past its lease that comes back publishes nothing more of it.

**Subscribing** (:meth:`Bus.subscribe`) is the same for both: the events after a given id, in order,
each once, until the debate's ``debate_done``. What the bus no longer holds (older than its
retention, published while Redis was down, or before this process's channel existed) comes from the
store: a gap in the bus's ids is filled from the store's events between them (every event but the
token deltas, whose text each ``turn_done`` carries whole). When the bus cannot be read (Redis
down), the subscription polls the store until it can be again; nothing stored is lost.

**Cancels** (:meth:`Bus.request_cancel`) reach the handlers registered with :meth:`Bus.on_cancel`
(the manager's) on every replica; the store's ``cancel_requested`` is the truth, and the manager
also polls it, so a cancel published while Redis is down still arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from moot.server.state.base import EPHEMERAL, Store, StoreError, one_line, redact_url, url_password

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("moot.server")

#: The name of the event that ends a debate's stream.
DONE = "debate_done"
#: The statuses of a debate not yet ended.
UNFINISHED = ("queued", "running")
#: Events of each debate a bus keeps (Redis: ``XADD MAXLEN ~``); older ones come from the store.
RETENTION = 10_000
#: Seconds a debate's Redis stream is kept after its last event.
TTL_S = 3600.0
#: Seconds between two reads of the store by a stream with no live feed (no Redis, or Redis down).
POLL_S = 0.5
#: Seconds a Redis read waits for an event before the subscription checks the store (a debate that
#: ended elsewhere without its end reaching the bus).
WAIT_S = 1.0
#: Seconds a bus that failed (Redis down) is left alone before it is tried again.
RETRY_S = 2.0
#: Events waiting to be written to Redis beyond which a replica drops new ones (Redis not keeping up).
MAX_PENDING = 100_000
#: Stored events of one debate a replica keeps to publish once Redis answers again (the newest: older
#: ones are in the store by then, which a stream's gap is filled from).
BACKLOG = 1000
#: The pub/sub channel of cancels.
CANCEL_CHANNEL = "moot:cancel"


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


def events_key(debate_id: str) -> str:
    return f"moot:events:{debate_id}"


def epoch_key(debate_id: str) -> str:
    """The epoch of the newest claim of the debate that published to (or claimed) its stream."""
    return f"moot:epoch:{debate_id}"


#: Add a claimed debate's events (ARGV: epoch, retention, ttl, then id, name, data of each) unless a
#: newer claim holds its stream: -1 then, else how many Redis took (an id at or below the stream's
#: top is skipped, as XADD refuses it).
_FENCED_XADD = """
local held = tonumber(redis.call('GET', KEYS[2]) or '0')
local epoch = tonumber(ARGV[1])
if epoch < held then return -1 end
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[3])
local added = 0
for i = 4, #ARGV, 3 do
  local ok = redis.pcall('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], ARGV[i] .. '-0', 'n', ARGV[i + 1], 'd', ARGV[i + 2])
  if type(ok) ~= 'table' or not ok.err then added = added + 1 end
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
return added
"""
#: Claim a debate's stream for an epoch (ARGV: epoch, ttl): older epochs' events are refused from
#: now on; returns the id of the stream's newest entry (false: none), read in the same step.
_CLAIM = """
local held = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) > held then redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2]) end
local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #top == 0 then return false end
return top[1][1]
"""


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
        read without waiting: what it still holds, token deltas included, then the store)."""
        last = after
        wait_s = 0.0 if ended else self.wait_s
        while True:
            batch = await self._read(debate_id, last, wait_s)
            if batch is None or not batch:
                # No live feed (or nothing new for wait_s): what the store has, and whether it ended.
                ended = _ended(store, debate_id)
                stored = [BusEvent(e.id, e.name, e.data) for e in store.events(debate_id, last)]
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
            batch = _filled(store, debate_id, last, batch)
            for i, event in enumerate(batch):
                if event.name == DONE:
                    yield batch[: i + 1]
                    return
            yield batch
            last = batch[-1].id

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


@dataclass
class _Channel:
    events: deque[BusEvent]
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    done: bool = False


class InProcessBus(Bus):
    """The bus of one process: each debate's newest ``retention`` events in memory, for streams in
    this process; cancels to the handlers of this process. A stream in another process polls the
    store (:meth:`Bus.subscribe`). The channels of the last ``keep_finished`` debates that ended are
    kept; older ones are dropped (their events are in the store)."""

    def __init__(
        self, *, retention: int = RETENTION, keep_finished: int = 64, poll_s: float = POLL_S, wait_s: float = WAIT_S
    ) -> None:
        super().__init__(poll_s=poll_s, wait_s=wait_s)
        self.retention = retention
        self.keep_finished = keep_finished
        self._channels: dict[str, _Channel] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        #: Set (and replaced) when a debate's channel is created: a subscriber waiting for it wakes.
        self._created = asyncio.Event()

    def publish(self, debate_id: str, events: Sequence[Publishable], *, epoch: int | None = None) -> None:
        if not events:
            return
        channel = self._channels.get(debate_id)
        if channel is None:
            channel = self._channels[debate_id] = _Channel(deque(maxlen=self.retention))
            self._created.set()
            self._created = asyncio.Event()
        top = channel.events[-1].id if channel.events else 0
        for e in events:
            if e.id > top:  # ids only go up: a stale replica's (fenced) are not mixed in
                channel.events.append(BusEvent(e.id, e.name, e.data))
                top = e.id
                if e.name == DONE:
                    channel.done = True
        channel.changed.set()
        channel.changed = asyncio.Event()
        if channel.done:
            self._finished[debate_id] = None
            while len(self._finished) > self.keep_finished:
                old, _ = self._finished.popitem(last=False)
                self._channels.pop(old, None)

    async def request_cancel(self, debate_id: str) -> bool:
        self._cancelled(debate_id)
        return True

    async def last_id(self, debate_id: str) -> int:
        channel = self._channels.get(debate_id)
        return channel.events[-1].id if channel is not None and channel.events else 0

    async def _idle(self, debate_id: str) -> None:
        """Until the next read of the store, or until this process publishes the debate."""
        if debate_id not in self._channels:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._created.wait(), self.poll_s)

    async def _read(self, debate_id: str, after: int, wait_s: float) -> list[BusEvent] | None:
        channel = self._channels.get(debate_id)
        if channel is None:
            return None
        events = _after(channel.events, after)
        if events or channel.done:
            return events
        changed = channel.changed
        if wait_s <= 0:
            return []
        try:
            await asyncio.wait_for(changed.wait(), wait_s)
        except TimeoutError:
            return []
        return _after(channel.events, after)


def _after(events: deque[BusEvent], after: int) -> list[BusEvent]:
    """The events with an id above ``after``, read from the newest back (a reader is near the end)."""
    out: list[BusEvent] = []
    for e in reversed(events):
        if e.id <= after:
            break
        out.append(e)
    out.reverse()
    return out


# ------------------------------------------------------------------------------------- Redis


def _redis_error() -> tuple[type[Exception], ...]:
    from redis.exceptions import RedisError

    return (RedisError, OSError)


class RedisBus(Bus):
    """The bus over Redis (see the module's doc). Publishing never blocks a debate: events wait in
    a buffer that one task writes in pipelines, in order; while Redis is down the token deltas are
    dropped, the failure is logged once, and Redis is tried again every ``retry_s``. The other
    events (those the store keeps) wait in a backlog, and go to Redis before any newer one of their
    debate once it answers again: a stream never reads a stored event's successor from Redis while
    the event itself is neither there nor yet in the store (the replica writes the store every few
    events, so a gap filled from the store at once could miss it)."""

    def __init__(
        self,
        url: str,
        *,
        retention: int = RETENTION,
        ttl_s: float = TTL_S,
        poll_s: float = POLL_S,
        wait_s: float = WAIT_S,
        retry_s: float = RETRY_S,
        client: Redis | None = None,
    ) -> None:
        super().__init__(poll_s=poll_s, wait_s=wait_s)
        from redis.asyncio import Redis

        self.url = url
        self.where = redact_url(url)
        self.retention = retention
        self.ttl_s = ttl_s
        self.retry_s = retry_s
        self._password = url_password(url)
        self.redis: Redis = client or Redis.from_url(
            url, decode_responses=True, socket_connect_timeout=2, health_check_interval=10
        )
        self._pending: list[tuple[str, int | None, list[BusEvent]]] = []
        self._pending_events = 0
        #: Per debate: the stored events Redis did not take (down, or not keeping up), and their epoch.
        self._backlog: dict[str, tuple[int | None, list[BusEvent]]] = {}
        self._wake = asyncio.Event()
        self._publisher: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._down_until = 0.0
        self._down_said = False
        self._stale_said: set[str] = set()

    # -- health

    def _failed(self, what: str, exc: BaseException) -> None:
        self._down_until = time.monotonic() + self.retry_s
        if not self._down_said:
            self._down_said = True
            log.warning(
                "Redis (%s) failed while %s: %s; streams on other replicas read the store meanwhile "
                "(stored events, no token deltas), and Redis is tried again every %.0f s",
                self.where,
                what,
                self._redact(f"{type(exc).__name__}: {exc}"),
                self.retry_s,
            )

    def _ok(self) -> None:
        if self._down_said:
            self._down_said = False
            log.warning("Redis (%s) answers again: live events go through it", self.where)

    def _down(self) -> bool:
        return time.monotonic() < self._down_until

    def _redact(self, text: str) -> str:
        text = one_line(text)
        return text.replace(self._password, "***") if self._password else text

    # -- publishing

    def publish(self, debate_id: str, events: Sequence[Publishable], *, epoch: int | None = None) -> None:
        if not events:
            return
        batch = [BusEvent(e.id, e.name, e.data) for e in events]
        if self._down():
            self._keep(debate_id, epoch, batch)
            return
        if self._pending_events >= MAX_PENDING:  # Redis too slow to keep up: shed, as when it is down
            self._failed("keeping up", TimeoutError(f"{self._pending_events} events waiting to be published"))
            self._keep(debate_id, epoch, batch)
            return
        self._pending_events += len(batch)
        self._pending.append((debate_id, epoch, batch))
        if self._publisher is None or self._publisher.done():
            self._publisher = asyncio.get_running_loop().create_task(self._publish_loop(), name="moot-bus-publish")
        self._wake.set()

    def _keep(self, debate_id: str, epoch: int | None, events: list[BusEvent]) -> None:
        """Events Redis did not take: the stored ones wait for it (the newest :data:`BACKLOG`)."""
        kept = [e for e in events if e.name not in EPHEMERAL]
        if not kept:
            return
        held_epoch, held = self._backlog.get(debate_id, (epoch, []))
        if epoch is not None and held_epoch is not None and epoch != held_epoch:
            if epoch < held_epoch:  # an older claim's events: Redis would refuse them
                return
            held = []  # a newer claim of the debate here: the older one's events would be refused
        self._backlog.pop(debate_id, None)
        self._backlog[debate_id] = (epoch, (held + kept)[-BACKLOG:])
        while len(self._backlog) > BACKLOG:  # a long outage: the debates kept longest are in the store
            del self._backlog[next(iter(self._backlog))]

    async def _publish_loop(self) -> None:
        errors = _redis_error()
        from redis.exceptions import ResponseError

        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._pending:
                continue
            pending, self._pending = self._pending, []
            self._pending_events = 0
            if self._down():
                for debate_id, epoch, events in pending:
                    self._keep(debate_id, epoch, events)
                continue
            if self._backlog:  # what waited for Redis goes before anything newer of its debate
                backlog, self._backlog = self._backlog, {}
                pending = [(d, epoch, events) for d, (epoch, events) in backlog.items()] + pending
            pipe = self.redis.pipeline(transaction=False)
            commands: list[tuple[str, bool]] = []  # (debate, fenced), one per command
            keys: dict[str, None] = {}
            for debate_id, epoch, events in pending:
                key = events_key(debate_id)
                keys[key] = None
                if epoch is not None:  # added only while no newer claim holds the debate (one script)
                    args: list[Any] = [epoch, self.retention, int(self.ttl_s)]
                    for e in events:
                        args += [e.id, e.name, e.data]
                    pipe.eval(_FENCED_XADD, 2, key, epoch_key(debate_id), *args)
                    commands.append((debate_id, True))
                    continue
                for e in events:
                    pipe.xadd(key, {"n": e.name, "d": e.data}, id=f"{e.id}-0", maxlen=self.retention, approximate=True)
                    commands.append((debate_id, False))
            for key in keys:
                pipe.expire(key, int(self.ttl_s))
            try:
                results = await pipe.execute(raise_on_error=False)
            except errors as exc:
                self._failed("publishing events", exc)
                newer, self._backlog = self._backlog, {}  # kept while this write went on (Redis marked down)
                for debate_id, epoch, events in pending:
                    self._keep(debate_id, epoch, events)
                for debate_id, (epoch, events) in newer.items():
                    self._keep(debate_id, epoch, events)
                continue
            except asyncio.CancelledError:
                raise
            self._ok()
            for (debate_id, fenced), outcome in zip(commands, results, strict=False):
                if debate_id in self._stale_said:
                    continue
                if isinstance(outcome, ResponseError):
                    # An id at or below one already there: another replica numbered it (a fenced one).
                    self._stale_said.add(debate_id)
                    log.warning("debate %s: Redis refused an event: %s", debate_id, self._redact(str(outcome)))
                elif fenced and outcome == -1:
                    self._stale_said.add(debate_id)
                    log.warning(
                        "debate %s: Redis refused this replica's events: another replica has claimed the debate since",
                        debate_id,
                    )

    async def aclose(self) -> None:
        if self._publisher is not None and not self._publisher.done() and self._pending:
            self._wake.set()
            for _ in range(50):  # what is waiting, for a moment (the store has it anyway)
                if not self._pending:
                    break
                await asyncio.sleep(0.01)
        for task in (self._publisher, self._listener):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._publisher = self._listener = None
        await self.redis.aclose()

    # -- reading

    async def _read(self, debate_id: str, after: int, wait_s: float) -> list[BusEvent] | None:
        if self._down():
            return None
        try:
            reply = await self.redis.xread(
                {events_key(debate_id): f"{after}-0"},
                count=1000,
                block=max(1, int(wait_s * 1000)) if wait_s > 0 else None,  # (0 would wait for ever)
            )
        except _redis_error() as exc:
            self._failed("reading a debate's events", exc)
            return None
        self._ok()
        out: list[BusEvent] = []
        streams: list[Any] = list(reply or [])
        for _key, entries in streams:
            for entry_id, values in entries:
                out.append(BusEvent(int(str(entry_id).split("-", 1)[0]), values["n"], values["d"]))
        return out

    async def claim(self, debate_id: str, epoch: int) -> int:
        try:
            top = await self.redis.eval(_CLAIM, 2, events_key(debate_id), epoch_key(debate_id), epoch, int(self.ttl_s))
        except _redis_error() as exc:
            self._failed("claiming a debate's stream", exc)
            return 0
        return int(str(top).split("-", 1)[0]) if top else 0

    async def last_id(self, debate_id: str) -> int:
        try:
            top = await self.redis.xrevrange(events_key(debate_id), count=1)
        except _redis_error() as exc:
            self._failed("reading a debate's last event id", exc)
            return 0
        return int(str(top[0][0]).split("-", 1)[0]) if top else 0

    # -- cancels

    async def request_cancel(self, debate_id: str) -> bool:
        try:
            await self.redis.publish(CANCEL_CHANNEL, debate_id)
        except _redis_error() as exc:
            self._failed("sending a cancel", exc)
            return False
        return True

    async def start(self) -> None:
        if self._listener is None:
            self._listener = asyncio.get_running_loop().create_task(self._listen(), name="moot-bus-cancels")

    async def _listen(self) -> None:
        """Every cancel on the channel, to the handlers; re-subscribed after Redis comes back."""
        errors = _redis_error()
        while True:
            try:
                async with self.redis.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(CANCEL_CHANNEL)
                    while True:
                        message = await pubsub.get_message(timeout=5.0)
                        if message is not None and message.get("type") == "message":
                            self._cancelled(str(message["data"]))
            except errors as exc:
                self._failed("listening for cancels", exc)
                await asyncio.sleep(self.retry_s)


def check_redis(url: str) -> None:
    """Refuse in one line (a :class:`BusError`, the password redacted) a Redis URL that cannot be
    used: malformed, of another scheme, unreachable, refusing the password; else return."""
    where = redact_url(url)
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise BusError(f"{where}: not a Redis URL; give redis://[:password@]host:port[/db] (or rediss:// for TLS)")
    try:
        from redis import Redis
    except ImportError:
        raise BusError("the redis package is not installed: pip install 'moot[redis]'") from None
    password = url_password(url)
    try:
        client = Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        text = one_line(f"{type(exc).__name__}: {exc}")
        if password:
            text = text.replace(password, "***")
        raise BusError(
            f"{where}: Redis cannot be used ({text}); check the host, port and password, or leave --redis out "
            "(one replica, or streams that poll the store)"
        ) from None


def open_bus(
    url: str | None,
    *,
    retention: int = RETENTION,
    ttl_s: float = TTL_S,
    poll_s: float = POLL_S,
    keep_finished: int = 64,
) -> Bus:
    """The bus ``url`` names: Redis, or (None) the in-process bus (``keep_finished``: the channels of
    finished debates it keeps, as many as the server keeps their logs in memory)."""
    if url is None:
        return InProcessBus(retention=retention, poll_s=poll_s, keep_finished=keep_finished)
    return RedisBus(url, retention=retention, ttl_s=ttl_s, poll_s=poll_s)
