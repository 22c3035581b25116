"""The routes of ``moot serve``, in routers the app includes (:func:`moot.server.http.app.create_app` keeps
the middleware, the error handlers and the lifespan): the debates API, the catalogue, the chat
endpoint and the viewer's pages. (The Responses API's router is :mod:`moot.server.openai.responses`.)"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from importlib.resources import files
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from moot.core.types import DebateResult
from moot.protocols import get_preset, preset_names
from moot.server.asgi import api_router
from moot.server.http.streams import EventStream
from moot.server.openai import chat, fields
from moot.server.openai.chat_wire import ChatCompletion, ChatCompletionRequest
from moot.server.policy import RequestError, prepare
from moot.server.schemas import (
    DebateCreated,
    DebateInfo,
    DebatePage,
    DebateRequest,
    DebateSummary,
    ErrorBody,
    ErrorDetail,
    Links,
    ModelCard,
    ModelList,
    ProtocolInfo,
    ProtocolList,
    ServerStatus,
    ViewerSession,
)
from moot.server.settings import ServerSettings
from moot.server.state import StoredDebate, idempotency
from moot.server.state.events import encode
from moot.server.state.keyring import UsageReport, usage_report
from moot.server.state.keys import KEY_ID, ApiKey
from moot.server.state.manager import DebateManager, LiveDebate

#: What a POST may be refused for before its route sees it (the app's BodyGuard).
BODY_ERRORS = (400, 408, 413, 415)
#: The largest id, cursor or count a request may give (SQLite's integer).
MAX_ID = 2**63 - 1


class ViewerSessions:
    """The viewer's session token: an expiry and an HMAC of it under the server's key (never the key),
    so that a token stops working when it expires. The viewer keeps it in the tab's
    ``sessionStorage`` (its origin's: this server's port alone) and sends it as its bearer; a cookie
    would reach every other service on the same host name, whatever its port. A session opened with
    one of the store's keys carries that key's id too (``EXPIRES.KEY_ID.MAC``): it ends when the key
    is revoked, and its requests are that key's. Without a key of the server's own, the HMAC's key is
    a random one of this process."""

    def __init__(self, key: str | None, max_age_s: int) -> None:
        self.key = key.encode() if key else secrets.token_bytes(32)
        self.max_age_s = max_age_s

    def _mac(self, expires: int, key_id: str | None = None) -> str:
        text = f"moot-viewer-session:{expires}" + (f":{key_id}" if key_id is not None else "")
        return hmac.new(self.key, text.encode(), hashlib.sha256).hexdigest()

    def issue(self, key_id: str | None = None) -> str:
        expires = int(time.time()) + self.max_age_s
        if key_id is not None:
            return f"{expires}.{key_id}.{self._mac(expires, key_id)}"
        return f"{expires}.{self._mac(expires)}"

    def check(self, token: str) -> bool | None:
        """True: a valid session; None: one that has expired; False: not one of this server's."""
        return self.session(token)[0]

    def session(self, token: str) -> tuple[bool | None, str | None]:
        """As :meth:`check`, with the id of the store's key the session was opened with (None: the
        server's own key)."""
        parts = token.split(".")
        if len(parts) == 2:
            (expires, mac), key_id = parts, None
        elif len(parts) == 3 and KEY_ID.fullmatch(parts[1]):
            expires, key_id, mac = parts
        else:
            return False, None
        if not (expires.isascii() and expires.isdigit() and len(expires) <= 12):
            return False, None
        if not hmac.compare_digest(mac.encode(), self._mac(int(expires), key_id).encode()):
            return False, None
        return (int(expires) > time.time() or None), key_id


@dataclass
class Kit:
    """What every router takes from the app: its kit.settings, its stream helper (graceful stops), the
    error responses of a route as the OpenAPI schema lists them, and the viewer's sessions."""

    settings: ServerSettings
    sse: Callable[[Request, AsyncIterator[bytes], Mapping[str, str] | None], EventStream]
    errors: Callable[..., dict[int | str, dict[str, Any]]]
    sessions: ViewerSessions | None


def _count(value: str, name: str, hint: str) -> int:
    """A count from a query or a header: ASCII digits within SQLite's integer, else a 400 naming it
    (``str.isdigit`` accepts ``²``, and ``int`` refuses 5,000 digits only by raising)."""
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 19 or int(text) > MAX_ID:
        raise RequestError(f"{name}: {hint}", param=name)
    return int(text)


