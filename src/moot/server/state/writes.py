"""What a running debate's events become (:class:`EventWriter`): numbered into its
:class:`~moot.server.state.events.EventLog` (a turn's token deltas gathered over a short window),
and, on every finished turn and round, written to the store with the transcript as it stands, the
writes of one moment batched into one transaction and those the store could not take tried again.
"""

from __future__ import annotations

import asyncio
import logging
import time

from pydantic import BaseModel

from moot.core.cost import debate_cost
from moot.core.events import (
    DebateDone,
    DebateResumed,
    DebateStarted,
    Event,
    RoundDone,
    TokenDelta,
    TurnDone,
    TurnRetry,
    TurnStarted,
)
from moot.core.types import DebateResult
from moot.secrets import redact, redact_json
from moot.server.schemas import ResumedData, ServerStatus
from moot.server.settings import ServerSettings
from moot.server.state import LeaseLost, Store, Write, now
from moot.server.state.base import Outage
from moot.server.state.events import Token, to_payload, token_json
from moot.server.state.leases import LeaseKeeper
from moot.server.state.live import LiveDebate

#: Seconds before the writes the store could not take (it was out of reach) are tried again.
RETRY_WRITES_S = 0.5

log = logging.getLogger("moot.server")


class EventWriter:
    """The events of the debates live here (``live``, the manager's) into their logs and the store."""

    def __init__(
        self, settings: ServerSettings, store: Store, live: dict[str, LiveDebate], leases: LeaseKeeper, replica: str
    ) -> None:
        self.settings = settings
        self.store = store
        self.live = live
        self.leases = leases
        self.replica = replica
        #: Store writes waiting for the event loop's next turn, by debate (:meth:`save`).
        self._writes: dict[str, Write] = {}
        #: The debates those writes are of, whose held events each write releases (:meth:`write_now`).
        self._writing: dict[str, LiveDebate] = {}
        self._write_soon = False
        #: Whether writes wait to be tried again (the store could not be reached).
        self._retry_soon = False
        self._outage = Outage(log)

    # -------------------------------------------------------------------------- into the log

    def on_event(self, live: LiveDebate, event: Event) -> None:
        """An event of the debate's engine (:attr:`Engine.on_event`): into its log, and stored."""
        if type(event) is TokenDelta:
            pending = live.tokens.get((event.speaker, event.round))
            if pending is not None and live.flush is not None:
                # The hot path, most pieces of a turn: gathered until the window's flush, which
                # checks the lease before it sends them.
                pending.append(event.text)
                return
        if self.leases.lease_gone(live):
            return  # not this replica's any more, perhaps: delivered to no stream, written nowhere
        if live.tracer is not None and type(event) is not TokenDelta:
            live.tracer(event)
        if type(event) is TokenDelta:
            # Gathered over a short window: an SSE event (and a write to each stream) per generated
            # piece cost more than the rest of a served debate (docs/benchmarks.md, moot serve). A
            # turn's first piece goes at once, with whatever waits: the first token never waits.
            key = (event.speaker, event.round)
            pending = live.tokens.get(key)
            if pending is None:
                live.tokens[key] = [event.text]
            else:
                pending.append(event.text)
            if key not in live.streaming:
                live.streaming.add(key)
                self.flush_tokens(live)
            elif live.flush is None:
                window = self.settings.token_window_s
                if window > 0:
                    live.flush = asyncio.get_running_loop().call_later(window, self.flush_tokens, live)
                else:
                    self.flush_tokens(live)
            return
        if live.tokens:
            self.flush_tokens(live)  # a turn's tokens come before its turn_done or turn_retry
        if isinstance(event, TurnStarted | TurnRetry):  # a new attempt's first piece goes at once too
            live.streaming.discard((event.speaker, event.round))
        elif isinstance(event, TurnDone):
            live.streaming.discard((event.turn.speaker, event.turn.round))
        if isinstance(event, DebateStarted | DebateResumed):
            live.result = event.result
        if isinstance(event, DebateResumed):  # another replica ran it until it stopped: it goes on here
            resumed = ResumedData(
                replica=self.replica,
                previous_replica=live.previous_replica,
                kept_turns=event.kept_turns,
                round=event.round,
            )
            self.log(live, "resumed", resumed, hold=True)
            self.save(live, event.result)
            return
        if isinstance(event, DebateDone) and live.runner is not None and live.runner.cancelling():
            return  # the engine ending a debate this server cancels: DebateManager._stopped announces it
        if isinstance(event, DebateDone):
            event.result.cost = debate_cost(event.result, self.settings.prices)
        if isinstance(event, DebateDone) and live.quality:
            # Announced (and stored as finished) only once the quality is in the result: DebateManager._assess.
            self.save(live, event.result)
            return
        name, payload = to_payload(
            event,
            live.id,
            elapsed=time.perf_counter() - live.t0,
            decision_kind=live.spec.decision.kind,
            rounds=live.spec.rounds,
        )
        # The events written at once (a turn's or a round's end, the debate's) reach the streams once
        # stored (EventLog.release in write_now): none shows a turn that a replica killed before its
        # write never stored, and which the replica taking the debate over runs again.
        stored_now = isinstance(event, DebateStarted | TurnDone | RoundDone | DebateDone)
        self.log(live, name, payload, hold=stored_now)
        if isinstance(event, DebateStarted | TurnDone | RoundDone):
            self.save(live, event.result)
        elif isinstance(event, DebateDone):
            self.save(live, event.result, status=event.result.status, error=event.result.error)

    def log(self, live: LiveDebate, name: str, payload: BaseModel, *, hold: bool = False) -> None:
        """An event into the debate's log, its secrets redacted as the store redacts them: the live
        stream and the one replayed from the store are the same events. (A turn's token deltas are
        not stored and not redacted: they reach the live stream only, as the model generates them.)
        ``hold``: the streams get it once it is stored (:meth:`EventLog.append_json`)."""
        raw = payload.model_dump_json()
        data = redact_json(raw, self.store.secrets)
        # The payload goes with its JSON for this process's streams, unless redaction changed the JSON.
        live.log.append_json(name, data, payload if data is raw else None, hold=hold)

    def flush_tokens(self, live: LiveDebate) -> None:
        """The gathered token deltas into the log: one ``token`` event per turn that streamed."""
        if live.flush is not None:
            live.flush.cancel()
            live.flush = None
        if live.tokens and self.leases.lease_gone(live):
            live.tokens = {}
        if live.tokens:
            tokens = [Token(s, r, "".join(parts)) for (s, r), parts in live.tokens.items()]
            live.log.extend_ephemeral("token", [token_json(t.speaker, t.round, t.text) for t in tokens], tokens)
            live.tokens = {}

    # ------------------------------------------------------------------------ into the store

    def save(
        self,
        live: LiveDebate,
        result: DebateResult | None = None,
        *,
        started: bool = False,
        status: ServerStatus | None = None,
        error: str | None = None,
    ) -> None:
        """Store a debate's transcript as it is now and its events since the last write. The writes
        of one moment (a turn's and its round's; every debate's) are merged into one transaction in
        the event loop's next turn; a debate's end is written at once, with all that waits."""
        if live.fenced:
            return
        self._writing[live.id] = live
        write = self._writes.get(live.id)
        if write is None:
            write = self._writes[live.id] = Write(live.id, None)
        write.epoch = live.epoch
        write.encoder = live.result_json
        write.events += live.log.take_unsaved()
        if result is not None and live.store_error is None:
            write.result = result
        if started:
            write.started = now()
        if status is not None:
            write.status, write.error = status, error
            self.write_now()
        elif not self._write_soon:
            self._write_soon = True
            asyncio.get_running_loop().call_soon(self.write_now)

    def drop(self, debate_id: str) -> None:
        """Forget a debate's writes not yet made (it was fenced: another replica writes it now)."""
        self._writes.pop(debate_id, None)
        self._writing.pop(debate_id, None)

    def write_now(self) -> None:
        """The writes waiting (one transaction, :meth:`Store.write_all`): one refused (a lost lease)
        or failed is that debate's alone; the others are written. One the store could not be
        reached for is tried again a moment later (under its lease, which the renewals keep)."""
        self._write_soon = False
        if self._writes:
            writes, self._writes = list(self._writes.values()), {}
            writing, self._writing = self._writing, {}
            lost: set[str] = set()
            later: set[str] = set()
            for failure in self.store.write_all(writes):
                live = self.live.get(failure.debate_id)
                if failure.retry:
                    self._write_later(next(w for w in writes if w.debate_id == failure.debate_id), failure.error)
                    later.add(failure.debate_id)
                    if (waiting := writing.get(failure.debate_id)) is not None:
                        self._writing[failure.debate_id] = waiting  # (its held end, released once stored)
                elif isinstance(failure.error, LeaseLost):
                    lost.add(failure.debate_id)
                    # (a debate that ended here, its end held for this write, is no longer live: it
                    # is fenced all the same, so that a request waiting for it reads the end the
                    # store keeps, not this replica's)
                    target = live if live is not None else writing.get(failure.debate_id)
                    if target is not None:
                        self.leases.fence(target, str(failure.error))
                else:
                    reason = failure.reason or redact(
                        f"{type(failure.error).__name__}: {failure.error}", self.store.secrets
                    )
                    log.error("debate %s: a write to the store failed: %s", failure.debate_id, reason)
                    self._unstorable(failure.debate_id, reason)
            # The events held for these writes, to the streams: stored, or (a store out of reach:
            # tried again in a moment) sent on as before, the debate going on meanwhile. Those of a
            # debate another replica holds now are never sent from here.
            for w in writes:
                held = writing.get(w.debate_id)
                if held is not None and w.debate_id not in lost and not held.fenced:
                    held.log.release(stored=w.debate_id not in later)
            if not later:
                self._outage.over()

    def _write_later(self, write: Write, error: Exception) -> None:
        """A write the store could not take now: merged before any newer one of its debate, and tried
        again in a moment (nothing is lost while the lease holds)."""
        newer = self._writes.get(write.debate_id)
        if newer is not None:
            write.events += newer.events
            write.result = newer.result if newer.result is not None else write.result
            write.status, write.error = (
                (newer.status, newer.error) if newer.status is not None else (write.status, write.error)
            )
            write.started = write.started or newer.started
            write.epoch = newer.epoch
            write.encoder = newer.encoder or write.encoder
        self._writes[write.debate_id] = write
        if not self._retry_soon:
            self._retry_soon = True
            self._outage.warn("the store cannot be reached (%s); its writes are tried again in a moment", error)

            def again() -> None:
                self._retry_soon = False
                self.write_now()

            try:
                asyncio.get_running_loop().call_later(RETRY_WRITES_S, again)
            except RuntimeError:  # no loop (a shutdown's last write): nothing more can be done
                self._retry_soon = False

    def _unstorable(self, debate_id: str, reason: str) -> None:
        """The store refused a debate's write (the others' went in): it is stopped as ``failed``
        with the reason, unless it is ending already (the store has marked it failed)."""
        live = self.live.get(debate_id)
        if live is None or live.store_error is not None:
            return
        live.store_error = reason
        runner = live.runner
        if runner is not None and not runner.done() and runner is not asyncio.current_task():
            if live.cancel_as != "interrupted":  # a shutdown's interruption stands
                live.cancel_as = "failed"
            runner.cancel()
