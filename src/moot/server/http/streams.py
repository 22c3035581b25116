"""Server-sent events as the app sends them: :class:`EventStream`, a stream of events already
encoded (:func:`moot.server.state.events.sse_event`), with a keepalive comment while it is quiet,
that stops when its client goes, and that, when the server begins a graceful stop
(:func:`stop_streams`, which ``moot serve``'s server calls on SIGTERM or Ctrl-C), starts the drain
(every debate interrupted, so each stream ends with its debate's reason) and is given
``shutdown_grace_s`` to send it.

One task per stream watches its connection (the client leaving, the keepalive's time); the events
themselves are written by the request's own task as they come, one ``send`` each and nothing else.
(sse-starlette's response, used before, ran five tasks per stream and a lock and a cancel scope per
event: about a tenth of the server's CPU per model call, docs/benchmarks.md.)"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping

import anyio
from fastapi import Request
from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from moot.server.settings import ServerSettings

log = logging.getLogger("moot.server")

#: What a quiet stream sends every ``keepalive_s`` (a comment: clients ignore it).
KEEPALIVE = b": keepalive\n\n"


#: The open streams of this process, and the event loops whose server began a graceful stop.
_OPEN: weakref.WeakSet[EventStream] = weakref.WeakSet()
_STOPPING: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
#: The drains of the apps served on each event loop (:func:`on_stop`).
_DRAINS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Callable[[], None]]] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def on_stop(drain: Callable[[], None]) -> Iterator[None]:
    """While inside, a graceful stop of the server on this event loop starts ``drain`` at once (an
    app's lifespan): with no stream open, a request waiting for its debate's end (a chat completion
    not streamed) waited for the whole graceful timeout, then got a 500, its debate still running."""
    drains = _DRAINS.setdefault(asyncio.get_running_loop(), [])
    drains.append(drain)
    try:
        yield
    finally:
        drains.remove(drain)


def stop_streams() -> None:
    """The server on this event loop begins a graceful stop: the drain of each app served on it
    starts, and every stream open on it (and any opened after) has its grace to end. Call it on
    the loop's thread."""
    loop = asyncio.get_running_loop()
    _STOPPING.add(loop)
    for drain in list(_DRAINS.get(loop, [])):
        try:
            drain()
        except Exception:  # the streams are still told, and cut after their grace
            log.exception("the drain could not start")
    for stream in [s for s in _OPEN if s.loop is loop]:
        stream.stop()


class EventStream(Response):
    """A ``text/event-stream`` response of events already encoded (each item of ``content`` is the
    bytes of one or more events). A HEAD request gets the headers and no stream."""

    media_type = "text/event-stream"

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        headers: Mapping[str, str] | None = None,
        keepalive_s: float,
        grace_s: float,
        on_stop: Callable[[], None] | None = None,
        background: BackgroundTask | None = None,
    ) -> None:
        self.body_iterator = content
        self.status_code = 200
        self.background = background
        self.keepalive_s = keepalive_s
        self.grace_s = grace_s
        self.on_stop = on_stop
        self.init_headers(
            {"Cache-Control": "no-store", **(headers or {}), "Connection": "keep-alive", "X-Accel-Buffering": "no"}
        )
        self._scope: anyio.CancelScope | None = None
        self._sent_at = 0.0  # when the stream last sent something (the event loop's clock)
        self._stopping = False
        self._cut_later: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def stop(self) -> None:
        """A graceful stop: the drain starts (its debates end, so the stream says why), and the
        stream is cut after ``grace_s`` if it has not ended by then."""
        if self._stopping:
            return
        self._stopping = True
        if self.on_stop is not None:
            try:
                self.on_stop()
            except Exception:  # the other streams are told, and this one is still cut after its grace
                log.exception("a stream's stop could not start the drain")
        if self._scope is not None:
            self._cut_later = asyncio.get_running_loop().call_later(self.grace_s, self._scope.cancel)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        if scope.get("method") == "HEAD":  # the stream never starts (it may never end)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            await self._stream(receive, send)
        if self.background is not None:
            await self.background()

    async def _stream(self, receive: Receive, send: Send) -> None:
        content = self.body_iterator
        with anyio.CancelScope() as cut:
            self._scope = cut
            watcher = asyncio.ensure_future(self._watch(receive, send, cut))
            self.loop = asyncio.get_running_loop()
            self._sent_at = self.loop.time()  # (the response's start)
            _OPEN.add(self)
            if self.loop in _STOPPING:
                self.stop()
            try:
                async for chunk in content:
                    self._sent_at = self.loop.time()
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            finally:
                _OPEN.discard(self)
                watcher.cancel()
                if self._cut_later is not None:
                    self._cut_later.cancel()
                aclose = getattr(content, "aclose", None)
                if aclose is not None:
                    with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                        await aclose()

    async def _watch(self, receive: Receive, send: Send, cut: anyio.CancelScope) -> None:
        """Until the client goes (then the stream is cut): a keepalive whenever ``keepalive_s`` went
        by with nothing sent, so that no gap is longer (it waited for a look every ``keepalive_s``
        that found nothing sent since the last look: a gap of up to twice that)."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                async with asyncio.timeout_at(self._sent_at + self.keepalive_s):
                    message = await receive()
            except TimeoutError:
                if loop.time() - self._sent_at >= self.keepalive_s:
                    self._sent_at = loop.time()
                    try:
                        await send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})
                    except Exception:  # the connection is gone: the next receive says so
                        log.debug("a keepalive could not be sent", exc_info=True)
                continue
            if message["type"] == "http.disconnect":
                cut.cancel()
                return


def sse_responder(
    settings: ServerSettings,
) -> Callable[[Request, AsyncIterator[bytes], Mapping[str, str] | None], EventStream]:
    """The app's stream helper (``Kit.sse``) for these settings (keepalives, the grace of a stop)."""

    def sse(request: Request, content: AsyncIterator[bytes], headers: Mapping[str, str] | None = None) -> EventStream:
        return EventStream(
            content,
            headers=headers,
            keepalive_s=settings.keepalive_s,
            grace_s=settings.shutdown_grace_s,
            on_stop=request.app.state.drain,
        )

    return sse
