"""``moot serve`` against the same debates run in-process and driven by an ideal client, in one run.

    .venv/bin/python benchmarks/bench_serve.py [--quick] [--part open|clients|all] [--debates N]
        [--concurrency C] [--latency L] [--clients K] [--per-client M] [--loop-latency L2]

Prints Markdown tables: measurement | measured | bound / baseline | ratio | target | verdict.

The loopback fake OpenAI server runs in a process of its own. The debates are
``affirmative_critical(rounds=2)`` (5 calls each, every reply ~120 words streamed word by word, the
question of ``bench_engine.py``).

Part ``open`` (rows 1-5): the same N debates at once, through one ``openai:`` model limited to C
calls at once, fake server latency L:

A. in-process: N ``Engine.run`` at once in this process, with an event handler that counts the
   engine's events (so every call streams, as it does under the server);
B. over HTTP: ``moot serve`` in its own process (``--model-concurrency C --max-running N``); the N
   debates are submitted with ``POST /v1/debates`` at once and each is followed by its own SSE
   client on ``/v1/debates/{id}/events`` until ``debate_done``.

Rows: B's wall time against A's (target: HTTP adds at most 5%); the server process's CPU per
debate beyond A's engine CPU; the events delivered to the SSE clients per second (a turn's token
deltas go out gathered over 50 ms, so far fewer than the engine emits); and what was lost:
debates not complete in the store, events missing from a client's stream (ids must run 1, 2, 3,
... without a gap) or whose tokens do not add up to the stored turn.

Part ``clients`` (rows 6-9): K clients in a closed loop (each starts its next debate when its last
one ends, M debates each after one warm-up debate), fake server latency L2, debates per second:

I. the ideal client: the debate's 5 streamed calls made straight to the fake server over two
   keep-alive connections spoken by hand (round 1's two at once, then round 2's two with round 1's
   replies in their prompts, then the synthesis), each chunk read as JSON, nothing else: the rate
   the fake server allows;
E. the engine in this process, K ``Engine.run`` loops (event handler as in A);
S. ``moot serve``: each client ``POST /v1/debates`` and follows its SSE stream to ``debate_done``;
C. ``moot serve``: each client a streamed chat completion (``moot/affirmative-critical``) read to
   ``[DONE]``;
R. ``moot serve``: each client a streamed response (``POST /v1/responses``, the same debate) read
   to ``response.completed``.

E, S and C as a ratio of I (target for S and C: at least 0.85); R as a ratio of C, the Responses
endpoint's overhead against the chat endpoint's on the same debate (row 10; ``--part responses``
runs C and R alone).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import aconnect_sse

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import CALLS_PER_DEBATE, REPLY, TASK, Row, check, fmt_ratio, spec, verdict

from moot.core.engine import Engine
from moot.core.events import Event
from moot.core.types import DebateResult
from moot.models.openai_compat import OpenAICompatModel

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-bench-serve-000000000000"

FAKE_SERVER = """
import sys, time
from moot.testing.fake_openai import FakeOpenAIServer
reply = sys.stdin.read()
server = FakeOpenAIServer(latency=float(sys.argv[1]), reply=lambda request: reply).start()
print(server.port, flush=True)
while True:
    time.sleep(3600)
