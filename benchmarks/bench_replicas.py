"""``moot serve`` replicas on PostgreSQL + Redis behind HAProxy, against the single SQLite process;
and a chaos run of three replicas killed and stopped under load (issue 40, items 8 and 9).

    .venv/bin/python benchmarks/bench_replicas.py [--runs R] [--clients K] [--seconds S] [--latency L]
        [--configs sqlite-1,pg-1,pg-2,pg-3]
    .venv/bin/python benchmarks/bench_replicas.py --chaos [--debates N] [--clients K] [--every S] [--lease S]

**The benchmark.** K clients (default 64) in a closed loop, each posting a debate (``POST
/v1/debates``, ``affirmative-critical`` with 2 rounds: 5 model calls, ~120-word replies streamed)
and reading its SSE stream to ``debate_done``, then the next. The model is the loopback fake OpenAI
server in a process of its own, L seconds a call (default 0.2). Configurations:

- ``sqlite-1``: one ``moot serve`` on a SQLite file, as today, the clients straight to it;
- ``pg-N`` (N = 1, 2, 3): N replicas on one PostgreSQL database and one Redis (``--redis``), behind
  Debian's HAProxy (docs/scale-out.md's configuration, round-robin).

PostgreSQL, Redis and HAProxy are throwaway processes in temporary folders on free loopback ports
(:mod:`moot.testing.services`), torn down at the end; each run gets a fresh database. Once every
client has ended one debate (a replica's first debates pay for its imports) and the warm-up has
passed, a window of S seconds (default 40) is measured: the model calls answered in it, as debates
per second (calls / 5 / S: the debates that end in it come in waves, the calls do not), the p99 of
the debates' latency (POST to the end of the stream; each client's first left out), and the CPU
(user + system, psutil) of the replica process(es), of PostgreSQL (the postmaster and every
backend), of Redis, of HAProxy and of the clients (this process) per model call (the calls the fake
server answered in the window; its own CPU is left out); and per call, PostgreSQL's committed
transactions and Redis's commands. Every configuration runs R times (default 3), the order rotated
each time, the load average beside each.

**The chaos run** (``--chaos``): three replicas on PostgreSQL + Redis behind HAProxy with a short
lease (``--lease``, default 5 s), K clients (default 24) posting debates through the balancer and
following their streams, reconnecting with ``Last-Event-ID`` whenever a stream breaks, until N
debates (default 500) have been accepted; meanwhile, every ``--every`` seconds (default 5) a random
running replica gets ``kill -9`` (it is started again at once) or ``SIGSTOP`` (``SIGCONT`` after the
lease and 2 s more). Each replica process calls the fake model under a path of its own, so the
fake model's request log says which process made each call. Then, from the store, the request log
and the clients' logs: (i) every debate in the store ended done (complete), failed, cancelled or
timed out, with a reason; (ii) no turn recorded twice (the transcript's and the ``turn_done``
events'); (iii) no debate ran on two replicas at once: the processes that called the model for a
debate follow each other (none calls again once another has), in the order of its ``resumed``
events, and a recorded turn's prompt went to the model more than once only when a take-over cut
it; (iv) no client saw an event id twice or out of order, or missed a stored event (the id jump of
a take-over, ``TAKEOVER_ID_GAP``, is not a gap), or got a ``debate_done`` the store does not hold.
Each client sends an ``Idempotency-Key`` per debate, so a POST retried after its answer was lost
starts no second debate. Exit 1 naming the debates when one fails; the logs of a failed run are
kept (the replicas', the fake model's, each client's events), in the folder it names, as ``--keep``
keeps them; and every run lists the store troubles the replicas logged (a write the store could not
take: the events held for it reach the streams unstored meanwhile).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import itertools
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from httpx_sse import aconnect_sse

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import CALLS_PER_DEBATE, REPLY, TASK

from moot.testing.services import HAProxy, Missing, Postgres, Redis, free_port

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-bench-replicas-0000000000"
ENDED = ("complete", "failed", "cancelled", "timeout")

#: The fake model in a process of its own: ``GET /stats`` gives the calls answered; with a log
#: path, one JSON line per call: arrival and end times, the path's first segment (which replica
#: process called), the debate's marker in the prompt, the prompt's hash, and whether it was answered.
FAKE_SERVER = r"""
import hashlib, json, re, sys, time
from moot.testing.fake_openai import FakeOpenAIServer

reply = sys.stdin.read()
log = open(sys.argv[2], "a", buffering=1) if len(sys.argv) > 2 else None
MARK = re.compile(r"\[q-[0-9a-z-]+\]")


class Logged(FakeOpenAIServer):
    calls = 0

    async def _respond(self, method, path, headers, body, writer):
        if method == "GET" and path == "/stats":
            await self._send(writer, 200, json.dumps({"calls": self.calls}).encode())
            return True
        self.requests.clear()  # (kept by the base class for tests: not needed here, and it grows)
        t0, ok = time.time(), False
        try:
            ok = await super()._respond(method, path, headers, body, writer)
            self.calls += 1
            return ok
        finally:
            if log is not None and method == "POST":
                text = json.dumps(json.loads(body or b"{}").get("messages"), sort_keys=True)
                mark = MARK.search(text)
                log.write(json.dumps({
                    "t0": t0, "t1": time.time(), "who": path.strip("/").split("/")[0], "ok": ok,
                    "debate": mark.group(0) if mark else None,
                    "prompt": hashlib.sha1(text.encode()).hexdigest(),
                }) + "\n")


