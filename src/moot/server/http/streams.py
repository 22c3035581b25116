"""Server-sent events as the app sends them (:func:`sse_responder`): a stream that ends, with its
debate's reason, when the server begins a graceful stop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import anyio
from fastapi import Request
from sse_starlette import EventSourceResponse, ServerSentEvent

from moot.server.settings import ServerSettings
from moot.server.state.events import SSE_SEP


def sse_responder(
    settings: ServerSettings,
) -> Callable[[Request, AsyncIterator[Any], Mapping[str, str] | None], EventSourceResponse]:
    """The app's stream helper (``Kit.sse``) for these settings (keepalives, the grace of a stop)."""

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

    return sse


def _keepalive() -> ServerSentEvent:
    return ServerSentEvent(comment="keepalive", sep=SSE_SEP)