"""


@dataclass(frozen=True)
class Params:
    debates: int
    concurrency: int
    latency: float
    #: Part ``clients``: clients in a closed loop, debates each, the fake server's latency.
    clients: int = 64
    per_client: int = 3
    loop_latency: float = 0.5
    part: str = "all"


@dataclass
class InProcess:
    wall: float
    cpu: float
    events: int


@dataclass
class OverHttp:
    wall: float
    server_cpu: float
    client_cpu: float
    events: int
    lost_debates: int
    lost_events: int
    statuses: dict[str, int] = field(default_factory=dict)


def env() -> dict[str, str]:
    src = str(ROOT / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""), "OPENAI_API_KEY": KEY}


def start_fake(latency: float) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", FAKE_SERVER, str(latency)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env(),
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(REPLY)
    proc.stdin.close()
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}/v1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------- A. in-process


async def in_process(p: Params, base_url: str) -> InProcess:
    model = OpenAICompatModel("bench", base_url=base_url, api_key=KEY, max_concurrency=p.concurrency)
    events = 0

    def count(_event: Event) -> None:
        nonlocal events
        events += 1

    engine = Engine(spec(), model, on_event=count)
    try:
        # Warm-up: enough debates at once to open the C keep-alive connections the timed run reuses.
        for r in await asyncio.gather(*(engine.run(TASK) for _ in range(max(1, p.concurrency // 2)))):
            check(r)
        events = 0
        gc.collect()
        cpu0 = time.thread_time()
        t0 = time.perf_counter()
        results = await asyncio.gather(*(engine.run(TASK) for _ in range(p.debates)))
        wall = time.perf_counter() - t0
        cpu = time.thread_time() - cpu0
        for r in results:
            check(r)
    finally:
        await model.aclose()
    return InProcess(wall, cpu, events)


# ---------------------------------------------------------------------------------- B. over HTTP


async def follow(client: httpx.AsyncClient, debate_id: str) -> list[tuple[int, str, dict[str, Any]]]:
    """A debate's events, read to the end of the stream: the server ends it after debate_done, and a
    stream read to its end gives its keep-alive connection back to the pool (one left mid-stream is
    closed, and the next debate pays for a new connection: the ideal client never does)."""
    out: list[tuple[int, str, dict[str, Any]]] = []
    async with aconnect_sse(client, "GET", f"/v1/debates/{debate_id}/events") as source:
        async for sse in source.aiter_sse():
            if sse.data:
                out.append((int(sse.id), sse.event, json.loads(sse.data)))
    return out


def lost_in(events: list[tuple[int, str, dict[str, Any]]], result: DebateResult) -> int:
    """Events missing from one client's stream: gaps in the ids, and tokens that do not add up to
    the stored turn (a lost token event)."""
    ids = [i for i, _, _ in events]
    gaps = (ids[-1] - len(ids)) if ids and ids[0] == 1 else len(ids) + 1
    streamed: dict[tuple[str, int], str] = {}
    for _, name, data in events:
        if name == "token":
            key = (data["speaker"], data["round"])
            streamed[key] = streamed.get(key, "") + data["text"]
    turns = [t for r in result.rounds for t in r.turns] + result.decision_turns
    wrong = sum(1 for t in turns if streamed.get((t.speaker, t.round)) != t.raw)
    return gaps + wrong


def start_server(
    concurrency: int, running: int, base_url: str, workdir: Path, extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    args = [
        "serve", "--port", str(port), "--db", str(workdir / "bench.sqlite"), "--models", "openai:bench",
        "--base-url", base_url, "--model-concurrency", str(concurrency), "--max-running", str(running),
        "--max-queued", "0", "--log-level", "warning", *extra,
    ]  # fmt: skip
    with (workdir / "serve.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from moot.cli.main import main; main()", *args], stdout=log, stderr=log, env=env()
        )
    return proc, f"http://127.0.0.1:{port}"


#: The server caps every debate's time; the in-process runs have none, so ask for the most it allows.
BODY = {
    "question": TASK.question,
    "context": [c.model_dump(exclude_none=True) for c in TASK.context],
    "rounds": 2,
    "budget": {"timeout_s": 600},
}


async def wait_up(client: httpx.AsyncClient, proc: subprocess.Popen[bytes], workdir: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if (await client.get("/v1/protocols")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            log = (workdir / "serve.log").read_text()[-2000:]
            raise RuntimeError(f"moot serve did not start (exit code {proc.poll()}); its log ends:\n{log}")
        await asyncio.sleep(0.1)


async def over_http(p: Params, proc: subprocess.Popen[bytes], url: str, workdir: Path) -> OverHttp:
    limits = httpx.Limits(
        max_connections=p.debates + 16, max_keepalive_connections=p.debates + 16, keepalive_expiry=2.0
    )
    body = BODY
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0), limits=limits) as client:
        await wait_up(client, proc, workdir)

        async def one() -> tuple[str, list[tuple[int, str, dict[str, Any]]]]:
            response = await client.post("/v1/debates", json=body)
            response.raise_for_status()
            debate_id = response.json()["id"]
            return debate_id, await follow(client, debate_id)

        # Warm-up, as in A: opens the server's C keep-alive connections to the fake backend.
        await asyncio.gather(*(one() for _ in range(max(1, p.concurrency // 2))))
        gc.collect()
        cpu0, client0 = process_cpu(proc.pid), time.process_time()
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(one()) for _ in range(p.debates)]
        streams = await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
        server_cpu, client_cpu = process_cpu(proc.pid) - cpu0, time.process_time() - client0
        lost_debates = lost_events = events = 0
        statuses: dict[str, int] = {}
        for debate_id, stream in streams:
            info = (await client.get(f"/v1/debates/{debate_id}")).json()
            statuses[info["status"]] = statuses.get(info["status"], 0) + 1
            result = DebateResult.model_validate(info["result"])
            if info["status"] != "complete" or result.llm_calls != CALLS_PER_DEBATE:
                lost_debates += 1
            events += len(stream)
            lost_events += lost_in(stream, result)
    return OverHttp(wall, server_cpu, client_cpu, events, lost_debates, lost_events, statuses)


# ------------------------------------------------------------------------ clients in a closed loop


@dataclass
class Loop:
    """K clients, each running its debates one after the other: debates per second, and the CPU
    seconds the process that ran the debates spent on the timed ones."""

    debates: int
    wall: float
    cpu: float
    #: For a served route: the CPU of this process's own clients (HTTP, SSE parsing), on the same cores.
    client_cpu: float = 0.0

    @property
    def rate(self) -> float:
        return self.debates / self.wall


async def closed_loop(p: Params, debate: Any, cpu: Any = time.process_time) -> Loop:
    """``debate()`` run by ``p.clients`` clients: one warm-up debate each (it opens the keep-alive
    connections), then ``p.per_client`` each, timed; ``cpu()``: the CPU seconds of the process
    that runs the debates (default: this one)."""
    await asyncio.gather(*(debate() for _ in range(p.clients)))
    gc.collect()

    async def client() -> None:
        for _ in range(p.per_client):
            await debate()

    cpu0, mine0, t0 = cpu(), time.process_time(), time.perf_counter()
    await asyncio.gather(*(client() for _ in range(p.clients)))
    wall, mine = time.perf_counter() - t0, time.process_time() - mine0
    return Loop(p.clients * p.per_client, wall, cpu() - cpu0, 0.0 if cpu is time.process_time else mine)


#: Each client's own HTTP client holds this many keep-alive connections: a debate's POST and its
#: stream. One client shared by all of them, with a pool of 2K connections, cost the clients more CPU
#: than the server: httpcore looks over every connection of its pool at each request (is it idle,
#: has it expired: a readability poll each), and the clients share the server's two cores.
CLIENT_CONNECTIONS = 2


def client_limits() -> httpx.Limits:
    n = CLIENT_CONNECTIONS
    return httpx.Limits(max_connections=n, max_keepalive_connections=n, keepalive_expiry=5.0)


class RawConnection:
    """One keep-alive HTTP/1.1 connection to the fake server, spoken by hand: a request written in
    one piece, the chunked SSE reply read chunk by chunk. No client library in the way."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def stream(self, payload: bytes) -> str:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {KEY}\r\ncontent-length: {len(payload)}\r\n\r\n"
        )
        self.writer.write(head.encode() + payload)
        head_in = await self.reader.readuntil(b"\r\n\r\n")
        if not head_in.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"the fake server answered {head_in[:40]!r}")
        parts: list[str] = []
        while True:
            size = int((await self.reader.readuntil(b"\r\n"))[:-2], 16)
            data = await self.reader.readexactly(size + 2)
            if size == 0:
                break
            line = data[:-2].strip()
            if line.startswith(b"data: {"):
                for choice in json.loads(line[6:]).get("choices") or ():
                    piece = choice["delta"].get("content")
                    if piece:
                        parts.append(piece)
        return "".join(parts)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def ideal_client(p: Params, base_url: str) -> Loop:
    """The debate's calls straight to the fake server, over two keep-alive connections per client
    spoken by hand: nothing but the requests and the chunks, each read as JSON."""
    context = "\n".join(f"[{i}] {c.text}" for i, c in enumerate(TASK.context, 1))
    opening = f"Question: {TASK.question}\n\nContext:\n{context}"
    address = base_url.split("//", 1)[1].split("/", 1)[0]
    host, port = address.rsplit(":", 1)
    idle: list[tuple[RawConnection, RawConnection]] = []

    async def call(conn: RawConnection, user: str) -> str:
        payload = {
            "model": "bench",
            "messages": [{"role": "system", "content": "You are a debater."}, {"role": "user", "content": user}],
            "max_tokens": 500,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        text = await conn.stream(json.dumps(payload).encode())
        if text != REPLY:
            raise RuntimeError("the ideal client read a reply that is not the fake server's")
        return text

    async def debate() -> None:
        a, b = idle.pop() if idle else (RawConnection(host, int(port)), RawConnection(host, int(port)))
        first = await asyncio.gather(call(a, opening), call(b, opening))
        others = [f"{opening}\n\nThe other side said:\n{r}" for r in reversed(first)]
        second = await asyncio.gather(call(a, others[0]), call(b, others[1]))
        await call(a, f"{opening}\n\nAffirmative:\n{second[0]}\n\nCritical:\n{second[1]}\n\nSynthesize.")
        idle.append((a, b))

    try:
        return await closed_loop(p, debate)
    finally:
        for a, b in idle:
            a.close()
            b.close()


async def engine_loop(p: Params, base_url: str) -> Loop:
    model = OpenAICompatModel("bench", base_url=base_url, api_key=KEY, max_concurrency=2 * p.clients)
    engine = Engine(spec(), model, on_event=lambda _event: None)

    async def debate() -> None:
        check(await engine.run(TASK))

    try:
        return await closed_loop(p, debate)
    finally:
        await model.aclose()


async def serve_loop(p: Params, proc: subprocess.Popen[bytes], url: str, workdir: Path, route: str) -> Loop:
    """``route`` ``api``: POST /v1/debates and its SSE stream to debate_done; ``chat``: a streamed
    chat completion read to [DONE]; ``responses``: a streamed response read to response.completed."""
    chat = {
        "model": "moot/affirmative-critical",
        "messages": [
            *({"role": "user", "content": f"[{c.source}] {c.text}"} for c in TASK.context),
            {"role": "user", "content": TASK.question},
        ],
        "stream": True,
        "moot": {"rounds": 2, "budget": {"timeout_s": 600}},
    }
    async with contextlib.AsyncExitStack() as stack:
        # K clients, each with its own HTTP client (CLIENT_CONNECTIONS), each debate borrowing one:
        # closed_loop runs K debates at a time, so none waits for one.
        free = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0), limits=client_limits())
            )
            for _ in range(p.clients)
        ]
        await wait_up(free[0], proc, workdir)

        @contextlib.asynccontextmanager
        async def borrowed() -> AsyncIterator[httpx.AsyncClient]:
            client = free.pop()
            try:
                yield client
            finally:
                free.append(client)

        async def api_debate() -> None:
            async with borrowed() as client:
                response = await client.post("/v1/debates", json=BODY)
                response.raise_for_status()
                events = await follow(client, response.json()["id"])
            done = events[-1]
            if done[1] != "debate_done" or done[2]["status"] != "complete" or done[2]["totals"]["calls"] != 5:
                raise RuntimeError(f"a served debate did not complete normally: {done}")
            # Every turn's token deltas, put together, are the fake model's reply: none lost or misplaced.
            streamed: dict[tuple[str, int], str] = {}
            for _, name, data in events:
                if name == "token":
                    key = (data["speaker"], data["round"])
                    streamed[key] = streamed.get(key, "") + data["text"]
            if len(streamed) != CALLS_PER_DEBATE or any(text != REPLY for text in streamed.values()):
                raise RuntimeError(f"a served debate's token deltas are not its turns' replies: {sorted(streamed)}")

        async def chat_debate() -> None:
            text, finish = [], None
            async with borrowed() as client, client.stream("POST", "/v1/chat/completions", json=chat) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    for choice in json.loads(line[6:]).get("choices") or ():
                        text.append(choice["delta"].get("content") or "")
                        finish = choice.get("finish_reason") or finish
            if finish != "stop" or "".join(text) != REPLY:
                raise RuntimeError("a streamed chat completion did not end with the synthesis")

        responses = {
            "model": chat["model"],
            "input": chat["messages"],
            "stream": True,
            "moot": chat["moot"],
        }

        async def responses_debate() -> None:
            text, last = [], ""
            async with borrowed() as client, client.stream("POST", "/v1/responses", json=responses) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    event = json.loads(line[6:])
                    last = event["type"]
                    if last == "response.output_text.delta":
                        text.append(event["delta"])
            if last != "response.completed" or "".join(text) != REPLY:
                raise RuntimeError("a streamed response did not end with the synthesis")

        debates = {"api": api_debate, "chat": chat_debate, "responses": responses_debate}
        return await closed_loop(p, debates[route], lambda: process_cpu(proc.pid))


