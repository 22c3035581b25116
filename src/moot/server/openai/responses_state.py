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
*stored* events alone (:mod:`moot.server.openai.responses_replay`): the same events with the same
``sequence_number`` whenever they are read, before or after a restart of the server. Such a stream
carries each turn's and the reply's text whole (the token deltas are not stored).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from moot.server.limits import RequestError
from moot.server.state import Store

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
STATUS = {"queued": "queued", "running": "in_progress", "complete": "completed", "cancelled": "cancelled"}

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
        now = STATUS.get(row.status, "in_progress") if row is not None else response.get("status")
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
