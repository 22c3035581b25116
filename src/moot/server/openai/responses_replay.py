"""A stored response followed over time: a background debate's end awaited (:class:`Watchers`), and a
response's stream events derived from its debate's *stored* events alone (:class:`Replay`), the same
events with the same ``sequence_number`` whenever they are read, before or after a restart of the
server (the state they read: :mod:`moot.server.openai.responses_state`)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

from moot.server.openai.debate_feed import turn_trace, value_of
from moot.server.openai.response_objects import rebuilt
from moot.server.openai.responses_state import (
    PREFIX,
    STATUS,
    TERMINAL,
    Kept,
    keep,
    kept_of,
    stamped,
)
from moot.server.schemas import RoundDoneData, TurnDoneData, TurnStartedData
from moot.server.state import Store, StoredDebate
from moot.server.state.base import EPHEMERAL, patiently
from moot.server.state.events import LoggedEvent, sse_event
from moot.server.state.manager import DebateManager, LiveDebate

log = logging.getLogger("moot.server")


# ------------------------------------------------------------------------------------ watching


class Watchers:
    """The tasks that keep each stored response's final form when its debate ends, by debate id."""

    def __init__(self) -> None:
        self.tasks: dict[str, asyncio.Task[dict[str, Any] | None]] = {}

    def watch(
        self,
        live: LiveDebate,
        store: Store,
        final: Callable[[], dict[str, Any]],
        kept: Kept,
        request: dict[str, Any],
    ) -> asyncio.Task[dict[str, Any] | None]:
        """Keep the response's final form with its stored ``request`` once its debate ends; the task
        gives that form (None: none was kept here), which a request waiting for it answers with."""

        async def run() -> dict[str, Any] | None:
            await live.done.wait()
            if live.status == "queued" or live.fenced:
                # Not ended: this server stopped before it started (it runs at the next start) or
                # handed it back, or another replica has it; the one that runs it keeps its final form.
                return None
            try:
                if live.status == "cancelled":  # (with a trace's finished turns, as its stream showed them)
                    data = {**stamped(kept.first or {}, kept, "cancelled"), "output": final().get("output") or []}
                else:
                    data = stamped(final(), kept)
                if not keep(store, live.id, request, kept.model_copy(update={"response": data})):
                    return None  # deleted meanwhile: it stays deleted (the write found no row)
            except Exception as exc:  # (the store closing at a shutdown): GET rebuilds it from the debate
                log.warning("response %s%s: its final form could not be kept: %s", PREFIX, live.id, exc)
                return None
            return data

        task = asyncio.get_running_loop().create_task(run(), name=f"response-{live.id}")
        self.tasks[live.id] = task
        # (A retry that joins the debate watches it too: each task removes its own entry only.)
        task.add_done_callback(lambda done: self.tasks.pop(live.id) if self.tasks.get(live.id) is done else None)
        return task

    async def settled(self, debate_id: str) -> None:
        """Once the debate's final response is kept (at once when none is being kept)."""
        task = self.tasks.get(debate_id)
        if task is not None:
            await asyncio.shield(task)


def current(row: StoredDebate, kept: Kept, live: LiveDebate | None) -> dict[str, Any]:
    """A stored response as it is now: its final form, or its first with the debate's status."""
    if kept.response is not None and kept.response.get("status") in TERMINAL:
        return kept.response
    if live is not None or row.status in ("queued", "running"):
        status = STATUS.get(live.status if live is not None else row.status, "in_progress")
        return stamped(kept.response or kept.first or {}, kept, status)
    return rebuilt(row, kept)


# ------------------------------------------------------------------------------------ the stream