def where_of(p: Params) -> str:
    return (
        f"{p.clients} clients in a closed loop, {p.per_client} debates each after a warm-up, "
        f"fake server L={p.loop_latency:g} s"
    )


def cpu(loop: Loop, whose: str) -> str:
    return f"; {whose} CPU {1000 * loop.cpu / loop.debates:.1f} ms/debate"


def responses_row(p: Params, chat: Loop, responses: Loop) -> Row:
    """The Responses endpoint against the chat endpoint, the same debate streamed by each: the server's
    CPU per debate (what the endpoint itself costs; on a shared machine the rates swing with the load
    far more than the CPU does), with the rates beside it."""
    r_cpu, c_cpu = 1000 * responses.cpu / responses.debates, 1000 * chat.cpu / chat.debates
    ratio = r_cpu / c_cpu
    return Row(
        f"10. R against C: the server's CPU per debate for a streamed response read to response.completed, "
        f"against a streamed chat completion read to [DONE] ({where_of(p)}; debates/s: R {responses.rate:.2f}, "
        f"C {chat.rate:.2f}, {responses.rate / chat.rate:.2f}×)",
        f"{r_cpu:.1f} ms/debate",
        f"{c_cpu:.1f} ms/debate (C)",
        ratio,
        "≤ 1.10",
        verdict(ratio <= 1.10),
    )


