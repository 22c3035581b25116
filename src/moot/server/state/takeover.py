"""A shared store's queue, looked at by this replica while it has a free slot (:class:`QueuePoller`):
it claims the oldest debate no live lease holds (one queued on a replica that was full, or one
whose replica died or stopped renewing) and runs it. A debate that had started is *taken over*:
rebuilt from its stored request (:meth:`Recovery.rebuild`) and resumed from its stored transcript
(:meth:`Engine.resume`), its events numbered on after the stored ones (:meth:`QueuePoller._first_id`).
One that cannot be rebuilt here ends ``failed`` with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from moot.secrets import redact
from moot.server.schemas import DebateDoneData
from moot.server.settings import ServerSettings
from moot.server.state import Claim, Store, StoredDebate, StoreUnavailable
from moot.server.state.base import one_line
from moot.server.state.bus import Bus
from moot.server.state.events import EventLog, LoggedEvent, done_data
from moot.server.state.live import Chore, LiveDebate, zero_totals

#: Ids a debate taken over skips above the highest its store and its bus hold (:meth:`QueuePoller._first_id`):
#: more than the events a replica can give its clients between two writes of the debate (its token
#: deltas, one per ``token_window_s`` per streaming turn: 100,000 is over 40 minutes of two turns
#: streaming at once at the default 50 ms). The ids stay far inside the store's 32-bit column.
TAKEOVER_ID_GAP = 100_000
#: Seconds a take-over waits for the bus to say the last id it holds (Redis hung: the gap covers it).
BUS_LOOKUP_S = 5.0

log = logging.getLogger("moot.server")


class QueuePoller:
    """Claims debates from the shared queue for this replica (``replica``) while one of its
    ``slots`` (the manager's) is free; ``start`` runs one, holding a slot for it (the manager's)."""

    def __init__(
        self,
        settings: ServerSettings,
        store: Store,
        bus: Bus,
        replica: str,
        live: dict[str, LiveDebate],
        slots: asyncio.Semaphore,
        *,
        start: Callable[[LiveDebate], None],
        rebuild: Callable[[str, dict[str, Any]], LiveDebate | str],
    ) -> None:
        self.settings = settings
        self.store = store
        self.bus = bus
        self.replica = replica
        self.live = live
        self._slots = slots
        self._start = start
        self._rebuild = rebuild
        #: Looks at the queue while this replica has a free slot (:meth:`_poll`).
        self._poller = Chore("moot-queue", self._poll)

    def start(self) -> None:
        """Look at the queue from now (once; :meth:`_poll`)."""
        self._poller.start()

    async def stop(self) -> None:
        await self._poller.stop()

    def _waiting_here(self) -> bool:
        """Whether a debate submitted here waits for a slot (it comes before the shared queue)."""
        return any(d.status == "queued" and d.claim is None for d in self.live.values())

    async def _poll(self) -> None:
        """While this replica has a free slot, every ``poll_s`` seconds: claim the oldest debate no
        live lease holds (queued on a replica that was full, or left by one that stopped) and run it."""
        down = False  # the store was out of reach at the last look: said once, and when it is back
        while True:
            await asyncio.sleep(self.settings.poll_s)
            try:
                if down:
                    self.store.expired()  # a read: it reconnects, or raises again
                    down = False
                    log.warning("the queue can be read again")
                while not self._waiting_here():
                    await self._slots.acquire()
                    held = False
                    try:
                        if self._waiting_here():
                            break
                        claim = self.store.claim(self.replica, self.settings.lease_s)
                        if claim is None:
                            break
                        held = await self._take(claim)
                    finally:
                        if not held:
                            self._slots.release()
            except Exception as exc:  # the store cannot be reached now: look again next time
                if not down:
                    log.warning(
                        "the queue could not be read (%s); looking again every %.1f s",
                        redact(f"{type(exc).__name__}: {exc}", self.store.secrets),
                        self.settings.poll_s,
                    )
                down = isinstance(exc, StoreUnavailable)

    def let_go_taken(self) -> None:
        """Debates submitted here that wait for a slot here, unclaimed, and that another replica's
        poller has taken from the shared queue: stopped here at once, writing nothing, so that their
        streams on this replica (a chat completion's caller waits on this one) follow them where
        they run through the bus, live, instead of once a slot frees here."""
        for live in list(self.live.values()):
            if live.status != "queued" or live.claim is not None or live.epoch is not None or live.fenced:
                continue
            owner, _ = self.store.lease(live.id)
            if owner is None or owner == self.replica:
                continue
            live.fenced = True
            log.info("debate %s, waiting here for a slot, runs on replica %s: its streams here follow it there",
                     live.id, owner)  # fmt: skip
            if live.runner is not None and not live.runner.done():
                live.runner.cancel()

    async def _first_id(self, debate_id: str, epoch: int) -> int:
        """The id above which a debate taken over numbers its events: the highest the store or the
        bus holds of it (a Redis stream keeps the token deltas, which the store does not; read as
        the bus is claimed for ``epoch``, after which it refuses the stopped replica's events), plus
        :data:`TAKEOVER_ID_GAP` for what neither may hold (events the stopped replica sent its own
        clients before they reached Redis, or with Redis down or absent). Every id a client may
        hold from the stopped replica is thus below the new ones: a ``Last-Event-ID`` resumes on
        any replica with no event skipped or repeated, and Redis (whose stream ids only grow)
        accepts the new ones. The events the stopped replica stored but had not yet published (it
        stopped between the two) go onto the bus first, so that its stream holds every stored one."""
        stored = self.store.last_event_id(debate_id)
        try:
            on_bus = await asyncio.wait_for(self.bus.claim(debate_id, epoch), BUS_LOOKUP_S)
        except Exception:  # Redis hung or down (claim says so in the log): the gap covers it
            return stored + TAKEOVER_ID_GAP
        if 0 < on_bus < stored:  # (a bus holding none of it: its subscribers read the store)
            self.bus.publish(debate_id, self.store.events(debate_id, on_bus), epoch=epoch)
        return max(stored, on_bus) + TAKEOVER_ID_GAP

    async def _take(self, claim: Claim) -> bool:
        """Run a debate the poller claimed (holding a slot for it): whether it runs here now, with
        the slot. One this replica runs already (its lease had expired: the store was out of reach)
        goes on under the new claim; one that cannot be built here ends ``failed``, with the reason."""
        claimed = time.monotonic()  # nothing awaited since the claim (:meth:`_poll`)
        here = self.live.get(claim.debate_id)
        if here is not None and here.fenced:  # stopping here (its lease went stale): claimable again
            try:
                self.store.release(claim.debate_id, claim.epoch)
            except Exception as exc:  # its lease expires instead
                log.warning("debate %s could not be handed back (%s)", claim.debate_id, type(exc).__name__)
            return False
        if here is not None:
            here.claim = claim
            here.renewed = claimed
            if here.epoch is not None:
                here.epoch = claim.epoch
            return False
        stored = self.store.get(claim.debate_id)
        if stored is None:
            return False
        request = self.store.request(claim.debate_id) or {}
        built = self._rebuild(claim.debate_id, request)
        if isinstance(built, str):
            self._unresumable(claim, stored, built, await self._first_id(claim.debate_id, claim.epoch))
            return False
        built.claim = claim
        built.renewed = claimed
        if claim.status == "running" or stored.started_at is not None:  # a take-over
            built.previous_replica = claim.previous_owner
            built.log = EventLog(
                [LoggedEvent(e.id, e.name, e.data) for e in self.store.events(claim.debate_id)],
                after=await self._first_id(claim.debate_id, claim.epoch),
            )
            if stored.result is not None:
                built.resume = stored.result
                built.result = stored.result
            log.warning(
                "debate %s is taken over from %s, from its last finished turn",
                claim.debate_id,
                claim.previous_owner or "a replica that handed it back",
            )
        self._start(built)
        return True

    def _unresumable(self, claim: Claim, stored: StoredDebate, why: str, after: int) -> None:
        """A claimed debate this replica cannot build: ``failed`` with the reason, its recorded turns
        kept; its ``debate_done`` numbered above ``after`` (:meth:`_first_id`) and sent on the bus."""
        reason = one_line(
            f"replica {self.replica} cannot run this debate ({why}); it was stopped with the turns it had finished"
        )
        result = stored.result
        if result is not None:
            result.status, result.error = "failed", reason
            data = done_data(result, "failed", reason)
        else:
            data = DebateDoneData(status="failed", error=reason, totals=zero_totals())
        done = LoggedEvent(after + 1, "debate_done", data.model_dump_json())
        event = done.stored()
        try:
            if result is not None:
                self.store.write(claim.debate_id, result, [event], status="failed", error=reason, epoch=claim.epoch)
            else:
                self.store.finish_without_result(claim.debate_id, "failed", reason, [event], epoch=claim.epoch)
        except Exception as exc:  # another replica has it now, or the store is down: its lease expires
            log.warning("debate %s could not be marked failed: %s", claim.debate_id, exc)
        else:
            self.bus.publish(claim.debate_id, [done], epoch=claim.epoch)  # streams on the bus end now
        log.error("debate %s: %s", claim.debate_id, reason)
