"""The bus over Redis (:class:`RedisBus`; ``moot serve --redis redis://...`` or ``MOOT_REDIS_URL``):
one Redis Stream per debate (``moot:events:<debate id>``), whose entry ids are moot's own event
ids (``<id>-0``), so a subscriber resumes after any id (``Last-Event-ID`` means the same on every
replica), token deltas included. ``XADD ... MAXLEN ~ retention`` keeps the newest events of each
debate, and the key expires ``ttl_s`` after its last event. Cancels go out on the pub/sub channel
``moot:cancel``. A claimed debate's events are added by a script that refuses them once a newer
claim holds the stream (``moot:epoch:<debate id>``, set by :meth:`Bus.claim` when a replica takes
the debate over): a replica stopped past its lease that comes back publishes nothing more of it.
A Redis URL is checked at start in one line (:func:`check_redis`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from moot.server.state.base import EPHEMERAL, one_line, redact_url, url_password
from moot.server.state.bus_base import POLL_S, RETENTION, WAIT_S, Bus, BusError, BusEvent, Publishable

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("moot.server")

#: Seconds a debate's Redis stream is kept after its last event.
TTL_S = 3600.0
#: Seconds a bus that failed (Redis down) is left alone before it is tried again.
RETRY_S = 2.0
#: Events waiting to be written to Redis beyond which a replica drops new ones (Redis not keeping up).
MAX_PENDING = 100_000
#: Stored events of one debate a replica keeps to publish once Redis answers again (the newest: older
#: ones are in the store by then, which a stream's gap is filled from).
BACKLOG = 1000
#: The pub/sub channel of cancels.
CANCEL_CHANNEL = "moot:cancel"


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
        if not password and ("NOAUTH" in text or "must be called with the client already authenticated" in text):
            raise BusError(
                f"{where}: Redis asks for a password and the URL gives none; give it as redis://:PASSWORD@host:port/db"
            ) from None
        raise BusError(
            f"{where}: Redis cannot be used ({text}); check the host, port and password, or leave --redis out "
            "(one replica, or streams that poll the store)"
        ) from None
