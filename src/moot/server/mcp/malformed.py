"""Messages the MCP SDK's parser refuses without a useful reason, answered before they reach it.

Its parser refuses JSON whose text holds a lone UTF-16 surrogate as if it were not JSON, and on
stdio it then answers nothing, so a host would wait forever. :func:`unreadable` gives the reply
such a message gets (and a line that is not JSON, the protocol's parse error); :class:`StdinLines`
applies it to ``moot mcp``'s stdin, and :class:`~moot.server.mcp.transports.HttpMount` to a POST.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal, Protocol

import anyio
import mcp_types as types
from mcp.shared.message import SessionMessage
from mcp_types.version import MODERN_PROTOCOL_VERSIONS, SUPPORTED_PROTOCOL_VERSIONS

from moot.server.mcp.tools import not_text

#: :func:`unreadable`'s answer for a message the SDK reads itself.
PASS: Literal["pass"] = "pass"
#: What :class:`StdinLines` reads in place of a line over its limit.
TOO_LONG = b"\0too long\0"
Refusal = types.JSONRPCResponse | types.JSONRPCError


#: How deep a message may nest: the SDK's parser (pydantic's) refuses one past about 200 levels, and
#: on stdio then answers nothing; an MCP message needs a dozen (a debate's inline protocol included).
MAX_DEPTH = 64
_TOO_DEEP = types.ErrorData(
    code=types.INVALID_REQUEST,
    message=f"Invalid request: the message nests deeper than {MAX_DEPTH} levels; send a flatter message",
)


def _nests_deeper(data: Any, limit: int) -> bool:
    """Whether ``data``'s lists and objects nest deeper than ``limit``."""
    stack = [(data, 1)] if isinstance(data, dict | list) else []
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        for child in value.values() if isinstance(value, dict) else value:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False


def _request_id(data: dict[str, Any]) -> types.RequestId | None:
    value = data.get("id")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and not_text(value) is None:
        return value
    return None


def parse_error(reason: str) -> types.JSONRPCError:
    """The protocol's parse error (no id: none could be read), saying why."""
    return types.JSONRPCError(
        jsonrpc="2.0",
        id=None,
        error=types.ErrorData(
            code=types.PARSE_ERROR,
            message=f"Parse error: the message is not JSON ({reason}); send one JSON-RPC message per line",
        ),
    )


def not_a_message(data: Any) -> str | None:
    """Why JSON is no JSON-RPC 2.0 message MCP takes (None: it is one, or one the SDK answers): not
    an object (a batch, which MCP no longer has, a bare value), ``jsonrpc`` not "2.0", an ``id``
    that is neither a string nor an integer, neither a ``method`` nor a ``result``/``error``."""
    if isinstance(data, list):
        return "a batch (a JSON array); send one JSON-RPC message at a time"
    if not isinstance(data, dict):
        return "not a JSON-RPC message (a JSON object); send one"
    if data.get("jsonrpc") != "2.0":
        return 'jsonrpc must be "2.0"'
    if "id" in data:
        value = data["id"]
        # (an error response may have a null id: the error of a message whose id could not be read)
        null_error = value is None and "error" in data and "method" not in data
        if not null_error and (isinstance(value, bool) or not isinstance(value, int | str)):
            return "id must be a string or an integer"
    if "method" not in data and "result" not in data and "error" not in data:
        return "a message has a method (a request, a notification) or a result or error (a response)"
    return None


def unreadable(text: str | bytes, *, not_json: bool, version: str | None = None) -> Refusal | Literal["pass"] | None:
    """The reply to a message the SDK's parser refuses, or :data:`PASS` for one it reads (None: a
    notification or a response, which gets no reply). Its parser refuses JSON whose text holds a lone
    UTF-16 surrogate (``"\\ud800"``) as if it were not JSON, and on stdio it then answers nothing,
    so a host would wait for the reply forever. Here a ``tools/call`` holding one gets the tool's own
    one-line error result, any other request the protocol's invalid-params error, both naming where
    it is; a message nested past the parser's recursion limit, the invalid-request error; with
    ``not_json``, a line that is not JSON gets the protocol's parse error. ``version``: the session's
    protocol revision where known (a tool's result carries ``resultType`` from 2026-07-28 on only, as
    the SDK's own results do)."""
    try:
        data = json.loads(text)
    except RecursionError:  # (the SDK's parser would meet it too, and end a stdio session with it)
        return types.JSONRPCError(jsonrpc="2.0", id=None, error=_TOO_DEEP)
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        if not not_json:
            return PASS
        if isinstance(exc, json.JSONDecodeError):
            reason = f"{exc.msg} at column {exc.colno}"
        elif isinstance(exc, UnicodeDecodeError):
            reason = "not UTF-8"
        else:  # (Python reads no integer of over 4300 digits)
            reason = f"a value that cannot be read: {str(exc).split(';')[0]}"
        return parse_error(reason)
    if _nests_deeper(data, MAX_DEPTH):  # (the SDK's parser gives up near 200 levels, and answers nothing)
        request_id = _request_id(data) if isinstance(data, dict) else None
        return types.JSONRPCError(jsonrpc="2.0", id=request_id, error=_TOO_DEEP)
    problem = not_a_message(data)
    if problem is not None:  # (the SDK drops it without a word: on stdio a host would wait for ever)
        request_id = _request_id(data) if isinstance(data, dict) else None
        error = types.ErrorData(code=types.INVALID_REQUEST, message=f"Invalid request: {problem}")
        return types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)
    where = not_text(data)
    if where is None:
        return PASS
    if not isinstance(data, dict) or "method" not in data or "id" not in data:
        return None
    request_id = _request_id(data)
    params = data.get("params")
    if data["method"] == "tools/call" and isinstance(params, dict) and request_id is not None:
        problem = not_text(params.get("arguments"))
        name = params.get("name")
        rest = {k: v for k, v in params.items() if k != "arguments"}
        if problem is not None and isinstance(name, str) and not_text(rest) is None:
            result = types.CallToolResult(
                content=[types.TextContent(type="text", text=f"{name}: {problem}")], is_error=True
            )
            dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            if version is not None and version not in MODERN_PROTOCOL_VERSIONS:
                dumped.pop("resultType", None)
            return types.JSONRPCResponse(jsonrpc="2.0", id=request_id, result=dumped)
    return types.JSONRPCError(
        jsonrpc="2.0", id=request_id, error=types.ErrorData(code=types.INVALID_PARAMS, message=where)
    )


