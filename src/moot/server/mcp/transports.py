"""The MCP door's two transports: ``moot serve``'s ``/mcp`` (streamable HTTP) and ``moot mcp`` (stdio).

:class:`HttpMount` is the SDK's streamable-HTTP session manager over the app's own debate manager,
mounted as a route of the app; :func:`serve_stdio` serves one session over stdin and stdout with a
debate manager and store of its own, and answers every request it has read before the end of stdin
ends it. Each puts :mod:`~moot.server.mcp.malformed` in front of the SDK's parser.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any, Generic, Protocol, Self, TypeVar, cast

import anyio
import mcp_types as types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, AuthorizationContext, authorization_context
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.jsonrpc_dispatcher import cancelled_request_id_from_params
from mcp.shared.message import SessionMessage
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from moot.server.asgi import replayed
from moot.server.mcp.malformed import PASS, StdinLines, unreadable
from moot.server.mcp.server import MootMCP
from moot.server.settings import ServerSettings, is_loopback
from moot.server.state.keys import ApiKey
from moot.server.state.manager import DebateManager

#: The issuer of the principals :class:`HttpMount` gives the SDK for the store's API keys.
KEY_ISSUER = "moot:api-key"


class _Sessions(StreamableHTTPSessionManager):
    """The SDK's session manager, with a cap of sessions per API key of the store: the SDK's own cap
    (10,000) is for all clients together, so one key could hold every session open (half an hour
    each) and lock the others out."""

    def __init__(self, *args: Any, per_key: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.per_key = per_key

    def held_by(self, owner: AuthorizationContext) -> int:
        """The sessions open for ``owner`` (the SDK keeps each session's principal)."""
        return sum(1 for held in self._session_owners.values() if held == owner)

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        # (under the SDK's lock for new sessions: the cap holds for a burst too)
        if requestor is not None and requestor["issuer"] == KEY_ISSUER and self.held_by(requestor) >= self.per_key:
            return None
        return super()._admit_session(requestor)


def key_principal(key: ApiKey) -> AuthenticatedUser:
    """A key of the store as the SDK's authenticated user: the SDK binds each session to it (another
    key's requests get the session's 404), and :class:`_Sessions` counts by it. Its id only, never
    the key itself."""
    token = AccessToken(token=key.id, client_id=key.id, scopes=[], claims={"iss": KEY_ISSUER})
    return AuthenticatedUser(token)


class HttpMount:
    """``moot serve``'s ``/mcp``: the SDK's streamable-HTTP session manager over the server's own
    debate manager, behind the server's key like every /v1 route. ``running()`` is entered for the
    app's lifetime (its lifespan)."""

    PATH = "/mcp"

    def __init__(self, settings: ServerSettings, manager: Callable[[], DebateManager]) -> None:
        self.mcp = MootMCP(settings, manager)
        # The SDK's own guard against DNS rebinding when the server listens on loopback (as its
        # streamable_http_app does): the Host, and any Origin, must be a loopback one.
        security = None
        if is_loopback(settings.host):
            security = TransportSecuritySettings(
                enable_dns_rebinding_protection=True,
                allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost", "[::1]"],
                allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
            )
        self.sessions = _Sessions(
            app=self.mcp.server,
            security_settings=security,
            max_request_body_size=settings.max_body_bytes,
            per_key=settings.mcp_sessions_per_key,
        )
        self.app = StreamableHTTPASGIApp(self.sessions)
        #: A lock per key of the store, held while a request of that key may open a session.
        self._opening: dict[str, asyncio.Lock] = {}
        # An ASGI app (this object), not a function: Starlette would call a function with a request.
        self.route = Route(self.PATH, endpoint=self)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The SDK's endpoint, but a message its parser refuses without a useful reason (a lone
        surrogate: :func:`unreadable`) is answered here, and a key of the store at its cap of sessions
        is told so (429) before a new one is opened."""
        key = scope.get("moot.key")
        if isinstance(key, ApiKey):
            user = key_principal(key)
            scope["user"] = user
            if _opens_a_session(scope):
                # One opening at a time per key: the SDK admits a session during the request, so the
                # next opening of the key counts it (a burst gets 429s, not the SDK's 503).
                async with self._opening.setdefault(key.id, asyncio.Lock()):
                    held = self.sessions.held_by(authorization_context(user))
                    if held >= self.sessions.per_key:
                        await _too_many_sessions(key, held)(scope, receive, send)
                        return
                    await self._serve(scope, receive, send)
                return
        await self._serve(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST":
            chunks: list[bytes] = []
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client went away
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
            body = b"".join(chunks)
            version = dict(scope.get("headers") or []).get(b"mcp-protocol-version", b"").decode("latin-1") or None
            reply = unreadable(body, not_json=False, version=version)
            if reply != PASS:
                if reply is None:
                    await Response(status_code=202)(scope, receive, send)
                    return
                assert not isinstance(reply, str)
                status = 200 if isinstance(reply, types.JSONRPCResponse) else 400
                text = reply.model_dump_json(by_alias=True, exclude_unset=True)
                await Response(text, status_code=status, media_type="application/json")(scope, receive, send)
                return
            await self.app(scope, replayed(body, receive), send)
            return
        await self.app(scope, receive, send)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.sessions.run(), self.mcp.running():
            try:
                yield
            finally:
                self.mcp.stopping = True


def _opens_a_session(scope: Scope) -> bool:
    """Whether the SDK may open a session for this request: a POST without a session id, of a
    revision with sessions (2025-11-25 and before; a 2026-07-28 request names its revision and is
    stateless)."""
    if scope.get("method") != "POST":
        return False
    headers = dict(scope.get("headers", []))
    if b"mcp-session-id" in headers:
        return False
    version = headers.get(b"mcp-protocol-version")
    return version is None or version.decode("latin-1") in HANDSHAKE_PROTOCOL_VERSIONS


def _too_many_sessions(key: ApiKey, held: int) -> Response:
    """429 for a key at its cap of MCP sessions, as a JSON-RPC error (no id) saying what to do."""
    error = types.JSONRPCError(
        jsonrpc="2.0",
        id=None,
        error=types.ErrorData(
            code=types.INVALID_REQUEST,
            message=f"key {key.name!r} holds {held} open MCP sessions, the most one key may (moot serve "
            "--mcp-sessions-per-key): end one (DELETE /mcp with its Mcp-Session-Id), reuse one, or wait until one "
            "has been idle 30 minutes",
        ),
    )
    body = error.model_dump_json(by_alias=True, exclude_none=True)
    return Response(body, status_code=429, media_type="application/json", headers={"Retry-After": "60"})


class _Owed:
    """The requests of a stdio session handed to the SDK's server and not answered yet, by id as its
    dispatcher matches them ("7" and 7 are one id)."""

    def __init__(self) -> None:
        self._ids: Counter[types.RequestId] = Counter()
        self._none = asyncio.Event()
        self._none.set()

    def read(self, message: types.JSONRPCMessage) -> None:
        """A message the server is handed: a request is owed its reply until :meth:`answered`; one
        the client cancels (``notifications/cancelled``) no longer is (MCP: none is sent for it)."""
        if isinstance(message, types.JSONRPCRequest):
            self._ids[coerce_request_id(message.id)] += 1
            self._none.clear()
        elif isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled":
            cancelled = cancelled_request_id_from_params(message.params)
            if cancelled is not None:
                self.answered(cancelled)

    def answered(self, request_id: types.RequestId | None) -> None:
        key = coerce_request_id(request_id) if request_id is not None else None
        if key is None or self._ids[key] <= 0:
            return
        self._ids[key] -= 1
        if self._ids[key] == 0:
            del self._ids[key]
        if not self._ids:
            self._none.set()

    async def settled(self) -> None:
        """Once every request handed to the server has been answered (or cancelled by the client)."""
        await self._none.wait()


class _Closable(Protocol):
    async def aclose(self) -> None: ...


_Inner = TypeVar("_Inner", bound=_Closable)


class _Closing(Generic[_Inner]):
    """A wrapped stream (``_inner``): closing it, by ``aclose`` or at the end of ``async with``,
    closes the stream it wraps."""

    _inner: _Inner

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class _UntilAnswered(_Closing[ReadStream[SessionMessage | Exception]]):
    """The read stream ``moot mcp``'s SDK server serves, whose end (stdin closed) reaches the
    server only once every request it was handed has been answered.

    The SDK's dispatcher takes the end of its read stream for the client gone: it cancels each
    handler still running, and a reply being written then is lost (it prefers no answer to a second
    one), one not begun gets at best "Connection closed". Over stdio the end of stdin is the host's
    shutdown (MCP: close the server's stdin, then wait for it to exit), and the host reads stdout on:
    so at the end, ``on_end`` stops the debates first (each call waiting for one is answered with it,
    interrupted), then the requests read are all answered, then the server sees the end, with nothing
    left to cancel."""

    def __init__(
        self, inner: ReadStream[SessionMessage | Exception], owed: _Owed, on_end: Callable[[], Awaitable[None]]
    ) -> None:
        self._inner = inner
        self._owed = owed
        self._on_end: Callable[[], Awaitable[None]] | None = on_end

    @property
    def last_context(self) -> Any:
        """The sender's context of the last message, which the SDK's dispatcher runs its handler in."""
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            item = await self._inner.receive()
        except anyio.EndOfStream:
            on_end, self._on_end = self._on_end, None
            if on_end is not None:
                await on_end()
            await self._owed.settled()
            raise
        if isinstance(item, SessionMessage):
            self._owed.read(item.message)
        return item

    def __aiter__(self) -> _UntilAnswered:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None


class _Answering(_Closing[WriteStream[SessionMessage]]):
    """The write stream of ``moot mcp``'s SDK server: each reply written settles its request in
    :class:`_Owed`, once stdout's writer has it (it writes it before the process ends)."""

    def __init__(self, inner: WriteStream[SessionMessage], owed: _Owed) -> None:
        self._inner = inner
        self._owed = owed

    async def send(self, item: SessionMessage, /) -> None:
        await self._inner.send(item)
        if isinstance(item.message, types.JSONRPCResponse | types.JSONRPCError):
            self._owed.answered(item.message.id)


async def serve_stdio(settings: ServerSettings, secrets: list[str] | None = None) -> None:
    """``moot mcp``: one MCP session over stdin and stdout, its debates in ``settings.db`` (by
    default in memory, for the session). When the host closes stdin, the debates still running are
    stored as interrupted, every request read is answered (a call waiting for a debate, with it),
    and the session ends."""
    from mcp.server.stdio import stdio_server

    from moot.server.state.sqlite import SqliteStore as DebateStore

    store = DebateStore(settings.db, secrets or [])
    manager = DebateManager(settings, store)
    manager.recover()
    mcp = MootMCP(settings, lambda: manager)
    lines = StdinLines(settings.max_body_bytes)
    main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    signalled: list[int] = []
    stopping: list[asyncio.Task[None]] = []

    def stop_debates() -> asyncio.Task[None]:
        """The manager's shutdown, once (at the end of stdin, then on the way out; or on the way out only)."""
        if not stopping:
            stopping.append(loop.create_task(manager.shutdown()))
        return stopping[0]

    async def on_end() -> None:
        # The session ends by the host (stdin closed) or by a signal (Ctrl-C, SIGTERM): either way its
        # calls are cut by the server's stop, not by their caller, so a debate they wait for is left to
        # the manager's shutdown, which stores it as interrupted (not as cancelled by a request). At the
        # end of stdin that comes first: each call waiting for a debate then answers with it.
        mcp.stop()
        await asyncio.shield(stop_debates())  # (a signal meanwhile cuts the wait, not the shutdown)

    owed = _Owed()

    def on_signal(signum: int) -> None:
        if signalled:  # a second signal while the first one's stop runs: that stop goes on
            return
        signalled.append(signum)
        mcp.stop()
        if main is not None:
            main.cancel()

    # Until the debates are stored, a signal is this stop's; then each gets the handler it had back
    # (moot's own for SIGTERM, not the default that would kill the process), or after a stop by a
    # signal, SIGTERM is ignored while the process ends.
    watched: list[tuple[signal.Signals, Any]] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(signum)
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # (not the main thread)
            loop.add_signal_handler(signum, on_signal, signum)
            watched.append((signum, previous))
    try:
        async with stdio_server(stdin=cast(Any, lines)) as (read, write), mcp.running():
            lines.replies = write
            lines.ready.set()
            await mcp.server.run(
                _UntilAnswered(read, owed, on_end), _Answering(write, owed), mcp.server.create_initialization_options()
            )
    except asyncio.CancelledError:
        if not signalled:
            raise
    finally:
        try:
            await stop_debates()
            store.close()
        finally:
            for number, previous in watched:
                loop.remove_signal_handler(number)
                if number == signal.SIGTERM and signalled:
                    # The stop is done: a host's second SIGTERM, while Python exits, would kill the process
                    # by its signal instead of letting it end with 130 (Python resets the handlers it set)
                    signal.signal(number, signal.SIG_IGN)
                elif previous is not None:
                    signal.signal(number, previous)
    if signalled:  # as Ctrl-C ends every command: main() says "interrupted" and exits with 130
        raise KeyboardInterrupt