def _stopping_event(debate_id: str, shared: bool) -> bytes:
    """Why a stream ends without its debate's end: the server stops, and the debate runs later
    (a single server: at its next start) or goes on elsewhere (replicas: another takes it)."""
    message = (
        f"the server is stopping: debate {debate_id} goes on at another replica (its finished turns kept, if "
        "any); reconnect with Last-Event-ID (through the balancer) to follow it, nothing is lost"
        if shared
        else f"the server is stopping before debate {debate_id} started; it stays queued and runs when the server "
        "starts again: reconnect then (with Last-Event-ID, nothing is lost)"
    )
    body = ErrorBody(error=ErrorDetail(message=message, type="server_stopping", code="server_stopping"))
    return f"event: error\ndata: {body.model_dump_json()}\n\n".encode()


def manager_of(request: Request) -> DebateManager:
    manager: DebateManager = request.app.state.manager
    return manager


def links(debate_id: str) -> Links:
    return Links(
        self=f"/v1/debates/{debate_id}",
        events=f"/v1/debates/{debate_id}/events",
        result=f"/v1/debates/{debate_id}/result",
        viewer=f"/debates/{debate_id}",
    )


def summary(row: StoredDebate) -> DebateSummary:
    return DebateSummary(**row.shown(), links=links(row.id))


def stored_or_404(request: Request, debate_id: str, *, with_result: bool = True) -> StoredDebate:
    row = manager_of(request).store.get(debate_id, with_result=with_result)
    if row is None:
        raise RequestError(
            f"no debate {debate_id!r} on this server; list them with GET /v1/debates",
            status=404,
            code="not_found",
            param="id",
        )
    return row


