"""The ASGI app: the JSON API under /v1, the OpenAI-compatible endpoint, and the viewer.

A thin layer over the engine: requests are checked (:mod:`moot.server.policy`), debates run in the
:class:`~moot.server.state.manager.DebateManager`, and the engine's own events are served as SSE.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib.util
import json
import logging
import math
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping, Sequence
from contextlib import asynccontextmanager
from importlib.resources import files
from typing import TYPE_CHECKING, Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from pydantic import ValidationError
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import cookie_parser
from starlette.routing import BaseRoute, Match, Mount

from moot._version import __version__
from moot.files import lone_surrogate
from moot.secrets import redact
from moot.server.asgi import replayed
from moot.server.http.connections import API_CSP, SECURITY_HEADERS
from moot.server.http.routes import (
    BODY_ERRORS,
    SESSION_COOKIE,
    Kit,
    ViewerSessions,
    catalogue_router,
    chat_router,
    debates_router,
    usage_router,
    viewer_router,
)
from moot.server.openai import chat, responses, responses_modes, responses_state
from moot.server.policy import RequestError
from moot.server.schemas import (
    ErrorBody,
    ErrorDetail,
)
from moot.server.settings import ServerSettings, is_loopback
from moot.server.state import Store, open_store
from moot.server.state.base import url_password
from moot.server.state.bus import open_bus
from moot.server.state.events import SSE_SEP
from moot.server.state.keyring import REQUEST_KEY, KeyRing
from moot.server.state.keys import ApiKey
from moot.server.state.manager import DebateManager, QueueFull

if TYPE_CHECKING:
    from moot.server.mcp import HttpMount

log = logging.getLogger("moot.server")

_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "moot", "moot.server", "fastapi")

Scope = MutableMapping[str, Any]
ASGIMessage = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[ASGIMessage]]
Send = Callable[[ASGIMessage], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class RedactingFilter(logging.Filter):
    """Keeps the server's key (and every known secret) out of log lines."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        # Each part on its own, so that formatters that read ``args`` (uvicorn's access log) still work.
        if isinstance(record.msg, str):
            record.msg = redact(record.msg, self.secrets)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a, self.secrets) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: redact(v, self.secrets) if isinstance(v, str) else v for k, v in record.args.items()}
        # A traceback is formatted once into exc_text, which formatters then reuse: redact that too
        # (an exception's message can quote a key).
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.secrets)
        if record.stack_info:
            record.stack_info = redact(record.stack_info, self.secrets)
        return True


def install_redaction(secrets: list[str]) -> None:
    """One redacting filter per logger the server writes to, holding every key seen so far."""
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        existing = next((f for f in logger.filters if isinstance(f, RedactingFilter)), None)
        if existing is None:
            logger.addFilter(RedactingFilter(list(secrets)))
        else:
            existing.secrets.extend(s for s in secrets if s not in existing.secrets)


#: The MCP endpoint (streamable HTTP), served when moot[mcp] is installed (moot.server.mcp).
MCP_PATH = "/mcp"

#: How deep a request body's JSON may nest (an inline protocol needs fewer than 10 levels).
MAX_JSON_DEPTH = 32
#: The longest integer a request body may write (int64 has 19 digits): longer is no count of anything.
MAX_INTEGER_DIGITS = 20


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _is_json(media: str) -> bool:
    # As FastAPI decides it: application/json, or application/<anything>+json.
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class _Unusable:
    """A number the body writes that no field can take: kept in place so that its field can be named."""

    def __init__(self, literal: str) -> None:
        self.literal = literal

    def problem(self) -> str:
        if self.literal in ("NaN", "Infinity", "-Infinity"):
            return f"{self.literal} is not a JSON number; give a number"
        digits = sum(c.isdigit() for c in self.literal)
        shown = self.literal if len(self.literal) <= 24 else f"a number of {digits} digits"
        return f"{shown} is out of range; give a smaller number"