def loop_rows(p: Params, ideal: Loop, engine: Loop, api: Loop, chat: Loop, responses: Loop) -> list[Row]:
    k = p.clients
    where = where_of(p)

    def served(name: str, loop: Loop) -> Row:
        ratio = loop.rate / ideal.rate
        clients = f"; the benchmark's clients' CPU {1000 * loop.client_cpu / loop.debates:.1f} ms/debate"
        return Row(
            f"{name} ({where}{cpu(loop, 'server')}{clients})", f"{loop.rate:.2f} debates/s",
            f"{ideal.rate:.2f} debates/s (I)", ratio, "≥ 0.85", verdict(ratio >= 0.85),
        )  # fmt: skip

    return [
        Row(
            f"6. I, the ideal client: the 5 streamed calls straight to the fake server ({where}{cpu(ideal, 'its')})",
            f"{ideal.rate:.2f} debates/s",
            f"{k / (3 * p.loop_latency):.2f} debates/s (K / (3 × L2), the latency alone)",
            ideal.rate / (k / (3 * p.loop_latency)),
            "—",
            "info",
        ),
        Row(
            f"7. E, the engine in this process ({where}{cpu(engine, 'its')})",
            f"{engine.rate:.2f} debates/s",
            f"{ideal.rate:.2f} debates/s (I)",
            engine.rate / ideal.rate,
            "—",
            "info",
        ),
        served("8. S, moot serve: POST /v1/debates + its SSE stream to debate_done", api),
        served("9. C, moot serve: a streamed chat completion read to [DONE]", chat),
        responses_row(p, chat, responses),
    ]


