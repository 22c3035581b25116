"""A debate's event log: the engine's own events, numbered, for the SSE stream.

Every event the engine emits becomes one :class:`LoggedEvent` with the next id (1, 2, 3, ...), so
a client that reconnects with ``Last-Event-ID: N`` gets exactly the events after N, and a client
that connects late first gets everything that already happened. A live debate's log is in
memory; a finished one's is kept for a while, then rebuilt from the store, which holds every
event but the token deltas (each ``turn_done`` carries its turn's whole text), under the same ids.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_json

from moot.core.dynamics import compute_dynamics
from moot.core.events import DebateDone, DebateStarted, Event, RoundDone, TokenDelta, TurnDone, TurnRetry, TurnStarted
from moot.core.types import DebateResult, Turn
from moot.server.schemas import (
    DebateDoneData,
    DebateStartedData,
    RoundDoneData,
    ServerStatus,
    TokenData,
    Totals,
    TurnDoneData,
    TurnRetryData,
    TurnStartedData,
    TurnView,
)
from moot.server.state import StoredEvent
from moot.server.state.base import EPHEMERAL


@dataclass(slots=True)
class Token:
    """A ``token`` event's data as a value (:class:`~moot.server.schemas.TokenData` is its JSON's
    schema). The hot path: a plain value costs less than a model, and a frozen dataclass four times
    what this one does (about 1.5 against 6 us); its readers only read it."""

    speaker: str
    round: int
    text: str


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    id: int
    name: str
    #: The event's data, as the SSE stream, the store and the bus carry it (JSON, encoded once).
    data: str
    #: The same data as the value it was encoded from (a :class:`Token`, or the event's payload
    #: model), for the streams this process serves, which then decode nothing: set on the events this
    #: replica's engine made (when redaction left their JSON as it was); None on an event read back
    #: from the store or the bus, whose reader decodes ``data``.
    value: Any = field(default=None, compare=False)

    def stored(self) -> StoredEvent:
        return StoredEvent(id=self.id, name=self.name, data=self.data)


class EventLog:
    """Append-only, followed by any number of readers."""

    def __init__(self, events: list[LoggedEvent] | None = None, *, closed: bool = False, after: int = 0) -> None:
        self.events: list[LoggedEvent] = list(events or [])
        self.closed = closed
        #: New events are numbered above this too (a debate taken over: ids another replica may
        #: have given clients without storing them, :meth:`QueuePoller._take`).
        self.floor = after
        self._changed = asyncio.Event()
        #: Readers waiting for the next event: with none, an append wakes no one.
        self._waiting = 0
        #: Events appended since the last store write.
        self.unsaved: list[LoggedEvent] = []
        #: Where each new event also goes (the manager: the bus, for streams on other replicas).
        self.sink: Callable[[list[LoggedEvent]], None] | None = None
        #: Where the events held back start (:meth:`append_json` with ``hold``): no reader and no
        #: sink gets them, nor any event after them, until :meth:`release`. None: nothing is held.
        self._held: int | None = None
        #: When the last event kept in the store was appended (a turn's or a round's end, a status):
        #: what a client polling the debate sees change (an MCP task's ``lastUpdatedAt``). None: none yet.
        #: Seconds since the epoch (``time.time()``: formatted only when asked).
        self.updated_at: float | None = None

    @property
    def last_id(self) -> int:
        return max(self.events[-1].id if self.events else 0, self.floor)

    @property
    def shown(self) -> list[LoggedEvent]:
        """The events readers may have: all but those held back (:meth:`append_json`)."""
        return self.events if self._held is None else self.events[: self._held]

    @property
    def end_held(self) -> bool:
        """Whether its ``debate_done`` is held back: the end is not stored yet (the store was out of
        reach when the debate ended; :meth:`release`)."""
        return self._held is not None and self.events[-1].name == "debate_done"

    def append(self, name: str, payload: BaseModel) -> LoggedEvent:
        return self.append_json(name, payload.model_dump_json(), payload)

    def append_json(self, name: str, data: str, value: Any = None, *, hold: bool = False) -> LoggedEvent:
        """The next event. ``hold``: readers and the sink get it, and every event after it, only once
        :meth:`release` is called (the writer: once it is stored), so that no stream shows a turn's
        end that a replica killed before its write never stored (and its next holder ran again)."""
        event = LoggedEvent(self.last_id + 1, name, data, value)
        self.events.append(event)
        if name not in EPHEMERAL:
            self.unsaved.append(event)
            self.updated_at = time.time()
        if hold and self._held is None:
            self._held = len(self.events) - 1
        if self._held is None:
            self._wake()
            if self.sink is not None:
                self.sink([event])
        return event

    def extend_ephemeral(self, name: str, data: list[str], values: list[Any] | None = None) -> None:
        """Several events not kept in the store (``token``), appended together: one wake."""
        first = self.last_id + 1
        typed = values if values is not None else [None] * len(data)
        new = [LoggedEvent(first + i, name, d, v) for i, (d, v) in enumerate(zip(data, typed, strict=True))]
        self.events.extend(new)
        if self._held is None:
            self._wake()
            if self.sink is not None:
                self.sink(new)

    def release(self, *, stored: bool = True) -> None:
        """The events held back (:meth:`append_json`), and those after them, to the readers and the
        sink. ``stored`` False (the store could not be reached; the write is tried again): all but
        a last ``debate_done``, which stays held until it is stored. The streams go on while the
        store is down, but none ends on an end the store may never hold: a replica that loses its
        lease meanwhile is fenced, and its clients follow the debate where it goes on."""
        if self._held is None:
            return
        end = len(self.events)
        if not stored and self.events[-1].name == "debate_done":
            end -= 1
        released = self.events[self._held : end]
        self._held = None if end == len(self.events) else end
        self._wake()
        if self.sink is not None and released:
            self.sink(released)

    def take_unsaved(self) -> list[StoredEvent]:
        out = [e.stored() for e in self.unsaved]
        self.unsaved = []
        return out

    def _shown_count(self) -> int:
        return len(self.events) if self._held is None else self._held

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        # A reader checks for events and starts waiting with no await in between, so when none is
        # waiting now, each will see this event before it waits: nothing to set (the hot path: the
        # token events of every turn in flight, while the reader is busy writing the last ones).
        if self._waiting:
            self._changed.set()
            self._changed = asyncio.Event()

    async def _wait(self, changed: asyncio.Event) -> None:
        self._waiting += 1
        try:
            await changed.wait()
        finally:
            self._waiting -= 1

    async def follow(self, after: int = 0) -> AsyncIterator[LoggedEvent]:
        """The events with an id above ``after``, then each new one as it comes, until closed."""
        i = _first_after(self.events, after)
        while True:
            changed = self._changed
            if i < self._shown_count():
                event = self.events[i]
                i += 1
                yield event
                continue
            if self.closed:
                return
            await self._wait(changed)

    async def batches(self, after: int = 0) -> AsyncIterator[list[LoggedEvent]]:
        """Like :meth:`follow`, but every event already there at once: a client that is behind (or
        a burst of tokens) costs one write, not one per event."""
        i = _first_after(self.events, after)
        while True:
            changed = self._changed
            shown = self._shown_count()
            if i < shown:
                batch = self.events[i:shown]
                i = shown
                yield batch
                continue
            if self.closed:
                return
            await self._wait(changed)


#: The end of every line of every SSE stream moot serves: LF, as the SSE standard allows and as every
#: parser reads (some, such as the Open Responses compliance suite's, read nothing else).
SSE_SEP = "\n"


_LINES = re.compile(r"\r\n|\r|\n")


def sse_event(data: str, event: str | None = None, id: str | int | None = None) -> bytes:
    """One event as it goes on the wire: ``id:``, ``event:`` and one ``data:`` line per line of
    ``data`` (JSON has none; a line break in other data is kept as the format allows)."""
    head = (f"id: {id}\n" if id is not None else "") + (f"event: {event}\n" if event is not None else "")
    if "\n" in data or "\r" in data:
        body = "".join(f"data: {line}\n" for line in _LINES.split(data))
    else:
        body = f"data: {data}\n"
    return (head + body + "\n").encode()


def encode(events: list[LoggedEvent]) -> bytes:
    """Events in the SSE wire format (the data is one line of JSON: no newline can split it)."""
    return b"".join(sse_event(e.data, e.name, e.id) for e in events)


def _first_after(events: list[LoggedEvent], after: int) -> int:
    lo, hi = 0, len(events)
    while lo < hi:
        mid = (lo + hi) // 2
        if events[mid].id <= after:
            lo = mid + 1
        else:
            hi = mid
    return lo


def token_json(speaker: str, round_index: int, text: str) -> str:
    """A ``token`` event's data (:class:`TokenData`) without building the model: this is the hot path
    (the deltas of one turn over a short window), and the fields are the engine's own, already typed."""
    return to_json({"speaker": speaker, "round": round_index, "text": text}).decode()