def json_problem(body: bytes, content_type: str | None) -> RequestError | None:
    """Why a request body is not JSON this server can read (None: it is, or there is none): the wrong
    content type (415), not UTF-8, not strict JSON (``NaN`` included), nested too deep, a number out
    of any range, or a string holding a lone surrogate (400, naming the field). FastAPI's own parser
    turns several of these into one generic message or a 500 (a 5,000-digit integer, a lone
    surrogate in a question), so they are found here first, for every route alike."""
    if not body:
        return None
    media = _media_type(content_type or "")
    if not _is_json(media):
        given = f"{media!r} is not JSON" if media else "missing"
        return RequestError(
            f"Content-Type: {given}; send the body as a JSON object with the header 'Content-Type: application/json'",
            param="Content-Type",
            status=415,
            code="unsupported_media_type",
        )
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return RequestError(
            f"the body is not valid UTF-8 (byte {exc.start} is 0x{body[exc.start]:02x}); send JSON encoded as UTF-8",
            code="invalid_encoding",
        )
    unusable: list[_Unusable] = []

    def keep(literal: str) -> _Unusable:
        unusable.append(_Unusable(literal))
        return unusable[-1]

    def integer(literal: str) -> int | _Unusable:
        return int(literal) if len(literal) <= MAX_INTEGER_DIGITS + 1 else keep(literal)

    def number(literal: str) -> float | _Unusable:
        value = float(literal)
        return value if math.isfinite(value) else keep(literal)

    deep = RequestError(
        f"the body nests deeper than {MAX_JSON_DEPTH} levels of objects and lists; send a flatter body (see /docs)",
        code="too_deep",
    )
    try:
        data = json.loads(text, parse_int=integer, parse_float=number, parse_constant=keep)
    except json.JSONDecodeError as exc:
        return RequestError(
            f"the body is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); send a JSON object",
            code="invalid_json",
        )
    except RecursionError:
        return deep
    if isinstance(data, _Unusable):
        return RequestError(data.problem())
    # One walk over the containers, for their depth and the field of an unusable number.
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())] if isinstance(data, dict | list) else []
    while stack:
        value, path = stack.pop()
        if len(path) >= MAX_JSON_DEPTH:
            return deep
        children = value.items() if isinstance(value, dict) else enumerate(value)
        for key, child in children:
            if isinstance(child, dict | list):
                stack.append((child, (*path, key)))
            elif unusable and isinstance(child, _Unusable):
                where = ".".join(str(x) for x in (*path, key))
                return RequestError(f"{where}: {child.problem()}", param=where)
    # Half a UTF-16 pair ("\udfff") in any string or key, of any route: no UTF-8 text can hold it, so
    # the store's write of it would fail (and, sharing a moment with other debates, theirs with it).
    found = lone_surrogate(data)
    if found is not None:
        where, problem = found
        return RequestError(f"{where}: {problem}" if where else f"the body {problem}", param=where or None)
    return None


class BodyGuard:
    """Reads a request body before the app does, and refuses it with one message naming the fix when
    it is over ``limit`` bytes (413, by Content-Length or as it arrives), when it does not arrive
    within ``timeout_s`` (408: slowloris; the headers' own deadline is the connection's,
    :mod:`moot.server.http.connections`), or when it is not JSON this server can read (:func:`json_problem`)."""

    def __init__(self, app: ASGIApp, limit: int, timeout_s: float, secrets: list[str]) -> None:
        self.app = app
        self.limit = limit
        self.timeout_s = timeout_s
        self.secrets = secrets

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        length = headers.get("content-length")
        if scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)  # a body it sends is never read
            return
        if length is not None and length.isascii() and length.isdigit() and int(length) > self.limit:
            await self._refuse(scope, receive, send, self._too_large(), close=True)
            return
        # The body (with a Content-Length or chunked) is read here, up to the limit, then replayed.
        chunks: list[bytes] = []
        seen = 0
        try:
            async with asyncio.timeout(self.timeout_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        return  # the client went away
                    chunk = message.get("body", b"")
                    seen += len(chunk)
                    if seen > self.limit:
                        await self._refuse(scope, receive, send, self._too_large(), close=True)
                        return
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            late = RequestError(
                f"the request body did not arrive within {self.timeout_s:g} s ({seen} bytes came); send it at once",
                status=408,
                code="request_timeout",
            )
            await self._refuse(scope, receive, send, late, close=True)
            return
        body = b"".join(chunks)
        # An MCP message that is not JSON is the SDK's to refuse, as a JSON-RPC error.
        problem = None if scope.get("path") == MCP_PATH else json_problem(body, headers.get("content-type"))
        if problem is not None:
            await self._refuse(scope, receive, send, problem)
            return
        await self.app(scope, replayed(body, receive), send)

    def _too_large(self) -> RequestError:
        return RequestError(
            f"the request body is over this server's limit of {self.limit} bytes; send less "
            "(fewer or shorter context passages)",
            status=413,
            code="body_too_large",
        )

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, error: RequestError, close: bool = False
    ) -> None:
        # A body left unread: close the connection rather than read the rest of it.
        headers = {"Connection": "close"} if close else None
        response = error_response(
            error.status, error.message, param=error.param, code=error.code, headers=headers, secrets=self.secrets
        )
        await response(scope, receive, send)


