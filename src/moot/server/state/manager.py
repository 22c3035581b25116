"""Debates as asyncio tasks in the server's loop: a bounded queue, a concurrency limit, the store.

The manager adds no round loop: each debate is one :meth:`Engine.run` whose events are numbered
into the debate's :class:`~moot.server.state.events.EventLog` and, on every finished turn and round,
written to the :class:`~moot.server.state.Store` with the transcript as it stands (:mod:`.writes`).
This module is the manager's public face (submit, cancel, follow, start, shutdown) and each
debate's run; its collaborators hold the rest, each with its own state:

- :mod:`.live`: a debate as this replica holds it (:class:`LiveDebate`);
- :mod:`.leases`: **leases** (:class:`LeaseKeeper`). A debate that starts is claimed in the store
  (:meth:`Store.claim`) by this replica, renewed while it runs; a write the store refuses
  (:class:`~moot.server.state.LeaseLost`) stops the debate here without writing again (*fenced*);
- :mod:`.writes`: its events into its log and the store, batched (:class:`EventWriter`);
- :mod:`.takeover`: a shared store's queue, polled (:class:`QueuePoller`);
- :mod:`.cancels`: a cancel across replicas (:class:`Cancels`);
- :mod:`.recovery`: stored debates built again (:class:`Recovery`).

**Replicas** (a shared store: PostgreSQL). Any number of ``moot serve`` processes share the store.
A debate is queued in it by the replica that received it, which runs it at once if it has a free
slot; besides, every replica with a free slot looks at the queue every ``settings.poll_s`` seconds
(:meth:`QueuePoller._poll`) and claims the oldest debate no live lease holds: one queued on a
replica that was full, or one whose replica died or stopped renewing (its lease expired). A debate
that had started is *taken over*: rebuilt from its stored request (:meth:`Recovery.rebuild`) and
resumed from its stored transcript (:meth:`Engine.resume`: the finished turns kept, neither run nor
paid again), its events going on after the stored ones with a ``resumed`` event. One that cannot be
rebuilt here (its model not configured on this replica, say) ends ``failed`` with the reason. On
SIGTERM a replica hands its debates back (:meth:`Store.release`) for another to take at once. With
SQLite (one server per store) nothing of this runs: at start the server marks the debates its
previous run left running ``interrupted`` and queues again those still waiting (:meth:`recover`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import statistics
import time
import uuid
import weakref
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any, cast

from moot.core.cost import debate_cost
from moot.core.engine import DebateTimeout, Engine
from moot.core.spec import ProtocolSpec
from moot.core.types import DebateQuality, DebateResult, DebateTask
from moot.models.base import BEFORE_CALL, BaseChatModel
from moot.secrets import redact
from moot.server.limits import RequestError
from moot.server.policy import Prepared, judge_of
from moot.server.schemas import DebateDoneData, DebateRequest, ServerStatus
from moot.server.settings import ServerSettings
from moot.server.state import INTERRUPTED, Claim, Store, StoreUnavailable
from moot.server.state.base import EPHEMERAL, PATIENCE_S
from moot.server.state.bus import Bus, BusEvent, InProcessBus
from moot.server.state.cancels import Cancels
from moot.server.state.events import EventLog, LoggedEvent, done_data
from moot.server.state.keyring import REQUEST_KEY
from moot.server.state.keys import LimitReached
from moot.server.state.leases import LeaseKeeper
from moot.server.state.live import (
    CANCELLED,
    DETACHED,
    NEVER_STARTED,
    LiveDebate,
    replica_name,
    stopped_from_outside,
    zero_totals,
)
from moot.server.state.recovery import Recovery
from moot.server.state.takeover import TAKEOVER_ID_GAP, QueuePoller
from moot.server.state.writes import EventWriter

#: What the doors import from here (a debate, and the words it ends with, live in :mod:`.live`).
__all__ = [
    "CANCELLED",
    "DETACHED",
    "NEVER_STARTED",
    "TAKEOVER_ID_GAP",
    "DebateManager",
    "LiveDebate",
    "QueueFull",
]

log = logging.getLogger("moot.server")


class QueueFull(Exception):
    """A submission over a limit: 429 with Retry-After; ``code`` names the limit (``queue_full``: the
    deployment's capacity; ``key_concurrency``: the API key's debates at once)."""

    def __init__(self, retry_after: int, capacity: int, message: str | None = None, code: str = "queue_full") -> None:
        super().__init__(message or f"the server is running and queueing {capacity} debates, its limit; retry later")
        self.retry_after = retry_after
        self.code = code


class DebateManager:
    def __init__(self, settings: ServerSettings, store: Store, bus: Bus | None = None) -> None:
        self.settings = settings
        self.store = store
        #: The live bus (:mod:`moot.server.state.bus`): this replica's events out to streams on any
        #: replica, their events in, and cancels both ways. The owner (the app) starts and closes it.
        self.bus: Bus = (
            bus
            if bus is not None
            else InProcessBus(
                retention=settings.bus_retention,
                keep_finished=settings.finished_logs_in_memory,
                poll_s=settings.stream_poll_s,
            )
        )
        self._stopping = False
        #: The name this process claims debates under (:meth:`Store.claim`).
        self.replica = replica_name()
        #: How the debate of a stored OpenAI request is built again, by route (the app registers the
        #: doors' own, which sit above the manager): to take one over from another replica.
        self.rebuilders: dict[str, Callable[[str, dict[str, Any]], LiveDebate]] = {}
        self.live: dict[str, LiveDebate] = {}
        self._slots = asyncio.Semaphore(settings.max_running)
        self._finished_logs: OrderedDict[str, EventLog] = OrderedDict()
        self._recent: deque[float] = deque(maxlen=20)
        #: The leases of the debates running here: renewed, checked, handed back (a fenced debate's
        #: waiting writes dropped from the writer below, made before any debate runs).
        self.leases = LeaseKeeper(settings, store, self.live, drop_writes=self._fenced)
        #: Their events into their logs and the store, the writes batched (:meth:`EventWriter.save`).
        self.writer = EventWriter(settings, store, self.live, self.leases, self.replica)
        #: Stored debates built again: at a restart (:meth:`recover`), or taken from the queue.
        self.recovery = Recovery(settings, store, self.rebuilders, self._start)
        #: Looks at a shared store's queue while this replica has a free slot (:meth:`start`).
        self.poller = QueuePoller(
            settings,
            store,
            self.bus,
            self.replica,
            self.live,
            self._slots,
            start=lambda live: self._start(live, slot=True),
            rebuild=self.recovery.rebuild,
        )
        #: Cancels across replicas: the bus's and the store's, watched while debates run here.
        self.cancels = Cancels(
            settings, store, self.bus, self.replica, self.live, self.leases, self.poller, cancel=self.cancel_local
        )
        self.bus.on_cancel(self.cancels.cancel_here)
        #: OpenTelemetry (``settings.trace``): one span tree per debate.
        self.tracing: Any = None
        if settings.trace or settings.trace_content:
            from moot.integrations.otel import tracing_from_env

            self.tracing = tracing_from_env(capture_content=settings.trace_content or None, warn=log.warning)

    # ---------------------------------------------------------------------------- lifecycle

    def recover(self) -> list[str]:
        """Take over what a previous process left unfinished (:meth:`Recovery.recover`): with a
        store of its own, its running debates marked interrupted (their ids are returned), its
        queued ones queued again; with a shared store nothing (the pollers take them over)."""
        return self.recovery.recover()

    @property
    def stopping(self) -> bool:
        """Whether this replica has begun to stop (:meth:`shutdown`)."""
        return self._stopping

    def start(self) -> None:
        """With a shared store, look at its queue while this replica has a free slot (:class:`QueuePoller`)."""
        if self.store.shared:
            self.poller.start()

    async def shutdown(self) -> None:
        """Stop every debate: each one running is stored as interrupted with what it had; each one
        still queued stays queued in the store, to run at the next start (:meth:`recover`). With a
        shared store, each one this replica holds is handed back instead (:meth:`Store.release`),
        its finished turns stored: another replica claims it at its next look at the queue and
        goes on from there, with no wait for the lease."""
        self._stopping = True
        await self.poller.stop()
        debates = list(self.live.values())
        for live in debates:
            live.cancel_as = "interrupted"
            live.hand_back = self.store.shared
            if live.runner is not None:
                live.runner.cancel()
        await asyncio.gather(*(d.runner for d in debates if d.runner is not None), return_exceptions=True)
        for live in debates:
            if not live.done.is_set():  # cancelled before it began: nothing ran, nothing to store
                if live.claim is not None:
                    self.leases.release(live)
                live.handed_back = self.store.shared  # (replicas: another one's poller takes it)
                self._finished(live, "queued")
        self.writer.write_now()
        await self.leases.stop()
        await self.cancels.stop()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)  # the spans buffered, exported before the end

    # ------------------------------------------------------------------------------ submit

    @property
    def capacity(self) -> int:
        return self.settings.max_running + self.settings.max_queued

    def _fenced(self, debate_id: str) -> None:
        """Another replica holds the debate now: its writes waiting here are dropped, and so is its log
        if it had ended here (its end held, then refused): it is read from the store and the bus, as
        every replica reads it, its events numbered there."""
        self.writer.drop(debate_id)
        self._finished_logs.pop(debate_id, None)

    def waits_for_slot(self, live: LiveDebate) -> bool:
        """Whether a queued debate waits for a slot (every one of ``max_running`` is taken), rather
        than only for its task's first step."""
        return live.status == "queued" and self._slots.locked()

    def retry_after(self) -> int:
        if not self._recent:
            return 5
        return max(1, min(300, math.ceil(statistics.fmean(self._recent))))

    def submit_request(
        self,
        prepared: Prepared,
        body: DebateRequest,
        *,
        recorded: dict[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        debate_id: str | None = None,
    ) -> LiveDebate:
        """Queue the debate of a ``POST /v1/debates`` body (or the MCP debate tool's, read into one),
        ``prepared`` by the server's policy: stored with the body as its request (``recorded``: what
        else is kept with it), with the quality assessment and the judge it asks for."""
        asked = body.quality_request()
        return self.submit(
            prepared.spec,
            prepared.task,
            prepared.engine,
            prepared.model,
            body.model_dump(mode="json", by_alias=True) | (recorded or {}),
            quality=asked is not None,
            judge=judge_of(asked, self.settings),
            headers=headers,
            debate_id=debate_id,
        )

    def submit(
        self,
        spec: ProtocolSpec,
        task: DebateTask,
        engine: Engine,
        model: str,
        request: dict[str, Any],
        *,
        quality: bool = False,
        judge: BaseChatModel | None = None,
        headers: Mapping[str, str] | None = None,
        debate_id: str | None = None,
    ) -> LiveDebate:
        """Queue a debate; ``headers``: the request's, whose W3C ``traceparent`` its spans join;
        ``debate_id``: its id, when the request names it (an ``Idempotency-Key``'s), else a new one
        (the store refuses an id it holds already)."""
        if self._stopping:  # (its debates are handed back or stored: a new one would wait out the stop)
            raise RequestError(
                "the server is stopping and takes no new debate; send the request again in a moment (to another "
                "replica, or to this server once it is back)",
                status=503,
                code="server_stopping",
            )
        debate_id = debate_id or uuid.uuid4().hex
        held = sum(1 for d in self.live.values() if d.claim is not None or d.epoch is not None)
        # With a slot free for it, the debate is added claimed by this replica, in the transaction
        # that adds it: another replica's poller (a shared store), which may look at the queue before
        # this debate's task first runs, must not take it from under its caller; and one transaction
        # less per debate. Counted by the claims held, not the semaphore: submissions arriving
        # together (whose tasks have not taken their slots yet) claim no more than the slots, and the
        # rest wait in the queue, where any replica's poller takes them.
        claim = held < self.settings.max_running
        asked = time.monotonic()
        # The capacity counts the store's unfinished debates, every replica's; the key's concurrency
        # its own (moot.server.state.keyring): both in the transaction that adds the debate.
        try:
            self.store.create(
                debate_id,
                protocol=spec.name,
                question=task.question,
                model=model,
                request=request,
                key=REQUEST_KEY.get(),
                capacity=self.capacity,
                claim_for=(self.replica, self.settings.lease_s) if claim else None,
            )
        except LimitReached as exc:
            code = "queue_full" if exc.limit == "capacity" else exc.limit
            raise QueueFull(self.retry_after(), exc.allowed, str(exc), code) from None
        live = LiveDebate(id=debate_id, spec=spec, task=task, engine=engine, model=model, quality=quality, judge=judge)
        if claim:
            live.claim = Claim(debate_id, 1, self.replica, None, "queued")
            live.renewed = asked
            live.epoch = live.claim.epoch
            self.leases.keep()  # renewed from now, should the task wait for its slot after all
        self._start(live, headers)
        return live

    def _start(self, live: LiveDebate, headers: Mapping[str, str] | None = None, *, slot: bool = False) -> None:
        """Run a debate as a task; ``slot``: the caller holds a slot for it already (:class:`QueuePoller`)."""
        if self.tracing is not None:
            parent = self.tracing.extract(headers) if headers else None
            live.tracer = self.tracing.handler(parent=parent, attributes={"moot.debate_id": live.id})
        self.live[live.id] = live
        live.log.sink = _weakly(live, lambda held, events: self.bus.publish(held.id, events, epoch=held.epoch))
        live.follow = functools.partial(self.follow, live.id)
        live.settle = self.leases.settle
        live.runner = asyncio.create_task(self._run(live, slot=slot), name=f"debate-{live.id}")
        self.cancels.watch()

    async def cancel_local(self, debate_id: str) -> bool:
        """Cancel a queued or running debate of this replica's; False if it is not live here (finished,
        unknown, or another replica's: a cancel a client asks for is :meth:`cancel_anywhere`)."""
        live = self.live.get(debate_id)
        if live is None or live.runner is None:
            return False
        live.runner.cancel()
        await live.done.wait()
        return True

    def forget(self, debate_id: str) -> None:
        """Drop a finished debate's event log from memory (its stored row was deleted)."""
        self._finished_logs.pop(debate_id, None)

    async def cancel_anywhere(self, debate_id: str) -> bool | None:
        """Cancel a debate wherever it runs (:meth:`Cancels.anywhere`): True: it has stopped; None:
        it was asked to and has not stopped yet (``cancel_wait_s``); False: it had ended already."""
        return await self.cancels.anywhere(debate_id)

    # ------------------------------------------------------------------------------ events

    async def follow(self, debate_id: str, after: int = 0) -> AsyncIterator[list[LoggedEvent]]:
        """A debate's events with an id above ``after``, wherever it runs, until it ends: from its
        log here while it runs here (token deltas included), else from the bus (another replica;
        without Redis, the store polled), else, when it has ended, from what the bus still holds of
        it, then the store. A debate that stops here without ending (another replica took it over:
        its lease) goes on from the bus."""
        last = after
        local = self.log_of(debate_id, from_store=False)
        if local is not None:
            # A reader arriving after the end reads the stored events, as from the store: the token
            # deltas were a live reader's only (never stored, never redacted).
            settled = debate_id not in self.live
            async for batch in local.batches(after):
                last = batch[-1].id
                if settled:
                    batch = [e for e in batch if e.name not in EPHEMERAL]
                    if not batch:
                        continue
                yield batch
            if self._stopping or (local.shown and local.shown[-1].name == "debate_done"):
                return
        while True:  # (patiently, but not past this server's stop: a request waits for nothing then)
            try:
                row = self.store.get(debate_id, with_result=False)
                break
            except StoreUnavailable:
                if self._stopping:
                    return
                await asyncio.sleep(PATIENCE_S)
        if row is None:
            return
        ended = row.status not in ("queued", "running")
        # Until the debate ends, or this server stops: a request waiting here for a debate another
        # replica runs is then answered where it went (a subscription waits for events, and an idle
        # debate gives none: its next batch is awaited a second at a time, never cancelled).
        batches = self.bus.subscribe(self.store, debate_id, last, ended=ended)
        pending: asyncio.Future[list[BusEvent]] | None = None
        try:
            while not self._stopping:
                pending = pending or asyncio.ensure_future(anext(batches))
                await asyncio.wait({pending}, timeout=1.0)
                if not pending.done():
                    continue
                try:
                    events = pending.result()
                except StopAsyncIteration:
                    return
                pending = None
                yield [LoggedEvent(e.id, e.name, e.data) for e in events]
        finally:
            if pending is not None:
                pending.cancel()
            with contextlib.suppress(Exception):
                await cast(AsyncGenerator[Any, None], batches).aclose()

    def log_of(self, debate_id: str, *, from_store: bool = True) -> EventLog | None:
        live = self.live.get(debate_id)
        if live is not None:
            return live.log
        log = self._finished_logs.get(debate_id)
        if log is not None or not from_store:
            return log
        if self.store.get(debate_id, with_result=False) is None:
            return None
        events = [LoggedEvent(e.id, e.name, e.data) for e in self.store.events(debate_id)]
        return EventLog(events, closed=True)

    # ------------------------------------------------------------------------------- running

    async def _run(self, live: LiveDebate, *, slot: bool = False) -> None:
        try:
            if not slot:
                await self._slots.acquire()
            try:
                await self._run_claimed(live)
            finally:
                self._slots.release()
        except asyncio.CancelledError as exc:
            _drop_tracebacks(exc)
            if live.fenced:
                self._finished(live, "interrupted")  # another replica has it: nothing more is written here
            elif live.hand_back and (live.epoch is not None or live.claim is not None):
                self.writer.write_now()  # its finished turns, stored before it is handed back
                self.leases.release(live)
                live.handed_back = True
                self._finished(live, "queued")
            elif live.cancel_as == "interrupted" and live.status == "queued":
                live.handed_back = self.store.shared  # (replicas: another one's poller takes it)
                self._finished(live, "queued")  # never started: the next start runs it
            else:
                self._stopped(live, live.cancel_as, live.store_error)
        except Exception as exc:  # a bug, not a model failure (the engine records those): keep the debate
            _drop_tracebacks(exc)
            self._stopped(live, "failed", redact(f"the server failed on this debate: {type(exc).__name__}: {exc}"))

    async def _run_claimed(self, live: LiveDebate) -> None:
        """Claim the debate (unless the poller has), then run it (or go on with it) to its end."""
        claim = live.claim
        if claim is None:
            asked = time.monotonic()
            try:
                claim = self.store.claim(self.replica, self.settings.lease_s, debate_id=live.id)
            except StoreUnavailable as exc:  # it stays queued in the store: a poller claims it once it is back
                log.warning("debate %s waits in the store's queue: %s", live.id, exc)
                # Not ended, and not this replica's to run now: a request waiting for it follows it to
                # where a poller runs it (LiveDebate.ended), not answered "never started".
                live.fenced = self.store.shared
                self._finished(live, "queued")
                return
            if claim is None:  # another replica holds it: it is not this one's to run
                self.leases.fence(live, "another replica holds its lease")
                self._finished(live, "interrupted")
                return
            live.claim = claim
            live.renewed = asked
        live.epoch = claim.epoch
        # Cancelled on another replica while it waited (one server's store: cancelled here, as a live debate).
        if self.store.shared and self.store.cancel_requested([live.id]):
            self._stopped(live, "cancelled")
            return
        self.leases.keep()
        live.status = "running"
        live.t0 = time.perf_counter() - (live.resume.elapsed_s if live.resume is not None else 0.0)
        if live.resume is None:
            self.writer.save(live, started=True)
        # (No closure over the debate stays in what it holds, its engine or its task's context, once
        # it ends: each would make a reference cycle that only the collector frees, and at 64 debates
        # at once its passes took about 6% of the server's CPU; docs/benchmarks.md, "Session 40".)
        live.engine.on_event = functools.partial(self.writer.on_event, live)
        # This task's model calls (and the judge's). The debate is held weakly: every timer and task
        # started from here (a connection's keep-alive, say) copies this context, and would keep the
        # whole debate in memory until it fires.
        guarded = BEFORE_CALL.set(_weakly(live, self.leases.guard_call))
        try:
            try:
                if live.resume is not None:
                    result = await live.engine.run(live.engine.resume(live.resume))
                else:
                    result = await live.engine.run(live.task)
            except DebateTimeout as exc:
                _drop_tracebacks(exc)
                result = exc.result
            finally:
                live.engine.on_event = None
            live.result = result
            if live.quality:
                await self._assess(live, result)
        finally:
            BEFORE_CALL.reset(guarded)
        self._recent.append(result.elapsed_s)
        self._finished(live, result.status)

    async def _assess(self, live: LiveDebate, result: DebateResult) -> None:
        """Add seed 004's quality to a finished debate, then announce and store it as done."""
        from moot.quality import assess

        try:
            result.quality = await assess(result, live.judge)
        except Exception as exc:  # the debate stands; say why its quality is missing
            reason = redact(f"the quality could not be assessed: {type(exc).__name__}: {exc}")
            result.quality = DebateQuality(unmeasured={"overall_quality": reason})
        if self.leases.lease_gone(live):
            raise asyncio.CancelledError  # not announced here: it may be another replica's now
        status: ServerStatus = result.status if result.status != "running" else "failed"
        self.writer.log(live, "debate_done", done_data(result, status), hold=True)
        self.writer.save(live, result, status=status, error=result.error)

    def _stopped(self, live: LiveDebate, status: ServerStatus, error: str | None = None) -> None:
        """A debate that did not end by itself: cancelled, interrupted by a shutdown, or broken."""
        if self.leases.lease_gone(live):
            self._finished(live, "interrupted")
            return
        reason = error or (CANCELLED if status == "cancelled" else INTERRUPTED)
        self.writer.flush_tokens(live)  # what the cut turns had streamed, before the end
        result = live.result
        if result is not None:
            if result.status in ("running", "interrupted"):  # the engine's own end of a cancel: say why
                # The engine records a turn cut by a cancellation as cut by its timeout; say what it was.
                for turn in [*(t for r in result.rounds for t in r.turns), *result.decision_turns]:
                    if turn.error is not None and turn.error.startswith("cancelled:"):
                        turn.error = f"{status}: {reason}"
                live.result_json.forget()  # (turns changed after they were recorded)
                result.elapsed_s = time.perf_counter() - live.t0
                stopped_from_outside(result, status, reason)
            result.cost = debate_cost(result, self.settings.prices)
            if live.tracer is not None:
                live.tracer.end(result)  # its spans end with it, none left open
            self.writer.log(live, "debate_done", done_data(result, status, reason), hold=True)
        else:
            self.writer.log(
                live, "debate_done", DebateDoneData(status=status, error=reason, totals=zero_totals()), hold=True
            )
        self.writer.save(live, result, status=status, error=reason)
        self._finished(live, status)

    def _finished(self, live: LiveDebate, status: ServerStatus) -> None:
        if live.flush is not None:
            live.flush.cancel()
            live.flush = None
        live.status = status
        live.log.close()
        self.live.pop(live.id, None)
        keep = self.settings.finished_logs_in_memory
        # Only the log of a debate that ended here: one another replica took (from the queue, or when
        # its lease went stale) or one handed back goes on there, and is read from the store and the
        # bus as every replica reads it (a stored response's replay numbered from this log's events
        # would number them otherwise than the other replicas do).
        if keep and not live.fenced and not live.handed_back:
            self._finished_logs[live.id] = live.log
            while len(self._finished_logs) > keep:
                self._finished_logs.popitem(last=False)
        live.done.set()


def _drop_tracebacks(exc: BaseException) -> None:
    """Let go of the frames an exception that stopped a debate (and those it was raised from) went
    through: a cancellation through a simultaneous stage's ``TaskGroup`` is a reference cycle with
    the group's frame (CPython 3.12 keeps it in a local there), and the frames on its way hold the
    debate, which only the collector would free then (the cancel, a timeout, a lost lease, a shutdown)."""
    pending: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        current.__traceback__ = None
        pending += [current.__cause__, current.__context__]


def _weakly(live: LiveDebate, act: Callable[..., None]) -> Callable[..., None]:
    """``act(live, *args)``, the debate held weakly (nothing is done once it is gone): what the debate
    holds (its log's sink) or what its task's context hands to every timer and task started from it
    (the lease check) would otherwise keep it alive, or make a cycle that only the collector frees.
    Whoever calls them holds the debate meanwhile (its writes, which release the events held; its run)."""
    debate = weakref.ref(live)

    def call(*args: Any) -> None:
        held = debate()
        if held is not None:
            act(held, *args)

    return call