# ----------------------------------------------------------------------------------- output


def table(rows: list[Row]) -> str:
    lines = [
        "| measurement | measured | bound / baseline | ratio | target | verdict |",
        "| --- | ---: | ---: | ---: | :---: | :---: |",
    ]
    for r in rows:
        cells = [r.measurement, r.measured, r.bound, fmt_ratio(r.ratio), r.target, r.verdict]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rows_of(p: Params, a: InProcess, b: OverHttp) -> list[Row]:
    n = p.debates
    ratio = b.wall / a.wall
    over_cpu = b.server_cpu - a.cpu
    return [
        Row(
            f"1. wall time: {n} debates submitted over HTTP at once, each followed by an SSE client, until the "
            "last debate_done",
            f"{b.wall:.3f} s",
            f"{a.wall:.3f} s (the same {n} debates in-process, A)",
            ratio,
            "≤ 1.05",
            verdict(ratio <= 1.05),
        ),
        Row(
            f"2. server process CPU per debate (total {b.server_cpu:.2f} s; A's engine + SDK thread {a.cpu:.2f} s)",
            f"{1000 * b.server_cpu / n:.2f} ms",
            f"{1000 * a.cpu / n:.2f} ms (A)",
            b.server_cpu / a.cpu if a.cpu else None,
            "—",
            "info",
        ),
        Row(
            "3. the server's own overhead: (server CPU − A's CPU) per debate "
            f"({b.events} SSE events delivered: a turn's tokens go out gathered over 50 ms; {a.events} engine "
            "events in A)",
            f"{1000 * over_cpu / n:.2f} ms/debate",
            "—",
            None,
            "—",
            "info",
        ),
        Row(
            f"3b. the {n} HTTP and SSE clients' CPU (this process: POSTs, SSE parsing, checks), on the same cores",
            f"{b.client_cpu:.2f} s ({1000 * b.client_cpu / n:.2f} ms/debate)",
            "—",
            None,
            "—",
            "info",
        ),
        Row(
            "4. SSE events delivered to the clients per second (all debates' streams together; token events "
            "gathered, so fewer than the engine emits)",
            f"{b.events / b.wall:.0f} events/s",
            f"{a.events / a.wall:.0f} events/s (emitted in A)",
            None,
            "—",
            "info",
        ),
        Row(
            "5. lost: debates not complete in the store; events missing from a stream (id gaps, tokens that do "
            "not add up to the stored turn)",
            f"{b.lost_debates} debates, {b.lost_events} events",
            "0",
            None,
            "= 0",
            verdict(b.lost_debates == 0 and b.lost_events == 0),
        ),
    ]


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def header(p: Params, quick: bool) -> str:
    bound = p.debates * CALLS_PER_DEBATE * p.latency / p.concurrency
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return "\n".join(
        [
            "# moot serve benchmark" + (" (--quick)" if quick else ""),
            "",
            f"- machine: {platform.system()} {platform.machine()}, os.cpu_count()={os.cpu_count()}, "
            f"CPUs usable by this process={cpus}, Python {platform.python_version()}",
            f"- load average at start (1/5/15 min): {load_average()} (the machine is shared: read the ratios)",
            f"- {p.debates} debates of affirmative_critical(rounds=2) ({CALLS_PER_DEBATE} calls each, ~120-word "
            f"replies streamed word by word), one openai: model with C={p.concurrency} calls at once, fake server "
            f"(own process) L={p.latency:g} s; bound calls × L / C = {bound:.2f} s",
            f"- closed loop (rows 6-10): K={p.clients} clients, M={p.per_client} debates each after a warm-up, "
            f"fake server L2={p.loop_latency:g} s, model concurrency 2K",
        ]
    )


