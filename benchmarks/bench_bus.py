"""The latency an event adds on its way through the live bus: Redis against the in-process bus.

    .venv/bin/python benchmarks/bench_bus.py [--events N] [--runs R] [--gap-ms G] [--redis URL]

One publisher and one subscriber in this process, as two replicas would be: with Redis, two
:class:`~moot.server.state.bus.RedisBus` clients (``XADD`` by the publisher's task, ``XREAD BLOCK``
by the subscriber) on a throwaway ``redis-server`` on loopback (or ``--redis``); in-process, one
:class:`~moot.server.state.bus.InProcessBus`. Each event carries the ``perf_counter_ns`` of its
``publish()`` call; the subscriber takes the time it receives it. N events (default 2,000), one every
G ms (default 1: latency, not throughput), ``token`` events as a debate streams them, then the
``debate_done`` that ends the subscription. Prints, per run and bus, p50 / p99 / max in
microseconds, and the load average (the machine is shared: read the spread across runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from moot.server.state import Write, now, open_store
from moot.server.state.bus import Bus, BusEvent, InProcessBus, RedisBus


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_redis(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server") or shutil.which("redis-server", path="/usr/bin:/usr/sbin")
    if binary is None:
        sys.exit("redis-server is not installed: apt-get install -y redis-server (or give --redis URL)")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import redis

    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(300):
        try:
            redis.Redis.from_url(url).ping()
            return proc, url
        except redis.RedisError:
            time.sleep(0.02)
    proc.kill()
    sys.exit("redis-server did not answer")


async def one_run(publisher: Bus, subscriber: Bus, store_path: Path, events: int, gap_s: float) -> list[float]:
    """Microseconds from publish() to receipt, per event."""
    store = open_store(store_path)
    debate_id = uuid.uuid4().hex
    store.create(debate_id, protocol="p", question="Q?", model="m", request={})
    store.write_one(Write(debate_id, None, started=now()))
    latencies: list[float] = []

    async def follow() -> None:
        async for batch in subscriber.subscribe(store, debate_id, 0):
            arrived = time.perf_counter_ns()
            for e in batch:
                latencies.append((arrived - json.loads(e.data)["t"]) / 1000)

    reader = asyncio.create_task(follow())
    await asyncio.sleep(0.2)  # the subscriber is waiting before the first event
    text = "word " * 3
    for i in range(1, events + 1):
        name = "debate_done" if i == events else "token"
        data = json.dumps({"speaker": "a", "round": 1, "text": text, "t": time.perf_counter_ns()})
        publisher.publish(debate_id, [BusEvent(i, name, data)])
        await asyncio.sleep(gap_s)
    await asyncio.wait_for(reader, 60)
    store.close()
    return latencies


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--gap-ms", type=float, default=1.0)
    parser.add_argument("--redis", default=None, help="a Redis URL to use instead of a throwaway redis-server")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="moot-bench-bus-"))
    proc = None
    url = args.redis
    if url is None:
        proc, url = start_redis(root)
    print("# moot serve's live bus: the latency of an event, Redis against in-process\n")
    print(
        f"- machine: {platform.system()} {platform.machine()}, os.cpu_count()={os.cpu_count()}, "
        f"Python {platform.python_version()}"
    )
    print("- load average at start (1/5/15 min): " + " / ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"- {args.events} events per run, one every {args.gap_ms} ms, {args.runs} runs; microseconds\n")
    print("| run | bus | p50 µs | p99 µs | max µs | load (1 min) |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    p50s: dict[str, list[float]] = {"in-process": [], "redis": []}
    p99s: dict[str, list[float]] = {"in-process": [], "redis": []}
    try:
        for run in range(1, args.runs + 1):
            for kind in ("in-process", "redis"):
                pub: Bus
                sub: Bus
                if kind == "in-process":
                    pub = sub = InProcessBus()
                else:
                    pub, sub = RedisBus(url), RedisBus(url)
                lat = await one_run(pub, sub, root / f"{kind}-{run}.sqlite", args.events, args.gap_ms / 1000)
                await pub.aclose()
                if sub is not pub:
                    await sub.aclose()
                assert len(lat) == args.events, f"{kind}: {len(lat)} of {args.events} events arrived"
                p50s[kind].append(pct(lat, 0.50))
                p99s[kind].append(pct(lat, 0.99))
                print(
                    f"| {run} | {kind} | {pct(lat, 0.5):.0f} | {pct(lat, 0.99):.0f} | {max(lat):.0f} | "
                    f"{os.getloadavg()[0]:.2f} |"
                )
        print()
        for kind in ("in-process", "redis"):
            print(
                f"- {kind}: p50 median {statistics.median(p50s[kind]):.0f} µs (runs {min(p50s[kind]):.0f}-"
                f"{max(p50s[kind]):.0f}), p99 median {statistics.median(p99s[kind]):.0f} µs (runs "
                f"{min(p99s[kind]):.0f}-{max(p99s[kind]):.0f})"
            )
        added50 = statistics.median(p50s["redis"]) - statistics.median(p50s["in-process"])
        added99 = statistics.median(p99s["redis"]) - statistics.median(p99s["in-process"])
        print(f"- added by Redis (medians of the runs): p50 {added50:.0f} µs, p99 {added99:.0f} µs")
        print("- load average at end (1/5/15 min): " + " / ".join(f"{x:.2f}" for x in os.getloadavg()))
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