server = Logged(latency=float(sys.argv[1]), reply=lambda request: reply).start()
print(server.port, flush=True)
while True:
    time.sleep(3600)
"""


def env() -> dict[str, str]:
    src = str(ROOT / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""), "OPENAI_API_KEY": KEY}


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def start_fake(latency: float, log: Path | None = None) -> tuple[subprocess.Popen[str], int]:
    args = [sys.executable, "-c", FAKE_SERVER, str(latency), *([str(log)] if log else [])]
    # (its stderr: asyncio says "socket.send() raised exception" for each reply to a killed replica)
    proc = subprocess.Popen(
        args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env()
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(REPLY)
    proc.stdin.close()
    return proc, int(proc.stdout.readline())


def stop(proc: subprocess.Popen[Any] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def body(marker: str) -> dict[str, Any]:
    return {
        "question": f"{TASK.question} {marker}",
        "context": [c.model_dump(exclude_none=True) for c in TASK.context],
        "rounds": 2,
        "budget": {"timeout_s": 600},
    }


@dataclass
class Replica:
    """One ``moot serve`` process; each start is a new *incarnation* (``r<index>g<generation>``),
    which calls the fake model under a path of its own."""

    index: int
    port: int
    args: list[str]
    fake_port: int
    folder: Path
    generation: int = 0
    proc: subprocess.Popen[bytes] | None = None
    stopped: bool = False
    #: Every incarnation: its name and pid.
    incarnations: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"r{self.index}g{self.generation}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.generation += 1
        base = f"http://127.0.0.1:{self.fake_port}/{self.name}/v1"
        args = ["serve", "--port", str(self.port), "--base-url", base, *self.args]
        with (self.folder / f"{self.name}.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "from moot.cli.main import main; main()", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env(),
            )
        self.stopped = False
        self.incarnations[self.name] = self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self) -> str:
        return (self.folder / f"{self.name}.log").read_text(errors="replace")[-2000:]


#: What a replica logs when its store could not take a write (the write is tried again; the events
#: it held for it meanwhile reach the streams unstored) or refused one (the debate is stopped).
STORE_TROUBLE = ("the store cannot be reached", "a write to the store failed")


def store_trouble(folder: Path) -> list[str]:
    """The replicas' logged store troubles (:data:`STORE_TROUBLE`), by replica: a stream that got a
    stored kind of event the store does not hold may have got it then."""
    found = {
        log.stem: sum(
            1 for line in log.read_text(errors="replace").splitlines() if any(t in line for t in STORE_TROUBLE)
        )
        for log in sorted(folder.glob("r*g*.log"))
    }
    troubled = {name: n for name, n in found.items() if n}
    detail = ", ".join(f"{name}: {n}" for name, n in troubled.items()) or "none"
    return [f"- store troubles the replicas logged (an outage, its writes tried again; a write refused): {detail}"]


async def wait_up(client: httpx.AsyncClient, replica: Replica, within: float = 180) -> None:
    deadline = time.monotonic() + within
    while True:
        if not replica.alive():
            raise RuntimeError(f"replica {replica.name} exited; its log ends:\n{replica.log_tail()}")
        with contextlib.suppress(httpx.TransportError):
            if (await client.get(replica.url + "/v1/protocols", timeout=5)).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"replica {replica.name} did not answer within {within:g} s:\n{replica.log_tail()}")
        await asyncio.sleep(0.2)


# -------------------------------------------------------------------------------------------- CPU


class CpuOf:
    """The CPU seconds (user + system) of processes: fixed pids, or a root and its descendants
    (PostgreSQL's postmaster and backends). Sampled while the window runs, so a process that ends
    inside it still counts up to its last sample."""

    def __init__(self, pids: list[int], *, tree: bool = False) -> None:
        self.roots = pids
        self.tree = tree
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}

    def _procs(self) -> list[psutil.Process]:
        out: list[psutil.Process] = []
        for pid in self.roots:
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                out.append(p)
                if self.tree:
                    out += p.children(recursive=True)
        return out

    def sample(self, *, start: bool = False) -> None:
        for p in self._procs():
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                cpu = t.user + t.system
                if start:
                    self.first[p.pid] = cpu
                elif p.pid not in self.first:
                    self.first[p.pid] = 0.0  # born in the window: all of its CPU is the window's
                self.last[p.pid] = cpu

    def seconds(self) -> float:
        return sum(self.last[pid] - self.first.get(pid, 0.0) for pid in self.last)


# ------------------------------------------------------------------------------------ benchmark


@dataclass
class Sample:
    config: str
    run: int
    debates: int
    seconds: float
    latencies: list[float]
    calls: int
    cpu: dict[str, float]
    pg_xacts: int
    redis_commands: int
    load: float
    failed: int

    @property
    def rate(self) -> float:
        """The model calls answered in the window, as debates (5 calls each): the debates ended in the
        window come in waves (64 started together end together), the calls do not."""
        return self.calls / CALLS_PER_DEBATE / self.seconds

    def p99(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")

    def per_call_ms(self, whose: str) -> float:
        return 1000 * self.cpu.get(whose, 0.0) / self.calls if self.calls else float("nan")


async def follow_to_end(client: httpx.AsyncClient, debate_id: str) -> dict[str, Any]:
    done: dict[str, Any] = {}
    async with aconnect_sse(client, "GET", f"/v1/debates/{debate_id}/events") as source:
        async for sse in source.aiter_sse():
            if sse.event == "debate_done":
                done = json.loads(sse.data)
    return done


def pg_xacts(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()
        return int(row[0]) if row else 0


def redis_commands(url: str) -> int:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return int(client.info("stats")["total_commands_processed"])
    finally:
        client.close()


async def measure(
    config: str,
    run: int,
    args: argparse.Namespace,
    pg: Postgres,
    rds: Redis,
    fake_port: int,
    folder: Path,
) -> Sample:
    kind, n = config.split("-")
    replicas_n = int(n)
    common = [
        "--models", "openai:bench", "--model-concurrency", "256", "--max-running", str(args.clients),
        "--max-queued", "1024", "--log-level", "warning",
    ]  # fmt: skip
    db_url = ""
    if kind == "sqlite":
        common += ["--db", str(folder / "bench.sqlite")]
    else:
        db_url = pg.url(pg.create_database())
        common += ["--db", db_url, "--redis", rds.url]
    replicas = [Replica(i + 1, free_port(), common, fake_port, folder) for i in range(replicas_n)]
    balancer: HAProxy | None = None
    limits = httpx.Limits(max_connections=4 * args.clients, max_keepalive_connections=4 * args.clients)
    try:
        for r in replicas:
            r.start()
        async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as probe:
            for r in replicas:
                await wait_up(probe, r)
        if kind == "pg":
            balancer = HAProxy([r.port for r in replicas]).start()
            url = balancer.url
        else:
            url = replicas[0].url
        cpu = {
            "replicas": CpuOf([r.proc.pid for r in replicas if r.proc is not None]),
            "postgres": CpuOf([pg.pid], tree=True) if kind == "pg" else CpuOf([]),
            "redis": CpuOf([rds.pid]) if kind == "pg" else CpuOf([]),
            "haproxy": CpuOf([balancer.pid]) if balancer is not None else CpuOf([]),
            "clients": CpuOf([os.getpid()]),
        }
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0), limits=limits) as client:
            fake = f"http://127.0.0.1:{fake_port}/stats"
            t_start = time.perf_counter()
            # The window opens once every client has ended a debate and the warm-up has passed: a
            # replica's first debates pay for its imports and its model's HTTP clients.
            window: list[float] = []
            warm: set[int] = set()
            errors: list[str] = []
            ended: list[tuple[float, float, str]] = []

            def running() -> bool:
                return not window or time.perf_counter() < window[1]

            async def one_client(k: int) -> None:
                i = 0
                while running():
                    i += 1
                    began = time.perf_counter()
                    try:
                        posted = await client.post("/v1/debates", json=body(f"[q-{run}-{k}-{i}]"))
                        posted.raise_for_status()
                        done = await follow_to_end(client, posted.json()["id"])
                    except Exception as exc:  # (a 503 from the balancer while a replica is slow to answer)
                        errors.append(f"{type(exc).__name__}: {exc}")
                        await asyncio.sleep(1)
                        continue
                    if k in warm:  # (a client's first debate pays for the replicas' warm-up)
                        ended.append((time.perf_counter(), time.perf_counter() - began, str(done.get("status"))))
                    warm.add(k)

            async def sampler() -> tuple[int, int, int]:
                while (len(warm) < args.clients and time.perf_counter() < t_start + 300) or (  # noqa: ASYNC110
                    time.perf_counter() < t_start + args.warmup
                ):
                    await asyncio.sleep(0.2)
                for c in cpu.values():
                    c.sample(start=True)
                calls0 = (await client.get(fake)).json()["calls"]
                x0 = pg_xacts(db_url) if db_url else 0
                c0 = redis_commands(rds.url) if db_url else 0
                window.extend([time.perf_counter(), time.perf_counter() + args.seconds])
                while time.perf_counter() < window[1]:
                    await asyncio.sleep(min(1.0, max(0.0, window[1] - time.perf_counter())))
                    for c in cpu.values():
                        c.sample()
                calls1 = (await client.get(fake)).json()["calls"]
                x1 = pg_xacts(db_url) if db_url else 0
                c1 = redis_commands(rds.url) if db_url else 0
                return calls1 - calls0, x1 - x0, c1 - c0

            clients = [asyncio.create_task(one_client(k)) for k in range(args.clients)]
            calls, xacts, commands = await sampler()
            load = os.getloadavg()[0]
            await asyncio.gather(*clients)
            if errors:
                print(f"  {config} run {run}: {len(errors)} client error(s), e.g. {errors[0]}", file=sys.stderr)
        t0, t1 = window
        # Every debate but each client's first: those that ended after the window started under its load too.
        inside = [(t, lat, s) for t, lat, s in ended if t >= t0]
        return Sample(
            config,
            run,
            len(inside),
            t1 - t0,
            [lat for _, lat, _ in inside],
            calls,
            {k: c.seconds() for k, c in cpu.items()},
            xacts,
            commands,
            load,
            sum(1 for _, _, s in inside if s != "complete"),
        )
    finally:
        if balancer is not None:
            balancer.stop()
        for r in replicas:
            stop(r.proc)


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    med = statistics.median(values)
    return f"{fmt.format(med)} ({fmt.format(min(values))}–{fmt.format(max(values))})"


WHOSE = ("replicas", "postgres", "redis", "haproxy", "clients")


def report(samples: list[Sample], configs: list[str]) -> None:
    print("\n## Each run\n")
    print(
        "| config | run | debates/s | p99 s | calls | replica(s) ms/call | PostgreSQL ms/call | Redis ms/call "
        "| HAProxy ms/call | clients ms/call | PG xacts/call | Redis cmds/call | failed | load (1 min) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for s in samples:
        cells = [f"{s.per_call_ms(w):.2f}" for w in WHOSE]
        print(
            f"| {s.config} | {s.run} | {s.rate:.2f} | {s.p99():.2f} | {s.calls} | " + " | ".join(cells)
            + f" | {s.pg_xacts / s.calls:.2f} | {s.redis_commands / s.calls:.2f} | {s.failed} | {s.load:.2f} |"
        )  # fmt: skip
    print("\n## Per configuration: median of the runs (min–max)\n")
    print(
        "| config | debates/s | p99 s | replica(s) ms/call | per replica ms/call | PostgreSQL ms/call | Redis ms/call "
        "| HAProxy ms/call | all but the model and clients, ms/call | load (1 min) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    by: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by[s.config].append(s)
    for config in configs:
        ss = by[config]
        if not ss:
            continue
        server = [sum(s.per_call_ms(w) for w in WHOSE[:4]) for s in ss]
        print(
            f"| {config} | {spread([s.rate for s in ss])} | {spread([s.p99() for s in ss])} | "
            f"{spread([s.per_call_ms('replicas') for s in ss])} | "
            f"{spread([s.per_call_ms('replicas') for s in ss])} | "
            f"{spread([s.per_call_ms('postgres') for s in ss])} | {spread([s.per_call_ms('redis') for s in ss])} | "
            f"{spread([s.per_call_ms('haproxy') for s in ss])} | {spread(server)} | "
            f"{spread([s.load for s in ss])} |"
        )
    # The replica CPU per call is the sum over the replicas, which together make every call: it is
    # already "per replica-call"; the column is repeated to read the goal against.
    if by.get("sqlite-1") and by.get("pg-1"):
        base = statistics.median(s.per_call_ms("replicas") for s in by["sqlite-1"])
        print("\n## The goal: a replica's CPU per model call on PostgreSQL + Redis ≤ 1.3× the SQLite process's\n")
        for config in configs:
            if config.startswith("pg") and by.get(config):
                mine = [s.per_call_ms("replicas") for s in by[config]]
                ratio = statistics.median(mine) / base
                pairs = [
                    a.per_call_ms("replicas") / b.per_call_ms("replicas")
                    for a, b in zip(by[config], by["sqlite-1"], strict=False)
                ]
                print(
                    f"- {config}: {statistics.median(mine):.2f} ms/call against {base:.2f} (sqlite-1): "
                    f"**{ratio:.2f}×** (run by run {', '.join(f'{p:.2f}' for p in pairs)}) "
                    f"{'MET' if ratio <= 1.3 else 'NOT MET'}"
                )


async def bench(args: argparse.Namespace) -> None:
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in configs:
        kind, _, n = c.partition("-")
        if kind not in ("sqlite", "pg") or not n.isdigit() or (kind == "sqlite" and n != "1"):
            sys.exit(f"unknown configuration {c!r}: use sqlite-1 or pg-N (N replicas)")
    print("# moot serve replicas: PostgreSQL + Redis behind HAProxy, against one process on SQLite\n")
    print(
        f"- machine: {platform.system()} {platform.machine()}, os.cpu_count()={os.cpu_count()}, "
        f"Python {platform.python_version()}; the cores are shared by every process below"
    )
    print(f"- load average at start (1/5/15 min): {load_average()}")
    print(
        f"- {args.clients} clients in a closed loop (POST /v1/debates, SSE to debate_done), affirmative-critical "
        f"rounds=2 ({CALLS_PER_DEBATE} calls, ~120-word replies streamed), fake model L={args.latency:g} s in "
        f"its own process (its CPU left out); warm-up {args.warmup:g} s, window {args.seconds:g} s; "
        f"{args.runs} runs per configuration, order rotated"
    )
    samples: list[Sample] = []
    with tempfile.TemporaryDirectory(prefix="moot-bench-replicas-") as tmp:
        fake, fake_port = start_fake(args.latency)
        try:
            with Postgres() as pg, Redis() as rds:
                for run in range(1, args.runs + 1):
                    shift = (run - 1) % len(configs)
                    for config in configs[shift:] + configs[:shift]:
                        folder = Path(tmp) / f"{config}-{run}"
                        folder.mkdir()
                        s = await measure(config, run, args, pg, rds, fake_port, folder)
                        samples.append(s)
                        cells = " ".join(f"{w} {s.per_call_ms(w):.2f}" for w in WHOSE)
                        print(
                            f"  run {run} {config}: {s.rate:.2f} debates/s, p99 {s.p99():.2f} s, calls {s.calls}, "
                            f"ms/call: {cells}; PG xacts/call {s.pg_xacts / s.calls:.2f}, Redis cmds/call "
                            f"{s.redis_commands / s.calls:.2f}, failed {s.failed}, load {s.load:.2f}",
                            file=sys.stderr,
                            flush=True,
                        )
        finally:
            stop(fake)
    report(samples, configs)
    print(f"\n- load average at end (1/5/15 min): {load_average()}")


# ---------------------------------------------------------------------------------------- chaos


@dataclass
class Followed:
    """One client's debate: its id, the event ids and names it saw, in order, and its reconnects."""

    marker: str
    debate_id: str
    seen: list[tuple[int, str]] = field(default_factory=list)
    #: For each event seen, the number of the connection it came on (0: the first).
    connection: list[int] = field(default_factory=list)
    reconnects: int = 0
    done: bool = False


@dataclass
class Chaos:
    accepted: list[Followed] = field(default_factory=list)
    post_retries: int = 0
    actions: list[tuple[float, str, str]] = field(default_factory=list)
    stop_new: bool = False


async def chaos_client(client: httpx.AsyncClient, k: int, state: Chaos, target: int) -> None:
    i = 0
    while not state.stop_new and len(state.accepted) < target:
        i += 1
        marker = f"[q-c{k}-{i}]"
        # One key per debate, on every attempt: a POST whose answer was lost (its replica killed) and
        # is sent again gets the debate it started, not a second one.
        key = {"Idempotency-Key": str(uuid.uuid4())}
        debate_id = None
        give_up = time.monotonic() + 600
        while time.monotonic() < give_up:
            try:
                posted = await client.post("/v1/debates", json=body(marker), headers=key, timeout=httpx.Timeout(10.0))
            except httpx.HTTPError:
                state.post_retries += 1
                await asyncio.sleep(0.5)
                continue
            if posted.status_code == 202:
                debate_id = posted.json()["id"]
                break
            state.post_retries += 1
            await asyncio.sleep(0.5)
        if debate_id is None:
            raise RuntimeError(f"client {k}: no replica accepted a debate in 10 minutes")
        f = Followed(marker, debate_id)
        state.accepted.append(f)
        deadline = time.monotonic() + 900
        while not f.done and time.monotonic() < deadline:
            headers = {"Last-Event-ID": str(f.seen[-1][0])} if f.seen else {}
            try:
                async with aconnect_sse(
                    client, "GET", f"/v1/debates/{debate_id}/events", headers=headers,
                    timeout=httpx.Timeout(10.0, read=15.0),
                ) as source:  # fmt: skip
                    async for sse in source.aiter_sse():
                        # (httpx_sse gives a keep-alive comment as an empty event with the last id: skipped)
                        if sse.id and sse.data:
                            f.seen.append((int(sse.id), sse.event))
                            f.connection.append(f.reconnects)
                        if sse.event == "debate_done":
                            f.done = True
            except Exception:  # the replica died or stopped: reconnect through the balancer
                pass
            if not f.done:
                f.reconnects += 1
                await asyncio.sleep(0.3)


async def chaos_monkey(replicas: list[Replica], state: Chaos, every: float, pause: float, rng: random.Random) -> None:
    t_start = time.monotonic()
    while not state.stop_new:
        await asyncio.sleep(every)
        # Only replicas that answer (a restarted one takes a while to import on a loaded machine),
        # and never the last one that does.
        healthy = []
        for r in replicas:
            if r.alive() and not r.stopped:
                with contextlib.suppress(httpx.HTTPError):
                    async with httpx.AsyncClient(timeout=2.0) as probe:
                        if (await probe.get(r.url + "/v1/protocols")).status_code == 200:
                            healthy.append(r)
        if len(healthy) < 2:
            continue
        victim = rng.choice(healthy)
        assert victim.proc is not None
        if rng.random() < 0.5:
            victim.proc.kill()
            victim.proc.wait()
            state.actions.append((time.monotonic() - t_start, "kill -9", victim.name))
            victim.start()
        else:
            os.kill(victim.proc.pid, signal.SIGSTOP)
            victim.stopped = True
            state.actions.append((time.monotonic() - t_start, "SIGSTOP", victim.name))

            async def resume(r: Replica = victim, proc: subprocess.Popen[bytes] = victim.proc) -> None:
                await asyncio.sleep(pause)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                r.stopped = False

            asyncio.get_running_loop().create_task(resume())


def check_chaos(state: Chaos, store: Any, fake_log: Path, replicas: list[Replica]) -> tuple[list[str], list[str]]:
    """The four invariants: (lines of the report, the failures naming their debates)."""
    from moot.server.state import StoredEvent

    lines: list[str] = []
    bad: list[str] = []
    by_marker = {f.marker: f for f in state.accepted}
    name_of_pid = {pid: name for r in replicas for name, pid in r.incarnations.items()}
    calls: dict[str, list[dict[str, Any]]] = defaultdict(list)
    t_first = float("inf")
    for line in fake_log.read_text().splitlines():
        c = json.loads(line)
        calls[c["debate"]].append(c)
        t_first = min(t_first, c["t0"])

    rows = store.page(status=None, limit=100000, before=None)
    statuses = Counter(r.status for r in rows)
    lines.append(f"- debates in the store: {len(rows)} ({dict(statuses)}); accepted by clients: {len(state.accepted)}")
    known = {f.debate_id for f in state.accepted}
    orphans = [r.id for r in rows if r.id not in known]
    lines.append(f"- debates a client never learned of (a POST retried after its answer was lost): {len(orphans)}")

    # (i) each ended, with a reason
    unended = [r.id for r in rows if r.status not in ENDED]
    no_reason = [r.id for r in rows if r.status in ("failed", "cancelled", "timeout") and not (r.error or "").strip()]
    missing = [f.debate_id for f in state.accepted if store.get(f.debate_id, with_result=False) is None]
    lines.append(
        f"- (i) not ended: {len(unended)}; failed/cancelled/timeout without a reason: {len(no_reason)}; "
        f"accepted but not in the store: {len(missing)}"
    )
    for what, ids in (("not ended", unended), ("no reason", no_reason), ("missing", missing)):
        bad += [f"(i) {what}: {i}" for i in ids]
    reasons = Counter((r.error or "")[:90] for r in rows if r.status != "complete")
    for reason, n in reasons.most_common(5):
        lines.append(f"  - {n} × {reason}")

    # (ii) no turn twice; (iii) one replica at a time; (iv) the clients' event ids
    from moot.server.state.manager import TAKEOVER_ID_GAP

    twice = rerun = overlap = gaps = dups = reused = foreign_end = 0
    jumps = 0
    phantom: Counter[str] = Counter()
    phantom_debates = 0
    takeovers = 0
    repeats_explained = same_process = 0
    for row in rows:
        d = store.get(row.id)
        events: list[StoredEvent] = store.events(row.id)
        result = d.result if d is not None else None
        turns = [] if result is None else [*(t for t in result.turns()), *result.decision_turns]
        keys = [(t.speaker, t.round, t.kind) for t in turns]
        done_keys = []
        resumed = []
        for e in events:
            if e.name == "turn_done":
                t = json.loads(e.data)["turn"]
                done_keys.append((t["speaker"], t["round"], t["kind"]))
            elif e.name == "resumed":
                resumed.append(json.loads(e.data))
        takeovers += len(resumed)
        if len(keys) != len(set(keys)) or len(done_keys) != len(set(done_keys)):
            twice += 1
            bad.append(f"(ii) a turn recorded twice: {row.id}")
        marker = row.question.rsplit(" ", 1)[-1]
        mine = sorted(calls.get(marker, []), key=lambda c: c["t0"])
        # The processes that called the model for it, in order (A, B, A: A called again after B had).
        order: list[str] = []
        for c in mine:
            if not order or order[-1] != c["who"]:
                order.append(c["who"])
        # Each stint of a process but its first (which may be the debate's start) must be a take-over
        # by it: a resumed event naming it. A stint more is a process calling the model for a debate
        # another has taken over. (A process absent from the resumed events, whose claim left none
        # because it was killed first, is no evidence either way.)
        took = Counter(name_of_pid.get(int(str(r["replica"]).split(":")[-2]), "?") for r in resumed)
        extra = {w: n - took[w] - (1 if w == order[0] else 0) for w, n in Counter(order).items()}
        if any(n > 0 for n in extra.values()):
            overlap += 1
            late = [c for c in mine if extra.get(c["who"], 0) > 0]
            bad.append(
                f"(iii) {' → '.join(order)} called the model, take-overs by {dict(took)}: a process called it "
                f"for a debate another had taken over ({marker}, its last call {late[-1]['t0'] - t_first:.1f} s "
                f"into the run): {row.id}"
            )
        # A recorded turn's prompt: sent once, or again only by the process that took it over.
        sent = Counter(c["prompt"] for c in mine)
        for t in turns:
            h = hashlib.sha1(
                json.dumps([{"role": m.role, "content": m.content} for m in t.messages], sort_keys=True).encode()
            ).hexdigest()
            if sent[h] > 1:
                rerun += 1
                senders = [c["who"] for c in mine if c["prompt"] == h]
                if len(set(senders)) < len(senders):
                    same_process += 1
                if sent[h] <= 1 + len(resumed):
                    repeats_explained += 1
                else:
                    bad.append(f"(iii) a recorded turn's prompt sent {sent[h]}× by {senders}: {row.id}")
        f = by_marker.get(marker)
        if f is not None:
            ids = [i for i, _ in f.seen]
            if ids != sorted(set(ids)):
                dups += 1
                bad.append(f"(iv) a client saw an event id twice or out of order: {row.id} ({ids})")
            # A take-over numbers its events TAKEOVER_ID_GAP above the last it found: a jump, not a
            # gap (a gap is a stored event the client never got, counted below).
            jumps += sum(1 for a, b in itertools.pairwise(ids) if b - a >= TAKEOVER_ID_GAP)
            # Events a client got that the store does not hold (token deltas aside: never stored):
            # sent by a replica whose lease had gone, or by one killed before its next write.
            held = {e.id: e.name for e in events}
            unheld = [(i, n) for i, n in f.seen if n != "token" and held.get(i) != n]
            if unheld:
                phantom_debates += 1
                phantom.update(n for _, n in unheld)
                # The events a replica stores as they come reach its streams once stored: one the
                # store does not hold is a turn (or an end) a client saw that never happened.
                if any(n in ("debate_started", "turn_done", "round_done", "debate_done") for _, n in unheld):
                    bad.append(
                        f"(iv) a client got a turn's or round's end the store does not hold {unheld[:8]}: {row.id}"
                    )
            seen = dict(f.seen)
            lost = [e.id for e in events if seen.get(e.id) != e.name]
            if lost:
                gaps += 1
                if all(seen.get(i) is not None for i in lost):
                    reused += 1  # each id it missed, it had seen as another event: the id was given twice
                if f.seen and f.seen[-1][1] == "debate_done" and seen.get(events[-1].id) != "debate_done":
                    foreign_end += 1  # its stream ended with a debate_done the store does not hold
                bad.append(
                    f"(iv) a client missed stored events {lost[:8]} (saw {[(i, seen.get(i)) for i in lost[:8]]}): "
                    f"{row.id}"
                )
    lines.append(f"- (ii) debates with a turn recorded twice: {twice}")
    lines.append(
        f"- (iii) take-overs (resumed events): {takeovers}; debates for which a process called the model after "
        f"another had taken the debate over, with no take-over back: {overlap}; recorded turns whose prompt went "
        f"to the model more than once: {rerun} ({repeats_explained} within the bound of one more sending per "
        f"take-over of the debate: a call in flight when its replica was killed, stopped or fenced, run again by "
        f"the next holder; {same_process} of them sent twice by one process, which had taken the debate back)"
    )
    reconnects = sum(f.reconnects for f in state.accepted)
    lines.append(
        f"- (iv) client streams: {len(state.accepted)}, reconnects with Last-Event-ID: {reconnects}; with an id "
        f"twice or out of order: {dups}; missing a stored event: {gaps} (in {reused} of them every id missed had "
        f"come as another event: ids given twice, by the replica that stopped and the one that went on; "
        f"{foreign_end} ended on a debate_done that is not the stored one); id jumps of a take-over "
        f"(+{TAKEOVER_ID_GAP:,} or more, not gaps): {jumps}; streams that got events the store does not hold "
        f"(token deltas aside): {phantom_debates} ({dict(phantom)}). Token deltas are not stored, so those a stream "
        f"missed around a take-over or with Redis down are not counted: allowed by design (each turn_done "
        f"carries the turn's whole text)"
    )
    return lines, bad


async def chaos(args: argparse.Namespace) -> int:
    print("# moot serve chaos run: 3 replicas on PostgreSQL + Redis behind HAProxy, killed and stopped\n")
    print(f"- machine: {platform.system()} {platform.machine()}, os.cpu_count()={os.cpu_count()}")
    print(f"- load average at start (1/5/15 min): {load_average()}")
    pause = args.lease + 2.0
    print(
        f"- {args.clients} clients, until {args.debates} debates are accepted; every {args.every:g} s a random "
        f"running replica gets kill -9 (started again at once) or SIGSTOP (SIGCONT {pause:g} s later); "
        f"--lease {args.lease:g} --poll {args.poll:g}; fake model L={args.latency:g} s"
    )
    rng = random.Random(args.seed)
    from moot.server.state.postgres import PostgresStore

    lines: list[str] = []
    bad: list[str] = []
    with tempfile.TemporaryDirectory(prefix="moot-chaos-") as tmp:
        folder = Path(tmp)
        fake_log = folder / "fake.jsonl"
        fake, fake_port = start_fake(args.latency, fake_log)
        replicas: list[Replica] = []
        balancer: HAProxy | None = None
        try:
            with Postgres() as pg, Redis() as rds:
                db_url = pg.url(pg.create_database())
                common = [
                    "--db", db_url, "--redis", rds.url, "--models", "openai:bench", "--model-concurrency", "256",
                    "--max-running", "16", "--max-queued", "1024", "--lease", str(args.lease),
                    "--poll", str(args.poll), "--log-level", "warning",
                ]  # fmt: skip
                replicas = [Replica(i + 1, free_port(), common, fake_port, folder) for i in range(3)]
                for r in replicas:
                    r.start()
                limits = httpx.Limits(max_connections=4 * args.clients, max_keepalive_connections=4 * args.clients)
                async with httpx.AsyncClient(limits=limits) as probe:
                    for r in replicas:
                        await wait_up(probe, r)
                balancer = HAProxy([r.port for r in replicas], inter="1s").start()
                state = Chaos()
                t0 = time.monotonic()
                async with httpx.AsyncClient(base_url=balancer.url, limits=limits) as client:
                    clients = [
                        asyncio.create_task(chaos_client(client, k, state, args.debates)) for k in range(args.clients)
                    ]
                    monkey = asyncio.create_task(chaos_monkey(replicas, state, args.every, pause, rng))
                    while len(state.accepted) < args.debates and not all(c.done() for c in clients):  # noqa: ASYNC110
                        await asyncio.sleep(0.5)
                    state.stop_new = True
                    await monkey
                    await asyncio.sleep(pause)  # every stopped replica is continued
                    for r in replicas:
                        if r.proc is not None:
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(r.proc.pid, signal.SIGCONT)
                        if not r.alive():
                            r.start()
                    results = await asyncio.gather(*clients, return_exceptions=True)
                    for res in results:
                        if isinstance(res, BaseException):
                            print(f"- a client failed: {type(res).__name__}: {res}")
                elapsed = time.monotonic() - t0
                store = PostgresStore(db_url, application_name="moot chaos check")
                try:
                    deadline = time.monotonic() + 300
                    while store.unfinished() and time.monotonic() < deadline:  # noqa: ASYNC110
                        await asyncio.sleep(1)
                    await asyncio.sleep(1)  # the fake model's last log lines
                    kills = sum(1 for _, a, _ in state.actions if a == "kill -9")
                    print(
                        f"- {elapsed:.0f} s; {len(state.actions)} actions ({kills} kill -9, "
                        f"{len(state.actions) - kills} SIGSTOP); POSTs retried: {state.post_retries}; "
                        f"load average at end: {load_average()}"
                    )
                    print("- actions: " + ", ".join(f"{t:.0f}s {a} {n}" for t, a, n in state.actions))
                    lines, bad = check_chaos(state, store, fake_log, replicas)
                    lines += store_trouble(Path(tmp))
                    if args.keep or bad:  # what each client saw, by connection, beside the store's events
                        with (Path(tmp) / "clients.jsonl").open("w", encoding="utf-8") as out:
                            for f in state.accepted:
                                stored = [(e.id, e.name) for e in store.events(f.debate_id)]
                                seen = list(zip(f.seen, f.connection, strict=True))
                                row = {"debate": f.debate_id, "seen": seen, "stored": stored}
                                out.write(json.dumps(row) + "\n")
                finally:
                    store.close()
        finally:
            if balancer is not None:
                balancer.stop()
            for r in replicas:
                stop(r.proc)
            stop(fake)
            keep = args.keep
            if keep is None and bad:  # a failure's logs outlive the run, to find its cause
                keep = Path(tempfile.mkdtemp(prefix="moot-chaos-failed-"))
                lines.append(f"- a failure: the replicas' and the fake model's logs are kept in {keep}")
            if keep is not None:
                import shutil

                shutil.copytree(tmp, keep, dirs_exist_ok=True)
    print("\n".join(lines))
    if bad:
        print(f"\nFAILED: {len(bad)} invariant violation(s):")
        for b in bad:
            print(f"  {b}")
        return 1
    print("\nevery invariant held")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chaos", action="store_true", help="the chaos run instead of the benchmark")
    ap.add_argument("--clients", type=int, default=None, help="clients (default 64; --chaos 24)")
    ap.add_argument("--latency", type=float, default=0.2, help="the fake model's latency per call, s (default 0.2)")
    ap.add_argument("--runs", type=int, default=3, help="runs per configuration (default 3)")
    ap.add_argument("--seconds", type=float, default=40.0, help="the measured window, s (default 40)")
    ap.add_argument("--warmup", type=float, default=8.0, help="before the window, s (default 8)")
    ap.add_argument("--configs", default="sqlite-1,pg-1,pg-2,pg-3", help="default sqlite-1,pg-1,pg-2,pg-3")
    ap.add_argument("--debates", type=int, default=500, help="--chaos: debates to accept (default 500)")
    ap.add_argument("--every", type=float, default=5.0, help="--chaos: seconds between faults (default 5)")
    ap.add_argument("--lease", type=float, default=5.0, help="--chaos: the replicas' --lease (default 5)")
    ap.add_argument("--poll", type=float, default=0.5, help="--chaos: the replicas' --poll (default 0.5)")
    ap.add_argument("--seed", type=int, default=40, help="--chaos: the faults' random seed")
    ap.add_argument(
        "--keep",
        default=None,
        help="--chaos: copy the logs to this folder (replicas', fake model's, and clients.jsonl: "
        "each client's events by connection, beside the store's)",
    )
    args = ap.parse_args(argv)
    if args.clients is None:
        args.clients = 24 if args.chaos else 64
    try:
        if args.chaos:
            return asyncio.run(chaos(args))
        asyncio.run(bench(args))
    except Missing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
