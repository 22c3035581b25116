"""The least a debate server can do: arms F, U, G and T of the interleaved benchmark (issue 43).

    python benchmarks/floor_server.py --port P --base-url URL --db FILE [--concurrency N]
        [--http raw|asgi|fastapi] [--typed]

Not a server to use: a measuring stick. It serves the two requests of the benchmark's S arm,
``POST /v1/debates`` and ``GET /v1/debates/{id}/events``, with what any server of this design has to
do and nothing more, to find the CPU per model call below which ``moot serve`` cannot go while it
keeps its wire contract and its durability:

- HTTP/1.1 read by hand on asyncio's streams (keep-alive, ``Content-Length`` bodies, a chunked SSE
  response), no framework, no middleware, no key, no validation of the body beyond its JSON; or
  (``--http``) a bare ASGI app on uvicorn, or FastAPI on uvicorn;
- the same :class:`~moot.core.engine.Engine` on the same ``openai:`` model as the E arm;
- the same events on the wire as ``moot serve``'s SSE stream for this debate (24: ``debate_started``,
  each turn's ``turn_started``, its first token delta at once and the rest with its end,
  ``turn_done``, ``round_done``, ``debate_done``), encoded by orjson from plain dicts, or
  (``--typed``) made as ``moot serve``'s pydantic payloads, the request validated as its model;
- each event but the tokens stored as a row, and each finished turn stored as a row of its own (an
  append, not the whole transcript again), all the writes of one moment of the event loop in one
  SQLite transaction (WAL, ``synchronous=NORMAL``, as moot's store);
- the collector set as ``moot serve`` sets it;
- no redaction, no queue, no leases, no bus, no replay of a stream from its ``Last-Event-ID``.

Left cheaper than ``moot serve`` beyond those (a review's count, about 0.02-0.03 ms a call in all):
one protocol spec made once rather than per request, no cost summary in ``debate_done``, a shorter
reply to the POST and fewer response headers.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import sqlite3
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import spec

from moot.core.engine import Engine
from moot.core.events import DebateDone, DebateStarted, Event, RoundDone, TokenDelta, TurnDone, TurnStarted
from moot.core.types import ContextChunk, DebateTask
from moot.models.openai_compat import OpenAICompatModel
from moot.server.http.connections import GC_YOUNG
from moot.server.schemas import DebateRequest
from moot.server.state.events import to_payload


class Store:
    """SQLite, the writes of one moment of the event loop in one transaction."""

    def __init__(self, path: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(
            "CREATE TABLE IF NOT EXISTS debates (id TEXT PRIMARY KEY, question TEXT, status TEXT);"
            "CREATE TABLE IF NOT EXISTS events (debate TEXT, id INTEGER, name TEXT, data TEXT);"
            "CREATE TABLE IF NOT EXISTS turns (debate TEXT, n INTEGER, turn TEXT);"
        )
        self.pending: list[tuple[str, tuple[Any, ...]]] = []

    def write(self, sql: str, args: tuple[Any, ...]) -> None:
        if not self.pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self.pending.append((sql, args))

    def flush(self) -> None:
        writes, self.pending = self.pending, []
        self.conn.execute("BEGIN")
        for sql, args in writes:
            self.conn.execute(sql, args)
        self.conn.execute("COMMIT")


class Debate:
    def __init__(self, debate_id: str, store: Store, typed: bool = False) -> None:
        self.id, self.store, self.typed = debate_id, store, typed
        self.wire: list[bytes] = []
        self.changed = asyncio.Event()
        self.done = False
        self.next_id = itertools.count(1)
        self.turns = itertools.count(1)
        #: Each streaming turn's token deltas not sent yet, and the turns whose first went out already.
        self.tokens: dict[tuple[str, int], list[str]] = {}
        self.streaming: set[tuple[str, int]] = set()

    def emit(self, name: str, data: dict[str, Any], stored: bool = True) -> None:
        n = next(self.next_id)
        body = orjson.dumps(data)
        if stored:
            self.store.write("INSERT INTO events VALUES (?, ?, ?, ?)", (self.id, n, name, body))
        self.wire.append(b"id: %d\nevent: %s\ndata: %s\n\n" % (n, name.encode(), body))
        self.changed.set()

    def flush_tokens(self, speaker: str, round_index: int) -> None:
        pending = self.tokens.pop((speaker, round_index), None)
        if pending:
            self.emit("token", {"speaker": speaker, "round": round_index, "text": "".join(pending)}, False)

    def on_event(self, event: Event) -> None:
        if self.typed and not isinstance(event, TokenDelta):
            self.on_typed_event(event)
            return
        result = event.result
        totals = {"calls": result.llm_calls, "total_tokens": result.usage.total_tokens}
        if isinstance(event, DebateStarted):
            self.emit("debate_started", {"id": self.id, "protocol": result.protocol})
        elif isinstance(event, TurnStarted):
            self.streaming.discard((event.speaker, event.round))
            self.emit("turn_started", {"speaker": event.speaker, "round": event.round, "kind": event.kind})
        elif isinstance(event, TokenDelta):
            key = (event.speaker, event.round)
            self.tokens.setdefault(key, []).append(event.text)
            if key not in self.streaming:  # a turn's first piece goes at once, the rest with its end
                self.streaming.add(key)
                self.flush_tokens(*key)
        elif isinstance(event, TurnDone):
            turn = event.turn
            self.flush_tokens(turn.speaker, turn.round)
            self.store.write("INSERT INTO turns VALUES (?, ?, ?)", (self.id, next(self.turns), turn.model_dump_json()))
            view = orjson.Fragment(turn.model_dump_json(exclude={"messages"}))
            self.emit("turn_done", {"turn": view, "totals": totals})
        elif isinstance(event, RoundDone):
            self.emit("round_done", {"round": event.round.index, "totals": totals})
        elif isinstance(event, DebateDone):
            self.store.write("UPDATE debates SET status = ? WHERE id = ?", (result.status, self.id))
            # A failure of this handler (the engine keeps it as a warning) fails the benchmark's check.
            failed = any(w.startswith("event handler failed") for w in result.warnings)
            status = "failed" if failed else result.status
            self.emit(
                "debate_done",
                {"status": status, "final_answer": result.final_answer, "warnings": result.warnings, "totals": totals},
            )
            self.done = True

    def on_typed_event(self, event: Event) -> None:
        """``--typed``: moot serve's own typed payloads (pydantic models, :func:`to_payload`), dumped."""
        if isinstance(event, TurnStarted):
            self.streaming.discard((event.speaker, event.round))
        if isinstance(event, TurnDone):
            self.flush_tokens(event.turn.speaker, event.turn.round)
            self.store.write(
                "INSERT INTO turns VALUES (?, ?, ?)", (self.id, next(self.turns), event.turn.model_dump_json())
            )
        if isinstance(event, DebateDone):
            self.store.write("UPDATE debates SET status = ? WHERE id = ?", (event.result.status, self.id))
            self.done = True
        name, payload = to_payload(event, self.id, elapsed=0.0, decision_kind="synthesis", rounds=2)
        n = next(self.next_id)
        body = payload.model_dump_json().encode()
        self.store.write("INSERT INTO events VALUES (?, ?, ?, ?)", (self.id, n, name, body))
        self.wire.append(b"id: %d\nevent: %s\ndata: %s\n\n" % (n, name.encode(), body))
        self.changed.set()


