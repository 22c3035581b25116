"""Benchmarks of the debate engine, measured against bounds, in one run.

    .venv/bin/python benchmarks/bench_engine.py [--quick] [--embedded-model NAME] [--skip-embedded]

Prints one Markdown table: measurement | measured | bound / baseline | ratio | target | verdict.
Every target is a ratio to a bound or a baseline measured in the same run, never an absolute
time: the machines this runs on are shared and noisy.

1. Single-debate latency: ``affirmative_critical(rounds=2)`` over HTTP against the loopback fake
   OpenAI server with a fixed latency L. Its critical path is 3 sequential calls (round 1 and
   round 2 in parallel pairs, then the synthesis), so the bound is 3 x L.
2. Throughput: many concurrent debates through ONE model with a concurrency limit C against the
   fake server with latency L. The bound is calls x L / C: the time if the limiter never idled.
3. Engine CPU per model call: debates on a zero-latency scripted model (no network), measured
   with ``time.process_time()``, minus the scripted model's own cost for the same requests.
4. Embedded llama.cpp: 4 calls at once (parallel slots) against the same 4 calls one at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import statistics
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from moot.core.engine import Engine
from moot.core.spec import ProtocolSpec
from moot.core.types import ContextChunk, DebateResult, DebateTask
from moot.models.base import ChatRequest, ChatResponse, Message
from moot.models.openai_compat import OpenAICompatModel
from moot.models.scripted import ScriptedModel
from moot.protocols.affirmative_critical import affirmative_critical
from moot.testing.fake_openai import FakeOpenAIServer

# A reply of realistic size (about 120 words, under the protocol's 500-token turn limit, so the
# engine never trims it): the same text from the fake server and from the scripted model.
REPLY = (
    "The context supports a qualified yes. Passage [1] reports a measured reduction in latency "
    "when requests are batched, and passage [2] confirms the effect on a second workload, although "
    "with a smaller sample. Passage [3] is the main caveat: it notes that the gain disappears when "
    "the queue is rarely full, which is the common case for interactive traffic. Weighing these, "
    "batching is worth enabling for offline and bulk jobs, where queues stay deep, and worth "
    "measuring before enabling for interactive endpoints. The evidence does not cover tail "
    "latency at all, so any claim about p99 behaviour would go beyond what the passages show. "
    "A careful rollout would start with the bulk pipeline, record both median and tail latency, "
    "and only then consider the interactive path, keeping a switch to turn batching off again."
)

TASK = DebateTask(
    question="Should we enable request batching on our inference service?",
    context=[
        ContextChunk(text="Batching cut median latency by 31% on the nightly embedding job.", source="report-a"),
        ContextChunk(text="A second team saw a 12% gain on summarisation, over 40 runs.", source="report-b"),
        ContextChunk(text="With shallow queues, batching brought no measurable gain.", source="report-c"),
        ContextChunk(text="Unrelated: the cluster was upgraded last week.", source="changelog"),
    ],
)

CALLS_PER_DEBATE = 5  # affirmative_critical(rounds=2): 2 rounds x 2 agents + 1 synthesis
CRITICAL_PATH_CALLS = 3  # round 1, round 2, synthesis


@dataclass(frozen=True)
class Params:
    latency_l: float
    latency_reps: int
    tp_debates: int
    tp_concurrency: int
    tp_latency: float
    stress_debates: int
    stress_latency: float
    cpu_debates: int
    embedded_model: str | None
    embedded_calls: int
    embedded_max_tokens: int
    embedded_reps: int


@dataclass
class Row:
    measurement: str
    measured: str
    bound: str
    ratio: float | None
    target: str
    verdict: str


def spec() -> ProtocolSpec:
    return affirmative_critical(rounds=2, timeout_s=None)


def fmt_ratio(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio:.3f}"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def check(result: DebateResult) -> None:
    if result.status != "complete" or result.llm_calls != CALLS_PER_DEBATE:
        raise RuntimeError(f"a benchmark debate did not complete normally: {result.status} {result.error}")


def fake_reply(_request: dict[str, object]) -> str:
    return REPLY


# ------------------------------------------------------------------------------ 1. latency


async def bench_latency(p: Params) -> list[Row]:
    with FakeOpenAIServer(latency=p.latency_l, reply=fake_reply) as server:
        model = OpenAICompatModel("bench", base_url=server.base_url, api_key="sk-bench")
        engine = Engine(spec(), model)
        try:
            check(await engine.run(TASK))  # warm-up: opens the keep-alive connections
            times: list[float] = []
            for _ in range(p.latency_reps):
                t0 = time.perf_counter()
                result = await engine.run(TASK)
                times.append(time.perf_counter() - t0)
                check(result)
        finally:
            await model.aclose()
    median = statistics.median(times)
    bound = CRITICAL_PATH_CALLS * p.latency_l
    ratio = median / bound
    return [
        Row(
            f"1. single debate latency, median of {p.latency_reps} (min {min(times):.3f} s, max {max(times):.3f} s)",
            f"{median:.3f} s",
            f"{bound:.3f} s (3 × L)",
            ratio,
            "≤ 1.10",
            verdict(ratio <= 1.10),
        )
    ]


# ---------------------------------------------------------------------------- 2. throughput


@dataclass(frozen=True)
class ThroughputRun:
    debates: int
    concurrency: int
    latency: float
    wall: float
    cpu: float
    client_cpu: float
    max_in_flight: int

    @property
    def calls(self) -> int:
        return self.debates * CALLS_PER_DEBATE

    @property
    def bound(self) -> float:
        return self.calls * self.latency / self.concurrency


async def run_throughput(n: int, c: int, lat: float) -> ThroughputRun:
    with FakeOpenAIServer(latency=lat, reply=fake_reply) as server:
        model = OpenAICompatModel("bench", base_url=server.base_url, api_key="sk-bench", max_concurrency=c)
        engine = Engine(spec(), model)
        try:
            # Warm-up: C calls at once open the C keep-alive connections the timed run reuses.
            warm = ChatRequest(messages=[Message(role="user", content="warm-up")], max_tokens=8)
            await asyncio.gather(*(model.complete(warm) for _ in range(c)))
            server.max_in_flight = 0
            served_before = len(server.requests)
            gc.collect()
            cpu0, client0 = time.process_time(), time.thread_time()
            t0 = time.perf_counter()
            results = await asyncio.gather(*(engine.run(TASK) for _ in range(n)))
            wall = time.perf_counter() - t0
            # The event loop, hence the engine and the SDK client, runs in this thread; the fake
            # server runs in its own thread of the same process (sharing the GIL).
            cpu, client_cpu = time.process_time() - cpu0, time.thread_time() - client0
            for r in results:
                check(r)
            served = len(server.requests) - served_before
            max_in_flight = server.max_in_flight
        finally:
            await model.aclose()
    run = ThroughputRun(n, c, lat, wall, cpu, client_cpu, max_in_flight)
    if served != run.calls:
        raise RuntimeError(f"the server saw {served} calls, expected {run.calls}")
    return run


def fifo_waves(debates: int, c: int) -> int:
    """Waves of C calls a perfect FIFO limiter needs for the debates, with zero overhead.

    Only the dependencies count: a debate's round-2 pair waits for its round-1 pair, its synthesis
    for its round-2 pair. Shows how much of the ratio the protocol's structure (the tail) explains.
    """
    queue: deque[tuple[int, int]] = deque((d, 1) for d in range(debates) for _ in range(2))
    remaining: dict[tuple[int, int], int] = {}
    waves = 0
    while queue:
        batch = [queue.popleft() for _ in range(min(c, len(queue)))]
        waves += 1
        for debate, stage in batch:
            key = (debate, stage)
            remaining[key] = remaining.get(key, 2 if stage < 3 else 1) - 1
            if remaining[key] == 0 and stage < 3:
                queue.extend([(debate, stage + 1)] * (2 if stage == 1 else 1))
    return waves


async def bench_throughput(p: Params) -> list[Row]:
    main = await run_throughput(p.tp_debates, p.tp_concurrency, p.tp_latency)
    stress = await run_throughput(p.stress_debates, p.tp_concurrency, p.stress_latency)
    c, lat = main.concurrency, main.latency
    ratio = main.wall / main.bound
    rate, ceiling = main.calls / main.wall, c / lat
    s_ratio = stress.wall / stress.bound
    return [
        Row(
            f"2a. throughput: {main.debates} concurrent debates ({main.calls} calls), one model, "
            f"C={c}, L={lat:g} s: wall time",
            f"{main.wall:.3f} s",
            f"{main.bound:.3f} s (calls × L / C; zero-overhead FIFO schedule: "
            f"{fifo_waves(main.debates, c) * lat:.3f} s)",
            ratio,
            "≤ 1.15",
            verdict(ratio <= 1.15),
        ),
        Row(
            f"2b. throughput: calls/s (CPU per call: {1000 * main.client_cpu / main.calls:.2f} ms engine + SDK "
            f"client, {1000 * main.cpu / main.calls:.2f} ms with the in-process server)",
            f"{rate:.1f} calls/s",
            f"{ceiling:.1f} calls/s (C / L)",
            rate / ceiling,
            "≥ 0.87 (= 1 / 1.15)",
            verdict(rate / ceiling >= 1 / 1.15),
        ),
        Row(
            "2c. throughput: server's max_in_flight during 2a",
            str(main.max_in_flight),
            f"{c} (C)",
            main.max_in_flight / c,
            "= C",
            verdict(main.max_in_flight == c),
        ),
        Row(
            f"2d. stress: 2a with L={stress.latency:g} s ({stress.debates} debates, C / L = "
            f"{stress.concurrency / stress.latency:.0f} calls/s); CPU {stress.cpu:.2f} s "
            f"({1000 * stress.client_cpu / stress.calls:.2f} ms engine + SDK client, "
            f"{1000 * stress.cpu / stress.calls:.2f} ms with server, per call); max_in_flight {stress.max_in_flight}",
            f"{stress.wall:.3f} s ({stress.calls / stress.wall:.0f} calls/s)",
            f"{stress.bound:.3f} s (calls × L / C; zero-overhead FIFO schedule: "
            f"{fifo_waves(stress.debates, stress.concurrency) * stress.latency:.3f} s)",
            s_ratio,
            "≤ 1.15",
            verdict(s_ratio <= 1.15),
        ),
    ]


# ------------------------------------------------------------------------------- 3. CPU time


def scripted_reply(_request: ChatRequest) -> str:
    return REPLY


async def cpu_of(fn: Callable[[], Awaitable[None]]) -> float:
    gc.collect()
    t0 = time.process_time()
    await fn()
    return time.process_time() - t0


async def bench_cpu(p: Params) -> list[Row]:
    n = p.cpu_debates
    model = ScriptedModel(fn=scripted_reply, latency=0)
    engine = Engine(spec(), model)
    for _ in range(20):  # warm-up: imports, caches, first-use allocations
        check(await engine.run(TASK))
    model.requests.clear()

    async def debates() -> None:
        for _ in range(n):
            check(await engine.run(TASK))

    debate_cpu = await cpu_of(debates)
    requests = list(model.requests)
    calls = len(requests)
    if calls != n * CALLS_PER_DEBATE:
        raise RuntimeError(f"expected {n * CALLS_PER_DEBATE} calls, the model saw {calls}")

    # The model's own cost: the very same requests, sent straight to a fresh scripted model.
    direct = ScriptedModel(fn=scripted_reply, latency=0)
    sink: list[ChatResponse] = []

    async def direct_calls() -> None:
        for request in requests:
            sink.append(await direct.complete(request))

    direct_cpu = await cpu_of(direct_calls)
    per_call = 1000 * debate_cpu / calls
    model_per_call = 1000 * direct_cpu / calls
    overhead = per_call - model_per_call
    return [
        Row(
            f"3a. CPU per model call inside debates ({n} debates, {calls} calls, scripted model, latency 0)",
            f"{per_call:.3f} ms",
            "—",
            None,
            "—",
            "info",
        ),
        Row(
            f"3b. scripted model's own CPU per call (the same {calls} requests, direct complete())",
            f"{model_per_call:.3f} ms",
            "—",
            None,
            "—",
            "info",
        ),
        Row(
            "3c. engine overhead per model call = 3a − 3b",
            f"{overhead:.3f} ms",
            "1 ms (target)",
            overhead / 1.0,
            "< 1 ms",
            verdict(overhead < 1.0),
        ),
    ]


# ------------------------------------------------------------------------------- 4. embedded

EMBEDDED_PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Give three practical tips for writing clear technical documentation.",
    "Describe how a hash table handles collisions.",
    "Summarise the main causes of the French Revolution.",
    "What are the trade-offs between SQL and NoSQL databases?",
    "Write a short paragraph about the history of the bicycle.",
    "Explain what a compiler does, step by step.",
    "List the benefits of regular exercise for mental health.",
]


async def bench_embedded(p: Params) -> list[Row]:
    from moot.models.embedded import EmbeddedModel, slots_for

    assert p.embedded_model is not None
    model = EmbeddedModel(p.embedded_model)
    t_load = time.perf_counter()
    await asyncio.to_thread(model.load)
    load_s = time.perf_counter() - t_load
    n = p.embedded_calls
    requests = [
        ChatRequest(
            messages=[
                Message(role="system", content="You are a helpful assistant."),
                Message(role="user", content=EMBEDDED_PROMPTS[i % len(EMBEDDED_PROMPTS)]),
            ],
            max_tokens=p.embedded_max_tokens,
            temperature=0.0,
        )
        for i in range(n)
    ]
    await model.complete(requests[0])  # warm-up

    async def sequential() -> list[ChatResponse]:
        return [await model.complete(r) for r in requests]

    async def parallel() -> list[ChatResponse]:
        return list(await asyncio.gather(*(model.complete(r) for r in requests)))

    seq_runs: list[tuple[float, int]] = []
    par_runs: list[tuple[float, int]] = []
    for rep in range(p.embedded_reps):
        # Alternate which mode goes first, so a drift in machine load hits both alike.
        order = [(sequential, seq_runs), (parallel, par_runs)]
        if rep % 2:
            order.reverse()
        for run, into in order:
            t0 = time.perf_counter()
            responses = await run()
            wall = time.perf_counter() - t0
            into.append((wall, sum(r.usage.completion_tokens for r in responses)))

    def median_run(runs: list[tuple[float, int]]) -> tuple[float, int]:
        return sorted(runs)[len(runs) // 2]

    seq_wall, seq_tokens = median_run(seq_runs)
    par_wall, par_tokens = median_run(par_runs)
    seq_rate, par_rate = seq_tokens / seq_wall, par_tokens / par_wall
    ratio = par_wall / seq_wall
    name = f"embedded:{model.info.name}"
    slots = slots_for(model.info)
    reps = f"median of {p.embedded_reps}" if p.embedded_reps > 1 else "1 run"
    common = f"{n} calls, max_tokens={p.embedded_max_tokens}, temperature 0, {reps}"
    return [
        Row(
            f"4a. {name}: {common}, one at a time (load {load_s:.1f} s, excluded)",
            f"{seq_wall:.3f} s ({seq_tokens} tokens, {seq_rate:.1f} tok/s)",
            "—",
            None,
            "—",
            "info",
        ),
        Row(
            f"4b. {name}: the same {n} calls at once ({slots} llama.cpp slots)",
            f"{par_wall:.3f} s ({par_tokens} tokens, {par_rate:.1f} tok/s)",
            f"{seq_wall:.3f} s (4a)",
            ratio,
            "< 1.0",
            verdict(ratio < 1.0),
        ),
        Row(
            f"4c. {name}: aggregate generation rate, parallel vs one at a time",
            f"{par_rate:.1f} tok/s",
            f"{seq_rate:.1f} tok/s (4a)",
            par_rate / seq_rate,
            "> 1.0",
            verdict(par_rate > seq_rate),
        ),
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


def usable_cpus() -> int | None:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def header(p: Params, quick: bool) -> str:
    emb = (
        f"{p.embedded_model}, {p.embedded_calls} calls, max_tokens={p.embedded_max_tokens}, {p.embedded_reps} rep(s)"
        if p.embedded_model
        else "skipped"
    )
    return "\n".join(
        [
            "# moot engine benchmark" + (" (--quick)" if quick else ""),
            "",
            f"- machine: {platform.system()} {platform.machine()}, os.cpu_count()={os.cpu_count()}, "
            f"CPUs usable by this process={usable_cpus()}, "
            f"Python {platform.python_version()} ({platform.python_implementation()})",
            f"- load average at start (1/5/15 min): {load_average()} (the machine is shared: read the ratios, "
            "not the absolute times)",
            "- protocol: affirmative_critical(rounds=2, timeout_s=None): 5 calls per debate, critical path 3 calls",
            f"- 1. latency: fake OpenAI server L={p.latency_l:g} s, 1 warm-up + {p.latency_reps} timed debates",
            f"- 2. throughput: {p.tp_debates} concurrent debates, one OpenAICompatModel, "
            f"max_concurrency C={p.tp_concurrency}, fake server L={p.tp_latency:g} s; "
            f"stress (2d): {p.stress_debates} debates, same C, L={p.stress_latency:g} s",
            f"- 3. CPU: {p.cpu_debates} sequential debates on ScriptedModel(latency=0)",
            f"- 4. embedded: {emb}",
        ]
    )


def parse_args(argv: list[str] | None = None) -> tuple[Params, bool]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller counts: the whole run takes under a minute")
    ap.add_argument("--embedded-model", default="smollm2-135m", help="embedded model for row 4 (default smollm2-135m)")
    ap.add_argument("--skip-embedded", action="store_true", help="leave out the embedded llama.cpp rows")
    ap.add_argument("--concurrency", type=int, default=16, help="C of the throughput rows (default 16)")
    ap.add_argument("--throughput-latency", type=float, default=0.5, help="L of rows 2a-2c, s (default 0.5)")
    args = ap.parse_args(argv)
    quick: bool = args.quick
    params = Params(
        latency_l=0.2,
        latency_reps=3 if quick else 7,
        tp_debates=64 if quick else 200,
        tp_concurrency=args.concurrency,
        tp_latency=args.throughput_latency,
        stress_debates=100 if quick else 200,
        stress_latency=0.05,
        cpu_debates=300 if quick else 2000,
        embedded_model=None if args.skip_embedded else args.embedded_model,
        embedded_calls=4,
        embedded_max_tokens=32 if quick else 64,
        embedded_reps=1 if quick else 3,
    )
    return params, quick


async def run_all(p: Params) -> list[Row]:
    # CPU first, while no server thread or SDK client exists in the process; rows print in order.
    steps: list[Callable[[Params], Awaitable[list[Row]]]] = [bench_cpu, bench_latency, bench_throughput]
    if p.embedded_model is not None:
        steps.append(bench_embedded)
    rows: list[Row] = []
    for step in steps:
        t0 = time.perf_counter()
        rows += await step(p)
        print(f"  {step.__name__}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return sorted(rows, key=lambda r: r.measurement.split(" ", 1)[0])


def main(argv: list[str] | None = None) -> None:
    params, quick = parse_args(argv)
    print(header(params, quick), flush=True)
    t0 = time.perf_counter()
    rows = asyncio.run(run_all(params))
    print()
    print(table(rows))
    print()
    print(f"total benchmark time: {time.perf_counter() - t0:.1f} s; load average at end: {load_average()}")


if __name__ == "__main__":
    main()
