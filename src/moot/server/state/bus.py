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

from moot.server.state.bus_base import POLL_S, RETENTION, Bus, BusError, BusEvent, Publishable
from moot.server.state.bus_memory import InProcessBus
from moot.server.state.bus_redis import TTL_S, RedisBus, check_redis, events_key

#: The bus's parts, each in its own module: the interface and the subscription (:mod:`.bus_base`),
#: the in-process bus (:mod:`.bus_memory`), the bus over Redis (:mod:`.bus_redis`).
__all__ = [
    "Bus",
    "BusError",
    "BusEvent",
    "InProcessBus",
    "Publishable",
    "RedisBus",
    "check_redis",
    "events_key",
    "open_bus",
]


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