def parse_args(argv: list[str] | None = None) -> tuple[Params, bool]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="50 debates instead of 200")
    ap.add_argument("--debates", type=int, default=None, help="debates per run (default 200; --quick 50)")
    ap.add_argument("--concurrency", type=int, default=16, help="C: calls at once to the model (default 16)")
    ap.add_argument("--latency", type=float, default=0.5, help="L: the fake server's latency, s (default 0.5)")
    ap.add_argument(
        "--part",
        choices=["open", "clients", "responses", "all"],
        default="all",
        help="which rows (default all; responses: row 10 alone, C and R three times each)",
    )
    ap.add_argument("--clients", type=int, default=64, help="K: clients in the closed loop (default 64)")
    ap.add_argument("--per-client", type=int, default=None, help="M: debates per client (default 3; --quick 1)")
    ap.add_argument(
        "--loop-latency", type=float, default=0.5, help="L2: the fake server's latency in the closed loop (default 0.5)"
    )
    args = ap.parse_args(argv)
    debates = args.debates or (50 if args.quick else 200)
    per_client = args.per_client or (1 if args.quick else 3)
    params = Params(debates, args.concurrency, args.latency, args.clients, per_client, args.loop_latency, args.part)
    return params, bool(args.quick)


def run_open(params: Params) -> str:
    fake, base_url = start_fake(params.latency)
    try:
        with tempfile.TemporaryDirectory(prefix="moot-bench-serve-") as tmp:
            a = asyncio.run(in_process(params, base_url))
            print(f"  A. in-process: {a.wall:.1f} s", file=sys.stderr, flush=True)
            proc, url = start_server(params.concurrency, params.debates, base_url, Path(tmp))
            try:
                b = asyncio.run(over_http(params, proc, url, Path(tmp)))
            finally:
                proc.terminate()
                proc.wait(30)
            print(f"  B. over HTTP: {b.wall:.1f} s ({b.statuses})", file=sys.stderr, flush=True)
    finally:
        fake.terminate()
        fake.wait(10)
    return table(rows_of(params, a, b))