class Replay:
    """A stored response's stream events, derived from its debate's stored events alone (numbered
    from 0): ``response.created`` and ``response.queued`` (its first form), ``response.in_progress``
    when the debate starts, with the trace each round's turns (whole, in order) as reasoning items
    when the round ends, then the rest of the final response's output and its end
    (``response.completed``, ``response.incomplete``, or ``response.failed``, whose response says
    ``failed`` or ``cancelled``)."""

    def __init__(self, debate_id: str, kept: Kept, trace: bool) -> None:
        self.debate_id = debate_id
        self.kept = kept
        self.trace = trace
        self.number = 0
        self.items: list[dict[str, Any]] = []
        self._started: list[tuple[str, int]] = []
        self._decision: set[tuple[str, int]] = set()
        self._texts: dict[tuple[str, int], str] = {}

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.number, **fields}
        self.number += 1
        return event

    def opening(self) -> list[dict[str, Any]]:
        first = stamped(self.kept.first or {}, self.kept, "queued")
        return [self._event("response.created", response=first), self._event("response.queued", response=first)]

    def of(self, event: LoggedEvent) -> list[dict[str, Any]]:
        """The stream events of one stored debate event (none for most)."""
        if event.name == "debate_started":
            running = stamped(self.kept.first or {}, self.kept, "in_progress")
            return [self._event("response.in_progress", response=running)]
        if not self.trace or event.name not in ("turn_started", "turn_done", "round_done"):
            return []
        if event.name == "turn_started":
            started = value_of(event, TurnStartedData)
            key = (started.speaker, started.round)
            if started.kind == "decision":
                self._decision.add(key)
            elif key not in self._started:
                self._started.append(key)
            return []
        if event.name == "turn_done":
            turn = value_of(event, TurnDoneData).turn
            key = (turn.speaker, turn.round)
            if key not in self._decision:  # (as the final response shows it: its items are the same)
                self._texts[key] = turn_trace(turn)
            return []
        ended = value_of(event, RoundDoneData).round
        out: list[dict[str, Any]] = []  # round_done: the round's turns, in the order they started
        for key in [k for k in self._started if k[1] == ended and k in self._texts]:
            self._started.remove(key)
            text = self._texts.pop(key)
            item_id = f"rs_{self.debate_id}_{len(self.items)}"
            part = {"type": "reasoning_text", "text": text}
            item: dict[str, Any] = {"type": "reasoning", "id": item_id, "status": "completed", "summary": []}
            item["content"] = [part]
            out += self._item(item)
        return out

    def _item(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        """One whole output item's events."""
        index = len(self.items)
        self.items.append(item)
        kind = item.get("type")
        if kind == "function_call":
            opened = {**item, "status": "in_progress", "arguments": ""}
            common = {"item_id": item["id"], "output_index": index}
            return [
                self._event("response.output_item.added", output_index=index, item=opened),
                self._event("response.function_call_arguments.delta", delta=item["arguments"], **common),
                self._event(
                    "response.function_call_arguments.done", arguments=item["arguments"], name=item["name"], **common
                ),
                self._event("response.output_item.done", output_index=index, item=item),
            ]
        parts = item.get("content") or []
        opened = {**item, "status": "in_progress", "content": []}
        out = [self._event("response.output_item.added", output_index=index, item=opened)]
        reasoning = kind == "reasoning"
        for c, part in enumerate(parts):
            common = {"item_id": item["id"], "output_index": index, "content_index": c}
            text = str(part.get("text", ""))
            empty = {**part, "text": ""}
            out.append(self._event("response.content_part.added", part=empty, **common))
            if reasoning:
                out.append(self._event("response.reasoning_text.delta", delta=text, **common))
                out.append(self._event("response.reasoning_text.done", text=text, **common))
            else:
                out.append(self._event("response.output_text.delta", delta=text, logprobs=[], **common))
                out.append(self._event("response.output_text.done", text=text, logprobs=[], **common))
            out.append(self._event("response.content_part.done", part=part, **common))
        out.append(self._event("response.output_item.done", output_index=index, item=item))
        return out

    def closing(self, final: dict[str, Any]) -> list[dict[str, Any]]:
        """The rest of the final response's output, and its end."""
        out: list[dict[str, Any]] = []
        for item in (final.get("output") or [])[len(self.items) :]:
            out += self._item(item)
        status = final.get("status")
        kind = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(
            str(status), "response.failed"
        )
        return [*out, self._event(kind, response=final)]

    def deleted(self) -> list[dict[str, Any]]:
        """The end of the stream of a response deleted while it ran: ``response.failed``, with what
        the stream had shown (a client's iterator would otherwise end as if nothing had happened)."""
        message = f"the response {PREFIX}{self.debate_id} was deleted before it ended (DELETE /v1/responses)"
        gone = {
            **stamped(self.kept.first or {}, self.kept, "failed"),
            "output": list(self.items),
            "error": {"code": "server_error", "message": message},
        }
        return [self._event("response.failed", response=gone)]


def events_after(events: Iterable[dict[str, Any]], starting_after: int | None) -> Iterable[dict[str, Any]]:
    return (e for e in events if starting_after is None or e["sequence_number"] > starting_after)


def sse_of(event: dict[str, Any]) -> bytes:
    return sse_event(json.dumps(event, separators=(",", ":"), ensure_ascii=False), event=event["type"])


async def replay(
    manager: DebateManager,
    watchers: Watchers,
    debate_id: str,
    kept: Kept,
    starting_after: int | None,
) -> AsyncIterator[bytes]:
    """A stored response's stream (:class:`Replay`), following its debate while it runs."""
    store = manager.store
    events = Replay(debate_id, kept, kept.trace)
    for event in events_after(events.opening(), starting_after):
        yield sse_of(event)
    live = manager.live.get(debate_id)
    # The log in memory while the debate runs here or was just finished here (its last writes may
    # not be in the store yet), else the store's, followed until the debate ends wherever it runs:
    # the same events, under the same ids. One that went on at another replica while this one runs
    # on (its lease was lost) is followed on from the store; at a stop, the stream says where the
    # debate went and ends (followed, it would only be cut at its grace).
    log_ = manager.log_of(debate_id, from_store=False)
    last = 0

    def shown(logged: LoggedEvent) -> Iterator[bytes]:
        return (sse_of(e) for e in events_after(events.of(logged), starting_after) if logged.name not in EPHEMERAL)

    def stopping() -> bool:
        return manager.stopping

    async for logged in log_.follow(0) if log_ is not None else _stored(store, debate_id, stopping=stopping):
        last = logged.id
        for chunk in shown(logged):
            yield chunk
    if live is not None:
        await live.done.wait()
    row = await patiently(lambda: store.get(debate_id, with_result=False))
    unended = row is not None and row.status in ("queued", "running")
    # Gone on at another replica (its lease lost, taken from this one's queue, handed back): followed
    # on from the store, after this log's last event, even once it ended there (this log stopped short).
    went = live is not None and (live.fenced or live.handed_back)
    if log_ is not None and store.shared and (went or unended) and not manager.stopping:
        async for logged in _stored(store, debate_id, after=last, stopping=stopping):
            last = logged.id
            for chunk in shown(logged):
                yield chunk
        row = await patiently(lambda: store.get(debate_id, with_result=False))
        unended = row is not None and row.status in ("queued", "running")
    if unended and manager.stopping:  # its end comes later, elsewhere or at the next start: say so, and end
        where = "goes on at another replica" if store.shared else "stays queued and runs when the server is back"
        said = events.number - 1
        message = (
            f"the server is stopping: {PREFIX}{debate_id} {where}; follow it with GET /v1/responses/"
            f"{PREFIX}{debate_id}?stream=true&starting_after={said} (nothing is lost)"
        )
        # (its number is the next event's, which the stream that follows it gives again)
        yield sse_of({"type": "error", "sequence_number": events.number, "code": "server_stopping",
                      "message": message, "param": None})  # fmt: skip
        return
    await watchers.settled(debate_id)
    row = await patiently(lambda: store.get(debate_id))
    found = await patiently(lambda: kept_of(store, debate_id))
    if row is None or found is None:  # deleted meanwhile: the stream still ends, and says why
        for event in events_after(events.deleted(), starting_after):
            yield sse_of(event)
        return
    final = current(row, found[1], None)
    for event in events_after(events.closing(final), starting_after):
        yield sse_of(event)


async def _stored(
    store: Store, debate_id: str, every_s: float = 0.5, *, after: int = 0, stopping: Callable[[], bool] = lambda: False
) -> AsyncIterator[LoggedEvent]:
    """A debate's stored events with an id above ``after``, followed until it ends (another process
    may be running it), or until this server stops (``stopping``)."""
    last = after
    while not stopping():
        row = await patiently(lambda: store.get(debate_id, with_result=False))  # (before its events: an end
        # is written with its last)
        for e in await patiently(functools.partial(store.events, debate_id, after=last)):
            last = e.id
            yield LoggedEvent(e.id, e.name, e.data)
        if row is None or row.status not in ("queued", "running"):
            return
        await asyncio.sleep(every_s)