def totals(result: DebateResult) -> Totals:
    return Totals(
        calls=result.llm_calls,
        prompt_tokens=result.usage.prompt_tokens,
        completion_tokens=result.usage.completion_tokens,
        total_tokens=result.usage.total_tokens,
        cached_prompt_tokens=result.usage.cached_prompt_tokens,
        elapsed_s=round(result.elapsed_s, 3),
    )


def turn_view(turn: Turn) -> TurnView:
    """The turn as its ``turn_done`` carries it. Built from the turn's own fields, validated already
    and of the same types (a dump and a validation again cost a fifth of a served debate's event
    handling): the same JSON as ``TurnView.model_validate(turn.model_dump(exclude={"messages"}))``."""
    view = TurnView.model_construct(**{name: getattr(turn, name) for name in _TURN_VIEW_FIELDS})
    view.raw = turn.raw if turn.parsed is not None else None  # (a text turn's is its text again)
    return view


_TURN_VIEW_FIELDS = tuple(TurnView.model_fields)


def done_data(result: DebateResult, status: ServerStatus, error: str | None = None) -> DebateDoneData:
    return DebateDoneData(
        status=status,
        stop_reason=result.stop_reason,
        final_answer=result.final_answer,
        decision=result.decision,
        error=error or result.error,
        warnings=result.warnings,
        dynamics=result.dynamics,
        totals=totals(result),
        quality=result.quality,
        cost=result.cost,
    )


