"""What the Open Responses standard (openresponses.org, the open schema of the Responses API) asks of
``/v1/responses`` beyond what the route itself does: the fields every response object must carry
(:func:`echoed`), and moot's compaction items (:func:`compaction_item`, :func:`compacted_messages`).

**The echoed fields.** The standard requires the sampling fields, ``service_tier``,
``previous_response_id`` and more on every response. Each holds what is true of the debate: the
request's value, or the one the debate ran with (``temperature``: the request's, else the protocol's,
else 1, standing for the backend's own default; ``top_p`` 1, ``presence_penalty`` and
``frequency_penalty`` 0 and ``top_logprobs`` 0, the only values a debate takes; ``service_tier``
``default``: one queue serves every request). A tool or a ``text.format`` comes back in the
standard's full form (``strict``, ``description`` and ``parameters`` or ``schema`` given, null when
the request left them out).

**Compaction.** ``POST /v1/responses/compact`` makes no model call: it is deterministic. The user
messages stay as they are; every other item a debate reads (system and developer messages, the
assistant's replies, a tool loop's calls and results, earlier compaction items) is packed into one
``compaction`` item, in order. Its ``encrypted_content`` is opaque to the client but not encrypted:
moot's own encoding (``moot1.`` then base64url of zlib'd JSON), which ``/v1/responses`` reads back as
the same context. Reasoning items (a debate's trace) are dropped, as ``/v1/responses`` never reads
them as context. Nothing is summarised, so nothing is lost: a conversation too long for the debate's
models stays too long (compaction here shrinks the items a client sends back, not the prompt).
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from typing import Any, Protocol

from moot.core.spec import ProtocolSpec
from moot.server.bodies import read_json
from moot.server.limits import RequestError

#: The prefix of moot's compaction payloads (a later encoding gets another).
COMPACTION_PREFIX = "moot1."
#: The most the compaction items of one request may unpack to in all, and the JSON objects they may
#: hold in all: a zlib bomb is refused as it unpacks, not inflated (a review: 35 items of 16 KB each
#: unpacking to 4 MB of tiny messages took 36 s and 4 GB; twenty unpacking to one 4 MB message each
#: held the event loop 8 s, and again at each request that continued that response).
MAX_COMPACTED_BYTES = 4 * 1024 * 1024
MAX_COMPACTED_OBJECTS = 20_000


class EchoedRequest(Protocol):
    """The fields of a Responses request that :func:`echoed` reads."""

    temperature: float | None
    tools: list[Any] | None
    text: dict[str, Any] | None
    reasoning: dict[str, Any] | None
    store: bool | None
    background: bool | None
    safety_identifier: str | None
    prompt_cache_key: str | None
    previous_response_id: str | None
    truncation: str | None
    parallel_tool_calls: bool | None


def echoed(req: EchoedRequest, spec: ProtocolSpec) -> dict[str, Any]:
    """The response object's fields that repeat the request, as the Open Responses schema requires
    them (see the module's docstring)."""
    temperature = req.temperature if req.temperature is not None else spec.temperature
    return {
        "temperature": 1.0 if temperature is None else temperature,
        "top_p": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "top_logprobs": 0,
        "max_tool_calls": None,
        "service_tier": "default",
        "tools": [function_tool(t) for t in req.tools or []],
        "text": text_field(req.text),
        "reasoning": reasoning_field(req.reasoning),
        "store": req.store is not False,  # left out: stored (responses_state)
        "background": bool(req.background),
        "truncation": req.truncation or "auto",  # (moot's default: the oldest messages left out to fit)
        "parallel_tool_calls": req.parallel_tool_calls is not False,  # (one call a turn fits either)
        "safety_identifier": req.safety_identifier,
        "prompt_cache_key": req.prompt_cache_key,
        "previous_response_id": req.previous_response_id,
    }


def function_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A function tool as the standard writes it: each of its fields present (null if not given)."""
    strict = tool.get("strict")
    return {
        "type": "function",
        "name": tool.get("name"),
        "description": tool.get("description"),
        "parameters": tool.get("parameters"),
        "strict": strict if isinstance(strict, bool) else None,
    }


def text_field(text: dict[str, Any] | None) -> dict[str, Any]:
    """``text`` as the standard writes it: its ``format`` in full (a ``json_schema`` with its name,
    description, schema and ``strict``)."""
    given = dict(text or {})
    fmt = given.get("format") or {"type": "text"}
    if fmt.get("type") == "json_schema":
        strict = fmt.get("strict")
        fmt = {
            "type": "json_schema",
            "name": fmt.get("name"),
            "description": fmt.get("description"),
            "schema": fmt.get("schema"),
            "strict": strict if isinstance(strict, bool) else False,
        }
    out: dict[str, Any] = {"format": fmt}
    if given.get("verbosity") is not None:
        out["verbosity"] = given["verbosity"]
    return out


def reasoning_field(reasoning: dict[str, Any] | None) -> dict[str, Any] | None:
    """``reasoning`` as the standard writes it: ``effort`` and ``summary`` (the older
    ``generate_summary`` read as ``summary``), None when the request gave none."""
    if reasoning is None:
        return None
    return {"effort": reasoning.get("effort"), "summary": reasoning.get("summary") or reasoning.get("generate_summary")}


# ------------------------------------------------------------------------------------ compaction


def compaction_item(items: list[dict[str, Any]], item_id: str) -> dict[str, Any]:
    """One ``compaction`` output item that carries ``items`` (see the module's docstring), refused
    when it would unpack past what a request may send back (:data:`MAX_COMPACTED_BYTES`: a review
    compacted again four compactions and more, and the server then refused what it had made)."""
    packed = json.dumps(items, separators=(",", ":"), ensure_ascii=False).encode()
    if len(packed) > MAX_COMPACTED_BYTES:
        raise RequestError(
            f"input: the conversation comes to {len(packed):,} bytes, over the {MAX_COMPACTED_BYTES:,} one compaction "
            "item may carry (and a request may send back); compact its most recent part, and send the rest no more",
            param="input",
        )
    payload = COMPACTION_PREFIX + base64.urlsafe_b64encode(zlib.compress(packed, 9)).decode()
    return {"type": "compaction", "id": item_id, "encrypted_content": payload, "created_by": "moot"}


class _Room:
    """What the compaction items of one request may still unpack to (:data:`MAX_COMPACTED_BYTES`,
    :data:`MAX_COMPACTED_OBJECTS`)."""

    def __init__(self) -> None:
        self.bytes = MAX_COMPACTED_BYTES
        self.objects = MAX_COMPACTED_OBJECTS


def compacted_messages(item: dict[str, Any], where: str, room: _Room | None = None) -> list[dict[str, Any]]:
    """The items a ``compaction`` input item carries, as :func:`compaction_item` packed them; one it
    did not make is refused by its place, saying what to send instead. ``room``: what this request's
    compaction items may still unpack to (what this one takes is taken from it)."""
    room = room if room is not None else _Room()
    content = item.get("encrypted_content")
    refusal = RequestError(
        f"{where}.encrypted_content: not a compaction this server made (POST /v1/responses/compact); send the "
        "conversation's items themselves, or the compact endpoint's output unchanged",
        param=f"{where}.encrypted_content",
    )
    if not isinstance(content, str) or not content.startswith(COMPACTION_PREFIX):
        raise refusal
    inflate = zlib.decompressobj()
    try:
        packed = base64.urlsafe_b64decode(content[len(COMPACTION_PREFIX) :].encode())
        raw = inflate.decompress(packed, room.bytes + 1)
    except (binascii.Error, zlib.error, ValueError):
        raise refusal from None
    if inflate.unconsumed_tail or len(raw) > room.bytes:
        raise RequestError(
            f"{where}.encrypted_content: the request's compaction items unpack to over {MAX_COMPACTED_BYTES:,} bytes "
            "in all; send fewer of them, or the conversation's items themselves",
            param=f"{where}.encrypted_content",
        )
    room.bytes -= len(raw)
    try:  # the payload is the client's to craft: read as a body is (depth, numbers, lone surrogates)
        items = read_json(raw, "application/json", max_objects=room.objects)
    except RequestError as exc:
        problem = exc.message.replace("the body", "the payload", 1)
        if exc.code == "too_many_objects":
            problem = (
                f"the request's compaction items hold over {MAX_COMPACTED_OBJECTS:,} JSON objects in all; send fewer "
                "of them, or the conversation's items themselves"
            )
        raise RequestError(f"{where}.encrypted_content: {problem}", param=f"{where}.encrypted_content") from None
    # (compaction_item packs expanded items: one that carries another compaction was not made here.)
    if not isinstance(items, list) or not all(isinstance(i, dict) and i.get("type") != "compaction" for i in items):
        raise refusal
    room.objects -= _objects_in(items)
    return items


def _objects_in(value: Any) -> int:
    """How many JSON objects ``value`` holds (itself included)."""
    count, stack = 0, [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            count += 1
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count


def expanded(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``input``'s items with each ``compaction`` item replaced by the items it carries (all of them
    together within :data:`MAX_COMPACTED_BYTES` and :data:`MAX_COMPACTED_OBJECTS`)."""
    room = _Room()
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get("type") == "compaction":
            out += compacted_messages(item, f"input[{i}]", room)
        else:
            out.append(item)
    return out
