"""The app's ASGI middleware, each checking a request on its headers before any route does, or
marking every response: the Host (:class:`HostCheck`), the API key (:class:`KeyCheck`), the body
(:class:`BodyGuard`), the headers on every response, the request's id among them
(:class:`ResponseHeaders`). ``create_app`` stacks them (:mod:`.app`)."""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.datastructures import Headers

from moot.server.asgi import DECODED_JSON, replayed
from moot.server.bodies import NO_BODY, read_json
from moot.server.http.connections import API_CSP, SECURITY_HEADERS
from moot.server.http.errors import error_response
from moot.server.http.redaction import REFUSED_HANDSHAKE
from moot.server.http.routes import ViewerSessions
from moot.server.policy import RequestError
from moot.server.state.keyring import REQUEST_KEY, KeyRing, rate_refusal
from moot.server.state.keys import ApiKey

log = logging.getLogger("moot.server")

Scope = MutableMapping[str, Any]
ASGIMessage = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[ASGIMessage]]
Send = Callable[[ASGIMessage], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The MCP endpoint (streamable HTTP), served when moot[mcp] is installed (moot.server.mcp).
MCP_PATH = "/mcp"


class BodyGuard:
    """Reads a request body before the app does, and refuses it with one message naming the fix when
    it is over ``limit`` bytes (413, by Content-Length or as it arrives), when it does not arrive
    within ``timeout_s`` (408: slowloris; the headers' own deadline is the connection's,
    :mod:`moot.server.http.connections`), or when it is not JSON this server can read
    (:func:`moot.server.bodies.read_json`)."""

    def __init__(self, app: ASGIApp, limit: int, timeout_s: float, secrets: list[str]) -> None:
        self.app = app
        self.limit = limit
        self.timeout_s = timeout_s
        self.secrets = secrets

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        # A NUL in the address (a debate's id, a query parameter): no store's text holds it (PostgreSQL
        # refused the lookup with a 500), so it is refused here, on any route, as in a body's text.
        if "\x00" in scope.get("path", "") or b"%00" in scope.get("query_string", b""):
            refused = RequestError("the address holds a NUL character (%00), which is not text; remove it")
            await self._refuse(scope, receive, send, refused, close=scope["type"] == "http")
            return
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
        if scope.get("path") != MCP_PATH:
            try:
                decoded = read_json(body, headers.get("content-type"))
            except RequestError as problem:
                await self._refuse(scope, receive, send, problem)
                return
            if decoded is not NO_BODY:
                scope[DECODED_JSON] = decoded  # the route reads it (moot.server.asgi.DecodedRoute)
        await self.app(scope, replayed(body, receive), send)

    def _too_large(self) -> RequestError:
        return RequestError(
            f"the request body is over this server's limit of {self.limit} bytes; send less "
            "(fewer or shorter context passages, smaller images or files sent inline)",
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


#: What the viewer's session token opens (the viewer's own requests): a token that leaked is not a model
#: to chat with, an MCP client or a WebSocket of the Responses API (no WebSocket is under these, so none
#: outlives a token's expiry: every request checks it).
VIEWER_ROUTES = ("/v1/debates", "/v1/protocols", "/v1/models", "/v1/usage", "/v1/session")


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
    keys``, looked up by its hash in :class:`KeyRing`'s short cache), or the viewer's session token.
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
        refused_session = False
        how = "server_key"
        wait: float | None = None
        try:
            authed = bool(given) and self.key is not None and hmac.compare_digest(given.encode(), self.key)
            if not authed and given:
                # The viewer's session token (POST /v1/session), valid or expired, else a store key.
                session, key_id = self.sessions.session(given)
                if session is not False and not scope.get("path", "").startswith(VIEWER_ROUTES):
                    # The viewer's token is for what the viewer does: not a model to chat with, not MCP.
                    session, refused_session = False, True
                elif session is not False:
                    how = "session"
                    if session and key_id is not None:
                        identity = self.ring.by_id(key_id)
                        session = identity is not None  # its key was revoked since
                    authed = bool(session)
                else:
                    identity = self.ring.lookup(given)
                    authed, how = identity is not None, "store_key"
            if not authed and not self.ring.required():
                authed, how = True, "open"
            if authed and identity is not None:
                wait = self.ring.over_rate(identity)
        except Exception as exc:  # the store cannot be read: refuse, without the key's value
            log.error("the API keys could not be checked: %s", type(exc).__name__)
            message = "the server cannot check API keys now (its store is unreachable); retry shortly"
            busy = error_response(
                503, message, code="store_unavailable", headers={**closing, "Retry-After": "5"}, secrets=self.secrets
            )
            await busy(scope, receive, send)
            return
        if identity is not None and wait is not None:
            message, retry = rate_refusal(identity, wait)
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
        elif refused_session:
            routes = ", ".join(VIEWER_ROUTES)
            message = f"a viewer's session token opens the viewer's own routes only ({routes}); send the API key"
        await error_response(401, message, headers=refused, secrets=self.secrets)(scope, receive, send)


def host_name(header: str) -> str:
    """The name a ``Host`` header gives, lower-cased, without its port or a final dot
    (``Example.COM.:8000`` is ``example.com``; ``[::1]:80`` is ``[::1]``)."""
    host = header.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        name, port = (host[: end + 1], host[end + 1 :]) if end != -1 else (host, "")
    else:
        name, port = (host.rsplit(":", 1)[0], host[host.rfind(":") :]) if ":" in host else (host, "")
    if port and not (port.startswith(":") and port[1:].isascii() and port[1:].isdigit()):
        return host  # not a name and a port ("[::1]evil", "localhost:80@evil"): allowed by no entry
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
        if len(headers.getlist("host")) == 1 and self.allows(host_name(given)):  # (two: RFC 9112's 400)
            await self.app(scope, receive, send)
            return
        shown = repr(given) if given else "(none)"
        if len(headers.getlist("host")) > 1:
            shown = " and ".join(repr(h) for h in headers.getlist("host")) + " (more than one)"
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


#: A client's ``X-Request-Id`` echoed as it is: a token of these characters (no space, no control).
_REQUEST_ID = re.compile(r"[A-Za-z0-9._~:/+=@-]{1,128}")


def request_id(given: str | None) -> str:
    """The ``x-request-id`` of a response: the client's own, when it is a sane token, else a new one."""
    if given is not None and _REQUEST_ID.fullmatch(given):
        return given
    return f"req_{uuid.uuid4().hex}"


def _noting_refusals(send: Send) -> Send:
    """``send`` of a WebSocket that notes a handshake refused with an HTTP response (a missing key's
    401): uvicorn then logs an ERROR that the handshake was never completed, which it was not, on
    purpose (:data:`~moot.server.http.redaction.REFUSED_HANDSHAKE` keeps that line out)."""

    async def sending(message: ASGIMessage) -> None:
        if message["type"] == "websocket.http.response.start":
            REFUSED_HANDSHAKE.set(True)
        await send(message)

    return sending


class ResponseHeaders:
    """The headers on every response, in one layer (each layer wraps every message a stream sends):

    - no framing (``frame-ancestors 'none'``, ``X-Frame-Options: DENY``), no MIME sniffing, no
      referrer; a Content-Security-Policy per kind of path (the API's allows nothing);
    - with ``request_ids``, ``x-request-id`` (as OpenAI's API does): the client's ``X-Request-Id``
      echoed when it is a sane token, else one made here, so that a report of a failure names the
      request in the server's log and the client's alike."""

    def __init__(self, app: ASGIApp, request_ids: bool = False) -> None:
        self.app = app
        self.request_ids = request_ids

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self.app(scope, receive, _noting_refusals(send))
            return
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
        added = [*SECURITY_HEADERS, (b"content-security-policy", csp)]
        if self.request_ids:
            added.append((b"x-request-id", request_id(Headers(scope=scope).get("x-request-id")).encode()))

        async def sending(message: ASGIMessage) -> None:
            if message["type"] == "http.response.start":
                headers = message.get("headers", [])
                if self.request_ids:
                    headers = [(k, v) for k, v in headers if k.lower() != b"x-request-id"]
                message["headers"] = [*headers, *added]
            await send(message)

        await self.app(scope, receive, sending)
