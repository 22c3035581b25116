"""The MCP door's two transports: ``moot serve``'s ``/mcp`` (streamable HTTP) and ``moot mcp`` (stdio).

:class:`HttpMount` is the SDK's streamable-HTTP session manager over the app's own debate manager,
mounted as a route of the app; :func:`serve_stdio` serves one session over stdin and stdout with a
debate manager and store of its own. Each puts :mod:`~moot.server.mcp.malformed` in front of the
SDK's parser.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import mcp_types as types
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from moot.server.asgi import replayed
from moot.server.mcp.malformed import PASS, StdinLines, unreadable
from moot.server.mcp.server import MootMCP
from moot.server.settings import ServerSettings, is_loopback
from moot.server.state.manager import DebateManager


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
        self.sessions = StreamableHTTPSessionManager(
            app=self.mcp.server, security_settings=security, max_request_body_size=settings.max_body_bytes
        )
        self.app = StreamableHTTPASGIApp(self.sessions)
        # An ASGI app (this object), not a function: Starlette would call a function with a request.
        self.route = Route(self.PATH, endpoint=self)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The SDK's endpoint, but a message its parser refuses without a useful reason (a lone
        surrogate: :func:`unreadable`) is answered here."""
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
            reply = unreadable(body, not_json=False)
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


async def serve_stdio(settings: ServerSettings, secrets: list[str] | None = None) -> None:
    """``moot mcp``: one MCP session over stdin and stdout, its debates in ``settings.db`` (by
    default in memory, for the session); those still running when the client goes are stored as
    interrupted."""
    from mcp.server.stdio import stdio_server

    from moot.server.state.sqlite import SqliteStore as DebateStore

    store = DebateStore(settings.db, secrets or [])
    manager = DebateManager(settings, store)
    manager.recover()
    mcp = MootMCP(settings, lambda: manager)
    lines = StdinLines(settings.max_body_bytes)
    try:
        async with stdio_server(stdin=cast(Any, lines)) as (read, write), mcp.running():
            lines.replies = write
            lines.ready.set()
            await mcp.server.run(read, write, mcp.server.create_initialization_options())
    finally:
        await manager.shutdown()
        store.close()