def _public(scope: Scope) -> bool:
    """What needs no key: reading the viewer's pages, its static files and the OpenAPI pages, which
    hold no data. Everything else (every /v1 route, and any request that sends a body) needs it."""
    path: str = scope.get("path", "")
    return scope.get("method") in ("GET", "HEAD") and not _api(path)


def _api(path: str) -> bool:
    """The API's paths: /v1 and, with moot[mcp], the MCP endpoint /mcp."""
    return path in ("/v1", MCP_PATH) or path.startswith("/v1/")


class KeyCheck:
    """The API key, checked on the headers alone, before a byte of the body is read: an unauthenticated
    client cannot make the server buffer a body (outside :class:`BodyGuard`, which it wraps).

    A bearer is the server's own key (``--api-key-env``), or one of the store's keys (``moot serve
    keys``, looked up by its hash in :class:`KeyRing`'s short cache), or the viewer's session cookie.
    A store key's rate is counted here (429 with Retry-After), and the key is the request's
    (:data:`REQUEST_KEY`, and ``scope["moot.key"]``) for the routes below. A server with no key of
    its own on loopback is open until its store holds a key."""

    def __init__(self, app: ASGIApp, key: str | None, sessions: ViewerSessions, ring: KeyRing) -> None:
        self.app = app
        self.key = key.encode() if key else None
        self.sessions = sessions
        self.ring = ring
        self.secrets = [key] if key else []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or _public(scope):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        scheme, _, given = headers.get("authorization", "").strip().partition(" ")
        given = given.strip() if scheme.lower() == "bearer" else ""
        # A body left unread: the connection is closed after the refusal.
        closing = (
            {"Connection": "close"}
            if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
            else {}
        )
        refused = {"WWW-Authenticate": "Bearer", **closing}
        identity: ApiKey | None = None
        session: bool | None = False
        how = "server_key"
        wait: float | None = None
        try:
            authed = bool(given) and self.key is not None and hmac.compare_digest(given.encode(), self.key)
            if not authed and given:
                identity = self.ring.lookup(given)
                authed, how = identity is not None, "store_key"
            if not authed:
                how = "session"
                cookie = cookie_parser(headers.get("cookie", "")).get(SESSION_COOKIE)
                session, key_id = self.sessions.session(cookie) if cookie else (False, None)
                if session and key_id is not None:
                    identity = self.ring.by_id(key_id)
                    session = identity is not None  # its key was revoked since
                authed = bool(session)
                if not authed and not self.ring.required():
                    authed, how = True, "open"
            if authed and identity is not None:
                wait = self.ring.over_rate(identity)
        except Exception as exc:  # the store cannot be read: refuse, without the key's value
            log.error("the API keys could not be checked: %s", type(exc).__name__)
            message = "the server cannot check API keys now (its store is unreachable); retry shortly"
            busy = error_response(503, message, headers={**closing, "Retry-After": "5"}, secrets=self.secrets)
            await busy(scope, receive, send)
            return
        if identity is not None and wait is not None:
            retry = max(1, math.ceil(wait))
            message = (
                f"the API key {identity.name!r} has made {identity.rate_per_min} requests this minute, "
                f"its rate limit; retry after {retry} s"
            )
            headers_429 = {**closing, "Retry-After": str(retry)}
            limited = error_response(429, message, code="key_rate", kind="rate_limit_error", headers=headers_429)
            await limited(scope, receive, send)
            return
        if authed:
            scope["moot.key"] = identity
            scope["moot.auth"] = how
            token = REQUEST_KEY.set(identity)
            try:
                await self.app(scope, receive, send)
            finally:
                REQUEST_KEY.reset(token)
            return
        message = "missing or wrong API key: send the header 'Authorization: Bearer <key>'"
        if session is None:
            message = "the viewer's session has expired: give the key again (" + message + ")"
        await error_response(401, message, headers=refused, secrets=self.secrets)(scope, receive, send)


