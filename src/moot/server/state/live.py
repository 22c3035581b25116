"""A debate as this replica holds it while it is live (:class:`LiveDebate`), and the words the
server ends one with when it stops it from outside (a cancel, a shutdown, a restart)."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from moot.core.engine import Engine
from moot.core.spec import ProtocolSpec
from moot.core.types import DebateResult, DebateTask
from moot.models.base import BaseChatModel
from moot.server.schemas import ServerStatus, Totals
from moot.server.state import Claim
from moot.server.state.events import EventLog, LoggedEvent
from moot.server.state.result_json import ResultJson

CANCELLED = "cancelled by a request; the transcript holds what was finished before"
#: A debate still in the queue when the server stopped.
NEVER_STARTED = "the server stopped before this debate started, so it never ran"
#: The key of a stored OpenAI request whose caller reads its result by its id, not on the connection
#: that sent it (a background response): one still queued at a restart is queued again.
DETACHED = "detached"


class Chore:
    """One of a replica's background loops (renewing leases, looking at the queue, watching for
    cancels): a named task, started when it is not running, stopped by cancelling it."""

    def __init__(self, name: str, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.name = name
        self._loop = loop
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Run the loop from now, unless it runs already (a loop that ended is started again)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._task = None


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
    #: stops here before any further model call or event (:meth:`LeaseKeeper.lease_gone`).
    renewed: float = 0.0
    #: The turns (attempts) whose first piece is out: a turn's first piece is sent at once, and
    #: only the rest is gathered over the window (the first token never waits for it).
    streaming: set[tuple[str, int]] = field(default_factory=set)
    #: Why the store refused this debate's write (:meth:`Store.write_all`): it is stopped as
    #: ``failed`` with this reason, and its transcript is no longer written (it is what failed).
    store_error: str | None = None
    #: Its result as the store keeps it, each finished turn encoded once (:class:`ResultJson`).
    result_json: ResultJson = field(default_factory=ResultJson)
    #: Its events after an id, wherever it runs (:meth:`DebateManager.follow`): set when it starts.
    follow: Callable[[int], AsyncIterator[list[LoggedEvent]]] | None = None
    #: Once it has ended on another replica (this one was fenced): its status and result from the store.
    settle: Callable[[LiveDebate], None] | None = None
    #: The claim this replica's queue poller took for it (:meth:`QueuePoller.poll`), before it runs.
    claim: Claim | None = None
    #: A debate taken over: its transcript as stored when its last replica stopped, to go on from
    #: (:meth:`Engine.resume`), and that replica (None: unknown, or it handed the debate back).
    resume: DebateResult | None = None
    previous_replica: str | None = None
    #: Stopped by a replica that hands it back (a shutdown, with a shared store): released in the
    #: store for another replica to go on with, not marked interrupted.
    hand_back: bool = False
    #: Left in a shared store's queue by a replica that stops (started or not): another replica runs
    #: it (going on from its finished turns, if any).
    handed_back: bool = False
    #: When its answer was first given as a completed response (epoch seconds): the stream's last
    #: event and the stored response, made apart, say the same ``completed_at``.
    completed_at: int | None = None
    #: Fenced here, its end as another replica stored it was read (:meth:`LeaseKeeper.settle`).
    settled: bool = False

    async def ended(self) -> None:
        """Once the debate has ended wherever it runs. ``done`` is set when it stops *here*: a debate
        another replica took from this one (it waited in the shared queue while this one's slots were
        taken, or its lease went stale) goes on there, and is followed (the bus, else the store) to its
        end, which ``settle`` then reads from the store into ``status`` and ``result``. A request that
        answers once the debate ends (a chat completion or a response not streamed, an MCP call)
        waits for this, not for ``done``: it was answered ``interrupted`` while its debate went on.
        Followed until this server stops (or the debate is deleted): ``settled`` says whether its end
        was read. A debate that ended here while the store was out of reach is followed too, until
        its end is stored (or its lease is lost meanwhile, and it goes on at another replica): an
        answer is never given from an end the store may not keep."""
        await self.done.wait()
        held = self.log.end_held
        if not self.fenced and not held:
            return
        if self.follow is not None:
            # (held: from the last event shown, so that its end comes through once it is stored)
            after = self.log.shown[-1].id if held and self.log.shown else self.log.last_id
            async for _ in self.follow(after):
                pass
        if self.settle is not None:
            self.settle(self)


#: What the engine says of a debate cancelled from outside (``Engine.run``): the server knows why.
_ENGINE_CANCEL = ("cancelled", "cancelled before the debate ended")


def stopped_from_outside(result: DebateResult, status: str, reason: str) -> None:
    """A transcript the server stopped (a cancel, a shutdown, a kill found at restart): it must not
    read as one still running when saved or loaded again, and it says why it stopped (the engine,
    cancelled, finishes it as interrupted without knowing by whom)."""
    result.status = "interrupted"
    result.stop_reason = status if result.stop_reason in (None, _ENGINE_CANCEL[0]) else result.stop_reason
    result.error = reason if result.error in (None, _ENGINE_CANCEL[1]) else result.error


def replica_name() -> str:
    """This process among the replicas sharing a store: its host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def zero_totals() -> Totals:
    """The totals of a debate that made no call (it ended before it ran)."""
    return Totals(calls=0, prompt_tokens=0, completion_tokens=0, total_tokens=0, elapsed_s=0.0)
