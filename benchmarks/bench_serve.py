"""``moot serve`` against the same debates run in-process, in one run.

    .venv/bin/python benchmarks/bench_serve.py [--quick] [--debates N] [--concurrency C] [--latency L]

Prints one Markdown table: measurement | measured | bound / baseline | ratio | target | verdict.

The loopback fake OpenAI server runs in a process of its own with a fixed latency L. The same N
``affirmative_critical(rounds=2)`` debates (5 calls each, every reply ~120 words streamed word by
word, the question of ``bench_engine.py``) run twice, through one ``openai:`` model limited to C
calls at once:

A. in-process: N ``Engine.run`` at once in this process, with an event handler that counts the
   engine's events (so every call streams, as it does under the server);
B. over HTTP: ``moot serve`` in its own process (``--model-concurrency C --max-running N``); the N
   debates are submitted with ``POST /v1/debates`` at once and each is followed by its own SSE
   client on ``/v1/debates/{id}/events`` until ``debate_done``.

Rows: B's wall time against A's (target: HTTP adds at most 5%); the server process's CPU per
debate and per event beyond A's engine CPU; the events delivered to the SSE clients per second;
and what was lost: debates not complete in the store, events missing from a client's stream (ids
must run 1, 2, 3, ... without a gap) or whose tokens do not add up to the stored turn.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
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
    out: list[tuple[int, str, dict[str, Any]]] = []
    async with aconnect_sse(client, "GET", f"/v1/debates/{debate_id}/events") as source:
        async for sse in source.aiter_sse():
            if not sse.data:
                continue
            out.append((int(sse.id), sse.event, json.loads(sse.data)))
            if sse.event == "debate_done":
                break
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


def start_server(p: Params, base_url: str, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    args = [
        "serve", "--port", str(port), "--db", str(workdir / "bench.sqlite"), "--models", "openai:bench",
        "--base-url", base_url, "--model-concurrency", str(p.concurrency), "--max-running", str(p.debates),
        "--max-queued", "0", "--log-level", "warning",
    ]  # fmt: skip
    with (workdir / "serve.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from moot.cli.main import main; main()", *args], stdout=log, stderr=log, env=env()
        )
    return proc, f"http://127.0.0.1:{port}"


async def over_http(p: Params, proc: subprocess.Popen[bytes], url: str, workdir: Path) -> OverHttp:
    limits = httpx.Limits(
        max_connections=p.debates + 16, max_keepalive_connections=p.debates + 16, keepalive_expiry=2.0
    )
    # The server caps every debate's time; the in-process run has none, so ask for the most it allows.
    body = {
        "question": TASK.question,
        "context": [c.model_dump(exclude_none=True) for c in TASK.context],
        "budget": {"timeout_s": 600},
    }
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0), limits=limits) as client:
        deadline = time.monotonic() + 60
        while True:
            try:
                if (await client.get("/v1/protocols")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"moot serve did not start; see {workdir / 'serve.log'}")
            await asyncio.sleep(0.1)

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
            "3. the server's own overhead: (server CPU − A's CPU) per debate and per event "
            f"({b.events} events delivered, {a.events} emitted in A)",
            f"{1000 * over_cpu / n:.2f} ms/debate, {1e6 * over_cpu / max(1, b.events):.0f} µs/event",
            "—",
            None,
            "—",
            "info",
        ),
        Row(
            f"3b. the {n} HTTP and SSE clients' CPU (this process: POSTs, SSE parsing, checks), on the same cores",
            f"{b.client_cpu:.2f} s ({1e6 * b.client_cpu / max(1, b.events):.0f} µs/event)",
            "—",
            None,
            "—",
            "info",
        ),
        Row(
            "4. events delivered to the SSE clients per second (all debates' streams together)",
            f"{b.events / b.wall:.0f} events/s",
            f"{a.events / a.wall:.0f} events/s (emitted in A)",
            (b.events / b.wall) / (a.events / a.wall) if a.events else None,
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
        ]
    )


def parse_args(argv: list[str] | None = None) -> tuple[Params, bool]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="50 debates instead of 200")
    ap.add_argument("--debates", type=int, default=None, help="debates per run (default 200; --quick 50)")
    ap.add_argument("--concurrency", type=int, default=16, help="C: calls at once to the model (default 16)")
    ap.add_argument("--latency", type=float, default=0.5, help="L: the fake server's latency, s (default 0.5)")
    args = ap.parse_args(argv)
    debates = args.debates or (50 if args.quick else 200)
    return Params(debates, args.concurrency, args.latency), bool(args.quick)


def main(argv: list[str] | None = None) -> None:
    params, quick = parse_args(argv)
    print(header(params, quick), flush=True)
    t0 = time.perf_counter()
    fake, base_url = start_fake(params.latency)
    try:
        with tempfile.TemporaryDirectory(prefix="moot-bench-serve-") as tmp:
            a = asyncio.run(in_process(params, base_url))
            print(f"  A. in-process: {a.wall:.1f} s", file=sys.stderr, flush=True)
            proc, url = start_server(params, base_url, Path(tmp))
            try:
                b = asyncio.run(over_http(params, proc, url, Path(tmp)))
            finally:
                proc.terminate()
                proc.wait(30)
            print(f"  B. over HTTP: {b.wall:.1f} s ({b.statuses})", file=sys.stderr, flush=True)
    finally:
        fake.terminate()
        fake.wait(10)
    print()
    print(table(rows_of(params, a, b)))
    print()
    print(f"total benchmark time: {time.perf_counter() - t0:.1f} s; load average at end: {load_average()}")


if __name__ == "__main__":
    main()