def host_name(header: str) -> str:
    """The name a ``Host`` header gives, lower-cased, without its port or a final dot
    (``Example.COM.:8000`` is ``example.com``; ``[::1]:80`` is ``[::1]``)."""
    host = header.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        name = host[: end + 1] if end != -1 else host
    else:
        name = host.rsplit(":", 1)[0] if ":" in host else host
    return name.rstrip(".")


class HostCheck:
    """Every request addressed to one of ``allowed`` (the ``Host`` header's name, any port; a
    ``*.example.com`` entry allows its subdomains), checked on the headers alone: a server on loopback
    answers to loopback names only, so a web page the operator visits cannot reach it through a name
    its attacker points at 127.0.0.1 (DNS rebinding). Anything else is a 400 naming the host and
    ``hint`` (how to allow it; ``{host}`` in it is the name refused). ``moot serve`` and ``moot view``
    both check here."""

    def __init__(self, app: ASGIApp, allowed: list[str], hint: str) -> None:
        self.app = app
        self.names = {a for a in allowed if not a.startswith("*.")}
        self.suffixes = tuple(a[1:] for a in allowed if a.startswith("*."))
        self.allowed = allowed
        self.hint = hint

    def allows(self, name: str) -> bool:
        return name in self.names or (bool(self.suffixes) and name.endswith(self.suffixes))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # (a WebSocket's handshake is checked too)
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        given = headers.get("host", "")
        if self.allows(host_name(given)):
            await self.app(scope, receive, send)
            return
        shown = repr(given) if given else "(none)"
        message = (
            f"Host {shown} is not a name this server answers to ({', '.join(self.allowed)}, any port), so that a "
            "web page cannot reach it through a name it controls (DNS rebinding); "
            + self.hint.format(host=host_name(given) or "NAME")
        )
        refused = None
        if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
            refused = {"Connection": "close"}  # its body is never read
        response = error_response(400, message, param="Host", code="host_not_allowed", headers=refused)
        await response(scope, receive, send)


#: The viewer: its own scripts and styles only, talking to this server only, never in a frame.
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
#: The OpenAPI pages (fastapi-offline's Swagger UI and ReDoc) start with inline scripts and styles.
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; worker-src 'self' blob:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)
_DOCS_PATHS = ("/docs", "/redoc", "/static-offline-docs/")


class SecurityHeaders:
    """Every response says: no framing (``frame-ancestors 'none'``, ``X-Frame-Options: DENY``), no MIME
    sniffing, no referrer; with a Content-Security-Policy per kind of path (the API's allows nothing)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        if path.startswith(_DOCS_PATHS):
            csp = DOCS_CSP.encode()
        elif _api(path):
            csp = API_CSP
        else:
            csp = PAGE_CSP.encode()

        async def sending(message: ASGIMessage) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS, (b"content-security-policy", csp)]
            await send(message)

        await self.app(scope, receive, sending)


#: A client's ``X-Request-Id`` echoed as it is: a token of these characters (no space, no control).
_REQUEST_ID = re.compile(r"[A-Za-z0-9._~:/+=@-]{1,128}")


def request_id(given: str | None) -> str:
    """The ``x-request-id`` of a response: the client's own, when it is a sane token, else a new one."""
    if given is not None and _REQUEST_ID.fullmatch(given):
        return given
    return f"req_{uuid.uuid4().hex}"


