"""The ASGI app: the JSON API under /v1, the OpenAI-compatible endpoint, and the viewer.

A thin layer over the engine: requests are checked (:mod:`moot.server.policy`), debates run in the
:class:`~moot.server.state.manager.DebateManager`, and the engine's own events are served as SSE.
:func:`create_app` puts it together: the store, the bus and the manager in its lifespan, the
middleware (:mod:`.middleware`), the error handlers (:mod:`.errors`), the OpenAPI schema
(:mod:`.openapi`), the routers (:mod:`.routes`, the OpenAI door's) and the MCP mount.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.resources import files

from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline

from moot._version import __version__
from moot.server.http.errors import add_error_handlers, error_response, validation_message
from moot.server.http.mcp_mount import LazyMcpMount
from moot.server.http.middleware import BodyGuard, HostCheck, KeyCheck, ResponseHeaders
from moot.server.http.openapi import declare_openapi, error_responses
from moot.server.http.redaction import RedactingFilter, install_redaction
from moot.server.http.routes import (
    BODY_ERRORS,
    Kit,
    ViewerSessions,
    catalogue_router,
    chat_router,
    debates_router,
    usage_router,
    viewer_router,
)
from moot.server.http.streams import on_stop, sse_responder
from moot.server.openai import chat, responses, responses_modes
from moot.server.openai.responses_replay import Watchers
from moot.server.settings import ServerSettings, is_loopback
from moot.server.state import Store, open_store
from moot.server.state.base import url_password
from moot.server.state.bus import open_bus
from moot.server.state.keyring import KeyRing
from moot.server.state.manager import DebateManager

#: Also what ``moot view``'s app takes from here (its Host check, its headers, its errors).
__all__ = [
    "HostCheck",
    "KeyCheck",
    "RedactingFilter",
    "ResponseHeaders",
    "create_app",
    "error_response",
    "validation_message",
]

log = logging.getLogger("moot.server")


def create_app(settings: ServerSettings, store: Store | None = None) -> FastAPI:
    """The app for these settings. The store is opened (unless given: ``moot serve`` opens it before
    it starts, to refuse a bad one in one line) and unfinished debates are marked interrupted when
    the app starts (its lifespan); debates still running at shutdown too, and as soon as the server
    begins a graceful stop, so that every open stream ends with the reason. The app closes the store.

    Served by uvicorn: run it with :class:`~moot.server.http.connections.StoppingServer`, as ``moot
    serve`` does, for its open streams to be told of a graceful stop (under a plain
    ``uvicorn.Server`` they stay open until uvicorn's graceful timeout)."""
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
    watchers = Watchers()
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
                with on_stop(drain):  # moot serve's SIGTERM or Ctrl-C starts it at once
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
    for route in app.routes:  # its pages answer HEAD, as the API's own pages and /openapi.json do
        if isinstance(route, APIRoute) and route.path in ("/docs", "/redoc") and route.methods is not None:
            route.methods.add("HEAD")
    mcp = _mcp_mount(app, settings)
    # Outermost last: the headers on every response, then the Host (on the headers alone), then the key
    # (on the headers alone), then the body.
    app.add_middleware(BodyGuard, limit=settings.max_body_bytes, timeout_s=settings.request_timeout_s, secrets=secrets)
    app.add_middleware(KeyCheck, key=key, sessions=sessions, ring=ring)
    trusted = settings.trusted_hosts()
    if trusted is not None:
        hint = "to answer to that name too, start moot serve with --allowed-hosts {host}"
        app.add_middleware(HostCheck, allowed=trusted, hint=hint)
    app.add_middleware(ResponseHeaders, request_ids=True)

    errors = error_responses(key)
    declare_openapi(app, key, ring)
    add_error_handlers(app, secrets)
    # The key is checked by KeyCheck, on the headers, before any route (or the body) is reached.
    sse = sse_responder(settings)

    kit = Kit(settings=settings, sse=sse, errors=errors, sessions=sessions)
    for router in (debates_router(kit), catalogue_router(kit), chat_router(kit), usage_router(kit)):
        app.include_router(router)
    app.include_router(responses.router(settings, sse, errors(*BODY_ERRORS, 404, 409, 429, 502, 503, 504), watchers))
    app.include_router(
        responses_modes.router(settings, errors(*BODY_ERRORS, 404), validation_message, secrets, watchers, ring)
    )
    app.include_router(viewer_router(kit))
    static = files("moot.server") / "static"
    app.mount("/static", StaticFiles(directory=str(static)), name="static")
    if mcp is not None:
        app.router.routes.append(mcp.route)
    return app


def _mcp_mount(app: FastAPI, settings: ServerSettings) -> LazyMcpMount | None:
    """The MCP endpoint over this app's debate manager, when the ``mcp`` SDK is installed (moot[mcp]);
    the SDK is loaded by the endpoint's first request (:mod:`moot.server.http.mcp_mount`)."""
    if importlib.util.find_spec("mcp") is None:
        return None

    def manager() -> DebateManager:
        current: DebateManager = app.state.manager
        return current

    return LazyMcpMount(settings, manager)