def debates_router(kit: Kit) -> APIRouter:
    """``/v1/debates``: start, list, read, download, cancel, and the live events."""
    api = api_router()

    @api.post(
        "/v1/debates",
        status_code=202,
        response_model=DebateCreated,
        tags=["debates"],
        responses=kit.errors(*BODY_ERRORS, 429, 503),
    )
    async def create_debate(request: Request, body: DebateRequest) -> JSONResponse:
        """Start a debate in the background; 202 with its id at once (429 with Retry-After when the queue is full).
        With an ``Idempotency-Key`` header, the same key (from the same caller) answers with the same
        debate, its current status, on any replica; the same key with another body is a 409."""
        idem = idempotency.of_request(request.headers, "/v1/debates", body)
        prepared = prepare(
            body.protocol, body.question, body.chunks(), body, kit.settings, reference=body.reference,
            images=body.images,
        )  # fmt: skip
        manager = manager_of(request)

        def create(recorded: dict[str, Any]) -> LiveDebate:
            debate_id = idem.debate_id if idem is not None else None
            return manager.submit_request(
                prepared, body, recorded=recorded, headers=request.headers, debate_id=debate_id
            )

        if idem is None:
            live = create({})
            debate_id, status = live.id, live.status
        else:
            debate_id, status = idempotency.create_once(manager, idem, create)
        created = DebateCreated(id=debate_id, status=status, links=links(debate_id))
        return JSONResponse(created.model_dump(mode="json"), status_code=202, headers={"Location": created.links.self})

    @api.get("/v1/debates", response_model=DebatePage, tags=["debates"], responses=kit.errors(400))
    async def list_debates(
        request: Request,
        status: ServerStatus | None = None,
        limit: Annotated[int, Query(ge=1, le=200)] = 50,
        cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
    ) -> DebatePage:
        """A page of debates, newest first; pass ``next_cursor`` back as ``cursor`` for the next one."""
        before = None
        if cursor is not None:
            before = _count(cursor, "cursor", "give the next_cursor of a previous page (a number)")
        rows = manager_of(request).store.page(status=status, limit=limit + 1, before=before)
        more = len(rows) > limit
        rows = rows[:limit]
        return DebatePage(
            debates=[summary(r) for r in rows],
            next_cursor=str(rows[-1].seq) if more else None,
        )

    @api.get("/v1/debates/{debate_id}", response_model=DebateInfo, tags=["debates"], responses=kit.errors(404))
    async def get_debate(request: Request, debate_id: str) -> DebateInfo:
        """Status and the result in its versioned JSON form (partial while it runs)."""
        row = stored_or_404(request, debate_id)
        return DebateInfo(**row.shown(), links=links(row.id), result=row.result)

    @api.get(
        "/v1/debates/{debate_id}/result", response_model=DebateResult, tags=["debates"], responses=kit.errors(404, 409)
    )
    async def download_result(request: Request, debate_id: str) -> Response:
        """The transcript alone (``moot.debate/1``, readable by ``moot.load_result``), as a download."""
        row = stored_or_404(request, debate_id)
        if row.result is None:
            raise RequestError(
                f"debate {debate_id} has no transcript yet (it is {row.status})", status=409, code="no_result"
            )
        return Response(
            row.result.to_json(),
            media_type="application/json",
            headers={"Content-Disposition": f'attachment; filename="moot-{debate_id}.json"'},
        )

    @api.post(
        "/v1/debates/{debate_id}/cancel",
        response_model=DebateInfo,
        tags=["debates"],
        responses={
            202: {"model": DebateInfo, "description": "Asked to stop; it runs on another replica and has not yet"},
            **kit.errors(*BODY_ERRORS, 404, 409),
        },
    )
    async def cancel_debate(request: Request, debate_id: str) -> Response:
        """Stop a queued or running debate, on whichever replica runs it; it keeps its partial
        transcript. 200 once it has stopped; 202 if it runs on another replica and has not stopped
        within ``cancel_wait_s`` (it will: poll GET /v1/debates/{id}); 409 if it already ended."""
        row = stored_or_404(request, debate_id)
        stopped = await manager_of(request).cancel_anywhere(debate_id)
        if stopped is False:
            now_row = manager_of(request).store.get(debate_id, with_result=False) or row
            raise RequestError(
                f"debate {debate_id} already ended ({now_row.status}); nothing to cancel",
                status=409,
                code="already_finished",
            )
        info = await get_debate(request, debate_id)
        if stopped is None:
            return JSONResponse(info.model_dump(mode="json"), status_code=202)
        return JSONResponse(info.model_dump(mode="json"))

    @api.get(
        "/v1/debates/{debate_id}/events",
        tags=["debates"],
        responses={200: {"content": {"text/event-stream": {}}}, **kit.errors(400, 404)},
    )
    async def debate_events(
        request: Request,
        debate_id: str,
        last_event_id: Annotated[str | None, Header()] = None,
        after: Annotated[int | None, Query(ge=0, le=MAX_ID, description="Same as Last-Event-ID")] = None,
    ) -> EventStream:
        """The engine's events as Server-Sent Events (debate_started, turn_started, token, turn_retry,
        turn_done, round_done, debate_done), each with its id: reconnect with ``Last-Event-ID`` to
        resume without a gap; a late client first gets everything that already happened."""
        manager = manager_of(request)
        local = manager.log_of(debate_id, from_store=False)
        if local is None or local.closed:
            # 404 if it is nowhere (a finished debate's log kept here is no proof: another replica may
            # have deleted it since); else it runs elsewhere, or has ended.
            stored_or_404(request, debate_id, with_result=False)
        start = after or 0
        if last_event_id is not None and last_event_id.strip():  # empty: the client has nothing yet
            start = _count(last_event_id, "Last-Event-ID", "give the id of the last event received (a number)")

        async def events() -> AsyncIterator[bytes]:
            # Wherever it runs: this replica's log, the bus (another replica's), or the store.
            async for batch in manager.follow(debate_id, start):
                yield encode(batch)
            # A debate still queued when the server stops is kept to run at its next start, and with
            # replicas one handed back goes on at another: its log here ends with no debate_done, so
            # the stream says why it ends (no id: a resume is unchanged).
            if request.app.state.stopping:
                store = manager_of(request).store
                row = store.get(debate_id, with_result=False)
                if row is not None and (row.status == "queued" or (store.shared and row.status == "running")):
                    yield _stopping_event(debate_id, store.shared)

        return kit.sse(request, events(), None)

    return api


