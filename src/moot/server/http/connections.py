"""What a connection may cost the server before it is a request: a deadline and a cap.

uvicorn times out nothing between a connection's first byte and its request's last header (its
keep-alive timeout covers idle time *between* requests only, and each byte resets it), so a client
that trickles a header a byte at a time holds its connection for ever (slowloris). ASGI code cannot
help: the app is called once the headers are complete. This module's protocol (uvicorn's h11 one,
given as ``uvicorn.Config(http=...)``: uvicorn's httptools protocol where ``httptools`` is installed,
its h11 one otherwise) adds the two guards at the connection:

- a **header deadline**: a new connection, or the first byte of a request on a kept-alive one,
  must bring the request's whole headers within ``request_timeout_s``, else it is answered ``408``
  and closed. The body has its own deadline, in the app (``BodyGuard``), where a 408 can be sent
  as a response.
- a **connection cap**: one connection over ``max_connections`` is answered ``503`` with
  ``Retry-After`` and closed at once, before it can hold anything.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import socket
import uuid
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

try:  # the C parser (llhttp), where it is installed (uvicorn[standard])
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - the dev extra installs it
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

from moot.server.http.streams import stop_streams
from moot.server.schemas import ErrorBody, ErrorDetail
from moot.server.settings import ServerSettings

log = logging.getLogger("moot.server")

#: Headers every response carries, those written here included (see ``middleware.ResponseHeaders``).
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
)
API_CSP = b"default-src 'none'; frame-ancestors 'none'"


def raw_response(status: int, reason: str, body: ErrorBody, extra: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    """A whole HTTP/1.1 response that closes the connection, for where there is no request to answer
    (its ``x-request-id`` a new one, as on every response: no request's own was read)."""
    data = body.model_dump_json().encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        (b"connection", b"close"),
        (b"x-request-id", f"req_{uuid.uuid4().hex}".encode()),
        *SECURITY_HEADERS,
        (b"content-security-policy", API_CSP),
        *extra,
    ]
    head = b"".join(k + b": " + v + b"\r\n" for k, v in headers)
    return f"HTTP/1.1 {status} {reason}\r\n".encode() + head + b"\r\n" + data


class Guarded(asyncio.Protocol):
    """A header deadline and a connection cap (the module's docstring) for one of uvicorn's HTTP/1.1
    protocols: both keep the request being answered in ``cycle``, and make a new one when a
    request's headers are complete."""

    request_timeout_s: float = 20.0
    max_connections: int = 1000
    cycle: Any
    connections: set[Any]
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            body = ErrorBody(
                error=ErrorDetail(
                    message=f"the server has {self.max_connections} connections open, its limit; retry later",
                    type="rate_limit_error",
                    code="too_many_connections",
                )
            )
            transport.write(raw_response(503, "Service Unavailable", body, ((b"retry-after", b"1"),)))
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        starting = cycle is None or cycle.response_complete  # these bytes begin a new request
        super().data_received(data)
        if self.cycle is not cycle:  # its headers are complete: the app has it now
            self._disarm()
        elif starting and self._deadline is None and not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._deadline = self.loop.call_later(self.request_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self.transport.get_protocol() is not self:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return
        log.info("a request's headers did not arrive within %g s; the connection is closed", self.request_timeout_s)
        body = ErrorBody(
            error=ErrorDetail(
                message=f"the request's headers did not arrive within {self.request_timeout_s:g} s; send the whole "
                "request at once",
                code="request_timeout",
            )
        )
        self.transport.write(raw_response(408, "Request Timeout", body))
        self.transport.close()


class GuardedH11Protocol(Guarded, H11Protocol):
    """uvicorn's h11 protocol, guarded."""


def guarded_protocol(settings: ServerSettings, parser: str = "auto") -> type[Guarded]:
    """The protocol class with this server's deadline and cap, on uvicorn's httptools protocol
    (``parser`` ``auto`` where it is installed, or ``httptools``) or its h11 one."""
    base: type[Any] = H11Protocol
    if parser == "httptools" or (parser == "auto" and HttpToolsProtocol is not None):
        if HttpToolsProtocol is None:
            raise RuntimeError("httptools is not installed: pip install httptools")
        base = HttpToolsProtocol

    class Protocol(Guarded, base):  # type: ignore[misc]
        request_timeout_s = settings.request_timeout_s
        max_connections = settings.max_connections

    return Protocol


#: How many times the body limit a WebSocket message may be before the protocol closes the socket
#: rather than hand the message to the route, which refuses it over the limit with an error event.
WS_MESSAGE_BUFFER = 4


def server_config(app: Any, settings: ServerSettings, *, parser: str = "auto", **options: Any) -> uvicorn.Config:
    """uvicorn's configuration of ``moot serve`` for this app: the guarded protocol, and idle
    connections kept longer than clients' pools keep theirs (httpx and the openai SDK: 5 s), so a
    client never reuses a connection the server is closing at the same moment."""
    defaults: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "http": guarded_protocol(settings, parser),
        # The Responses API's WebSocket mode (GET /v1/responses). A message over the body limit is
        # answered by the route with an error event (413), the socket left open; one over four times
        # the limit is not even buffered: the protocol closes the socket (1009, message too big).
        "ws": "websockets-sansio",
        "ws_max_size": WS_MESSAGE_BUFFER * settings.max_body_bytes,
        "timeout_keep_alive": 15,
        # Streams get settings.shutdown_grace_s to send their last event, within this.
        "timeout_graceful_shutdown": max(5, math.ceil(settings.shutdown_grace_s) + 2),
    }
    return uvicorn.Config(app, **{**defaults, **options})


#: The collector's first threshold in ``moot serve`` (Python's default: 700 allocations).
GC_YOUNG = 20_000


class StoppingServer(uvicorn.Server):
    """uvicorn's server, as ``moot serve`` runs it:

    - on SIGTERM or Ctrl-C it also tells the app's open event streams that the server is stopping
      (:func:`moot.server.http.streams.stop_streams`): each starts the drain and gets
      ``shutdown_grace_s`` to send its debate's end, within uvicorn's graceful shutdown;
    - the garbage collector leaves alone what the server's start made (its modules, the app, the
      schemas: ``gc.freeze``) and looks at new objects every :data:`GC_YOUNG` allocations instead of
      700. Under load it took 12% of the server's CPU, a full pass over every object of the process
      every second or so; then 4-5% (docs/benchmarks.md, "Session 27"), and 1-2% once no finished
      debate was left as a reference cycle for it to free ("Session 40")."""

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])
        super().run(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # the signal came before the server's loop ran, or after
            return
        loop.call_soon_threadsafe(stop_streams)  # (a signal handler: the loop does it, woken)
