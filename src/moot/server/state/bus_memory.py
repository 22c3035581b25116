"""The in-process bus (:class:`InProcessBus`), the default (no Redis): what one process needs. The
replica running a debate publishes into a channel in its own memory; a stream in another process
cannot read it, so there it polls the store every ``poll_s`` (0.5 s): the stored events only, no
token deltas."""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from moot.server.state.bus_base import DONE, POLL_S, RETENTION, WAIT_S, Bus, BusEvent, Publishable


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
