"""A cancel across replicas (:class:`Cancels`): a debate is cancelled wherever it runs, here at
once, on another replica through the store's ``cancel_requested`` mark and the bus; and, while
debates are live here, the store is watched for the cancels of them sent elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from moot.secrets import redact
from moot.server.schemas import DebateDoneData
from moot.server.settings import ServerSettings
from moot.server.state import LeaseLost, Store
from moot.server.state.base import Outage
from moot.server.state.bus import Bus
from moot.server.state.events import LoggedEvent
from moot.server.state.leases import LeaseKeeper
from moot.server.state.live import CANCELLED, Chore, LiveDebate, zero_totals
from moot.server.state.takeover import QueuePoller

log = logging.getLogger("moot.server")


class Cancels:
    """Cancels of the debates of a store, for this replica (``replica``; ``live``: its debates, the
    manager's); ``cancel`` stops one running here (:meth:`DebateManager.cancel`)."""

    def __init__(
        self,
        settings: ServerSettings,
        store: Store,
        bus: Bus,
        replica: str,
        live: dict[str, LiveDebate],
        leases: LeaseKeeper,
        poller: QueuePoller,
        *,
        cancel: Callable[[str], Awaitable[bool]],
    ) -> None:
        self.settings = settings
        self._cancels_unread = Outage(log)
        self._queue_unread = Outage(log)
        self.store = store
        self.bus = bus
        self.replica = replica
        self.live = live
        self.leases = leases
        self.poller = poller
        self._cancel = cancel
        #: Checks the store for cancels sent to other replicas while debates run here (:meth:`_watch`).
        self._watcher = Chore("moot-cancels", self._watch)

    def watch(self) -> None:
        """Watch the store for cancels of the debates live here, until none is (:meth:`_watch`)."""
        self._watcher.start()

    async def stop(self) -> None:
        await self._watcher.stop()

    async def anywhere(self, debate_id: str) -> bool | None:
        """Cancel a debate wherever it runs: here at once; on another replica through the store's
        ``cancel_requested`` and the bus, waiting up to ``cancel_wait_s`` for it to stop. True: it
        has stopped; None: it was asked to and has not stopped yet; False: it had ended already."""
        if not self.store.request_cancel(debate_id):
            return False
        if await self._cancel(debate_id):
            return True
        owner, _ = self.store.lease(debate_id)
        if owner is None:
            # Queued with no replica holding it (none has taken it from the queue yet): claimed here,
            # and ended as cancelled, atomically (a replica claiming it after finds it taken).
            claim = self.store.claim(self.replica, self.settings.lease_s, debate_id=debate_id)
            row = self.store.get(debate_id, with_result=False)
            if claim is not None and row is not None and row.status == "queued":
                done = LoggedEvent(
                    self.store.last_event_id(debate_id) + 1,
                    "debate_done",
                    DebateDoneData(status="cancelled", error=CANCELLED, totals=zero_totals()).model_dump_json(),
                )
                try:
                    self.store.finish_without_result(
                        debate_id, "cancelled", CANCELLED, [done.stored()], epoch=claim.epoch
                    )
                except LeaseLost:
                    pass  # taken meanwhile by the replica that runs it: its own check cancels it
                else:
                    self.bus.publish(debate_id, [done], epoch=claim.epoch)
                    await self.bus.request_cancel(debate_id)  # the replica queueing it lets it go
                    return True
            elif claim is not None:  # it had started (handed back by a replica): for a replica to resume
                with contextlib.suppress(LeaseLost):
                    self.store.release(debate_id, claim.epoch)
        await self.bus.request_cancel(debate_id)
        deadline = time.monotonic() + self.settings.cancel_wait_s
        while True:
            row = self.store.get(debate_id, with_result=False)
            if row is None or row.status not in ("queued", "running"):
                return True
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.05)

    def cancel_here(self, debate_id: str) -> None:
        """A cancel sent on any replica (the bus, or the store's mark): if the debate runs here, it
        stops. One still waiting here for a slot that another replica has ended already (it took
        it from the queue to cancel it) leaves this replica's queue, writing nothing."""
        live = self.live.get(debate_id)
        if live is None or live.runner is None or live.runner.done():
            return
        if live.epoch is None:
            row = self.store.get(debate_id, with_result=False)
            if row is not None and row.status not in ("queued", "running"):
                self.leases.fence(live, f"it was {row.status} on another replica before it started here")
                return
        log.info("debate %s: cancelled by a request sent to another replica", debate_id)
        live.runner.cancel()

    async def _watch(self) -> None:
        """While debates are live here: every ``cancel_poll_s``, the store's cancels of them (sent
        to another replica while the bus could not carry it, or without Redis), and (a shared
        store) those waiting here that another replica took from the queue
        (:meth:`QueuePoller.let_go_taken`)."""
        while self.live:
            await asyncio.sleep(self.settings.cancel_poll_s)
            try:
                wanted = self.store.cancel_requested(list(self.live))
            except Exception as exc:  # the store unreachable for now: the next tick tries again
                self._cancels_unread.warn(
                    "cancels could not be read from the store: %s", redact(f"{type(exc).__name__}: {exc}")
                )
                continue
            self._cancels_unread.over()
            for debate_id in wanted:
                self.cancel_here(debate_id)
            if self.store.shared:
                try:
                    self.poller.let_go_taken()
                except Exception as exc:  # the store unreachable for now: the next tick looks again
                    said = redact(f"{type(exc).__name__}: {exc}")
                    self._queue_unread.warn("the queue could not be read: %s", said)
                else:
                    self._queue_unread.over()