def json_reply(status: bytes, body: bytes) -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (status, len(body), body)


class Server:
    def __init__(self, args: argparse.Namespace) -> None:
        self.store = Store(args.db)
        self.typed: bool = args.typed
        self.model = OpenAICompatModel(
            "bench", base_url=args.base_url, api_key="sk-floor", max_concurrency=args.concurrency
        )
        self.spec = spec()
        self.debates: dict[str, Debate] = {}
        self.ids = itertools.count(1)
        self.tasks: set[asyncio.Task[None]] = set()

    async def run(self, debate: Debate, task: DebateTask) -> None:
        await Engine(self.spec, self.model, on_event=debate.on_event).run(task)

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *fields = head.decode("latin-1").split("\r\n")
                method, path, _ = line.split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields if f)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if method == "POST" and path == "/v1/debates":
                    self.create(writer, orjson.loads(body))
                elif method == "GET" and path.startswith("/v1/debates/") and path.endswith("/events"):
                    await self.events(writer, self.debates[path.split("/")[3]])
                else:
                    writer.write(json_reply(b"200 OK", b'{"data":[]}'))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def start(self, body: dict[str, Any]) -> Debate:
        """A debate started from a request's JSON: created in the store, its engine running."""
        debate = Debate(f"d{next(self.ids)}", self.store, self.typed)
        self.debates[debate.id] = debate
        if self.typed:  # moot serve's request model, validated
            request = DebateRequest.model_validate(body)
            task = DebateTask(question=request.question, context=request.chunks())
        else:
            task = DebateTask(question=body["question"], context=[ContextChunk(**c) for c in body.get("context", [])])
        self.store.write("INSERT INTO debates VALUES (?, ?, 'running')", (debate.id, task.question))
        running = asyncio.get_running_loop().create_task(self.run(debate, task))
        self.tasks.add(running)
        running.add_done_callback(self.tasks.discard)
        return debate

    def create(self, writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
        debate = self.start(body)
        writer.write(json_reply(b"201 Created", orjson.dumps({"id": debate.id, "status": "running"})))

    async def events(self, writer: asyncio.StreamWriter, debate: Debate) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        async for chunk in self.stream(debate):
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
        writer.write(b"0\r\n\r\n")

    async def stream(self, debate: Debate) -> AsyncIterator[bytes]:
        """The events route's body: the events as they come, those of one moment in one piece."""
        sent = 0
        while True:
            debate.changed.clear()
            if sent < len(debate.wire):
                chunk = b"".join(debate.wire[sent:])
                sent = len(debate.wire)
                yield chunk
                continue
            if debate.done:
                break
            await debate.changed.wait()
        del self.debates[debate.id]


JSON_HEADERS = [(b"content-type", b"application/json")]


def asgi_app(server: Server) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The same two routes as a bare ASGI callable on uvicorn: uvicorn's own part, without FastAPI's."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if method == "POST" and path == "/v1/debates":
            body, more = b"", True
            while more:
                message = await receive()
                body, more = body + message.get("body", b""), message.get("more_body", False)
            debate = server.start(orjson.loads(body))
            await send(
                {"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": orjson.dumps({"id": debate.id, "status": "running"})})
        elif method == "GET" and path.startswith("/v1/debates/") and path.endswith("/events"):
            headers = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            async for chunk in server.stream(server.debates[path.split("/")[3]]):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": b'{"data":[]}'})

    return app


def fastapi_app(server: Server) -> FastAPI:
    """The same two routes on FastAPI and uvicorn, no middleware: the framework's own part."""
    app = FastAPI()

    @app.post("/v1/debates", status_code=201)
    async def create(request: Request) -> Response:
        debate = server.start(orjson.loads(await request.body()))
        reply = orjson.dumps({"id": debate.id, "status": "running"})
        return Response(reply, status_code=201, media_type="application/json")

    @app.get("/v1/debates/{debate_id}/events")
    async def events(debate_id: str) -> StreamingResponse:
        return StreamingResponse(server.stream(server.debates[debate_id]), media_type="text/event-stream")

    @app.get("/v1/protocols")
    async def protocols() -> dict[str, list[str]]:
        return {"data": []}

    return app


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--db", required=True)
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument(
        "--http", choices=["raw", "asgi", "fastapi"], default="raw", help="raw asyncio streams, or FastAPI + uvicorn"
    )
    ap.add_argument("--typed", action="store_true", help="the request and the events as moot serve's pydantic models")
    args = ap.parse_args()
    server = Server(args)
    # The collector as moot serve sets it (StoppingServer.run): what the start made frozen, the young
    # generation looked at every GC_YOUNG allocations.
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])
    if args.http in ("fastapi", "asgi"):
        app = fastapi_app(server) if args.http == "fastapi" else asgi_app(server)
        config = uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning")
        await uvicorn.Server(config).serve()
        return
    listening = await asyncio.start_server(server.connection, "127.0.0.1", args.port)
    async with listening:
        await listening.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
