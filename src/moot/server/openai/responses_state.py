"""Stateful Responses: ``store``, ``previous_response_id`` and ``background`` on the debate store.

**A response is a stored debate.** Its id is ``resp_<debate id>``; what the Responses API keeps of it
is under the ``responses`` key of the debate's stored request (:class:`Kept`): whether it is stored,
whether it runs in the background, the request as sent, the conversation the debate read (its input
items) and the response object as last returned (its final form once the debate ends). ``store``
is true unless the request sets it false, as in OpenAI's API; a response stored false is not
retrievable here (404) nor continued, though its debate is in ``GET /v1/debates/{id}`` as every
debate is. ``DELETE /v1/responses/{id}`` removes the debate and its events for good.

**A chain is a conversation.** With ``previous_response_id``, the debate reads the previous
response's input items, then its output, then the new input (the previous ``instructions`` are not
carried over, as in the API). Each stored response keeps its whole conversation, so a chain is one
read of the store however long it is.

**Background.** ``background: true`` returns at once (``queued``); the debate runs in the server
and its response is kept when it ends; poll ``GET /v1/responses/{id}``, cancel with ``POST
/v1/responses/{id}/cancel``. ``GET /v1/responses/{id}?stream=true&starting_after=N`` (and
``background`` with ``stream``) sends the response's stream events derived from the debate's
*stored* events alone (:class:`Replay`): the same events with the same ``sequence_number`` whenever
they are read, before or after a restart of the server. Such a stream carries each turn's and the
reply's text whole (the token deltas are not stored).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from moot.server.limits import RequestError
from moot.server.openai.debate_feed import header, value_of
from moot.server.schemas import RoundDoneData, TurnDoneData, TurnStartedData
from moot.server.state import Store, StoredDebate
from moot.server.state.base import EPHEMERAL, patiently
from moot.server.state.events import LoggedEvent, sse_event
from moot.server.state.manager import DebateManager, LiveDebate

log = logging.getLogger("moot.server")

PREFIX = "resp_"
#: What a debate id may be (moot's are 32 hex digits): any other id names no response, and is not
#: sent to the store (PostgreSQL refuses a NUL in a text parameter).
_DEBATE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: The key of a debate's stored request that holds what the Responses API keeps of it.
KEY = "responses"
#: The statuses a response ends in (a cancel of one of these changes nothing).
TERMINAL = frozenset({"completed", "incomplete", "failed", "cancelled"})
#: A stored debate's status, as a response's (``complete`` is ``completed``, the rest ``failed``).
_STATUS = {"queued": "queued", "running": "in_progress", "complete": "completed", "cancelled": "cancelled"}

#: The app's stream helper (:func:`moot.server.http.streams.sse_responder`).
SSE = Callable[[Request, AsyncIterator[bytes], Mapping[str, str] | None], Response]


class Kept(BaseModel):
    """What a stored response keeps (its debate's request, under ``responses``)."""

    store: bool = True
    background: bool = False
    previous_response_id: str | None = None
    created_at: int = Field(default_factory=lambda: int(time.time()))
    #: The conversation the debate read: the chain's items, then this request's input, as items.
    input: list[dict[str, Any]] = Field(default_factory=list)
    #: Whether its stream carries the debate's turns (the request asked for the trace).
    trace: bool = False
    #: The response object as first returned (a background response's ``queued`` form).
    first: dict[str, Any] | None = None
    #: The response object as last returned (its final form once the debate ended).
    response: dict[str, Any] | None = None


class DeletedResponse(BaseModel):
    """``DELETE /v1/responses/{id}``, as the API answers it."""

    id: str
    object: Literal["response"] = "response"
    deleted: bool = True


class ItemList(BaseModel):
    """``GET /v1/responses/{id}/input_items``: a page of input items, as the API pages them."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


# ------------------------------------------------------------------------------------ errors


def not_found(response_id: str) -> RequestError:
    return RequestError(
        f"response_id: no stored response with id {response_id!r} (it was never made here, was made with store: "
        "false, or was deleted); check the id",
        param="response_id",
        status=404,
        code="response_not_found",
    )


def previous_not_found(response_id: str) -> RequestError:
    """OpenAI's own refusal of a continuation it has nothing to continue (400, as the API gives it)."""
    return RequestError(
        f"Previous response with id {response_id!r} not found: previous_response_id must name a response this "
        "server stored (made with store left out or true, not deleted); send the whole conversation in input "
        "instead",
        param="previous_response_id",
        code="previous_response_not_found",
    )


def debate_of(response_id: str) -> str | None:
    """The debate id behind a response id (``resp_<debate id>``), or None for another kind of id."""
    debate_id = response_id[len(PREFIX) :] if response_id.startswith(PREFIX) else ""
    return debate_id if _DEBATE_ID.fullmatch(debate_id) else None


def kept_of(store: Store, debate_id: str) -> tuple[dict[str, Any], Kept] | None:
    """A stored debate's request and what it keeps as a response (None: not a stored response)."""
    request = store.request(debate_id)
    raw = (request or {}).get(KEY)
    if request is None or not isinstance(raw, dict):
        return None
    kept = Kept.model_validate(raw)
    return (request, kept) if kept.store else None


def base_of(kept: Kept) -> str:
    """The server's base URL as the response's request saw it (its viewer link, in the first form's
    metadata), for the final form of a response whose debate another process runs."""
    url = str(((kept.first or {}).get("metadata") or {}).get("moot_url") or "")
    return url.rsplit("/debates/", 1)[0]


def keep(store: Store, debate_id: str, request: dict[str, Any], kept: Kept) -> bool:
    """Keep ``kept`` with the debate's stored request; False: no such debate (deleted)."""
    return store.set_request(debate_id, {**request, KEY: kept.model_dump(mode="json")})


# ------------------------------------------------------------------------------------ input items


def as_items(value: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """A request's ``input`` as input items (a string is one user message)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}]
    return [dict(item) for item in value]


def listed(item: dict[str, Any], item_id: str) -> dict[str, Any]:
    """An input item as ``input_items`` lists it (the API's item types: an id, content as parts)."""
    out = dict(item)
    kind = out.get("type") or ("message" if "role" in out else None)
    if kind is not None:
        out["type"] = kind
    out.setdefault("id", item_id)
    if kind == "message":
        role = out.get("role")
        content = out.get("content")
        part = "output_text" if role == "assistant" else "input_text"
        if isinstance(content, str):
            text: dict[str, Any] = {"type": part, "text": content}
            if part == "output_text":
                text["annotations"] = []
            out["content"] = [text]
        elif content is None:
            out["content"] = []
        out.setdefault("status", "completed")
    elif kind == "function_call_output":
        out.setdefault("status", "completed")
    elif kind == "reasoning":
        out.setdefault("summary", [])
    return out


def conversation(debate_id: str, kept: Kept) -> list[dict[str, Any]]:
    """The input items of a stored response, each with its id (those without one are numbered)."""
    return [listed(item, f"msg_{debate_id}_{i}") for i, item in enumerate(kept.input)]


def chain(store: Store, previous_response_id: str, new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation a continuation reads: the previous response's items, its output, the new input."""
    debate_id = debate_of(previous_response_id)
    found = kept_of(store, debate_id) if debate_id is not None else None
    if debate_id is None or found is None:
        raise previous_not_found(previous_response_id)
    _, previous = found
    response = previous.response or {}
    if response.get("status") in ("queued", "in_progress"):
        row = store.get(debate_id, with_result=False)  # (the kept form says queued until its end is kept)
        now = _STATUS.get(row.status, "in_progress") if row is not None else response.get("status")
        raise RequestError(
            f"previous_response_id: the response {previous_response_id} is still {now}; wait "
            f"until it ends (GET /v1/responses/{previous_response_id}) before continuing it",
            param="previous_response_id",
        )
    output = [dict(item) for item in response.get("output") or []]
    return [*conversation(debate_id, previous), *output, *new]


def bounded(items: list[dict[str, Any]], earlier: int, limit: int, truncate: bool) -> list[dict[str, Any]]:
    """A chain's conversation (``earlier`` items of the chain, then the new input) held to ``limit``
    bytes of JSON: each stored response keeps its whole conversation, so a chain grew every row
    without end. With ``truncate`` (``truncation: auto``) the chain's oldest items are left out, as
    the debate leaves them out to fit its model; else, or if the new input alone is over, refused."""
    sizes = [len(json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode()) for item in items]
    total, start = sum(sizes), 0
    if total <= limit:
        return items
    while truncate and start < earlier and total > limit:
        total -= sizes[start]
        start += 1
    if total > limit:
        raise RequestError(
            f"previous_response_id: the conversation comes to {sum(sizes):,} bytes, over this server's limit of "
            f"{limit:,} for one conversation (moot serve --max-conversation-bytes); "
            + ("send truncation: auto to leave its oldest items out, or " if not truncate else "")
            + "start a new conversation with what matters of it",
            param="previous_response_id",
        )
    return items[start:]


def named_in_input(error: RequestError, earlier: int) -> RequestError:
    """A refusal of the conversation a chain made, named as the request wrote it: ``input[i]`` of
    the new input (after ``earlier`` items of the chain), or ``previous_response_id`` for an item of
    the chain."""
    found = re.match(r"input\[(\d+)\]", error.param or "")
    if not earlier or found is None:
        return error
    index = int(found.group(1))
    if index < earlier:
        message = f"previous_response_id: item {index} of the chain's conversation is refused ({error.message})"
        return RequestError(message, param="previous_response_id", status=error.status, code=error.code)
    old = found.group(0)
    new = f"input[{index - earlier}]"
    message = error.message.replace(old, new, 1)
    param = new + (error.param or "")[len(old) :]
    return RequestError(message, param=param, status=error.status, code=error.code)


def page(
    items: list[dict[str, Any]], *, after: str | None, before: str | None, limit: int, order: str
) -> dict[str, Any]:
    """A list object of input items, as the API pages them (``after``/``before`` an item id)."""
    ordered = items if order == "asc" else list(reversed(items))
    ids = [str(item.get("id")) for item in ordered]
    for name, cursor in (("after", after), ("before", before)):
        if cursor is not None and cursor not in ids:
            raise RequestError(
                f"{name}: no input item with id {cursor!r} in this response; give an id from its input_items",
                param=name,
            )
    start = ids.index(after) + 1 if after is not None else 0
    end = ids.index(before) if before is not None else len(ordered)
    window = ordered[start:end]
    data = window[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(window) > limit,
    }


# ------------------------------------------------------------------------------------ the response


def stamped(data: dict[str, Any], kept: Kept, status: str | None = None) -> dict[str, Any]:
    """A response object as this request made it: its store, background, chain and creation time."""
    out = {
        **data,
        "store": kept.store,
        "background": kept.background,
        "previous_response_id": kept.previous_response_id,
        "created_at": kept.created_at,
    }
    if status is not None:
        out["status"] = status
    return out


def rebuilt(row: StoredDebate, kept: Kept) -> dict[str, Any]:
    """The response of a debate that ended with no response kept (the server stopped first): its
    status, and its answer if it has one."""
    base = dict(kept.response or kept.first or {})
    result = row.result
    status = _STATUS.get(row.status, "failed")
    output: list[dict[str, Any]] = []
    if status == "completed" and result is not None and result.final_answer is not None:
        text = {"type": "output_text", "text": result.final_answer, "annotations": [], "logprobs": []}
        output.append(
            {"type": "message", "id": f"msg_{row.id}", "role": "assistant", "status": "completed", "content": [text]}
        )
    elif status == "completed":
        status = "failed"
    error = None
    if status == "failed":
        why = row.error or (result.error if result else None) or "no decision"
        error = {"code": "server_error", "message": f"the debate {row.id} ended {row.status}: {why}"}
    return stamped({**base, "output": output, "error": error, "status": status}, kept)


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
                if live.status == "cancelled":
                    data = {**stamped(kept.first or {}, kept, "cancelled"), "output": []}
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
        status = _STATUS.get(live.status if live is not None else row.status, "in_progress")
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
            if key not in self._decision:
                text = header(turn.name or turn.speaker, turn.round) + (turn.text or "")
                if turn.error is not None:
                    text += f"\n\n_(this turn failed: {turn.error})_"
                self._texts[key] = text
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
    if row is None or found is None:  # deleted meanwhile
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
