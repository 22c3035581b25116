"""The Open Responses standard's other ways to reach ``/v1/responses``: ``POST /v1/responses/compact``
and WebSocket mode (``GET /v1/responses``, upgraded).

**Compact** makes no model call (:mod:`moot.server.openai.open_responses` says how it packs a conversation):
the conversation's items, checked as ``/v1/responses`` checks them, come back as one ``compaction``
item that ``/v1/responses`` reads as the same context. ``usage`` is all zeros: nothing was generated.

**WebSocket mode.** After the upgrade (the same key as every ``/v1`` route, and a browser page of
another origin refused), each ``response.create`` message (a Responses request without ``stream`` or
``background``) runs one debate; its events are the streamed response's, each a JSON text message.
Turns run one after another (a message sent while one runs waits). A response is stored as over HTTP
(``store`` left out or true: ``GET /v1/responses/{id}``, continued over HTTP or from another
connection; :mod:`moot.server.openai.responses_state`); ``store: false`` keeps it from the store.
``previous_response_id`` continues the connection's most recent response (its input and output come
before the new input, as if sent again: that cache is the connection's alone and holds only its last
response), else a stored response, as over HTTP. An id neither names (with ``store: false``, any other
than the connection's last) is an ``error`` event ``previous_response_not_found`` (400), and the
connection stays open. A refused message is an ``error`` event with the HTTP status and
the error a request would get; a continuation refused or failed evicts the response it continued
from the connection's cache, as the standard requires (continued from again, with ``store: false``
it is not found; a stored one is read from the store). A connection lasts at most
:data:`CONNECTION_LIMIT_S` (the standard's 60 minutes): then it gets
``websocket_connection_limit_reached`` and closes, idle or not (a turn running then ends first).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal

from fastapi import APIRouter, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.datastructures import Headers

from moot.secrets import redact
from moot.server.asgi import api_router
from moot.server.bodies import NO_BODY, read_json
from moot.server.limits import RequestError
from moot.server.openai import open_responses, responses, submission
from moot.server.openai import responses_state as state
from moot.server.openai.catalogue import debate_model
from moot.server.openai.refusals import refuse_unless
from moot.server.openai.response_objects import Shell
from moot.server.openai.responses_replay import Watchers
from moot.server.openai.responses_request import ResponsesRequest, split_input
from moot.server.openai.responses_stream import events
from moot.server.settings import ServerSettings
from moot.server.state import StoreUnavailable
from moot.server.state.keyring import KeyRing, rate_refusal
from moot.server.state.keys import ApiKey
from moot.server.state.manager import QueueFull

log = logging.getLogger("moot.server")

#: How long one WebSocket connection lasts (the standard's limit).
CONNECTION_LIMIT_S = 60 * 60
#: The fields of a ``response.create`` message that only the HTTP transport has.
HTTP_ONLY = ("stream", "stream_options", "background")
#: The status codes an error event may carry, by the error's kind.
_KINDS = {429: "rate_limit_error"}
#: A pydantic validation error, as the app words it: (message, param).
Describe = Callable[[ValidationError], tuple[str, str | None]]


class CompactRequest(BaseModel):
    """``POST /v1/responses/compact``."""

    model_config = ConfigDict(extra="forbid")

    model: str
    input: str | list[dict[str, Any]] | None = None
    previous_response_id: str | None = None
    instructions: str | None = None
    prompt_cache_key: str | None = None


class CompactUsage(BaseModel):
    input_tokens: int = 0
    input_tokens_details: dict[str, int] = {"cached_tokens": 0}
    output_tokens: int = 0
    output_tokens_details: dict[str, int] = {"reasoning_tokens": 0}
    total_tokens: int = 0


class CompactResource(BaseModel):
    id: str
    object: Literal["response.compaction"] = "response.compaction"
    output: list[dict[str, Any]]
    created_at: int
    usage: CompactUsage


def compact(body: CompactRequest, settings: ServerSettings) -> CompactResource:
    """The conversation ``body`` gives, packed into one compaction item (see the module's docstring)."""
    debate_model(body.model, tuned=settings.tuned)
    refuse_unless(
        "previous_response_id",
        body.previous_response_id is None,
        "compaction packs the conversation it is given; send the whole conversation in input (a stored "
        "response's items: GET /v1/responses/{id}/input_items and its output)",
    )
    items = open_responses.expanded(state.as_items(body.input))  # each compaction item unpacked, once
    # Checked as /v1/responses checks it (an item it would refuse is refused here, by its place).
    split_input(ResponsesRequest(model=body.model, input=items))
    kept = [i for i in items if i.get("type") != "reasoning"]
    stamp = uuid.uuid4().hex
    return CompactResource(
        id=f"cmp_{stamp}",
        output=[open_responses.compaction_item(kept, f"cmp_item_{stamp}")],
        created_at=int(time.time()),
        usage=CompactUsage(),
    )


# ------------------------------------------------------------------------------------ WebSocket


class Turn(BaseModel):
    """A finished response of one connection: its id, and the items a continuation of it reads."""

    id: str
    items: list[dict[str, Any]]


def as_input(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as the input items that send them back (reasoning left out: it is
    never read as context)."""
    items: list[dict[str, Any]] = []
    for item in output:
        if item.get("type") == "message":
            text = "".join(p.get("text", "") for p in item.get("content", []) if isinstance(p, dict))
            items.append({"type": "message", "role": "assistant", "content": text})
        elif item.get("type") == "function_call":
            items.append({k: item[k] for k in ("type", "call_id", "name", "arguments") if k in item})
    return items


class ErrorEvent(Exception):
    """A WebSocket ``error`` event: the HTTP-style status and the error a request would get."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def event(self, secrets: list[str]) -> dict[str, Any]:
        kind = _KINDS.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")
        error = {
            "type": kind,
            "code": self.code or kind,
            "message": redact(self.message, secrets),
            "param": redact(self.param, secrets) if self.param is not None else None,
        }
        return {"type": "error", "status": self.status, "error": error}


def parse_create(data: str | bytes, limit: int, describe: Describe) -> ResponsesRequest:
    """A ``response.create`` message (a text frame, or a binary one holding UTF-8) as the request it
    is, or the error event that refuses it. Its JSON is read as an HTTP body is
    (:func:`~moot.server.bodies.read_json`: not UTF-8, too deep, a number out of range or a lone
    surrogate is refused by its field), before any model reads it."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if len(raw) > limit:
        raise ErrorEvent(413, f"the message is over this server's limit of {limit} bytes; send less", code="too_large")
    try:
        message = read_json(raw, "application/json")
    except RequestError as exc:
        said = exc.message.replace("the body", "the message", 1)
        raise ErrorEvent(exc.status, said, param=exc.param, code=exc.code) from None
    if message is NO_BODY:
        raise ErrorEvent(400, "the message is empty; send a response.create event (a JSON object)")
    if not isinstance(message, dict) or message.get("type") != "response.create":
        kind = message.get("type") if isinstance(message, dict) else None
        raise ErrorEvent(400, f"{kind!r} is not a client event; send response.create", param="type")
    for name in HTTP_ONLY:
        if name in message:
            raise ErrorEvent(
                400,
                f"{name}: a field of the HTTP transport only; leave it out (every response streams on the socket)",
                param=name,
            )
    body = {k: v for k, v in message.items() if k != "type"}
    try:
        return ResponsesRequest.model_validate(body)
    except ValidationError as exc:
        said, param = describe(exc)
        raise ErrorEvent(400, said, param=param) from None


def same_origin(headers: Headers) -> bool:
    """Whether a browser's ``Origin`` (when it sends one) is this server's own: a page of another
    origin may not open a debate socket (no CORS check stands in the way of a WebSocket)."""
    origin = headers.get("origin")
    if origin is None:
        return True
    host = origin.split("://", 1)[-1].rstrip("/")
    return host.lower() == headers.get("host", "").lower()


class Connection:
    """One WebSocket: its turns, one after another, and its cache of the last response."""

    def __init__(
        self,
        socket: WebSocket,
        settings: ServerSettings,
        describe: Describe,
        secrets: list[str],
        watchers: Watchers,
        ring: KeyRing | None = None,
    ) -> None:
        self.socket = socket
        self.watchers = watchers
        #: The store's keys: the key the socket was opened with is checked again at each message.
        self.ring = ring
        self.settings = settings
        self.describe = describe
        self.secrets = secrets
        self.last: Turn | None = None
        self.opened = time.monotonic()

    async def serve(self) -> None:
        # A socket that sends nothing is closed at its limit too (it was checked at each message
        # only: an idle one stayed open for good, a review found).
        closes_at = asyncio.get_running_loop().time() + CONNECTION_LIMIT_S
        while True:
            try:
                async with asyncio.timeout_at(closes_at):
                    received = await self.socket.receive()
            except TimeoutError:
                await self._over_limit()
                return
            if received["type"] == "websocket.disconnect":
                return
            text: str | bytes = received.get("text") or received.get("bytes") or b""
            if time.monotonic() - self.opened > CONNECTION_LIMIT_S:
                await self._over_limit()
                return
            try:
                try:
                    await self.turn(text)
                except StoreUnavailable:  # out of reach for now: as over HTTP, a 503 (the socket stays open)
                    raise ErrorEvent(503, StoreUnavailable.TOLD, code="store_unavailable") from None
            except ErrorEvent as refused:  # (a refused continuation evicted its response: Connection.turn)
                await self.socket.send_json(refused.event(self.secrets))
                if refused.status == 401:  # the key is gone: so is the connection
                    await self.socket.close(code=1008, reason="the API key was revoked")
                    return
            except WebSocketDisconnect:
                return

    async def _over_limit(self) -> None:
        """The connection's time is up: an error event that says so, and the socket closes."""
        limit = ErrorEvent(
            400,
            f"this connection is over its limit of {CONNECTION_LIMIT_S // 60:g} minutes; open a new one",
            code="websocket_connection_limit_reached",
        )
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):  # (gone meanwhile)
            await self.socket.send_json(limit.event(self.secrets))
            await self.socket.close(code=1000)

    def check_key(self) -> None:
        """The store's key the socket was opened with, checked again for each message as for each HTTP
        request: revoked since (a 401 event, and the socket closes), or over its rate (a 429 event)."""
        opened_with: ApiKey | None = self.socket.scope.get("moot.key")
        if opened_with is None or self.ring is None:
            return
        key = self.ring.by_id(opened_with.id)
        if key is None:
            raise ErrorEvent(
                401,
                "the API key this connection was opened with was revoked; open one with a valid key",
                code="invalid_api_key",
            )
        wait = self.ring.over_rate(key)
        if wait is not None:
            message, _ = rate_refusal(key, wait)
            raise ErrorEvent(429, message, code="key_rate")

    async def turn(self, text: str | bytes) -> None:
        self.check_key()  # (before the message is read, as an HTTP request's key before its body)
        req = parse_create(text, self.settings.max_body_bytes, self.describe)
        manager = self.socket.app.state.manager
        continued = req.previous_response_id
        stored = req.store is not False
        before: list[dict[str, Any]] = []
        if continued is not None:
            if self.last is not None and self.last.id == continued:
                before = self.last.items
            elif stored:  # not the connection's last: a response this server stored (as over HTTP)
                try:
                    before = state.chain(manager.store, continued, [])
                except RequestError as exc:
                    raise ErrorEvent(exc.status, exc.message, param=exc.param, code=exc.code) from None
            else:
                raise ErrorEvent(
                    400,
                    f"Previous response with id '{continued}' not found: with store false, this connection keeps "
                    "its last response only; send the whole conversation in input instead",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
        try:
            await self._run(req, before)
        except (ErrorEvent, StoreUnavailable):
            # The standard: a continuation that fails evicts the response it continued from the
            # connection's cache; continued from again with store false, it is not found.
            if continued is not None and self.last is not None and self.last.id == continued:
                self.last = None
            raise

    async def _run(self, req: ResponsesRequest, before: list[dict[str, Any]]) -> None:
        """One ``response.create`` message's debate, ``before`` its earlier items, its events sent."""
        manager = self.socket.app.state.manager
        continued = req.previous_response_id
        stored = req.store is not False
        new = state.as_items(req.input)
        try:
            whole = state.bounded(
                [*before, *new], len(before), self.settings.max_conversation_bytes, req.truncation != "disabled"
            )
        except RequestError as exc:
            raise ErrorEvent(exc.status, exc.message, param=exc.param, code=exc.code) from None
        earlier = len(whole) - len(new)  # (a refusal names input[i] of this message's input, as over HTTP)
        run = req.model_copy(update={"input": whole, "previous_response_id": None})
        # Stored as a response over HTTP is (store left out or true): GET /v1/responses/{id}, a chain.
        kept = state.Kept(previous_response_id=continued, input=whole) if stored else None
        record: dict[str, Any] = {}
        try:
            live, asked = await responses.begin(
                run, self.settings, manager, self.socket.headers, debated=run, earlier=earlier, record=record, kept=kept
            )
        except RequestError as exc:
            raise ErrorEvent(exc.status, exc.message, param=exc.param, code=exc.code) from None
        except QueueFull as exc:  # the queue, or the key's concurrency: named as over HTTP
            raise ErrorEvent(429, str(exc), code=exc.code) from None
        base = str(self.socket.base_url).replace("ws", "http", 1).rstrip("/")
        shown = run.model_copy(update={"previous_response_id": continued})
        shell = Shell(live, shown, base)
        stamp: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        if kept is not None:
            first = responses.keep_first(manager, live, kept, shell, record)
            self.watchers.watch(live, manager.store, responses.final_form(shell, asked), first, record)

            def stamp(data: dict[str, Any]) -> dict[str, Any]:
                return state.stamped(data, first)

        final: dict[str, Any] | None = None
        self.last = None  # a turn that fails leaves nothing to continue
        async for event in events(shell, asked, stamp):
            await self.socket.send_text(event.text())
            if event.kind in ("response.completed", "response.incomplete"):
                final = event.data["response"]
        if final is not None:
            self.last = Turn(id=final["id"], items=[*whole, *as_input(final["output"])])


def router(
    settings: ServerSettings,
    errors: dict[int | str, dict[str, Any]],
    describe: Describe,
    secrets: list[str],
    watchers: Watchers | None = None,
    ring: KeyRing | None = None,
) -> APIRouter:
    """The routes, for :func:`moot.server.create_app` (its error responses, its validation wording,
    the secrets its errors never show, the watchers that keep each stored response's final form, and
    the store's keys, which a socket's messages are checked against)."""
    api = api_router()
    watchers = watchers if watchers is not None else Watchers()

    @api.post("/v1/responses/compact", response_model=CompactResource, tags=["openai"], responses=errors)
    async def compact_conversation(request: Request, body: CompactRequest) -> Response:
        """The Open Responses standard's compaction, made without a model call: the conversation
        as one ``compaction`` item, which ``/v1/responses`` reads back as the same context."""
        packed = await submission.off_loop(lambda: compact(body, settings))  # its files read off the loop
        return JSONResponse(packed.model_dump(mode="json"))

    @api.websocket("/v1/responses")
    async def responses_socket(socket: WebSocket) -> None:
        """WebSocket mode: ``response.create`` messages, each answered by its response's events."""
        if not same_origin(socket.headers):
            await socket.close(code=1008, reason="a page of another origin may not open this socket")
            return
        await socket.accept()
        try:
            await Connection(socket, settings, describe, secrets, watchers, ring).serve()
        except Exception as exc:  # the socket closes with the reason; the server goes on
            log.error("internal error on the Responses WebSocket: %s: %s", type(exc).__name__, exc)
            with contextlib.suppress(Exception):  # (the client may be gone already)
                await socket.close(code=1011, reason="internal server error; the server's log has the details")

    return api
