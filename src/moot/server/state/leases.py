"""The leases of the debates this replica runs (:class:`LeaseKeeper`): renewed while they run, a
debate *fenced* (stopped here, writing nothing more) once another replica may hold it, and handed
back to the store's queue when this replica stops.

A debate that starts is claimed in the store (:meth:`Store.claim`) by this replica, for
``settings.lease_s`` seconds, renewed every third of that while it runs; every write of it carries
its claim's epoch, and a write the store refuses (:class:`~moot.server.state.LeaseLost`: another
replica has claimed it since) stops the debate here without writing again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from moot.secrets import redact
from moot.server.settings import ServerSettings
from moot.server.state import LeaseLost, Store, StoreUnavailable
from moot.server.state.live import Chore, LiveDebate

log = logging.getLogger("moot.server")


class LeaseKeeper:
    """Renews, checks and gives up the leases of the debates live here (``live``, the manager's)."""

    def __init__(
        self,
        settings: ServerSettings,
        store: Store,
        live: dict[str, LiveDebate],
        *,
        drop_writes: Callable[[str], None],
    ) -> None:
        self.settings = settings
        self.store = store
        self.live = live
        #: A fenced debate's writes waiting to be made are dropped (:meth:`EventWriter.drop`).
        self._drop_writes = drop_writes
        #: Renews the leases of the running debates (:meth:`_renew`), while any runs.
        self._renewer = Chore("moot-leases", self._renew)

    def keep(self) -> None:
        """Renew the leases of the debates running here from now (:meth:`_renew`)."""
        self._renewer.start()

    async def stop(self) -> None:
        await self._renewer.stop()

    async def _renew(self) -> None:
        """Renew the lease of every debate this replica runs, every third of ``lease_s``, until none
        runs. A lease the store no longer holds for this replica fences its debate (:meth:`fence`);
        a store that cannot be reached is tried again next time (the lease may still hold)."""
        every = self.settings.lease_s / 3
        while True:
            await asyncio.sleep(every)
            leased = [d for d in self.live.values() if d.epoch is not None and not d.fenced]
            if not leased:
                return
            for live in leased:
                assert live.epoch is not None
                asked = time.monotonic()
                try:
                    self.store.renew(live.id, live.epoch, self.settings.lease_s)
                    live.renewed = asked
                except LeaseLost as exc:
                    self.fence(live, str(exc))
                except Exception as exc:
                    log.warning(
                        "debate %s: its lease could not be renewed (%s); trying again in %.0f s",
                        live.id,
                        redact(f"{type(exc).__name__}: {exc}", self.store.secrets),
                        every,
                    )

    def fence(self, live: LiveDebate, why: str, *, even_this_task: bool = False) -> None:
        """Another replica holds the debate now: stop it here, and write nothing more of it."""
        if live.fenced:
            return
        live.fenced = True
        self._drop_writes(live.id)
        live.tokens = {}
        log.warning("debate %s stops on this replica without writing: %s", live.id, why)
        runner = live.runner
        if runner is not None and not runner.done() and (even_this_task or runner is not asyncio.current_task()):
            runner.cancel()

    def lease_gone(self, live: LiveDebate) -> bool:
        """Whether a debate must stop on this replica before its next model call or event: fenced
        already, or (a shared store) its lease last claimed or renewed longer ago than the lease
        lasts, so that another replica may have taken it over while this process was stopped
        (SIGSTOP) or cut off. A local check, with no round trip: it stops here without writing, as
        a refused renewal does; the debate's streams here follow it where it goes on."""
        if live.fenced:
            return True
        if live.epoch is None or not self.store.shared:
            return False
        age = time.monotonic() - live.renewed
        if age <= self.settings.lease_s:
            return False
        self.fence(
            live,
            f"its lease was last renewed {age:.1f} s ago, longer than it lasts ({self.settings.lease_s:g} s): "
            "another replica may have taken it over",
            even_this_task=True,
        )
        return True

    def guard_call(self, live: LiveDebate) -> None:
        """Right before each model call of a debate (:data:`moot.models.base.BEFORE_CALL`): none is
        sent for one whose lease may have gone (:meth:`lease_gone`); it is cancelled instead."""
        if self.lease_gone(live):
            raise asyncio.CancelledError

    def release(self, live: LiveDebate) -> None:
        """Hand a debate back to the store's queue (a replica stopping): another claims it at once."""
        epoch = live.epoch if live.epoch is not None else live.claim.epoch if live.claim is not None else None
        if epoch is None or live.fenced:
            return
        try:
            self.store.release(live.id, epoch)
            log.info("debate %s handed back to the queue for another replica", live.id)
        except Exception as exc:  # lost already, or the store is down: its lease expires instead
            log.warning("debate %s could not be handed back (%s); it is taken over once its lease expires",
                        live.id, redact(f"{type(exc).__name__}: {exc}", self.store.secrets))  # fmt: skip

    def settle(self, live: LiveDebate) -> None:
        """A debate this replica stopped running (fenced) and another finished: its end as stored."""
        if not live.fenced:
            return
        try:
            row = self.store.get(live.id)
        except StoreUnavailable:  # (its waiter says where it went instead)
            return
        if row is not None and row.status not in ("queued", "running"):
            live.status = row.status
            live.result = row.result
            live.settled = True