class _Replies(Protocol):
    async def send(self, item: SessionMessage, /) -> None: ...


class StdinLines:
    """The lines the SDK's stdio transport reads: each one it could not read is answered here
    (:func:`unreadable`) and not passed on; the server goes on serving the next.

    stdin is read by a daemon thread of its own, its lines handed to the event loop: waiting for the
    next line never holds the server up when it stops (SIGTERM, Ctrl-C) while the host keeps stdin
    open, where a read in the event loop's worker thread could not be cancelled, and the process
    went on until stdin closed (holding its ``--db`` lock). A line is read as bytes and decoded
    strictly: one that is not UTF-8 gets the parse error, not a debate of U+FFFD."""

    #: Lines read ahead of the server: past them the reading thread waits, and so does a host that
    #: writes faster than the server reads (the pipe fills), instead of the process's memory growing.
    AHEAD = 16

    def __init__(self, max_bytes: int = 1_000_000) -> None:
        self.raw = os.fdopen(os.dup(sys.stdin.fileno()), "rb")
        self.replies: _Replies | None = None
        self.ready = anyio.Event()
        #: The session's protocol revision, as its ``initialize`` asked for it (None: not known, or
        #: one the SDK does not support, which it answers with its latest).
        self.version: str | None = None
        #: The longest message read (``--max-body-bytes``, as over HTTP): a longer line is answered with
        #: a parse error saying so, and read on to its end without being held.
        self.max_bytes = max_bytes

    def _read(self) -> Iterator[bytes]:
        """The lines of stdin, each at most :attr:`max_bytes` (a longer one: :data:`TOO_LONG`)."""
        while line := self.raw.readline(self.max_bytes + 2):  # (a message of max_bytes and its \r\n)
            if len(line.rstrip(b"\r\n")) > self.max_bytes:
                ended = line.endswith(b"\n")
                while not ended and (rest := self.raw.readline(65536)):  # (the rest of it, not held)
                    ended = rest.endswith(b"\n")
                yield TOO_LONG
            else:
                yield line

    def _note_version(self, line: str) -> None:
        """Keep the revision an ``initialize`` request asks for (the SDK answers with it if it
        supports it)."""
        if '"initialize"' not in line:
            return
        data = json.loads(line)
        if isinstance(data, dict) and data.get("method") == "initialize":
            params = data.get("params")
            asked = params.get("protocolVersion") if isinstance(params, dict) else None
            self.version = asked if asked in SUPPORTED_PROTOCOL_VERSIONS else None

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        await self.ready.wait()
        assert self.replies is not None
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bytes] = asyncio.Queue(self.AHEAD)

        def read() -> None:
            # (OSError, ValueError: stdin closed under it, the end as an end of file is; RuntimeError:
            # the event loop closed first, at the process's end; CancelledError: the loop stopped
            # while this thread waited for room)
            with contextlib.suppress(OSError, ValueError, RuntimeError, concurrent.futures.CancelledError):
                for line in self._read():
                    hand(line)
            with contextlib.suppress(RuntimeError, concurrent.futures.CancelledError):
                hand(b"")

        def hand(line: bytes) -> None:
            """The line to the event loop once the queue has room (this thread waits for it)."""
            put = queue.put(line)
            try:
                asyncio.run_coroutine_threadsafe(put, loop).result()
            except RuntimeError:  # the loop closed first: the put never ran
                put.close()
                raise

        threading.Thread(target=read, name="moot-mcp-stdin", daemon=True).start()
        while raw := await queue.get():
            if raw is TOO_LONG:
                await self.replies.send(SessionMessage(parse_error(f"a message is at most {self.max_bytes} bytes")))
                continue
            if not raw.strip():
                continue
            try:  # strictly UTF-8 (json.loads would take UTF-16 bytes too, which the SDK cannot read)
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                await self.replies.send(SessionMessage(parse_error("not UTF-8")))
                continue
            reply = unreadable(line, not_json=True, version=self.version)
            if reply == PASS:
                self._note_version(line)
                yield line
            elif isinstance(reply, types.JSONRPCResponse | types.JSONRPCError):
                await self.replies.send(SessionMessage(reply))
