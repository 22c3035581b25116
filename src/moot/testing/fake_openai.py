"""A loopback OpenAI-compatible chat server with a fixed latency and injectable faults.

For tests and benchmarks of the HTTP backend: it speaks enough of the protocol for the official
SDK (``POST /v1/chat/completions``, plain and streamed, HTTP/1.1 keep-alive) and runs its own
event loop in a background thread, so it serves while the code under test blocks or awaits.

    with FakeOpenAIServer(latency=0.05) as server:
        server.faults.append(Fault.http(429, retry_after=0.2))
        model = OpenAICompatModel("fake", base_url=server.base_url, api_key="sk-test")

It listens on 127.0.0.1 only. It also runs as a process, for dry runs of the HTTP paths without a
key (``moot debate -m openai:fake``, ``moot eval``, any preset)::

    python -m moot.testing.fake_openai --port 8000 [--latency 0.2]
    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=sk-fake moot debate "Q?" -m openai:fake

As a process it answers a typed request with JSON that follows the request's schema
(:func:`schema_reply`), so typed presets parse; its replies are placeholders, not answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from moot.models.base import approx_tokens, trim_to_tokens

ReplyFn = Callable[[dict[str, Any]], str]


@dataclass
class Fault:
    """What the server does to one request instead of answering normally."""

    kind: str  # "status" | "reset" | "delay" | "invalid_json" | "no_choices" | "trickle" | "cut" | "length"
    status: int = 500
    headers: dict[str, str] = field(default_factory=dict)
    message: str = "injected fault"
    seconds: float = 0.0

    @classmethod
    def http(cls, status: int, message: str = "injected fault", retry_after: float | None = None) -> Fault:
        headers = {"retry-after": f"{retry_after:g}"} if retry_after is not None else {}
        return cls("status", status=status, headers=headers, message=message)

    @classmethod
    def reset(cls) -> Fault:
        return cls("reset")

    @classmethod
    def delay(cls, seconds: float) -> Fault:
        return cls("delay", seconds=seconds)

    @classmethod
    def invalid_json(cls) -> Fault:
        return cls("invalid_json")

    @classmethod
    def trickle(cls, seconds_per_chunk: float) -> Fault:
        """Stream the reply slowly: each chunk arrives ``seconds_per_chunk`` after the last."""
        return cls("trickle", seconds=seconds_per_chunk)

    @classmethod
    def cut(cls, after_chunks: int = 2) -> Fault:
        """Stream a few chunks, then drop the connection mid-reply."""
        return cls("cut", status=after_chunks)

    @classmethod
    def length(cls) -> Fault:
        """The reply stops at the request's ``max_tokens`` (cut there when longer) with
        ``finish_reason: "length"``, as a server reports a reply cut at its token limit."""
        return cls("length")

    @classmethod
    def no_choices(cls) -> Fault:
        """A 200 chat completion whose ``choices`` list is empty."""
        return cls("no_choices")


def default_reply(request: dict[str, Any]) -> str:
    if request.get("response_format"):
        # A reasoning first, as every preset's answer schema requires one (issue 39, S6).
        return json.dumps({"reasoning": "a fake model's reasoning", "answer": "ok", "confidence": 0.5})
    messages = request.get("messages") or [{}]
    last = str(messages[-1].get("content", ""))
    return f"reply to: {last[:60]}"


#: How deep :func:`example_of` follows a recursive schema's optional branches before it takes their
#: null (a self-referring model, ``nested: Answer | None``, recursed until Python's limit: a client
#: pass saw the fake's handler die and moot answer 502).
EXAMPLE_DEPTH = 4


def example_of(schema: dict[str, Any], defs: dict[str, Any] | None = None, name: str = "", depth: int = 0) -> Any:
    """A small value that follows a JSON schema (the first enum value, a number within its
    bounds, a short string, every required property): placeholder content that validates."""
    defs = defs if defs is not None else schema.get("$defs", {})
    if depth > 8 * EXAMPLE_DEPTH:  # (a recursion no null or empty list can end: not satisfiable anyway)
        return {}
    if "$ref" in schema:
        return example_of(defs.get(schema["$ref"].rsplit("/", 1)[-1], {}), defs, name, depth + 1)
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            options = [o for o in schema[key] if o.get("type") != "null"] or schema[key]
            if depth > EXAMPLE_DEPTH and len(options) < len(schema[key]):
                return None  # deep in a recursion: the null branch ends it
            return example_of(options[0], defs, name, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "object" or "properties" in schema:
        props: dict[str, Any] = schema.get("properties", {})
        return {key: example_of(sub, defs, key, depth + 1) for key, sub in props.items()}
    if kind == "array":
        count = int(schema.get("minItems", 0))
        return [example_of(schema.get("items", {}), defs, name, depth + 1) for _ in range(count)]
    if kind in ("number", "integer"):
        low, high = schema.get("minimum", schema.get("exclusiveMinimum")), schema.get("maximum")
        value: float = 0.5
        if low is not None and high is not None:
            value = (float(low) + float(high)) / 2
        elif low is not None:
            value = float(low) + 1
        elif high is not None:
            value = float(high) - 1
        return int(value) if kind == "integer" else value
    if kind == "boolean":
        return False
    text = f"fake {name or 'text'}".ljust(int(schema.get("minLength", 0)), ".")
    limit = schema.get("maxLength")
    return text[: int(limit)] if limit is not None else text


def schema_reply(request: dict[str, Any]) -> str:
    """:func:`default_reply`, except that a request with a JSON schema gets JSON that follows it."""
    fmt = request.get("response_format") or {}
    schema = (fmt.get("json_schema") or {}).get("schema")
    if isinstance(schema, dict):
        return json.dumps(example_of(schema))
    return default_reply(request)


def agent_reply(request: dict[str, Any]) -> str:
    """:func:`schema_reply` for an agent's tool loop, the dry-run server's (``python -m
    moot.testing.fake_openai``): JSON that follows the schema a typed turn asks for, whether as
    ``response_format`` or in the prompt (LangChain models); and after a tool's result (or a text
    ReAct client's ``Observation:``: smolagents), the action of answering (or the client's own
    ``final_answer`` tool) rather than another call, so that a client's loop ends as it would on a
    real model (the first action, a call, every time, never ended one)."""
    fmt = request.get("response_format") or {}
    schema = (fmt.get("json_schema") or {}).get("schema")
    last = str((request.get("messages") or [{}])[-1].get("content", ""))
    marker = "It must match this JSON schema:\n"
    if schema is None and marker in last:
        schema = json.loads(last.split(marker, 1)[1])
    sent = json.dumps(request.get("messages"))
    if isinstance(schema, dict) and ("the result of the tool call" in sent or "Observation:" in sent):
        options: list[dict[str, Any]] = schema.get("anyOf") or schema.get("oneOf") or []
        answering = [o for o in options if _answers(o, schema)] or [
            o for o in options if _answers(o, schema, "final_answer")
        ]
        if answering:
            return json.dumps(example_of(answering[0], schema.get("$defs", {})))
    return json.dumps(example_of(schema)) if isinstance(schema, dict) else default_reply(request)


def _answers(option: dict[str, Any], schema: dict[str, Any], action: str = "answer") -> bool:
    """Whether an option of an action union is the action of answering (``do: answer``), or ``action``."""
    if "$ref" in option:
        option = schema.get("$defs", {}).get(option["$ref"].rsplit("/", 1)[-1], {})
    return bool(option.get("properties", {}).get("do", {}).get("const") == action)


class FakeOpenAIServer:
    def __init__(
        self,
        *,
        latency: float = 0.0,
        reply: ReplyFn | None = None,
        reject_response_format: bool | Callable[[dict[str, Any]], bool] = False,
        reject_status: int = 400,
        port: int = 0,
        cached_tokens: int = 0,
    ) -> None:
        self.latency = latency
        #: Prompt tokens each reply says the server read from its prompt cache (at most its prompt).
        self.cached_tokens = cached_tokens
        self.reply = reply or default_reply
        self.reject_response_format = reject_response_format
        self.reject_status = reject_status
        self.faults: deque[Fault] = deque()
        self.requests: list[dict[str, Any]] = []
        self.headers_seen: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        #: TCP connections accepted (a client that keeps its connections opens fewer than it sends requests).
        self.connections = 0
        #: The paths requested, query included.
        self.paths: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.port = port

    # -------------------------------------------------------------------------------- lifecycle

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeOpenAIServer:
        self._thread = threading.Thread(target=self._serve, name="fake-openai", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fake OpenAI server did not start")
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", self.port, backlog=1024)
            )
        except OSError as exc:
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    # --------------------------------------------------------------------------------- protocol

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.paths.append(path)
                keep = await self._respond(method, path, headers, body, writer)
                if not keep:
                    return
        except (
            asyncio.IncompleteReadError,
            ConnectionError,
            asyncio.LimitOverrunError,
            asyncio.CancelledError,
        ):
            return
        finally:
            if not writer.is_closing():
                writer.close()

    async def _send(
        self, writer: asyncio.StreamWriter, status: int, payload: bytes, headers: dict[str, str] | None = None
    ) -> None:
        reason = {
            200: "OK",
            400: "Bad Request",
            401: "Unauthorized",
            404: "Not Found",
            429: "Too Many Requests",
        }
        hdrs = {"content-type": "application/json", "content-length": str(len(payload)), **(headers or {})}
        head = f"HTTP/1.1 {status} {reason.get(status, 'Error')}\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in hdrs.items()
        )
        writer.write(head.encode() + b"\r\n" + payload)
        await writer.drain()

    async def _respond(
        self, method: str, path: str, headers: dict[str, str], body: bytes, writer: asyncio.StreamWriter
    ) -> bool:
        if method != "POST" or not path.partition("?")[0].endswith("/chat/completions"):
            await self._send(writer, 404, json.dumps({"error": {"message": f"no route {path}"}}).encode())
            return True
        request = json.loads(body or b"{}")
        self.requests.append(request)
        self.headers_seen.append(headers)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            fault = self.faults.popleft() if self.faults else None
            if fault is not None and fault.kind == "delay":
                await asyncio.sleep(fault.seconds)
            elif self.latency:
                await asyncio.sleep(self.latency)
            if fault is not None and fault.kind == "reset":
                transport = writer.transport
                transport.abort()
                return False
            if fault is not None and fault.kind == "status":
                err = {"error": {"message": fault.message, "type": "fault", "code": fault.status}}
                await self._send(writer, fault.status, json.dumps(err).encode(), fault.headers)
                return True
            if fault is not None and fault.kind == "invalid_json":
                await self._send(writer, 200, b"{this is not json")
                return True
            if fault is not None and fault.kind == "no_choices":
                await self._send(writer, 200, json.dumps({**self._completion(request, ""), "choices": []}).encode())
                return True
            refuses = self.reject_response_format
            if request.get("response_format") and (refuses(request) if callable(refuses) else refuses):
                err = {"error": {"message": "response_format is not supported", "type": "invalid_request_error"}}
                await self._send(writer, self.reject_status, json.dumps(err).encode())
                return True
            text = self.reply(request)
            finish = "stop"
            if fault is not None and fault.kind == "length":
                text, finish = trim_to_tokens(text, int(request.get("max_tokens") or 16)), "length"
            if request.get("stream"):
                return await self._stream(writer, request, text, fault)
            else:
                await self._send(writer, 200, json.dumps(self._completion(request, text, finish)).encode())
            return True
        finally:
            self.in_flight -= 1

    def _usage(self, request: dict[str, Any], text: str) -> dict[str, Any]:
        prompt = sum(approx_tokens(str(m.get("content", ""))) + 4 for m in request.get("messages", []))
        completion = approx_tokens(text)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        if self.cached_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": min(self.cached_tokens, prompt)}
        return usage

    def _completion(self, request: dict[str, Any], text: str, finish: str = "stop") -> dict[str, Any]:
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model", "fake"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": self._usage(request, text),
        }

    async def _stream(
        self, writer: asyncio.StreamWriter, request: dict[str, Any], text: str, fault: Fault | None = None
    ) -> bool:
        head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        writer.write(head.encode())

        def chunk(data: dict[str, Any]) -> bytes:
            payload = f"data: {json.dumps(data)}\n\n".encode()
            return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"

        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "fake"}
        words = text.split(" ")
        for i, word in enumerate(words):
            if fault is not None and fault.kind == "cut" and i >= fault.status:
                await writer.drain()
                writer.transport.abort()
                return False
            if fault is not None and fault.kind == "trickle":
                await writer.drain()
                await asyncio.sleep(fault.seconds)
            piece = word if i == 0 else " " + word
            writer.write(chunk({**base, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}))
        finish = "length" if fault is not None and fault.kind == "length" else "stop"
        writer.write(chunk({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
        if (request.get("stream_options") or {}).get("include_usage"):
            writer.write(chunk({**base, "choices": [], "usage": self._usage(request, text)}))
        done = b"data: [DONE]\n\n"
        writer.write(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
        await writer.drain()
        return True


def main(argv: list[str] | None = None) -> int:
    """``python -m moot.testing.fake_openai``: serve until Ctrl-C (or SIGTERM)."""
    parser = argparse.ArgumentParser(
        prog="python -m moot.testing.fake_openai",
        description="A loopback OpenAI-compatible chat server for dry runs: no key, no model, placeholder replies.",
    )
    parser.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (0: any free port; default 8000)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each reply (default 0)")
    args = parser.parse_args(argv)
    server = FakeOpenAIServer(latency=args.latency, reply=agent_reply, port=args.port)
    try:
        server.start()
    except OSError as exc:
        print(f"error: cannot listen on 127.0.0.1:{args.port}: {exc.strerror}; try another --port", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(
        f"fake OpenAI-compatible server on {server.base_url} (Ctrl-C stops it). Try:\n"
        f"  export OPENAI_BASE_URL={server.base_url} OPENAI_API_KEY=sk-fake\n"
        '  moot debate "Is the sky blue?" -m openai:fake',
        flush=True,
    )
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    print(f"served {len(server.requests)} requests", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