def catalogue_router(kit: Kit) -> APIRouter:
    """``/v1/protocols`` and ``/v1/models``."""
    api = api_router()

    @api.get("/v1/protocols", response_model=ProtocolList, tags=["catalogue"], responses=kit.errors())
    async def protocols() -> ProtocolList:
        """The protocol presets, with their planned model calls."""
        out = []
        for name in preset_names():
            spec = get_preset(name)
            out.append(
                ProtocolInfo(
                    name=name,
                    description=spec.description,
                    calls=spec.planned_calls(),
                    rounds=spec.rounds,
                    participants=[p.persona.name for p in spec.participants],
                    decision=spec.decision.kind,
                )
            )
        return ProtocolList(protocols=out)

    @api.get("/v1/models", response_model=ModelList, tags=["catalogue", "openai"], responses=kit.errors())
    async def models() -> ModelList:
        """Every ``moot/<protocol>`` debate model (the OpenAI list shape) with what it accepts, the
        applications' protocols apart, and the backends debates run on."""
        cards, apps = chat.model_cards(kit.settings.tuned)
        return ModelList(
            data=cards, applications=apps, backends=kit.settings.models, default_backend=kit.settings.default_model
        )

    @api.get(
        "/v1/models/{model_id:path}", response_model=ModelCard, tags=["catalogue", "openai"], responses=kit.errors(404)
    )
    async def model(model_id: str) -> ModelCard:
        """One debate model (the openai SDK's ``models.retrieve``): what it accepts, its calls a request."""
        return fields.model_card(model_id, kit.settings.tuned)

    return api


def chat_router(kit: Kit) -> APIRouter:
    """``/v1/chat/completions``: a debate as one chat model."""
    api = api_router()

    @api.post(
        "/v1/chat/completions",
        response_model=ChatCompletion,
        tags=["openai"],
        responses=kit.errors(*BODY_ERRORS, 404, 409, 429, 502, 503, 504),
    )
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        """A debate as one chat model: ``model`` is ``moot/<protocol>``; streamed with ``stream: true``."""
        manager = manager_of(request)
        live, asked = await chat.start(body, manager, kit.settings, headers=request.headers)
        base = str(request.base_url).rstrip("/")
        if body.stream:
            return kit.sse(request, chat.stream(live, body, base, asked), {"x-moot-debate-id": live.id})
        await live.ended()
        failed = chat.failure(live, asked)
        if failed is not None:
            raise failed
        return JSONResponse(
            chat.completion(live, body, base, asked).model_dump(mode="json"),
            headers=fields.cost_headers(live),
        )

    return api


def viewer_router(kit: Kit) -> APIRouter:
    """The viewer: its session (the key traded for a token), its pages and static files."""
    api = api_router()

    @api.post("/v1/session", tags=["viewer"], responses=kit.errors(*BODY_ERRORS))
    async def open_session(request: Request) -> ViewerSession:
        """For the viewer: trade the bearer key for a session token, which it sends as its bearer
        (``Authorization: Bearer TOKEN``) until it expires after ``session_max_age_s`` (the viewer
        then asks for the key again). Not a cookie: a cookie reaches every service of the same host
        name, whatever its port, where the viewer's ``sessionStorage`` is this origin's alone."""
        if request.scope.get("moot.auth") == "session":
            # (a token renewed itself, so a session never ended without the key)
            raise RequestError(
                "a session is not renewed by its token; send the key (Authorization: Bearer KEY) to open another",
                status=401,
                code="key_required",
            )
        # Only for a request that gave a key (a token issued while the server was open would
        # outlive the first key added to its store).
        key: ApiKey | None = request.scope.get("moot.key")
        if kit.sessions is None or request.scope.get("moot.auth") not in ("server_key", "store_key"):
            return ViewerSession(token=None, expires_in=0)
        token = kit.sessions.issue(key.id if key is not None else None)
        return ViewerSession(token=token, expires_in=kit.sessions.max_age_s)

    static = files("moot.server") / "static"

    # The pages answer HEAD too (a health check's or a link checker's), as the static files do.
    @api.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(str(static / "index.html"))

    @api.api_route("/debates/{debate_id}", methods=["GET", "HEAD"], include_in_schema=False)
    async def debate_page(debate_id: str) -> FileResponse:
        return FileResponse(str(static / "debate.html"))

    return api


def usage_router(kit: Kit) -> APIRouter:
    """``/v1/usage``: what the calling API key has used, for the whole deployment."""
    api = api_router()

    @api.get("/v1/usage", response_model=UsageReport, tags=["usage"], responses=kit.errors(404))
    async def usage(request: Request) -> UsageReport:
        """The calling key's own usage (its finished debates, their model calls, tokens and US dollars)
        and limits: only a key of the store has one (``moot serve keys add``); another key's is never shown."""
        key: ApiKey | None = request.scope.get("moot.key")
        fresh = manager_of(request).store.key(key.id) if key is not None else None
        if fresh is None:
            raise RequestError(
                "usage is kept per API key of the store (moot serve keys add); this request's key is not one: "
                "send 'Authorization: Bearer <a key moot serve keys add printed>'",
                status=404,
                code="no_key_usage",
            )
        return usage_report(fresh)

    return api
