"""What Python's garbage collector costs ``moot serve`` under the interleaved benchmark's load.

    .venv/bin/python benchmarks/bench_collector.py [--reps 4] [--clients 64]
    BENCH=bench_collector.py sh benchmarks/against_tree.sh REV [--reps 4]    # another tree's server

Runs arm S of ``bench_interleaved.py`` (``POST /v1/debates`` and its SSE stream, K clients in a
closed loop on the loopback fake model; or C's or R's, ``--route``) ``--reps`` times against one
``moot serve``, started through a probe (this file, ``--probe``) that times every collection with
``gc.callbacks``. The first repetition warms the server (its imports and first requests collect as
a start does); the figures are the other repetitions': collections by generation, their time per
model call, the longest one (the event loop does nothing else meanwhile: every stream waits), the
objects they freed (which only the collector frees: reference cycles), and the server's resident
memory at the end.

A collection's time is wall-clock time in the server's one thread, which the collector holds.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import CALLS_PER_DEBATE
from bench_interleaved import load_options
from bench_serve import Params, env, free_port, serve_loop, start_fake


def probe(out: Path, moot_args: list[str]) -> None:
    """Run ``moot`` with ``moot_args``, every collection timed; the totals written to ``out`` twice a
    second (SIGUSR2 starts them again from zero)."""
    totals: dict[str, Any] = {}
    started = [0.0]

    def reset(*_: Any) -> None:
        totals.update(collections=[0, 0, 0], seconds=[0.0, 0.0, 0.0], longest_s=0.0, collected=0)

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        took, generation = time.perf_counter() - started[0], info["generation"]
        totals["collections"][generation] += 1
        totals["seconds"][generation] += took
        totals["longest_s"] = max(totals["longest_s"], took)
        totals["collected"] += info["collected"]

    def write() -> None:
        while True:
            time.sleep(0.5)
            pages = int(Path("/proc/self/statm").read_text().split()[1])
            snapshot = {**totals, "rss_mib": pages * os.sysconf("SC_PAGE_SIZE") / 2**20}
            out.with_suffix(".tmp").write_text(json.dumps(snapshot))
            out.with_suffix(".tmp").replace(out)

    reset()
    signal.signal(signal.SIGUSR2, reset)
    gc.callbacks.append(timed)
    threading.Thread(target=write, daemon=True).start()
    sys.argv = ["moot", *moot_args]
    from moot.cli.main import main

    main()


def start_probed(concurrency: int, base_url: str, workdir: Path, out: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``moot serve`` as ``bench_serve.start_server`` starts it, through :func:`probe`."""
    port = free_port()
    args = [
        "serve", "--port", str(port), "--db", str(workdir / "bench.sqlite"), "--models", "openai:bench",
        "--base-url", base_url, "--model-concurrency", str(concurrency), "--max-running", str(concurrency),
        "--max-queued", "0", "--log-level", "warning",
    ]  # fmt: skip
    with (workdir / "serve.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--probe", str(out), *args], stdout=log, stderr=log, env=env()
        )
    return proc, f"http://127.0.0.1:{port}"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    p = Params(debates=0, concurrency=2 * args.clients, latency=args.latency, clients=args.clients,
               per_client=args.per_client, loop_latency=args.latency)  # fmt: skip
    fake, base_url = start_fake(args.latency)
    workdir = Path(tempfile.mkdtemp(prefix="bench-collector-"))
    out = workdir / "collector.json"
    proc, url = start_probed(2 * args.clients, base_url, workdir, out)
    per_call: list[float] = []
    debates = 0
    try:
        for rep in range(1, args.reps + 1):
            loop = await serve_loop(p, proc, url, workdir, args.route)
            print(f"rep {rep}: {loop.rate:.2f} debates/s", file=sys.stderr, flush=True)
            if rep == 1:
                proc.send_signal(signal.SIGUSR2)  # the warm-up's collections are not counted
                await asyncio.sleep(1.0)  # (nor the debates it is ending)
                continue
            debates += loop.debates
            per_call.append(1000 * loop.cpu / (CALLS_PER_DEBATE * loop.debates))
        await asyncio.sleep(1.0)  # the probe's last totals
        totals: dict[str, Any] = json.loads(out.read_text())
    finally:
        fake.terminate()
        proc.terminate()
        proc.wait(30)
    # (the warm-up repetition's clients end their streams before the reset; a debate or two of it
    # may end after it: counted with the timed ones, as the calls are not)
    calls = CALLS_PER_DEBATE * debates
    return {**totals, "calls": calls, "cpu_ms_per_call": statistics.median(per_call)}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--probe"]:
        probe(Path(argv[1]), argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    load_options(ap, 4, "the first a warm-up")
    ap.add_argument(
        "--route", choices=["api", "chat", "responses"], default="api",
        help="arm S's POST /v1/debates and its stream (api, the default), C's chat completion, R's response",
    )  # fmt: skip
    ap.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    if args.reps < 2:
        ap.error("--reps must be at least 2: the first warms the server up")
    start = os.getloadavg()
    got = asyncio.run(run(args))
    calls = got["calls"]
    print("# moot serve's garbage collector under load\n")
    arm = {"api": "S", "chat": "C", "responses": "R"}[args.route]
    print(f"- arm {arm}, K={args.clients} clients, {args.reps - 1} timed repetitions after a warm-up, {calls} calls")
    print(f"- load average at start {start[0]:.2f}, at end {os.getloadavg()[0]:.2f}\n")
    print("| generation | collections | ms | ms per model call |\n| --- | ---: | ---: | ---: |")
    for g in range(3):
        s = got["seconds"][g]
        print(f"| {g} | {got['collections'][g]} | {1000 * s:.1f} | {1000 * s / calls:.4f} |")
    total = sum(got["seconds"])
    print(f"| all | {sum(got['collections'])} | {1000 * total:.1f} | {1000 * total / calls:.4f} |\n")
    print(f"- the longest collection: {1000 * got['longest_s']:.1f} ms")
    print(f"- objects that only the collector freed (reference cycles): {got['collected']}")
    print(f"- the server's resident memory at the end: {got['rss_mib']:.0f} MiB")
    print(f"- the server's CPU per model call, median of the timed repetitions: {got['cpu_ms_per_call']:.2f} ms")
    if args.json is not None:
        args.json.write_text(json.dumps(got, indent=1))


if __name__ == "__main__":
    main()
