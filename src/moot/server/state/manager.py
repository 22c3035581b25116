"""Debates as asyncio tasks in the server's loop: a bounded queue, a concurrency limit, the store.

The manager adds no round loop: each debate is one :meth:`Engine.run` whose events are numbered
into the debate's :class:`~moot.server.state.events.EventLog` and, on every finished turn and round,
written to the :class:`~moot.server.state.Store` with the transcript as it stands.

**Leases.** A debate that starts is claimed in the store (:meth:`Store.claim`) by this replica, for
``settings.lease_s`` seconds, renewed every third of that while it runs; every write of it carries
its claim's epoch, and a write the store refuses (:class:`~moot.server.state.LeaseLost`: another
replica has claimed it since) stops the debate here without writing again (it is *fenced*).

**Replicas** (a shared store: PostgreSQL). Any number of ``moot serve`` processes share the store.
A debate is queued in it by the replica that received it, which runs it at once if it has a free
slot; besides, every replica with a free slot looks at the queue every ``settings.poll_s`` seconds
(:meth:`_poll`) and claims the oldest debate no live lease holds: one queued on a replica that was
full, or one whose replica died or stopped renewing (its lease expired). A debate that had started
is *taken over*: rebuilt from its stored request (:meth:`_rebuild`) and resumed from its stored
transcript (:meth:`Engine.resume`: the finished turns kept, neither run nor paid again), its
events going on after the stored ones with a ``resumed`` event. One that cannot be rebuilt here
(its model not configured on this replica, say) ends ``failed`` with the reason. On SIGTERM a
replica hands its debates back (:meth:`Store.release`) for another to take at once. With SQLite
(one server per store) nothing of this runs: at start the server marks the debates its previous
run left running ``interrupted`` and queues again those still waiting (:meth:`recover`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import statistics
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from pydantic import BaseModel, ValidationError

from moot.core.cost import debate_cost
from moot.core.engine import DebateTimeout, Engine
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
from moot.core.spec import ProtocolSpec
from moot.core.types import DebateQuality, DebateResult, DebateTask
from moot.models.base import BEFORE_CALL, BaseChatModel
from moot.secrets import redact, redact_json
from moot.server.schemas import DebateDoneData, DebateRequest, ResumedData, ServerStatus, Totals
from moot.server.settings import ServerSettings
from moot.server.state import (
    INTERRUPTED,
    Claim,
    LeaseLost,
    Store,
    StoredDebate,
    StoreUnavailable,
    Write,
    now,
)
from moot.server.state.base import one_line
from moot.server.state.bus import Bus, InProcessBus
from moot.server.state.events import EventLog, LoggedEvent, Token, done_data, to_payload, token_json
from moot.server.state.keyring import REQUEST_KEY
from moot.server.state.keys import LimitReached

CANCELLED = "cancelled by a request; the transcript holds what was finished before"
#: A debate still in the queue when the server stopped.
NEVER_STARTED = "the server stopped before this debate started, so it never ran"
#: The key of a stored OpenAI request whose caller reads its result by its id, not on the connection
#: that sent it (a background response): one still queued at a restart is queued again.
DETACHED = "detached"
#: Seconds before the writes the store could not take (it was out of reach) are tried again.
RETRY_WRITES_S = 0.5

log = logging.getLogger("moot.server")


class QueueFull(Exception):
    """A submission over a limit: 429 with Retry-After; ``code`` names the limit (``queue_full``: the
    deployment's capacity; ``key_concurrency``: the API key's debates at once)."""

    def __init__(self, retry_after: int, capacity: int, message: str | None = None, code: str = "queue_full") -> None:
        super().__init__(message or f"the server is running and queueing {capacity} debates, its limit; retry later")
        self.retry_after = retry_after
        self.code = code


@dataclass
class LiveDebate:
    id: str
    spec: ProtocolSpec
    task: DebateTask
    engine: Engine
    model: str
    log: EventLog = field(default_factory=EventLog)
    status: ServerStatus = "queued"
    result: DebateResult | None = None
    runner: asyncio.Task[None] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    t0: float = 0.0
    #: What a cancellation means: a user's cancel, or the server shutting down.
    cancel_as: ServerStatus = "cancelled"
    #: Seed 004's quality is added before the debate is announced done (with this judge, if any).
    quality: bool = False
    judge: BaseChatModel | None = None
    #: Its spans (``moot serve --trace``), under its caller's ``traceparent``.
    tracer: Any = None
    #: Token deltas not yet in the log, by turn (speaker, round): each turn's become one ``token``
    #: event when the server's ``token_window_s`` ends, or before any other event.
    tokens: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    flush: asyncio.TimerHandle | None = None
    #: The epoch of this replica's claim of the debate (None until it starts): every write carries it.
    epoch: int | None = None
    #: The store refused this replica's epoch (another claimed the debate): it stops, writing nothing more.
    fenced: bool = False
    #: When (``time.monotonic``, which runs on while the process is stopped) its lease was last
    #: claimed or renewed: once that is older than the lease, another replica may hold it, and it
    #: stops here before any further model call or event (:meth:`DebateManager._lease_gone`).
    renewed: float = 0.0
    #: The turns (attempts) whose first piece is out: a turn's first piece is sent at once, and
    #: only the rest is gathered over the window (the first token never waits for it).
    streaming: set[tuple[str, int]] = field(default_factory=set)
    #: Why the store refused this debate's write (:meth:`Store.write_all`): it is stopped as
    #: ``failed`` with this reason, and its transcript is no longer written (it is what failed).
    store_error: str | None = None
    #: Its events after an id, wherever it runs (:meth:`DebateManager.follow`): set when it starts.
    follow: Callable[[int], AsyncIterator[list[LoggedEvent]]] | None = None
    #: Once it has ended on another replica (this one was fenced): its status and result from the store.
    settle: Callable[[], None] | None = None
    #: The claim this replica's queue poller took for it (:meth:`DebateManager._poll`), before it runs.
    claim: Claim | None = None
    #: A debate taken over: its transcript as stored when its last replica stopped, to go on from
    #: (:meth:`Engine.resume`), and that replica (None: unknown, or it handed the debate back).
    resume: DebateResult | None = None
    previous_replica: str | None = None
    #: Stopped by a replica that hands it back (a shutdown, with a shared store): released in the
    #: store for another replica to go on with, not marked interrupted.
    hand_back: bool = False


#: What the engine says of a debate cancelled from outside (``Engine.run``): the server knows why.
_ENGINE_CANCEL = ("cancelled", "cancelled before the debate ended")


#: Ids a debate taken over skips above the highest its store and its bus hold (:meth:`DebateManager._first_id`):
#: more than the events a replica can give its clients between two writes of the debate (its token
#: deltas, one per ``token_window_s`` per streaming turn: 100,000 is over 40 minutes of two turns
#: streaming at once at the default 50 ms). The ids stay far inside the store's 32-bit column.
TAKEOVER_ID_GAP = 100_000
#: Seconds a take-over waits for the bus to say the last id it holds (Redis hung: the gap covers it).
BUS_LOOKUP_S = 5.0


def _stopped_from_outside(result: DebateResult, status: str, reason: str) -> None:
    """A transcript the server stopped (a cancel, a shutdown, a kill found at restart): it must not
    read as one still running when saved or loaded again, and it says why it stopped (the engine,
    cancelled, finishes it as interrupted without knowing by whom)."""
    result.status = "interrupted"
    result.stop_reason = status if result.stop_reason in (None, _ENGINE_CANCEL[0]) else result.stop_reason
    result.error = reason if result.error in (None, _ENGINE_CANCEL[1]) else result.error


def replica_name() -> str:
    """This process among the replicas sharing a store: its host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


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
        self.bus.on_cancel(self._cancel_here)
        #: Checks the store for cancels sent to other replicas while debates run here (:meth:`_watch_cancels`).
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False
        #: The name this process claims debates under (:meth:`Store.claim`).
        self.replica = replica_name()
        #: Renews the leases of the running debates (:meth:`_renew_leases`); None when none runs.
        self._renewer: asyncio.Task[None] | None = None
        #: Looks at a shared store's queue while this replica has a free slot (:meth:`_poll`).
        self._poller: asyncio.Task[None] | None = None
        #: Whether writes wait to be tried again (the store could not be reached).
        self._retry_soon = False
        #: How the debate of a stored OpenAI request is built again, by route (the app registers the
        #: doors' own, which sit above the manager): to take one over from another replica.
        self.rebuilders: dict[str, Callable[[str, dict[str, Any]], LiveDebate]] = {}
        self.live: dict[str, LiveDebate] = {}
        self._slots = asyncio.Semaphore(settings.max_running)
        self._finished_logs: OrderedDict[str, EventLog] = OrderedDict()
        self._recent: deque[float] = deque(maxlen=20)
        #: Store writes waiting for the event loop's next turn, by debate (:meth:`_save`).
        self._writes: dict[str, Write] = {}
        self._write_soon = False
        #: OpenTelemetry (``settings.trace``): one span tree per debate.
        self.tracing: Any = None
        if settings.trace or settings.trace_content:
            from moot.integrations.otel import tracing_from_env

            self.tracing = tracing_from_env(capture_content=settings.trace_content or None, warn=log.warning)

    # ---------------------------------------------------------------------------- lifecycle

    def recover(self) -> list[str]:
        """Take over what a previous process left unfinished. The debates it was running are marked
        interrupted with what they had (their ids are returned); those still waiting in its queue,
        which never started, are queued again in their order, under the same ids (a background
        response too, built again from its stored request). One that cannot be (a chat completion or
        a foreground response, whose caller's connection closed with the server; a request this
        server's models or limits no longer allow) is marked interrupted too, saying that it never
        ran and how to send it again.

        With a shared store (PostgreSQL) nothing is marked: other replicas may be running those
        debates. Each one whose replica stopped is claimed by a poller once its lease has expired
        (or at once if it was handed back), and goes on from its last finished turn (:meth:`start`)."""
        if self.store.shared:
            return []
        interrupted: list[str] = []
        requeued = left = 0
        for debate_id in self.store.unfinished():
            stored = self.store.get(debate_id)
            assert stored is not None
            if stored.status == "queued" and stored.result is None and self._not_served_here(debate_id):
                left += 1  # moot mcp on a store moot serve wrote: left queued for a server with that route
                continue
            if stored.status == "queued" and stored.result is None:
                owner, epoch = self.store.lease(debate_id)
                if owner is not None:  # claimed by the last process, which stopped before it started
                    self.store.release(debate_id, epoch)
                if self.store.cancel_requested([debate_id]):  # cancelled while it waited: not run again
                    gone = DebateDoneData(status="cancelled", error=CANCELLED, totals=_zero())
                    self.store.finish_without_result(
                        debate_id,
                        "cancelled",
                        CANCELLED,
                        [LoggedEvent(1, "debate_done", gone.model_dump_json()).stored()],
                    )
                    continue
                why = self._requeue(stored)
                if why is None:
                    requeued += 1
                    continue
                never = DebateDoneData(status="interrupted", error=why, totals=_zero())
                self.store.finish_without_result(
                    debate_id, "interrupted", why, [LoggedEvent(1, "debate_done", never.model_dump_json()).stored()]
                )
                interrupted.append(debate_id)
                continue
            last = self.store.last_event_id(debate_id)
            result = stored.result
            if result is not None and result.status == "running":
                _stopped_from_outside(result, "interrupted", INTERRUPTED)
            data = (
                done_data(result, "interrupted", INTERRUPTED)
                if result is not None
                else DebateDoneData(status="interrupted", error=INTERRUPTED, totals=_zero())
            )
            event = LoggedEvent(last + 1, "debate_done", data.model_dump_json()).stored()
            if result is not None:
                self.store.write(debate_id, result, [event], status="interrupted", error=INTERRUPTED)
            else:
                self.store.finish_without_result(debate_id, "interrupted", INTERRUPTED, [event])
            interrupted.append(debate_id)
        if requeued:
            log.warning("%d debate(s) still queued when the last run stopped are queued again", requeued)
        if left:
            log.warning(
                "%d debate(s) still queued were sent to an OpenAI route this server does not serve: they stay "
                "queued for moot serve on this store",
                left,
            )
        return interrupted

    def _not_served_here(self, debate_id: str) -> bool:
        """Whether a queued debate was a request, stored whole, to an OpenAI route that this server has
        no builder for (``moot mcp`` has no OpenAI door): it is left queued rather than ended, for a
        ``moot serve`` on the same store."""
        request = self.store.request(debate_id) or {}
        route = str(request.get("endpoint") or "/v1/chat/completions")
        return (
            bool(request.get("chat_completion"))
            and bool(request.get(DETACHED))
            and isinstance(request.get("request"), dict)
            and route not in self.rebuilders
        )

    def _requeue(self, stored: StoredDebate) -> str | None:
        """Queue again a debate that never started, from its stored request; else say why not."""
        request = self.store.request(stored.id) or {}
        # Either OpenAI route (each records the one it came from), unless its caller reads the result by
        # its id rather than on its connection (a background response: ``detached``).
        if request.get("chat_completion") and not request.get(DETACHED):
            route = str(request.get("endpoint") or "/v1/chat/completions")
            what = "a Responses API request" if route == "/v1/responses" else "a chat completion"
            return (
                f"{NEVER_STARTED}; it was {what}, whose caller's connection closed with the server, so it is not "
                f"run again: send the request to POST {route} again"
            )
        built = self._rebuild(stored.id, request)
        if isinstance(built, LiveDebate):
            self._start(built)
            return None
        return redact(
            f"{NEVER_STARTED}, and this server cannot queue it again ({built}); submit it again (POST /v1/debates)"
        )

    def _rebuild(self, debate_id: str, request: dict[str, Any]) -> LiveDebate | str:
        """A stored debate, built again from its stored request by this server's models and limits
        (to queue it again at a restart, or to run one another replica queued or left): the
        :class:`LiveDebate`, or why it cannot be built here, in one line."""
        from moot.server.policy import RequestError, judge_of, prepare

        if request.get("chat_completion"):
            route = str(request.get("endpoint") or "/v1/chat/completions")
            rebuild = self.rebuilders.get(route)
            if rebuild is None or not isinstance(request.get("request"), dict):
                return (
                    f"it was sent to POST {route} by a moot that did not store such requests whole, so only the "
                    "replica that received it could run it"
                )
            try:
                return rebuild(debate_id, request)
            except ValidationError as exc:
                first = exc.errors()[0]
                why = f"{'.'.join(str(x) for x in first['loc'])}: {first['msg']}"
            except Exception as exc:  # a refusal (RequestError: its message) or a failure: said in one line
                why = str(getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}")
            return " ".join(redact(why, self.store.secrets).split())
        try:
            # Its Idempotency-Key's record (moot.server.state.idempotency) is kept beside the body, not in it.
            body = DebateRequest.model_validate({k: v for k, v in request.items() if k != "idempotency"})
            prepared = prepare(
                body.protocol, body.question, body.chunks(), body, self.settings, reference=body.reference
            )
            asked = body.quality_request()
            judge = judge_of(asked, self.settings)
        except RequestError as exc:
            reason = exc.message
        except ValidationError as exc:
            first = exc.errors()[0]
            reason = f"{'.'.join(str(x) for x in first['loc'])}: {first['msg']}"
        except Exception as exc:  # this server cannot rebuild it: say so, and go on
            reason = f"{type(exc).__name__}: {exc}"
        else:
            return LiveDebate(
                id=debate_id,
                spec=prepared.spec,
                task=prepared.task,
                engine=prepared.engine,
                model=prepared.model,
                quality=asked is not None,
                judge=judge,
            )
        return " ".join(redact(reason, self.store.secrets).split())

    def start(self) -> None:
        """With a shared store, look at its queue while this replica has a free slot (:meth:`_poll`)."""
        if self.store.shared and self._poller is None:
            self._poller = asyncio.create_task(self._poll(), name="moot-queue")

    async def shutdown(self) -> None:
        """Stop every debate: each one running is stored as interrupted with what it had; each one
        still queued stays queued in the store, to run at the next start (:meth:`recover`). With a
        shared store, each one this replica holds is handed back instead (:meth:`Store.release`),
        its finished turns stored: another replica claims it at its next look at the queue and
        goes on from there, with no wait for the lease."""
        self._stopping = True
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
            self._poller = None
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
                    self._release(live)
                self._finished(live, "queued")
        self._write_now()
        for task in (self._renewer, self._watcher):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._renewer = self._watcher = None
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)  # the spans buffered, exported before the end

    # ------------------------------------------------------------------------------ submit

    @property
    def capacity(self) -> int:
        return self.settings.max_running + self.settings.max_queued

    def retry_after(self) -> int:
        if not self._recent:
            return 5
        return max(1, min(300, math.ceil(statistics.fmean(self._recent))))

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
        debate_id = debate_id or uuid.uuid4().hex
        held = sum(1 for d in self.live.values() if d.claim is not None or d.epoch is not None)
        # With a slot free for it (a shared store), the debate is added claimed by this replica, in
        # the transaction that adds it: another replica's poller, which may look at the queue before
        # this debate's task first runs, must not take it from under its caller. Counted by the
        # claims held, not the semaphore: submissions arriving together (whose tasks have not taken
        # their slots yet) claim no more than the slots, and the rest wait in the shared queue, where
        # any replica's poller takes them.
        claim = self.store.shared and held < self.settings.max_running
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
            self._keep_leases()  # renewed from now, should the task wait for its slot after all
        self._start(live, headers)
        return live

    def _start(self, live: LiveDebate, headers: Mapping[str, str] | None = None, *, slot: bool = False) -> None:
        """Run a debate as a task; ``slot``: the caller holds a slot for it already (:meth:`_poll`)."""
        if self.tracing is not None:
            parent = self.tracing.extract(headers) if headers else None
            live.tracer = self.tracing.handler(parent=parent, attributes={"moot.debate_id": live.id})
        self.live[live.id] = live
        live.log.sink = lambda events: self.bus.publish(live.id, events, epoch=live.epoch)
        live.follow = lambda after: self.follow(live.id, after)
        live.settle = lambda: self._settle(live)
        live.runner = asyncio.create_task(self._run(live, slot=slot), name=f"debate-{live.id}")
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.create_task(self._watch_cancels(), name="moot-cancels")

    async def cancel(self, debate_id: str) -> bool:
        """Cancel a queued or running debate; False if it is not live (finished or unknown)."""
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
        """Cancel a debate wherever it runs: here at once; on another replica through the store's
        ``cancel_requested`` and the bus, waiting up to ``cancel_wait_s`` for it to stop. True: it
        has stopped; None: it was asked to and has not stopped yet; False: it had ended already."""
        if not self.store.request_cancel(debate_id):
            return False
        if await self.cancel(debate_id):
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
                    DebateDoneData(status="cancelled", error=CANCELLED, totals=_zero()).model_dump_json(),
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

    def _cancel_here(self, debate_id: str) -> None:
        """A cancel sent on any replica (the bus, or the store's mark): if the debate runs here, it
        stops. One still waiting here for a slot that another replica has ended already (it took
        it from the queue to cancel it) leaves this replica's queue, writing nothing."""
        live = self.live.get(debate_id)
        if live is None or live.runner is None or live.runner.done():
            return
        if live.epoch is None:
            row = self.store.get(debate_id, with_result=False)
            if row is not None and row.status not in ("queued", "running"):
                self._fence(live, f"it was {row.status} on another replica before it started here")
                return
        log.info("debate %s: cancelled by a request sent to another replica", debate_id)
        live.runner.cancel()

    async def _watch_cancels(self) -> None:
        """While debates are live here: every ``cancel_poll_s``, the store's cancels of them (sent
        to another replica while the bus could not carry it, or without Redis), and (a shared
        store) those waiting here that another replica took from the queue (:meth:`_let_go_taken`)."""
        while self.live:
            await asyncio.sleep(self.settings.cancel_poll_s)
            try:
                wanted = self.store.cancel_requested(list(self.live))
            except Exception as exc:  # the store unreachable for now: the next tick tries again
                log.warning("cancels could not be read from the store: %s", redact(f"{type(exc).__name__}: {exc}"))
                continue
            for debate_id in wanted:
                self._cancel_here(debate_id)
            if self.store.shared:
                try:
                    self._let_go_taken()
                except Exception as exc:  # the store unreachable for now: the next tick looks again
                    log.warning("the queue could not be read: %s", redact(f"{type(exc).__name__}: {exc}"))

    def _settle(self, live: LiveDebate) -> None:
        """A debate this replica stopped running (fenced) and another finished: its end as stored."""
        if not live.fenced:
            return
        row = self.store.get(live.id)
        if row is not None and row.status not in ("queued", "running"):
            live.status = cast(ServerStatus, row.status)
            live.result = row.result

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
            async for batch in local.batches(after):
                yield batch
                last = batch[-1].id
            if self._stopping or (local.events and local.events[-1].name == "debate_done"):
                return
        row = self.store.get(debate_id, with_result=False)
        if row is None:
            return
        ended = row.status not in ("queued", "running")
        async for events in self.bus.subscribe(self.store, debate_id, last, ended=ended):
            yield [LoggedEvent(e.id, e.name, e.data) for e in events]

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
        except asyncio.CancelledError:
            if live.fenced:
                self._finished(live, "interrupted")  # another replica has it: nothing more is written here
            elif live.hand_back and (live.epoch is not None or live.claim is not None):
                self._write_now()  # its finished turns, stored before it is handed back
                self._release(live)
                self._finished(live, "queued")
            elif live.cancel_as == "interrupted" and live.status == "queued":
                self._finished(live, "queued")  # never started: the next start runs it
            else:
                self._stopped(live, live.cancel_as, live.store_error)
        except Exception as exc:  # a bug, not a model failure (the engine records those): keep the debate
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
                self._finished(live, "queued")
                return
            if claim is None:  # another replica holds it: it is not this one's to run
                self._fence(live, "another replica holds its lease")
                self._finished(live, "interrupted")
                return
            live.claim = claim
            live.renewed = asked
        live.epoch = claim.epoch
        if self.store.cancel_requested([live.id]):  # cancelled on another replica while it waited
            self._stopped(live, "cancelled")
            return
        self._keep_leases()
        live.status = "running"
        live.t0 = time.perf_counter() - (live.resume.elapsed_s if live.resume is not None else 0.0)
        if live.resume is None:
            self._save(live, started=True)
        live.engine.on_event = lambda event: self._on_event(live, event)
        BEFORE_CALL.set(lambda: self._guard_call(live))  # this task's model calls (and the judge's)
        try:
            if live.resume is not None:
                result = await live.engine.run(live.engine.resume(live.resume))
            else:
                result = await live.engine.run(live.task)
        except DebateTimeout as exc:
            result = exc.result
        live.result = result
        if live.quality:
            await self._assess(live, result)
        self._recent.append(result.elapsed_s)
        self._finished(live, result.status)

    def _release(self, live: LiveDebate) -> None:
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

    # ---------------------------------------------------------------------------- the queue

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

    def _let_go_taken(self) -> None:
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
        self._start(built, slot=True)
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
            data = DebateDoneData(status="failed", error=reason, totals=_zero())
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

    def _on_event(self, live: LiveDebate, event: Event) -> None:
        if self._lease_gone(live):
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
                self._flush_tokens(live)
            elif live.flush is None:
                window = self.settings.token_window_s
                if window > 0:
                    live.flush = asyncio.get_running_loop().call_later(window, self._flush_tokens, live)
                else:
                    self._flush_tokens(live)
            return
        if live.tokens:
            self._flush_tokens(live)  # a turn's tokens come before its turn_done or turn_retry
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
            self._log(live, "resumed", resumed)
            self._save(live, event.result)
            return
        if isinstance(event, DebateDone) and live.runner is not None and live.runner.cancelling():
            return  # the engine ending a debate this server cancels: _stopped announces it, with why
        if isinstance(event, DebateDone):
            event.result.cost = debate_cost(event.result, self.settings.prices)
        if isinstance(event, DebateDone) and live.quality:
            # Announced (and stored as finished) only once the quality is in the result: _assess.
            self._save(live, event.result)
            return
        name, payload = to_payload(
            event,
            live.id,
            elapsed=time.perf_counter() - live.t0,
            decision_kind=live.spec.decision.kind,
            rounds=live.spec.rounds,
        )
        self._log(live, name, payload)
        if isinstance(event, DebateStarted | TurnDone | RoundDone):
            self._save(live, event.result)
        elif isinstance(event, DebateDone):
            self._save(live, event.result, status=event.result.status, error=event.result.error)

    def _log(self, live: LiveDebate, name: str, payload: BaseModel) -> None:
        """An event into the debate's log, its secrets redacted as the store redacts them: the live
        stream and the one replayed from the store are the same events. (A turn's token deltas are
        not stored and not redacted: they reach the live stream only, as the model generates them.)"""
        raw = payload.model_dump_json()
        data = redact_json(raw, self.store.secrets)
        # The payload goes with its JSON for this process's streams, unless redaction changed the JSON.
        live.log.append_json(name, data, payload if data is raw else None)

    def _save(
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
        write = self._writes.get(live.id)
        if write is None:
            write = self._writes[live.id] = Write(live.id, None)
        write.epoch = live.epoch
        write.events += live.log.take_unsaved()
        if result is not None and live.store_error is None:
            write.result = result
        if started:
            write.started = now()
        if status is not None:
            write.status, write.error = status, error
            self._write_now()
        elif not self._write_soon:
            self._write_soon = True
            asyncio.get_running_loop().call_soon(self._write_now)

    def _write_now(self) -> None:
        """The writes waiting, each debate's in a transaction of its own: one refused (a lost lease)
        or failed is that debate's alone; the others are written. One the store could not be
        reached for is tried again a moment later (under its lease, which the renewals keep)."""
        self._write_soon = False
        if self._writes:
            writes, self._writes = list(self._writes.values()), {}
            for failure in self.store.write_all(writes):
                live = self.live.get(failure.debate_id)
                if failure.retry:
                    self._write_later(next(w for w in writes if w.debate_id == failure.debate_id), failure.error)
                elif isinstance(failure.error, LeaseLost):
                    if live is not None:
                        self._fence(live, str(failure.error))
                else:
                    reason = failure.reason or redact(
                        f"{type(failure.error).__name__}: {failure.error}", self.store.secrets
                    )
                    log.error("debate %s: a write to the store failed: %s", failure.debate_id, reason)
                    self._unstorable(failure.debate_id, reason)

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
        self._writes[write.debate_id] = write
        if not self._retry_soon:
            self._retry_soon = True
            log.warning("the store cannot be reached (%s); its writes are tried again in a moment", error)

            def again() -> None:
                self._retry_soon = False
                self._write_now()

            try:
                asyncio.get_running_loop().call_later(RETRY_WRITES_S, again)
            except RuntimeError:  # no loop (a shutdown's last write): nothing more can be done
                self._retry_soon = False

    # -------------------------------------------------------------------------------- leases

    def _keep_leases(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.create_task(self._renew_leases(), name="moot-leases")

    async def _renew_leases(self) -> None:
        """Renew the lease of every debate this replica runs, every third of ``lease_s``, until none
        runs. A lease the store no longer holds for this replica fences its debate (:meth:`_fence`);
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
                    self._fence(live, str(exc))
                except Exception as exc:
                    log.warning(
                        "debate %s: its lease could not be renewed (%s); trying again in %.0f s",
                        live.id,
                        redact(f"{type(exc).__name__}: {exc}", self.store.secrets),
                        every,
                    )

    def _fence(self, live: LiveDebate, why: str, *, even_this_task: bool = False) -> None:
        """Another replica holds the debate now: stop it here, and write nothing more of it."""
        if live.fenced:
            return
        live.fenced = True
        self._writes.pop(live.id, None)
        live.tokens = {}
        log.warning("debate %s stops on this replica without writing: %s", live.id, why)
        runner = live.runner
        if runner is not None and not runner.done() and (even_this_task or runner is not asyncio.current_task()):
            runner.cancel()

    def _lease_gone(self, live: LiveDebate) -> bool:
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
        self._fence(
            live,
            f"its lease was last renewed {age:.1f} s ago, longer than it lasts ({self.settings.lease_s:g} s): "
            "another replica may have taken it over",
            even_this_task=True,
        )
        return True

    def _guard_call(self, live: LiveDebate) -> None:
        """Right before each model call of a debate (:data:`moot.models.base.BEFORE_CALL`): none is
        sent for one whose lease may have gone (:meth:`_lease_gone`); it is cancelled instead."""
        if self._lease_gone(live):
            raise asyncio.CancelledError

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

    def _flush_tokens(self, live: LiveDebate) -> None:
        """The gathered token deltas into the log: one ``token`` event per turn that streamed."""
        if live.flush is not None:
            live.flush.cancel()
            live.flush = None
        if live.tokens and self._lease_gone(live):
            live.tokens = {}
        if live.tokens:
            tokens = [Token(s, r, "".join(parts)) for (s, r), parts in live.tokens.items()]
            live.log.extend_ephemeral("token", [token_json(t.speaker, t.round, t.text) for t in tokens], tokens)
            live.tokens = {}

    async def _assess(self, live: LiveDebate, result: DebateResult) -> None:
        """Add seed 004's quality to a finished debate, then announce and store it as done."""
        from moot.quality import assess

        try:
            result.quality = await assess(result, live.judge)
        except Exception as exc:  # the debate stands; say why its quality is missing
            reason = redact(f"the quality could not be assessed: {type(exc).__name__}: {exc}")
            result.quality = DebateQuality(unmeasured={"overall_quality": reason})
        if self._lease_gone(live):
            raise asyncio.CancelledError  # not announced here: it may be another replica's now
        status: ServerStatus = result.status if result.status != "running" else "failed"
        self._log(live, "debate_done", done_data(result, status))
        self._save(live, result, status=status, error=result.error)

    def _stopped(self, live: LiveDebate, status: ServerStatus, error: str | None = None) -> None:
        """A debate that did not end by itself: cancelled, interrupted by a shutdown, or broken."""
        if self._lease_gone(live):
            self._finished(live, "interrupted")
            return
        reason = error or (CANCELLED if status == "cancelled" else INTERRUPTED)
        self._flush_tokens(live)  # what the cut turns had streamed, before the end
        result = live.result
        if result is not None:
            if result.status in ("running", "interrupted"):  # the engine's own end of a cancel: say why
                # The engine records a turn cut by a cancellation as cut by its timeout; say what it was.
                for turn in [*(t for r in result.rounds for t in r.turns), *result.decision_turns]:
                    if turn.error is not None and turn.error.startswith("cancelled:"):
                        turn.error = f"{status}: {reason}"
                result.elapsed_s = time.perf_counter() - live.t0
                _stopped_from_outside(result, status, reason)
            result.cost = debate_cost(result, self.settings.prices)
            if live.tracer is not None:
                live.tracer.end(result)  # its spans end with it, none left open
            self._log(live, "debate_done", done_data(result, status, reason))
        else:
            self._log(live, "debate_done", DebateDoneData(status=status, error=reason, totals=_zero()))
        self._save(live, result, status=status, error=reason)
        self._finished(live, status)

    def _finished(self, live: LiveDebate, status: ServerStatus) -> None:
        if live.flush is not None:
            live.flush.cancel()
            live.flush = None
        live.status = status
        live.log.close()
        self.live.pop(live.id, None)
        keep = self.settings.finished_logs_in_memory
        if keep:
            self._finished_logs[live.id] = live.log
            while len(self._finished_logs) > keep:
                self._finished_logs.popitem(last=False)
        live.done.set()


def _zero() -> Totals:
    return Totals(calls=0, prompt_tokens=0, completion_tokens=0, total_tokens=0, elapsed_s=0.0)