def to_payload(
    event: Event, debate_id: str, *, elapsed: float, decision_kind: str, rounds: int
) -> tuple[str, BaseModel]:
    """The SSE name and data of an engine event. ``elapsed`` keeps the running totals current
    (the engine sets ``elapsed_s`` only when it finishes)."""
    result = event.result
    if not isinstance(event, DebateDone):
        result.elapsed_s = elapsed
    if isinstance(event, DebateStarted):
        return "debate_started", DebateStartedData(
            id=debate_id,
            protocol=result.protocol,
            question=result.task.question,
            participants=result.participants,
            rounds=rounds,
            decision=decision_kind,
            context_passages=len(result.task.context),
        )
    if isinstance(event, TurnStarted):
        return "turn_started", TurnStartedData(
            speaker=event.speaker, name=event.name, round=event.round, kind=event.kind
        )
    if isinstance(event, TokenDelta):
        return "token", TokenData(speaker=event.speaker, round=event.round, text=event.text)
    if isinstance(event, TurnRetry):
        return "turn_retry", TurnRetryData(
            speaker=event.speaker, round=event.round, attempt=event.attempt, error=event.error
        )
    if isinstance(event, TurnDone):
        return "turn_done", TurnDoneData(turn=turn_view(event.turn), totals=totals(result))
    if isinstance(event, RoundDone):
        # The same per-round dynamics the finished result will carry, as they stand now.
        rd = next(r for r in compute_dynamics(result).rounds if r.round == event.round.index)
        return "round_done", RoundDoneData(
            round=rd.round,
            answers=rd.answers,
            majority=rd.majority,
            agreement=rd.agreement,
            changed=rd.changed,
            errors=rd.errors,
            parse_failures=rd.parse_failures,
            warnings=list(result.warnings),
            totals=totals(result),
        )
    status: ServerStatus = result.status if result.status != "running" else "failed"
    return "debate_done", done_data(result, status)