def served_loops(params: Params, base_url: str, tmp: Path, routes: tuple[str, ...]) -> dict[str, Loop]:
    loops: dict[str, Loop] = {}
    for route in routes:
        # A fresh server for each route, so that none inherits another's store or logs.
        proc, url = start_server(2 * params.clients, params.clients, base_url, tmp / route)
        try:
            loops[route] = asyncio.run(serve_loop(params, proc, url, tmp / route, route))
        finally:
            proc.terminate()
            proc.wait(30)
        print(f"  {route}: {loops[route].rate:.2f} debates/s", file=sys.stderr, flush=True)
    return loops


def run_clients(params: Params) -> str:
    fake, base_url = start_fake(params.loop_latency)
    try:
        with tempfile.TemporaryDirectory(prefix="moot-bench-serve-") as tmp:
            ideal = asyncio.run(ideal_client(params, base_url))
            print(f"  I. ideal client: {ideal.rate:.2f} debates/s", file=sys.stderr, flush=True)
            engine = asyncio.run(engine_loop(params, base_url))
            print(f"  E. engine: {engine.rate:.2f} debates/s", file=sys.stderr, flush=True)
            loops = served_loops(params, base_url, Path(tmp), ("api", "chat", "responses"))
    finally:
        fake.terminate()
        fake.wait(10)
    return table(loop_rows(params, ideal, engine, loops["api"], loops["chat"], loops["responses"]))


def run_responses(params: Params, repeats: int = 3) -> str:
    """Row 10 alone: the chat endpoint and the Responses endpoint on the same debate, each
    measured ``repeats`` times in alternating order (on a shared machine the first of two runs in a
    row was up to 30% faster whichever it was), pooled."""
    fake, base_url = start_fake(params.loop_latency)
    runs: dict[str, list[Loop]] = {"chat": [], "responses": []}
    try:
        with tempfile.TemporaryDirectory(prefix="moot-bench-serve-") as tmp:
            for i in range(repeats):
                order = ("chat", "responses") if i % 2 == 0 else ("responses", "chat")
                for route, loop in served_loops(params, base_url, Path(tmp) / str(i), order).items():
                    runs[route].append(loop)
    finally:
        fake.terminate()
        fake.wait(10)

    def pooled(loops: list[Loop]) -> Loop:
        return Loop(
            sum(x.debates for x in loops), sum(x.wall for x in loops), sum(x.cpu for x in loops),
            sum(x.client_cpu for x in loops),
        )  # fmt: skip

    chat, responses = pooled(runs["chat"]), pooled(runs["responses"])

    def each(loops: list[Loop]) -> str:
        return ", ".join(f"{x.rate:.2f}/s {1000 * x.cpu / x.debates:.1f} ms" for x in loops)

    note = f"\n\nEach route {repeats} times, alternating, pooled; chat: {each(runs['chat'])}; responses: " + each(
        runs["responses"]
    )
    return table([responses_row(params, chat, responses)]) + note


def main(argv: list[str] | None = None) -> None:
    params, quick = parse_args(argv)
    print(header(params, quick), flush=True)
    t0 = time.perf_counter()
    if params.part in ("open", "all"):
        print()
        print(run_open(params), flush=True)
    if params.part in ("clients", "all"):
        print()
        print(run_clients(params), flush=True)
    if params.part == "responses":
        print()
        print(run_responses(params), flush=True)
    print()
    print(f"total benchmark time: {time.perf_counter() - t0:.1f} s; load average at end: {load_average()}")


if __name__ == "__main__":
    main()
