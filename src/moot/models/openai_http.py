"""The HTTP client of moot's OpenAI-compatible backend: one aiohttp session per event loop, whose
requests run the caller's check (:data:`~moot.models.base.BEFORE_CALL`, a replica's lease) once
more before they are sent, as their connection is handed to them and before each write to the
socket; the sessions are closed with the event loop they were made on.
:mod:`moot.models.openai_compat` (the model) makes its requests here.

Not the ``openai`` SDK's client: building and sending its request object and reading its response
object cost about 1.5 ms of CPU per streamed call above a plain aiohttp request, 30% of the call
(``benchmarks/bench_model_call.py``, docs/benchmarks.md), the largest cost of a served debate."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from contextvars import ContextVar
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

import aiohttp
from yarl import URL

from moot._version import __version__
from moot.models.base import BEFORE_CALL

#: Connections per session, and how long an idle one is kept (the ``openai`` SDK's figures).
MAX_CONNECTIONS = 1000
KEEPALIVE_S = 5.0

#: Where a check that failed in a write records its exception, for the request it belongs to (a list
#: the request's task sets: the task aiohttp writes from runs in a copy of its context).
_FAILED_IN_WRITE: ContextVar[list[BaseException] | None] = ContextVar("moot_failed_in_write", default=None)


def check_before_call() -> None:
    """The caller's check (:data:`~moot.models.base.BEFORE_CALL`), if one is set."""
    check = BEFORE_CALL.get()
    if check is not None:
        check()


def _check_before_write() -> None:
    """The check, from a write to the socket: what it raises is recorded for the request too, since
    aiohttp writes from a task of its own, whose failure the request does not see as such."""
    try:
        check_before_call()
    except BaseException as exc:
        failed = _FAILED_IN_WRITE.get()
        if failed is not None:
            failed.append(exc)
        raise


class _CheckedTransport:
    """A kept connection's asyncio transport whose writes run the caller's check first: aiohttp
    writes a request's body (and the headers it holds back to send with it) from a task of its own,
    a loop turn or more after the pool handed the request its connection, so a process stopped
    (SIGSTOP) in that gap would send when resumed. The check runs in the task writing, whose
    context is the request's (the task is made from it)."""

    #: What aiohttp calls on its transport per chunk read (``resume_reading``) or per request, bound
    #: here once: found through ``__getattr__`` each call cost a failed look-up, 3% of a served call.
    _FORWARDED = ("resume_reading", "pause_reading", "is_reading", "is_closing", "get_extra_info")

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        for name in self._FORWARDED:
            if hasattr(transport, name):
                setattr(self, name, getattr(transport, name))

    def write(self, data: Any) -> None:
        _check_before_write()
        self._transport.write(data)

    def writelines(self, data: Any) -> None:
        _check_before_write()
        self._transport.writelines(data)

    def __getattr__(self, name: str) -> Any:  # is_closing, close, pause_reading, get_extra_info, ...
        return getattr(self._transport, name)


class CheckedConnector(aiohttp.TCPConnector):
    """A pool whose connection, new or kept, is handed to a request only after the caller's check,
    and whose every write to the socket runs it again (:class:`_CheckedTransport`)."""

    async def connect(
        self,
        req: aiohttp.ClientRequest,
        traces: list[Any],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 - aiohttp's signature
    ) -> aiohttp.connector.Connection:
        connection = await super().connect(req, traces, timeout)
        try:
            check_before_call()
        except BaseException:
            connection.release()
            raise
        protocol = connection.protocol
        if protocol is not None and not isinstance(protocol.transport, _CheckedTransport | None):
            protocol.transport = _CheckedTransport(protocol.transport)  # type: ignore[assignment]
        return connection


def host(parts: SplitResult) -> str:
    """A split URL's host and port, without the user and password it may carry."""
    netloc = parts.hostname or ""
    if ":" in netloc:  # an IPv6 address
        netloc = f"[{netloc}]"
    return f"{netloc}:{parts.port}" if parts.port else netloc