class RequestId:
    """Every response carries ``x-request-id`` (as OpenAI's API does): the client's ``X-Request-Id``
    echoed when it is a sane token, else one made here, so that a report of a failure names the
    request in the server's log and the client's alike."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id(Headers(scope=scope).get("x-request-id")).encode()

        async def sending(message: ASGIMessage) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                message["headers"] = [*kept, (b"x-request-id", rid)]
            await send(message)

        await self.app(scope, receive, sending)


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    kind: str | None = None,
    headers: Mapping[str, str] | None = None,
    secrets: list[str] | None = None,
) -> JSONResponse:
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    body = ErrorBody(error=ErrorDetail(message=redact(message, secrets or []), type=kind, param=param, code=code))
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


#: Names pydantic gives a union's branches in an error's location.
_BRANCH = re.compile(r"str|int|float|bool|list\[.*\]|dict\[.*\]|[A-Z][A-Za-z]+|function-.*")


def validation_message(exc: RequestValidationError | ValidationError) -> tuple[str, str | None]:
    first = exc.errors()[0]
    original = (first.get("ctx") or {}).get("error")
    if isinstance(original, RequestError):  # raised by a validator: it names its field itself
        return original.message, original.param
    raw_loc = list(first["loc"])
    if raw_loc and raw_loc[0] in ("body", "query", "header", "path", "cookie"):
        raw_loc = raw_loc[1:]
    # A union's branch is in the location ("protocol.str", "context.0.ContextChunk"): the field is
    # what the user wrote, so leave the branch names out.
    loc = [str(x) for x in raw_loc if not (isinstance(x, str) and _BRANCH.fullmatch(x))]
    where = ".".join(loc) or None
    kind = first["type"]
    msg = first["msg"]
    if kind == "missing" and where is None:
        return "the body is missing: send a JSON object (see /docs)", None
    if kind == "json_invalid":
        return f"the body is not valid JSON ({msg}); send a JSON object", None
    if kind == "extra_forbidden":
        return f"{where}: unknown field; remove it or check its spelling (see /docs)", where
    if kind == "missing":
        return f"{where}: required; add it", where
    if kind in ("model_attributes_type", "dict_type") and where is None:
        return "the body must be a JSON object; see /docs", None
    msg = msg.removeprefix("Value error, ")
    return (f"{where}: {msg}" if where else msg), where


#: What each error status of the API means (the OpenAPI schema lists those a route really sends).
_ERRORS: dict[int, str] = {
    400: "A field is wrong: the message names it (param) and the fix",
    401: "Missing or wrong API key (send 'Authorization: Bearer <key>')",
    404: "No such debate (or debate model)",
    408: "The request body did not arrive in time",
    409: "The debate is not in a state that allows this, or an Idempotency-Key was sent before with another body",
    413: "The body is over the server's --max-body",
    415: "The body is not sent as JSON (Content-Type: application/json)",
    429: "A limit is reached (code: queue_full, key_concurrency, key_rate): retry after Retry-After seconds",
    502: "The debate ended without a decision",
    503: "The server cannot use its model",
    504: "The debate's timeout expired",
}


def _declare_errors(schema: dict[str, Any], keyed: bool) -> None:
    """The schema as the server behaves: no 422 (every validation error is a 400 in the error shape),
    and with a key (the server's own, or keys in its store), the bearer scheme and a 401 on every /v1 route."""
    unauthorized = {
        "description": _ERRORS[401],
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
    }
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
            if keyed and (path == "/v1" or path.startswith("/v1/")):
                operation["security"] = [{"bearer": []}]
                operation.setdefault("responses", {}).setdefault("401", unauthorized)
    components = schema.setdefault("components", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.get("schemas", {}).pop(name, None)
    if keyed:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}


#: The methods a 405's ``Allow`` is worked out over: every method a route of this app serves.
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(routes: Sequence[BaseRoute], scope: Scope) -> list[str]:
    """Every method some route serves at the request's path, each route asked by its own matching.
    Starlette's 405 gives the methods of the first route whose path matched, so a path two routes
    serve (``GET`` and ``POST /v1/debates``) was said to allow only one. Mounts are left out: one
    answers its own 405."""
    allowed = []
    for method in _METHODS:
        probe = {**scope, "method": method, "fastapi": {}}  # the router's own bookkeeping, kept apart
        if any(not isinstance(r, Mount) and r.matches(probe)[0] is Match.FULL for r in routes):
            allowed.append(method)
    return allowed


def create_app(settings: ServerSettings, store: Store | None = None) -> FastAPI:
    """The app for these settings. The store is opened (unless given: ``moot serve`` opens it before
    it starts, to refuse a bad one in one line) and unfinished debates are marked interrupted when
    the app starts (its lifespan); debates still running at shutdown too, and as soon as the server
    begins a graceful stop, so that every open stream ends with the reason. The app closes the store."""
    key = settings.api_key.get_secret_value() if settings.api_key is not None else None
    secrets = [key] if key else []
    if settings.db_url is not None and (password := url_password(settings.db_url.get_secret_value())):
        secrets.append(password)  # the database's password: in no log line either
    if settings.redis_url is not None and (password := url_password(settings.redis_url.get_secret_value())):
        secrets.append(password)  # Redis's too
    # The viewer's sessions are signed with the server's key, or (keys in the store only) a random
    # secret of this process: a session opened on one replica is not known to another.
    sessions = ViewerSessions(key, settings.session_max_age_s)
    ring = KeyRing(settings.key_cache_s, required=key is not None or not is_loopback(settings.host))
    # Keep each stored response's final form when its debate ends: one a request queued here, or one
    # built again from its stored request (another replica's, or one queued before a restart).
    watchers = responses_state.Watchers()
    install_redaction(secrets)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        opened = store if store is not None else open_store(settings.store_target(), secrets)
        ring.bind(opened)
        bus = open_bus(
            settings.redis_url.get_secret_value() if settings.redis_url is not None else None,
            retention=settings.bus_retention,
            ttl_s=settings.bus_ttl_s,
            poll_s=settings.stream_poll_s,
            keep_finished=settings.finished_logs_in_memory,
        )
        manager = DebateManager(settings, opened, bus)
        await bus.start()
        # A chat completion or Responses debate another replica queued or left is built again here.
        manager.rebuilders["/v1/chat/completions"] = lambda i, r: chat.rebuild(i, r, settings)
        manager.rebuilders["/v1/responses"] = lambda i, r: responses.rebuild(i, r, settings, watchers, manager.store)
        interrupted = manager.recover()
        if interrupted:
            log.warning("%d debate(s) left unfinished by the last run are now marked interrupted", len(interrupted))
        manager.start()  # a shared store (PostgreSQL): its queue is polled, its stopped replicas' debates taken over
        draining: list[asyncio.Task[None]] = []

        def drain() -> None:
            """A graceful stop has begun: interrupt every debate now (not after the connections close),
            so that each open stream gets its debate's end, and why, before the server goes."""
            if not draining:
                log.info("stopping: the %d live debate(s) are stopped and their streams told why", len(manager.live))
                app.state.stopping = True
                draining.append(asyncio.ensure_future(manager.shutdown()))

        app.state.manager = manager
        app.state.store = opened
        app.state.drain = drain
        app.state.stopping = False
        try:
            async with mcp.running() if mcp is not None else contextlib.nullcontext():
                yield
        finally:
            await asyncio.gather(*draining, return_exceptions=True)
            await manager.shutdown()
            await bus.aclose()
            opened.close()

    # The OpenAPI page (/docs, /redoc) from files shipped in fastapi-offline, not from a CDN.
    app = FastAPIOffline(
        title="moot",
        version=__version__,
        description="Structured multi-agent LLM debate as a service: debates, their live events, and an "
        "OpenAI-compatible debate model.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    mcp = _mcp_mount(app, settings)
    # Outermost last: the headers on every response, then the Host (on the headers alone), then the key
    # (on the headers alone), then the body.
    app.add_middleware(BodyGuard, limit=settings.max_body_bytes, timeout_s=settings.request_timeout_s, secrets=secrets)
    app.add_middleware(KeyCheck, key=key, sessions=sessions, ring=ring)
    trusted = settings.trusted_hosts()
    if trusted is not None:
        hint = "to answer to that name too, start moot serve with --allowed-hosts {host}"
        app.add_middleware(HostCheck, allowed=trusted, hint=hint)
    app.add_middleware(SecurityHeaders)
    app.add_middleware(RequestId)

    def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
        """The error responses of a route, as the OpenAPI schema lists them (401 when keyed)."""
        keyed = (401,) if key is not None else ()
        return {code: {"model": ErrorBody, "description": _ERRORS[code]} for code in sorted({*codes, *keyed})}

    original_openapi = app.openapi
    declared_keyed: list[bool] = []

    def openapi() -> dict[str, Any]:
        # Made again once the server needs a key (a first key added to its store).
        keyed = key is not None or ring.required()
        if app.openapi_schema is None or declared_keyed != [keyed]:
            app.openapi_schema = None
            _declare_errors(original_openapi(), keyed=keyed)
            declared_keyed[:] = [keyed]
        assert app.openapi_schema is not None
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    # ------------------------------------------------------------------------------- errors

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return error_response(400, message, param=param, secrets=secrets)

    @app.exception_handler(RequestError)
    async def _refused(request: Request, exc: RequestError) -> JSONResponse:
        retry = None if exc.should_retry is None else {"x-should-retry": "true" if exc.should_retry else "false"}
        return error_response(exc.status, exc.message, param=exc.param, code=exc.code, headers=retry, secrets=secrets)

    @app.exception_handler(QueueFull)
    async def _full(request: Request, exc: QueueFull) -> JSONResponse:
        return error_response(
            429,
            str(exc),
            code=exc.code,
            kind="rate_limit_error",
            headers={"Retry-After": str(exc.retry_after)},
            secrets=secrets,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such path: {where}; the API is under /v1 (see /docs)"
        headers = exc.headers
        if exc.status_code == 405:
            message = f"{where} is not allowed; see /docs for the methods of each path"
            allowed = allowed_methods(request.app.router.routes, request.scope)
            if allowed:  # (a mount, the static files, answers its own 405 with its own Allow)
                headers = {**(headers or {}), "Allow": ", ".join(allowed)}
        return error_response(exc.status_code, message, headers=headers, secrets=secrets)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.error("internal error on %s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return error_response(500, "internal server error; the server's log has the details", secrets=secrets)

    # The key is checked by KeyCheck, on the headers, before any route (or the body) is reached.

    def sse(
        request: Request, content: AsyncIterator[Any], headers: Mapping[str, str] | None = None
    ) -> EventSourceResponse:
        """A stream that, when the server begins a graceful stop, starts the drain (every debate
        interrupted, so its stream ends with the reason) and gets ``shutdown_grace_s`` to send it."""
        stopping = anyio.Event()

        async def on_stop() -> None:
            await stopping.wait()
            request.app.state.drain()

        return EventSourceResponse(
            content,
            headers=headers,
            ping=settings.keepalive_s,
            sep=SSE_SEP,
            ping_message_factory=_keepalive,
            shutdown_event=stopping,
            shutdown_grace_period=settings.shutdown_grace_s,
            data_sender_callable=on_stop,
        )

    kit = Kit(settings=settings, sse=sse, errors=errors, sessions=sessions)
    for router in (debates_router(kit), catalogue_router(kit), chat_router(kit), usage_router(kit)):
        app.include_router(router)
    app.include_router(responses.router(settings, sse, errors(*BODY_ERRORS, 404, 409, 429, 502, 503, 504), watchers))
    app.include_router(
        responses_modes.router(settings, errors(*BODY_ERRORS, 404), validation_message, secrets, watchers)
    )
    app.include_router(viewer_router(kit))
    static = files("moot.server") / "static"
    app.mount("/static", StaticFiles(directory=str(static)), name="static")
    if mcp is not None:
        app.router.routes.append(mcp.route)
    return app


def _mcp_mount(app: FastAPI, settings: ServerSettings) -> HttpMount | None:
    """The MCP endpoint over this app's debate manager, when the ``mcp`` SDK is installed (moot[mcp])."""
    if importlib.util.find_spec("mcp") is None:
        return None
    from moot.server.mcp import HttpMount

    def manager() -> DebateManager:
        current: DebateManager = app.state.manager
        return current

    return HttpMount(settings, manager)


def _keepalive() -> ServerSentEvent:
    return ServerSentEvent(comment="keepalive", sep=SSE_SEP)
