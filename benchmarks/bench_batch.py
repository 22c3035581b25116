"""Benchmarks of ``moot batch`` in this process and on Ray, in one run (``moot[ray]``).

    .venv/bin/python benchmarks/bench_batch.py [--quick] [--skip-embedded]

Prints one Markdown table. Every target is a ratio between two measurements of this run.

a. Ray's own overhead: the same batch of N debates (``affirmative-critical``, 2 rounds, 5 calls)
   against the loopback fake OpenAI server with latency L, in this process (C debates at once)
   and on ONE Ray actor (C debates at once). Both use one ``openai:`` model with its default
   limit of 8 calls at once, so the model's limiter, not the executor, sets the pace. Ray start-up
   (``ray.init`` and the actor's start) is measured apart and left out of the ratio.
b. Embedded: ``embedded:smollm2-135m`` (tiny turn budget), items/s of 2 single-thread actors
   (1 CPU each) against one process with 2 llama.cpp threads (the same items, the same slots).
c. Scaling on this machine: the fake server with a short latency stands in for remote models;
   throughput (calls/s) of 1..K actors against one process, to show where one process's CPU
   limit is lifted (and where this machine's own cores take over).

The fake server runs in a process of its own, so that its CPU is not charged to the driver.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

SERVER = """
import sys, time
from moot.testing.fake_openai import FakeOpenAIServer
text = "The evidence supports a qualified yes: batching helps bulk jobs, less so interactive ones. " * 4
server = FakeOpenAIServer(latency=float(sys.argv[1]), reply=lambda request: text).start()
print(server.base_url, flush=True)
sys.stdin.read()  # serve until the benchmark closes our stdin
"""


@dataclass
class Row:
    what: str
    measured: str
    baseline: str
    ratio: float | None
    target: str
    verdict: str


class FakeServer:
    """The fake OpenAI server in a subprocess with latency ``latency``."""

    def __init__(self, latency: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(latency)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.base_url = self.proc.stdout.readline().strip()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


def questions(n: int, tag: str) -> list[str]:
    return [f"Should service {tag}-{i} enable request batching?" for i in range(n)]


async def timed_batch(inputs: list[str], out: Path, executor: Any, **options: Any) -> tuple[float, int, int]:
    """Wall time, calls and failures of one batch through ``executor``."""
    from moot.batch import run_batch

    start = time.perf_counter()
    calls = failed = 0
    async for r in run_batch(inputs, out=out, executor=executor, **options):
        calls += r.calls
        failed += r.status != "ok"
    return time.perf_counter() - start, calls, failed


async def overhead_rows(args: argparse.Namespace, work: Path) -> list[Row]:
    from moot.models.registry import resolve_model
    from moot.scale import LocalExecutor
    from moot.scale.ray_backend import RayExecutor

    server = FakeServer(args.latency)
    try:
        opts = {"base_url": server.base_url, "api_key": "sk-bench"}
        common = {"model": "openai:fake", "timeout_s": 600.0}
        local = LocalExecutor(resolve_model("openai:fake", **opts), capacity=args.concurrency)
        # a warm-up batch opens the keep-alive connections (both sides get one)
        await timed_batch(questions(8, "warm"), work / "a-warm-local", local, **common)
        t_local, calls, failed_l = await timed_batch(questions(args.items, "a"), work / "a-local", local, **common)
        await local.model.aclose()
        start = time.perf_counter()
        pool = RayExecutor("openai:fake", address="local", workers=1, per_worker=args.concurrency, model_options=opts)
        await pool.start()
        t_start = time.perf_counter() - start
        try:
            await timed_batch(questions(8, "warm"), work / "a-warm-ray", pool, **common)
            t_ray, _, failed_r = await timed_batch(questions(args.items, "a"), work / "a-ray", pool, **common)
        finally:
            pool.close()
    finally:
        server.close()
    per_item_ms = (t_ray - t_local) / args.items * args.concurrency * 1000
    ratio = t_ray / t_local
    return [
        Row(f"a. {args.items} debates ({calls} calls), fake server L={args.latency:g} s, C={args.concurrency} debates "
            f"at once: ONE Ray actor vs this process (failed: {failed_r} vs {failed_l})",
            f"{t_ray:.2f} s", f"{t_local:.2f} s (in-process)", ratio, "< 1.05",
            "PASS" if ratio < 1.05 else "MISS"),
        Row("a'. Ray's added time per item (wall-time difference x C / items: the extra latency each debate saw)",
            f"{per_item_ms:.1f} ms", f"{3 * args.latency * 1000:.0f} ms (a debate's critical path, 3 x L)",
            per_item_ms / (3 * args.latency * 1000), "—", "info"),
        Row("a''. Ray start-up, left out of (a): connect + start one actor + build its model", f"{t_start:.1f} s",
            "—", None, "—", "info"),
    ]  # fmt: skip


async def embedded_rows(args: argparse.Namespace, work: Path) -> list[Row]:
    from moot.models.embedded import EmbeddedModel
    from moot.scale import LocalExecutor
    from moot.scale.ray_backend import RayExecutor

    common = {"model": "embedded:smollm2-135m", "rounds": 1, "max_tokens": 16, "timeout_s": 600.0}
    items = questions(args.embedded_items, "b")
    # one process, 2 llama.cpp threads (set before the model loads), loaded and warmed up first
    os.environ["MOOT_EMBEDDED_THREADS"] = "2"
    model = EmbeddedModel("smollm2-135m")
    await asyncio.to_thread(model.load)
    local = LocalExecutor(model, capacity=4)
    await timed_batch(questions(2, "warm"), work / "b-warm-local", local, **common)
    print("  b warm", file=sys.stderr, flush=True)
    t_local, calls_l, _ = await timed_batch(items, work / "b-local", local, **common)
    print(f"  b in-process: {t_local:.1f} s", file=sys.stderr, flush=True)
    tokens_local = _tokens(work / "b-local")
    # two actors of 1 CPU each: 1 thread each (the executor sets MOOT_EMBEDDED_THREADS per actor)
    pool = RayExecutor("embedded:smollm2-135m", address="local", workers=2, worker_cpus=1.0, per_worker=4)
    await pool.start()
    try:
        await timed_batch(questions(2, "warm"), work / "b-warm-ray", pool, **common)
        t_ray, calls_r, _ = await timed_batch(items, work / "b-ray", pool, **common)
    finally:
        pool.close()
    tokens_ray = _tokens(work / "b-ray")
    n = len(items)
    ips_l, ips_r = n / t_local, n / t_ray
    return [
        Row(f"b. embedded:smollm2-135m, {n} items (affirmative-critical, 1 round, 16-token turns): 2 actors x 1 thread "
            f"vs 1 process x 2 threads, items/s ({calls_r} vs {calls_l} calls)",
            f"{ips_r:.2f} items/s", f"{ips_l:.2f} items/s", ips_r / ips_l, "> 1.0",
            "PASS" if ips_r > ips_l else "MISS"),
        Row("b'. the same, generated tokens/s (greedy outputs differ in length between batch compositions)",
            f"{tokens_ray / t_ray:.1f} tok/s", f"{tokens_local / t_local:.1f} tok/s",
            (tokens_ray / t_ray) / (tokens_local / t_local), "—", "info"),
    ]  # fmt: skip


def _tokens(out: Path) -> int:
    from moot.eval.store import RunStore

    store = RunStore.open(out)
    try:
        return sum(r.completion_tokens for r in store.results())
    finally:
        store.close()


async def scaling_rows(args: argparse.Namespace, work: Path) -> list[Row]:
    from moot.models.registry import resolve_model
    from moot.scale import LocalExecutor
    from moot.scale.ray_backend import RayExecutor

    server = FakeServer(args.scale_latency)
    rows: list[Row] = []
    try:
        opts = {"base_url": server.base_url, "api_key": "sk-bench"}
        common = {"model": "openai:fake", "timeout_s": 600.0}
        items = questions(args.items, "c")
        local = LocalExecutor(resolve_model("openai:fake", **opts), capacity=args.concurrency)
        await timed_batch(questions(8, "warm"), work / "c-warm-local", local, **common)
        t, calls, _ = await timed_batch(items, work / "c-local", local, **common)
        await local.model.aclose()
        base = calls / t
        rows.append(Row(f"c. scaling, fake server L={args.scale_latency:g} s, {len(items)} debates: this process, "
                        f"C={args.concurrency}", f"{base:.0f} calls/s", "—", 1.0, "—", "info"))  # fmt: skip
        for k in range(1, args.max_actors + 1):
            cpus = min(1.0, 2.0 / k)
            pool = RayExecutor(
                "openai:fake", address="local", workers=k, worker_cpus=cpus, per_worker=args.concurrency,
                model_options=opts,
            )  # fmt: skip
            await pool.start()
            try:
                await timed_batch(questions(8, f"warm{k}"), work / f"c-warm-{k}", pool, **common)
                t, calls, _ = await timed_batch(items, work / f"c-ray-{k}", pool, **common)
            finally:
                pool.close()
            rows.append(Row(f"c{k}. {k} Ray actor(s) x {cpus:g} CPU, C={args.concurrency} debates each",
                            f"{calls / t:.0f} calls/s", f"{base:.0f} calls/s (this process)", calls / t / base, "—",
                            "info"))  # fmt: skip
    finally:
        server.close()
    return rows


async def main_async(args: argparse.Namespace) -> list[Row]:
    from moot.scale.ray_backend import connect

    connect("local", num_cpus=2)  # one Ray instance for every row; each pool joins it
    rows: list[Row] = []
    with TemporaryDirectory(prefix="moot-bench-batch-") as tmp:
        work = Path(tmp)
        for name, part in (("a", overhead_rows), ("b", embedded_rows), ("c", scaling_rows)):
            if name not in args.rows or (name == "b" and args.skip_embedded):
                continue
            started = time.perf_counter()
            rows += await part(args, work)
            print(f"rows {name}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller counts")
    ap.add_argument("--skip-embedded", action="store_true", help="leave out the embedded rows (b)")
    ap.add_argument("--rows", default="abc", help="which rows to run, e.g. b (default abc)")
    ap.add_argument("--items", type=int, default=200, help="debates of rows a and c (default 200)")
    ap.add_argument("--latency", type=float, default=0.1, help="L of row a, s (default 0.1)")
    ap.add_argument("--scale-latency", type=float, default=0.02, help="L of rows c, s (default 0.02)")
    ap.add_argument("--concurrency", type=int, default=8, help="C: debates at once per process/actor (default 8)")
    ap.add_argument("--max-actors", type=int, default=4, help="the largest pool of rows c (default 4)")
    ap.add_argument("--embedded-items", type=int, default=12, help="items of row b (default 12)")
    args = ap.parse_args(argv)
    if args.quick:
        args.items, args.embedded_items, args.max_actors = 40, 4, 2
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    load = os.getloadavg()
    started = time.perf_counter()
    rows = asyncio.run(main_async(args))
    import ray

    ray.shutdown()
    print("# moot batch benchmark\n")
    print(f"- machine: {platform.system()} {platform.machine()}, os.cpu_count()={os.cpu_count()}, "
          f"Python {platform.python_version()}, Ray {ray.__version__}")  # fmt: skip
    print(f"- load average at start (1/5/15 min): {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")
    print(f"- total time {time.perf_counter() - started:.0f} s\n")
    print("| measurement | measured | baseline | ratio | target | verdict |")
    print("| --- | ---: | ---: | ---: | :---: | :---: |")
    for r in rows:
        ratio = "—" if r.ratio is None else f"{r.ratio:.3f}"
        print(f"| {r.what} | {r.measured} | {r.baseline} | {ratio} | {r.target} | {r.verdict} |")


if __name__ == "__main__":
    main()