def chat_url(base_url: str) -> tuple[str, str | None]:
    """The chat-completions URL under ``base_url`` (its query kept) without the user and password it
    may carry, and those as a Basic ``Authorization`` header (as httpx sends them; aiohttp refuses a
    URL with credentials beside an ``Authorization`` header), or None."""
    parts = urlsplit(base_url)
    url = urlunsplit((parts.scheme, host(parts), parts.path.rstrip("/") + "/chat/completions", parts.query, ""))
    if parts.username is None and parts.password is None:
        return url, None
    credentials = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}".encode()
    return url, "Basic " + base64.b64encode(credentials).decode("ascii")


def request_headers(api_key: str, basic_auth: str | None) -> dict[str, str]:
    """What every request carries: the key (or the base URL's Basic auth), JSON both ways, and the
    organization and project of ``OPENAI_ORG_ID`` / ``OPENAI_PROJECT_ID``, as the SDK sends them."""
    headers = {
        "Authorization": basic_auth or f"Bearer {api_key}",
        "Content-Type": "application/json",
        "Accept": "application/json",
        "User-Agent": f"moot/{__version__}",
    }
    for header, variable in (("OpenAI-Organization", "OPENAI_ORG_ID"), ("OpenAI-Project", "OPENAI_PROJECT_ID")):
        if value := os.environ.get(variable):
            headers[header] = value
    return headers


def session(base_url: str) -> aiohttp.ClientSession:
    """A session for ``base_url`` on a :class:`CheckedConnector`, on the event loop running. No
    timeout of its own: the model's per-call timeout covers the whole call. The environment's proxy
    for the endpoint (``HTTPS_PROXY``, ``NO_PROXY``, ...), as httpx honours it, is looked up once:
    aiohttp's ``trust_env`` looks it up, and .netrc, in a thread per request."""
    connector = CheckedConnector(limit=MAX_CONNECTIONS, keepalive_timeout=KEEPALIVE_S)
    try:
        proxy, auth = aiohttp.helpers.get_env_proxy_for_url(URL(base_url))
    except LookupError:
        proxy, auth = None, None
    return aiohttp.ClientSession(
        connector=connector, proxy=proxy, proxy_auth=auth, timeout=aiohttp.ClientTimeout(total=None)
    )


@contextlib.asynccontextmanager
async def post(
    client: aiohttp.ClientSession, url: str, body: bytes, headers: Mapping[str, str]
) -> AsyncIterator[aiohttp.ClientResponse]:
    """POST ``body``, the caller's check run first, again as the pool hands the request its
    connection and before each write to the socket: a process stopped (SIGSTOP) after the check in
    :meth:`BaseChatModel.complete` and resumed past its lease does not send the call it was
    building, opening a connection for, or writing (``moot serve``'s replicas, issue 40). The
    response is released (its connection kept if it was read to its end) when the block ends."""
    check_before_call()
    failed: list[BaseException] = []
    token = _FAILED_IN_WRITE.set(failed)
    try:
        response = await client.post(url, data=body, headers=headers)
    except BaseException:
        # A check that failed in aiohttp's writer task closed the connection: the request fails
        # however that shows (a broken connection on Python 3.11; on 3.12, where the task starts
        # eagerly, an AttributeError on the closed connection). What the check raised is what the
        # caller gets.
        if failed:
            raise failed[0] from None
        raise
    finally:
        _FAILED_IN_WRITE.reset(token)
    try:
        yield response
    finally:
        response.release()


def closed_with(loop: asyncio.AbstractEventLoop, sessions: list[aiohttp.ClientSession]) -> AsyncIterator[None]:
    """An async generator, started on ``loop``, that closes ``sessions`` when the loop shuts its
    generators down (``asyncio.run`` does, as do uvicorn and pytest's loops) or when it is collected:
    an aiohttp session left open says so on stderr when collected, and a model's sessions live as
    long as the loop they were made on, which the caller, not the model, ends."""

    async def closer() -> AsyncIterator[None]:
        try:
            yield
        finally:
            for client in sessions:
                with contextlib.suppress(Exception):
                    await client.close()

    generator = closer()
    loop.create_task(generator.__anext__())  # type: ignore[arg-type]
    return generator
