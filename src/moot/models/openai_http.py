"""The ``openai`` SDK's HTTP client as moot's OpenAI-compatible backend uses it: the caller's check
(:data:`~moot.models.base.BEFORE_CALL`, a replica's lease) run once more right before each write to
the socket, the SDK's aiohttp transport where it is installed, and the clients closed with the event
loop they were made on. :mod:`moot.models.openai_compat` (the model) takes its clients from here."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextvars import ContextVar
from typing import Any

import openai

from moot.models.base import BEFORE_CALL

#: Where a check that failed in a write records its exception, for the request it belongs to (a list
#: the request's task sets: the task aiohttp writes from runs in a copy of its context).
_FAILED_IN_WRITE: ContextVar[list[BaseException] | None] = ContextVar("moot_failed_in_write", default=None)


def _check_before_call() -> None:
    check = BEFORE_CALL.get()
    if check is not None:
        check()


def _check_before_write() -> None:
    """The check, from a write to the socket: what it raises is recorded for the request too, since
    aiohttp writes from a task of its own, whose failure the request does not see as such."""
    try:
        _check_before_call()
    except BaseException as exc:
        failed = _FAILED_IN_WRITE.get()
        if failed is not None:
            failed.append(exc)
        raise


async def _before_send(request: Any) -> None:
    """The HTTP client's request hook: the caller's check (:data:`~moot.models.base.BEFORE_CALL`)
    once more after the SDK has built the request, before a connection is taken for it."""
    _check_before_call()


class _CheckedStream:
    """A connection's socket whose every write runs the caller's check first (see
    :func:`http_client`): the requests written on it, whichever task's, are checked by that task."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def write(self, *args: Any, **kwargs: Any) -> None:  # (buffer, timeout)
        _check_before_call()
        await self._stream.write(*args, **kwargs)

    async def start_tls(self, *args: Any, **kwargs: Any) -> _CheckedStream:
        return _CheckedStream(await self._stream.start_tls(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:  # read, aclose, get_extra_info
        return getattr(self._stream, name)


class _CheckedTransport:
    """A kept aiohttp connection's asyncio transport whose writes run the caller's check first, as
    :class:`_CheckedStream` does for httpx: aiohttp writes a request's body (and the headers it
    holds back to send with it) from a task of its own, a loop turn or more after the pool handed the
    request its connection, so a process stopped (SIGSTOP) in that gap would send when resumed. The
    check runs in the task writing, whose context is the request's (the task is made from it)."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport

    def write(self, data: Any) -> None:
        _check_before_write()
        self._transport.write(data)

    def writelines(self, data: Any) -> None:
        _check_before_write()
        self._transport.writelines(data)

    def __getattr__(self, name: str) -> Any:  # is_closing, close, pause_reading, get_extra_info, ...
        return getattr(self._transport, name)


class _CheckedBackend:
    """The connection pool's network backend, its streams checked before each write."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> _CheckedStream:
        return _CheckedStream(await self._backend.connect_tcp(*args, **kwargs))

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> _CheckedStream:
        return _CheckedStream(await self._backend.connect_unix_socket(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:  # sleep
        return getattr(self._backend, name)


def aiohttp_transport(base_url: str) -> Any | None:
    """The SDK's aiohttp transport (``openai.DefaultAioHttpClient``'s), whose connections are
    checked as they are handed to a request, or None where the installed SDK or ``aiohttp`` lacks it.

    Reading a streamed reply through aiohttp (its C parser, chunks read as they come) costs about
    half the CPU per call of the SDK's default httpx transport (h11, one event per chunk), the
    largest cost of a served debate (docs/benchmarks.md, moot serve against the ideal client)."""
    try:
        import aiohttp
        import httpx2
        from openai._vendor.httpx_aiohttp.transport import AiohttpTransport
        from yarl import URL
    except ImportError:  # pragma: no cover - an SDK or an install without them
        return None

    def remapped(exc: BaseException) -> BaseException:
        """The transport calls every broken connection a connect timeout (its map sends
        ``aiohttp.ClientConnectionError`` to ``ConnectTimeout``): a reset or a server that hung up,
        no timeout at all, is a read error, as on httpx."""
        cause = exc.__cause__
        if (
            isinstance(exc, httpx2.TimeoutException)
            and isinstance(cause, aiohttp.ClientConnectionError)
            and not isinstance(cause, TimeoutError)
        ):
            error = httpx2.ReadError(str(cause) or type(cause).__name__)
            error.__cause__ = cause
            return error
        return exc

    class Body(httpx2.AsyncByteStream):
        def __init__(self, body: httpx2.AsyncByteStream) -> None:
            self._body = body

        async def __aiter__(self) -> AsyncIterator[bytes]:
            try:
                async for chunk in self._body:
                    yield chunk
            except httpx2.TimeoutException as exc:
                raise remapped(exc) from exc.__cause__

        async def aclose(self) -> None:
            await self._body.aclose()

    class Transport(AiohttpTransport):
        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            if request.url.userinfo:  # as httpx does: Basic auth from the URL, which aiohttp refuses
                request.headers["authorization"] = httpx2.BasicAuth(
                    request.url.username, request.url.password
                )._auth_header
                request.url = request.url.copy_with(username=None, password=None)
            failed: list[BaseException] = []
            token = _FAILED_IN_WRITE.set(failed)
            try:
                response: httpx2.Response = await super().handle_async_request(request)
            except BaseException as exc:
                # A check that failed in aiohttp's writer task closed the connection: the request
                # fails however that shows (a broken connection on Python 3.11; on 3.12, where the
                # task starts eagerly, an AttributeError on the closed connection). What the check
                # raised is what the caller gets.
                if failed:
                    raise failed[0] from None
                if isinstance(exc, httpx2.TimeoutException):
                    raise remapped(exc) from exc.__cause__
                raise
            finally:
                _FAILED_IN_WRITE.reset(token)
            response.stream = Body(response.stream)  # type: ignore[arg-type]
            return response

    class CheckedConnector(aiohttp.TCPConnector):
        """A pool whose connection, new or kept, is handed to a request only after the caller's
        check, and whose every write to the socket runs it again (:class:`_CheckedTransport`)."""

        async def connect(
            self,
            req: aiohttp.ClientRequest,
            traces: list[Any],
            timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 - aiohttp's signature
        ) -> aiohttp.connector.Connection:
            connection = await super().connect(req, traces, timeout)
            try:
                _check_before_call()
            except BaseException:
                connection.release()
                raise
            protocol = connection.protocol
            if protocol is not None and not isinstance(protocol.transport, _CheckedTransport | None):
                protocol.transport = _CheckedTransport(protocol.transport)  # type: ignore[assignment]
            return connection

    limits = openai.DEFAULT_CONNECTION_LIMITS

    def session() -> aiohttp.ClientSession:
        connector = CheckedConnector(limit=limits.max_connections or 0, keepalive_timeout=limits.keepalive_expiry)
        # The environment's proxy for the endpoint (HTTPS_PROXY, NO_PROXY, ...), as httpx honours
        # it, looked up once: aiohttp's trust_env looks it up, and .netrc, in a thread per request.
        try:
            proxy, auth = aiohttp.helpers.get_env_proxy_for_url(URL(base_url))
        except LookupError:
            proxy, auth = None, None
        return aiohttp.ClientSession(connector=connector, proxy=proxy, proxy_auth=auth)

    return Transport(client=session)


def http_client(base_url: str) -> Any:
    """The SDK's HTTP client, with the caller's check (:data:`~moot.models.base.BEFORE_CALL`) run
    in its request hook and right before the request is written: a process stopped (SIGSTOP) after
    the check in :meth:`BaseChatModel.complete` and resumed past its lease does not send the call it
    was building, opening a connection for, or writing (``moot serve``'s replicas, issue 40).

    On aiohttp (:func:`aiohttp_transport`) it runs as the pool hands the request its connection
    and again before each write to the socket. On the SDK's default httpx transport, where aiohttp
    is missing, it runs before each write to a socket: it reaches the connection pool's network
    backend, which the HTTP client does not take as an argument; where the installed version lays it
    out otherwise, the request hook alone runs."""
    hooks = {"request": [_before_send]}
    transport = aiohttp_transport(base_url)
    if transport is not None:
        return openai.DefaultAioHttpClient(transport=transport, event_hooks=hooks)
    client = openai.DefaultAsyncHttpxClient(event_hooks=hooks)
    pool = getattr(getattr(client, "_transport", None), "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if backend is not None and hasattr(backend, "connect_tcp"):
        pool._network_backend = _CheckedBackend(backend)  # type: ignore[union-attr]
    return client


def closed_with(loop: asyncio.AbstractEventLoop, clients: list[openai.AsyncOpenAI]) -> AsyncIterator[None]:
    """An async generator, started on ``loop``, that closes ``clients`` when the loop shuts its
    generators down (``asyncio.run`` does, as do uvicorn and pytest's loops) or when it is collected:
    an aiohttp session left open says so on stderr when collected, and a model's clients live as long
    as the loop they were made on, which the caller, not the model, ends."""

    async def closer() -> AsyncIterator[None]:
        try:
            yield
        finally:
            for client in clients:
                with contextlib.suppress(Exception):
                    await client.close()

    generator = closer()
    loop.create_task(generator.__anext__())  # type: ignore[arg-type]
    return generator
