"""``moot serve``'s ``/mcp``, loaded by its first request.

The MCP SDK and moot's MCP server (:mod:`moot.server.mcp`) take about 0.8 s of CPU to import, as much
as the rest of the server: a server whose clients never use MCP (most of them, and every replica of
a test) should not pay it at every start. The endpoint is a route from the start; its first request
has the SDK imported (in a thread: the event loop goes on serving) and the SDK's session manager
started, and waits for both; the next ones go straight to it.

The SDK's session manager keeps task groups open for the server's lifetime, and they must be left by
the task that entered them: a task of the app's lifespan (:meth:`LazyMcpMount.running`) holds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from moot.server.http.errors import error_response
from moot.server.http.middleware import MCP_PATH
from moot.server.settings import ServerSettings
from moot.server.state.manager import DebateManager

if TYPE_CHECKING:
    from moot.server.mcp import HttpMount

log = logging.getLogger("moot.server")


class LazyMcpMount:
    """The ``/mcp`` route; :class:`moot.server.mcp.HttpMount` made and started by its first request."""

    PATH = MCP_PATH

    def __init__(self, settings: ServerSettings, manager: Callable[[], DebateManager]) -> None:
        self._settings = settings
        self._manager = manager
        self._wanted = asyncio.Event()  # a request came (or the server stops)
        self._ready = asyncio.Event()  # the mount is serving, or will not be
        self._mount: HttpMount | None = None
        self._failure = ""
        # An ASGI app (this object), not a function: Starlette would call a function with a request.
        self.route = Route(self.PATH, endpoint=self)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """For the app's lifetime (its lifespan): the task that will hold the SDK's session manager.
        Each lifespan starts afresh (the SDK's session manager runs once per instance: a mount of an
        earlier lifespan, as a test client's, is not used again)."""
        self._wanted, self._ready = asyncio.Event(), asyncio.Event()
        self._mount, self._failure = None, ""
        stopping = asyncio.Event()
        holder = asyncio.create_task(self._hold(stopping), name="moot-mcp")
        try:
            yield
        finally:
            stopping.set()
            self._wanted.set()
            await holder

    async def _hold(self, stopping: asyncio.Event) -> None:
        try:
            while True:
                await self._wanted.wait()
                if stopping.is_set():
                    return
                try:
                    module = await asyncio.to_thread(importlib.import_module, "moot.server.mcp")
                    mount: HttpMount = module.HttpMount(self._settings, self._manager)
                except Exception as exc:  # the requests waiting are told why; the next one tries again
                    log.exception("the MCP endpoint could not start")
                    self._failure = f"the MCP endpoint could not start: {type(exc).__name__}: {exc}"
                    failed, self._ready = self._ready, asyncio.Event()
                    self._wanted.clear()
                    failed.set()
                    continue
                async with mount.running():
                    self._mount = mount
                    self._ready.set()
                    await stopping.wait()
                return
        finally:
            self._ready.set()  # a request still waiting is answered (503) rather than left hanging

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        mount = self._mount
        if mount is None:
            ready = self._ready
            self._wanted.set()
            await ready.wait()
            mount = self._mount
        if mount is None:
            reason = self._failure or "the server is stopping: the MCP endpoint is closed"
            await error_response(503, reason, code="mcp_unavailable")(scope, receive, send)
            return
        await mount(scope, receive, send)
